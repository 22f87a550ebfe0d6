#!/usr/bin/env bash
# Scaling on 2, 4 and 8 GPUs (issues 10 and 13): one phase per device call, each
# within SCALE_BUDGET_S seconds (default 540), every run under its own time
# limit and what is left of the budget (device_lib.sh's budgeted), a
# failure recorded and the next run started.
#
#   SCALE_PHASE=dp    item 1. The benchmark recipe (bench/cmd/rlbench's
#                     GRPO step: ref_logprob + train, bf16, every layer
#                     recomputed, chunk 2048) on Qwen2.5-1.5B and -3B at
#                     dp 1, 2, 4, 8 against the PyTorch FSDP2 peer under
#                     torch.distributed.run; weak scaling: 8 sequences of
#                     2048 tokens per GPU at every dp. Needs nvidia-h200-x8
#                     (x4: dp 1, 2, 4). Estimated 7-8 min.
#   SCALE_PHASE=7b    item 2, and item 4 for it. rlbench and the peer on
#                     Qwen2.5-7B at dp W (the example's shape: the ref
#                     offloaded, kl 0.001), then
#                     examples/qwen2.5-7b-grpo-8xh100.yaml adapted to H200
#                     (mesh.gpu h200-141g, 3 steps, 32 groups of 8 samples
#                     of 512 tokens) end to end in one process, then as W
#                     processes under torch.distributed.run. Each writes
#                     a checkpoint of about 100 GiB (removed after the run)
#                     and a 15 GB export. x8 (x4: the dp 4 variant).
#                     Estimated 8-9 min, 2 min less with a warm rlbench cache.
#   SCALE_PHASE=cp    item 3, and item 4 for it. stages' TestRunTinyCUDADP2
#                     and TestRunTinyCUDACP2 and nccl/libnccl's CUDA tests
#                     (none has run on more than one GPU), then Qwen2.5-7B
#                     on samples of 28672 tokens with recompute off: the
#                     plan refuses it at cp 1 (152 GiB a GPU at dp 8), it
#                     runs at dp 4 × cp 2 and dp 2 × cp 4, then at dp 8 ×
#                     cp 1 with every layer recomputed (the fitting
#                     baseline), then dp 4 × cp 2 as 8 processes, each
#                     cut (killed) once its 2 steps are recorded, before
#                     the final checkpoint. Ring attention's blocks from
#                     other ranks run on the SIMT kernels (4.2 TFLOP/s
#                     forward, 2.5 backward on the H100): an estimated
#                     1 min a step. x8 (x4: dp × cp = 4).
#                     Estimated 8-9 min; 2 min more without the 7B checkpoint
#                     of a previous phase in the rlbench cache.
#   SCALE_PHASE=proc  item 4 for item 1: the benchmark recipe as a spec
#                     (rlbench's job without its marks) at dp W, by
#                     rlpipe run in one process and as W processes, 1.5B
#                     and 3B, each cut once its 4 steps are recorded.
#                     x8 (x4: dp 4). Estimated 3-5 min.
#   SCALE_PHASE=long  issue 10's longest samples:
#                     examples/qwen2.5-1.5b-long-cp2.yaml on the W GPUs
#                     with samples of SCALE_LONG_SEQ tokens (262,144 on
#                     H100s, 524,288 on H200s: longer than cp 1 holds),
#                     W a step: the plans at cp 1 (refused) and cp 2,
#                     rlpipe plan --longest of both, then one step at
#                     cp 2, cut once recorded. SCALE_GPU=h100-80g on
#                     nvidia-h100-x2: an estimated 2.5 min a step.
#
# In the dp and 7b phases rlbench runs first and the peer starts from its
# random checkpoint and rollouts (peer_fsdp2.py --weights, --rollouts), so
# that the two grad norms are of the same weights and data.
#
# W is 8 with 8 GPUs visible, 4 with 4 to 7 and 2 with 2 or 3 (issue 10's
# two-GPU runs on nvidia-h200-x2: dp 1 and 2; the 7B at dp 2; cp at dp 1 ×
# cp 2 only, where one cp pair takes both samples of a step, about twice
# the time a step that x8 gives it: SCALE_CP_STEPS=1 keeps it in a call);
# with fewer a phase says so and skips. SCALE_PHASE may name several phases ("cp proc"): they share
# the budget. The estimates come from the 1- and 2-GPU runs' setup and
# step times in docs/performance.md; none of this has run on 4 or 8 GPUs.
# Run the phases back to back on one machine (it stays warm 30 s after a
# call): rlbench's random checkpoints (RLBENCH_CACHE, /tmp/rbc) and the
# kernel cache then carry over.
#
# Build first, here (the CUDA libraries load at run time):
#
#   L='-ldflags=-s -w'
#   go build "$L" -o .devbin/rlbench ./bench/cmd/rlbench
#   go build "$L" -o .devbin/rlpipe ./cmd/rlpipe
#   go test -c "$L" -o .devbin/stages.test ./stages          # cp
#   go test -c "$L" -o .devbin/libnccl.test ./nccl/libnccl   # cp
#
# then one call a phase:  OUT=... SCALE_PHASE=dp bash bench/scale_device.sh
#
# Knobs: SCALE_PHASE (dp), SCALE_BUDGET_S (540), SCALE_MODELS
# ("qwen2.5-1.5b qwen2.5-3b": dp, proc), SCALE_DPS ("1 2 4 8"),
# SCALE_7B_STEPS (3), SCALE_CP_MODEL (qwen2.5-7b), SCALE_CP_SEQ (28672),
# SCALE_GPU (h200-141g: the preset rlbench and the specs plan for),
# SCALE_LONG_SEQ (long), SCALE_CP_STEPS (2), SCALE_CP_RUNS (the cp phase's runs, of "tests cp2 cp4
# recompute procs"; on four H200s all five outran one call: the 4-process
# run was cut), SCALE_GPUS (the GPU count; default nvidia-smi's),
# SCALE_BIN (.devbin: rlbench, rlpipe and the test binaries),
# SCALE_WORK (/tmp/rlpipe-scale: specs, rollouts, run records),
# RLBENCH_CACHE (/tmp/rbc), SCALE_PEER_FLAGS (more peer_fsdp2.py flags for
# every peer run, e.g. "--compile layers"). SCALE_DRY=1 runs nothing: it writes the specs
# (models linked to examples/models, enough to plan) and prints every
# command it would run; bench/scale_test.go plans what it writes.
#
# $OUT gets summary.md (tokens/s per GPU, scaling efficiency against dp 1,
# plan against arena high-water against NVML per GPU, NCCL memory against
# the plan's reserve, host RSS per process), summary.txt (the runs as they
# went), env.txt, json.tgz (a JSON per run, the plans, the run records
# without checkpoints, the peak RSS per process) and logs.tgz.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-/tmp/scale-out}
PHASES=${SCALE_PHASE:-dp}
BUDGET=${SCALE_BUDGET_S:-540}
DRY=${SCALE_DRY:-}
MODELS=${SCALE_MODELS:-"qwen2.5-1.5b qwen2.5-3b"}
DPS=${SCALE_DPS:-"1 2 4 8"}
STEPS7B=${SCALE_7B_STEPS:-3}
CPM=${SCALE_CP_MODEL:-qwen2.5-7b}
CPSEQ=${SCALE_CP_SEQ:-28672}
CPSTEPS=${SCALE_CP_STEPS:-2}
CPRUNS=${SCALE_CP_RUNS:-"tests cp2 cp4 recompute procs"}
GPU=${SCALE_GPU:-h200-141g}
# The long phase's sample length: longer than one GPU holds at cp 1
# at dp W (rlpipe plan --longest at W 2: 224,256 tokens on H100s, 433,152
# on H200s; more at W 8, where the model's shards are smaller).
if [[ $GPU == h100-80g ]]; then LONGSEQ=${SCALE_LONG_SEQ:-262144}; else LONGSEQ=${SCALE_LONG_SEQ:-524288}; fi
W=${SCALE_WORK:-/tmp/rlpipe-scale}
C=${RLBENCH_CACHE:-/tmp/rbc}
B=$(realpath -m "${SCALE_BIN:-.devbin}")
RLBENCH=$B/rlbench
RLPIPE=$B/rlpipe
S=$W/specs
TR=(python3 -m torch.distributed.run)
# NVLink multicast stays off (the device machines' KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT/logs" "$OUT/json" "$S/models" "$S/data"
OUT=$(realpath "$OUT")
D=$OUT # device_lib.sh's say appends to $D/summary.txt
. bench/device_lib.sh # say, budgeted

