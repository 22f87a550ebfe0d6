#!/usr/bin/env bash
# Call 17: M is main (e473022); W is M with the gate/up kernel's and the
# fused head's ring buffers released by lane 0 of each consumer warp
# (the q/k/v kernel keeps one arrival a thread). W's tests of the three
# kernels; the 3B step, M and W alternated; best against best at 3B on W.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 150 ../../.devbin/W/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE|TestLogProbsFused' -test.v >"$R/tests.log" 2>&1)
say "W tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in M W M W; do
	i=$((i + 1))
	timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1
	say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
done
cp .devbin/W/rlbench .devbin/rlbench
OUT=$OUT/f FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=300 bash bench/fair_device.sh >"$R/fair.log" 2>&1
rm -rf "$OUT/f"/work-*
say "$(grep 'best against best' "$R/fair.log" | tail -1)"
say "$(grep '| shared' "$R/fair.log" | tail -1)"
(cd "$OUT" && tar czf r.tgz r f && rm -rf r f)
