#!/usr/bin/env bash
# Call 1 (two GPUs of one host), build c1 (main at 423563e plus
# BenchmarkCollectives): a decoder layer's grads reduce-scattered and
# params all-gathered per parameter in one NCCL group (as the train stage
# issues them) against one flat call on the same bytes (as FSDP2 does),
# rlpipe's binding and PyTorch's (bench/nccl_peer.py); then the 3B train
# step at dp 2 with overlap_reduce off and on, with timelines, to see
# what the reduce-scatters take inside the step.
set -u
tar xzf .devbin/b.tgz -C .devbin
export NCCL_NVLS_ENABLE=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/env.txt" 2>&1
nvidia-smi topo -m >>"$OUT/env.txt" 2>&1
mkdir -p "$OUT/rb"
(cd nccl/libnccl && timeout 120 ../../.devbin/c1/libnccl.test -test.run '^$' -test.bench Collectives -test.benchtime 100x >"$OUT/rb/go-nccl.log" 2>&1)
say "go bench rc=$? at ${SECONDS}s"
grep -E 'Benchmark' "$OUT/rb/go-nccl.log" | tee -a "$OUT/summary.txt"
timeout 120 torchrun --nproc_per_node 2 bench/nccl_peer.py --iters 100 --out "$OUT/rb/peer-nccl.json" >"$OUT/rb/peer-nccl.log" 2>&1
say "peer rc=$? at ${SECONDS}s"
grep '^|' "$OUT/rb/peer-nccl.log" | tee -a "$OUT/summary.txt"
one() { # NAME [FLAGS...]
	local n=$1
	shift
	timeout 150 .devbin/c1/rlbench --backend cuda --config examples/models/qwen2.5-3b/config.json --dp 2 --seqs 16 \
		--tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto \
		--cache /tmp/rbc -q --out "$OUT/rb/$n.json" "$@" >"$OUT/rb/$n.log" 2>&1
	say "$n rc=$? at ${SECONDS}s: $(tail -n 1 "$OUT/rb/$n.log" | cut -c1-260)"
}
one 3b-noov --overlap-reduce=false --timeline "$OUT/rb/3b-noov.trace.json"
one 3b-ov --timeline "$OUT/rb/3b-ov.trace.json"
for f in "$OUT"/rb/*.trace.json; do
	python3 bench/trace_ops.py "$f" >"${f%.trace.json}.ops.md" 2>&1
done
(cd "$OUT" && tar czf r.tgz rb && rm -rf rb)
