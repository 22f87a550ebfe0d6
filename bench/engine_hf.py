#!/usr/bin/env python3
"""A small inference engine over transformers that speaks the subset of
SGLang's HTTP API that rlpipe uses, for testing rlpipe's live loop on a
machine where SGLang cannot be installed:

    python3 bench/engine_hf.py --model DIR [--port 30000] [--device cuda] [--dtype bfloat16]

Endpoints (shapes as SGLang's; see docs/engines.md):

  POST /generate                    {"input_ids": [...], "sampling_params": {...}, "return_logprob": true}
      -> {"text": "", "output_ids": [...], "meta_info": {"id", "finish_reason": {"type", "matched"|"length"},
          "prompt_tokens", "completion_tokens", "output_token_logprobs": [[logprob, id, null], ...]}}
  POST /update_weights_from_disk    {"model_path": dir} -> {"success": true, "message": ..., "num_paused_requests": 0}
  POST /release_memory_occupation   {} -> null (the model moves to the CPU)
  POST /resume_memory_occupation    {} -> null (and back)
  GET  /health, /health_generate    -> 200

Requests that arrive together are generated as one left-padded batch (up
to --max-batch) with the sampling parameters of the first; each response's
log-probs are log_softmax(logits / T) at its tokens, the full distribution
after temperature, before top-k and top-p (what rlpipe's log-prob stages
compute). Requests' sampling_seed is not honoured: the engine seeds torch
once (--seed). It is a test engine, not a fast one.
"""

import argparse
import json
import queue
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


class Engine:
    def __init__(self, path, device, dtype, max_batch):
        self.device, self.dtype, self.max_batch = device, dtype, max_batch
        self.lock = threading.Lock()
        self.model = self._load(path)
        self.queue = queue.Queue()
        threading.Thread(target=self._worker, daemon=True).start()

    def _load(self, path):
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=self.dtype)
        return m.to(self.device).eval()

    def reload(self, path):
        with self.lock:
            new = AutoModelForCausalLM.from_pretrained(path, torch_dtype=self.dtype)
            self.model.load_state_dict(new.state_dict())
            del new
        return f"loaded {path}"

    def release(self):
        with self.lock:
            self.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def resume(self):
        with self.lock:
            self.model.to(self.device)

    def submit(self, req):
        done = threading.Event()
        box = {}
        self.queue.put((req, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _worker(self):
        while True:
            batch = [self.queue.get()]
            time.sleep(0.005)  # let a step's concurrent requests gather
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self._generate([b[0] for b in batch])
                for (_, done, box), r in zip(batch, results):
                    box["result"] = r
                    done.set()
            except Exception as e:  # noqa: BLE001: every waiter must wake
                traceback.print_exc()
                for _, done, box in batch:
                    box["error"] = e
                    done.set()

    @torch.no_grad()
    def _generate(self, reqs):
        sp = reqs[0].get("sampling_params", {})
        max_new = int(sp.get("max_new_tokens", 128))
        temp = float(sp.get("temperature", 1.0))
        top_p = float(sp.get("top_p", 1.0))
        top_k = int(sp.get("top_k", -1))
        stop = set(int(t) for t in sp.get("stop_token_ids", []) or [])
        if not sp.get("ignore_eos", False):
            eos = self.model.config.eos_token_id
            stop |= set([eos] if isinstance(eos, int) else (eos or []))
        with self.lock:
            prompts = [r["input_ids"] for r in reqs]
            width = max(len(p) for p in prompts)
            pad = 0
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
            out = [[] for _ in reqs]
            lps = [[] for _ in reqs]
            finished = [None] * len(reqs)
            past = None
            cur_ids, cur_mask = ids, mask
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            for step in range(max_new):
                o = self.model(input_ids=cur_ids, attention_mask=cur_mask if past is None else mask,
                               position_ids=positions if past is None else positions[:, -1:],
                               past_key_values=past, use_cache=True)
                past = o.past_key_values
                logits = o.logits[:, -1, :].float() / temp
                logp = F.log_softmax(logits, dim=-1)
                probs = logp.exp()
                if top_k > 0:
                    kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]
                    probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
                if top_p < 1.0:
                    sp_, si = torch.sort(probs, descending=True, dim=-1)
                    cum = sp_.cumsum(-1)
                    keep = cum - sp_ < top_p
                    sp_ = sp_ * keep
                    probs = torch.zeros_like(probs).scatter(-1, si, sp_)
                nxt = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1)
                for i in range(len(reqs)):
                    if finished[i] is not None:
                        continue
                    t = int(nxt[i, 0])
                    out[i].append(t)
                    lps[i].append(float(logp[i, t]))
                    if t in stop:
                        finished[i] = {"type": "stop", "matched": t}
                if all(f is not None for f in finished):
                    break
                cur_ids = nxt
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=-1)
                positions = torch.cat([positions, positions[:, -1:] + 1], dim=-1)
        res = []
        for i, r in enumerate(reqs):
            fin = finished[i] or {"type": "length", "length": len(out[i])}
            res.append({"text": "", "output_ids": out[i], "meta_info": {
                "id": uuid.uuid4().hex, "finish_reason": fin, "prompt_tokens": len(r["input_ids"]),
                "completion_tokens": len(out[i]), "cached_tokens": 0,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps[i], out[i])]}})
        return res


def handler(engine):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                return self._send(200, None)
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            try:
                body = self._body()
                if self.path == "/generate":
                    if not isinstance(body.get("input_ids"), list) or not body["input_ids"] or isinstance(body["input_ids"][0], list):
                        return self._send(400, {"error": {"message": "this engine takes one prompt of input_ids per request"}})
                    return self._send(200, engine.submit(body))
                if self.path == "/update_weights_from_disk":
                    msg = engine.reload(body["model_path"])
                    return self._send(200, {"success": True, "message": msg, "num_paused_requests": 0})
                if self.path == "/release_memory_occupation":
                    engine.release()
                    return self._send(200, None)
                if self.path == "/resume_memory_occupation":
                    engine.resume()
                    return self._send(200, None)
                self._send(404, {"error": {"message": f"no route {self.path}"}})
            except Exception as e:  # noqa: BLE001: the client gets the message
                traceback.print_exc()
                self._send(500, {"error": {"message": repr(e)}})

    return H


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    engine = Engine(a.model, a.device, getattr(torch, a.dtype), a.max_batch)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), handler(engine))
    print(f"engine_hf: serving {a.model} on 127.0.0.1:{a.port} ({a.device}, {a.dtype})", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
