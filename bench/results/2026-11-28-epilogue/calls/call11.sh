#!/usr/bin/env bash
# Call 11 (one H200): Nsight Compute's warp-state and scheduler sections on
# k_gemm_dswiglu_bf16 at the 3B shape (build h: main at 3de2fdf), for the
# stall reasons behind its tensor pipes' 69% (call 7).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_BENCH_DOWN=16384,2048,11008 timeout 240 /usr/local/cuda/bin/ncu --kernel-name regex:'dswiglu' --launch-count 1 \
	--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
	../../.devbin/h/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward/fused' -test.benchtime 1x) >"$OUT/ncu.txt" 2>&1
say "ncu: rc=$? at ${SECONDS}s"
grep -vE '^\s*$' "$OUT/ncu.txt" | tail -70 | tee -a "$OUT/summary.txt"
