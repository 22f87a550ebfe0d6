#!/usr/bin/env bash
# Call 5 (two GPUs of one host), build u (5df6e7c's replicate plus
# update_ref into a replica): stages' TestReplicateCUDADP2 (without
# update_ref, and with it every step), TestRunTinyCUDADP2 (whose on-device
# case now replicates its ref, synced by update_ref every 6 steps), then
# rlbench at dp 2, the ref replicated (auto) against sharded, alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t" "$OUT/rb"
(cd stages && timeout 240 ../.devbin/u/stages.test -test.v -test.timeout 230s -test.run 'TestReplicateCUDADP2|TestRunTinyCUDADP2' >"$OUT/t/stages.log" 2>&1)
say "stages tests rc=$? at ${SECONDS}s"
grep -E '^(\s*--- |ok|PASS|FAIL)|panic|_test.go' "$OUT/t/stages.log" | head -30 | tee -a "$OUT/summary.txt"
one() { # NAME MODEL [FLAGS...]
	local n=$1 m=$2
	shift 2
	timeout 150 .devbin/u/rlbench --backend cuda --config "examples/models/$m/config.json" --dp 2 --seqs 16 \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(grep -o 'replicate of model ref: [a-z]*' "$OUT/rb/$n.log" | head -1); $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-220)"
}
for r in 1 2; do
	for m in qwen2.5-3b qwen2.5-1.5b; do
		((SECONDS < 420)) || break
		one "$m-auto-$r" $m
		one "$m-shard-$r" $m --ref-replicate=false
	done
done
(cd "$OUT" && tar czf r.tgz t rb && rm -rf t rb)
