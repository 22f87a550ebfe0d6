#!/usr/bin/env python3
"""PyTorch FSDP2 peer of rlpipe's benchmark (bench/cmd/rlbench).

One GRPO step of SEQS sequences of TOKENS tokens (PROMPT prompt + the rest
response) on one GPU, the way a PyTorch RL trainer (slime's FSDP backend,
verl) does it today:

  * a Qwen2 model from an HF config.json, attn_implementation="sdpa"
    (with --sdpa flash or cudnn, that backend of PyTorch's alone),
    random-init, or with --weights DIR a checkpoint's values (rlbench's
    random checkpoint, so that both sides start from the same weights);
    random token ids and rewards, or with --rollouts FILE the first SEQS
    samples of an rlpipe rollout file (rlbench's, kept with --workdir);
  * torch.distributed with world size 1 (file:// store), or under torchrun
    (`python3 -m torch.distributed.run --nproc_per_node W`) one process per
    GPU with each rank taking SEQS/W of the sequences; FSDP2
    (torch.distributed.fsdp.fully_shard) per decoder layer and on the root,
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 master;
  * activation checkpointing per decoder layer (checkpoint_wrapper, non-reentrant);
  * with --compile layers, each decoder layer (of the actor and the
    reference) under torch.compile, as torchtitan applies it: after the
    activation checkpointing and before fully_shard, so that FSDP2's hooks
    stay outside the compiled graphs;
  * log-probs from the final hidden state in chunks of CHUNK rows: a custom
    autograd Function computes logits = h @ W^T in bf16, log_softmax and the
    entropy in fp32, and recomputes each chunk in backward, so [tokens x vocab]
    is never materialised (only the rows predicting response tokens go
    through the head, as in rlpipe);
  * a frozen reference model (bf16 copy, its own fully_shard) for the
    low_var_kl term;
  * GRPO loss per shared/RL-MATH.md: clipped ratio with l_old = detached l
    (on-policy), low_var_kl to the reference log-probs, sample-mean
    aggregation, backward on loss / GBS; grad clip 1.0; fused AdamW.

Measured with CUDA events after warm-up (median over --steps):
  ref_logprob: reference forward, no grad, chunked log-probs;
  train:       actor forward + backward + grad clip + optimizer step.
--offload puts the actor under CPUOffloadPolicy (params, grads and the
optimizer step on the host); --offload-ref does so for the reference.

Layout: "batch" (default) feeds the sequences as a [SEQS, TOKENS] batch with
no mask, so SDPA takes its causal flash kernel. For equal-length sequences
this is the same computation as rlpipe's varlen packing. "packed" feeds one
[1, SEQS*TOKENS] row with position ids restarting per sequence and relies on
transformers' packed-sequence detection, which builds a block-causal mask
(SDPA's masked kernel): slower, shown for reference.

Prints a one-line summary and writes JSON (--out). --selftest checks the
chunked log-prob Function and the loss against unchunked float64 math and
exits (needs only torch; runs on the CPU).
"""

import argparse
import copy
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

GIB = float(1 << 30)


# ---------------------------------------------------------------------------
# Chunked log-probs


