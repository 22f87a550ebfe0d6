#!/usr/bin/env bash
# Call 7 (one H200). Build diag: main at 20d1350 with stages/train.go's
# chunkGrads timing its parts (a Sync first; the loss's setup on a
# micro-batch's first chunk; the two downloads; TokenGrads.Fill; the two
# uploads), printed a micro-batch at a time ("DIAG" lines); not committed.
# Build h: main at 20d1350 with BenchmarkLogProbsHead's step rows. rlbench
# 3B and 1.5B with diag; then Nsight Compute on BenchmarkDownSwiGLUBackward
# at the 3B shape (L2, DRAM and SM throughput of the fused kernel and of
# cuBLASLt's product).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
for m in qwen2.5-3b qwen2.5-1.5b; do
	timeout 150 .devbin/diag/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m.json" >"$OUT/rb/$m.log" 2>&1
	say "$m: rc=$? $(tail -1 "$OUT/rb/$m.log") at ${SECONDS}s"
	grep DIAG "$OUT/rb/$m.log" | tee -a "$OUT/summary.txt"
done
(cd gpu/cuda && RLPIPE_BENCH_DOWN=16384,2048,11008 timeout 200 /usr/local/cuda/bin/ncu --kernel-name regex:'dswiglu|gemm|swiglu' --launch-count 6 \
	--metrics gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
	../../.devbin/h/cuda.test -test.run '^$' -test.bench DownSwiGLUBackward -test.benchtime 1x) >"$OUT/ncu.txt" 2>&1
say "ncu: rc=$? at ${SECONDS}s"
grep -E '(k_gemm|k_swiglu|sm90|gemm|Kernel|==PROF==|ERR|duration|throughput|bytes|hmma)' "$OUT/ncu.txt" | head -80 | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz rb; rm -rf rb)
