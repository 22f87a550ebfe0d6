# device_lib.sh: the helpers the device scripts share. Source it after
# setting D, the directory logs and summary.txt go to.

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
