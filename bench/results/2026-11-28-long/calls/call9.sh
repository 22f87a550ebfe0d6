#!/usr/bin/env bash
# Call 9 (one H200): Nsight Compute on the attention backward's two passes
# (main at f17f992): one launch each of k_ws_dkv_bf16_128 and
# k_ws_dq_bf16_128 in BenchmarkAttention at 8 × 2048, 16/2 heads of 128,
# --set full; the report and its details page as text.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
/usr/local/cuda/bin/ncu --version >>"$OUT/env.txt" 2>&1
mkdir -p "$OUT/n"
cd gpu/cuda
RLPIPE_BENCH_ATTN="8x2048/16/2/128" timeout 400 /usr/local/cuda/bin/ncu --set full -k 'regex:k_ws_(dkv|dq)_bf16_128' --launch-count 2 \
	-o "$OUT/n/bwd" ../../.devbin/m/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd' -test.benchtime 1x >"$OUT/n/ncu.log" 2>&1
say "ncu rc=$? at ${SECONDS}s"
tail -n 5 "$OUT/n/ncu.log" | tee -a "$OUT/summary.txt"
/usr/local/cuda/bin/ncu --import "$OUT/n/bwd.ncu-rep" --page details >"$OUT/n/details.txt" 2>&1
/usr/local/cuda/bin/ncu --import "$OUT/n/bwd.ncu-rep" --page source --csv --print-source sass >"$OUT/n/source.csv" 2>&1
say "import rc=$? at ${SECONDS}s; $(wc -l <"$OUT/n/details.txt") lines"
grep -E 'k_ws_|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy' "$OUT/n/details.txt" | head -40 | tee -a "$OUT/summary.txt"
cd "$OUT" && tar czf n.tgz n && rm -rf n