if [[ -n $DRY ]]; then
	NGPU=${SCALE_GPUS:-8}
else
	NGPU=${SCALE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
fi
WORLD=0
((NGPU >= 2)) && WORLD=2
((NGPU >= 4)) && WORLD=4
((NGPU >= 8)) && WORLD=8

# step NAME LIMIT CMD...: CMD under LIMIT seconds (or what is left of the
# budget), logged to logs/NAME.log; with SCALE_DRY, printed instead.
step() {
	local n=$1 limit=$2
	shift 2
	if [[ -n $DRY ]]; then
		printf '%s (%ss):' "$n" "$limit"
		printf ' %q' "$@"
		echo
		return 0
	fi
	local line rc
	line=$(budgeted "$n" "$limit" "$@")
	rc=$?
	say "$line"
	return $rc
}

# sampled NAME LIMIT CMD...: step, with every GPU's memory.used sampled
# twice a second into logs/NAME.smi (the summary takes each GPU's largest
# less its smallest, the idle figure before the run allocates).
sampled() {
	local smi=""
	if [[ -z $DRY ]]; then
		nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/logs/$1.smi" 2>/dev/null &
		smi=$!
	fi
	step "$@"
	local rc=$?
	if [[ -n $smi ]]; then
		kill "$smi" 2>/dev/null
		wait "$smi" 2>/dev/null
	fi
	return $rc
}

# needs PHASE: says so and fails when fewer than 2 GPUs are visible.
needs() {
	((WORLD > 0)) && return 0
	say "phase $1: needs 2, 4 or 8 GPUs (nvidia-h200-x2, -x4 or -x8), $NGPU visible; skipped"
	return 1
}

# ensure_ckpt MODEL: links specs/models/MODEL to MODEL's random-init bf16
# checkpoint in rlbench's cache, which a short rlbench run at dp WORLD
# writes when no earlier run did; with SCALE_DRY, to examples/models/MODEL
# (config.json only: enough to plan).
ensure_ckpt() {
	local m=$1 ck
	if [[ -n $DRY ]]; then
		ln -sfn "$REPO/examples/models/$m" "$S/models/$m"
		return 0
	fi
	ck=$(ls -d "$C/$m"-*/model.safetensors 2>/dev/null | head -n 1)
	if [[ -z $ck ]]; then
		step "ckpt-$m" 300 "$RLBENCH" --backend cuda --gpu "$GPU" --config "examples/models/$m/config.json" --dp "$WORLD" \
			--seqs "$WORLD" --tokens-per-seq 256 --prompt-tokens 64 --chunk 256 --warmup 0 --steps 1 --cache "$C" --out "$OUT/json/ckpt-$m.json"
		ck=$(ls -d "$C/$m"-*/model.safetensors 2>/dev/null | head -n 1)
	fi
	[[ -n $ck ]] || { say "$m: no random checkpoint in $C"; return 1; }
	ln -sfn "$(dirname "$ck")" "$S/models/$m"
}

# rollouts NAME GROUPS PER_GROUP PROMPT RESPONSE: specs/data/NAME.jsonl, GROUPS
# groups of PER_GROUP samples with a shared prompt, random ids and rewards.
rollouts() {
	if [[ -n $DRY ]]; then
		echo "rollouts: $S/data/$1.jsonl, $2 groups of $3 samples of $4 + $5 tokens"
		return 0
	fi
	python3 - "$S/data/$1.jsonl" "$2" "$3" "$4" "$5" <<'PY'
import json, random, sys
path, groups, per, prompt, response = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(0)
with open(path, "w") as f:
    for g in range(groups):
        p = [rng.randrange(1000, 20000) for _ in range(prompt)]
        for _ in range(per):
            f.write(json.dumps({"prompt_tokens": p, "response_tokens": [rng.randrange(1000, 20000) for _ in range(response)],
                                "reward": rng.random(), "group": g}) + "\n")
PY
}

# plan NAME: rlpipe plan --json of specs/NAME.yaml into json/plan-NAME.json
# (exit code 4 where it does not fit).
plan() {
	if [[ -n $DRY ]]; then
		echo "plan: $RLPIPE plan --json $S/$1.yaml > $OUT/json/plan-$1.json"
		return 0
	fi
	"$RLPIPE" plan --json "$S/$1.yaml" >"$OUT/json/plan-$1.json" 2>"$OUT/logs/plan-$1.log"
	local rc=$? verdict
	if ((rc == 0 || rc == 4)); then
		verdict=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); print("fits" if p["fits"] else "does not fit", "device total %.2f GiB, arena %.2f GiB" % (p["device_total_bytes"] / 2**30, p["device_arena_bytes"] / 2**30))' "$OUT/json/plan-$1.json" 2>&1 | tail -n 1)
	else
		verdict=$(grep -v '^\s*$' "$OUT/logs/plan-$1.log" | head -n 1 | cut -c1-300)
	fi
	say "plan $1: rc=$rc $verdict"
	return $rc
}

