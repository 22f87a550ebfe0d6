#!/usr/bin/env bash
# Call 12 (one H200): build t is main at b80bc11 with calls/dsvar4.py's
# timers (not committed): k_gemm_dswiglu_bf16's consumer warpgroups time
# their waits for the ring's full buffers and for the drained staging
# tile, the epilogue its waits for the staged tile (clock64 cycles, a
# CTA's totals). BenchmarkDownSwiGLUBackward's fused row at the 3B and
# 1.5B shapes, one timed launch after one untimed.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for shp in 16384,2048,11008 16384,1536,8960; do
	(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp timeout 60 ../../.devbin/t/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward/fused' -test.benchtime 1x) >"$OUT/t-$shp.txt" 2>&1
	say "timers $shp: rc=$? at ${SECONDS}s"
	# The second launch's lines: sums over CTAs.
	grep 'DSDBG consumer' "$OUT/t-$shp.txt" | tail -264 | awk '{n++; full+=$8; dr+=$10; st+=$12; tot+=$14} END {printf "consumer warpgroups %d: full %.1f%%, drained %.1f%%, staging %.1f%% of their time\n", n, 100*full/tot, 100*dr/tot, 100*st/tot}' | tee -a "$OUT/summary.txt"
	grep 'DSDBG epilogue' "$OUT/t-$shp.txt" | tail -132 | awk '{n++; w+=$5; tot+=$7} END {printf "epilogues %d: waiting for staged %.1f%% of their time\n", n, 100*w/tot}' | tee -a "$OUT/summary.txt"
done
