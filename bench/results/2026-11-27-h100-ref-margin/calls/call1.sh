#!/usr/bin/env bash
# Call 1: M is main (700f2e1). The fused kernels' tests (QKVRoPE's operand
# checks through gpu.QKVDims, 9af488f, had not run on a GPU), then best
# against best at 3B twice (peer with AC, rlpipe auto), each a fresh
# fair_device.sh.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 150 ../../.devbin/M/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused|TestGemmAdd' -test.v >"$R/tests.log" 2>&1)
say "M tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
cp .devbin/M/rlbench .devbin/rlbench
for i in 1 2; do
	OUT=$OUT/f$i FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=280 bash bench/fair_device.sh >"$R/fair$i.log" 2>&1
	rm -rf "$OUT/f$i"/work-*
	say "fair $i: $(grep 'best against best' "$R/fair$i.log" | tail -1)"
	say "fair $i: $(grep '| shared' "$R/fair$i.log" | tail -1)"
done
(cd "$OUT" && tar czf r.tgz r f1 f2 && rm -rf r f1 f2)
