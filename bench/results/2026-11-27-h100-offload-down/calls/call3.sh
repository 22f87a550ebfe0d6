set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
(cd stages && timeout 200 ../.devbin/stages.test -test.v -test.run 'TestRunTinyCUDA$|TestHostUpdateOverlap|TestHostNorms' > $OUT/o/stages-tests.log 2>&1; echo "stages rc=$?" ; grep -E "^(--- |ok|PASS|FAIL)" $OUT/o/stages-tests.log | head -20)
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
for r in 1 2 3; do
for v in base new; do
  bin=.devbin/rlbench; [ $v = base ] && bin=.devbin/rlbench-base
  echo "$v-$r $(timeout 150 $bin --backend cuda $W --warmup 1 --steps 4 --offload --out $OUT/o/off-$v-$r.json 2>&1 | tail -1)"
done; done
timeout 150 .devbin/rlbench --backend cuda $W --warmup 1 --steps 2 --offload --timeline $OUT/o/new.trace.json --out $OUT/o/tl-new.json 2>&1 | tail -1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 200 python3 bench/peer_fsdp2.py --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --offload --out $OUT/o/peer-ac.json > $OUT/o/peer.log 2>&1; echo "peer rc=$? $(tail -1 $OUT/o/peer.log)"
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
