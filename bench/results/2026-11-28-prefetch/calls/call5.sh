#!/usr/bin/env bash
# Call 5 (one H200). Builds: new is main at bc27014 with the row
# statistics kept from LogProbs for LogitsBackward (the change committed
# after this call); e is rlbench at bc27014, s rlbench at ff8996d (this
# work's start).
# 1. new's tests of the log-prob head (TestLogitsBackwardStats among them);
#    if they fail, nothing else;
# 2. BenchmarkLogProbsHead's step rows at the 3B and 1.5B shapes, twice
#    (LogitsBackward with the statistics and without, in one binary);
# 3. rlbench 3B and 1.5B, new and e alternated twice;
# 4. the stages package's CUDA tests on new;
# 5. best against best at 3B and 1.5B against the compiled peer, new as
#    rlpipe and s as FAIR_BASE (bench/fair_device.sh, as call 10 of
#    2026-11-28-epilogue).
set -u
tar xzf .devbin/b.tgz -C .devbin
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
{
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$OUT/env.txt" 2>&1
mkdir -p "$OUT/t" "$OUT/ops" "$OUT/rb"
(cd gpu/cuda && timeout 200 ../../.devbin/new/cuda.test -test.run 'TestLogitsBackwardStats|TestLogProbs|TestKernelNames|TestElementwise' -test.v) >"$OUT/t/lp.log" 2>&1
rc=$?
say "tests (new): rc=$rc at ${SECONDS}s"
grep -E '^(--- |FAIL|ok|PASS)|not the same|did not change|changed with' "$OUT/t/lp.log" | head -40 | tee -a "$OUT/summary.txt"
if ((rc != 0)); then
	(cd "$OUT" && tar czf r.tgz t; rm -rf t ops rb)
	exit 1
fi
for r in 1 2; do
	for shp in 2048,2048,151936 2048,1536,151936; do
		f="$OUT/ops/lp$r-${shp//,/x}.txt"
		(cd gpu/cuda && RLPIPE_BENCH_LP=$shp timeout 90 ../../.devbin/new/cuda.test -test.run '^$' -test.bench 'LogProbsHead/step:' -test.benchtime 20x) >"$f" 2>&1
		say "lp $shp: rc=$? at ${SECONDS}s"
		grep -E '^Benchmark' "$f" | tee -a "$OUT/summary.txt"
	done
done
run() { # build model round [extra...]
	local b=$1 m=$2 r=$3
	shift 3
	timeout 120 .devbin/$b/rlbench --backend cuda --config examples/models/$m/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc --warmup 1 --steps 3 --out "$OUT/rb/$m-$b-$r.json" "$@" >"$OUT/rb/$m-$b-$r.log" 2>&1
	say "$m $b round $r: rc=$? $(tail -1 "$OUT/rb/$m-$b-$r.log") at ${SECONDS}s"
}
run new qwen2.5-3b 1 --timeline "$OUT/rb/3b-new.trace.json"
run e qwen2.5-3b 1 --timeline "$OUT/rb/3b-e.trace.json"
run new qwen2.5-3b 2
run e qwen2.5-3b 2
run new qwen2.5-1.5b 1
run e qwen2.5-1.5b 1
run new qwen2.5-1.5b 2
run e qwen2.5-1.5b 2
(cd stages && timeout 120 ../.devbin/new/stages.test -test.run 'CUDA' -test.v) >"$OUT/t/stages-cuda.log" 2>&1
say "stages CUDA tests (new): rc=$? at ${SECONDS}s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/t/stages-cuda.log" | tee -a "$OUT/summary.txt"
cp .devbin/new/rlbench .devbin/rlbench
OUT=$OUT/f3 FAIR_MODELS=qwen2.5-3b FAIR_RUNS="auto peer-ac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=220 bash bench/fair_device.sh >"$OUT/fair3.log" 2>&1
grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair3.log" | tee -a "$OUT/summary.txt"
say "at ${SECONDS}s"
if ((SECONDS < 430)); then
	OUT=$OUT/f15 FAIR_MODELS=qwen2.5-1.5b FAIR_RUNS="auto peer-noac-compile" FAIR_BASE=.devbin/s/rlbench FAIR_BUDGET_S=$((570 - SECONDS)) bash bench/fair_device.sh >"$OUT/fair15.log" 2>&1
	grep -E 'rc=|best against best|base auto|\| shared' "$OUT/fair15.log" | tee -a "$OUT/summary.txt"
fi
say "at ${SECONDS}s"
rm -rf "$OUT"/f3/work-* "$OUT"/f15/work-*
(cd "$OUT" && tar czf r.tgz t ops rb f3 f15 fair3.log fair15.log 2>/dev/null; rm -rf t ops rb f3 f15 fair3.log fair15.log)
