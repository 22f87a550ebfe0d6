#!/usr/bin/env bash
# Call 2 (one H200): the norm backward's rows, strided over the blocks
# (RLPIPE_CUDA_NORM_ROWS=strided) or in runs, with and without the
# shared-memory pipeline: gpu/cuda's norm tests both ways; BenchmarkOps'
# rmsnorm_bwd rows for 1a (runs, registers), 1s (strided, registers),
# p4 (runs, 4 rows in flight), p2s and p4s, alternated twice; rlbench's
# GRPO step at 1.5B and 3B for 1a, 1s and p4s, alternated twice.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/n2
for rows in runs strided; do
	(cd gpu/cuda && RLPIPE_CUDA_NORM_ROWS=$rows timeout 200 ../../$B/cuda.test -test.v -test.run 'TestFusedNorms|TestRMSNorm|TestKernelNames' >"$OUT/r/cuda-tests-$rows.log" 2>&1)
	say "cuda tests rows=$rows rc=$? at ${SECONDS}s"
	grep -E '^(\s*--- |ok|PASS|FAIL)|panic|error|\.go:[0-9]+:' "$OUT/r/cuda-tests-$rows.log" | grep -v seed | head -30 | tee -a "$OUT/summary.txt"
done
# variant NAME: PIPE ROWS
var() { case $1 in 1a) echo "0 runs" ;; 1s) echo "0 strided" ;; p4) echo "4 runs" ;; p2s) echo "2 strided" ;; p4s) echo "4 strided" ;; esac; }
for r in 1 2; do
	for v in 1a 1s p4 p2s p4s; do
		set -- $(var $v)
		(cd gpu/cuda && RLPIPE_CUDA_NORM_PIPE=$1 RLPIPE_CUDA_NORM_ROWS=$2 timeout 100 ../../$B/cuda.test -test.run '^$' -test.bench 'Ops/rmsnorm_bwd_add' -test.benchtime 100x >"$OUT/r/ops-$v-$r.log" 2>&1)
		say "ops $v round $r rc=$?"
		grep -E 'Benchmark' "$OUT/r/ops-$v-$r.log" | sed "s/^/$v.$r /;s/BenchmarkOps.rmsnorm_bwd_add_//" | tee -a "$OUT/summary.txt"
	done
done
one() { # NAME VARIANT MODEL [args]
	set -- "$1" $(var $2) "${@:3}"
	RLPIPE_CUDA_NORM_PIPE=$2 RLPIPE_CUDA_NORM_ROWS=$3 timeout 100 $B/rlbench --backend cuda --config "examples/models/$4/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:5}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-200)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		for v in 1a 1s p4s; do one $m-$v-$r $v $m; done
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
