#!/usr/bin/env python3
"""The Llama e2e suite's helper (tests/e2e/llama_weights.sh), numpy and the
standard library only, none of zinf's code: writes small Hugging Face Llama
checkpoints (safetensors, one file or shards with
model.safetensors.index.json, in BF16, F16 or F32), reads them back, and
computes an independent float64 forward of LlamaForCausalLM (RMSNorm, rotary
embeddings "rotate half" with Llama 3's frequency scaling, grouped-query
attention, SwiGLU) for the loss zinf-train reports at its first step; for a
"qwen2:" spec, Qwen2ForCausalLM's (the same, with q, k and v biases).

  llama_ref.py write DIR SPEC --dtype bf16 --shards 3 [--seed S] [--bad missing|extra|shape|nan]
  llama_ref.py tokens FILE N V [--seed S]        an llm.c token file (version 1)
  llama_ref.py loss CKPT SPEC TOKENS B T         the mean loss of batch 0
  llama_ref.py same CKPT_A CKPT_B                every tensor's bytes alike (names, dtypes, shapes)
"""
import json, os, struct, sys

import numpy as np


def parse_spec(text):
    assert text.startswith("llama:") or text.startswith("qwen2:")
    kv = dict(item.split("=") for item in text[6:].split(","))
    s = dict(layers=int(kv["layers"]), hidden=int(kv["hidden"]), heads=int(kv["heads"]),
             kv_heads=int(kv.get("kv_heads", kv["heads"])), ffn=int(kv["ffn"]), vocab=int(kv["vocab"]),
             seq=int(kv["seq"]), theta=float(kv.get("rope_theta", 10000)), tied=kv.get("tied", "0") == "1",
             eps=float(kv.get("eps", 1e-5)), scale=float(kv.get("rope_scale", 0)),
             low=float(kv.get("rope_low", 1)), high=float(kv.get("rope_high", 4)), orig=int(kv.get("rope_orig", 8192)))
    s["hd"] = s["hidden"] // s["heads"]
    s["bias"] = text.startswith("qwen2:")  # q, k and v with biases
    return s


def shapes(s):
    C, hd, F, V = s["hidden"], s["hd"], s["ffn"], s["vocab"]
    out = [("model.embed_tokens.weight", [V, C])]
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", [C]))
        for proj, rows in (("q", s["heads"] * hd), ("k", s["kv_heads"] * hd), ("v", s["kv_heads"] * hd)):
            out.append((p + f"self_attn.{proj}_proj.weight", [rows, C]))
            if s["bias"]:
                out.append((p + f"self_attn.{proj}_proj.bias", [rows]))
        out += [(p + "self_attn.o_proj.weight", [C, s["heads"] * hd]),
                (p + "post_attention_layernorm.weight", [C]),
                (p + "mlp.gate_proj.weight", [F, C]),
                (p + "mlp.up_proj.weight", [F, C]),
                (p + "mlp.down_proj.weight", [C, F])]
    out.append(("model.norm.weight", [C]))
    if not s["tied"]:
        out.append(("lm_head.weight", [V, C]))
    return out


# --- elements --------------------------------------------------------------------
def encode(vals, dtype):  # float64 values -> little-endian bytes; BF16 rounds to nearest even, as torch
    if dtype == "F32":
        return vals.astype("<f4").tobytes()
    if dtype == "F16":
        return vals.astype("<f2").tobytes()
    b = vals.astype("<f4").view("<u4").astype(np.uint64)
    b += 0x7FFF + ((b >> 16) & 1)
    return ((b >> 16) & 0xFFFF).astype("<u2").tobytes()


def decode(raw, dtype):  # bytes -> float64
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float64)
    return (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").astype(np.float64)


# --- safetensors -----------------------------------------------------------------
def write_safetensors(path, tensors):  # [(name, dtype, shape, bytes)]
    header, at = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors:
            f.write(t[3])


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[8 + n + b: 8 + n + end])
    return out


def read_checkpoint(path):
    if os.path.isdir(path):
        idx = os.path.join(path, "model.safetensors.index.json")
        path = idx if os.path.exists(idx) else os.path.join(path, "model.safetensors")
    if path.endswith(".json"):
        wm = json.load(open(path))["weight_map"]
        out = {}
        for f in sorted(set(wm.values())):
            out.update(read_safetensors(os.path.join(os.path.dirname(path), f)))
        return out
    return read_safetensors(path)


# --- write -------------------------------------------------------------------------
def cmd_write(args):
    d, s = args[0], parse_spec(args[1])
    opts = dict(zip(args[2::2], args[3::2]))
    dtype = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}[opts.get("--dtype", "bf16")]
    shards = int(opts.get("--shards", "1"))
    rng = np.random.default_rng(int(opts.get("--seed", "1")))
    bad = opts.get("--bad", "")
    tensors = []
    for name, shape in shapes(s):
        n = int(np.prod(shape))
        norm = len(shape) == 1 and not name.endswith(".bias")
        vals = 1 + 0.1 * rng.standard_normal(n) if norm else 0.3 * rng.standard_normal(n)
        if bad == "shape" and name.endswith("layers.1.self_attn.k_proj.weight"):
            shape = [shape[0] + 1, shape[1]]
            vals = np.concatenate([vals, vals[: shape[1]]])
        if bad == "nan" and name.endswith("layers.0.mlp.down_proj.weight"):
            vals[5] = np.nan
        if bad == "missing" and name.endswith("layers.1.mlp.up_proj.weight"):
            continue
        tensors.append((name, dtype, shape, encode(vals, dtype)))
    if bad == "extra":
        tensors.append(("model.layers.0.self_attn.q_proj.bias", dtype, [4], encode(np.zeros(4), dtype)))
    os.makedirs(d, exist_ok=True)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        return
    per = -(-len(tensors) // shards)
    wm, total = {}, 0
    for k in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        part = tensors[k * per:(k + 1) * per]
        write_safetensors(os.path.join(d, name), part)
        for t in part:
            wm[t[0]] = name
            total += len(t[3])
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)


