#!/usr/bin/env bash
# Call 5 (one H200): cuBLASLt's candidates (pick0 is the heuristic's first,
# the one Gemm takes) for the products of the 1.5B train step with varied
# operands (RLPIPE_BENCH_GEMM_SCRAMBLED=1: the GPU then runs at its power
# limit, as in a step), the head's on chunks of 16384 rows (chunk_tokens
# auto at these sizes) and of 2048; then the 3B shapes at 16384.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=../../.devbin/g5/cuda.test
one() { # NAME DIMS CHUNK FILTER
	(cd gpu/cuda && RLPIPE_BENCH_GEMM_SCRAMBLED=1 RLPIPE_BENCH_GEMM_DIMS=$2 RLPIPE_BENCH_GEMM_CHUNK=$3 timeout 240 $B -test.run '^$' \
		-test.bench "GemmAlgos/$4" -test.benchtime 20x >"$OUT/r/$1.log" 2>&1)
	say "$1 rc=$? at ${SECONDS}s"
	grep -E '^Benchmark' "$OUT/r/$1.log" | sed -E 's/^BenchmarkGemmAlgos\///; s/-16 +/ /' | awk '{print $1, $2, $3, $(NF-1)}' | tee -a "$OUT/summary.txt"
}
one 15b-head16k 1536,8960,256 16384 'head'
one 15b-all 1536,8960,256 2048 ''
((SECONDS < 420)) && one 3b-head16k 2048,11008,256 16384 'head_d'
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
