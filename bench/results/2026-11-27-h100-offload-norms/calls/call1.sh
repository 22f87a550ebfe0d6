# Call 1: gpu-norms tests, then offloaded 3B runs, new (gpu-norms) and base
# (main c82f79c) alternated, and the peer, in one call on one H100.
set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
left() { echo $((560 - SECONDS)); }
say() { echo "$* at ${SECONDS}s" | tee -a $OUT/o/summary.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/o/env.txt
(cd gpu/cuda && timeout 60 ../../.devbin/cuda.test -test.v -test.run 'TestAdamWAndSumSquares' > $OUT/o/cuda-tests.log 2>&1; say "cuda tests rc=$? $(grep -E '^(--- |ok|PASS|FAIL)' $OUT/o/cuda-tests.log | tr '\n' ' ')")
(cd stages && timeout 120 ../.devbin/stages.test -test.v -test.run 'TestRunTinyCUDA$|TestHostUpdateOverlap' > $OUT/o/stages-tests.log 2>&1; say "stages tests rc=$? $(grep -E '^(--- |ok|PASS|FAIL)' $OUT/o/stages-tests.log | tr '\n' ' ')")
say "warm $(timeout 200 .devbin/rlbench --backend cuda $W --warmup 0 --steps 1 --offload --out $OUT/o/warm.json 2>&1 | tail -1)"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 150 python3 bench/peer_fsdp2.py --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --offload --out $OUT/o/peer-ac.json > $OUT/o/peer.log 2>&1; say "peer rc=$? $(tail -1 $OUT/o/peer.log)"
for r in 1 2 3 4; do
for v in new base; do
  (( $(left) < 50 )) && break 2
  bin=.devbin/rlbench; [ $v = base ] && bin=.devbin/rlbench-base
  say "$v-$r $(timeout 100 $bin --backend cuda $W --warmup 1 --steps 4 --offload --out $OUT/o/off-$v-$r.json 2>&1 | tail -1)"
done; done
if (( $(left) > 40 )); then
 say "tl-new $(timeout $(( $(left) - 5 )) .devbin/rlbench --backend cuda $W --warmup 1 --steps 2 --offload --timeline $OUT/o/new.trace.json --out $OUT/o/tl-new.json 2>&1 | tail -1)"
fi
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