# run_spec NAME LIMIT PROCS SPEC [CUT]: rlpipe run of specs/SPEC.yaml in
# one process (PROCS 1) or as PROCS torchrun workers, each under maxrss.py
# (its peak RSS to rss-NAME/rank-R.json), the GPUs sampled; with CUT, the
# run is killed once it has recorded CUT steps (a timing run: no final
# checkpoint and export). Then the run record without checkpoints and
# export to json/NAME/, and those removed.
run_spec() {
	local n=$1 limit=$2 np=$3 spec=$S/$4.yaml cut=${5:-0} launch=(python3)
	((np > 1)) && launch=("${TR[@]}" --nproc-per-node "$np")
	[[ -z $DRY ]] && rm -rf "$W/runs-$n" "$W/rss-$n"
	sampled "$n" "$limit" env MAXRSS_STOP_AFTER="$cut" MAXRSS_RUNS="$W/runs-$n" "${launch[@]}" "$W/maxrss.py" "$W/rss-$n" \
		"$RLPIPE" run --backend cuda --runs "$W/runs-$n" "$spec"
	local rc=$?
	[[ -n $DRY ]] && return 0
	((rc != 0)) && reap "--runs $W/runs-$n "
	mkdir -p "$OUT/json/$n"
	for d in "$W/runs-$n"/*/; do
		[[ -d $d ]] || continue
		cp "$d"/{run.json,spec.yaml,plan.json,metrics.jsonl,updates.jsonl,log} "$OUT/json/$n/" 2>/dev/null
		rm -rf "$d/checkpoints" "$d/export"
	done
	cp "$W/rss-$n"/*.json "$OUT/json/$n/" 2>/dev/null
	return $rc
}

# reap KEY: after a run that failed or timed out, kills (by pid) what is
# left of it: the processes whose command line holds KEY, a path unique to
# the run (torchrun's workers can outlive a killed agent and hold GPUs).
reap() {
	local p cmd pids=()
	for p in /proc/[0-9]*; do
		[[ ${p#/proc/} == "$$" ]] && continue
		cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
		[[ $cmd == *"$1"* ]] && pids+=("${p#/proc/}")
	done
	((${#pids[@]})) || return 0
	say "reap: killing leftover pids ${pids[*]} of $1"
	kill -9 "${pids[@]}" 2>/dev/null
	sleep 2
}

# bench NAME LIMIT MODEL DP [FLAGS...]: rlbench at dp DP, 8 sequences of 2048
# tokens per GPU.
bench() {
	local n=$1 limit=$2 m=$3 dp=$4
	shift 4
	sampled "$n" "$limit" "$RLBENCH" --backend cuda --gpu "$GPU" --config "examples/models/$m/config.json" --dp "$dp" \
		--seqs $((8 * dp)) --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute \
		--cache "$C" --workdir "$W/work-$n" --out "$OUT/json/$n.json" "$@"
	local rc=$?
	[[ -z $DRY ]] && ((rc != 0)) && reap "$OUT/json/$n.json"
	return $rc
}

# peer NAME LIMIT MODEL DP [FLAGS...]: the PyTorch FSDP2 peer on the same
# workload, under torch.distributed.run at dp > 1; its checkpoint_wrapper
# failing, once more with HF's own checkpointing.
peer() {
	local n=$1 limit=$2 m=$3 dp=$4 launch=(python3)
	shift 4
	((dp > 1)) && launch=("${TR[@]}" --standalone --nproc_per_node "$dp")
	local args=(bench/peer_fsdp2.py --config "examples/models/$m/config.json" --seqs $((8 * dp)) --tokens-per-seq 2048
		--prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --out "$OUT/json/$n.json" "$@")
	# shellcheck disable=SC2206 # flags, split on spaces
	local more=(${SCALE_PEER_FLAGS:-})
	args+=("${more[@]}")
	sampled "$n" "$limit" "${launch[@]}" "${args[@]}"
	local rc=$?
	[[ -n $DRY ]] && return 0
	((rc != 0)) && reap "$OUT/json/$n.json"
	if ((rc != 0 && rc != 99 && rc != 124 && rc != 137)) && grep -qi checkpoint "$OUT/logs/$n.log" && ! grep -q OutOfMemory "$OUT/logs/$n.log"; then
		sampled "$n-achf" "$limit" "${launch[@]}" "${args[@]}" --ac hf
		(($? != 0)) && reap "$OUT/json/$n.json"
	fi
	return 0
}

# grpo_stages REF_WITH TRAIN_WITH: the stages of a GRPO step against a
# frozen ref (load, shard both, pack, ref_logprob, train) in YAML, with
# REF_WITH and TRAIN_WITH added to the two stages' with.
grpo_stages() {
	cat <<YAML
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard_actor, uses: apply_fsdp2, needs: load, with: {model: actor}}
    - {id: shard_ref, uses: apply_fsdp2, needs: load, with: {model: ref}}
  step:
    - {id: pack, uses: pack}
    - {id: ref_logp, uses: ref_logprob, needs: pack, with: {model: ref, $1}}
    - {id: train, uses: train, needs: [pack, ref_logp], with: {model: actor, $2}}
YAML
}

# spec_bench MODEL DP: rlbench's job (bench/bench.go's specYAML without the
# bench_mark stages, which declare no buffers) as specs/bench-MODEL-dpDP.yaml.
spec_bench() {
	local m=$1 dp=$2 n=$((8 * $2))
	cat >"$S/bench-$m-dp$dp.yaml" <<YAML
# Written by bench/scale_device.sh: rlbench's job at dp $dp (8 sequences of
# 2048 tokens per GPU, one GRPO group), for rlpipe run.
version: 1
name: bench-$m-dp$dp
models:
  actor: {path: models/$m}
  ref: {copy_of: actor}
mesh: {gpus_per_node: $dp, gpu: $GPU, host_memory: 512GiB}
data:
  rollouts: data/bench-dp$dp.jsonl
  global_batch_size: $n
  samples_per_prompt: $n
  max_tokens_per_gpu: 16384
  max_seq_len: 2048
train: {steps: 4, lr: 1e-6, betas: [0.9, 0.95], grad_clip: 1.0}
policies: {precision: '"bf16"', recompute: 'true'}
$(grpo_stages "chunk_tokens: 2048" "chunk_tokens: 2048, eps_clip: 0.2, kl: low_var_kl, kl_coef: 0.01, entropy_coef: 0")
YAML
}

# spec_7b DP: examples/qwen2.5-7b-grpo-8xh100.yaml on DP H200s, SCALE_7B_STEPS
# steps, as specs/7b-h200-dpDP.yaml.
spec_7b() {
	local dp=$1 f=$S/7b-h200-dp$1.yaml
	{
		echo "# Written by bench/scale_device.sh from examples/qwen2.5-7b-grpo-8xh100.yaml: H200, dp $dp, $STEPS7B steps."
		sed -e "s/^name: qwen2.5-7b-grpo-8xh100\$/name: qwen2.5-7b-grpo-${dp}xh200/" -e "s/^  gpus_per_node: 8\$/  gpus_per_node: $dp/" \
			-e "s/^  dp: 8\$/  dp: $dp/" -e "s/^  gpu: h100-80g\$/  gpu: $GPU/" -e "s/^  host_memory: 2TiB .*/  host_memory: 512GiB/" \
			-e "s/^  steps: 200\$/  steps: $STEPS7B/" examples/qwen2.5-7b-grpo-8xh100.yaml
	} >"$f"
	local want
	for want in "gpus_per_node: $dp" "dp: $dp" "gpu: $GPU" "host_memory: 512GiB" "steps: $STEPS7B"; do
		grep -q "^  $want\$" "$f" || { say "spec_7b: the example changed: no '$want' in $f"; return 1; }
	done
}

