#!/usr/bin/env bash
# Call 12: Z is main at fa05906 (the forward softmax's one fma, the head's
# trimmed epilogue, attention compiled as eight modules). The GPU tests
# of the kernels this session touched and TestRunTinyCUDA; then best
# against best at 3B three times (the peer with activation checkpointing,
# rlpipe auto), each a fresh fair_device.sh.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 240 ../../.devbin/Z/cuda.test -test.run 'TestAttention|TestLogProbs|TestHead|TestGateUpSwiGLU|TestQKVRoPE|TestGemmAdd|TestKernelCacheReused|TestKernelsCompile' >"$R/cuda-tests.log" 2>&1)
say "Z cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 ../.devbin/Z/stages.test -test.run 'TestRunTinyCUDA' >"$R/stages.log" 2>&1)
say "Z TestRunTinyCUDA rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
cp .devbin/Z/rlbench .devbin/rlbench
for i in 1 2 3; do
	OUT=$OUT/f$i FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=280 bash bench/fair_device.sh >"$R/fair$i.log" 2>&1
	rm -rf "$OUT/f$i"/work-*
	say "fair $i: $(grep 'best against best' "$R/fair$i.log" | tail -1)"
	say "fair $i: $(grep '| shared' "$R/fair$i.log" | tail -1)"
done
(cd "$OUT" && tar czf r.tgz r f1 f2 f3 && rm -rf r f1 f2 f3)
