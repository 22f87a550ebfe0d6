#!/usr/bin/env bash
# Call 11: B is main at f9b22e3 (the forward softmax's one fma); G is B
# with the fused log-prob head's epilogue trimmed (the columns past n and
# the targets' logits handled apart from the per-element work, the
# exponential as one fma and ex2). G's head tests and TestRunTinyCUDA;
# BenchmarkLogProbsHead, B and G alternated; the 3B step, B and G
# alternated; best against best at 3B and 1.5B on G (on B if G's tests
# failed).
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 150 ../../.devbin/G/cuda.test -test.run 'TestLogProbs|TestHead' -test.v >"$R/tests.log" 2>&1)
rc=$?
say "G head tests rc=$rc $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 ../.devbin/G/stages.test -test.run 'TestRunTinyCUDA' >"$R/stages.log" 2>&1)
rc2=$?
say "G TestRunTinyCUDA rc=$rc2 $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
for rep in 1 2; do
	for b in B G; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'LogProbsHead' -test.benchtime 20x >"$R/bench-$b-$rep.log" 2>&1)
		say "[$b] rep $rep: $(grep -E '^Benchmark' "$R/bench-$b-$rep.log" | awk '{print $1, $3, $4}' | tr '\n' ';')"
	done
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in B G B G; do
	i=$((i + 1))
	timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1
	say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
done
best=G
[[ $rc == 0 && $rc2 == 0 ]] || best=B
cp .devbin/$best/rlbench .devbin/rlbench
say "fair runs on $best"
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="peer-ac auto" FAIR_BUDGET_S=280 bash bench/fair_device.sh >"$R/fair3.log" 2>&1
rm -rf "$OUT/f3"/work-*
say "$(grep 'best against best' "$R/fair3.log" | tail -1)"
say "$(grep '| shared' "$R/fair3.log" | tail -1)"
OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="peer-noac auto" FAIR_BUDGET_S=150 bash bench/fair_device.sh >"$R/fair15.log" 2>&1
rm -rf "$OUT/f15"/work-*
say "$(grep 'best against best' "$R/fair15.log" | tail -1)"
say "$(grep '| shared' "$R/fair15.log" | tail -1)"
(cd "$OUT" && tar czf r.tgz r f3 f15 && rm -rf r f3 f15)
