#!/usr/bin/env python3
"""Reference values (goldens) for rlpipe's model math and GRPO train step.

For each case (llama, qwen2, qwen3, mistral, llama_bias) this builds a tiny
random Hugging Face model, saves it as an HF checkpoint, computes per-token
log-probs and entropies of three fixed samples, and runs ONE GRPO training
step with the slime loss (see shared/RL-MATH.md), recording everything the
Go side needs to reproduce it.

    python3 model/testdata/gen/gen_goldens.py --out DIR [--families a,b]

writes DIR/<family>/{model/, golden.json, grads.safetensors,
after_step.safetensors} for every case, or only for those --families names.
A "family" here is a case key: llama_bias is an HF Llama model (model_type
llama) with attention_bias true.  See README.md beside this file.

Everything runs on CPU and is seeded; the actor is float32.  Besides the HF
forward, the script carries its own float64 implementation of the decoder
(`ref_forward`): it documents the exact math the Go code must implement and is
cross-checked against HF (the result is recorded in golden.json).

`--dev` runs the whole pipeline without transformers/safetensors, with
`ref_forward` standing in for the HF model (for testing this script on a
machine without transformers; its output is NOT a golden).
"""

import argparse
import copy
import json
import math
import os
import platform
import struct
import sys
import traceback

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# Fixed settings
# ---------------------------------------------------------------------------

# Case keys.  The index of a key feeds its seeds, so new cases are appended:
# the committed goldens of the earlier ones stay reproducible.
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "llama_bias"]

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=256,
    initializer_range=0.1,
)

# Per-case variations (all fields used by ref_forward too).  model_type
# names the HF model class where it differs from the case key; output_bias
# (o_proj bias) is False where absent.
VARIANTS = {
    "llama": dict(
        tie_word_embeddings=False,
        attention_bias=False,
        qk_norm=False,
        head_dim=16,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2": dict(
        tie_word_embeddings=True,
        attention_bias=True,  # Qwen2 always has q/k/v bias (o_proj none)
        qk_norm=False,
        head_dim=16,
        rope_scaling=None,
    ),
    "qwen3": dict(
        tie_word_embeddings=False,
        attention_bias=False,
        qk_norm=True,  # RMSNorm over head_dim on q and k, before RoPE
        head_dim=32,  # != hidden_size / num_attention_heads (16)
        rope_scaling=None,
    ),
    "mistral": dict(
        tie_word_embeddings=False,
        attention_bias=False,
        qk_norm=False,
        head_dim=16,
        rope_scaling=None,
        sliding_window=None,
    ),
    # Llama with attention_bias: transformers' LlamaAttention then builds
    # q_proj, k_proj, v_proj AND o_proj with a bias.
    "llama_bias": dict(
        model_type="llama",
        tie_word_embeddings=False,
        attention_bias=True,
        output_bias=True,
        qk_norm=False,
        head_dim=16,
        rope_scaling=None,
    ),
}

# The case index feeds the seeds, so each case gets different weights.
SEED_BASE = 1234

# (prompt_length, response_length) of the three samples: one GRPO group.
SAMPLE_SHAPES = [(5, 7), (3, 9), (6, 4)]
REWARDS = [1.0, 0.0, 0.5]
# sample 0, response token 3 is forced to token id 0 (not padding!)
ZERO_TOKEN = (0, 3)
# sample 1, response token 2 is masked out of the loss
MASKED = (1, 2)
DATA_SEED = 20240601

TEMPERATURES = [1.0, 0.7]

LOSS_CONFIG = {
    "advantage_estimator": "grpo",
    "grpo_std_normalization": True,
    "advantage_eps": 1e-6,
    "eps_clip": 0.2,
    "eps_clip_high": 0.28,
    "dual_clip_c": 3.0,
    "kl": "low_var_kl",
    "kl_clamp": [-10.0, 10.0],
    "kl_coef": 0.1,
    "entropy_coef": 0.01,
    "aggregation": "sample_mean",
    "global_batch_size": 3,
    "dp_size": 1,
    "train_temperature": 1.0,
}
OPTIMIZER = {
    "type": "adamw",
    "lr": 1e-3,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "grad_clip_eps": 1e-6,
}

