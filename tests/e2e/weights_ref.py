#!/usr/bin/python3
"""The references of tests/e2e/weights.sh, written with numpy alone and none of
zinf's code: writers of the files zinf-shard import reads (Hugging Face
safetensors, llm.c's checkpoint, llm.c's token file), readers of the files
zinf-shard export writes, the values a manifest must hold after an import,
and a float64 GPT-2 forward (GELU's tanh form, LayerNorm eps 1e-5, wte tied).

  weights_ref.py safetensors OUT SPEC SEED TRUTH [--prefix] [--dtype F32|F16|BF16|mixed]
  weights_ref.py llmc OUT SPEC SEED TRUTH [--version 3|5] [--padded-vocab VP]
  weights_ref.py tokens OUT N SEED VOCAB
  weights_ref.py check MANIFEST TRUTH
  weights_ref.py read-safetensors FILE TRUTH [--bf16]  (exported values == TRUTH)
  weights_ref.py read-llmc FILE TRUTH
  weights_ref.py loss TRUTH SPEC TOKENS B T       (prints the loss of batch 0)
  weights_ref.py COMMAND ARGS... + COMMAND ARGS...  (several in one run)

TRUTH ("-": none) is an .npz of every model tensor as fp32, zinf's names and shapes
(Conv1D weights (in, out)): what the master state must hold.
"""
import json
import struct
import sys

import numpy as np


def parse_spec(spec):
    kv = dict(item.split("=") for item in spec.split(":", 1)[1].split(","))
    return {k: int(v) for k, v in kv.items()}


def shapes(s):
    L, C, V, T = s["layers"], s["hidden"], s["vocab"], s["seq"]
    out = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for l in range(L):
        h = f"h.{l}."
        out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                (h + "attn.c_attn.weight", (C, 3 * C)), (h + "attn.c_attn.bias", (3 * C,)),
                (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                (h + "mlp.c_fc.weight", (C, 4 * C)), (h + "mlp.c_fc.bias", (4 * C,)),
                (h + "mlp.c_proj.weight", (4 * C, C)), (h + "mlp.c_proj.bias", (C,))]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def random_weights(s, seed):
    """fp32 values with every element distinct in practice; LayerNorm weights near 1."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in shapes(s):
        v = rng.standard_normal(shape) * 0.1
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            v += 1.0
        w[name] = v.astype(np.float32)
    return w


def bf16_bits(a):
    """fp32 -> bf16 bits, rounded to nearest even (no NaNs here)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode(a, dtype):
    """(bytes in the file, the fp32 value they hold)"""
    if dtype == "F32":
        return a.astype("<f4").tobytes(), a.astype(np.float32)
    if dtype == "F16":
        h = a.astype("<f2")
        return h.tobytes(), h.astype(np.float32)
    b = bf16_bits(a)
    return b.astype("<u2").tobytes(), from_bf16(b)


def write_safetensors(path, items, metadata=None):
    """items: (name, dtype, shape, bytes). The data in reverse order of the
    header's entries, so a reader that follows the header's order, not the
    offsets, reads the wrong bytes; no padding, so the data starts unaligned."""
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, data in reversed(items):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header = dict(reversed(list(header.items())))
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_safetensors(out, spec, seed, truth, prefix=False, dtype="mixed"):
    s = parse_spec(spec)
    w = random_weights(s, seed)
    kinds = ["F32", "F16", "BF16"]
    items, held = [], {}
    for i, (name, shape) in enumerate(shapes(s)):
        dt = kinds[i % 3] if dtype == "mixed" else dtype
        data, value = encode(w[name], dt)
        held[name] = value
        items.append((("transformer." if prefix else "") + name, dt, shape, data))
    # GPT-2's causal-mask buffer, which checkpoints carry and import leaves out.
    T = s["seq"]
    items.insert(3, ("h.0.attn.bias", "F32", (1, 1, T, T), np.tril(np.ones((1, 1, T, T), np.float32)).tobytes()))
    write_safetensors(out, items, {"format": "pt"})
    if truth != "-":
        np.savez(truth, **held)


