#!/usr/bin/env bash
# Call 1: the residual add in the down product's epilogue (GemmAdd).
# Tests (kernels compile, GemmAdd, HF parity on CUDA, the tiny CUDA run),
# the gate/up benchmark at 3B shapes with nvidia-smi sampling the SM clock
# and power, the 3B step with RLPIPE_CUDA_GEMM_ADD on and off alternated,
# and a timeline of the step with it on.
set -u
B=$PWD/.devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv >"$R/env.txt"
(cd gpu/cuda && timeout 240 "$B/cuda.test" -test.run 'TestKernelsCompile|TestGemmAdd|TestGateUpSwiGLU$' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd model && timeout 150 "$B/model.test" -test.run 'TestDecoderParityHF|TestDecoderBF16|TestFusedQKV|TestHeadStep' -test.v >"$R/model-tests.log" 2>&1)
say "model tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/model-tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 "$B/stages.test" -test.run 'TestRunTinyCUDA$|TestGateUpFused' -test.v >"$R/stages.log" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
# The SM clock and power while each row of the gate/up benchmark runs.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,nounits -lms 50 >"$R/smi.csv" 2>&1 &
smi=$!
for row in unfused products fused; do
	echo "mark $row start $(date +%Y/%m/%d\ %H:%M:%S.%3N)" >>"$R/marks.txt"
	(cd gpu/cuda && RLPIPE_BENCH_GATE_UP=16384,2048,11008 timeout 100 "$B/cuda.test" -test.run '^$' -test.bench "GateUpSwiGLU/$row" -test.benchtime 60x >>"$R/bench.log" 2>&1)
	echo "mark $row end $(date +%Y/%m/%d\ %H:%M:%S.%3N)" >>"$R/marks.txt"
	sleep 2
done
kill $smi
grep Benchmark "$R/bench.log" | tee -a "$OUT/summary.txt"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in 1 0 1 0; do
	i=$((i + 1))
	RLPIPE_CUDA_GEMM_ADD=$v timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-add$v-$i.json" >"$R/3b-add$v-$i.log" 2>&1
	say "3b gemm-add=$v run $i rc=$? $(tail -n 1 "$R/3b-add$v-$i.log")"
done
timeout 200 "$B/rlbench" "${W[@]}" --steps 2 --timeline "$R/3b.trace.json" --out "$R/tl-3b.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
