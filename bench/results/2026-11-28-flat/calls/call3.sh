#!/usr/bin/env bash
# Call 3 (one H200): the norm backward's grid as one wave (blocks = SMs
# times the blocks an SM holds, from the driver's occupancy calculation)
# instead of four blocks an SM. Build c3/n (the change) against c3/b
# (main at 423563e with the same benchmark rows): gpu/cuda's norm tests
# and TestResidentBlocks; BenchmarkOps' norm backward rows at the 1.5B
# and 3B shapes, alternated; rlbench's GRPO step at 1.5B and 3B,
# alternated; the stages package's one-GPU CUDA tests on n.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
(cd gpu/cuda && timeout 200 ../../.devbin/c3/n/cuda.test -test.v -test.run 'TestResidentBlocks|TestFusedNorms|TestRMSNorm|TestAddRMSNorm16|TestKernelNames' >"$OUT/r/cuda-tests.log" 2>&1)
say "cuda tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|blocks an SM|panic' "$OUT/r/cuda-tests.log" | head -30 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in n b; do
		(cd gpu/cuda && timeout 100 ../../.devbin/c3/$v/cuda.test -test.run '^$' -test.bench 'Ops/rmsnorm_bwd' -test.benchtime 100x >"$OUT/r/ops-$v-$r.log" 2>&1)
		say "ops $v round $r rc=$?"
		grep -E 'rmsnorm_bwd' "$OUT/r/ops-$v-$r.log" | sed "s/^/$v$r /" | tee -a "$OUT/summary.txt"
	done
done
one() { # NAME BUILD MODEL
	timeout 120 .devbin/c3/$2/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:4}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-240)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		((SECONDS < 330)) || break
		one $m-n-$r n $m
		one $m-b-$r b $m
	done
done
one qwen2.5-1.5b-n-tl n qwen2.5-1.5b --timeline "$OUT/r/15b-n.trace.json"
python3 bench/trace_ops.py "$OUT/r/15b-n.trace.json" >"$OUT/r/15b-n.ops.md" 2>&1
grep -E 'norm' "$OUT/r/15b-n.ops.md" | tee -a "$OUT/summary.txt"
((SECONDS < 400)) && (cd stages && timeout 170 ../.devbin/c3/n/stages.test -test.run 'CUDA' -test.timeout 165s >"$OUT/r/stages.log" 2>&1)
say "stages CUDA tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic' "$OUT/r/stages.log" | head -20 | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
