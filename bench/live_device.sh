#!/usr/bin/env bash
# The live loop on a GPU, in one device call: rlpipe trains Qwen2.5-0.5B
# (random init from examples/models/qwen2.5-0.5b/config.json, saved by
# transformers) while bench/engine_hf.py, a transformers engine speaking
# SGLang's HTTP API, generates the rollouts on the same GPU; push_weights
# streams the actor to it after every step. It measures what the live loop
# costs (generate_s, push_write_s, push_reload_s, push_gb per step) and how
# closely the engine's log-probs match rlpipe's old log-probs
# (mismatch_abs, mismatch_k3: bf16 numerics in step 1; a stale or wrong
# push would show from step 2 on). It also runs the embedded default
# (examples/tiny-live.yaml, the local engine) on the CUDA backend. Build
# first:
#
#   go build -ldflags='-s -w' -o .devbin/rlpipe ./cmd/rlpipe
#
# Output: $OUT/live.tgz (logs, metrics.jsonl, updates.jsonl, the recipe).
# Knobs: LIVE_STEPS (default 4), LIVE_NEW (max_new_tokens, default 256),
# LIVE_LR (default 2e-5), LIVE_TINY (0 skips the tiny-live run), LIVE_DIR
# (where push_weights writes, default /tmp/rlpipe-live; /dev/shm is RAM),
# LIVE_COLOCATE (1: sleep and wake around generate; sleep_s, wake_s,
# asleep_device_bytes in the metrics).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/live-out}
D=$OUT/live
W=/tmp/rlpipe-live
mkdir -p "$D"
rm -rf "$W" && mkdir -p "$W"
. bench/device_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$D/env.txt" 2>&1
say "$(head -n 1 "$D/env.txt")"

if [[ ${LIVE_TINY:-1} == 1 ]]; then
	say "tiny-live on cuda (local engine)"
	timeout -k 5 120 .devbin/rlpipe run --backend cuda --runs "$W/tiny-runs" examples/tiny-live.yaml >"$D/tiny-live.log" 2>&1
	say "tiny-live: rc=$? $(tail -n 4 "$D/tiny-live.log" | head -n 1)"
	cp "$W"/tiny-runs/*/metrics.jsonl "$D/tiny-live-metrics.jsonl" 2>/dev/null
fi

say "random-init checkpoint and prompts"
python3 bench/random_init.py examples/models/qwen2.5-0.5b "$W/model" >"$D/setup.log" 2>&1
python3 - "$W" >>"$D/setup.log" 2>&1 <<'PY'
import json, random, sys
w = sys.argv[1]
rng = random.Random(0)
with open(f"{w}/prompts.jsonl", "w") as f:
    for _ in range(64):
        n = rng.randrange(32, 97)
        f.write(json.dumps({"prompt_tokens": [rng.randrange(1000, 20000) for _ in range(n)]}) + "\n")
print("ok")
PY
say "setup: rc=$? $(tail -n 1 "$D/setup.log")"

python3 bench/engine_hf.py --model "$W/model" --port 30000 >"$D/engine.log" 2>&1 &
ENGINE=$!
trap 'kill $ENGINE 2>/dev/null' EXIT
for _ in $(seq 1 120); do
	python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30000/health', timeout=2)" >/dev/null 2>&1 && break
	sleep 1
done
say "engine up: $(head -n 1 "$D/engine.log")"

# LIVE_COLOCATE=1: the trainer sleeps at the end of every step (the engine
# resumes and loads the push) and wakes after generate (the engine releases).
WAKE=
PUSH="    - {id: push, uses: push_weights, with: {dir: ${LIVE_DIR:-$W}/policy, engine: sglang, url: http://127.0.0.1:30000}}"
if [[ ${LIVE_COLOCATE:-0} == 1 ]]; then
	WAKE="    - {id: wake, uses: wake, with: {engine: sglang, url: 'http://127.0.0.1:30000'}}
"
	PUSH="    - {id: push, uses: push_weights, with: {dir: ${LIVE_DIR:-$W}/policy}}
    - {id: sleep, uses: sleep, with: {engine: sglang, url: 'http://127.0.0.1:30000', reload: push}}"
fi
cat >"$W/live.yaml" <<YAML
version: 1
name: live-0.5b-engine-hf
models:
  actor: {path: $W/model}
  ref: {copy_of: actor}
mesh: {gpus_per_node: 1}
data:
  prompts: $W/prompts.jsonl
  rollout_batch_size: 16
  samples_per_prompt: 4
  global_batch_size: 64
  max_tokens_per_gpu: 16384
  max_seq_len: $((96 + ${LIVE_NEW:-256}))
train:
  steps: ${LIVE_STEPS:-4}
  lr: ${LIVE_LR:-2e-5}
  grad_clip: 1.0
policies:
  precision: '"bf16"'
  recompute: 'layer.kind == "decoder"'
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard_actor, uses: apply_fsdp2, with: {model: actor}}
    - {id: shard_ref, uses: apply_fsdp2, with: {model: ref}}
  step:
    - id: generate
      uses: generate
      with:
        engine: sglang
        url: http://127.0.0.1:30000
        max_new_tokens: ${LIVE_NEW:-256}
        reward: {expr: 'count(response, # < 75968) / len(response)'}
$WAKE    - {id: pack, uses: pack}
    - {id: ref_logp, uses: ref_logprob, with: {chunk_tokens: 2048}}
    - {id: old_logp, uses: actor_logprob, with: {chunk_tokens: 2048}}
    - {id: train, uses: train, with: {chunk_tokens: 2048, eps_clip: 0.2, kl: low_var_kl, kl_coef: 0.01}}
$PUSH
YAML
cp "$W/live.yaml" "$D/"
.devbin/rlpipe plan "$W/live.yaml" >"$D/live-plan.txt" 2>&1
say "live run"
timeout -k 5 420 .devbin/rlpipe run --backend cuda --runs "$W/runs" --export "" "$W/live.yaml" >"$D/live.log" 2>&1
say "live: rc=$? $(tail -n 3 "$D/live.log" | head -n 1)"
cp "$W"/runs/*/metrics.jsonl "$D/live-metrics.jsonl" 2>/dev/null
cp "$W"/runs/*/updates.jsonl "$D/live-updates.jsonl" 2>/dev/null
ls -la "$W" >>"$D/summary.txt"
tail -n 30 "$D/engine.log" >"$D/engine-tail.log"
tar -C "$OUT" -czf "$OUT/live.tgz" live && rm -rf "$D"
