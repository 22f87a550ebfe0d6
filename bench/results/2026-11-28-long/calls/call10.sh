#!/usr/bin/env bash
# Call 10 (one H200): build new, the backward's dS functions (wg_ds_cols,
# fa_ds_rows, fa_ds_cols) with their mask decided once a tile instead of
# in a branch an element (call 9's profile: a BSSY/BRA pair an element),
# against base (main at 91cdda9). The attention tests on new; the
# BenchmarkAttention rows (forward and backward) and BenchmarkOps' dk/dv
# and dq pass rows, new and base alternated twice; rlbench 3B at 8 × 2048
# and 2 × 8192, new and base alternated (the grad norms must agree to the
# bit: the same arithmetic).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t" "$OUT/rb"
(cd gpu/cuda && timeout 150 ../../.devbin/new/cuda.test -test.v -test.timeout 140s -test.run 'TestAttentionTensorCore|TestAttentionSpans|TestTensorCoreLaunch' >"$OUT/t/tests.log" 2>&1)
say "tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|deterministic|panic' "$OUT/t/tests.log" | head -30 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in new base; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention|BenchmarkOps/attention_bwd_8x2048_h12/2_d128_d' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/Benchmark//' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
for tok in 2048 8192; do
	seqs=$((16384 / tok))
	for v in new base; do
		((SECONDS > 470)) && break
		timeout 100 .devbin/$v/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --seqs $seqs --tokens-per-seq $tok --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q --out "$OUT/rb/3b-$tok-$v.json" >"$OUT/rb/3b-$tok-$v.log" 2>&1
		say "3b $tok $v rc=$? $(tail -n 1 "$OUT/rb/3b-$tok-$v.log" | cut -c1-200) $(python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["last_metrics"].get("grad_norm")))' "$OUT/rb/3b-$tok-$v.json" 2>&1)"
	done
done
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t rb 2>/dev/null; rm -rf t rb)
