#!/usr/bin/env bash
# Call 3 (one H200). Builds: b0 is main at ff8996d; new is the change
# (sigmoid with ex2/div .approx.ftz, swiglu8/dswiglu8 rounding pairs, the
# dswiglu epilogue's loads a pair ahead at 160/96 registers); nz is new
# with calls/sigmoid-forms.txt (k_zz_sigmoid_forms and its test, not
# committed); b0t is b0's kernels with new's tests; mut is new with
# dswiglu8's du rounding left out (the bits test must fail).
# 1. nz: the two sigmoid forms over all 2^32 float32 inputs;
# 2. new: gpu/cuda's tests of the changed kernels; b0t: the new tests on
#    the old kernels; mut: the bits test;
# 3. BenchmarkDownSwiGLUBackward and BenchmarkGateUpSwiGLU at the 3B and
#    1.5B shapes, b0 new b0 new;
# 4. rlbench 3B (timelines in round 1) and 1.5B, two rounds, new and b0
#    alternated;
# 5. the stages package's CUDA tests on new, gpu/cuda's whole suite on
#    new, if time is left; the SASS of new's k_gemm_dswiglu_bf16.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/ops" "$OUT/rb" "$OUT/t"
t() { # build name regexp
	(cd gpu/cuda && timeout 200 ../../.devbin/$1/cuda.test -test.run "$3" -test.v) >"$OUT/t/$2.log" 2>&1
	say "tests $2 ($1): rc=$? at ${SECONDS}s"
	grep -E '^(--- |FAIL|ok|PASS)|differing|not the same' "$OUT/t/$2.log" | head -40 | tee -a "$OUT/summary.txt"
}
t nz sigmoid 'TestZZSigmoidForms'
t new changed 'TestDownSwiGLUBackward|TestGateUpSwiGLU|TestElementwise|TestKernelNames|TestTileQueue'
t b0t oldkernels 'TestDownSwiGLUBackwardBits|TestGateUpSwiGLUSpecial'
t mut mutation 'TestDownSwiGLUBackwardBits'
i=0
for v in b0 new b0 new; do
	i=$((i + 1))
	for shp in 16384,2048,11008 16384,1536,8960; do
		f="$OUT/ops/ds$i-$v-${shp//,/x}.txt"
		(cd gpu/cuda && RLPIPE_BENCH_DOWN=$shp RLPIPE_BENCH_GATE_UP=$shp timeout 90 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'DownSwiGLUBackward|GateUpSwiGLU' -test.benchtime 50x) >"$f" 2>&1
		say "ops $v $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark' "$f" | tee -a "$OUT/summary.txt"
	done
done
run() { # build model round [extra...]
	local b=$1 m=$2 r=$3
	shift 3
	timeout 120 .devbin/$b/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-$b-$r.json" "$@" >"$OUT/rb/$m-$b-$r.log" 2>&1
	say "$m $b round $r: rc=$? $(tail -1 "$OUT/rb/$m-$b-$r.log") at ${SECONDS}s"
}
run new qwen2.5-3b 1 --timeline "$OUT/rb/3b-new.trace.json"
run b0 qwen2.5-3b 1 --timeline "$OUT/rb/3b-b0.trace.json"
run new qwen2.5-3b 2
run b0 qwen2.5-3b 2
run new qwen2.5-1.5b 1
run b0 qwen2.5-1.5b 1
run new qwen2.5-1.5b 2
run b0 qwen2.5-1.5b 2
/usr/local/cuda/bin/cuobjdump -sass -fun k_gemm_dswiglu_bf16 .devbin/sass/new/gemm.cubin >"$OUT/ops/new.sass" 2>&1
/usr/local/cuda/bin/cuobjdump -sass -fun k_gemm_swiglu_bf16 .devbin/sass/new/gemm.cubin >"$OUT/ops/new-gateup.sass" 2>&1
if ((SECONDS < 420)); then
	(cd stages && timeout $((540 - SECONDS)) ../.devbin/new/stages.test -test.run 'CUDA' -test.v) >"$OUT/t/stages-cuda.log" 2>&1
	say "stages CUDA tests (new): rc=$? at ${SECONDS}s"
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/t/stages-cuda.log" | tee -a "$OUT/summary.txt"
fi
if ((SECONDS < 480)); then
	t new all '.'
fi
(cd "$OUT" && tar czf r.tgz ops rb t; rm -rf ops rb t)
