"""Makes the source checkpoints of bench/export_device.sh and checks rlpipe's
HF exports of them in transformers.

    python3 bench/export_check.py make DIR [--no-hf]
    python3 bench/export_check.py check --out RESULT.json [--no-hf] [--shell-checks FILE]
        --case NAME SOURCE EXPORT DTYPE LAYOUT [REF] ...

make writes two tiny random-init Qwen2 checkpoints (bf16, tied embeddings,
vocab 256) with the same weights: DIR/t5 in the transformers 5 config.json
dialect (dtype, rope_parameters) and DIR/t4 in the transformers 4 one
(torch_dtype, rope_theta, rope_scaling). The one the installed transformers
writes comes from save_pretrained, the other is a hand-edited copy. Beside
the weights: a WordLevel tokenizer over w4..w255 (tokenizers library,
saved by PreTrainedTokenizerFast: tokenizer.json, tokenizer_config.json,
...), a chat template, generation_config.json, README.md, LICENSE and a
hidden .gitattributes (which an export must not copy). --no-hf (a dry run
where torch, transformers or tokenizers are missing) copies rlpipe's own
examples/models/tiny-qwen2 (fp32) instead and writes stand-in tokenizer
files that only the file checks read.

check checks each export (a --case: a name, its source checkpoint directory,
the export directory, the dtype expected: bfloat16, float16, float32 or
"source" for the source config's, the layout expected: single or sharded,
and optionally the name of an earlier case whose weights these must equal,
bit for bit once rounded to the narrower dtype of the two):
  - files: every file of the source but config.json, the weights and hidden
    files is in the export, byte for byte; no hidden file is;
  - weights: model.safetensors alone, or shards named model-0000K-of-0000N
    with model.safetensors.index.json (total_size, a weight_map naming every
    tensor of every shard and nothing else), as the layout says; the tensors
    are the source's (names, shapes) in the dtype expected, and trained:
    some differ from the source's;
  - config.json: the source's keys, in the source's order, with the same
    values but the dtype's, under the key(s) the source used;
  - transformers (not with --no-hf): AutoTokenizer.from_pretrained (the chat
    template gives the ids expected), AutoModelForCausalLM.from_pretrained
    (no missing, unexpected or mismatched keys; the dtype expected; every
    parameter bit for bit the tensor of the export's files; the copied
    generation config in use), and greedy generation of a few tokens (on
    the GPU where there is one); cases with equal weights generate equally.
--shell-checks names a file of lines "NAME ok|FAIL DETAIL" that the shell
script checked (the CLI's refusal of a missing source, --source); they count
too. The result, {"ok": ..., "cases": [...], ...}, goes to --out; the exit
code is 1 when a check failed.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 256
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> {% endif %}"
)
PROMPT = "w5 w6 w7"
PROMPT_IDS = [1, 5, 6, 7, 2, 1]  # what CHAT_TEMPLATE makes of PROMPT
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
DTYPE_KEYS = ("torch_dtype", "dtype")
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
SIZES = {"BF16": 2, "F16": 2, "F32": 4}


def dump_config(d):
    """config.json text as transformers writes it."""
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def to_t4(d):
    d = dict(d)
    if "dtype" in d:
        d["torch_dtype"] = d.pop("dtype")
    rp = d.pop("rope_parameters", None)
    if rp is not None:
        if rp.get("rope_type", "default") != "default":
            raise SystemExit(f"rope_parameters {rp}: only default rope is converted")
        d["rope_theta"] = rp.get("rope_theta", 10000.0)
        d["rope_scaling"] = None
    d["transformers_version"] = "4.57.1"
    return d


def to_t5(d):
    d = dict(d)
    if "torch_dtype" in d:
        d["dtype"] = d.pop("torch_dtype")
    if d.pop("rope_scaling", None) is not None:
        raise SystemExit("rope_scaling set: only default rope is converted")
    d["rope_parameters"] = {"rope_theta": d.pop("rope_theta", 10000.0), "rope_type": "default"}
    d["transformers_version"] = "5.0.0"
    return d


def dialect(d):
    return "t5" if "dtype" in d or "rope_parameters" in d else "t4"


def make(args):
    out = os.path.abspath(args.dir)
    shutil.rmtree(out, ignore_errors=True)
    tmp = os.path.join(out, "native")
    os.makedirs(tmp)
    if args.no_hf:
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(REPO, "examples", "models", "tiny-qwen2", f), tmp)
        vocab = {t: i for i, t in enumerate(SPECIALS)}
        vocab.update({f"w{i}": i for i in range(len(SPECIALS), VOCAB)})
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump({"version": "1.0", "stand_in": True, "model": {"type": "WordLevel", "vocab": vocab}}, f)
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "</s>", "chat_template": CHAT_TEMPLATE}, f)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": 2, "max_new_tokens": 8}, f)
    else:
        import torch
        import transformers
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

        major = int(transformers.__version__.split(".")[0])
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                          pad_token_id=0, use_sliding_window=False)
        torch.manual_seed(0)
        # transformers 5 names the dtype argument dtype and always writes
        # safetensors (safe_serialization is gone); 4 says torch_dtype.
        kw = {"dtype" if major >= 5 else "torch_dtype": torch.bfloat16}
        AutoModelForCausalLM.from_config(cfg, **kw).save_pretrained(tmp)
        vocab = {t: i for i, t in enumerate(SPECIALS)}
        vocab.update({f"w{i}": i for i in range(len(SPECIALS), VOCAB)})
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.add_special_tokens(SPECIALS)
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
        try:  # as a model's tokenizer is saved
            from transformers import PreTrainedTokenizerFast

            fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
            fast.chat_template = CHAT_TEMPLATE
            fast.save_pretrained(tmp)
        except Exception as e:  # by hand: the files AutoTokenizer reads
            print(f"PreTrainedTokenizerFast.save_pretrained failed ({type(e).__name__}: {e}); writing the files by hand")
            tok.save(os.path.join(tmp, "tokenizer.json"))
            with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
                           "chat_template": CHAT_TEMPLATE, **special}, f, indent=2)
            with open(os.path.join(tmp, "special_tokens_map.json"), "w") as f:
                json.dump(special, f, indent=2)
        GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, max_new_tokens=8,
                         do_sample=False).save_pretrained(tmp)
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write("# tiny-qwen2 for the export check\n")
    with open(os.path.join(tmp, "LICENSE"), "w") as f:
        f.write("Apache-2.0\n")
    with open(os.path.join(tmp, ".gitattributes"), "w") as f:
        f.write("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    with open(os.path.join(tmp, "config.json")) as f:
        native = json.load(f)
    have = dialect(native)
    other = "t4" if have == "t5" else "t5"
    os.rename(tmp, os.path.join(out, have))
    shutil.copytree(os.path.join(out, have), os.path.join(out, other))
    with open(os.path.join(out, other, "config.json"), "w") as f:
        f.write(dump_config(to_t4(native) if other == "t4" else to_t5(native)))
    for d in ("t4", "t5"):
        with open(os.path.join(out, d, "config.json")) as f:
            got = dialect(json.load(f))
        if got != d:
            raise SystemExit(f"{out}/{d}/config.json is in dialect {got}")
    print(f"made {out}/{have} (save_pretrained) and {out}/{other} (hand-edited): {sorted(os.listdir(os.path.join(out, have)))}")


def is_weight(name):
    name = name.lower()
    if name.endswith(".index.json"):
        name = name[: -len(".index.json")]
    return name.endswith(WEIGHT_SUFFIXES)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        if t["dtype"] not in SIZES:
            raise ValueError(f"{path}: {name} has dtype {t['dtype']}")
        out[name] = (t["dtype"], t["shape"], data[a:b])
    return out


def f32_to_bf16(raw):
    """fp32 bytes rounded to bf16 bytes, to nearest even, as rlpipe and torch round."""
    n = len(raw) // 4
    out = []
    for x in struct.unpack(f"<{n}I", raw):
        if (x & 0x7F800000) == 0x7F800000 and (x & 0x7FFFFF):
            out.append(((x >> 16) | 0x40) & 0xFFFF)  # a quiet NaN
        else:
            out.append(((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF)
    return struct.pack(f"<{n}H", *out)


def narrowed(a, b):
    """The raw bytes of tensors a and b in the narrower dtype of the two (None: not comparable)."""
    (da, _, ra), (db, _, rb) = a, b
    if da == db:
        return ra, rb
    if (da, db) == ("F32", "BF16"):
        return f32_to_bf16(ra), rb
    if (da, db) == ("BF16", "F32"):
        return ra, f32_to_bf16(rb)
    return None


class Case:
    def __init__(self, name, source, export, dtype, layout, ref):
        self.name, self.source, self.export, self.layout, self.ref = name, source, export, layout, ref
        self.dtype = dtype
        self.result = {"name": name, "source": source, "export": export, "layout": layout, "checks": {}, "errors": []}
        self.tensors = {}
        self.generated = None

    def check(self, what, ok, detail=""):
        self.result["checks"][what] = {"ok": bool(ok), "detail": detail} if detail else bool(ok)
        if not ok:
            self.result["errors"].append(f"{what}: {detail}" if detail else what)
        return ok


def check_files(c):
    src = sorted(os.listdir(c.source))
    exp = set(os.listdir(c.export))
    want = [f for f in src if not f.startswith(".") and f != "config.json" and not is_weight(f)
            and os.path.isfile(os.path.join(c.source, f))]
    missing = [f for f in want if f not in exp]
    differ = []
    for f in want:
        if f in exp:
            with open(os.path.join(c.source, f), "rb") as x, open(os.path.join(c.export, f), "rb") as y:
                if x.read() != y.read():
                    differ.append(f)
    c.result["copied"] = want
    c.check("copied files present", not missing, f"missing {missing}")
    c.check("copied files byte-identical", not differ, f"differ: {differ}")
    hidden = sorted(f for f in exp if f.startswith("."))
    c.check("no hidden files", not hidden, f"hidden: {hidden}")


def check_weights(c):
    files = sorted(os.listdir(c.export))
    shards = [f for f in files if re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f)]
    single = "model.safetensors" in files
    index = "model.safetensors.index.json" in files
    c.result["weight_files"] = [f for f in files if f.startswith("model")]
    if c.layout == "single":
        c.check("single model.safetensors", single and not index and not shards, f"files {files}")
        if single:
            c.tensors = read_safetensors(os.path.join(c.export, "model.safetensors"))
    else:
        ok = c.check("sharded: index and 2+ shards, no model.safetensors", index and len(shards) >= 2 and not single,
                     f"files {files}")
        if not ok or not index:
            return
        n = len(shards)
        c.check("shard names 1..N of N", shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
                f"{shards}")
        with open(os.path.join(c.export, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        wm = idx.get("weight_map", {})
        total = 0
        mapped_ok = True
        for s in shards:
            ts = read_safetensors(os.path.join(c.export, s))
            for name, t in ts.items():
                mapped_ok &= wm.get(name) == s
                total += len(t[2])
            c.tensors.update(ts)
        c.check("index weight_map names every tensor's shard, and nothing else",
                mapped_ok and set(wm) == set(c.tensors), f"{len(wm)} mapped, {len(c.tensors)} in shards")
        c.check("index total_size", idx.get("metadata", {}).get("total_size") == total,
                f"{idx.get('metadata')} vs {total} bytes of tensors")
        c.result["shards"] = n
    src = read_safetensors(os.path.join(c.source, "model.safetensors"))
    c.check("tensor names are the source's", set(src) == set(c.tensors),
            f"only in source {sorted(set(src) - set(c.tensors))}, only in export {sorted(set(c.tensors) - set(src))}")
    c.check("shapes are the source's", all(src[n][1] == t[1] for n, t in c.tensors.items() if n in src))
    want = ST_DTYPES.get(c.dtype)
    c.check(f"tensors stored as {want}", all(t[0] == want for t in c.tensors.values()),
            f"{sorted({t[0] for t in c.tensors.values()})}")
    changed = 0
    for n, t in c.tensors.items():
        pair = narrowed(t, src[n]) if n in src else None
        if pair is not None and pair[0] != pair[1]:
            changed += 1
    c.result["tensors_changed_by_training"] = changed
    c.check("weights trained (some tensors differ from the source's)", changed > 0, f"{changed} of {len(c.tensors)}")


def check_config(c):
    def load(path):
        with open(path) as f:
            return json.load(f, object_pairs_hook=list)

    src, exp = load(os.path.join(c.source, "config.json")), load(os.path.join(c.export, "config.json"))
    sk, ek = [k for k, _ in src], [k for k, _ in exp]
    used = [k for k in DTYPE_KEYS if k in sk]
    dialect_keys = used or (["dtype"] if "rope_parameters" in sk else ["torch_dtype"])
    c.result["dialect"] = dialect(dict(src))
    c.result["dtype_keys"] = dialect_keys
    sd, ed = dict(src), dict(exp)
    if c.dtype == "source":
        c.dtype = next((sd[k] for k in used if sd[k]), "float32")
    inserted = [k for k in ek if k not in sk]
    c.check("config keys are the source's, in its order", ek[: len(sk)] == sk and inserted in ([], dialect_keys),
            f"source {sk}, export {ek}")
    c.check("config values are the source's but the dtype",
            all(json.dumps(ed.get(k)) == json.dumps(v) for k, v in sd.items() if k not in DTYPE_KEYS))
    want = c.dtype if (used or c.dtype != "float32") else None
    c.check(f"dtype {c.dtype} under {dialect_keys}",
            all(ed.get(k) == want for k in dialect_keys) and not any(k in ed for k in DTYPE_KEYS if k not in dialect_keys),
            f"export has { {k: ed.get(k) for k in DTYPE_KEYS if k in ed} }")


def check_hf(c, torch, transformers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    major = int(transformers.__version__.split(".")[0])
    tok = AutoTokenizer.from_pretrained(c.export)
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    ids = enc["input_ids"][0].tolist()
    # The export must serve the source's tokenizer: the same text and ids
    # from the source directory's files. (Whether transformers applies the
    # stand-in tokenizer's whitespace pre-tokenizer, which would give
    # PROMPT_IDS, is a property of the stand-in, recorded but not checked:
    # transformers 5.17 drops the words.)
    src = AutoTokenizer.from_pretrained(c.source)
    src_text = src.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    src_ids = src(src_text, return_tensors="pt", add_special_tokens=False)["input_ids"][0].tolist()
    c.result["prompt_ids"], c.result["prompt_ids_as_built"] = ids, PROMPT_IDS
    c.check("tokenizer and chat template are the source's", text == src_text and ids == src_ids,
            f"{text!r} -> {ids}; source {src_text!r} -> {src_ids}")
    kw = {"dtype" if major >= 5 else "torch_dtype": "auto"}
    model, info = AutoModelForCausalLM.from_pretrained(c.export, output_loading_info=True, **kw)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    bad = {k: sorted(set(map(str, info.get(k) or [])) - tied) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    c.check("from_pretrained: no missing, unexpected or mismatched keys", not any(bad.values()), f"{bad}")
    want = getattr(torch, c.dtype)
    c.check(f"model loads as {c.dtype}", model.dtype == want, f"{model.dtype}")
    sd = model.state_dict()
    views = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32}
    differ = []
    for name, (dt, shape, raw) in c.tensors.items():
        t = sd.get(name)
        if t is None or list(t.shape) != shape:
            differ.append(name)
            continue
        got = t.detach().cpu().contiguous().view(views[dt]).numpy().tobytes()
        if got != raw:
            differ.append(name)
    c.check("loaded parameters equal the export's tensors bit for bit", not differ and c.tensors, f"differ: {differ}")
    unknown = sorted(set(sd) - set(c.tensors) - tied)
    c.check("every parameter comes from the export's files", not unknown, f"{unknown}")
    gc = model.generation_config
    c.check("generation_config.json in use", gc.eos_token_id == 2 and gc.max_new_tokens == 8,
            f"eos {gc.eos_token_id}, max_new_tokens {gc.max_new_tokens}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(dev).eval()
    with torch.no_grad():
        out = model.generate(**{k: v.to(dev) for k, v in enc.items()}, max_new_tokens=6, do_sample=False)
    new = out[0, len(ids):].tolist()
    c.generated = new
    c.result["generated"] = {"device": dev, "ids": new, "text": tok.decode(new)}
    c.check("generates", len(new) >= 1 and all(0 <= i < VOCAB for i in new), f"{new}")


def check(args):
    result = {"ok": False, "cases": [], "errors": [], "python": sys.version.split()[0]}
    torch = transformers = None
    if not args.no_hf:
        try:
            import torch
            import transformers

            result["torch_version"], result["transformers_version"] = torch.__version__, transformers.__version__
        except Exception as e:  # recorded: the file checks still run
            result["errors"].append(f"import torch/transformers: {e}")
    cases = {}
    for spec in args.case:
        if len(spec) not in (5, 6):
            raise SystemExit(f"--case {spec}: want NAME SOURCE EXPORT DTYPE LAYOUT [REF]")
        c = Case(*spec[:5], spec[5] if len(spec) == 6 else None)
        cases[c.name] = c
        for step in (check_files, check_config, check_weights):
            try:
                step(c)
            except Exception as e:
                c.check(step.__name__, False, f"{type(e).__name__}: {e}")
                traceback.print_exc()
        if c.ref:
            r = cases.get(c.ref)
            same = r is not None and set(r.tensors) == set(c.tensors) and all(
                (p := narrowed(t, r.tensors[n])) is not None and p[0] == p[1] for n, t in c.tensors.items())
            c.check(f"weights equal {c.ref}'s bit for bit (in the narrower dtype)", same and c.tensors)
        if torch is not None:
            try:
                check_hf(c, torch, transformers)
            except Exception as e:
                c.check("transformers", False, f"{type(e).__name__}: {e}")
                traceback.print_exc()
            r = cases.get(c.ref) if c.ref else None
            if r is not None and r.generated is not None and r.dtype == c.dtype:
                c.check(f"generates as {c.ref}", c.generated == r.generated, f"{c.generated} vs {r.generated}")
        result["cases"].append(c.result)
    if args.shell_checks:
        shell = []
        with open(args.shell_checks) as f:
            for line in f:
                name, status, detail = (line.rstrip("\n").split(" ", 2) + ["", ""])[:3]
                if name:
                    shell.append({"name": name, "ok": status == "ok", "detail": detail})
        result["shell_checks"] = shell
        result["errors"] += [f"shell check {s['name']}: {s['detail']}" for s in shell if not s["ok"]]
    failed = [f"{c['name']}: {e}" for c in result["cases"] for e in c["errors"]]
    result["ok"] = not failed and not result["errors"] and bool(result["cases"])
    result["failed"] = failed
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    for c in result["cases"]:
        print(f"{c['name']}: {'ok' if not c['errors'] else 'FAIL'} ({len(c['checks'])} checks)"
              + "".join(f"\n  FAIL {e}" for e in c["errors"]))
    for e in result["errors"]:
        print(f"FAIL {e}")
    print(f"export check: {'ok' if result['ok'] else 'FAIL'}; result in {args.out}")
    return 0 if result["ok"] else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--no-hf", action="store_true")
    k = sub.add_parser("check")
    k.add_argument("--out", required=True)
    k.add_argument("--case", nargs="+", action="append", required=True)
    k.add_argument("--no-hf", action="store_true")
    k.add_argument("--shell-checks")
    args = ap.parse_args()
    if args.cmd == "make":
        make(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
