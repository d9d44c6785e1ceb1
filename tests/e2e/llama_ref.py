#!/usr/bin/env python3
"""The Llama e2e suite's helper (tests/e2e/llama_weights.sh), the standard
library only: writes small Hugging Face Llama checkpoints (safetensors, one
file or shards with model.safetensors.index.json, in BF16, F16 or F32),
reads them back, and computes an independent float64 forward of
LlamaForCausalLM (RMSNorm, rotary embeddings "rotate half" with Llama 3's
frequency scaling, grouped-query attention, SwiGLU) for the loss zinf-train
reports at its first step.

  llama_ref.py write DIR SPEC --dtype bf16 --shards 3 [--seed S] [--bad missing|extra|shape]
  llama_ref.py tokens FILE N V [--seed S]        an llm.c token file (version 1)
  llama_ref.py loss CKPT SPEC TOKENS B T         the mean loss of batch 0
  llama_ref.py same CKPT_A CKPT_B                every tensor's bytes alike (names, dtypes, shapes)
"""
import json, math, os, random, struct, sys


def parse_spec(text):
    assert text.startswith("llama:")
    kv = dict(item.split("=") for item in text[6:].split(","))
    s = dict(layers=int(kv["layers"]), hidden=int(kv["hidden"]), heads=int(kv["heads"]),
             kv_heads=int(kv.get("kv_heads", kv["heads"])), ffn=int(kv["ffn"]), vocab=int(kv["vocab"]),
             seq=int(kv["seq"]), theta=float(kv.get("rope_theta", 10000)), tied=kv.get("tied", "0") == "1",
             eps=float(kv.get("eps", 1e-5)), scale=float(kv.get("rope_scale", 0)),
             low=float(kv.get("rope_low", 1)), high=float(kv.get("rope_high", 4)), orig=int(kv.get("rope_orig", 8192)))
    s["hd"] = s["hidden"] // s["heads"]
    return s


def shapes(s):
    C, hd, F, V = s["hidden"], s["hd"], s["ffn"], s["vocab"]
    out = [("model.embed_tokens.weight", [V, C])]
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [C]),
                (p + "self_attn.q_proj.weight", [s["heads"] * hd, C]),
                (p + "self_attn.k_proj.weight", [s["kv_heads"] * hd, C]),
                (p + "self_attn.v_proj.weight", [s["kv_heads"] * hd, C]),
                (p + "self_attn.o_proj.weight", [C, s["heads"] * hd]),
                (p + "post_attention_layernorm.weight", [C]),
                (p + "mlp.gate_proj.weight", [F, C]),
                (p + "mlp.up_proj.weight", [F, C]),
                (p + "mlp.down_proj.weight", [C, F])]
    out.append(("model.norm.weight", [C]))
    if not s["tied"]:
        out.append(("lm_head.weight", [V, C]))
    return out


# --- elements ------------------------------------------------------------------
def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def to_bf16(x):  # round to nearest even, as torch
    b = f32_bits(x)
    b += 0x7FFF + ((b >> 16) & 1)
    return (b >> 16) & 0xFFFF


