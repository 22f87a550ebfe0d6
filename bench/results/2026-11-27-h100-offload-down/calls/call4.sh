set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
for r in 1 2 3; do
for v in base down new; do
  bin=.devbin/rlbench; [ $v = base ] && bin=.devbin/rlbench-base
  e=RLPIPE_HOST_NORMS=1; [ $v = down ] && e=RLPIPE_HOST_NORMS=0
  echo "$v-$r $(env $e timeout 150 $bin --backend cuda $W --warmup 1 --steps 4 --offload --out $OUT/o/off-$v-$r.json 2>&1 | tail -1)"
done; done
for v in base down new; do
  bin=.devbin/rlbench; [ $v = base ] && bin=.devbin/rlbench-base
  e=RLPIPE_HOST_NORMS=1; [ $v = down ] && e=RLPIPE_HOST_NORMS=0
  env $e timeout 150 $bin --backend cuda $W --warmup 1 --steps 2 --offload --timeline $OUT/o/$v.trace.json --out $OUT/o/tl-$v.json 2>&1 | tail -1
done
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
