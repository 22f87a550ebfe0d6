# device_lib.sh: the helpers the device scripts share. Source it, then set
# D, the directory logs and summary.txt go to (or call workdir).

# workdir NAME: D=$OUT/NAME (made, absolute) for the logs, and a fresh,
# empty work directory W=/tmp/rlpipe-NAME.
workdir() {
	D=$OUT/$1
	W=/tmp/rlpipe-$1
	mkdir -p "$D"
	D=$(realpath "$D")
	rm -rf "$W" && mkdir -p "$W"
}

# random_job MODEL GROUPS: a random-init bf16 checkpoint of
# examples/models/MODEL in $W/model and GROUPS groups of rollouts in
# $W/rollouts.jsonl (random_rollouts), logged to $D/setup.log.
random_job() {
	python3 bench/random_init.py "examples/models/$1" "$W/model" >"$D/setup.log" 2>&1 &&
		random_rollouts "$W" "$2" >>"$D/setup.log" 2>&1
}

# outdirs SUB...: makes $OUT/SUB... and $OUT/logs (budgeted's logs), makes
# OUT absolute and points D at it (say's summary.txt); B is the binaries
# carried in .devbin, C rlbench's checkpoint cache.
outdirs() {
	mkdir -p "$OUT/logs" "${@/#/$OUT/}"
	OUT=$(realpath "$OUT")
	D=$OUT
	B=$PWD/.devbin
	C=/tmp/rbc
}

# visible_dp [DP]: sets NGPU to the number of GPUs visible and DP to DP,
# or when that is empty to NGPU (at most 8).
visible_dp() {
	NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
	DP=${1:-$((NGPU > 8 ? 8 : NGPU))}
}

# say prints a timestamped line and appends it to $D/summary.txt.
say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$D/summary.txt"; }

# run NAME LIMIT CMD...: runs CMD with a time limit, its output in
# $D/NAME.log, and says its exit code and last result lines.
run() {
	local name=$1 limit=$2
	shift 2
	timeout -k 5 "$limit" "$@" >"$D/$name.log" 2>&1
	say "$name: rc=$? $(grep -E -- '^(ok|FAIL|PASS|--- FAIL|run )' "$D/$name.log" | tail -n 3 | tr '\n' ' ')"
}

# random_rollouts DIR GROUPS: writes DIR/rollouts.jsonl, GROUPS groups of 8
# samples with a shared 128-token prompt and 384-token responses of random
# ids, random rewards (seeded: the same file every time).
random_rollouts() {
	python3 - "$1" "$2" <<'PY'
import json, random, sys
w, groups = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
with open(f"{w}/rollouts.jsonl", "w") as f:
    for g in range(groups):
        prompt = [rng.randrange(1000, 20000) for _ in range(128)]
        for _ in range(8):
            f.write(json.dumps({"prompt_tokens": prompt, "response_tokens": [rng.randrange(1000, 20000) for _ in range(384)],
                                "reward": rng.random(), "group": g}) + "\n")
print("ok")
PY
}

# budgeted NAME LIMIT CMD...: runs CMD under LIMIT seconds or what is left
# of $BUDGET seconds of the script (less 5), its output in
# $OUT/logs/NAME.log; says its exit code and last line, and skips (return
# 99) when fewer than 20 seconds are left. Where nvidia-smi is, the GPUs'
# utilization, SM clock, power and throttle reasons are sampled every 200
# ms meanwhile into $OUT/logs/NAME.smi.csv, and the line ends with
# bench/smi_summary.py's summary of the busy samples: a step at these
# sizes runs at the power cap, at a clock that depends on the data.
budgeted() {
	local n=$1 limit=$2
	shift 2
	local left=$((BUDGET - SECONDS - 5))
	((left < 20)) && { echo "$n: skipped, ${left}s left"; return 99; }
	((limit > left)) && limit=$left
	local smi="" clk=""
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi --query-gpu=index,utilization.gpu,clocks.sm,power.draw,clocks_throttle_reasons.active \
			--format=csv,noheader,nounits -lms 200 >"$OUT/logs/$n.smi.csv" 2>/dev/null &
		smi=$!
	fi
	timeout -k 5 "$limit" "$@" >"$OUT/logs/$n.log" 2>&1
	local rc=$?
	if [[ -n $smi ]]; then
		kill "$smi" 2>/dev/null
		wait "$smi" 2>/dev/null
		clk=$(python3 bench/smi_summary.py "$OUT/logs/$n.smi.csv" 2>&1 | tail -n 1)
	fi
	echo "$n: rc=$rc at +${SECONDS}s: $(grep -v '^\s*$' "$OUT/logs/$n.log" | tail -n 1 | cut -c1-250)${clk:+ [$clk]}"
	return $rc
}

# split_env ARGS...: sets ENVS to the leading NAME=VALUE arguments and
# ARGS to the rest (a run's environment, then its flags).
split_env() {
	ENVS=()
	while [[ $# -gt 0 && $1 == *=* ]]; do
		ENVS+=("$1")
		shift
	done
	ARGS=("$@")
}

# bench_step NAME DP MODEL STEPS JSON [ENV=VALUE...] [FLAGS...]: one
# rlbench run of the benchmark step at dp DP (8 sequences of 2048 tokens
# per GPU, every layer recomputed, chunk 2048, 1 warm-up and STEPS timed
# steps) from $B, with ENV in its environment and FLAGS after its own,
# its result in JSON, under budgeted (log, limit 240 s), said.
bench_step() {
	local n=$1 dp=$2 m=$3 steps=$4 json=$5
	shift 5
	split_env "$@"
	say "$(budgeted "$n" 240 env "${ENVS[@]}" "$B/rlbench" --backend cuda --config "examples/models/$m/config.json" --dp "$dp" \
		--seqs $((8 * dp)) --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps "$steps" --precision bf16 \
		--recompute --cache "$C" -q --out "$json" "${ARGS[@]}")"
}

# peer_inputs JSON WORK: prints, one a line, the peer_fsdp2.py flags that
# start the peer from the random checkpoint of the rlbench run that wrote
# JSON and the rollouts it kept in WORK (rlbench --workdir WORK), so that
# the two sides' grad norms are of the same weights and data; nothing,
# and a line on standard error, when that run left neither.
peer_inputs() {
	local ck
	ck=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("checkpoint_path") or "")' "$1" 2>/dev/null)
	if [[ -n $ck && -f $2/rollouts.jsonl ]]; then
		printf '%s\n' --weights "$ck" --rollouts "$2/rollouts.jsonl"
	else
		echo "peer_inputs: no checkpoint in $1 or no rollouts in $2: the peer draws its own" >&2
	fi
}