def encode(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    return struct.pack("<%dH" % len(vals), *[to_bf16(v) for v in vals])


def decode(raw, dtype):
    if dtype == "F32":
        return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % (len(raw) // 2), raw))
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]


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
    rng = random.Random(int(opts.get("--seed", "1")))
    bad = opts.get("--bad", "")
    tensors = []
    for name, shape in shapes(s):
        n = math.prod(shape)
        vals = [1 + 0.1 * rng.gauss(0, 1) for _ in range(n)] if len(shape) == 1 else \
               [0.3 * rng.gauss(0, 1) for _ in range(n)]
        if bad == "shape" and name.endswith("layers.1.self_attn.k_proj.weight"):
            shape = [shape[0] + 1, shape[1]]
            vals += vals[: shape[1]]
        if bad == "nan" and name.endswith("layers.0.mlp.down_proj.weight"):
            vals[5] = float("nan")
        if bad == "missing" and name.endswith("layers.1.mlp.up_proj.weight"):
            continue
        tensors.append((name, dtype, shape, encode(vals, dtype)))
    if bad == "extra":
        tensors.append(("model.layers.0.self_attn.q_proj.bias", dtype, [4], encode([0.0] * 4, dtype)))
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
    rng = random.Random(int(args[4]) if len(args) > 4 else 3)
    toks = [rng.randrange(V) for _ in range(n)]
    h = [0] * 256
    h[0], h[1], h[2] = 20240520, 1, n
    open(path, "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % n, *toks))


# --- the forward, float64 -----------------------------------------------------------
def freqs(s):
    hd = s["hd"]
    f = [1.0 / s["theta"] ** (2 * i / hd) for i in range(hd // 2)]
    if s["scale"] == 0:
        return f
    low_wl, high_wl = s["orig"] / s["low"], s["orig"] / s["high"]
    out = []
    for x in f:
        wl = 2 * math.pi / x
        if wl < high_wl:
            out.append(x)
        elif wl > low_wl:
            out.append(x / s["scale"])
        else:
            sm = (s["orig"] / wl - s["low"]) / (s["high"] - s["low"])
            out.append((1 - sm) * x / s["scale"] + sm * x)
    return out


def matvec(W, x, out_dim, in_dim):  # W (out, in) flat
    return [sum(W[o * in_dim + i] * x[i] for i in range(in_dim)) for o in range(out_dim)]


def rms(x, g, eps):
    r = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [g[i] * (x[i] * r) for i in range(len(x))]


def rope(v, pos, heads, hd, f):
    half, out = hd // 2, list(v)
    for h in range(heads):
        b = h * hd
        for j in range(hd):
            a = pos * f[j % half]
            rot = -v[b + j + half] if j < half else v[b + j - half]
            out[b + j] = v[b + j] * math.cos(a) + rot * math.sin(a)
    return out


def cmd_loss(args):
    ck, s, tok_path, B, T = read_checkpoint(args[0]), parse_spec(args[1]), args[2], int(args[3]), int(args[4])
    W = {name: decode(raw, dt) for name, (dt, shape, raw) in ck.items()}
    raw = open(tok_path, "rb").read()
    toks = list(struct.unpack("<%dH" % (B * T + 1), raw[1024:1024 + 2 * (B * T + 1)]))
    C, H, KV, hd, F, V = s["hidden"], s["heads"], s["kv_heads"], s["hd"], s["ffn"], s["vocab"]
    f, total = freqs(s), 0.0
    for b in range(B):
        xs = [W["model.embed_tokens.weight"][toks[b * T + t] * C:(toks[b * T + t] + 1) * C] for t in range(T)]
        for l in range(s["layers"]):
            p = f"model.layers.{l}."
            hs = [rms(x, W[p + "input_layernorm.weight"], s["eps"]) for x in xs]
            q = [rope(matvec(W[p + "self_attn.q_proj.weight"], h, H * hd, C), t, H, hd, f) for t, h in enumerate(hs)]
            k = [rope(matvec(W[p + "self_attn.k_proj.weight"], h, KV * hd, C), t, KV, hd, f) for t, h in enumerate(hs)]
            v = [matvec(W[p + "self_attn.v_proj.weight"], h, KV * hd, C) for h in hs]
            for t in range(T):
                o = []
                for h in range(H):
                    g = h // (H // KV)
                    sc = [sum(q[t][h * hd + i] * k[t2][g * hd + i] for i in range(hd)) / math.sqrt(hd)
                          for t2 in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(x - m) for x in sc]
                    z = sum(e)
                    o += [sum(e[t2] / z * v[t2][g * hd + i] for t2 in range(t + 1)) for i in range(hd)]
                a = matvec(W[p + "self_attn.o_proj.weight"], o, C, H * hd)
                xs[t] = [xs[t][i] + a[i] for i in range(C)]
            for t in range(T):
                h2 = rms(xs[t], W[p + "post_attention_layernorm.weight"], s["eps"])
                gt = matvec(W[p + "mlp.gate_proj.weight"], h2, F, C)
                up = matvec(W[p + "mlp.up_proj.weight"], h2, F, C)
                act = [gt[i] / (1 + math.exp(-gt[i])) * up[i] for i in range(F)]
                d = matvec(W[p + "mlp.down_proj.weight"], act, C, F)
                xs[t] = [xs[t][i] + d[i] for i in range(C)]
        head = W["model.embed_tokens.weight" if s["tied"] else "lm_head.weight"]
        for t in range(T):
            h = rms(xs[t], W["model.norm.weight"], s["eps"])
            logits = matvec(head, h, V, C)
            m = max(logits)
            total += math.log(sum(math.exp(x - m) for x in logits)) + m - logits[toks[b * T + t + 1]]
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
