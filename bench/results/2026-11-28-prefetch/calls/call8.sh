#!/usr/bin/env bash
# Call 8 (one H200): the review's build m (main at 610df01 with SwiGLU's
# element formulas shared by the unfused kernels and the epilogues,
# swiglu1/dswiglu1/dswiglu_tail in common.cuh, k_lp_fwd under a launch
# bound of two 512-thread blocks an SM, the log-prob kernels' block one
# constant): the tests of the kernels it touches; BenchmarkLogProbsHead's
# step rows and BenchmarkDownSwiGLUBackward at the 3B shape; rlbench 1.5B
# (its grad norm was 3.49735 before).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
(cd gpu/cuda && timeout 150 ../../.devbin/m/cuda.test -test.run 'TestElementwise|TestGateUpSwiGLU|TestDownSwiGLUBackward|TestLogProbs|TestLogitsBackwardStats|TestKernelNames' -test.v) >"$OUT/tests.log" 2>&1
say "tests (m): rc=$? at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|not the same|did not change|changed with' "$OUT/tests.log" | head -30 | tee -a "$OUT/summary.txt"
(cd gpu/cuda && RLPIPE_BENCH_LP=2048,2048,151936 RLPIPE_BENCH_DOWN=16384,2048,11008 timeout 90 ../../.devbin/m/cuda.test -test.run '^$' -test.bench 'LogProbsHead/step:|DownSwiGLUBackward/fused' -test.benchtime 20x) >"$OUT/bench.txt" 2>&1
say "bench: rc=$? at ${SECONDS}s"
grep -E '^Benchmark' "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
timeout 100 .devbin/m/rlbench --backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb.json" >"$OUT/rb.log" 2>&1
say "rlbench 1.5B (m): rc=$? $(tail -1 "$OUT/rb.log") at ${SECONDS}s"
gzip "$OUT/tests.log"
