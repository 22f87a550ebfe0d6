#!/usr/bin/env bash
# How long checkpoints stall a run: a random-init Qwen2.5-1.5B (bf16), 12
# GRPO steps of 128 samples of 512 tokens on one GPU, a checkpoint every 6
# steps (about 21 GB each: fp32 params and AdamW moments, the bf16 ref),
# written at the step's end and with train.checkpoint_async. Reports the
# run log's checkpoint events ("checkpoint snapshot taken": what the step
# waited for with async; "checkpoint saved": the write, which the step
# waits for without), each step's wall time and the run's. Build first:
#
#   go build -ldflags='-s -w' -o .devbin/rlpipe ./cmd/rlpipe
#
# Logs go to $OUT/ckpt.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ckpt-out}
. bench/device_lib.sh
workdir ckpt
say "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); $(df -h /tmp | tail -n 1)"
random_job qwen2.5-1.5b 192
cat >"$W/ckpt.yaml" <<YAML
version: 1
name: ckpt-1.5b
models:
  actor: {path: $W/model}
  ref: {copy_of: actor}
mesh: {gpus_per_node: 1}
data:
  rollouts: $W/rollouts.jsonl
  rollout_batch_size: 16
  samples_per_prompt: 8
  global_batch_size: 128
  max_tokens_per_gpu: 16384
  max_seq_len: 512
train:
  steps: 12
  lr: 1e-6
  checkpoint_every: 6
  checkpoint_async: ASYNC
policies:
  precision: '"bf16"'
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard_actor, uses: apply_fsdp2, with: {model: actor}}
    - {id: shard_ref, uses: apply_fsdp2, with: {model: ref}}
  step:
    - {id: pack, uses: pack}
    - {id: ref_logp, uses: ref_logprob}
    - {id: old_logp, uses: actor_logprob}
    - {id: train, uses: train, with: {eps_clip: 0.2, kl: low_var_kl, kl_coef: 0.01}}
YAML
cp "$W/ckpt.yaml" "$D/"
for bin in sync async; do
	val=false
	[[ $bin == async ]] && val=true
	sed "s/ASYNC/$val/" "$W/ckpt.yaml" >"$W/$bin.yaml"
	t0=$SECONDS
	timeout 200 .devbin/rlpipe run --backend cuda --runs "$W/runs-$bin" "$W/$bin.yaml" >"$D/$bin.out" 2>&1
	rc=$?
	run=$(ls -d "$W/runs-$bin"/*/ | head -n 1)
	cp "$run/log" "$D/$bin.runlog" 2>/dev/null
	cp "$run/metrics.jsonl" "$D/$bin.metrics.jsonl" 2>/dev/null
	say "$bin: rc=$rc in $((SECONDS - t0))s; checkpoint events: $(python3 -c 'import json,sys; print("; ".join("step %d %s %.2fs" % (e["step"], e["message"], e["seconds"]) for e in map(json.loads, open(sys.argv[1])) if "checkpoint" in e.get("message", "")))' "$D/$bin.runlog"); step walls (s): $(grep -o '"wall_s":[0-9.]*' "$D/$bin.metrics.jsonl" | cut -d: -f2 | tr '\n' ' '); $(du -sh "$run/checkpoints" | cut -f1) of checkpoints"
	rm -rf "$W/runs-$bin"
done
tar -C "$OUT" -czf "$OUT/ckpt.tgz" ckpt && rm -rf "$D"