def cmd_tokens(args):
    path, n, V = args[0], int(args[1]), int(args[2])
    opts = dict(zip(args[3::2], args[4::2]))
    toks = np.random.default_rng(int(opts.get("--seed", "3"))).integers(0, V, n)
    h = np.zeros(256, "<i4")
    h[:3] = 20240520, 1, n
    open(path, "wb").write(h.tobytes() + toks.astype("<u2").tobytes())


# --- the forward, float64 -----------------------------------------------------------
def freqs(s):  # the rotary frequencies of one head's first half, Llama 3's scaling when rope_scale > 0
    hd = s["hd"]
    f = 1.0 / s["theta"] ** (2 * np.arange(hd // 2) / hd)
    if s["scale"] == 0:
        return f
    low_wl, high_wl = s["orig"] / s["low"], s["orig"] / s["high"]
    wl = 2 * np.pi / f
    sm = (s["orig"] / wl - s["low"]) / (s["high"] - s["low"])
    mid = (1 - sm) * f / s["scale"] + sm * f
    return np.where(wl < high_wl, f, np.where(wl > low_wl, f / s["scale"], mid))


def rms(x, g, eps):  # x (T, C)
    return g * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def rope(v, f):  # v (T, heads, hd): dimension i pairs with i + hd/2 ("rotate half")
    T, half = v.shape[0], v.shape[2] // 2
    a = np.arange(T)[:, None] * f[None, :]                  # (T, half)
    cos = np.concatenate([np.cos(a), np.cos(a)], axis=1)[:, None, :]
    sin = np.concatenate([np.sin(a), np.sin(a)], axis=1)[:, None, :]
    rot = np.concatenate([-v[..., half:], v[..., :half]], axis=-1)
    return v * cos + rot * sin


def cmd_loss(args):
    ck, s, tok_path, B, T = read_checkpoint(args[0]), parse_spec(args[1]), args[2], int(args[3]), int(args[4])
    W = {name: decode(raw, dt).reshape(shape) for name, (dt, shape, raw) in ck.items()}
    toks = np.frombuffer(open(tok_path, "rb").read()[1024:1024 + 2 * (B * T + 1)], "<u2").astype(np.int64)
    C, H, KV, hd = s["hidden"], s["heads"], s["kv_heads"], s["hd"]
    f, total = freqs(s), 0.0
    causal = np.tril(np.ones((T, T), dtype=bool))
    head = W["model.embed_tokens.weight" if s["tied"] else "lm_head.weight"]
    for b in range(B):
        x = W["model.embed_tokens.weight"][toks[b * T:(b + 1) * T]]           # (T, C)
        for l in range(s["layers"]):
            p = f"model.layers.{l}."
            h = rms(x, W[p + "input_layernorm.weight"], s["eps"])
            def proj(name):  # h @ W^T (+ b, a Qwen2's)
                y = h @ W[p + f"self_attn.{name}_proj.weight"].T
                return y + W[p + f"self_attn.{name}_proj.bias"] if s["bias"] else y
            q = rope(proj("q").reshape(T, H, hd), f)
            k = rope(proj("k").reshape(T, KV, hd), f)
            v = proj("v").reshape(T, KV, hd)
            o = np.empty((T, H, hd))
            for hh in range(H):
                g = hh // (H // KV)                                           # query head hh reads kv head g
                sc = np.where(causal, q[:, hh] @ k[:, g].T / np.sqrt(hd), -np.inf)
                e = np.exp(sc - sc.max(axis=1, keepdims=True))
                o[:, hh] = (e / e.sum(axis=1, keepdims=True)) @ v[:, g]
            x = x + o.reshape(T, H * hd) @ W[p + "self_attn.o_proj.weight"].T
            h2 = rms(x, W[p + "post_attention_layernorm.weight"], s["eps"])
            gate, up = h2 @ W[p + "mlp.gate_proj.weight"].T, h2 @ W[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
        logits = rms(x, W["model.norm.weight"], s["eps"]) @ head.T             # (T, V)
        m = logits.max(axis=1)
        lse = np.log(np.exp(logits - m[:, None]).sum(axis=1)) + m
        total += float((lse - logits[np.arange(T), toks[b * T + 1:(b + 1) * T + 1]]).sum())
    print("%.10f" % (total / (B * T)))


def cmd_same(args):
    a, b = read_checkpoint(args[0]), read_checkpoint(args[1])
    if sorted(a) != sorted(b):
        print("names differ:", sorted(set(a) ^ set(b)))
        sys.exit(1)
    bad = [n for n in a if a[n] != b[n]]
    if bad:
        print("differ:", bad[:5], [(a[n][0], a[n][1], b[n][0], b[n][1]) for n in bad[:2]])
        sys.exit(1)
    print("%d tensors alike" % len(a))


if __name__ == "__main__":
    {"write": cmd_write, "tokens": cmd_tokens, "loss": cmd_loss, "same": cmd_same}[sys.argv[1]](sys.argv[2:])
