#!/bin/bash
# Session 16, call 2: f2bf on the hardware's cvt.rn; qkv items without a division.
# .devbin: cuda.test, stages.test, rlbench (98cd7b7 with the working tree's
# f2bf/f2bf2 and qkv_cols kk/rem change, before rnd's cvt); cuda-base.test,
# rlbench-base (98cd7b7); q15b-2l.json (Qwen2.5-1.5B's config with 2 layers).
set -u
B=$PWD/.devbin
R=$OUT/r; mkdir -p $R
C=/tmp/rbc
W=(--seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --precision bf16 --recompute-auto --cache $C)
( cd gpu/cuda && timeout 420 $B/cuda.test -test.timeout 400s > $R/cuda-tests.log 2>&1; echo "cuda tests rc=$?" ) | tee -a $R/summary.txt
grep -E "^(--- FAIL|FAIL|ok|PASS)" $R/cuda-tests.log | head -20 | tee -a $R/summary.txt
( cd stages && timeout 200 $B/stages.test -test.run 'TestRunTinyCUDA$' -test.v > $R/stages-tests.log 2>&1; echo "stages TestRunTinyCUDA rc=$?" ) | tee -a $R/summary.txt
grep -E "^(--- |FAIL|ok|PASS)" $R/stages-tests.log | head -20 | tee -a $R/summary.txt
( cd gpu/cuda
for i in 1 2; do
timeout 100 $B/cuda-base.test -test.run '^$' -test.bench 'Ops/(qkv|rmsnorm|swiglu|add_|rope|addbias|adamw|cast|embedding)' -test.benchtime 20x > $R/ops-base-$i.log 2>&1
timeout 100 $B/cuda.test -test.run '^$' -test.bench 'Ops/(qkv|rmsnorm|swiglu|add_|rope|addbias|adamw|cast|embedding)' -test.benchtime 20x > $R/ops-new-$i.log 2>&1
done )
paste <(grep Benchmark $R/ops-base-2.log | awk '{print $1, $3, $5, $6}') <(grep Benchmark $R/ops-new-2.log | awk '{print $3, $5, $6}') | tee -a $R/summary.txt
timeout 200 ncu --clock-control none --kernel-name 'regex:^k_' --launch-count 400 --section SpeedOfLight --section LaunchStats \
  $B/rlbench --backend cuda --config $B/q15b-2l.json "${W[@]}" --warmup 0 --steps 1 --out $R/ncu-rlbench.json > $R/ncu-step.txt 2>&1
echo "ncu rc=$?" | tee -a $R/summary.txt
for m in qwen2.5-1.5b; do
  i=0
  for b in rlbench rlbench-base rlbench rlbench-base; do
    i=$((i+1))
    timeout 150 $B/$b --backend cuda --config examples/models/$m/config.json "${W[@]}" --out $R/$m-$b-$i.json > $R/$m-$b-$i.log 2>&1
    echo "$m $b $i rc=$? $(tail -1 $R/$m-$b-$i.log)" | tee -a $R/summary.txt
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
