#!/usr/bin/env bash
# Call 2 (one H200): the dswiglu epilogue's forms (calls/dsvar6.py on the
# tile-ahead form; calls/dsdiag.py on ff8996d's):
# TestDownSwiGLUBackward for each new form; BenchmarkDownSwiGLUBackward at
# the 3B and 1.5B shapes, 50 launches, b0 pipe88 near88 pk96 bal96
# alternated twice; the epilogue's phase timers (diag at 56 registers,
# diag88 at 88) at both shapes; the SASS of k_gemm_dswiglu_bf16 for b0
# and pk96 (cubins from NVRTC 12.4 here, nvdisasm there).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops"
for v in pipe88 near88 pk96 bal96; do
	(cd gpu/cuda && timeout 120 ../../.devbin/$v/cuda.test -test.run 'TestDownSwiGLUBackward' -test.v) >"$OUT/ops/test-$v.txt" 2>&1
	say "test $v: rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/ops/test-$v.txt" | head -20 | tee -a "$OUT/summary.txt"
done
V="b0 pipe88 near88 pk96 bal96"
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
for v in diag diag88; do
	for shp in 16384,2048,11008 16384,1536,8960; do
		f="$OUT/ops/ph-$v-${shp//,/x}.txt"
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 90 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward/fused' -test.benchtime 1x) >"$f" 2>&1
		say "phases $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark.*fused' "$f" | tee -a "$OUT/summary.txt"
		# The last launch's lines: 7 a CTA.
		grep '^DSPH' "$f" | tail -n $((7 * 132)) | awk '{w=$3; n[w]++; s[w]+=$5; l[w]+=$7; r[w]+=$9; t[w]+=$11} END {for (w in n) printf "warp %d: staged %.1f%% loads %.1f%% rest %.1f%% (total %.0f cycles a CTA)\n", w, 100*s[w]/t[w], 100*l[w]/t[w], 100*r[w]/t[w], t[w]/n[w]}' | sort -n -k2 | tee -a "$OUT/summary.txt"
	done
done
mkdir -p "$OUT/ops/sass"
for v in b0 pk96; do
	/usr/local/cuda/bin/cuobjdump -sass -fun k_gemm_dswiglu_bf16 .devbin/sass/$v/gemm.cubin >"$OUT/ops/sass/$v.sass" 2>&1 || /usr/local/cuda/bin/nvdisasm -c .devbin/sass/$v/gemm.cubin >"$OUT/ops/sass/$v.sass" 2>&1
	say "sass $v: $(wc -l <"$OUT/ops/sass/$v.sass") lines"
done
(cd "$OUT" && tar czf r.tgz ops; rm -rf ops)