class ChunkedLogProb(torch.autograd.Function):
    """logp[n] = log_softmax(h[n] @ w^T)[targets[n]] and entropy[n], chunk by chunk.

    h [N, H] and w [V, H] in the compute dtype (bf16); the logits of a chunk
    are formed in that dtype by the GEMM (fp32 accumulation) and upcast to
    fp32 for log_softmax and the entropy. Backward recomputes each chunk's
    logits, turns them into dlogits in place, and accumulates dh and dw.
    Peak extra memory: about two [chunk, V] fp32 buffers.
    """

    @staticmethod
    def forward(ctx, h, w, targets, chunk, want_entropy):
        n = h.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=h.device)
        ent = torch.empty(n, dtype=torch.float32, device=h.device) if want_entropy else None
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            z = torch.matmul(h[lo:hi], w.t()).float()  # [C, V]
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            logp[lo:hi] = z.gather(1, targets[lo:hi, None]).squeeze(1) - lse.squeeze(1)
            if want_entropy:
                z.sub_(lse)  # log p
                p = z.exp()
                ent[lo:hi] = -torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1)
                del p
            del z, lse
        ctx.save_for_backward(h, w, targets)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        if want_entropy:
            return logp, ent
        return logp, torch.zeros(0, dtype=torch.float32, device=h.device)

    @staticmethod
    def backward(ctx, dlogp, dent):
        h, w, targets = ctx.saved_tensors
        chunk = ctx.chunk
        n = h.shape[0]
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        dw = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
        if dent is not None and dent.numel() == 0:
            dent = None
        if dlogp is None:
            dlogp = torch.zeros(n, dtype=torch.float32, device=h.device)
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            hc = h[lo:hi]
            z = torch.matmul(hc, w.t()).float()
            z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))  # log p
            p = z.exp()
            gl = dlogp[lo:hi, None]
            if dent is not None:
                # dH/dz = -p (log p + H); dlogp_t/dz = onehot_t - p
                hval = -torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1, 1)
                z.add_(hval).mul_(-dent[lo:hi, None]).sub_(gl)  # -dent (log p + H) - dlogp
                g = p.mul_(z)
            else:
                g = p.mul_(-gl)
            del z
            rows = torch.arange(hi - lo, device=h.device)
            g[rows, targets[lo:hi]] += dlogp[lo:hi]
            gb = g.to(w.dtype)
            del g, p
            if dh is not None:
                dh[lo:hi] = torch.matmul(gb, w)
            if dw is not None:
                dw.addmm_(gb.t(), hc)
            del gb
        return dh, dw, None, None, None


def chunked_logprobs(h, w, targets, chunk, want_entropy=True):
    logp, ent = ChunkedLogProb.apply(h, w, targets, chunk, want_entropy)
    return logp, (ent if want_entropy else None)


# ---------------------------------------------------------------------------
# GRPO loss (shared/RL-MATH.md)


def grpo_advantages(rewards, group):
    r = rewards.view(-1, group)
    a = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=True, keepdim=True) + 1e-6)
    return a.reshape(-1)


def sample_mean(x, sample_of, lens, nsamples):
    """SM(x) = sum_i mean over i's tokens of x (loss mask all ones)."""
    s = torch.zeros(nsamples, dtype=x.dtype, device=x.device).index_add_(0, sample_of, x)
    return (s / lens.clamp(min=1)).sum()


def grpo_loss(logp, ent, ref_logp, adv_tok, sample_of, lens, nsamples, gbs, eps=0.2, eps_high=0.2, kl_coef=0.01, ent_coef=0.0):
    old = logp.detach()
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv_tok * ratio, -adv_tok * ratio.clamp(1 - eps, 1 + eps_high))
    x = logp - ref_logp
    kl = (torch.exp(-x) - 1 + x).clamp(-10, 10)
    loss = sample_mean(pg, sample_of, lens, nsamples) + kl_coef * sample_mean(kl, sample_of, lens, nsamples)
    if ent_coef != 0 and ent is not None:
        loss = loss - ent_coef * sample_mean(ent, sample_of, lens, nsamples)
    return loss / gbs


# ---------------------------------------------------------------------------
# Model


class LogProbModel(nn.Module):
    """An HF causal LM whose forward returns chunked log-probs of the given rows.

    It is the FSDP root, so the embedding, final norm and (tied) lm_head are
    gathered around its forward; the decoder layers are their own units.
    """

    def __init__(self, lm, chunk, want_entropy):
        super().__init__()
        self.lm = lm
        self.chunk = chunk
        self.want_entropy = want_entropy

    def forward(self, input_ids, position_ids, rows, targets):
        out = self.lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        h = out.last_hidden_state
        h = h.reshape(-1, h.shape[-1]).index_select(0, rows)
        return chunked_logprobs(h, self.lm.lm_head.weight, targets, self.chunk, self.want_entropy)


