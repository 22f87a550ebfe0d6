#!/usr/bin/env python3
"""CPU smoke test of bench/peer_fsdp2.py without transformers or a GPU.

Replaces the HF model builder with a tiny stand-in (embedding, a few
residual MLP layers, final norm, tied head) and runs the peer's benchmark
loop with --device cpu --no-fsdp --ac none, checking the JSON it writes.
Needs only torch (e.g. Debian's python3-torch):

    /usr/bin/python3 bench/peer_smoke.py
"""

import json
import os
import sys
import tempfile
import types

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_fsdp2  # noqa: E402


class _Inner(nn.Module):
    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, input_ids, position_ids, use_cache=False):
        assert input_ids.shape == position_ids.shape
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return types.SimpleNamespace(last_hidden_state=self.norm(x))


class _LM(nn.Module):
    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.model = _Inner(vocab, hidden, layers)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied


def fake_build_lm(config_path, device, weights=None):
    cfg = types.SimpleNamespace(model_type="fake", num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=101, tie_word_embeddings=True)
    torch.manual_seed(0)
    return _LM(cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers).to(device), cfg


def main():
    peer_fsdp2.build_lm = fake_build_lm
    with tempfile.TemporaryDirectory() as d:
        for layout in ("batch", "packed"):
            out = os.path.join(d, f"peer-{layout}.json")
            code = peer_fsdp2.main(["--config", "examples/models/tiny-qwen2/config.json", "--device", "cpu", "--no-fsdp", "--ac", "none",
                                    "--seqs", "4", "--tokens-per-seq", "24", "--prompt-tokens", "4", "--chunk", "16",
                                    "--steps", "2", "--warmup", "1", "--layout", layout, "--entropy-coef", "0.001", "-q", "--out", out])
            r = json.load(open(out))
            assert code == 0 and r["status"] == "ok", r.get("traceback", r)
            assert len(r["train"]["times_s"]) == 2 and r["train"]["tokens"] == 96, r["train"]
            assert r["ref_logprob"]["tokens_per_s"] > 0 and r["train"]["tokens_per_s"] > 0
            assert r["workload"]["response_tokens_per_step"] == 80
            assert all(map(lambda v: v == v, r["last_metrics"].values())), r["last_metrics"]
        # Two micro-batches of 2 sequences: the same update, the grads
        # accumulated (bf16 compute: the norms agree to rounding).
        one = json.load(open(os.path.join(d, "peer-batch.json")))
        out = os.path.join(d, "peer-micro.json")
        code = peer_fsdp2.main(["--config", "examples/models/tiny-qwen2/config.json", "--device", "cpu", "--no-fsdp", "--ac", "none",
                                "--seqs", "4", "--tokens-per-seq", "24", "--prompt-tokens", "4", "--chunk", "16",
                                "--steps", "2", "--warmup", "1", "--entropy-coef", "0.001", "--micro-batches", "2", "-q", "--out", out])
        r = json.load(open(out))
        assert code == 0 and r["status"] == "ok", r.get("traceback", r)
        assert r["workload"]["micro_batches"] == 2 and r["train"]["tokens"] == 96, r["workload"]
        a, b = one["last_metrics"]["grad_norm"], r["last_metrics"]["grad_norm"]
        assert abs(a - b) <= 0.02 * abs(a), (a, b)
        assert abs(one["last_metrics"]["loss"] - r["last_metrics"]["loss"]) <= 0.02 * abs(one["last_metrics"]["loss"]) + 1e-6, (one["last_metrics"], r["last_metrics"])
        # Each layer under torch.compile: the same update, every layer
        # compiled (one graph a grad mode, shared), no graph breaks.
        out = os.path.join(d, "peer-compile.json")
        code = peer_fsdp2.main(["--config", "examples/models/tiny-qwen2/config.json", "--device", "cpu", "--no-fsdp", "--ac", "none",
                                "--seqs", "4", "--tokens-per-seq", "24", "--prompt-tokens", "4", "--chunk", "16",
                                "--steps", "2", "--warmup", "1", "--entropy-coef", "0.001", "--compile", "layers", "-q", "--out", out])
        r = json.load(open(out))
        assert code == 0 and r["status"] == "ok", r.get("traceback", r)
        c = r["compile"]
        assert r["workload"]["compile"] == "layers" and c["graph_breaks"] == 0 and c["stats"]["unique_graphs"] >= 1, c
        b = r["last_metrics"]["grad_norm"]
        assert abs(a - b) <= 0.02 * abs(a), (a, b)
    print("peer smoke test: ok")


if __name__ == "__main__":
    main()
