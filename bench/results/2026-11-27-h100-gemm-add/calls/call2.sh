#!/usr/bin/env bash
# Call 2: the warp-per-row RMSNorm and AddRMSNorm forwards (k_rmsnorm_r*,
# k_add_rmsnorm_r*). Tests, BenchmarkOps' norm rows with the kernels on and
# off (RLPIPE_CUDA_NORM_WARP=0), the 3B step alternated, a timeline.
set -u
B=$PWD/.devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 240 "$B/cuda.test" -test.run 'TestKernelsCompile|TestRMSNorm|TestAddRMSNorm16|TestFusedNorms|TestGemmAdd' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
(cd model && timeout 150 "$B/model.test" -test.run 'TestDecoderParityHF|TestDecoderBF16|TestFusedQKV' -test.v >"$R/model-tests.log" 2>&1)
say "model tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/model-tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 "$B/stages.test" -test.run 'TestRunTinyCUDA$' -test.v >"$R/stages.log" 2>&1)
say "stages tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
for v in 1 0 1 0; do
	(cd gpu/cuda && RLPIPE_CUDA_NORM_WARP=$v timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'Ops/rmsnorm_fwd' -test.benchtime 200x >"$R/bench-warp$v.log" 2>&1)
	say "warp=$v $(grep Benchmark "$R/bench-warp$v.log" | tr -s ' \t' ' ' | tr '\n' ' ')"
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in 1 0 1 0; do
	i=$((i + 1))
	RLPIPE_CUDA_NORM_WARP=$v timeout 200 "$B/rlbench" "${W[@]}" --out "$R/3b-warp$v-$i.json" >"$R/3b-warp$v-$i.log" 2>&1
	say "3b norm-warp=$v run $i rc=$? $(tail -n 1 "$R/3b-warp$v-$i.log")"
done
timeout 200 "$B/rlbench" "${W[@]}" --steps 2 --timeline "$R/3b.trace.json" --out "$R/tl-3b.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
