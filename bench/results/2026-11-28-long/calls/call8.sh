#!/usr/bin/env bash
# Call 8 (one H200): build t, the TMA dk/dv pass's consumers taking turns
# to issue their products (RLPIPE_CUDA_BWD_PINGPONG, on by default; =0 is
# main's kernel). The attention tests (both forms); BenchmarkAttention's
# backward rows and BenchmarkOps' dk/dv and dq pass rows with turns (pp)
# and without (nopp), alternated twice; rlbench 3B at 8 × 2048 and
# 2 × 8192, pp and nopp alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t" "$OUT/rb"
(cd gpu/cuda && timeout 150 ../../.devbin/t/cuda.test -test.v -test.timeout 140s -test.run 'TestAttentionTensorCore|TestTensorCoreLaunch|TestAttentionSpans' >"$OUT/t/tests.log" 2>&1)
say "tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|deterministic|panic' "$OUT/t/tests.log" | head -30 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in pp nopp; do
		e=1; [[ $v == nopp ]] && e=0
		(cd gpu/cuda && RLPIPE_CUDA_BWD_PINGPONG=$e timeout 100 ../../.devbin/t/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd|BenchmarkOps/attention_bwd_8x2048_h12/2_d128_d.*pass-' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/Benchmark//' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
for tok in 2048 8192; do
	seqs=$((16384 / tok))
	for v in pp nopp; do
		e=1; [[ $v == nopp ]] && e=0
		((SECONDS > 480)) && break
		RLPIPE_CUDA_BWD_PINGPONG=$e timeout 100 .devbin/t/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --seqs $seqs --tokens-per-seq $tok --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q --out "$OUT/rb/3b-$tok-$v.json" >"$OUT/rb/3b-$tok-$v.log" 2>&1
		say "3b $tok $v rc=$? $(tail -n 1 "$OUT/rb/3b-$tok-$v.log" | cut -c1-200)"
	done
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t rb 2>/dev/null; rm -rf t rb)
