#!/usr/bin/env bash
# The process-per-rank checks on a device machine, in one call: the NCCL
# tests (per-rank bootstrap over the TCP communicator, abort with the host
# communicator), the environment torchrun really gives its workers, and the
# tiny recipe at dp 2 as two torchrun workers against one process (CPU
# backend: one GPU cannot hold two NCCL ranks), then at dp 1 on the GPU
# under torchrun. Build first:
#
#   L='-ldflags=-s -w'
#   go test -c "$L" -o .devbin/libnccl.test ./nccl/libnccl
#   go build "$L" -o .devbin/rlpipe ./cmd/rlpipe
#
# Logs go to $OUT/process, tarred into $OUT/process.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/process-out}
D=$OUT/process
mkdir -p "$D"
D=$(realpath "$D")
B=$(realpath .devbin)
. bench/device_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$D/env.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >>"$D/env.txt" 2>&1
say "$(tail -n +2 "$D/env.txt" | tr '\n' ' ')"
(cd nccl/libnccl && run nccl-tests 180 "$B/libnccl.test" -test.v)
TR="python3 -m torch.distributed.run"
run torchrun-env 60 $TR --no-python --nproc-per-node 2 sh -c 'env | grep -E "^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]*)=" | sort | sed "s/^/[$RANK] /"'
ex=$(realpath examples)
sed -e 's/gpus_per_node: 1/gpus_per_node: 2/' -e "s#path: models/#path: $ex/models/#" -e "s#rollouts: data/#rollouts: $ex/data/#" examples/tiny-grpo.yaml >/tmp/tiny-dp2.yaml
rm -rf /tmp/runs-one /tmp/runs-tr /tmp/runs-gpu
run tiny-dp2-one 300 "$B/rlpipe" run --backend cpu --runs /tmp/runs-one /tmp/tiny-dp2.yaml
run tiny-dp2-torchrun 300 $TR --nproc-per-node 2 --no-python "$B/rlpipe" run --backend cpu --runs /tmp/runs-tr /tmp/tiny-dp2.yaml
python3 - /tmp/runs-one /tmp/runs-tr >"$D/compare.txt" 2>&1 <<'PY'
import glob, json, sys
def load(root):
    [f] = glob.glob(root + "/*/metrics.jsonl")
    return [json.loads(l) for l in open(f)]
a, b = load(sys.argv[1]), load(sys.argv[2])
skip = {"time", "wall_s", "tokens_per_s", "peak_mem_bytes"}
worst = 0.0
for x, y in zip(a, b):
    for k, v in x.items():
        if k in skip or not isinstance(v, (int, float)):
            continue
        d = abs(v - y[k]) / max(1.0, abs(v))
        worst = max(worst, d)
print(f"steps {len(a)} vs {len(b)}; largest relative difference over every metric: {worst:.3g}")
PY
say "compare: $(cat "$D/compare.txt")"
run tiny-gpu-torchrun 300 $TR --nproc-per-node 1 --no-python "$B/rlpipe" run --backend cuda --runs /tmp/runs-gpu examples/tiny-grpo.yaml
cp -r /tmp/runs-tr "$D/runs-torchrun" 2>/dev/null
tar -C "$OUT" -czf "$OUT/process.tgz" process && rm -rf "$D"
