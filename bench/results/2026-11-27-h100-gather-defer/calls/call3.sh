#!/usr/bin/env bash
# Call 3: build D (58819f2 + QKVRoPE with its cos and sin from a table
# k_rope_cs16 writes first, uncommitted). Tests of the new kernel
# and of those sharing its code; BenchmarkQKVRoPE at the 3B, 1.5B and 0.5B
# shapes; the 3B step with everything on and RLPIPE_CUDA_GEMM_QKV=0,
# alternated; a timeline with everything on.
set -u
tar xzf .devbin/b.tgz -C .devbin
B=$PWD/.devbin/D
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_CUDA_COMPILE_LOG=1 timeout 240 "$B/cuda.test" -test.run 'TestKernelNames|TestQKVRoPE|TestQKVFused|TestGateUpSwiGLU$|TestLogProbsFused$|TestRoPE' -test.v >"$R/cuda-tests.log" 2>&1)
say "cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
grep -E -- '--- (FAIL|SKIP)' "$R/cuda-tests.log" | head -20 | tee -a "$OUT/summary.txt"
grep -E -i 'gemm_qkv|spill' "$R/cuda-tests.log" | head -20 | tee -a "$OUT/summary.txt"
(cd model && timeout 150 "$B/model.test" -test.run 'TestQKVRoPEForward|TestDecoderParityHF' -test.v >"$R/model-tests.log" 2>&1)
say "model tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/model-tests.log" | tr '\n' ' ')"
for s in 16384,2048,16,2,128 16384,1536,12,2,128 16384,896,14,2,64; do
	(cd gpu/cuda && RLPIPE_BENCH_QKV=$s timeout 100 "$B/cuda.test" -test.run '^$' -test.bench 'QKVRoPE' -test.benchtime 20x >>"$R/bench.log" 2>&1)
done
grep -E 'Benchmark|FAIL' "$R/bench.log" | tee -a "$OUT/summary.txt"
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in on qkv0 on qkv0; do
	i=$((i + 1))
	case $v in
	qkv0) env=(RLPIPE_CUDA_GEMM_QKV=0) ;;
	late0) env=(RLPIPE_LATE_GATHERS=0) ;;
	*) env=() ;;
	esac
	env "${env[@]}" timeout 150 "$B/rlbench" "${W[@]}" --out "$R/3b-$v-$i.json" >"$R/3b-$v-$i.log" 2>&1
	say "3b $v run $i rc=$? $(tail -n 1 "$R/3b-$v-$i.log")"
done
timeout 150 "$B/rlbench" "${W[@]}" --steps 2 --timeline "$R/3b.trace.json" --out "$R/tl-3b.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
