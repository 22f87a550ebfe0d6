#!/usr/bin/env bash
# Call 7: S is main with attention.cu compiled as eight modules
# (splitParts); M is 700f2e1 (one module). S's compile times per module
# (sm_90a, one at a time) and its attention and cache tests; then the
# 1.5B step from an empty kernel cache, S and M alternated (setup_s
# includes compiling every module, in parallel), and S once more with its
# cache warm.
set -u
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && RLPIPE_COMPILE_ARCHS=sm_90a timeout 200 ../../.devbin/S/cuda.test -test.run 'TestKernelsCompile$' -test.v >"$R/compile.log" 2>&1)
say "compile rc=$?"
grep -E 'for sm_90a' "$R/compile.log" | while read -r l; do say "  $l"; done
(cd gpu/cuda && timeout 200 ../../.devbin/S/cuda.test -test.run 'TestAttentionTensorCore|TestKernelCacheReused|TestSplitParts|TestKernelNames' -test.v >"$R/tests.log" 2>&1)
say "S tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
W=(--backend cuda --config examples/models/qwen2.5-1.5b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 3 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in S M S M; do
	i=$((i + 1))
	RLPIPE_CACHE_DIR=/tmp/kc-$b-$i timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/15b-$b-$i.json" >"$R/15b-$b-$i.log" 2>&1
	say "1.5b $b run $i (empty kernel cache) rc=$? setup_s $(python3 -c "import json;print(json.load(open('$R/15b-$b-$i.json')).get('setup_s'))" 2>/dev/null) $(tail -n 1 "$R/15b-$b-$i.log")"
done
RLPIPE_CACHE_DIR=/tmp/kc-S-3 timeout 150 .devbin/S/rlbench "${W[@]}" --out "$R/15b-S-warm.json" >"$R/15b-S-warm.log" 2>&1
say "1.5b S (warm kernel cache) rc=$? setup_s $(python3 -c "import json;print(json.load(open('$R/15b-S-warm.json')).get('setup_s'))" 2>/dev/null) $(tail -n 1 "$R/15b-S-warm.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
