# One call: the resident 3B step's timeline (every op's span on the compute
# stream, no syncs), to see where ref_logprob and train spend their time.
set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/o/env.txt
timeout 200 .devbin/rlbench --backend cuda $W --warmup 1 --steps 2 --timeline $OUT/o/3b.trace.json --out $OUT/o/tl-3b.json > $OUT/o/run.log 2>&1; echo "rc=$? $(tail -1 $OUT/o/run.log) at ${SECONDS}s" | tee $OUT/o/summary.txt
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
