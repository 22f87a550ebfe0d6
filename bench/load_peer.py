"""Seconds transformers takes to load a checkpoint onto the GPU, the peer of
rlpipe's setup (load_hf + apply_fsdp2 of the actor and of its ref copy).

    python3 bench/load_peer.py CHECKPOINT_DIR [--out FILE]

Times, from a warm page cache (the checkpoint is read once first):
from_pretrained in bf16 onto the GPU (safetensors, device_map) for the
actor, an fp32 master copy of it (what FSDP2 training keeps), and a second
from_pretrained for the reference model, as a trainer that loads both does.
"""
import argparse, json, sys, time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--out")
    a = ap.parse_args()
    # Warm the page cache as rlpipe's runs see it.
    import glob, os
    for f in glob.glob(os.path.join(a.ckpt, "*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(1 << 26):
                pass
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    actor = AutoModelForCausalLM.from_pretrained(a.ckpt, torch_dtype=torch.bfloat16, device_map="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    master = [p.detach().float() for p in actor.parameters()]
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    ref = AutoModelForCausalLM.from_pretrained(a.ckpt, torch_dtype=torch.bfloat16, device_map="cuda")
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    res = {"actor_load_s": t1 - t0, "fp32_master_s": t2 - t1, "ref_load_s": t3 - t2, "total_s": t3 - t0,
           "params": sum(p.numel() for p in actor.parameters()), "torch": torch.__version__}
    del master, ref
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
