#!/usr/bin/env bash
# Call 1 (H100): the peer with each decoder layer under torch.compile
# (peer_fsdp2.py --compile layers), against the peer without it and
# rlpipe's auto, at 1.5B, one fair_device.sh. Build 1 is main at this
# section's first commit (rlbench unchanged since 78b59da).
set -u
tar xzf .devbin/b.tgz -C .devbin
cp .devbin/1/rlbench .devbin/rlbench
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
	python3 -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
	gcc --version | head -1
	nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# A tiny model first: if the compiled peer fails, stop here.
timeout 180 python3 bench/peer_fsdp2.py --config examples/models/tiny-qwen2/config.json --seqs 4 --tokens-per-seq 256 --prompt-tokens 16 --chunk 256 --warmup 1 --steps 2 --ac none --compile layers --out "$OUT/tiny-compile.json" >"$OUT/tiny-compile.log" 2>&1
say "tiny compile: rc=$? $(tail -1 "$OUT/tiny-compile.log")"
grep -q '"status": "ok"' "$OUT/tiny-compile.json" 2>/dev/null || exit 1
python3 -c 'import json; print(json.dumps(json.load(open("'"$OUT"'/tiny-compile.json")).get("compile"))[:1500])' | tee -a "$OUT/summary.txt"
OUT=$OUT/f FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac peer-ac peer-noac-compile peer-ac-compile" FAIR_BUDGET_S=530 bash bench/fair_device.sh >"$OUT/fair.log" 2>&1
rm -rf "$OUT/f"/work-*
grep -E 'rc=|best against best|\| shared' "$OUT/fair.log" | tee -a "$OUT/summary.txt"
(cd "$OUT" && tar czf r.tgz f fair.log tiny-compile.log tiny-compile.json && rm -rf f)
