#!/usr/bin/env bash
# The GPU checks of a change, in one device call: the CUDA tests of the
# packages built into .devbin (model parity against the HF goldens, the
# stages' GPU runs), the tiny recipes through `rlpipe run --backend cuda`,
# and an A/B of two rlbench builds (before and after the change) on the same
# GPU, alternated. Logs and JSON go to $OUT/check, tarred into
# $OUT/check.tgz. Build first (stripped, to keep the carry small):
#
#   L='-ldflags=-s -w'
#   go test -c "$L" -o .devbin/model.test ./model
#   go test -c "$L" -o .devbin/stages.test ./stages
#   go test -c "$L" -o .devbin/cuda.test ./gpu/cuda
#   go build "$L" -o .devbin/rlpipe ./cmd/rlpipe
#   go build "$L" -o .devbin/rlbench ./bench/cmd/rlbench
#   (cd OLD_CHECKOUT && go build "$L" -o .devbin/rlbench-old ./bench/cmd/rlbench)
#
# Knobs: CHECK_TESTS (regexp for stages.test, default TestRunTinyCUDA$),
# CHECK_AB_MODEL (default qwen2.5-1.5b; several, space-separated, run one
# after the other; empty skips the A/B), CHECK_AB_ROUNDS (default 2),
# CHECK_AB_FLAGS (default --recompute; e.g. --recompute-auto),
# CHECK_AB_STEPS (timed steps, default 3), CHECK_DP (default 1; rlbench
# --dp), CHECK_BENCH (regexp for cuda.test's benchmarks, default none).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/check-out}
D=$OUT/check
mkdir -p "$D"
B=.devbin
. bench/device_lib.sh
# gotest PKG NAME LIMIT ARGS...: a test binary runs in its package's
# directory, where its testdata is.
gotest() {
	local pkg=$1 name=$2 limit=$3
	shift 3
	[[ -x $B/$name.test ]] || return 0
	(cd "$pkg" && run "$name-tests" "$limit" "$OLDPWD/$B/$name.test" -test.v "$@")
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$D/env.txt" 2>&1
say "$(tail -n +2 "$D/env.txt" | head -n 1)"
D=$(realpath "$D")
gotest gpu/cuda cuda 240
if [[ -n ${CHECK_BENCH:-} && -x $B/cuda.test ]]; then
	(cd gpu/cuda && run cuda-bench 180 "$OLDPWD/$B/cuda.test" -test.run '^$' -test.bench "$CHECK_BENCH" -test.benchtime 20x)
fi
gotest model model 240
gotest stages stages 300 -test.run "${CHECK_TESTS:-TestRunTinyCUDA\$}"
if [[ -x $B/rlpipe ]]; then
	for r in tiny-grpo tiny-ppo; do
		rm -rf "/tmp/check-runs-$r"
		run "rlpipe-$r" 120 "$B/rlpipe" run --backend cuda --runs "/tmp/check-runs-$r" "examples/$r.yaml"
		cp /tmp/check-runs-$r/*/updates.jsonl "$D/$r-updates.jsonl" 2>/dev/null
		cp /tmp/check-runs-$r/*/metrics.jsonl "$D/$r-metrics.jsonl" 2>/dev/null
	done
fi
for M in ${CHECK_AB_MODEL-qwen2.5-1.5b}; do
	[[ -x $B/rlbench && -x $B/rlbench-old ]] || break
	for i in $(seq 1 "${CHECK_AB_ROUNDS:-2}"); do
		for b in rlbench-old rlbench; do
			# shellcheck disable=SC2086 # CHECK_AB_FLAGS is a list of flags
			run "$M-$b-$i" 180 "$B/$b" --backend cuda --config "examples/models/$M/config.json" --dp "${CHECK_DP:-1}" \
				--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 ${CHECK_AB_FLAGS:---recompute} \
				--warmup 1 --steps "${CHECK_AB_STEPS:-3}" --budget-s 40 --cache /tmp/check-cache --out "$D/$M-$b-$i.json"
		done
	done
done
say done
tar czf "$OUT/check.tgz" -C "$OUT" check
