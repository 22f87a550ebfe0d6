#!/usr/bin/env bash
# Call 1 (one H200): the train step's log-prob head in one kernel
# (lpHeadStore: the product, the float32 logits' store and the row
# statistics with entropies; RLPIPE_CUDA_LP_STORE=0 is the path before it).
# gpu/cuda's log-prob tests; BenchmarkLogProbsHead at the 1.5B and 3B
# shapes, the store off and on alternated; rlbench's GRPO step at 1.5B and
# 3B, off and on alternated, with a timeline of each at 1.5B; the model
# package's tests (HF parity on the CUDA backend); the stages package's
# one-GPU CUDA tests.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/s1
(cd gpu/cuda && timeout 240 ../../$B/cuda.test -test.v -test.run 'TestLogProbs|TestLogitsBackward|TestKernelNames|TestHead' >"$OUT/r/cuda-tests.log" 2>&1)
say "cuda tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic|logprobs_store_test|\.go:[0-9]+:' "$OUT/r/cuda-tests.log" | grep -v 'seed ' | head -40 | tee -a "$OUT/summary.txt"
for shp in 2048,1536,151936 2048,2048,151936; do
	for r in 1 2; do
		for v in 0 1; do
			(cd gpu/cuda && RLPIPE_CUDA_LP_STORE=$v RLPIPE_BENCH_LP=$shp timeout 100 ../../$B/cuda.test -test.run '^$' -test.bench 'LogProbsHead/(logits|step:_logits_\+|step:_logits_backward_2)' -test.benchtime 20x >"$OUT/r/lp-$shp-$v-$r.log" 2>&1)
			say "lp bench $shp store=$v round $r rc=$?"
			grep -E 'Benchmark' "$OUT/r/lp-$shp-$v-$r.log" | sed "s/^/s$v.$r /" | tee -a "$OUT/summary.txt"
		done
	done
done
one() { # NAME STORE MODEL [args]
	RLPIPE_CUDA_LP_STORE=$2 timeout 120 $B/rlbench --backend cuda --config "examples/models/$3/config.json" --seqs 8 --tokens-per-seq 2048 \
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
		--out "$OUT/r/$1.json" "${@:4}" >"$OUT/r/$1.log" 2>&1
	say "$1 rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/r/$1.log" | cut -c1-240)"
}
for r in 1 2; do
	for m in qwen2.5-1.5b qwen2.5-3b; do
		((SECONDS < 330)) || break
		one $m-s0-$r 0 $m
		one $m-s1-$r 1 $m
	done
done
for v in 0 1; do
	one qwen2.5-1.5b-s$v-tl $v qwen2.5-1.5b --timeline "$OUT/r/15b-s$v.trace.json"
	python3 bench/trace_ops.py "$OUT/r/15b-s$v.trace.json" >"$OUT/r/15b-s$v.ops.md" 2>&1
	grep -E 'head|span' "$OUT/r/15b-s$v.ops.md" | sed "s/^/s$v /" | tee -a "$OUT/summary.txt"
done
((SECONDS < 440)) && (cd model && timeout 100 ../$B/model.test -test.v -test.timeout 95s >"$OUT/r/model.log" 2>&1)
say "model tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/r/model.log" | grep -v '^--- PASS' | head -20 | tee -a "$OUT/summary.txt"
grep -c '^--- PASS' "$OUT/r/model.log" | sed 's/^/model passes: /' | tee -a "$OUT/summary.txt"
((SECONDS < 500)) && (cd stages && timeout 90 ../$B/stages.test -test.v -test.run 'CUDA' -test.timeout 85s >"$OUT/r/stages.log" 2>&1)
say "stages CUDA tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/r/stages.log" | head -30 | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
