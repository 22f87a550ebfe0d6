#!/usr/bin/env bash
# Call 4: the fused gate/up kernels at three models' shapes, random
# operands, and ncu's occupancy, launch and warp-state sections on each
# fused kernel at 3B shapes.
set -u
R=$OUT/r; mkdir -p $R; B=$PWD/.devbin
cd gpu/cuda
for s in 16384,2048,11008 16384,1536,8960 16384,896,4864; do
	RLPIPE_BENCH_GATE_UP=$s timeout 100 $B/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU' -test.benchtime 20x >>$R/bench.log 2>&1
done
grep Benchmark $R/bench.log
timeout 200 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
	--section WarpStateStats --section SchedulerStats --kernel-name regex:'gemm_swiglu' --launch-count 12 \
	$B/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused' -test.benchtime 2x >$R/ncu.log 2>&1
echo "ncu rc=$?"
cd $OUT && tar czf r.tgz r && rm -rf r
