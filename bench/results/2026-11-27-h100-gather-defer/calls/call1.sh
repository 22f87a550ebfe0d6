#!/usr/bin/env bash
# Call 1: build A (gather-defer, 3597923) and B (A + o_proj GemmAdd, beaa412).
# TestGemmAdd on A (the gemmMats refactor); TestRunTinyCUDA on B with and
# without deferred gathers; the 3B step on A with RLPIPE_GATHER_AT unset,
# gate_up and down, and on B (gate_up), alternated; a timeline of A gate_up.
set -u
tar xzf .devbin/b.tgz -C .devbin
R=$OUT/r
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
(cd gpu/cuda && timeout 150 "$PWD/../../.devbin/A/cuda.test" -test.run 'TestGemmAdd' -test.v >"$R/cuda-tests.log" 2>&1)
say "A cuda tests rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/cuda-tests.log" | tr '\n' ' ')"
for at in "" gate_up; do
	(cd stages && RLPIPE_GATHER_AT=$at timeout 150 ../.devbin/B/stages.test -test.run 'TestRunTinyCUDA$' -test.v >"$R/stages-$at.log" 2>&1)
	say "B stages at=$at rc=$? $(grep -E '^(--- FAIL|FAIL|PASS|ok)' "$R/stages-$at.log" | tr '\n' ' ')"
done
W=(--backend cuda --config examples/models/qwen2.5-3b/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048
	--warmup 1 --steps 4 --precision bf16 --recompute-auto --cache /tmp/rbc)
i=0
for v in A- A-gate_up A-down B-gate_up A- A-gate_up A-down B-gate_up; do
	i=$((i + 1))
	bin=${v%%-*} at=${v#*-}
	RLPIPE_GATHER_AT=$at timeout 150 .devbin/$bin/rlbench "${W[@]}" --out "$R/3b-$v-$i.json" >"$R/3b-$v-$i.log" 2>&1
	say "3b $v run $i rc=$? $(tail -n 1 "$R/3b-$v-$i.log")"
done
RLPIPE_GATHER_AT=gate_up timeout 150 .devbin/A/rlbench "${W[@]}" --steps 2 --timeline "$R/3b.trace.json" --out "$R/tl-3b.json" >"$R/tl.log" 2>&1
say "timeline rc=$? $(tail -n 1 "$R/tl.log")"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