# spec_cp DP CP RECOMPUTE: SCALE_CP_MODEL on samples of SCALE_CP_SEQ tokens
# at dp DP × cp CP (one sample per dp group and micro-batch, at least two a
# step), the ref offloaded, chunk 4096, as specs/cp-dpDP-cpCP[-recompute].yaml.
spec_cp() {
	local dp=$1 cp=$2 rc=$3 gbs=$(($1 > 2 ? $1 : 2)) name=cp-dp$1-cp$2
	[[ $rc == true ]] && name+=-recompute
	cat >"$S/$name.yaml" <<YAML
# Written by bench/scale_device.sh: $CPM on samples of $CPSEQ tokens, dp $dp × cp $cp, recompute $rc.
version: 1
name: $name
models:
  actor: {path: models/$CPM}
  ref: {copy_of: actor}
mesh: {gpus_per_node: $((dp * cp)), cp: $cp, gpu: $GPU, host_memory: 512GiB}
data:
  rollouts: data/cp-$CPSEQ.jsonl
  rollout_batch_size: $((gbs / 2))
  samples_per_prompt: 2
  global_batch_size: $gbs
  max_tokens_per_gpu: $((CPSEQ / cp))
  max_seq_len: $CPSEQ
train: {steps: $CPSTEPS, lr: 1e-6, grad_clip: 1.0}
policies:
  offload: 'model.role == "ref"'
  precision: '"bf16"'
  recompute: '$rc'
$(grpo_stages "chunk_tokens: 4096" "chunk_tokens: 4096, kl: low_var_kl, kl_coef: 0.01")
YAML
}

