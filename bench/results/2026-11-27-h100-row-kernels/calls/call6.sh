#!/bin/bash
# Session 16, call 6: the whole gpu/cuda suite and stages' one-GPU CUDA tests on 6deca79; cuBLASLt's candidates at Qwen2.5-3B's shapes.
# .devbin: cuda.test.gz, stages.test.gz (6deca79 plus BenchmarkGemmAlgos's RLPIPE_BENCH_GEMM_DIMS).
set -u
for f in .devbin/*.gz; do gunzip -f $f; done; chmod +x .devbin/*
B=$PWD/.devbin
R=$OUT/r; mkdir -p $R
( cd gpu/cuda && timeout 150 env RLPIPE_BENCH_GEMM_DIMS=2048,11008,256 $B/cuda.test -test.run '^$' -test.bench GemmAlgos -test.benchtime 10x > $R/gemm-algos-3b.txt 2>&1; echo "algos rc=$?" )
( cd gpu/cuda && timeout 300 $B/cuda.test -test.timeout 290s > $R/cuda-tests.log 2>&1; echo "cuda tests rc=$?"; grep -E "^(--- FAIL|FAIL|ok|PASS)" $R/cuda-tests.log | head )
( cd stages && timeout 120 $B/stages.test -test.run 'CUDA' -test.v > $R/stages-tests.log 2>&1; echo "stages CUDA tests rc=$?"; grep -E "^(--- |FAIL|ok|PASS)" $R/stages-tests.log | head -30 )
python3 - $R/gemm-algos-3b.txt <<'PY'
import re,sys
best={}
for l in open(sys.argv[1]):
    m=re.match(r'BenchmarkGemmAlgos/(.+)/pick(\d)-\d+\s+\d+\s+\d+ ns/op\s+([\d.]+) TFLOP/s',l)
    if m: best.setdefault(m.group(1),{})[int(m.group(2))]=float(m.group(3))
for k,v in best.items():
    b=max(v,key=v.get); print(f"{k}: pick0 {v.get(0,0):.0f}, best pick{b} {v[b]:.0f} TFLOP/s ({v[b]/max(v.get(0,1),1):.3f}x)")
PY
cd $OUT && tar czf r.tgz r && rm -rf r
