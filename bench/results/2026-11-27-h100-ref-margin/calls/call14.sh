#!/usr/bin/env bash
# Call 14: main (d1c9ac0) built with the fused gate/up kernel's tile group
# GS_GROUP at 8, 16 (main's), 32 and 64 row tiles (kernels/gemm.cu; the
# weights are read from memory once per group). BenchmarkGateUpSwiGLU at
# the 3B shapes, the four alternated twice; TestGateUpSwiGLU on 32 and 64;
# the 3B step on 16, 32 and 64, alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
for g in 32 64; do
	(cd gpu/cuda && timeout 120 ../../.devbin/G$g/cuda.test -test.run 'TestGateUpSwiGLU' >"$R/tests-$g.log" 2>&1)
	say "G$g tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests-$g.log" | tr '\n' ' ')"
done
for rep in 1 2; do
	for g in 8 16 32 64; do
		(cd gpu/cuda && timeout 100 ../../.devbin/G$g/cuda.test -test.run '^$' -test.bench 'GateUpSwiGLU/fused' -test.benchtime 30x >"$R/bench-$g-$rep.log" 2>&1)
		say "G$g rep $rep: $(grep -E '^Benchmark' "$R/bench-$g-$rep.log" | awk '{print $1, $3, $4, $5, $6}' | tr '\n' ';')"
	done
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for g in 16 32 64 16 32 64; do
	i=$((i + 1))
	timeout 150 .devbin/G$g/rlbench "${W[@]}" --out "$R/3b-$g-$i.json" >"$R/3b-$g-$i.log" 2>&1
	say "3b G$g run $i rc=$? $(tail -n 1 "$R/3b-$g-$i.log" | cut -c1-100)"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
