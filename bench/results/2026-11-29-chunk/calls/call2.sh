#!/usr/bin/env bash
# Call 2 (one H200): lpHeadStore in blocks of rows (chunks whose partials
# do not fit the cuBLASLt workspace at once). gpu/cuda's log-prob tests
# (with TestLogProbsHeadStoreBlocks: blocks of 128 rows against one, the
# same bits); BenchmarkLogProbsHead at 16384 rows of the 1.5B head, the
# store off and on alternated twice; rlbench's GRPO step at 1.5B and 3B
# with chunk_tokens auto (the whole micro-batch of 16384 rows), the store
# off (the path before: cuBLASLt and k_lp_fwd) and on (in blocks),
# alternated twice, and at --chunk 2048 once; a timeline of the 1.5B step
# at auto, each way.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/s2
(cd gpu/cuda && timeout 240 ../../$B/cuda.test -test.v -test.run 'TestLogProbs|TestLogitsBackward|TestHead' >"$OUT/r/cuda-tests.log" 2>&1)
say "cuda tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic|logprobs_store_test|\.go:[0-9]+:' "$OUT/r/cuda-tests.log" | grep -v 'seed ' | head -40 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in 0 1; do
		(cd gpu/cuda && RLPIPE_CUDA_LP_STORE=$v RLPIPE_BENCH_LP=16384,1536,151936 timeout 100 ../../$B/cuda.test -test.run '^$' -test.bench 'LogProbsHead/(logits|step:_logits_\+|step:_logits_backward_2)' -test.benchtime 5x >"$OUT/r/lp-$v-$r.log" 2>&1)
		say "lp bench 16384 store=$v round $r rc=$?"
		grep -E 'Benchmark' "$OUT/r/lp-$v-$r.log" | sed "s/^/s$v.$r /" | tee -a "$OUT/summary.txt"
	done
done
one() { # NAME STORE MODEL CHUNK [args]
	RLPIPE_CUDA_LP_STORE=$2 timeout 100 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk $4 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:5}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-260)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		one $m-s0-$r 0 $m 0
		one $m-s1-$r 1 $m 0
	done
done
for m in qwen2.5-1.5b qwen2.5-3b; do one $m-c2048 1 $m 2048; done
for v in 0 1; do
	one qwen2.5-1.5b-s$v-tl $v qwen2.5-1.5b 0 --timeline "$OUT/r/15b-s$v.trace.json"
	python3 bench/trace_ops.py "$OUT/r/15b-s$v.trace.json" >"$OUT/r/15b-s$v.ops.md" 2>&1
	grep -E 'head|span' "$OUT/r/15b-s$v.ops.md" | sed "s/^/s$v /" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