def make_llmc(out, spec, seed, truth, version=3, padded_vocab=None):
    s = parse_spec(spec)
    L, C, V, T = s["layers"], s["hidden"], s["vocab"], s["seq"]
    Vp = padded_vocab or (V + 127) // 128 * 128
    w = random_weights(s, seed)
    if version == 5:
        w = {k: from_bf16(bf16_bits(v)) for k, v in w.items()}
    rng = np.random.default_rng(seed + 1)
    wte = np.concatenate([w["wte.weight"], rng.standard_normal((Vp - V, C)).astype(np.float32)])  # padding: not zero
    def layers(suffix, transpose=False):
        return np.stack([w[f"h.{l}.{suffix}"].T if transpose else w[f"h.{l}.{suffix}"] for l in range(L)])
    arrays = [wte, w["wpe.weight"], layers("ln_1.weight"), layers("ln_1.bias"),
              layers("attn.c_attn.weight", True), layers("attn.c_attn.bias"),
              layers("attn.c_proj.weight", True), layers("attn.c_proj.bias"),
              layers("ln_2.weight"), layers("ln_2.bias"),
              layers("mlp.c_fc.weight", True), layers("mlp.c_fc.bias"),
              layers("mlp.c_proj.weight", True), layers("mlp.c_proj.bias"),
              w["ln_f.weight"], w["ln_f.bias"]]
    header = np.zeros(256, "<i4")
    header[:8] = [20240326, version, T, V, L, s["heads"], C, Vp]
    with open(out, "wb") as f:
        f.write(header.tobytes())
        for a in arrays:
            f.write(bf16_bits(a).astype("<u2").tobytes() if version == 5 else a.astype("<f4").tobytes())
    np.savez(truth, **w)


def make_tokens(out, n, seed, vocab):
    toks = np.random.default_rng(seed).integers(0, vocab, n).astype("<u2")
    header = np.zeros(256, "<i4")
    header[:3] = [20240520, 1, n]
    with open(out, "wb") as f:
        f.write(header.tobytes() + toks.tobytes())


def check(manifest, truth):
    """Every tensor of the manifest (tiles too), param and master, against
    TRUTH, read from the partitions' files as the manifest places them."""
    want = np.load(truth)
    lines = [json.loads(l) for l in open(manifest)]
    head, recs = lines[0], lines[1:]
    K = head.get("tile", 1)
    got, shapes_of = {}, {}
    for r in sorted(recs, key=lambda r: r["rank"]):
        if r["state"] not in ("param", "master"):
            continue
        size = 2 if r["dtype"] == "bf16" else 4
        with open(head["dir"] + "/" + r["file"], "rb") as f:
            f.seek(r["offset"])
            first, last = r["elements"]
            data = f.read((last - first) * size)
        got[(r["tensor"], r["state"])] = got.get((r["tensor"], r["state"]), b"") + data
        shapes_of[(r["tensor"], r["state"])] = (tuple(r["shape"]), r["dtype"])
    bad = []
    for (name, state), data in sorted(got.items()):
        shape, dtype = shapes_of[(name, state)]
        key, v = name, None
        if ".tile" in name:
            key, k = name.rsplit(".tile", 1)
            k, out = int(k), want[key].shape[1]
            v = want[key][:, out * k // K:out * (k + 1) // K]
        else:
            v = want[key]
        exp = bf16_bits(v).astype("<u2").tobytes() if dtype == "bf16" else np.ascontiguousarray(v, "<f4").tobytes()
        if v.shape != shape or data != exp:
            bad.append(f"{name} {state}")
    tensors = {r["tensor"] for r in recs}
    if bad or len(got) != len(tensors) * len([s for s in head["states"] if s in ("param", "master")]):
        print("values differ: " + ", ".join(bad), file=sys.stderr)
        sys.exit(1)


def read_safetensors(path, truth, bf16=False):
    """The file holds TRUTH's tensors (rounded to bf16 and stored BF16 with --bf16)."""
    want = np.load(truth)
    want = {k: from_bf16(bf16_bits(want[k])) if bf16 else want[k] for k in want.files}
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    ok = sorted(names) == sorted(want)
    for k in names:
        e = header[k]
        b = data[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "F32" and not bf16:
            v = np.frombuffer(b, "<f4")
        elif e["dtype"] == "BF16" and bf16:
            v = from_bf16(np.frombuffer(b, "<u2"))
        else:
            ok = False
            continue
        ok = ok and tuple(e["shape"]) == want[k].shape and np.array_equal(v.reshape(want[k].shape), want[k])
    sys.exit(0 if ok else 1)


def read_llmc(path, truth):
    want = np.load(truth)
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], "<i4")
    magic, version, T, V, L, NH, C, Vp = (int(x) for x in h[:8])
    vals = np.frombuffer(raw[1024:], "<f4")
    ok = magic == 20240326 and version == 3 and Vp % 128 == 0 and Vp >= V
    at = 0
    def take(shape):
        nonlocal at
        n = int(np.prod(shape))
        a = vals[at:at + n].reshape(shape)
        at += n
        return a
    wte = take((Vp, C))
    ok = ok and np.array_equal(wte[:V], want["wte.weight"]) and not wte[V:].any()
    ok = ok and np.array_equal(take((T, C)), want["wpe.weight"])
    for suffix, shape, tr in [("ln_1.weight", (C,), False), ("ln_1.bias", (C,), False),
                              ("attn.c_attn.weight", (3 * C, C), True), ("attn.c_attn.bias", (3 * C,), False),
                              ("attn.c_proj.weight", (C, C), True), ("attn.c_proj.bias", (C,), False),
                              ("ln_2.weight", (C,), False), ("ln_2.bias", (C,), False),
                              ("mlp.c_fc.weight", (4 * C, C), True), ("mlp.c_fc.bias", (4 * C,), False),
                              ("mlp.c_proj.weight", (C, 4 * C), True), ("mlp.c_proj.bias", (C,), False)]:
        a = take((L,) + shape)
        for l in range(L):
            ok = ok and np.array_equal(a[l].T if tr else a[l], want[f"h.{l}.{suffix}"])
    ok = ok and np.array_equal(take((C,)), want["ln_f.weight"]) and np.array_equal(take((C,)), want["ln_f.bias"])
    sys.exit(0 if ok and at == vals.size else 1)


