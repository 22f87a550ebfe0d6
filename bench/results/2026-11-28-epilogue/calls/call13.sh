#!/usr/bin/env bash
# Call 13 (one H200 machine's host, 16 cores): BenchmarkTokenGradsFill
# (stages/rl, main at the review commit), one goroutine against
# GOMAXPROCS, four rounds.
set -u
tar xzf .devbin/b.tgz -C .devbin
(cd stages/rl && timeout 60 ../../.devbin/r/rl.test -test.run '^$' -test.bench TokenGradsFill -test.count 4) 2>&1 | tee "$OUT/summary.txt"
