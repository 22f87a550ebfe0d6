#!/usr/bin/env bash
# Variants of k_gemm_swiglu_* (GS_STAGED, GS_WAIT0 in kernels/gemm.cu), each
# built into its own cuda-V.test and rlbench-V (gzipped in .devbin): the
# kernel's test and BenchmarkOps rows per variant, then the 3B ref_logprob
# with the fastest variant on and off (RLPIPE_CUDA_GEMM_SWIGLU), alternated.
# Call 5 ran the variants A B C (the default then), call 6 A F (the default now).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gs-variants}
R=$OUT/r
mkdir -p "$R" /tmp/bin
for f in .devbin/*.gz; do gunzip -c "$f" >/tmp/bin/$(basename "$f" .gz); done
chmod +x /tmp/bin/*
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
best= bestns=999999999
for v in ${GS_VARIANTS:-A F}; do
	(cd gpu/cuda && timeout 150 /tmp/bin/cuda-$v.test -test.run 'TestGateUpSwiGLU|TestElementwise' -test.v >"$R/tests-$v.log" 2>&1)
	say "$v tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-$v.log" | tr '\n' ' ')"
	(cd gpu/cuda && timeout 60 /tmp/bin/cuda-$v.test -test.run '^$' -test.bench 'Ops/(gemm_bf16|gate|swiglu_fwd)' -test.benchtime 20x >"$R/bench-$v.log" 2>&1)
	grep Benchmark "$R/bench-$v.log" | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
	ns=$(awk '/gate\/up/ {print int($3)}' "$R/bench-$v.log")
	if grep -q '^PASS' "$R/tests-$v.log" && [ -n "$ns" ] && [ "$ns" -lt "$bestns" ]; then best=$v bestns=$ns; fi
done
say "fastest passing variant: ${best:-none} ($bestns ns)"
if [ -n "$best" ]; then
	W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
		--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
	i=0
	for f in 1 0 1 0; do
		i=$((i + 1))
		RLPIPE_CUDA_GEMM_SWIGLU=$f timeout 200 /tmp/bin/rlbench-$best "${W[@]}" --out "$R/3b-$best-fused$f-$i.json" >"$R/3b-$best-fused$f-$i.log" 2>&1
		say "3b $best fused=$f run $i rc=$? $(tail -n 1 "$R/3b-$best-fused$f-$i.log")"
	done
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
