#!/usr/bin/env bash
# Call 3: the log-prob head without float32 logits (LogProbsFused:
# k_lp_head_*, k_lp_combine) and the warp-per-row RMSNorm of float32 rows
# (k_rmsnorm_r*). Tests, BenchmarkLogProbsHead at three models' shapes, the
# 3B step with both on, the head off (RLPIPE_CUDA_LP_FUSED=0) and the norm
# off (RLPIPE_CUDA_NORM_WARP=0), alternated, and a timeline with both on.
set -u
B=$PWD/.devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 300 "$B/cuda.test" -test.run 'TestKernelsCompile|TestRMSNorm|TestAddRMSNorm16|TestFusedNorms|TestLogProbs' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd model && timeout 150 "$B/model.test" -test.run 'TestDecoderParityHF|TestDecoderBF16|TestHeadStep|TestHeadForwardFused' -test.v >"$R/model-tests.log" 2>&1)
say "model tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/model-tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 "$B/stages.test" -test.run 'TestRunTinyCUDA$' -test.v >"$R/stages.log" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
for s in 2048,2048,151936 2048,1536,151936 2048,896,151936; do
	(cd gpu/cuda && RLPIPE_BENCH_LP=$s timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'LogProbsHead' -test.benchtime 20x >>"$R/bench.log" 2>&1)
done
grep -E 'Benchmark|FAIL' "$R/bench.log" | tee -a "$OUT/summary.txt"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
if grep -q -- '--- FAIL' "$R/cuda-tests.log"; then vs="lp0"; say "cuda tests failed: only lp0 runs"; else vs="on lp0 norm0 on lp0 norm0"; fi
for v in $vs; do
	i=$((i + 1))
	case $v in
	lp0) env=(RLPIPE_CUDA_LP_FUSED=0) ;;
	norm0) env=(RLPIPE_CUDA_NORM_WARP=0) ;;
	*) env=() ;;
	esac
	env "${env[@]}" timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-$v-$i.json" >"$R/3b-$v-$i.log" 2>&1
	say "3b $v run $i rc=$? $(tail -n 1 "$R/3b-$v-$i.log")"
done
if [ "$vs" != lp0 ]; then
	timeout 200 "$B/rlbench" "${W[@]}" --steps 2 --timeline "$R/3b.trace.json" --out "$R/tl-3b.json" >"$R/tl.log" 2>&1
	say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
fi
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
