#!/usr/bin/env bash
# Call 10: B is main (425e90f); F is B with the forward softmax's exponent
# one fma (2^fma(s, sl2, -m), maxima over s then scaled) instead of a
# multiply and a subtraction. F's attention tests and TestRunTinyCUDA;
# the forward rows of BenchmarkOps, B and F alternated; the 3B step, B
# and F alternated.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 150 ../../.devbin/F/cuda.test -test.run 'TestAttention' -test.v >"$R/tests.log" 2>&1)
say "F attention tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/tests.log" | tr '\n' ' ')"
(cd stages && timeout 150 ../.devbin/F/stages.test -test.run 'TestRunTinyCUDA' -test.v >"$R/stages.log" 2>&1)
say "F TestRunTinyCUDA rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages.log" | tr '\n' ' ')"
for rep in 1 2; do
	for b in B F; do
		(cd gpu/cuda && timeout 100 ../../.devbin/$b/cuda.test -test.run '^$' -test.bench 'Ops/attention_fwd_(8x2048|2x16384)_h1[24]/2_d(128|64)_ws_pingpong$' -test.benchtime 20x >"$R/bench-$b-$rep.log" 2>&1)
		say "[$b] rep $rep rc=$?"
		grep -E 'attention_fwd' "$R/bench-$b-$rep.log" | awk '{print $1, $3, $4, $5}' | while read -r l; do say "  $l"; done
	done
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for b in B F B F; do
	i=$((i + 1))
	timeout 150 .devbin/$b/rlbench "${W[@]}" --out "$R/3b-$b-$i.json" >"$R/3b-$b-$i.log" 2>&1
	say "3b $b run $i rc=$? $(tail -n 1 "$R/3b-$b-$i.log")"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
