set -u
gunzip -f .devbin/*.gz; chmod +x .devbin/*
mkdir -p $OUT/o
M=qwen2.5-3b
W="--config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --precision bf16 --recompute-auto --cache /tmp/rbc -q"
left() { echo $((540 - SECONDS)); }
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/o/env.txt
echo "warm $(timeout 200 .devbin/rlbench --backend cuda $W --warmup 0 --steps 1 --offload --out $OUT/o/warm.json 2>&1 | tail -1) at ${SECONDS}s" | tee -a $OUT/o/summary.txt
for r in 1 2; do
for v in new down base; do
  (( $(left) < 60 )) && break 2
  bin=.devbin/rlbench; [ $v = base ] && bin=.devbin/rlbench-base
  e=RLPIPE_HOST_NORMS=1; [ $v = down ] && e=RLPIPE_HOST_NORMS=0
  echo "$v-$r $(env $e timeout 100 $bin --backend cuda $W --warmup 1 --steps 4 --offload --out $OUT/o/off-$v-$r.json 2>&1 | tail -1) at ${SECONDS}s" | tee -a $OUT/o/summary.txt
done; done
if (( $(left) > 60 )); then
 env RLPIPE_HOST_NORMS=1 timeout 90 .devbin/rlbench --backend cuda $W --warmup 1 --steps 2 --offload --timeline $OUT/o/new.trace.json --out $OUT/o/tl-new.json 2>&1 | tail -1 | tee -a $OUT/o/summary.txt
fi
if (( $(left) > 130 )); then
 export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
 timeout $(( $(left) - 10 )) python3 bench/peer_fsdp2.py --config examples/models/$M/config.json --seqs 8 --tokens-per-seq 2048 --prompt-tokens 64 --chunk 2048 --warmup 1 --steps 3 --offload --out $OUT/o/peer-ac.json > $OUT/o/peer.log 2>&1; echo "peer rc=$? $(tail -1 $OUT/o/peer.log)" | tee -a $OUT/o/summary.txt
fi
tar czf $OUT/o.tgz -C $OUT o && rm -rf $OUT/o
