#!/usr/bin/env bash
# Call 12: build C3 (call 11's, its grid capped at the clusters the device runs
# at once, cuOccupancyMaxActiveClusters; uncommitted). As call 11.
# The gate/up tests with clusters and without (RLPIPE_CUDA_GEMM_CLUSTER=0);
# BenchmarkGateUpSwiGLU at 3B, alternated; the 3B step, alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
B=$PWD/.devbin/C
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for c in 1 0; do
	(cd gpu/cuda && RLPIPE_CUDA_GEMM_CLUSTER=$c RLPIPE_CUDA_COMPILE_LOG=1 timeout 120 "$B/cuda.test" -test.run 'TestGateUpSwiGLU' -test.v >"$R/tests-$c.log" 2>&1)
	say "cluster=$c tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-$c.log" | tr '\n' ' ')"
done
grep -A3 "Function properties for k_gemm_swiglu_c2_bf16" "$R/tests-1.log" | tee -a "$OUT/summary.txt"
if grep -q '^ok\|^PASS' "$R/tests-1.log"; then
	for c in 1 0 1 0; do
		(cd gpu/cuda && RLPIPE_CUDA_GEMM_CLUSTER=$c timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'GateUpSwiGLU' -test.benchtime 20x >"$R/b.log" 2>&1)
		say "cluster=$c $(grep -E 'fused|FAIL' "$R/b.log" | tr '\n' ' ')"
	done
	W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
	i=0
	for c in 1 0 1 0; do
		i=$((i + 1))
		RLPIPE_CUDA_GEMM_CLUSTER=$c timeout 150 "$B/rlbench" "${W[@]}" --out "$R/3b-$c-$i.json" >"$R/3b-$c-$i.log" 2>&1
		say "3b cluster=$c run $i rc=$? $(tail -n 1 "$R/3b-$c-$i.log")"
	done
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
