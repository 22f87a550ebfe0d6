#!/usr/bin/env bash
# Call 8: M is main (5b5f05f); L is branch gateup-lag (the gate/up
# kernel's second consumer warpgroup GS_LAG k-steps behind the first,
# each staging its own half of a tile; RLPIPE_DIAG_DEFINES=GS_LAG=N picks
# the lag, 0 starting both together). TestGateUpSwiGLU at lags 0, 1 and
# 2; BenchmarkGateUpSwiGLU's fused row (3B shapes), M and L at lags 0-3
# alternated, three rounds.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for g in 0 1 2; do
	(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_LAG=$g" timeout 150 ../../.devbin/L/cuda.test -test.run 'TestGateUpSwiGLU' -test.v >"$R/tests-$g.log" 2>&1)
	say "L lag $g tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-$g.log" | tr '\n' ' ')"
done
for rep in 1 2 3; do
	for c in M 0 1 2 3; do
		if [[ $c == M ]]; then
			(cd gpu/cuda && timeout 100 ../../.devbin/M/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^fused' -test.benchtime 20x >"$R/bench-$c-$rep.log" 2>&1)
		else
			(cd gpu/cuda && RLPIPE_DIAG_DEFINES="GS_LAG=$c" timeout 100 ../../.devbin/L/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/^fused' -test.benchtime 20x >"$R/bench-$c-$rep.log" 2>&1)
		fi
		say "[$c] rep $rep: $(grep -E '^Benchmark' "$R/bench-$c-$rep.log" | awk '{print $1, $3, $5}' | tr '\n' ';')"
	done
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