phase_dp() {
	needs dp || return 0
	local m dp sh
	for m in $MODELS; do
		for dp in $DPS; do
			if ((dp > NGPU)); then
				say "dp $dp: $NGPU GPUs visible; skipped"
				continue
			fi
			bench "rlpipe-$m-dp$dp" 240 "$m" "$dp"
			mapfile -t sh < <(peer_inputs "$OUT/json/rlpipe-$m-dp$dp.json" "$W/work-rlpipe-$m-dp$dp" 2>/dev/null)
			peer "peer-$m-dp$dp" 150 "$m" "$dp" "${sh[@]}"
		done
	done
}

phase_7b() {
	needs 7b || return 0
	local m=qwen2.5-7b n=7b-h200-dp$WORLD sh
	bench "rlpipe-$m-dp$WORLD" 300 "$m" "$WORLD" --offload-ref --kl-coef 0.001
	mapfile -t sh < <(peer_inputs "$OUT/json/rlpipe-$m-dp$WORLD.json" "$W/work-rlpipe-$m-dp$WORLD" 2>/dev/null)
	peer "peer-$m-dp$WORLD" 180 "$m" "$WORLD" --offload-ref --kl-coef 0.001 "${sh[@]}"
	ensure_ckpt "$m" || return 0
	spec_7b "$WORLD" || return 0
	rollouts rollouts 32 8 128 384
	plan "$n"
	run_spec "$n" 300 1 "$n"
	run_spec "$n-procs" 300 "$WORLD" "$n"
}

# cprun NAME: whether SCALE_CP_RUNS names the cp phase's run NAME.
cprun() { [[ " $CPRUNS " == *" $1 "* ]]; }

phase_cp() {
	needs cp || return 0
	if cprun tests && [[ -x $B/stages.test || -n $DRY ]]; then
		step gpu-tests-stages 150 bash -c "cd stages && $(printf %q "$B/stages.test") -test.run 'TestRunTinyCUDA(DP2|CP2)\$' -test.v"
	fi
	if cprun tests && [[ -x $B/libnccl.test || -n $DRY ]]; then
		step gpu-tests-nccl 150 bash -c "cd nccl/libnccl && $(printf %q "$B/libnccl.test") -test.run TestCUDA -test.v"
	fi
	ensure_ckpt "$CPM" || return 0
	spec_cp "$WORLD" 1 false
	spec_cp $((WORLD / 2)) 2 false
	((WORLD >= 4)) && spec_cp $((WORLD / 4)) 4 false
	spec_cp "$WORLD" 1 true
	rollouts "cp-$CPSEQ" $((WORLD / 2)) 2 64 $((CPSEQ - 64))
	plan "cp-dp$WORLD-cp1" # refused: the reason to split
	plan "cp-dp$((WORLD / 2))-cp2"
	((WORLD >= 4)) && plan "cp-dp$((WORLD / 4))-cp4"
	plan "cp-dp$WORLD-cp1-recompute"
	cprun cp2 && run_spec "cp-dp$((WORLD / 2))-cp2" 240 1 "cp-dp$((WORLD / 2))-cp2" "$CPSTEPS"
	((WORLD >= 4)) && cprun cp4 && run_spec "cp-dp$((WORLD / 4))-cp4" 200 1 "cp-dp$((WORLD / 4))-cp4" "$CPSTEPS"
	cprun recompute && run_spec "cp-dp$WORLD-cp1-recompute" 120 1 "cp-dp$WORLD-cp1-recompute" "$CPSTEPS"
	cprun procs && run_spec "cp-dp$((WORLD / 2))-cp2-procs" 240 "$WORLD" "cp-dp$((WORLD / 2))-cp2" "$CPSTEPS"
}

