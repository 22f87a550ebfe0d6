#!/usr/bin/env bash
# Call 5 (one H200), build s5 (main at the commit after 8907e85's docs:
# the one-kernel head and its tests, TestLogProbsHeadStoreBadTarget):
# gpu/cuda's whole test suite, the model package's tests (HF parity on
# the CUDA backend) and the stages package's one-GPU CUDA tests, verbose;
# then the GPU's SM clock and power, sampled every 100 ms, during
# rlbench's 1.5B step with real loss gradients and with them left at zero
# (d4's diagnostic build, RLPIPE_DIAG_NOGRADS=1): is the step held by the
# power limit?
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/r"
B=.devbin/s5
(cd gpu/cuda && timeout 300 ../../$B/cuda.test -test.v -test.timeout 290s >"$OUT/r/cuda.log" 2>&1)
say "gpu/cuda suite rc=$? at ${SECONDS}s: $(grep -c '^--- PASS' "$OUT/r/cuda.log") pass, $(grep -c '^--- SKIP' "$OUT/r/cuda.log") skip, $(grep -c '^--- FAIL' "$OUT/r/cuda.log") fail"
grep -E '^--- (FAIL|SKIP)|^(ok|FAIL|PASS)$|panic' "$OUT/r/cuda.log" | head -20 | tee -a "$OUT/summary.txt"
grep -E '^--- PASS: TestLogProbs' "$OUT/r/cuda.log" | tee -a "$OUT/summary.txt"
(cd model && timeout 100 ../$B/model.test -test.v -test.timeout 95s >"$OUT/r/model.log" 2>&1)
say "model tests rc=$? at ${SECONDS}s: $(grep -c '^--- PASS' "$OUT/r/model.log") pass, $(grep -c '^--- FAIL' "$OUT/r/model.log") fail"
(cd stages && timeout 90 ../$B/stages.test -test.v -test.run 'CUDA' -test.timeout 85s >"$OUT/r/stages.log" 2>&1)
say "stages CUDA tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|panic' "$OUT/r/stages.log" | head -30 | tee -a "$OUT/summary.txt"
for mode in "" 1; do
	for r in 1 2; do
		((SECONDS < 500)) || break
		nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 100 >"$OUT/r/smi-${mode:-real}-$r.csv" 2>&1 &
		smi=$!
		RLPIPE_DIAG_NOGRADS=$mode timeout 120 $B/rlbench-diag --backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 8 --tokens-per-seq 2048 \
			--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 6 --precision bf16 --recompute-auto --cache /tmp/rbc -q \
			--out "$OUT/r/rb-${mode:-real}-$r.json" >"$OUT/r/rb-${mode:-real}-$r.log" 2>&1
		rc=$?
		kill $smi
		say "1.5B ${mode:-real} $r rc=$rc: $(tail -n 1 "$OUT/r/rb-${mode:-real}-$r.log" | grep -o 'train [0-9]* tok/s')"
		python3 - "$OUT/r/smi-${mode:-real}-$r.csv" <<'PY' | tee -a "$OUT/summary.txt"
import sys
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        rows.append((float(f[1].split()[0]), float(f[2].split()[0]), f[4]))
    except (ValueError, IndexError):
        pass
busy = [r for r in rows if r[1] > 300]
if busy:
    clk = sorted(r[0] for r in busy); pw = sorted(r[1] for r in busy)
    th = {}
    for r in busy: th[r[2]] = th.get(r[2], 0) + 1
    print(f"  samples over 300 W: {len(busy)} of {len(rows)}; SM clock median {clk[len(clk)//2]:.0f} MHz (min {clk[0]:.0f}, max {clk[-1]:.0f}); power median {pw[len(pw)//2]:.0f} W (max {pw[-1]:.0f}); throttle reasons {th}")
else:
    print(f"  no sample over 300 W ({len(rows)} samples)")
PY
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
