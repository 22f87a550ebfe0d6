"""Check that an rlpipe HF export loads in transformers and holds the trained policy.

Usage (on a machine with torch + transformers):
    python3 check_export.py EXPORT_DIR INITIAL_DIR ROLLOUTS.jsonl [--out result.json]

Loads both checkpoints with AutoModelForCausalLM.from_pretrained, computes every
sample's mean response log-prob (fp32, one sequence at a time) and the GRPO
reward-weighted objective adv_logp = sum_i A_i * mean_t logp / n (A_i: group-normalised
rewards, unbiased std + 1e-6), and prints both. The export must load, give finite
log-probs, and (for the tiny GRPO run) score a higher adv_logp than the initial model.
"""
import argparse
import json
import math
import sys

import torch
from transformers import AutoModelForCausalLM


def load_samples(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append((d["prompt_tokens"], d["response_tokens"], d["reward"], d["group"]))
    return out


def advantages(samples):
    groups = {}
    for i, s in enumerate(samples):
        groups.setdefault(s[3], []).append(i)
    adv = [0.0] * len(samples)
    for idx in groups.values():
        r = torch.tensor([samples[i][2] for i in idx], dtype=torch.float64)
        std = r.std(unbiased=True) if len(idx) > 1 else torch.tensor(0.0, dtype=torch.float64)
        for k, i in enumerate(idx):
            adv[i] = float((r[k] - r.mean()) / (std + 1e-6))
    return adv


@torch.no_grad()
def score(model_dir, samples, adv):
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    means, obj = [], 0.0
    for (p, r, _, _), a in zip(samples, adv):
        ids = torch.tensor([p + r])
        logits = model(ids).logits[0].double()
        lp = torch.log_softmax(logits[len(p) - 1 : len(p) + len(r) - 1], dim=-1)
        tok = torch.tensor(r)
        m = float(lp.gather(1, tok[:, None]).mean())
        if not math.isfinite(m):
            sys.exit(f"{model_dir}: non-finite log-prob")
        means.append(m)
        obj += a * m
    return {"adv_logp": obj / len(samples), "mean_logp": sum(means) / len(means)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export")
    ap.add_argument("initial")
    ap.add_argument("rollouts")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    samples = load_samples(a.rollouts)[: a.samples]
    adv = advantages(samples)
    res = {"export": score(a.export, samples, adv), "initial": score(a.initial, samples, adv)}
    res["improved"] = res["export"]["adv_logp"] > res["initial"]["adv_logp"]
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if not res["improved"]:
        sys.exit("the export does not score a higher adv_logp than the initial model")


if __name__ == "__main__":
    main()