# spec_long CP: examples/qwen2.5-1.5b-long-cp2.yaml on the W GPUs of
# SCALE_GPU at cp CP, samples of SCALE_LONG_SEQ tokens, W of them a step
# (one group of two per dp rank at cp 1), as specs/long-cpCP.yaml.
spec_long() {
	local cp=$1 f=$S/long-cp$1.yaml
	{
		echo "# Written by bench/scale_device.sh from examples/qwen2.5-1.5b-long-cp2.yaml: $WORLD × $GPU, cp $cp, samples of $LONGSEQ tokens."
		sed -e "s/^name: qwen2.5-1.5b-long-cp2\$/name: long-cp$cp/" -e "s/^  gpus_per_node: 2\$/  gpus_per_node: $WORLD/" \
			-e "s/^  cp: 2 .*/  cp: $cp/" -e "s/^  gpu: h100-80g\$/  gpu: $GPU/" -e "s|^  rollouts: data/rollouts.jsonl\$|  rollouts: data/long-$LONGSEQ.jsonl|" \
			-e "s/^  rollout_batch_size: 4\$/  rollout_batch_size: $((WORLD / 2))/" -e "s/^  samples_per_prompt: 8\$/  samples_per_prompt: 2/" \
			-e "s/^  global_batch_size: 32\$/  global_batch_size: $WORLD/" -e "s/^  max_tokens_per_gpu: 131072 .*/  max_tokens_per_gpu: $((LONGSEQ / cp))/" \
			-e "s/^  max_seq_len: 262144\$/  max_seq_len: $LONGSEQ/" -e "s/^  steps: 50\$/  steps: 1/" examples/qwen2.5-1.5b-long-cp2.yaml
	} >"$f"
	local want
	for want in "name: long-cp$cp" "  gpus_per_node: $WORLD" "  cp: $cp" "  gpu: $GPU" "  rollouts: data/long-$LONGSEQ.jsonl" \
		"  rollout_batch_size: $((WORLD / 2))" "  samples_per_prompt: 2" "  global_batch_size: $WORLD" \
		"  max_tokens_per_gpu: $((LONGSEQ / cp))" "  max_seq_len: $LONGSEQ" "  steps: 1"; do
		grep -q "^$want\$" "$f" || { say "spec_long: the example changed: no '$want' in $f"; return 1; }
	done
}

# longest NAME: rlpipe plan --longest --json of specs/NAME.yaml into
# json/longest-NAME.json.
longest() {
	if [[ -n $DRY ]]; then
		echo "longest: $RLPIPE plan --longest --json $S/$1.yaml > $OUT/json/longest-$1.json"
		return 0
	fi
	"$RLPIPE" plan --longest --json "$S/$1.yaml" >"$OUT/json/longest-$1.json" 2>"$OUT/logs/longest-$1.log"
	say "longest $1: rc=$? $(python3 -c 'import json, sys; l = json.load(open(sys.argv[1]))["longest"]; print(l)' "$OUT/json/longest-$1.json" 2>&1 | tail -n 1 | cut -c1-300)"
}

phase_long() {
	needs long || return 0
	ensure_ckpt qwen2.5-1.5b || return 0
	spec_long 1 || return 0
	spec_long 2 || return 0
	rollouts "long-$LONGSEQ" $((WORLD / 2)) 2 64 $((LONGSEQ - 64))
	plan long-cp1 # refused: the reason to split
	plan long-cp2
	longest long-cp1
	longest long-cp2
	run_spec long-cp2 480 1 long-cp2 1
}

phase_proc() {
	needs proc || return 0
	local m n
	rollouts "bench-dp$WORLD" 1 $((8 * WORLD)) 64 1984
	for m in $MODELS; do
		n=bench-$m-dp$WORLD
		ensure_ckpt "$m" || continue
		spec_bench "$m" "$WORLD"
		plan "$n"
		run_spec "$n" 150 1 "$n" 4
		run_spec "$n-procs" 150 "$WORLD" "$n" 4
	done
}

# summarize: summary.md from json/ and logs/.
summarize() {
	if [[ -n $DRY ]]; then
		echo "summary: python3 (bench/scale_device.sh's summarize) $OUT > $OUT/summary.md"
		return 0
	fi
	SCALE_GPU=$GPU python3 - "$OUT" >"$OUT/summary.md" 2>>"$OUT/logs/summary.log" <<'PY'
import glob, json, os, re, statistics, sys

out = sys.argv[1]
GIB = float(1 << 30)
NCCL_RESERVE = 1536 << 20  # stages.NCCLReserve


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip().startswith("{")]
    except (OSError, ValueError):
        return []


def g(v):
    return "—" if v is None else f"{v / GIB:.2f}"


def smi(name):
    """{gpu: largest less smallest memory.used, bytes} of logs/NAME.smi."""
    seen = {}
    try:
        with open(f"{out}/logs/{name}.smi") as f:
            for l in f:
                m = re.match(r"\s*(\d+),\s*(\d+)", l)
                if m:
                    seen.setdefault(int(m[1]), []).append(int(m[2]) << 20)
    except OSError:
        pass
    return {k: max(v) - min(v) for k, v in seen.items()}


def smi_range(name):
    d = smi(name)
    return "—" if not d else f"{min(d.values()) / GIB:.2f}–{max(d.values()) / GIB:.2f} ({len(d)} GPUs)"


def tps(r, stage):
    return ((r or {}).get(stage) or {}).get("tokens_per_s") or 0.0


print("# Scaling on 4 and 8 GPUs (bench/scale_device.sh)\n")
env = open(f"{out}/env.txt").read().splitlines() if os.path.exists(f"{out}/env.txt") else []
print("\n".join(f"    {l}" for l in env[:3]), "\n")

# Item 1 (and the 7B pair): rlbench and the peer, per model and dp.
runs = {}
for p in glob.glob(f"{out}/json/*-dp*.json"):
    m = re.match(r"(peer|rlpipe)-(.+)-dp(\d+)\.json$", os.path.basename(p))
    if m:
        runs[(m[2], int(m[3]), m[1])] = load(p)
