#!/usr/bin/env bash
# Call 1 (one H200): new, the attention forward's softmax with its mask
# decided once a tile (fa_softmax_m, branch fwd-mask2), against base (main
# at e032d70). The attention tests on new; BenchmarkAttention new and base
# alternated twice; attn_peer_device.sh on new (rlpipe against PyTorch's
# SDPA backends in this call); rlbench 3B at 8 x 2048 and 2 x 8192, new and
# base (grad norms must agree to the bit); Nsight Compute on one launch of
# new's k_ws_fwd_bf16_128 at 8 x 2048, 16/2 heads of 128.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
/usr/local/cuda/bin/ncu --version >>"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t" "$OUT/rb" "$OUT/n"
(cd gpu/cuda && timeout 150 ../../.devbin/new/cuda.test -test.v -test.timeout 140s -test.run 'TestAttentionTensorCore|TestAttentionSpans|TestTensorCoreLaunch' >"$OUT/t/tests.log" 2>&1)
say "tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/t/tests.log" | head -30 | tee -a "$OUT/summary.txt"
for r in 1 2; do
	for v in new base; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$v/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention' -test.benchtime 20x >"$OUT/t/bench-$v-$r.log" 2>&1)
		say "$v round $r rc=$?"
		grep -E 'ns/op' "$OUT/t/bench-$v-$r.log" | sed 's/Benchmark//' | awk '{print $1, $3/1000 " us", $5, $6}' | tee -a "$OUT/summary.txt"
	done
done
say "at ${SECONDS}s"
cp .devbin/new/cuda.test .devbin/cuda.test
OUT="$OUT/p" bash bench/attn_peer_device.sh >/dev/null 2>&1
say "peer rc=$? at ${SECONDS}s"
cat "$OUT/p/table.md" >>"$OUT/summary.txt"
for tok in 2048 8192; do
	seqs=$((16384 / tok))
	for v in new base; do
		((SECONDS > 420)) && break
		timeout 100 .devbin/$v/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --seqs $seqs --tokens-per-seq $tok --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc -q --out "$OUT/rb/3b-$tok-$v.json" >"$OUT/rb/3b-$tok-$v.log" 2>&1
		say "3b $tok $v rc=$? $(tail -n 1 "$OUT/rb/3b-$tok-$v.log" | cut -c1-200) $(python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["last_metrics"].get("grad_norm")))' "$OUT/rb/3b-$tok-$v.json" 2>&1)"
	done
done
say "at ${SECONDS}s"
if ((SECONDS < 470)); then
	(cd gpu/cuda && RLPIPE_BENCH_ATTN="8x2048/16/2/128" timeout 90 /usr/local/cuda/bin/ncu --set full -k 'regex:k_ws_fwd_bf16_128' --launch-count 1 \
		-o "$OUT/n/fwd" ../../.devbin/new/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/fwd' -test.benchtime 1x >"$OUT/n/ncu.log" 2>&1)
	say "ncu rc=$? at ${SECONDS}s"
	/usr/local/cuda/bin/ncu --import "$OUT/n/fwd.ncu-rep" --page details >"$OUT/n/details.txt" 2>&1
	/usr/local/cuda/bin/ncu --import "$OUT/n/fwd.ncu-rep" --page source --csv --print-source sass >"$OUT/n/source.csv" 2>&1
	rm -f "$OUT/n/fwd.ncu-rep"
	grep -E 'k_ws_|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy' "$OUT/n/details.txt" | head -20 | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
(cd "$OUT" && tar czf r.tgz t rb n p 2>/dev/null; rm -rf t rb n p)