NOISE_SEED = 777
OLD_NOISE = 0.3
REF_NOISE = 0.1
# Deterministic overrides (flat response-token index -> offset from the
# actor's fp32 log-prob) so that every loss branch is exercised whatever the
# random noise does.  See golden.json "noise_overrides".
#   flat 1  = sample 0 token 1, A>0, ratio e^0.6 ~ 1.82 > 1.28: clipped high
#   flat 7  = sample 1 token 0, A<0, ratio e^1.5 ~ 4.48 > c=3: dual clip
#   flat 8  = sample 1 token 1, A<0, ratio e^-0.6 ~ 0.55 < 0.8: clipped low
#   flat 16 = sample 2 token 0, x = l - l_ref = -3: k3 = e^3-4 > 10, clamped
OLD_OVERRIDES = {1: -0.6, 7: -1.5, 8: 0.6}
REF_OVERRIDES = {16: 3.0}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def flist(t):
    """Tensor -> list of python floats (exact: float32 values widen exactly)."""
    return [float(v) for v in t.detach().to(torch.float64).reshape(-1).tolist()]


def spec_of(family):
    s = dict(COMMON)
    s.update(copy.deepcopy(VARIANTS[family]))
    s["family"] = family
    return s


def make_samples():
    g = torch.Generator().manual_seed(DATA_SEED)
    samples = []
    for i, (P, R) in enumerate(SAMPLE_SHAPES):
        toks = torch.randint(0, 256, (P + R,), generator=g)
        if i == ZERO_TOKEN[0]:
            toks[P + ZERO_TOKEN[1]] = 0
        mask = [1] * R
        if i == MASKED[0]:
            mask[MASKED[1]] = 0
        samples.append(
            {
                "tokens": [int(t) for t in toks.tolist()],
                "prompt_length": P,
                "response_length": R,
                "reward": REWARDS[i],
                "group": 0,
                "loss_mask": mask,
            }
        )
    return samples


def response_slice(logits, sample, temperature, dtype):
    """log-probs of the response tokens and entropies at the same positions.

    Response token t (0-based) sits at pos = P + t and is predicted by the
    logits at pos - 1.  Entropy uses the untempered logits.
    """
    P, R = sample["prompt_length"], sample["response_length"]
    z = logits[P - 1 : P + R - 1].to(dtype)
    y = torch.tensor(sample["tokens"][P : P + R], dtype=torch.long)
    lp = F.log_softmax(z / temperature, dim=-1)
    logp = lp.gather(-1, y[:, None])[:, 0]
    lp1 = F.log_softmax(z, dim=-1)
    ent = -(lp1.exp() * lp1).sum(-1)
    return logp, ent


# ---------------------------------------------------------------------------
# Independent reference decoder (float64 capable).  Mirrors HF's Llama /
# Qwen2 / Qwen3 / Mistral math, parameters keyed by HF names.
# ---------------------------------------------------------------------------


