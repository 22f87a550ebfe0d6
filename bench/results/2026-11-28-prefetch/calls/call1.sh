#!/usr/bin/env bash
# Call 1 (one H200): TestDownSwiGLUBackward for each build, then
# BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes, 50 launches, the
# builds alternated twice: b0 (main at ff8996d), v1 (the next tile's g and
# u prefetched into L2 a tile ahead), v1r (v1 with consumers at 176
# registers, the other warps at 80), pipe (v1r with each pair of vectors'
# loads issued before the pair before it is computed), pipe88 (pipe at
# 168/88).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops"
V="b0 v1 v1r pipe pipe88"
for v in $V; do
	(cd gpu/cuda && timeout 120 ../../.devbin/$v/cuda.test -test.run 'TestDownSwiGLUBackward' -test.v) >"$OUT/ops/test-$v.txt" 2>&1
	say "test $v: rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/ops/test-$v.txt" | head -20 | tee -a "$OUT/summary.txt"
done
i=0
for r in 1 2; do
	for v in $V; do
		i=$((i + 1))
		for shp in 16384,2048,11008 16384,1536,8960; do
			f="$OUT/ops/ds$i-$v-${shp//,/x}.txt"
			(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 90 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 50x) >"$f" 2>&1
			say "dswiglu $v $shp: rc=$? at ${SECONDS}s"
			grep -E '^Benchmark.*(fused|only)' "$f" | tee -a "$OUT/summary.txt"
		done
	done
done
(cd "$OUT" && tar czf r.tgz ops; rm -rf ops)
