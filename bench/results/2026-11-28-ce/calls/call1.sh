#!/usr/bin/env bash
# Call 1 (four GPUs of one host): build w, the device arenas as NCCL
# windows (RunOptions.NCCLWindows, rlbench --nccl-windows) with
# NCCL_CTA_POLICY=2, so that the all-gathers run on the copy engines.
# Tests: gpu/cuda TestShareable; libnccl TestCUDACollectives and
# TestCUDAWindowCollectives with the policy (NCCL's "Init CE" line says
# the copy-engine path ran); stages TestRunTinyCUDADP2 (its windows cases)
# with the policy. Then rlbench's benchmark step at dp 4 (recompute auto,
# 8 x 2048 tokens a GPU): base against windows + policy 2, alternated,
# 3B then 1.5B; last, windows with the default policy.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
nvidia-smi topo -m >>"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb" "$OUT/t"
(cd gpu/cuda && timeout 120 ../../.devbin/w/cuda.test -test.v -test.run 'TestShareable$' >"$OUT/t/cuda.log" 2>&1)
say "cuda TestShareable rc=$? at ${SECONDS}s: $(grep -E '^(--- |ok|PASS|FAIL)' "$OUT/t/cuda.log" | tr '\n' ' ')"
(cd nccl/libnccl && NCCL_CTA_POLICY=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV timeout 120 ../../.devbin/w/libnccl.test -test.v -test.run 'TestCUDACollectives$|TestCUDAWindowCollectives$' >"$OUT/t/libnccl.log" 2>&1)
say "libnccl rc=$? at ${SECONDS}s: $(grep -E '^(--- |ok|PASS|FAIL)' "$OUT/t/libnccl.log" | tr '\n' ' '); Init CE lines: $(grep -c 'Init CE' "$OUT/t/libnccl.log"); symmetric: $(grep -m2 -E 'Symmetric VA|CTA' "$OUT/t/libnccl.log" | tr '\n' ' ')"
(cd stages && NCCL_CTA_POLICY=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 200 ../.devbin/w/stages.test -test.v -test.timeout 190s -test.run 'TestRunTinyCUDADP2' >"$OUT/t/stages.log" 2>&1)
say "stages rc=$? at ${SECONDS}s: Init CE lines: $(grep -c 'Init CE' "$OUT/t/stages.log")"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic' "$OUT/t/stages.log" | head -20 | tee -a "$OUT/summary.txt"
one() { # NAME MODEL [FLAGS...]
	local n=$1 m=$2
	shift 2
	timeout 150 .devbin/w/rlbench --backend cuda --config "examples/models/$m/config.json" --dp 4 --seqs 32 \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: CE $(grep -c 'Init CE' "$OUT/rb/$n.log"); $(grep -v NCCL "$OUT/rb/$n.log" | tail -n 1 | cut -c1-300)"
}
for r in 1 2; do
	for m in qwen2.5-3b qwen2.5-1.5b; do
		((SECONDS < 420)) || break
		one "$m-base-$r" $m
		NCCL_CTA_POLICY=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT one "$m-ce-$r" $m --nccl-windows
	done
done
((SECONDS < 500)) && NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT one "qwen2.5-3b-win" qwen2.5-3b --nccl-windows
(cd "$OUT" && tar czf r.tgz rb t && rm -rf rb t)
