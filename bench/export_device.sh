#!/usr/bin/env bash
# rlpipe's HF exports, loaded in transformers (issue 12), in one device call
# of a minute or two:
#
# 1. bench/export_check.py make: a tiny random-init Qwen2 checkpoint (bf16,
#    save_pretrained) with a tokenizer (tokenizers' WordLevel), a chat
#    template, generation_config.json, README.md, LICENSE and a hidden
#    .gitattributes, in both config.json dialects: the one the installed
#    transformers writes, and a hand-edited copy in the other (t4:
#    torch_dtype/rope_theta, t5: dtype/rope_parameters).
# 2. For each dialect: `rlpipe run` of examples/tiny-grpo.yaml on it, 3 steps
#    (a checkpoint and the export at the end: one model.safetensors), then
#    `rlpipe export` of the same checkpoint in the other dtype with
#    --max-shard-size 64KB (shards and model.safetensors.index.json).
# 3. The source directory moved: `rlpipe export` must refuse, naming it and
#    --source; with --source it must write the run's export again, the same
#    bytes.
# 4. bench/export_check.py check: every export loads with AutoTokenizer and
#    AutoModelForCausalLM, its parameters are bit for bit the export's
#    tensors, the sharded exports' weights the single ones' (rounded to the
#    narrower dtype), the config keeps its dialect, the copied files are the
#    source's, and it generates a few tokens (see the script's docstring).
#
# Build first, here:
#
#   go build -ldflags='-s -w' -o .devbin/rlpipe ./cmd/rlpipe
#
# then on the device, carrying .devbin:
#
#   run(command="bash bench/export_device.sh", carry=[".devbin"], timeout_s=600)
#
# $OUT/export/ gets result.json (the verdict, "ok", and every check),
# summary.txt and the logs (make, each rlpipe command, check). The exit code
# is 0 only when every check passed. A dry run without a GPU, transformers
# or tokenizers checks the rlpipe side and the file checks:
#
#   OUT=/tmp/export-dry EXPORT_BACKEND=cpu EXPORT_NO_HF=1 bash bench/export_device.sh
#
# Knobs: EXPORT_BACKEND (cuda), EXPORT_NO_HF=1, PYTHON (python3), RLPIPE
# (.devbin/rlpipe), EXPORT_SHARD_SIZE (64KB).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/export-out}
BACKEND=${EXPORT_BACKEND:-cuda}
PY=${PYTHON:-python3}
RLPIPE=${RLPIPE:-.devbin/rlpipe}
SHARD=${EXPORT_SHARD_SIZE:-64KB}
NOHF=()
[[ ${EXPORT_NO_HF:-} == 1 ]] && NOHF=(--no-hf)
. bench/device_lib.sh
workdir export
CHECKS=$D/shell-checks.txt
: >"$CHECKS"

# fail WHY: records WHY in result.json and summary.txt, and stops.
fail() {
	printf '{"ok": false, "errors": [%s], "cases": []}\n' "$("$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1" 2>/dev/null || echo '"see summary.txt"')" >"$D/result.json"
	say "FAIL: $1"
	exit 1
}
trap 'fail "line $LINENO: $BASH_COMMAND exited $?"' ERR

# step NAME LIMIT CMD...: runs CMD with a time limit, its output in
# $D/NAME.log; a failure shows the log's tail and stops the script.
step() {
	local name=$1 limit=$2 rc=0 t0=$SECONDS
	shift 2
	timeout -k 5 "$limit" "$@" >"$D/$name.log" 2>&1 || rc=$?
	if ((rc != 0)); then
		((rc == 124 || rc == 137)) && say "$name: timed out after ${limit}s"
		tail -n 20 "$D/$name.log" | tee -a "$D/summary.txt"
		fail "$name: exit $rc (log: $name.log)"
	fi
	say "$name: ok in $((SECONDS - t0))s"
}

# shell_check NAME OK DETAIL: a check made here, for result.json.
shell_check() {
	if [[ $2 == ok ]]; then
		echo "$1 ok $3" >>"$CHECKS"
		say "$1: ok"
	else
		echo "$1 FAIL $3" >>"$CHECKS"
		say "$1: FAIL $3"
	fi
}

