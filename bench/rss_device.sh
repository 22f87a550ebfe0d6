#!/usr/bin/env bash
# Peak resident memory of one rlpipe run process against the plan's host
# figure, before and after a change: a random-init Qwen2.5-1.5B (bf16), two
# GRPO steps of 128 samples of 512 tokens on one GPU, the checkpoint of the
# last step and the HF export included. The peak RSS is read from
# getrusage(RUSAGE_CHILDREN) after each run. Build first:
#
#   L='-ldflags=-s -w'
#   go build "$L" -o .devbin/rlpipe ./cmd/rlpipe
#   (cd OLD_CHECKOUT && go build "$L" -o .devbin/rlpipe-old ./cmd/rlpipe)   # optional
#
# Logs go to $OUT/rss, tarred into $OUT/rss.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rss-out}
. bench/device_lib.sh
workdir rss
say "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
random_job qwen2.5-1.5b 32
say "setup: rc=$? $(tail -n 1 "$D/setup.log")"
cat >"$W/rss.yaml" <<YAML
version: 1
name: rss-1.5b
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
  steps: 2
  lr: 1e-6
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
    - {id: pack, uses: pack}
    - {id: ref_logp, uses: ref_logprob, with: {chunk_tokens: 2048}}
    - {id: old_logp, uses: actor_logprob, with: {chunk_tokens: 2048}}
    - {id: train, uses: train, with: {chunk_tokens: 2048, eps_clip: 0.2, kl: low_var_kl, kl_coef: 0.01}}
YAML
cp "$W/rss.yaml" "$D/"
.devbin/rlpipe plan "$W/rss.yaml" >"$D/plan.txt" 2>&1
say "plan: $(grep -E '^host (pinned|buffers|per node)' "$D/plan.txt" | cut -c1-60 | tr '\n' ';')"
# The CUDA libraries alone: rlpipe doctor loads the driver, NVRTC,
# cuBLASLt and NCCL and loads every kernel module once.
python3 - .devbin/rlpipe >"$D/doctor.log" 2>&1 <<'PY'
import resource, subprocess, sys
r = subprocess.run([sys.argv[1], "doctor"], capture_output=True)
print(f"rc={r.returncode} max_rss_gib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/2**20:.2f}")
PY
say "doctor (CUDA libraries, kernels): $(tail -n 1 "$D/doctor.log")"
for bin in rlpipe rlpipe-old; do
	[[ -x .devbin/$bin ]] || continue
	python3 - ".devbin/$bin" "$W/runs-$bin" "$W/rss.yaml" >"$D/$bin.log" 2>&1 <<'PY'
# Runs rlpipe, samples its resident memory every 0.2 s with what it last
# printed, and reports the peak (getrusage) and the samples.
import resource, subprocess, sys, threading, time
t0 = time.time()
p = subprocess.Popen([sys.argv[1], "run", "--backend", "cuda", "--runs", sys.argv[2], sys.argv[3]],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
last = ["start"]
def read():
    for line in p.stdout:
        last[0] = line.strip()[:100]
        print(f"{time.time()-t0:7.1f}s | {line.rstrip()}")
threading.Thread(target=read, daemon=True).start()
samples = []  # (t, rss, anon, file, last line): anonymous memory is what the plan counts
while p.poll() is None:
    try:
        f = {l.split(":")[0]: int(l.split()[1]) / 2**20 for l in open(f"/proc/{p.pid}/status") if l.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:"))}
        samples.append((time.time() - t0, f["VmRSS"], f["RssAnon"], f["RssFile"] + f.get("RssShmem", 0), last[0]))
    except (OSError, KeyError):
        pass
    time.sleep(0.2)
peak = max(samples, key=lambda s: s[1]) if samples else (0, 0, 0, 0, "")
anon = max(samples, key=lambda s: s[2]) if samples else (0, 0, 0, 0, "")
step = max(1, len(samples) // 40)
for t, g, a, fl, what in samples[::step]:
    print(f"rss {t:7.1f}s {g:6.2f} GiB (anon {a:5.2f}, file+shmem {fl:5.2f})  after: {what}")
print(f"rss peak sample {peak[1]:.2f} GiB (anon {peak[2]:.2f}) at {peak[0]:.1f}s after: {peak[4]}")
print(f"anon peak sample {anon[2]:.2f} GiB at {anon[0]:.1f}s after: {anon[4]}")
print(f"rc={p.returncode} wall_s={time.time()-t0:.1f} max_rss_gib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/2**20:.2f}")
PY
	say "$bin: $(tail -n 1 "$D/$bin.log"); $(grep '^anon peak' "$D/$bin.log")"
done
tar -C "$OUT" -czf "$OUT/rss.tgz" rss && rm -rf "$D"
