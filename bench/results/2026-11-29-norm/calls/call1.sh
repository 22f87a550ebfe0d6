#!/usr/bin/env bash
# Call 1 (one H200): the norm backward with its rows' loads in flight
# through shared memory (k_rmsnorm_bwd8_p<S>, S = 2, 3, 4) against the
# kernels that hold rows in registers (RLPIPE_CUDA_NORM_PIPE=0): gpu/cuda's
# norm tests (the same bits); BenchmarkOps' rmsnorm_bwd rows for each,
# alternated twice; rlbench's GRPO step at 1.5B and 3B, S=4 against 0,
# alternated twice; a timeline of the 1.5B step each way.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/n1
(cd gpu/cuda && timeout 200 ../../$B/cuda.test -test.v -test.run 'TestFusedNorms|TestRMSNorm|TestResidentBlocks|TestKernelNames' >"$OUT/r/cuda-tests.log" 2>&1)
say "cuda tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic|error|\.go:[0-9]+:' "$OUT/r/cuda-tests.log" | head -40 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in 0 2 3 4; do
		(cd gpu/cuda && RLPIPE_CUDA_NORM_PIPE=$v timeout 100 ../../$B/cuda.test -test.run '^$' -test.bench 'Ops/rmsnorm_bwd' -test.benchtime 100x >"$OUT/r/ops-$v-$r.log" 2>&1)
		say "ops pipe=$v round $r rc=$?"
		grep -E 'Benchmark' "$OUT/r/ops-$v-$r.log" | sed "s/^/p$v.$r /" | tee -a "$OUT/summary.txt"
	done
done
one() { # NAME PIPE MODEL [args]
	RLPIPE_CUDA_NORM_PIPE=$2 timeout 100 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:4}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-260)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-p0-$r 0 $m
		one $m-p4-$r 4 $m
	done
done
for v in 0 4; do
	one qwen2.5-1.5b-p$v-tl $v qwen2.5-1.5b --timeline "$OUT/r/15b-p$v.trace.json"
	python3 bench/trace_ops.py "$OUT/r/15b-p$v.trace.json" >"$OUT/r/15b-p$v.ops.md" 2>&1
	grep -E 'norm|span' "$OUT/r/15b-p$v.ops.md" | sed "s/^/p$v /" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
