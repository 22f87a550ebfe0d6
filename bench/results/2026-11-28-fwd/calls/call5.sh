#!/usr/bin/env bash
# Call 5 (four GPUs of one host): build n, apply_fsdp2's overlap_reduce auto
# (the default; the plan turns it on at dp > 1 where it fits) and the
# arena's third order (largest area first). The stages package's
# multi-GPU CUDA tests (TestRunTinyCUDADP2's on-device case now runs with
# overlap_reduce chosen, against the CPU) and TestOverlapReduce; then
# rlbench's benchmark step at dp 4 (recompute auto, 8 x 2048 tokens a GPU),
# the default against --overlap-reduce=false, alternated, 3B and 1.5B:
# the plan's choice, tok/s, plan = high-water, grad norms.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb" "$OUT/t"
(cd stages && timeout 240 ../.devbin/n/stages.test -test.v -test.timeout 230s -test.run 'TestRunTinyCUDADP2|TestRunTinyCUDACP2|TestOverlapReduce$|TestEarlyUpdateCUDADP2' >"$OUT/t/stages.log" 2>&1)
say "stages tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic' "$OUT/t/stages.log" | head -30 | tee -a "$OUT/summary.txt"
one() { # NAME MODEL [FLAGS...]
	local n=$1 m=$2
	shift 2
	timeout 200 .devbin/n/rlbench --backend cuda --config "examples/models/$m/config.json" --dp 4 --seqs 32 \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(grep -o 'overlap_reduce of model actor: [a-z]*' "$OUT/rb/$n.log" | head -1); $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-260)"
}
for r in 1 2; do
	for m in qwen2.5-3b qwen2.5-1.5b; do
		((SECONDS < 480)) || break
		one "$m-auto-$r" $m
		one "$m-off-$r" $m --overlap-reduce=false
	done
done
(cd "$OUT" && tar czf r.tgz rb t && rm -rf rb t)