def build_lm(config_path, device, weights=None):
    """The actor: HF's random initialisation of the config (seed 0), or,
    with weights (a checkpoint directory, e.g. rlbench's random checkpoint),
    that checkpoint's values; fp32 master weights either way."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dir = config_path if os.path.isdir(config_path) else os.path.dirname(os.path.abspath(config_path))
    cfg = AutoConfig.from_pretrained(cfg_dir)
    cfg.use_cache = False
    if weights:
        import transformers

        # transformers 5 calls the argument dtype; 4 says torch_dtype.
        kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
        lm = AutoModelForCausalLM.from_pretrained(weights, config=cfg, attn_implementation="sdpa", **kw)
    else:
        torch.manual_seed(0)
        with torch.device(device):
            lm = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    lm = lm.to(device).float()  # fp32 master weights; compute in bf16 through the FSDP policy
    lm.config.use_cache = False
    return lm, cfg


def read_rollouts(path, seqs, n, p):
    """Token ids [seqs, n] and rewards [seqs] of the first seqs samples of an
    rlpipe rollout file (prompt_tokens, response_tokens, reward per line),
    each of which must have p prompt tokens and n in all."""
    ids, rewards = [], []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            if len(ids) == seqs:
                break
            if not line.strip():
                continue
            s = json.loads(line)
            pr, rs = s["prompt_tokens"], s["response_tokens"]
            if len(pr) != p or len(pr) + len(rs) != n:
                raise ValueError(f"{path}:{ln}: {len(pr)} prompt + {len(rs)} response tokens, want {p} + {n - p}")
            if s.get("loss_mask") is not None:
                raise ValueError(f"{path}:{ln}: a loss mask (the peer takes every response token)")
            ids.append(pr + rs)
            rewards.append(float(s["reward"]))
    if len(ids) < seqs:
        raise ValueError(f"{path}: {len(ids)} samples, want {seqs}")
    return torch.tensor(ids, dtype=torch.long), torch.tensor(rewards, dtype=torch.float64)


def apply_ac(lm, mode):
    layers = lm.model.layers
    if mode == "wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        for i in range(len(layers)):
            layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    elif mode == "hf":
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif mode != "none":
        raise ValueError(f"--ac {mode}")


def apply_compile(lm, mode):
    """torch.compile each decoder layer (mode "layers"), as torchtitan does:
    the compiled module replaces the layer in its ModuleList, and
    fully_shard is applied to it afterwards."""
    if mode == "none":
        return
    if mode != "layers":
        raise ValueError(f"--compile {mode}")
    import torch._dynamo

    # The layers share their code, so one graph per grad mode serves them
    # all; room in the guard cache keeps a recompiling layer from falling
    # back to eager unseen (the counters in the JSON tell).
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    layers = lm.model.layers
    for i in range(len(layers)):
        layers[i] = torch.compile(layers[i])


def compile_counters():
    """Dynamo's counts of frames compiled, graphs and graph breaks (with
    their reasons), for the JSON."""
    from torch._dynamo.utils import counters

    out = {k: dict(counters[k]) for k in ("stats", "frames") if k in counters}
    breaks = counters.get("graph_break", {})
    out["graph_breaks"] = sum(breaks.values())
    out["graph_break_reasons"] = {str(k)[:200]: v for k, v in list(breaks.items())[:10]}
    return out


def shard(root, lm, mesh, offload, use_fsdp, reshard=True):
    if not use_fsdp:
        return
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kw = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
              offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy(), reshard_after_forward=reshard)
    for layer in lm.model.layers:
        fully_shard(layer, **kw)
    fully_shard(root, **kw)


# ---------------------------------------------------------------------------
# Benchmark


def timing(times, tokens):
    med = statistics.median(times) if times else 0.0
    return {"times_s": times, "median_s": med, "min_s": min(times) if times else 0.0,
            "mean_s": statistics.fmean(times) if times else 0.0, "tokens": tokens,
            "tokens_per_s": tokens / med if med > 0 else 0.0}


class EnergyMeter:
    """A GPU's energy counter through NVML (libnvidia-ml's total energy
    consumption since the driver loaded), in joules, as rlbench reads it.
    The GPU is found by the UUID PyTorch gives, else by its CUDA index.
    meter() returns None, with a note, where there is none. A phase's
    energy is the counter's difference between the end of its last warm-up
    step and the end of its last timed step, outside every timed window (a
    read takes milliseconds); the counter moves every 100 ms on an H200."""

    def __init__(self, dev):
        import ctypes

        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        h = ctypes.c_void_p()
        uuid = str(getattr(torch.cuda.get_device_properties(dev), "uuid", "") or "")
        if uuid:
            uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            rc = lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(h))
        else:
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(dev.index or 0), ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(f"no NVML handle for {dev} ({uuid or 'by index'}): error {rc}")
        self.lib, self.h, self.mj = lib, h, ctypes.c_ulonglong()
        self.joules()  # a GPU without the counter fails here

    def joules(self):
        import ctypes

        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(self.mj))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetTotalEnergyConsumption: error {rc}")
        return self.mj.value / 1e3


def meter(dev, res):
    try:
        return EnergyMeter(dev)
    except (OSError, RuntimeError, AttributeError) as e:
        res["energy_note"] = str(e)
        return None


def energy_mark(energy):
    """The counter and the clock now (the device idle: after a Timer), or None."""
    return (energy.joules(), time.perf_counter()) if energy else None


def energy_since(energy, mark, steps):
    """The energy from mark to now over steps timed steps, as rlbench's Energy."""
    j, t = energy.joules() - mark[0], time.perf_counter() - mark[1]
    return {"joules": j, "seconds": t, "steps": steps, "joules_per_step": j / steps if steps else 0.0,
            "watts": j / t if t > 0 else 0.0}