if runs:
    print("## rlbench and the PyTorch FSDP2 peer: 8 × 2048 tokens per GPU\n")
    print("Tokens/s per GPU; efficiency is per GPU against the same side at dp 1.\n")
    print("| model | dp | side | status | train tok/s/GPU | eff | ref_logprob tok/s/GPU | eff | rlpipe / peer train |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (m, dp, side) in sorted(runs, key=lambda k: (k[0], k[1], k[2])):
        r = runs[(m, dp, side)] or {}
        base = runs.get((m, 1, side))
        cells = []
        for st in ("train", "ref_logprob"):
            v = tps(r, st) / dp
            b = tps(base, st)
            cells += [f"{v:,.0f}" if v else "—", f"{100 * v / b:.0f}%" if v and b else "—"]
        other = runs.get((m, dp, "peer"))
        ratio = f"{tps(r, 'train') / tps(other, 'train'):.2f}×" if side == "rlpipe" and tps(other, "train") and tps(r, "train") else ""
        status = r.get("status", "missing")
        if r.get("error"):
            status += ": " + r["error"].splitlines()[-1][:60]
        print(f"| {m} | {dp} | {side} | {status} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {ratio} |")
    print("\nrlpipe memory per GPU, GiB. NVML: rank 0's process on GPU 0; nvidia-smi: each GPU's largest memory.used less its idle figure,"
          " smallest–largest over the GPUs. Outside the arena: NVML less the arena; NCCL: that less the same at dp 1, against the plan's"
          f" reserve of {NCCL_RESERVE / GIB:.2f}.\n")
    print("| model | dp | plan peak | arena | high-water | plan total | NVML GPU 0 | nvidia-smi | outside arena | NCCL | host peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    def memories(side):
        for (m, dp, sd) in sorted(runs):
            if sd == side and runs[(m, dp, sd)]:
                yield m, dp, runs[(m, dp, sd)].get("memory", {})

    def less_dp1(figs, m, dp):
        o, o1 = figs.get((m, dp)), figs.get((m, 1))
        return g(o - o1) if o is not None and o1 is not None and dp > 1 else "—"

    outside = {}
    for m, dp, mem in memories("rlpipe"):
        nv = mem.get("nvml_process_bytes")
        if nv:
            outside[(m, dp)] = nv - mem.get("plan_device_arena_bytes", 0)
        print(f"| {m} | {dp} | {g(mem.get('plan_peak_bytes'))} | {g(mem.get('plan_device_arena_bytes'))} | {g(mem.get('arena_high_water_bytes'))} "
              f"| {g(mem.get('plan_device_total_bytes'))} | {g(nv)} | {smi_range(f'rlpipe-{m}-dp{dp}')} | {g(outside.get((m, dp)))} "
              f"| {less_dp1(outside, m, dp)} | {g(mem.get('host_peak_rss_bytes'))} |")
    print("\nThe peer's memory on GPU 0, GiB (torch.cuda; device used less reserved, less the same at dp 1, is its NCCL and context):\n")
    print("| model | dp | allocated | reserved | device used | used − reserved | NCCL | nvidia-smi |")
    print("|---|---|---|---|---|---|---|---|")
    extra = {}
    for m, dp, mem in memories("peer"):
        used, res = mem.get("device_used_max_bytes"), mem.get("peak_reserved_bytes")
        if used and res:
            extra[(m, dp)] = used - res
        print(f"| {m} | {dp} | {g(mem.get('peak_allocated_bytes'))} | {g(res)} | {g(used)} | {g(extra.get((m, dp)))} | {less_dp1(extra, m, dp)} "
              f"| {smi_range(f'peer-{m}-dp{dp}')} |")
    print()

# Items 2-4: rlpipe run records.
recs = sorted(d for d in glob.glob(f"{out}/json/*/") if os.path.exists(d + "metrics.jsonl") or os.path.exists(d + "log"))
if recs:
    print("## rlpipe run (one process, or a process per GPU)\n")
    print("Timing runs are cut (killed) once their last step is recorded, before the final checkpoint and export."
          " Tokens/s: the median of the steps after the first (the whole step). GiB per GPU. High-water: rank 0's arena (the run record's);"
          " NVML rank 0: its process on its GPU (metrics.jsonl's nvml_bytes); nvidia-smi: each GPU's largest memory.used less its idle"
          " figure, smallest–largest; RSS: each process's peak (maxrss.py); plan host: pinned arena + largest host buffer.\n")
    print("| run | processes × ranks | status | steps | tok/s/GPU | setup s | ckpt s | export s | plan peak | arena | high-water | plan total | NVML rank 0 | nvidia-smi | RSS per process | plan host per rank |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in recs:
        name = os.path.basename(d.rstrip("/"))
        met = lines(d + "metrics.jsonl")
        ev = {e.get("event"): e for e in lines(d + "log") if e.get("event")}
        info = load(d + "run.json") or {}
        p = load(d + "plan.json") or {}  # the record's plan: no header, no total
        start = ev.get("run_started", {})
        ranks = start.get("ranks") or 1
        later = [x.get("tokens_per_s") for x in met[1:] if x.get("tokens_per_s")]
        tok = statistics.median(later) / ranks if later else None
        rss = sorted((x.get("rank", 0), x.get("max_rss_bytes", 0)) for x in (load(f) for f in glob.glob(d + "rank-*.json")) if x)
        rss_s = ", ".join(f"{b / GIB:.2f}" for _, b in rss) or "—"
        total = (p.get("device_arena_bytes") or 0) + (p.get("resident_arena_bytes") or 0) + sum(r.get("bytes", 0) for r in p.get("reserves") or [])
        host = (p.get("host_pinned_bytes") or 0) + max([h.get("bytes", 0) for h in p.get("host_buffers") or [] if not h.get("rank0")] or [0])
        hw = ev.get("run_finished", {}).get("high_water_bytes") or max([x.get("peak_mem_bytes") or 0 for x in met] or [0]) or None
        nv = max([x.get("nvml_bytes") or 0 for x in met] or [0]) or None
        cut = max([x.get("cut_after_steps") or 0 for x in (load(f) for f in glob.glob(d + "rank-*.json")) if x] or [0])
        status = f"cut after {cut} steps" if cut else info.get("status", "?")
        print(f"| {name} | {start.get('processes', '?')} × {ranks} | {status} | {len(met)} | {f'{tok:,.0f}' if tok else '—'} "
              f"| {ev.get('setup_finished', {}).get('seconds', 0):.1f} | {ev.get('checkpoint_saved', {}).get('seconds', 0):.1f} "
              f"| {ev.get('export_written', {}).get('seconds', 0):.1f} | {g(p.get('peak_bytes'))} | {g(p.get('device_arena_bytes'))} | {g(hw)} "
              f"| {g(total or None)} | {g(nv)} | {smi_range(name)} | {rss_s} | {g(host)} |")
    print()

plans = sorted(glob.glob(f"{out}/json/plan-*.json"))
if plans:
    print(f"## Plans on {os.environ.get('SCALE_GPU', 'h200-141g')} (rlpipe plan --json)\n")
    print("| spec | ranks | dp × cp | rows per GPU | peak | arena | device total | fits |")
    print("|---|---|---|---|---|---|---|---|")
    for f in plans:
        p = load(f)
        if not p:
            print(f"| {os.path.basename(f)[5:-5]} | plan failed: logs/{os.path.basename(f)[:-5]}.log | | | | | | |")
            continue
        j = p.get("job") or {}
        print(f"| {os.path.basename(f)[5:-5]} | {j.get('ranks', '?')} | {j.get('dp', '?')} × {j.get('cp') or 1} | {j.get('tokens_per_micro_batch', '?')} "
              f"| {g(p.get('peak_bytes'))} | {g(p.get('device_arena_bytes'))} | {g(p.get('device_total_bytes'))} | {p.get('fits')} |")
    print()

tests = sorted(glob.glob(f"{out}/logs/gpu-tests-*.log"))
if tests:
    print("## GPU tests\n")
    for f in tests:
        for l in open(f, errors="replace"):
            if re.match(r"\s*--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)\b|NCCL on GPU|\s+\S+_test\.go:\d+: .*(MiB|GiB|skip)", l):
                print("    " + l.rstrip()[:200])
    print()

if os.path.exists(f"{out}/summary.txt"):
    print("## The runs as they went\n")
    print("\n".join("    " + l.rstrip() for l in open(f"{out}/summary.txt")))
PY
}

cat >"$W/maxrss.py" <<'PY'
"""maxrss.py DIR CMD...: runs CMD, passes SIGTERM and SIGINT on, and writes
DIR/rank-RANK.json with the child's peak RSS (getrusage of the children
once it exited) and exit code. With MAXRSS_STOP_AFTER=N and
MAXRSS_RUNS=RUNS, it kills the child once RUNS/*/metrics.jsonl has N
lines (rank 0 writes a step's line before its checkpoint, which a timing
run does not need) and exits 0; otherwise with the child's code."""
import glob, json, os, resource, signal, subprocess, sys

out, cmd = sys.argv[1], sys.argv[2:]
stop, runs = int(os.environ.get("MAXRSS_STOP_AFTER", "0")), os.environ.get("MAXRSS_RUNS", "")


def steps():
    n = 0
    for f in glob.glob(f"{runs}/*/metrics.jsonl"):
        with open(f) as m:
            n = max(n, sum(1 for _ in m))
    return n


p = subprocess.Popen(cmd)
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda n, _f: p.send_signal(n))
while True:
    try:
        rc = p.wait(timeout=0.5)
        break
    except subprocess.TimeoutExpired:
        if stop and steps() >= stop:
            p.kill()
cut = bool(stop and steps() >= stop)  # a rank that failed as its peers were killed counts as cut too
rank = int(os.environ.get("RANK", "0"))
os.makedirs(out, exist_ok=True)
with open(f"{out}/rank-{rank}.json", "w") as f:
    json.dump({"rank": rank, "pid": p.pid, "rc": rc, "cut_after_steps": stop if cut else 0,
               "max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10}, f)
sys.exit(0 if cut else rc if rc >= 0 else 128 - rc)
PY

say "start: phases '$PHASES', $NGPU GPUs visible (W=$WORLD), budget ${BUDGET}s${DRY:+, dry run}"
if [[ -z $DRY ]]; then
	{
		nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1
		nproc
		grep -E '^(MemTotal|MemAvailable)' /proc/meminfo
		python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())' 2>&1
		nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv 2>&1
		nvidia-smi topo -m 2>&1
		df -h /tmp 2>&1
		ls -l "$B" 2>&1
	} >"$OUT/env.txt"
	for bin in "$RLBENCH" "$RLPIPE"; do
		[[ -x $bin ]] || say "missing $bin: build it first (see the header)"
	done
fi
for ph in $PHASES; do
	case $ph in
	dp | 7b | cp | proc | long) "phase_$ph" ;;
	*) say "unknown phase '$ph' (dp, 7b, cp, proc, long)" ;;
	esac
done
summarize
say "done"
if [[ -z $DRY ]]; then
	cp "$OUT/summary.txt" "$OUT/logs/" 2>/dev/null
	(cd "$OUT" && tar czf json.tgz json && rm -rf json && tar czf logs.tgz logs && rm -rf logs)
	cat "$OUT/summary.md"
fi
