# Call 2: the Down stream fix (c013324) and gpu-norms on it (b866a3f):
# tests, the witness (c82f79c with only the test hook: its delayed case must
# fail), then offloaded 3B runs of pre (0d91554, before the Down stream), fix
# and norms alternated, with each run's grad_norm, and the peer.
set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
left() { echo $((565 - SECONDS)); }
say() { echo "$* at ${SECONDS}s" | tee -a $OUT/o/summary.txt; }
gn() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('grad_norm', j['last_metrics']['grad_norm'], 'train_median_s', j['train']['median_s'])" $1 2>&1 | tail -1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/o/env.txt
(cd gpu/cuda && timeout 70 ../../.devbin/cuda.test -test.v -test.run 'TestDelay|TestAdamWAndSumSquares' > $OUT/o/cuda-tests.log 2>&1; say "cuda tests rc=$? $(grep -E '^(--- |ok|PASS|FAIL)' $OUT/o/cuda-tests.log | tr '\n' ' ')")
(cd stages && timeout 90 ../.devbin/stages.test -test.v -test.run 'TestRunTinyCUDA$|TestHostUpdateOverlap' > $OUT/o/stages-tests.log 2>&1; say "stages tests rc=$? $(grep -E '^\s*(--- |ok|PASS|FAIL)' $OUT/o/stages-tests.log | tr '\n' ' ')")
(cd stages && timeout 60 ../.devbin/stages-witness.test -test.v -test.run 'TestRunTinyCUDA$/delayed' > $OUT/o/witness.log 2>&1; say "witness (must FAIL) rc=$? $(grep -E '^\s*(--- |ok|PASS|FAIL)' $OUT/o/witness.log | tr '\n' ' ')")
say "warm $(timeout 200 .devbin/rlbench-fix --backend cuda $W --warmup 0 --steps 1 --offload --out $OUT/o/warm.json 2>&1 | tail -1) $(gn $OUT/o/warm.json)"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 150 python3 bench/peer_fsdp2.py --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --offload --out $OUT/o/peer-ac.json > $OUT/o/peer.log 2>&1; say "peer rc=$? $(tail -1 $OUT/o/peer.log)"
for r in 1 2 3 4; do
for v in pre fix norms; do
  (( $(left) < 45 )) && break 2
  say "$v-$r $(timeout 90 .devbin/rlbench-$v --backend cuda $W --warmup 1 --steps 3 --offload --out $OUT/o/off-$v-$r.json 2>&1 | tail -1) $(gn $OUT/o/off-$v-$r.json)"
done; done
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