class Timer:
    def __init__(self, cuda):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            self.s = self.a.elapsed_time(self.b) / 1e3
        else:
            self.s = time.perf_counter() - self.t0
        self.wall = time.perf_counter() - self.t0
        return False


def mem_snapshot(cuda):
    if not cuda:
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"max_allocated_bytes": torch.cuda.max_memory_allocated(), "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_used_bytes": total - free}


def world():
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))


def set_sdpa(which):
    """Leaves scaled_dot_product_attention's backends as PyTorch has them
    ("default") or enables flash (FlashAttention-2) or cuDNN's alone."""
    if which == "default":
        return
    b = torch.backends.cuda
    b.enable_flash_sdp(which == "flash")
    b.enable_cudnn_sdp(which == "cudnn")
    b.enable_mem_efficient_sdp(False)
    b.enable_math_sdp(False)


def run(args, res):
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    rank, nranks, local = world()
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        set_sdpa(args.sdpa)
    use_fsdp = not args.no_fsdp
    mesh = None
    store = None
    if use_fsdp:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            if nranks > 1:  # torchrun: env:// rendezvous, one process per GPU
                dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=dev if cuda else None)
            else:
                store = tempfile.NamedTemporaryFile(prefix="peer-fsdp2-store-", delete=False)
                store.close()
                os.unlink(store.name)
                dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="file://" + store.name, rank=0, world_size=1)
        mesh = init_device_mesh(dev.type, (nranks,))

    t_setup = time.perf_counter()
    lm, cfg = build_lm(args.config, dev, args.weights)
    nparams = sum(p.numel() for p in lm.parameters())
    res["model"] = {"config": args.config, "family": cfg.model_type, "params": nparams, "layers": cfg.num_hidden_layers,
                    "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size, "heads": cfg.num_attention_heads,
                    "kv_heads": cfg.num_key_value_heads, "vocab": cfg.vocab_size,
                    "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False))}
    # The reference: a frozen bf16 copy of the initial actor (copy_of: actor).
    ref_lm = copy.deepcopy(lm)
    for p in ref_lm.parameters():
        p.requires_grad_(False)
        p.data = p.data.to(torch.bfloat16)
    apply_ac(lm, args.ac)
    apply_compile(lm, args.compile)
    apply_compile(ref_lm, args.compile)
    actor = LogProbModel(lm, args.chunk, want_entropy=True)
    ref = LogProbModel(ref_lm, args.chunk, want_entropy=False)
    shard(actor, lm, mesh, args.offload, use_fsdp, not args.no_reshard)
    if not args.ref_replicate:  # else a whole bf16 copy on every rank: no gathers
        shard(ref, ref_lm, mesh, args.offload_ref, use_fsdp)
    if not use_fsdp:  # plain bf16 compute (CPU smoke test)
        actor.to(torch.bfloat16)
    params = [p for p in actor.parameters() if p.requires_grad]
    opt_kw = dict(lr=1e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    state = {}

    def make_opt(fused):
        state["opt"] = torch.optim.AdamW(params, fused=True, **opt_kw) if fused else torch.optim.AdamW(params, foreach=True, **opt_kw)
        res["optimizer"] = "AdamW(fused=True)" if fused else "AdamW(foreach=True)"

    try:
        make_opt(True)
    except (RuntimeError, TypeError, ValueError) as e:
        res["notes"].append(f"fused AdamW unavailable ({e}); foreach")
        make_opt(False)

    def opt_step():
        try:
            state["opt"].step()
        except RuntimeError as e:  # e.g. no fused kernel for CPU-offloaded params
            if "fused" not in res["optimizer"] or state.get("retried"):
                raise
            state["retried"] = True
            res["notes"].append(f"fused AdamW step failed ({e}); foreach")
            make_opt(False)
            state["opt"].step()
        state["opt"].zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    res["setup_s"] = time.perf_counter() - t_setup

    # Workload: S sequences of N tokens, P prompt + R response; one GRPO group.
    # With several ranks each takes S/W of the sequences (the same split as
    # rlpipe's dp ranks), normalises its loss by them, and FSDP2 averages
    # the grads over the ranks; throughput counts the whole step's tokens.
    S_all, N, P = args.seqs, args.tokens_per_seq, args.prompt_tokens
    if S_all % nranks:
        raise ValueError(f"{nranks} ranks do not divide {S_all} sequences")
    S = S_all // nranks
    R = N - P
    if args.rollouts:
        ids, rewards = read_rollouts(args.rollouts, S_all, N, P)
    else:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (S_all, N), generator=g)
        rewards = torch.rand(S_all, generator=g, dtype=torch.float64)
    adv = grpo_advantages(rewards, S_all).float()
    ids, adv = ids[rank * S:(rank + 1) * S], adv[rank * S:(rank + 1) * S]
    # Micro-batches: the rank's sequences in M groups of S/M, each a
    # forward and backward of its own whose grads add up (gradient
    # accumulation, as FSDP2 users write it); the loss of each is its
    # samples' share of the update's, normalised by all S.
    M = args.micro_batches
    if M < 1 or S % M:
        raise ValueError(f"--micro-batches {M} does not divide a rank's {S} sequences")
    s = S // M
    to = lambda t: t.to(dev)  # noqa: E731

    def micro(k):
        mids = ids[k * s:(k + 1) * s]
        starts = torch.arange(s) * N
        rows = (starts[:, None] + (N - 1 - R) + torch.arange(R)[None, :]).reshape(-1)  # logit positions
        targets = mids.reshape(-1)[rows + 1]
        sample_of = torch.arange(s).repeat_interleave(R)
        if args.layout == "batch":
            input_ids = mids
            position_ids = torch.arange(N).expand(s, N).contiguous()
        else:
            input_ids = mids.reshape(1, s * N)
            position_ids = torch.arange(N).repeat(s).reshape(1, s * N)
        input_ids, position_ids, rows, targets, sample_of = map(to, (input_ids, position_ids, rows, targets, sample_of))
        return {"args": (input_ids, position_ids, rows, targets), "sample_of": sample_of,
                "adv_tok": to(adv[k * s:(k + 1) * s])[sample_of], "lens": torch.full((s,), float(R), device=dev)}

    mbs = [micro(k) for k in range(M)]
    tokens = S_all * N
    res["workload"].update({"tokens_per_step": tokens, "response_tokens_per_step": S_all * R, "dp": nranks, "micro_batches": M,
                            "grad_sync": args.grad_sync})

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        res["memory"]["persistent_allocated_bytes"] = torch.cuda.memory_allocated()

    # ref_logprob: forward only, no grad.
    ref_times = []
    ref_logp = None
    energy = meter(dev, res) if cuda else None
    if energy and not args.warmup:
        res["energy_note"] = "no energy without a warm-up step, whose end is its first read"
        energy = None
    for i in range(args.warmup + args.steps):
        with torch.no_grad(), Timer(cuda) as t:
            ref_logp = [ref(*mb["args"])[0] for mb in mbs]
        if i == args.warmup - 1:
            mark = energy_mark(energy)
        if i >= args.warmup:
            ref_times.append(t.s)
            res["ref_logprob"] = timing(ref_times, tokens)  # kept if a later step is interrupted
        log(args, f"ref step {i + 1}/{args.warmup + args.steps}: {t.s:.4f}s")
    res["ref_logprob"] = timing(ref_times, tokens)
    if energy:
        res["ref_logprob"]["energy"] = energy_since(energy, mark, args.steps)
    res["memory"]["ref"] = mem_snapshot(cuda)
    ref_logp = [x.detach() for x in ref_logp]

    # train: forward + backward + clip + AdamW.
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    train_times, walls = [], []
    last = {}
    for i in range(args.warmup + args.steps):
        with Timer(cuda) as t:
            loss, logps = 0.0, []
            for k, (mb, rl) in enumerate(zip(mbs, ref_logp)):
                if M > 1 and args.grad_sync == "last" and hasattr(actor, "set_requires_gradient_sync"):
                    # FSDP2's gradient accumulation without communication:
                    # the unsharded grads add up on the GPU, and only the
                    # last micro-batch reduces (and, offloaded, copies) them.
                    actor.set_requires_gradient_sync(k == M - 1)
                logp, ent = actor(*mb["args"])
                part = grpo_loss(logp, ent, rl, mb["adv_tok"], mb["sample_of"], mb["lens"], s, gbs=S,
                                 kl_coef=args.kl_coef, ent_coef=args.entropy_coef)
                part.backward()
                loss, logps = loss + part.detach(), logps + [logp.detach()]
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt_step()
        if i == args.warmup - 1:
            mark = energy_mark(energy)
        if i >= args.warmup:
            train_times.append(t.s)
            walls.append(t.wall)
            res["train"] = timing(train_times, tokens)
        if hasattr(gn, "full_tensor"):
            gn = gn.full_tensor()
        last = {"loss": float(loss), "grad_norm": float(gn), "mean_logp": float(torch.cat(logps).mean())}
        log(args, f"train step {i + 1}/{args.warmup + args.steps}: {t.s:.4f}s loss {last['loss']:.4g} grad_norm {last['grad_norm']:.4g}")
    res["train"] = timing(train_times, tokens)
    if energy:
        res["train"]["energy"] = energy_since(energy, mark, args.steps)
    res["train_wall"] = timing(walls, tokens)
    res["memory"]["train"] = mem_snapshot(cuda)
    res["last_metrics"] = last
    if args.compile != "none":
        res["compile"] = compile_counters()
    if cuda:
        m = res["memory"]
        m["peak_allocated_bytes"] = max(m["ref"]["max_allocated_bytes"], m["train"]["max_allocated_bytes"])
        m["peak_reserved_bytes"] = max(m["ref"]["max_reserved_bytes"], m["train"]["max_reserved_bytes"])
        m["device_used_max_bytes"] = max(m["ref"]["device_used_bytes"], m["train"]["device_used_bytes"])
    if use_fsdp:
        import torch.distributed as dist

        dist.destroy_process_group()


def log(args, msg):
    if not args.quiet:
        print(f"peer: {msg}", file=sys.stderr, flush=True)


def summary(res):
    m = res.get("memory", {})
    name = os.path.basename(os.path.dirname(os.path.abspath(res["config"])))
    off = " offload" if res["workload"]["offload"] else ""
    s = (f"fsdp2 {name}{off} [{res.get('gpu', res['device'])}] {res['status']}: "
         f"ref_logprob {res.get('ref_logprob', {}).get('tokens_per_s', 0):.0f} tok/s, "
         f"train {res.get('train', {}).get('tokens_per_s', 0):.0f} tok/s")
    if "peak_allocated_bytes" in m:
        s += f"; peak {m['peak_allocated_bytes'] / GIB:.2f} GiB allocated / {m['peak_reserved_bytes'] / GIB:.2f} GiB reserved"
    gn = (res.get("last_metrics") or {}).get("grad_norm")
    if gn is not None:
        s += f"; last grad_norm {gn:.6g}"
    e_ref, e_train = res.get("ref_logprob", {}).get("energy"), res.get("train", {}).get("energy")
    if e_ref and e_train:
        s += (f"; energy a step: ref_logprob {e_ref['joules_per_step']:.1f} J ({e_ref['watts']:.0f} W), "
              f"train {e_train['joules_per_step']:.1f} J ({e_train['watts']:.0f} W)")
    if res.get("error"):
        s += " — " + res["error"].splitlines()[-1]
    return s


# ---------------------------------------------------------------------------
# Self-test (CPU, float64 reference)


def selftest():
    torch.manual_seed(0)
    n, hdim, vocab, chunk = 37, 16, 53, 8
    for want_entropy in (True, False):
        h = torch.randn(n, hdim, dtype=torch.float64, requires_grad=True)
        w = torch.randn(vocab, hdim, dtype=torch.float64, requires_grad=True)
        t = torch.randint(0, vocab, (n,))
        a = torch.randn(n, dtype=torch.float64)
        b = torch.randn(n, dtype=torch.float64)
        # reference: full logits
        z = h @ w.t()
        lp_all = torch.log_softmax(z, -1)
        lp = lp_all.gather(1, t[:, None]).squeeze(1)
        en = -(lp_all.exp() * lp_all).sum(-1)
        obj = (a * lp).sum() + ((b * en).sum() if want_entropy else 0)
        gh, gw = torch.autograd.grad(obj, (h, w))
        # chunked, computed in fp32 from fp64 inputs cast down
        h32 = h.detach().float().requires_grad_(True)
        w32 = w.detach().float().requires_grad_(True)
        lp2, en2 = chunked_logprobs(h32, w32, t, chunk, want_entropy)
        obj2 = (a.float() * lp2).sum() + ((b.float() * en2).sum() if want_entropy else 0)
        gh2, gw2 = torch.autograd.grad(obj2, (h32, w32))

        def rel(x, y):
            return float((x.double() - y).norm() / y.norm())

        errs = {"logp": rel(lp2.detach(), lp.detach()), "dh": rel(gh2, gh), "dw": rel(gw2, gw)}
        if want_entropy:
            errs["entropy"] = rel(en2.detach(), en.detach())
        bad = {k: v for k, v in errs.items() if not v < 1e-5}
        print(f"selftest chunked log-probs (entropy={want_entropy}): " + ", ".join(f"{k} rel {v:.2e}" for k, v in errs.items()))
        if bad:
            raise SystemExit(f"selftest failed: {bad}")
    # Loss: ratio 1 → pg = -A; GRPO advantages sum to 0 per group, so SM(pg) = 0;
    # low_var_kl of x: exp(-x) - 1 + x.
    S, R = 4, 5
    rewards = torch.tensor([0.1, 0.5, 0.9, 0.3], dtype=torch.float64)
    adv = grpo_advantages(rewards, S).float()
    sample_of = torch.arange(S).repeat_interleave(R)
    logp = torch.randn(S * R, requires_grad=True)
    ref = logp.detach() + 0.3 * torch.randn(S * R)  # |x| small: the ±10 clamp is inactive
    lens = torch.full((S,), float(R))
    loss = grpo_loss(logp, None, ref, adv[sample_of], sample_of, lens, S, gbs=S, kl_coef=0.5)
    x = (logp - ref).detach()
    want = 0.5 * ((torch.exp(-x) - 1 + x).view(S, R).mean(1).sum()) / S
    if abs(float(loss) - float(want)) > 1e-5 * max(1.0, abs(float(want))):
        raise SystemExit(f"selftest failed: loss {float(loss)} want {float(want)}")
    loss.backward()
    # d/dlogp of pg term: -A/R/GBS per token; of kl: kl_coef*(1 - exp(-x))/R/GBS
    gwant = (-adv[sample_of] + 0.5 * (1 - torch.exp(-x))) / R / S
    if float((logp.grad - gwant).abs().max()) > 1e-6:
        raise SystemExit("selftest failed: loss gradient")
    print("selftest GRPO loss: ok")


# ---------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="HF config.json (or its directory)")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens-per-seq", type=int, default=2048)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=2048, help="log-prob chunk rows")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per phase")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--offload", action="store_true", help="CPUOffloadPolicy for the actor")
    ap.add_argument("--offload-ref", action="store_true", help="CPUOffloadPolicy for the reference")
    ap.add_argument("--ref-replicate", action="store_true", help="the reference not sharded: a whole bf16 copy on every rank, which its forward reads with no all-gather (rlpipe's apply_fsdp2 replicate)")
    ap.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False for the actor: its layers stay gathered from forward to backward")
    ap.add_argument("--micro-batches", type=int, default=1, help="split a rank's sequences into this many micro-batches, their grads accumulated (as rlbench --max-tokens-per-gpu)")
    ap.add_argument("--grad-sync", choices=["each", "last"], default="each",
                    help="with --micro-batches: reduce (and, offloaded, copy to the host) the grads after each micro-batch's backward, or only the last one's (FSDP2's set_requires_gradient_sync(False) before the others)")
    ap.add_argument("--layout", choices=["batch", "packed"], default="batch")
    ap.add_argument("--ac", choices=["wrapper", "hf", "none"], default="wrapper", help="activation checkpointing per decoder layer")
    ap.add_argument("--compile", choices=["none", "layers"], default="none",
                    help="torch.compile each decoder layer of both models (torchtitan's way: after the checkpointing, before fully_shard)")
    ap.add_argument("--sdpa", choices=["default", "flash", "cudnn"], default="default",
                    help="scaled_dot_product_attention's backend: PyTorch's own choice, or only flash (FlashAttention-2) "
                    "or cuDNN's enabled (torch.backends.cuda.enable_*_sdp, set before the models are built and compiled)")
    ap.add_argument("--kl-coef", type=float, default=0.01)
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--weights", help="start from this checkpoint directory (e.g. rlbench's random checkpoint) instead of HF's initialisation")
    ap.add_argument("--rollouts", help="take the token ids and rewards of the first --seqs samples of this rlpipe rollout file "
                    "(e.g. rlbench's, kept with its --workdir) instead of random ones")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--no-fsdp", action="store_true", help="skip torch.distributed and FSDP (CPU smoke test)")
    ap.add_argument("--out", help="write the result JSON here")
    ap.add_argument("--selftest", action="store_true", help="check the chunked log-probs and the loss on the CPU, then exit")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
        return 0
    if not args.config:
        ap.error("--config is required")
    res = {"impl": "fsdp2", "status": "failed", "config": args.config, "device": args.device,
           "torch": torch.__version__, "warmup": args.warmup, "steps": args.steps, "notes": [],
           "workload": {"seqs": args.seqs, "tokens_per_seq": args.tokens_per_seq, "prompt_tokens": args.prompt_tokens,
                        "chunk": args.chunk, "precision": "bf16 (MixedPrecisionPolicy param bf16, reduce fp32)",
                        "recompute": args.ac != "none", "ac": args.ac, "compile": args.compile, "sdpa": args.sdpa, "offload": args.offload, "offload_ref": args.offload_ref, "ref_replicate": args.ref_replicate,
                        "layout": args.layout + (" [S, N], SDPA causal (no mask)" if args.layout == "batch" else " [1, S*N], block-causal mask from position ids"),
                        "kl_coef": args.kl_coef, "entropy_coef": args.entropy_coef,
                        # null: HF's initialisation (seed 0), random ids and rewards (seed 1)
                        "weights": args.weights, "rollouts": args.rollouts},
           "memory": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import transformers

        res["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    if args.device == "cuda" and torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name(world()[2])
        res["gpu_bytes"] = torch.cuda.get_device_properties(world()[2]).total_memory
    code = 0

    def on_term(signum, frame):  # `timeout` sends SIGTERM: still write what was measured
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        run(args, res)
        res["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 - record OOMs and interrupts too
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
        traceback.print_exc()
        code = 1
        if isinstance(e, KeyboardInterrupt):
            code = 130
    if world()[0] != 0:  # under torchrun only rank 0 reports
        return code
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(args.out + ".tmp", args.out)
    print(summary(res), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
