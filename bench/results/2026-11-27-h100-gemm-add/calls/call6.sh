#!/usr/bin/env bash
# Call 6: the Hopper products' ring (wg_ring_init, wg_ring_slot,
# wg_tile_order, wg_ring_tile192) and the quad reductions shared through
# hopper.cuh and common.cuh. Tests, the two benchmarks at 3B shapes, one 3B
# step.
set -u
B=$PWD/.devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 300 "$B/cuda.test" -test.run 'TestKernelsCompile|TestGateUpSwiGLU|TestLogProbsFused|TestRMSNorm|TestFusedNorms|TestAttentionTensorCore|TestGemmAdd' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd gpu/cuda && timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU|LogProbsHead' -test.benchtime 20x >"$R/bench.log" 2>&1)
grep -E 'Benchmark|FAIL' "$R/bench.log" | tee -a "$OUT/summary.txt"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b.json" >"$R/3b.log" 2>&1
say "3b rc=$? $(tail -n 1 "$R/3b.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
