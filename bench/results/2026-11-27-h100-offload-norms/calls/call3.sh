# Call 3: the resident 3B against the offloaded 3B with gpu-norms (b866a3f),
# alternated in one call, and a timeline of the offloaded step.
set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
left() { echo $((480 - SECONDS)); }
say() { echo "$* at ${SECONDS}s" | tee -a $OUT/o/summary.txt; }
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_median_s', j['train']['median_s'])" $1 2>&1 | tail -1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/o/env.txt
say "warm $(timeout 200 .devbin/rlbench-norms --backend cuda $W --warmup 0 --steps 1 --offload --out $OUT/o/warm.json 2>&1 | tail -1) $(gn $OUT/o/warm.json)"
for r in 1 2 3; do
for v in resident offload; do
  (( $(left) < 45 )) && break 2
  f=""; [ $v = offload ] && f=--offload
  say "$v-$r $(timeout 90 .devbin/rlbench-norms --backend cuda $W --warmup 1 --steps 3 $f --out $OUT/o/$v-$r.json 2>&1 | tail -1) $(gn $OUT/o/$v-$r.json)"
done; done
if (( $(left) > 35 )); then
 say "tl $(timeout $(( $(left) - 3 )) .devbin/rlbench-norms --backend cuda $W --warmup 1 --steps 2 --offload --timeline $OUT/o/norms.trace.json --out $OUT/o/tl-norms.json 2>&1 | tail -1)"
fi
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