def forward_loss(W, s, inp, tgt):
    """GPT-2's mean cross-entropy over (B, T), in float64."""
    W = {k: W[k].astype(np.float64) for k in W.files}
    C, NH = s["hidden"], s["heads"]
    B, T = inp.shape
    hs = C // NH

    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    x = W["wte.weight"][inp] + W["wpe.weight"][:T]
    future = np.triu(np.ones((T, T), bool), 1)
    for l in range(s["layers"]):
        h = f"h.{l}."
        a = ln(x, W[h + "ln_1.weight"], W[h + "ln_1.bias"])
        q, k, v = np.split(a @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"], 3, axis=-1)
        q, k, v = (t.reshape(B, T, NH, hs).transpose(0, 2, 1, 3) for t in (q, k, v))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
        att[..., future] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
        m = ln(x, W[h + "ln_2.weight"], W[h + "ln_2.bias"])
        x = x + gelu(m @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"]) @ W[h + "mlp.c_proj.weight"] \
            + W[h + "mlp.c_proj.bias"]
    x = ln(x, W["ln_f.weight"], W["ln_f.bias"])
    logits = x @ W["wte.weight"].T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, tgt[..., None], -1).mean()


def main(a):
    cmd = a[0]
    if cmd == "safetensors":
        dtype = a[a.index("--dtype") + 1] if "--dtype" in a else "mixed"
        make_safetensors(a[1], a[2], int(a[3]), a[4], "--prefix" in a, dtype)
    elif cmd == "llmc":
        version = int(a[a.index("--version") + 1]) if "--version" in a else 3
        vp = int(a[a.index("--padded-vocab") + 1]) if "--padded-vocab" in a else None
        make_llmc(a[1], a[2], int(a[3]), a[4], version, vp)
    elif cmd == "tokens":
        make_tokens(a[1], int(a[2]), int(a[3]), int(a[4]))
    elif cmd == "check":
        check(a[1], a[2])
    elif cmd == "read-safetensors":
        read_safetensors(a[1], a[2], "--bf16" in a)
    elif cmd == "read-llmc":
        read_llmc(a[1], a[2])
    elif cmd == "loss":
        s = parse_spec(a[2])
        B, T = int(a[4]), int(a[5])
        toks = np.frombuffer(open(a[3], "rb").read()[1024:], "<u2").astype(np.int64)
        print(repr(float(forward_loss(np.load(a[1]), s, toks[:B * T].reshape(B, T), toks[1:B * T + 1].reshape(B, T)))))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    # Several commands joined by "+", in one interpreter (numpy takes a while to start).
    args, cmd = sys.argv[1:] + ["+"], []
    for x in args:
        if x == "+":
            main(cmd)
            cmd = []
        else:
            cmd.append(x)