def rope_inv_freq(spec, dtype=torch.float64):
    hd = spec["head_dim"]
    base = spec["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    sc = spec.get("rope_scaling")
    if sc and sc.get("rope_type") == "llama3":
        factor = sc["factor"]
        lo, hi = sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wl >= hi_wl) & (wl <= lo_wl)
        out = torch.where(medium, smoothed, out)
        inv = out
    elif sc:
        raise ValueError("unsupported rope scaling %r" % (sc,))
    return inv.to(dtype)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def ref_forward(p, spec, ids):
    """ids: LongTensor [L] -> logits [L, V] (dtype of the parameters)."""
    L = ids.shape[0]
    nh, nkv, hd = spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]
    eps = spec["rms_norm_eps"]
    emb = p["model.embed_tokens.weight"]
    dt = emb.dtype
    x = emb[ids]
    inv = rope_inv_freq(spec, torch.float64)
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().to(dt)[:, None, :], ang.sin().to(dt)[:, None, :]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for i in range(spec["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = rms(x, p[pre + "input_layernorm.weight"], eps)

        def lin(name, inp, bias=False):
            """y = inp W^T (+ b); bias says whether the spec has b."""
            w = p[pre + name + ".weight"]
            b = p.get(pre + name + ".bias")
            if (b is not None) != bias:
                raise ValueError("%s%s: bias present %s, spec says %s" % (pre, name, b is not None, bias))
            return F.linear(inp, w, b)

        # q/k/v biases: attention_bias.  o_proj bias: output_bias (Llama and
        # Qwen3 with attention_bias; never Qwen2 or Mistral).  MLP: none.
        qkv_bias, o_bias = spec["attention_bias"], spec.get("output_bias", False)
        q = lin("self_attn.q_proj", h, qkv_bias).view(L, nh, hd)
        k = lin("self_attn.k_proj", h, qkv_bias).view(L, nkv, hd)
        v = lin("self_attn.v_proj", h, qkv_bias).view(L, nkv, hd)
        if spec["qk_norm"]:
            q = rms(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms(k, p[pre + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)  # q head j uses kv head j // rep
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * (hd ** -0.5)
        s = s.masked_fill(~causal[None], float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("hqk,khd->qhd", a, v).reshape(L, nh * hd)
        x = x + lin("self_attn.o_proj", o, o_bias)
        h = rms(x, p[pre + "post_attention_layernorm.weight"], eps)
        m = F.silu(lin("mlp.gate_proj", h)) * lin("mlp.up_proj", h)
        x = x + lin("mlp.down_proj", m)
    x = rms(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if spec["tie_word_embeddings"] else p["lm_head.weight"]
    return x @ head.t()


def dev_params(spec, gen):
    """Random parameters with HF names (used only by --dev)."""
    H, I, V = spec["hidden_size"], spec["intermediate_size"], spec["vocab_size"]
    nh, nkv, hd = spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]
    r = spec["initializer_range"]
    p = {}

    def n(*shape):
        return torch.randn(*shape, generator=gen) * r

    p["model.embed_tokens.weight"] = n(V, H)
    for i in range(spec["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        p[pre + "self_attn.q_proj.weight"] = n(nh * hd, H)
        p[pre + "self_attn.k_proj.weight"] = n(nkv * hd, H)
        p[pre + "self_attn.v_proj.weight"] = n(nkv * hd, H)
        p[pre + "self_attn.o_proj.weight"] = n(H, nh * hd)
        if spec["attention_bias"]:
            for x, d in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                p[pre + "self_attn.%s_proj.bias" % x] = torch.zeros(d)
        if spec.get("output_bias", False):
            p[pre + "self_attn.o_proj.bias"] = torch.zeros(H)
        if spec["qk_norm"]:
            p[pre + "self_attn.q_norm.weight"] = torch.ones(hd)
            p[pre + "self_attn.k_norm.weight"] = torch.ones(hd)
        p[pre + "mlp.gate_proj.weight"] = n(I, H)
        p[pre + "mlp.up_proj.weight"] = n(I, H)
        p[pre + "mlp.down_proj.weight"] = n(H, I)
        p[pre + "input_layernorm.weight"] = torch.ones(H)
        p[pre + "post_attention_layernorm.weight"] = torch.ones(H)
    p["model.norm.weight"] = torch.ones(H)
    if not spec["tie_word_embeddings"]:
        p["lm_head.weight"] = n(V, H)
    return p


# ---------------------------------------------------------------------------
# HF model construction
# ---------------------------------------------------------------------------


def hf_config(spec, transformers):
    major = int(transformers.__version__.split(".")[0])
    fam = spec.get("model_type", spec["family"])
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
    }[fam]
    kw = dict(
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        vocab_size=spec["vocab_size"],
        rms_norm_eps=spec["rms_norm_eps"],
        max_position_embeddings=spec["max_position_embeddings"],
        initializer_range=spec["initializer_range"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        hidden_act="silu",
    )
    if major >= 5:
        rp = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
        if spec["rope_scaling"]:
            rp = dict(spec["rope_scaling"])
            rp["rope_theta"] = spec["rope_theta"]
        kw["rope_parameters"] = rp
        kw["dtype"] = "float32"
    else:
        kw["rope_theta"] = spec["rope_theta"]
        kw["rope_scaling"] = copy.deepcopy(spec["rope_scaling"])
        kw["torch_dtype"] = "float32"
    if fam in ("llama", "qwen3"):
        # One key drives the q/k/v and the o_proj biases in these families.
        if spec.get("output_bias", False) != spec["attention_bias"]:
            raise ValueError("%s: output_bias must equal attention_bias" % spec["family"])
    elif spec.get("output_bias", False) or spec["attention_bias"] != (fam == "qwen2"):
        raise ValueError("%s: %s biases are fixed (q/k/v %s, o_proj none)" % (spec["family"], fam, fam == "qwen2"))
    if fam == "llama":
        kw["attention_bias"] = spec["attention_bias"]
        kw["mlp_bias"] = False
    elif fam == "qwen2":
        kw["use_sliding_window"] = False
    elif fam == "qwen3":
        kw["head_dim"] = spec["head_dim"]
        kw["attention_bias"] = spec["attention_bias"]
        kw["use_sliding_window"] = False
    elif fam == "mistral":
        kw["sliding_window"] = None
    return cls(**kw)


def build_hf_model(spec, transformers, seed):
    cfg = hf_config(spec, transformers)
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    except TypeError:
        cfg._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model = model.to(torch.float32)
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise RuntimeError("attention implementation is %r, want eager" % impl)
    # Norm weights 1 + 0.1*randn, biases 0.1*randn, so that they matter.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith(".bias"):
                prm.copy_(0.1 * torch.randn(prm.shape, generator=g))
            elif prm.ndim == 1:
                assert "norm" in name, name
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=g))
    if spec["tie_word_embeddings"]:
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise RuntimeError("qwen2: lm_head is not tied to embed_tokens")
    else:
        if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
            raise RuntimeError("%s: lm_head unexpectedly tied" % spec["family"])
    # Shape sanity against the spec (catches e.g. an ignored head_dim).
    a = model.model.layers[0].self_attn
    hd, nh, nkv = spec["head_dim"], spec["num_attention_heads"], spec["num_key_value_heads"]
    assert tuple(a.q_proj.weight.shape) == (nh * hd, spec["hidden_size"]), a.q_proj.weight.shape
    assert tuple(a.k_proj.weight.shape) == (nkv * hd, spec["hidden_size"]), a.k_proj.weight.shape
    assert (a.q_proj.bias is not None) == spec["attention_bias"]
    assert (a.o_proj.bias is not None) == spec.get("output_bias", False), a.o_proj
    assert model.model.layers[0].mlp.down_proj.bias is None
    assert hasattr(a, "q_norm") == spec["qk_norm"]
    return model


# ---------------------------------------------------------------------------
# safetensors (library on the device machine; tiny fallback writer for --dev)
# ---------------------------------------------------------------------------


def save_safetensors(tensors, path):
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in tensors.items()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        header, off, blobs = {}, 0, []
        for k in sorted(tensors):
            b = tensors[k].numpy().tobytes()
            header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        return
    save_file(tensors, path, metadata={"format": "pt"})


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in sorted(h.items())}


# ---------------------------------------------------------------------------
# Loss (slime semantics; see shared/RL-MATH.md)
# ---------------------------------------------------------------------------


def grpo_advantages(rewards):
    r = torch.tensor(rewards, dtype=torch.float32)
    r = r - r.mean()
    std = torch.sqrt((r * r).sum() / (r.shape[0] - 1))  # unbiased (n - 1)
    return r / (std + LOSS_CONFIG["advantage_eps"])


def policy_loss(logp, old, adv):
    c = LOSS_CONFIG
    ratio = torch.exp(logp - old)
    pg1 = -ratio * adv
    pg2 = -ratio.clamp(1 - c["eps_clip"], 1 + c["eps_clip_high"]) * adv
    clip1 = torch.maximum(pg1, pg2)
    clipfrac = torch.gt(pg2, pg1).float()
    pg3 = -c["dual_clip_c"] * adv
    clip2 = torch.minimum(pg3, clip1)
    pg = torch.where(adv < 0, clip2, clip1)
    branch = []
    for k in range(len(pg)):
        if adv[k] < 0 and pg3[k] < clip1[k]:
            branch.append("dual_clip")
        elif clipfrac[k] > 0:
            branch.append("clipped")
        else:
            branch.append("unclipped")
    return pg, clipfrac, ratio, branch


def low_var_kl(logp, ref):
    x = logp - ref
    lo, hi = LOSS_CONFIG["kl_clamp"]
    return (torch.exp(-x) - 1 + x).clamp(min=lo, max=hi)


def sample_mean(x, masks):
    """SM(x) = sum_i sum_t m x / max(sum_t m, 1), masks: list of float tensors."""
    tot, off = 0.0, 0
    for m in masks:
        R = m.shape[0]
        tot = tot + (x[off : off + R] * m).sum() / m.sum().clamp(min=1)
        off += R
    return tot


# ---------------------------------------------------------------------------
# Main per-family work
# ---------------------------------------------------------------------------


def run_family(family, fi, out_dir, dev):
    spec = spec_of(family)
    seed = SEED_BASE + 100 * fi
    fdir = os.path.join(out_dir, family)
    os.makedirs(fdir, exist_ok=True)
    notes = []
    golden = {"family": family, "torch_version": torch.__version__}

    if dev:
        golden["transformers_version"] = "none (--dev: NOT A GOLDEN)"
        gen = torch.Generator().manual_seed(seed)
        params = {k: v.clone().requires_grad_(True) for k, v in dev_params(spec, gen).items()}
        named = list(params.items())

        def forward(ids):
            return ref_forward(params, spec, ids)

        ckpt = os.path.join(fdir, "model")
        os.makedirs(ckpt, exist_ok=True)
        save_safetensors({k: v for k, v in named}, os.path.join(ckpt, "model.safetensors"))
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump(spec, f, indent=2)
        model = None
    else:
        import transformers

        golden["transformers_version"] = transformers.__version__
        model = build_hf_model(spec, transformers, seed)
        named = list(model.named_parameters())  # tied weights appear once

        def forward(ids):
            return model(input_ids=ids[None], use_cache=False).logits[0]

        ckpt = os.path.join(fdir, "model")
        try:
            model.save_pretrained(ckpt, safe_serialization=True)
        except Exception as e:  # newer transformers: safetensors is the only format
            print("  %s: save_pretrained(safe_serialization=True) failed (%r); retrying without" % (family, e))
            model.save_pretrained(ckpt)

    golden["python_version"] = platform.python_version()
    golden["generator"] = "model/testdata/gen/gen_goldens.py"
    golden["model_spec"] = spec
    golden["seeds"] = {"init": seed, "norm_and_bias": seed + 1, "data": DATA_SEED, "noise": NOISE_SEED + fi}
    st = os.path.join(ckpt, "model.safetensors")
    golden["checkpoint_tensors"] = read_safetensors_header(st) if os.path.exists(st) else None
    golden["parameter_names"] = [n for n, _ in named]
    if spec["tie_word_embeddings"]:
        notes.append(
            "tie_word_embeddings: lm_head.weight is model.embed_tokens.weight; the checkpoint, "
            "grads.safetensors, after_step.safetensors and grad_norms hold it once, as "
            "model.embed_tokens.weight; its gradient is the sum of the embedding and LM-head uses"
        )

    samples = make_samples()
    golden["samples"] = samples
    ids_list = [torch.tensor(s["tokens"], dtype=torch.long) for s in samples]
    masks = [torch.tensor(s["loss_mask"], dtype=torch.float32) for s in samples]

    # ---- recorded log-probs / entropies: HF fp32 logits, softmax in fp64 ----
    tc = {}
    with torch.no_grad():
        logits32 = [forward(ids).to(torch.float32) for ids in ids_list]
    for T in TEMPERATURES:
        lps, ents = [], []
        for s, z in zip(samples, logits32):
            lp, en = response_slice(z, s, T, torch.float64)
            lps.append(lp)
            ents.append(en)
        case = {"logp": flist(torch.cat(lps))}
        if T == 1.0:
            case["entropy"] = flist(torch.cat(ents))
        tc[repr(T)] = case
    golden["temperature_cases"] = tc

    # ---- independent float64 reference decoder, cross-checked -------------
    try:
        p64 = {n: v.detach().to(torch.float64) for n, v in named}
        if spec["tie_word_embeddings"] and "lm_head.weight" not in p64:
            pass  # ref_forward uses embed_tokens for the head when tied
        rc = {}
        worst = 0.0
        with torch.no_grad():
            logits64 = [ref_forward(p64, spec, ids) for ids in ids_list]
        for T in TEMPERATURES:
            lps, ents = [], []
            for s, z in zip(samples, logits64):
                lp, en = response_slice(z, s, T, torch.float64)
                lps.append(lp)
                ents.append(en)
            case = {"logp": flist(torch.cat(lps))}
            worst = max(worst, max(abs(a - b) for a, b in zip(case["logp"], tc[repr(T)]["logp"])))
            if T == 1.0:
                case["entropy"] = flist(torch.cat(ents))
                worst = max(worst, max(abs(a - b) for a, b in zip(case["entropy"], tc["1.0"]["entropy"])))
            rc[repr(T)] = case
        lg = max(float((a.to(torch.float64) - b).abs().max()) for a, b in zip(logits32, logits64))
        golden["reference_fp64"] = {
            "agrees_with_hf": bool(worst < 1e-4),
            "max_abs_diff_vs_hf_logp_entropy": worst,
            "max_abs_diff_vs_hf_logits": lg,
            "temperature_cases": rc,
        }
        print("  %s: fp64 reference vs HF fp32: logp/entropy max diff %.3g, logits %.3g" % (family, worst, lg))
    except Exception as e:  # recorded, not fatal
        golden["reference_fp64"] = {"error": repr(e)}
        print("  %s: fp64 reference failed: %r" % (family, e))

    # ---- reload check of the saved checkpoint -------------------------------
    if not dev:
        try:
            import transformers

            m2 = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager")
            m2 = m2.to(torch.float32).eval()
            with torch.no_grad():
                d = max(
                    float((m2(input_ids=ids[None], use_cache=False).logits[0] - z).abs().max())
                    for ids, z in zip(ids_list, logits32)
                )
            golden["reload_max_abs_diff_logits"] = d
            print("  %s: reload max |dlogits| %.3g" % (family, d))
            del m2
        except Exception as e:
            golden["reload_max_abs_diff_logits"] = {"error": repr(e)}
            print("  %s: reload check failed: %r" % (family, e))

    # ---- the training forward (fp32, with grad) ------------------------------
    if model is not None:
        model.train()
    lps, ents = [], []
    for s, ids in zip(samples, ids_list):
        z = forward(ids).to(torch.float32)
        lp, en = response_slice(z, s, LOSS_CONFIG["train_temperature"], torch.float32)
        lps.append(lp)
        ents.append(en)
    logp = torch.cat(lps)
    ent = torch.cat(ents)
    N = logp.shape[0]

    # ---- old / ref log-probs: fp32 logp + seeded noise (+ overrides) ---------
    g = torch.Generator().manual_seed(NOISE_SEED + fi)
    n_old = torch.randn(N, generator=g, dtype=torch.float64)
    n_ref = torch.randn(N, generator=g, dtype=torch.float64)
    base = logp.detach().to(torch.float64)
    old = base + OLD_NOISE * n_old
    ref = base + REF_NOISE * n_ref
    for k, dlt in OLD_OVERRIDES.items():
        old[k] = base[k] + dlt
    for k, dlt in REF_OVERRIDES.items():
        ref[k] = base[k] + dlt
    old = old.to(torch.float32)
    ref = ref.to(torch.float32)

    adv_s = grpo_advantages(REWARDS)
    adv = torch.cat([adv_s[i].expand(s["response_length"]) for i, s in enumerate(samples)])

    # Keep every ratio at least 0.1% away from a clip boundary, so that the
    # branch taken cannot depend on last-bit differences between backends.
    nudges = []
    bounds = [1 - LOSS_CONFIG["eps_clip"], 1 + LOSS_CONFIG["eps_clip_high"], LOSS_CONFIG["dual_clip_c"]]
    for k in range(N):
        for _ in range(10):
            rho = math.exp(float(logp[k].detach()) - float(old[k]))
            if all(abs(rho / b - 1) > 1e-3 for b in bounds):
                break
            old[k] = old[k] + 0.01
            nudges.append(k)
    golden["noise_overrides"] = {
        "description": "old_logp = logp + %g*N(0,1) and ref_logp = logp + %g*N(0,1) (torch.Generator seed %d, "
        "old noise drawn first), logp = the fp32 training forward (per_token.logp), rounded to float32; "
        "then old_logp[k] = logp[k] + old[k] and ref_logp[k] = logp[k] + ref[k] for these flat indices; "
        "nudged indices got +0.01 to keep ratios off clip boundaries"
        % (OLD_NOISE, REF_NOISE, NOISE_SEED + fi),
        "old": {str(k): v for k, v in OLD_OVERRIDES.items()},
        "ref": {str(k): v for k, v in REF_OVERRIDES.items()},
        "nudged": nudges,
    }
    golden["old_logp"] = flist(old)
    golden["ref_logp"] = flist(ref)
    golden["advantages"] = flist(adv_s)
    golden["token_advantages"] = flist(adv)

    # ---- loss ---------------------------------------------------------------
    pg, clipfrac, ratio, branch = policy_loss(logp, old, adv)
    kl = low_var_kl(logp, ref)
    pg_sm = sample_mean(pg, masks)
    ent_sm = sample_mean(ent, masks)
    kl_sm = sample_mean(kl, masks)
    cf_sm = sample_mean(clipfrac, masks)
    loss = pg_sm - LOSS_CONFIG["entropy_coef"] * ent_sm + LOSS_CONFIG["kl_coef"] * kl_sm
    gbs = LOSS_CONFIG["global_batch_size"]
    (loss * (LOSS_CONFIG["dp_size"] / gbs)).backward()

    golden["loss_config"] = LOSS_CONFIG
    golden["loss"] = float(loss)
    golden["metrics_sum"] = {
        "loss": float(loss),
        "pg_loss": float(pg_sm),
        "kl": float(kl_sm),
        "entropy": float(ent_sm),
        "clipfrac": float(cf_sm),
    }
    golden["metrics"] = {k: v / gbs for k, v in golden["metrics_sum"].items()}
    golden["per_token"] = {
        "logp": flist(logp),
        "entropy": flist(ent),
        "ratio": flist(ratio),
        "pg": flist(pg),
        "clipfrac": flist(clipfrac),
        "kl": flist(kl),
        "branch": branch,
        "loss_mask": [m for s in samples for m in s["loss_mask"]],
    }

    # ---- gradients, clipping, AdamW -----------------------------------------
    plist = [p for _, p in named]
    grads = {}
    gn = {}
    sq = 0.0
    for n, p in named:
        gr = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[n] = gr.detach().clone()
        v = float(gr.detach().to(torch.float64).norm())
        gn[n] = v
        sq += v * v
    save_safetensors(grads, os.path.join(fdir, "grads.safetensors"))
    golden["grads_file"] = "grads.safetensors (pre-clip gradients of loss*dp/GBS, HF names)"
    golden["grad_norms"] = gn
    golden["total_grad_norm"] = math.sqrt(sq)
    tn = torch.nn.utils.clip_grad_norm_(plist, OPTIMIZER["grad_clip"])
    golden["total_grad_norm_torch_fp32"] = float(tn)
    golden["grad_clip_coef"] = min(1.0, OPTIMIZER["grad_clip"] / (float(tn) + OPTIMIZER["grad_clip_eps"]))
    opt = torch.optim.AdamW(
        plist,
        lr=OPTIMIZER["lr"],
        betas=tuple(OPTIMIZER["betas"]),
        eps=OPTIMIZER["eps"],
        weight_decay=OPTIMIZER["weight_decay"],
        foreach=False,
    )
    opt.step()
    golden["optimizer"] = OPTIMIZER
    save_safetensors({n: p for n, p in named}, os.path.join(fdir, "after_step.safetensors"))
    golden["after_step_file"] = "after_step.safetensors (all parameters after the step, HF names)"

    with torch.no_grad():
        if model is not None:
            model.eval()
        lps = []
        for s, ids in zip(samples, ids_list):
            lp, _ = response_slice(forward(ids).to(torch.float32), s, 1.0, torch.float64)
            lps.append(lp)
    golden["after_step"] = {"logp": flist(torch.cat(lps))}

    notes += [
        "Each sample is run on its own (positions 0..L-1, causal, no padding): the same as varlen packing.",
        "temperature_cases: HF float32 forward (eager attention), log_softmax/entropy of those logits in float64.",
        "per_token.*: the training forward, all float32 (this is what the loss and gradients used).",
        "reference_fp64: this script's own float64 decoder (ref_forward), same weights.",
        "advantages are per sample (group 0); token_advantages repeat them over each response.",
        "Loss per slime: pg = max(-rA, -clip(r,1-eps,1+eps_high)A); where A<0 pg = min(-cA, pg); "
        "clipfrac = [-clip(r)A > -rA]; kl = clamp(exp(-x)-1+x, -10, 10), x = logp - ref_logp; "
        "SM(x) = sum_i sum_t m x / max(sum_t m, 1); loss = SM(pg) - entropy_coef SM(H) + kl_coef SM(kl); "
        "backward on loss * dp / GBS.  metrics = metrics_sum / GBS.",
        "torch.maximum/minimum split the gradient 50/50 on ties (pg1 == pg2 when the ratio is inside the clip "
        "range): the total is the same as taking either branch.",
        "Grad clip: coef = min(1, max_norm / (total_norm + 1e-6)), total_norm over all parameters.",
        "AdamW (torch, foreach=False): p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; "
        "p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).  Weight decay applies to every parameter "
        "(norms, biases, embeddings too).  After one step an element moves by ~lr*sign(g): elements whose "
        "gradient is tiny (|g| ~ eps or at rounding noise) are sensitive to it.",
    ]
    golden["notes"] = notes

    with open(os.path.join(fdir, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(
        "  %s: loss %.9g pg %.6g kl %.6g H %.6g clipfrac %.4g |g| %.6g branches %s"
        % (
            family,
            golden["loss"],
            golden["metrics_sum"]["pg_loss"],
            golden["metrics_sum"]["kl"],
            golden["metrics_sum"]["entropy"],
            golden["metrics_sum"]["clipfrac"],
            golden["total_grad_norm"],
            {b: branch.count(b) for b in set(branch)},
        )
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help="comma-separated case keys to generate (default: all: %(default)s)",
    )
    ap.add_argument("--dev", action="store_true", help="no transformers: test this script only (not goldens)")
    args = ap.parse_args()
    chosen = [f for f in args.families.split(",") if f]
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown or not chosen:
        ap.error("--families: unknown %s (known: %s)" % (",".join(unknown) or "none given", ",".join(FAMILIES)))

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_default_dtype(torch.float32)
    print("torch", torch.__version__, "python", platform.python_version())
    if not args.dev:
        import transformers

        print("transformers", transformers.__version__)
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for family in chosen:
        try:
            run_family(family, FAMILIES.index(family), args.out, args.dev)
        except Exception:
            traceback.print_exc()
            failed.append(family)
    if failed:
        print("FAILED:", ",".join(failed))
        return 1
    print("all families done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
