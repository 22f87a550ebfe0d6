#!/usr/bin/env bash
# Call 13: the review build (the consumers' staging write shared as
# wg_stage, the fused ops' operand checks as fusedAddrs; no change meant):
# the fused kernels' tests, the tiny CUDA run and one 3B step.
set -u
tar xzf .devbin/b.tgz -C .devbin
B=$PWD/.devbin/R
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 200 "$B/cuda.test" -test.run 'TestKernelNames|TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestGemmAdd' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 "$B/stages.test" -test.run 'TestRunTinyCUDA$' -test.v >"$R/stages.log" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
timeout 150 "$B/rlbench" "${W[@]}" --out "$R/3b.json" >"$R/3b.log" 2>&1
say "3b rc=$? $(tail -n 1 "$R/3b.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
