#!/usr/bin/env bash
# Call 5: o_proj adds the attention's residual in its epilogue too
# (GemmAdd into the float32 mid, then RMSNorm of mid), and the device
# worker and its callers poll 50 us before blocking (RLPIPE_CUDA_SPIN_US).
# Tests on CUDA, the 3B step with everything on, GemmAdd off and the
# polling off, then best against best at 3B on this build.
set -u
B=$PWD/.devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd model && timeout 150 "$B/model.test" -test.run 'TestDecoderParityHF|TestDecoderBF16|TestFusedQKV|TestHeadStep|TestLayout' -test.v >"$R/model-tests.log" 2>&1)
say "model tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/model-tests.log" | tr '\n' ' ')"
(cd stages && timeout 200 "$B/stages.test" -test.run 'TestRunTinyCUDA$|TestSleepWakeCUDA' -test.v >"$R/stages.log" 2>&1)
say "stages CUDA tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
(cd gpu/cuda && timeout 100 "$B/cuda.test" -test.run 'TestGemmAdd|TestPoll|TestSpinFromEnv|TestRMSNormF32Rows' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in on add0 spin0 on; do
	i=$((i + 1))
	case $v in
	add0) env=(RLPIPE_CUDA_GEMM_ADD=0) ;;
	spin0) env=(RLPIPE_CUDA_SPIN_US=0) ;;
	*) env=() ;;
	esac
	env "${env[@]}" timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-$v-$i.json" >"$R/3b-$v-$i.log" 2>&1
	say "3b $v run $i rc=$? $(tail -n 1 "$R/3b-$v-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
OUT0=$OUT
OUT=$OUT0/f-3b FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=200 bash bench/fair_device.sh >$OUT0/fair-3b.log 2>&1
rm -rf $OUT0/f-3b/work-*
say "$(grep "best against best" $OUT0/fair-3b.log | tail -1)"
say "$(grep "| shared\|| own" $OUT0/fair-3b.log | tail -1)"
cd $OUT0 && tar czf f.tgz f-3b fair-3b.log && rm -rf f-3b fair-3b.log
