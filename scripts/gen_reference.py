#!/usr/bin/env python3
"""PyTorch reference for zinf's GPT parity test (like llm.c's train_gpt2.py).

    scripts/gen_reference.py [--bin DIR] [--out FILE]

    --bin DIR   folder holding zinf-shard (default: the repository's bin/)
    --out FILE  reference file to write (default: tests/data/gpt_tiny.ref)

Needs PyTorch and NumPy (Debian: apt-get install python3-torch); when the
python3 that runs the script cannot import torch, it re-runs itself under
/usr/bin/python3. Exits 66 when zinf-shard or torch is missing, 70 when a
check fails.

What it does:
  1. Runs `zinf-shard layout --model gpt:layers=2,hidden=48,heads=4,vocab=67,
     seq=16 --param-dtype fp32 --param cpu --optim cpu --seed 24301 |
     zinf-shard init --dir TMP` in a temporary folder and reads the "param"
     records of the manifest (fp32, dp=1) straight from the data files. The
     values come from zinf's counter-based generator keyed by the seed, so the
     C++ test regenerates exactly these weights with the same layout and init.
  2. Builds the batch: one draw of B*T+1 tokens from numpy's default_rng(1234),
     uniform in [0, V); as llm.c's loader lays them, inputs row b =
     toks[b*T : b*T+T], targets row b = toks[b*T+1 : b*T+T+1]. B=2, T=11
     (T < seq on purpose: wpe rows T..seq-1 get zero gradient).
  3. Forward of a pre-LayerNorm GPT-2 in fp32, exactly as zinf's C++ GPT:
       x = wte[tokens] + wpe[0..T-1]
       per block: x += attn(ln_1(x)); x += mlp(ln_2(x))
       logits = ln_f(x) @ wte^T (tied, no bias); loss = mean cross-entropy
     Linear weights have GPT-2's Conv1D layout (in, out) and are used as x @ W;
     qkv is split [q | k | v] along the last dim; causal softmax(q k^T/sqrt(hs));
     GELU is the tanh approximation; LayerNorm eps 1e-5; no dropout.
     Then the gradient of the mean loss with respect to every parameter.
  4. 10 steps of torch.optim.AdamW (lr 1e-3, betas (0.9, 0.95), eps 1e-8,
     weight decay 0.1 on the tensors with 2 or more dimensions and 0 on the
     1-D ones, no clipping, constant lr) on the same batch from the same
     initial weights; step k records the loss of the forward before its update.

File format (all little-endian):
  header    256 x int32
              [0] magic 0x5A494E46 ("ZINF")   [1] version 1
              [2] layers  [3] hidden  [4] heads  [5] vocab  [6] seq (max positions)
              [7] B  [8] T  [9] number of tensors  [10] number of AdamW steps
              [11] zinf-shard seed, low 32 bits  [12] seed, high 32 bits
              [13] lr  [14] beta1  [15] beta2  [16] eps  [17] weight_decay
                   (each the bits of a float32)
              [18] total number of parameters; the rest zero
  inputs    int32   (B*T)
  targets   int32   (B*T)
  logits    float32 (B*T*V)
  loss      float32 (1)
  grads     float32, for each tensor in execution order (the manifest's order:
            wte.weight (V,C), wpe.weight (seq,C), then per layer l
            h.l.ln_1.weight (C), h.l.ln_1.bias (C), h.l.attn.c_attn.weight (C,3C),
            h.l.attn.c_attn.bias (3C), h.l.attn.c_proj.weight (C,C),
            h.l.attn.c_proj.bias (C), h.l.ln_2.weight (C), h.l.ln_2.bias (C),
            h.l.mlp.c_fc.weight (C,4C), h.l.mlp.c_fc.bias (4C),
            h.l.mlp.c_proj.weight (4C,C), h.l.mlp.c_proj.bias (C),
            then ln_f.weight (C), ln_f.bias (C)), each numel values, row-major
  losses    float32 (number of AdamW steps)

The size is 4 * (256 + 2*B*T + B*T*V + 1 + parameters + steps) bytes; the script
re-reads the file, checks it against the header as a reader would, and prints
a summary (loss, first and last AdamW loss, size, sha256) on stderr.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

PROG = "gen_reference"

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") \
            and os.access("/usr/bin/python3", os.X_OK) and not os.environ.get("ZINF_GEN_REFERENCE_REEXEC"):
        os.environ["ZINF_GEN_REFERENCE_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    print(f"{PROG}: {e}: needs PyTorch and NumPy (Debian: apt-get install python3-torch)", file=sys.stderr)
    sys.exit(66)

# The model and the run; the C++ test reads them back from the header.
LAYERS, HIDDEN, HEADS, VOCAB, SEQ = 2, 48, 4, 67, 16
SEED = 24301              # zinf-shard --seed
B, T = 2, 11              # T < SEQ on purpose
DATA_SEED = 1234          # numpy default_rng for the tokens
STEPS = 10
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1
LN_EPS = 1e-5

MAGIC, VERSION, HEADER_INTS = 0x5A494E46, 1, 256


class Failure(Exception):
    def __init__(self, msg, code=70):
        super().__init__(msg)
        self.code = code


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def expected_tensors():
    """Names and shapes in execution order (the order of zinf's manifest)."""
    C = HIDDEN
    out = [("wte.weight", (VOCAB, C)), ("wpe.weight", (SEQ, C))]
    for l in range(LAYERS):
        p = f"h.{l}."
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def zinf_weights(bindir):
    """Runs zinf-shard layout | init in a temporary folder; returns [(name, ndarray)] in manifest order."""
    shard = os.path.join(bindir, "zinf-shard")
    if not (os.path.isfile(shard) and os.access(shard, os.X_OK)):
        raise Failure(f"{shard} is missing or not executable (build it: make bin/zinf-shard, or pass --bin DIR)", 66)
    model = f"gpt:layers={LAYERS},hidden={HIDDEN},heads={HEADS},vocab={VOCAB},seq={SEQ}"
    layout_cmd = [shard, "layout", "--model", model, "--param-dtype", "fp32", "--param", "cpu",
                  "--optim", "cpu", "--seed", str(SEED)]
    with tempfile.TemporaryDirectory(prefix="zinf-ref-") as tmp:
        data = os.path.join(tmp, "data")  # init creates it
        layout = subprocess.run(layout_cmd, capture_output=True)
        if layout.returncode != 0:
            raise Failure(f"{' '.join(layout_cmd)} failed ({layout.returncode}): {layout.stderr.decode().strip()}")
        init_cmd = [shard, "init", "--dir", data]
        init = subprocess.run(init_cmd, input=layout.stdout, capture_output=True)
        if init.returncode != 0:
            raise Failure(f"{' '.join(init_cmd)} failed ({init.returncode}): {init.stderr.decode().strip()}")
        lines = [json.loads(l) for l in init.stdout.decode().splitlines() if l.strip()]
        check(lines, "zinf-shard init wrote no manifest")
        head, recs = lines[0], lines[1:]
        check(head.get("dp") == 1, f"manifest dp {head.get('dp')}, expected 1")
        check(head.get("param_dtype") == "fp32", f"manifest param_dtype {head.get('param_dtype')}, expected fp32")
        check(head.get("seed") == SEED, f"manifest seed {head.get('seed')}, expected {SEED}")
        check(head.get("model") == model, f"manifest model {head.get('model')}, expected {model}")
        base = head.get("dir", data)
        out = []
        for r in recs:
            if r["state"] != "param":
                continue
            first, last = r["elements"]  # [first, last): last is one past the end
            numel = math.prod(r["shape"])
            check(r["dtype"] == "fp32", f"{r['tensor']}: dtype {r['dtype']}, expected fp32")
            check(first == 0 and last == numel, f"{r['tensor']}: elements {r['elements']} are not the whole tensor")
            check(r["bytes"] == 4 * numel, f"{r['tensor']}: {r['bytes']} bytes for {numel} fp32 values")
            path = os.path.join(base, r["file"])
            check(os.path.getsize(path) >= r["offset"] + r["bytes"], f"{path} is shorter than {r['tensor']}'s record")
            a = np.fromfile(path, dtype="<f4", count=numel, offset=r["offset"]).reshape(r["shape"])
            out.append((r["tensor"], a.astype(np.float32)))
        check(sum(a.size for _, a in out) == head.get("parameters"),
              f"param records hold {sum(a.size for _, a in out)} values, the header says {head.get('parameters')}")
    got = [(n, tuple(a.shape)) for n, a in out]
    check(got == expected_tensors(), f"zinf-shard's tensors differ from the expected GPT layout:\n  {got}")
    return out


def batch():
    toks = np.random.default_rng(DATA_SEED).integers(0, VOCAB, size=B * T + 1, dtype=np.int64)
    inputs = np.stack([toks[b * T: b * T + T] for b in range(B)])
    targets = np.stack([toks[b * T + 1: b * T + T + 1] for b in range(B)])
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def forward(P, idx, targets):
    """P: name -> tensor. Returns (logits (B,T,V), mean loss)."""
    Bs, Ts = idx.shape
    C, NH = HIDDEN, HEADS
    hs = C // NH
    x = P["wte.weight"][idx] + P["wpe.weight"][:Ts]
    mask = torch.ones(Ts, Ts, dtype=torch.bool).tril()
    for l in range(LAYERS):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], LN_EPS)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]          # (B,T,3C)
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bs, Ts, NH, hs).transpose(1, 2) for t in (q, k, v))     # (B,NH,T,hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(Bs, Ts, C)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], LN_EPS)
        h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], LN_EPS)
    logits = x @ P["wte.weight"].t()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def params_from(weights, dtype):
    return {n: torch.tensor(a, dtype=dtype).requires_grad_(True) for n, a in weights}


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write(path, weights, inputs, targets, logits, loss, grads, losses):
    nparams = sum(a.size for _, a in weights)
    h = np.zeros(HEADER_INTS, dtype="<u4")
    h[:19] = [MAGIC, VERSION, LAYERS, HIDDEN, HEADS, VOCAB, SEQ, B, T, len(weights), STEPS,
              SEED & 0xFFFFFFFF, SEED >> 32, f32_bits(LR), f32_bits(BETA1), f32_bits(BETA2),
              f32_bits(EPS), f32_bits(WEIGHT_DECAY), nparams]
    parts = [h, inputs.numpy().astype("<i4"), targets.numpy().astype("<i4"),
             logits.detach().numpy().astype("<f4"), np.array([loss], dtype="<f4")]
    parts += [grads[n].astype("<f4") for n, _ in weights]
    parts.append(np.array(losses, dtype="<f4"))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for p in parts:
            f.write(np.ascontiguousarray(p).tobytes())
    os.replace(tmp, path)


