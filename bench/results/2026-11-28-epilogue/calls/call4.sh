#!/usr/bin/env bash
# Call 4 (one H200): BenchmarkDownSwiGLUBackward at the 3B and 1.5B shapes
# for b0 (main at fcf9323), A (call 3's) and three diagnostic forms of A
# (calls/dsvar3.py: nocomp, nowait, nostore), in the order
# b0 A A-nocomp A-nowait A-nostore A b0.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops"
i=0
for v in b0 A A-nocomp A-nowait A-nostore A b0; do
	i=$((i + 1))
	for shp in 16384,2048,11008 16384,1536,8960; do
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 60 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 20x) >"$OUT/ops/ds$i-$v-$shp.txt" 2>&1
		say "dswiglu $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark.*fused' "$OUT/ops/ds$i-$v-$shp.txt" | tee -a "$OUT/summary.txt"
	done
done
(cd "$OUT" && tar czf r.tgz ops; rm -rf ops)
