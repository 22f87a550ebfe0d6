#!/usr/bin/env bash
# Call 2 (one H200): build o (main + the one-pass attention backward,
# AttentionBackwardOnePass, not yet used by the stages): its tests and the
# attention tests around it; rlpipe's attention (forward, two-pass and
# one-pass backward) against PyTorch's, with PyTorch's default choice of
# backend listed; then best against best at 3B (8 × 2048) with the peer on
# cuDNN's attention (FAIR_PEER_SDPA=cudnn), both AC configurations,
# compiled.
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/n/cuda.test .devbin/cuda.test
cp .devbin/n/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t"
(cd gpu/cuda && timeout 200 ../../.devbin/cuda.test -test.v -test.timeout 190s -test.run 'TestAttentionOnePass|TestAttentionTensorCore|TestTensorCoreLaunch|TestKernelNames' >"$OUT/t/tests.log" 2>&1)
say "tests rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|PASS|FAIL)|not the same|dq:|panic' "$OUT/t/tests.log" | head -40 | tee -a "$OUT/summary.txt"
OUT=$OUT/attn ATTN_BUDGET_S=200 bash bench/attn_peer_device.sh >"$OUT/attn.log" 2>&1
cat "$OUT/attn/table.md" | tee -a "$OUT/summary.txt"
grep -E '\| default' "$OUT/attn/logs/peer-attn.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_PEER_SDPA=cudnn FAIR_RUNS="auto peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=$((570 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-*
(cd "$OUT" && tar czf r.tgz t attn f3 fair3.log attn.log 2>/dev/null; rm -rf t attn f3 fair3.log attn.log)
