#!/usr/bin/env bash
# Call 4: M is main (69af574); S1 is branch stage-stmatrix (e487ebc: the
# gate/up and q/k/v kernels' staging written with stmatrix, the staged and
# drained mbarriers released a warp at a time); S2 is branch
# stage-stmatrix-thread (22d5902: stmatrix, the barriers a thread at a
# time as in M). S1's and S2's tests of both kernels; the fused rows of
# BenchmarkGateUpSwiGLU and BenchmarkQKVRoPE (3B shapes), M, S1, S2
# alternated, three rounds; the 3B step, M and S1 alternated, twice each.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for b in S1 S2; do
	(cd gpu/cuda && timeout 150 ../../.devbin/$b/cuda.test -test.run 'TestGateUpSwiGLU|TestQKVRoPE' -test.v >"$R/tests-$b.log" 2>&1)
	say "$b tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-$b.log" | tr '\n' ' ')"
done
for rep in 1 2 3; do
	for b in M S1 S2; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench '(GateUpSwiGLU|QKVRoPE)/^fused' -test.benchtime 20x >"$R/bench-$b-$rep.log" 2>&1)
		say "[$b] rep $rep: $(grep -E '^Benchmark' "$R/bench-$b-$rep.log" | awk '{print $1, $3, $5}' | tr '\n' ';')"
	done
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in M S1 M S1; do
	i=$((i + 1))
	timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1
	say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