[[ -x $RLPIPE ]] || fail "no $RLPIPE: build it with go build -ldflags='-s -w' -o .devbin/rlpipe ./cmd/rlpipe and carry .devbin"
if ((${#NOHF[@]} == 0)); then
	"$PY" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())' >"$D/versions.txt" 2>&1 ||
		fail "$PY cannot import torch, transformers and tokenizers ($(tail -n 1 "$D/versions.txt")); EXPORT_NO_HF=1 runs the file checks alone"
	say "$(cat "$D/versions.txt")"
fi
if [[ $BACKEND == cuda ]]; then
	say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)"
fi
"$RLPIPE" version >"$D/rlpipe-version.txt" 2>&1 || true

step make 180 "$PY" bench/export_check.py make "$W/src" "${NOHF[@]}"

cases=()
declare -A runs
for d in t4 t5; do
	spec=$W/$d.yaml
	sed -e "s#path: models/tiny-qwen2#path: $W/src/$d#" -e "s#rollouts: data/#rollouts: $REPO/examples/data/#" \
		-e "s#^  steps: 12\$#  steps: 3#" examples/tiny-grpo.yaml >"$spec"
	grep -q "path: $W/src/$d" "$spec" && grep -q "rollouts: $REPO/" "$spec" && grep -q '^  steps: 3$' "$spec" ||
		fail "examples/tiny-grpo.yaml has changed: cannot make $spec from it (model path, rollouts, steps)"
	step "run-$d" 300 "$RLPIPE" run --backend "$BACKEND" --runs "$W/runs-$d" "$spec"
	run=$(ls -d "$W/runs-$d"/*/ | head -n 1)
	run=${run%/}
	runs[$d]=$run
	[[ -f $run/export/actor/config.json ]] || fail "run-$d wrote no export in $run/export/actor"
	src_dtype=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("dtype") or d.get("torch_dtype") or "float32")' "$W/src/$d/config.json")
	if [[ $src_dtype == bfloat16 ]]; then other=float32; else other=bfloat16; fi
	step "export-$d" 120 "$RLPIPE" export --dtype "$other" --max-shard-size "$SHARD" --out "$W/$d-sharded" "$run"
	say "  $(grep -E '^(exported|copied)' "$D/export-$d.log" | tr '\n' ' ')"
	cases+=(--case "$d-run" "$W/src/$d" "$run/export/actor" source single)
	cases+=(--case "$d-sharded" "$W/src/$d" "$W/$d-sharded" "$other" sharded "$d-run")
done

# The source directory moved since the run: refused, with a way on.
mv "$W/src/t4" "$W/src/t4-moved"
rc=0
"$RLPIPE" export --out "$W/t4-moved" "${runs[t4]}" >"$D/export-moved.log" 2>&1 || rc=$?
if ((rc != 0)) && grep -qF "$W/src/t4" "$D/export-moved.log" && grep -qF -- "--source" "$D/export-moved.log" && [[ ! -e $W/t4-moved ]]; then
	shell_check source-moved-refused ok "exit $rc"
else
	shell_check source-moved-refused FAIL "exit $rc, export dir $([[ -e $W/t4-moved ]] && echo written || echo absent): $(tail -n 2 "$D/export-moved.log" | tr '\n' ' ')"
fi
step export-source 120 "$RLPIPE" export --source "$W/src/t4-moved" --out "$W/t4-source" "${runs[t4]}"
mv "$W/src/t4-moved" "$W/src/t4"
if cmp -s "$W/t4-source/model.safetensors" "${runs[t4]}/export/actor/model.safetensors" &&
	cmp -s "$W/t4-source/config.json" "${runs[t4]}/export/actor/config.json"; then
	shell_check source-flag ok "--source wrote the run's export again, the same bytes"
else
	shell_check source-flag FAIL "the export with --source differs from the run's"
fi

rc=0
"$PY" bench/export_check.py check --out "$D/result.json" --shell-checks "$CHECKS" "${NOHF[@]}" "${cases[@]}" >"$D/check.log" 2>&1 || rc=$?
grep -E '^(t[45]-|  FAIL|FAIL|export check)' "$D/check.log" | tee -a "$D/summary.txt" || true
[[ -s $D/result.json ]] || fail "export_check.py check wrote no result (exit $rc; see check.log)"
say "done: exit $rc; result in $D/result.json"
trap - ERR
exit $rc
