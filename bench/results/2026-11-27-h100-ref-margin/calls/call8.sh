#!/usr/bin/env bash
# Call 8: S (0c4d944). Which cache spared call 7's later runs their
# compile: the CUDA driver's (~/.nv/ComputeCache, CUDA_CACHE_PATH)? The
# 1.5B step, each run with an empty RLPIPE_CACHE_DIR: first with an empty
# CUDA_CACHE_PATH, then with the same one again, then with the driver's
# cache disabled (CUDA_CACHE_DISABLE=1).
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
say "before: $(du -sh ~/.nv/ComputeCache 2>/dev/null || echo 'no ~/.nv/ComputeCache')"
W=(--backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 1 --precision bf16 --recompute-auto --cache /tmp/rbc)
one() {
	local name=$1
	shift
	env RLPIPE_CACHE_DIR=/tmp/kc-$name "$@" timeout 150 .devbin/S/rlbench "${W[@]}" --out "$R/$name.json" >"$R/$name.log" 2>&1
	say "$name rc=$? setup_s $(python3 -c "import json;print(round(json.load(open('$R/$name.json')).get('setup_s'),2))" 2>/dev/null) $(tail -n 1 "$R/$name.log" | cut -c1-90)"
}
one first CUDA_CACHE_PATH=/tmp/cc-a
say "  /tmp/cc-a: $(du -sh /tmp/cc-a 2>/dev/null | cut -f1), kernel cache: $(ls /tmp/kc-first/kernels | wc -l) files"
one same-driver-cache CUDA_CACHE_PATH=/tmp/cc-a
one new-driver-cache CUDA_CACHE_PATH=/tmp/cc-b
one driver-cache-off CUDA_CACHE_DISABLE=1
one kernel-cache-warm CUDA_CACHE_DISABLE=1 RLPIPE_CACHE_DIR=/tmp/kc-first
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