def reread(path, inputs, targets, loss, grads, names, losses):
    """Reads the file back as the C++ test would: header, then size, then a few values."""
    raw = open(path, "rb").read()
    check(len(raw) >= 4 * HEADER_INTS, f"{path}: {len(raw)} bytes, shorter than the header")
    h = np.frombuffer(raw[:4 * HEADER_INTS], dtype="<i4")
    check(h[0] == MAGIC and h[1] == VERSION, f"{path}: bad magic {h[0]:#x} or version {h[1]}")
    Bs, Ts, V, ntens, steps, nparams = int(h[7]), int(h[8]), int(h[5]), int(h[9]), int(h[10]), int(h[18])
    want = 4 * (HEADER_INTS + 2 * Bs * Ts + Bs * Ts * V + 1 + nparams + steps)
    check(len(raw) == want, f"{path}: {len(raw)} bytes, the header implies {want}")
    check(ntens == len(names) and steps == len(losses), f"{path}: header counts differ")
    body = np.frombuffer(raw[4 * HEADER_INTS:], dtype="<u4")
    o = 0
    def take(n, dt):
        nonlocal o
        a = body[o:o + n].view(dt)
        o += n
        return a
    check(np.array_equal(take(Bs * Ts, "<i4"), inputs.numpy().ravel()), "inputs differ on re-read")
    check(np.array_equal(take(Bs * Ts, "<i4"), targets.numpy().ravel()), "targets differ on re-read")
    take(Bs * Ts * V, "<f4")
    check(take(1, "<f4")[0] == np.float32(loss), "loss differs on re-read")
    for n in names:
        check(np.array_equal(take(grads[n].size, "<f4"), grads[n].ravel()), f"{n}'s gradient differs on re-read")
    check(np.array_equal(take(steps, "<f4"), np.array(losses, dtype=np.float32)), "losses differ on re-read")
    check(o == len(body), "trailing values on re-read")
    return len(raw), hashlib.sha256(raw).hexdigest()


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Writes the PyTorch reference for zinf's GPT parity test.")
    ap.add_argument("--bin", default=os.path.join(root, "bin"), help="folder holding zinf-shard (default: %(default)s)")
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "gpt_tiny.ref"),
                    help="reference file to write (default: %(default)s)")
    args = ap.parse_args()

    torch.manual_seed(0)  # nothing here is random; fixed anyway
    torch.set_num_threads(1)  # one summation order, so reruns give the same bytes
    torch.use_deterministic_algorithms(True)

    weights = zinf_weights(args.bin)
    names = [n for n, _ in weights]
    inputs, targets = batch()

    # 1. Forward and backward from the initial weights.
    P = params_from(weights, torch.float32)
    logits, loss = forward(P, inputs, targets)
    loss.backward()
    grads = {n: P[n].grad.detach().numpy().copy() for n in names}
    loss0 = loss.item()

    # Sanity checks: small init -> loss near ln(V); fp32 gradients agree with fp64;
    # the unused wpe rows get no gradient.
    check(abs(loss0 - math.log(VOCAB)) < 0.1, f"initial loss {loss0:.4f} is far from ln({VOCAB}) = {math.log(VOCAB):.4f}")
    P64 = params_from(weights, torch.float64)
    logits64, loss64 = forward(P64, inputs, targets)
    loss64.backward()
    check(abs(loss64.item() - loss0) < 1e-5, f"fp32 loss {loss0} differs from fp64 {loss64.item()}")
    check(torch.allclose(logits.double(), logits64, rtol=1e-4, atol=1e-5), "fp32 logits differ from fp64")
    worst = 0.0
    for n in names:
        g64 = P64[n].grad.numpy()
        err = float(np.abs(grads[n] - g64).max()) / max(float(np.abs(g64).max()), 1e-12)
        worst = max(worst, err)
        check(err < 1e-3, f"{n}: fp32 gradient differs from fp64 by {err:.2e} of its largest value")
    check(not grads["wpe.weight"][T:].any(), "wpe rows T.. have a nonzero gradient")
    check(grads["wpe.weight"][:T].any(axis=1).all(), "a used wpe row has zero gradient")

    # 2. AdamW on the same batch, from the same initial weights.
    P = params_from(weights, torch.float32)
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = forward(P, inputs, targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    check(np.float32(losses[0]) == np.float32(loss0), f"step 1 loss {losses[0]} differs from the forward's {loss0}")
    check(all(b < a for a, b in zip(losses, losses[1:])), f"AdamW losses do not fall: {losses}")

    write(args.out, weights, inputs, targets, logits.reshape(B * T, VOCAB), loss0, grads, losses)
    size, sha = reread(args.out, inputs, targets, loss0, grads, names, losses)

    print(f"{PROG}: {len(names)} tensors, {sum(a.size for _, a in weights)} parameters, B={B} T={T}", file=sys.stderr)
    print(f"{PROG}: loss {loss0:.6f} (ln {VOCAB} = {math.log(VOCAB):.6f}); fp32 vs fp64 gradients within {worst:.1e}",
          file=sys.stderr)
    print(f"{PROG}: AdamW losses step 1 {losses[0]:.6f} .. step {STEPS} {losses[-1]:.6f}", file=sys.stderr)
    print(f"{PROG}: wrote {args.out}: {size} bytes, sha256 {sha}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        sys.exit(e.code)
