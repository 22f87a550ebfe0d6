#!/usr/bin/env bash
# Call 2 (one H200): Nsight Compute on the attention backward's two passes
# at two shapes with main at e032d70 (build base): one launch each of
# k_ws_dkv_bf16_128 and k_ws_dq_bf16_128 in BenchmarkAttention at
# 8 x 2048 and at 1 x 16384, 16/2 heads of 128, --set full; the details
# page and the per-instruction samples as text. The question: at 16384
# tokens a sequence the backward takes 3.6 times the forward, at 2048 2.95
# times (cuDNN's: 2.99 and 3.15); which pass loses, and to what.
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/n"
cd gpu/cuda
for shape in 8x2048 1x16384; do
	RLPIPE_BENCH_ATTN="$shape/16/2/128" timeout 200 /usr/local/cuda/bin/ncu --set full -k 'regex:k_ws_(dkv|dq)_bf16_128' --launch-count 2 \
		-o "$OUT/n/$shape" ../../.devbin/base/cuda.test -test.run '^$' -test.bench 'BenchmarkAttention/bwd' -test.benchtime 1x >"$OUT/n/$shape-ncu.log" 2>&1
	say "$shape ncu rc=$? at ${SECONDS}s"
	/usr/local/cuda/bin/ncu --import "$OUT/n/$shape.ncu-rep" --page details >"$OUT/n/$shape-details.txt" 2>&1
	/usr/local/cuda/bin/ncu --import "$OUT/n/$shape.ncu-rep" --page source --csv --print-source sass >"$OUT/n/$shape-source.csv" 2>&1
	rm -f "$OUT/n/$shape.ncu-rep"
	grep -E 'k_ws_|Duration|Compute \(SM\) Throughput|L2 Hit Rate|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued' "$OUT/n/$shape-details.txt" | head -30 | tee -a "$OUT/summary.txt"
done
cd "$OUT" && tar czf n.tgz n && rm -rf n
