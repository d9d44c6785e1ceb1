// What one call of each kernel costs at the least: its FLOPs and the bytes it
// must read and write (profile.hpp says how they are counted). One formula
// per kernels.def entry, in the entry's order; a new kernel gets its formula
// here or the library does not link (cost::<name> is declared from the list).
#include <zinf/profile.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace zinf::device::cost {

namespace {

double d(u64 x) { return static_cast<double>(x); }
// Bytes an element of a view takes as stored.
double width(ConstView v) { return v.is_bf16() ? 2.0 : 4.0; }
// Query-key pairs a causal attention head forms over T positions.
double causal_pairs(u64 T) { return d(T) * d(T + 1) / 2; }

}  // namespace

// ---- linear -------------------------------------------------------------------
// 2 m n k a matrix; A and B read once at their width, C written (and read
// when beta != 0: C += ...).
Cost gemm(Gemm g, ConstView a, ConstView b, View c) {
    const double per = 2.0 * d(g.m) * d(g.n) * d(g.k);
    const double c_bytes = width(ConstView(c)) * d(g.m) * d(g.n) * (g.beta != 0 ? 2 : 1);
    const double bytes = d(g.m) * d(g.k) * width(a) + d(g.k) * d(g.n) * width(b) + c_bytes;
    return {.flops = per * d(g.batch), .bytes = bytes * d(g.batch), .detail = gemm_detail(g, a.dtype(), b.dtype())};
}
// The epilogues' GEMMs: the GEMM's matrix FLOPs alone (the epilogue's
// element work, 1 to 10 FLOPs an element of C beside the GEMM's 2k, is
// left out, so that the GEMM rows' FLOPs are the model's matrix FLOPs),
// and the bytes the epilogue moves beside the GEMM's: the bias read; pre
// and out written; dbias read and written.
Cost gemm_bias(Gemm g, ConstView a, ConstView b, std::span<const float>, View c) {
    Cost k = gemm(g, a, b, c);
    k.bytes += 4.0 * d(g.n);
    return k;
}
Cost gemm_bias_gelu(Gemm g, ConstView a, ConstView b, std::span<const float>, View pre, View out) {
    Cost k = gemm(g, a, b, pre);
    k.bytes += 4.0 * d(g.n) + width(ConstView(out)) * d(g.m) * d(g.n);
    return k;
}
Cost gemm_dbias(Gemm g, ConstView a, ConstView b, View c, std::span<float> dbias, bool) {
    Cost k = gemm(g, a, b, c);
    k.bytes += 8.0 * d(dbias.size());
    return k;
}
Cost bias_add(std::span<float>, std::span<const float>, u64 N, u64 OC) {
    return {.flops = d(N) * d(OC), .bytes = 4.0 * (2.0 * d(N) * d(OC) + d(OC))};
}
Cost bias_backward(std::span<float>, std::span<const float>, u64 N, u64 OC) {
    return {.flops = d(N) * d(OC), .bytes = 4.0 * (d(N) * d(OC) + 2.0 * d(OC))};
}

// ---- embedding -------------------------------------------------------------------
// A lookup (no FLOPs) plus the position row's add; the position table read once.
Cost embedding_forward(std::span<float>, std::span<const std::int32_t>, ConstView wte, ConstView wpe, u64 B, u64 T,
                       u64 C, u64) {
    const double N = d(B * T);
    const bool pos = !wpe.empty();
    return {.flops = pos ? N * d(C) : 0.0,
            .bytes = 4.0 * N + N * d(C) * width(wte) + (pos ? d(T) * d(C) * width(wpe) : 0.0) + 4.0 * N * d(C)};
}
Cost embedding_backward(std::span<float>, std::span<float> dwpe, std::span<const float>,
                        std::span<const std::int32_t>, u64 B, u64 T, u64 C, u64) {
    const double N = d(B * T);
    const bool pos = !dwpe.empty();
    return {.flops = N * d(C) * (pos ? 2 : 1),
            .bytes = 4.0 * (N + N * d(C) + 2.0 * N * d(C) + (pos ? 2.0 * d(T) * d(C) : 0.0))};
}

// ---- norms ---------------------------------------------------------------------------
// LayerNorm forward: the mean's add, the centring, the variance's
// multiply-add, the scale by rstd, w's multiply and b's add: 7 an element.
Cost layernorm_forward(std::span<float>, std::span<float>, std::span<float>, std::span<const float>,
                       std::span<const float>, std::span<const float>, u64 N, u64 C) {
    return {.flops = 7.0 * d(N) * d(C), .bytes = 4.0 * (2.0 * d(N) * d(C) + 2.0 * d(C) + 2.0 * d(N))};
}
// The residual's add first: 8; res read and written, add read, the kept
// copy written where there is one.
Cost residual_layernorm_forward(std::span<float>, std::span<float>, std::span<float>, std::span<float>,
                                std::span<const float>, View kept, std::span<const float>, std::span<const float>,
                                u64 N, u64 C) {
    const double NC = d(N) * d(C);
    return {.flops = 8.0 * NC, .bytes = 4.0 * (4.0 * NC + 2.0 * d(C) + 2.0 * d(N)) + 2.0 * d(kept.size())};
}
// Backward: x-hat (2), dout w (1), the two row sums (3), dw and db (3), dinp
// (4 and its +=): 14 an element; dinp, dw and db accumulate.
Cost layernorm_backward(std::span<float>, std::span<float>, std::span<float>, std::span<const float>, ConstView inp,
                        std::span<const float>, std::span<const float>, std::span<const float>, u64 N, u64 C) {
    const double NC = d(N) * d(C);
    return {.flops = 14.0 * NC,
            .bytes = 4.0 * NC + NC * width(inp) + 8.0 * NC + 4.0 * (4.0 * d(C) + d(C) + 2.0 * d(N))};
}
// RMSNorm: the square's multiply-add, rstd's scale and w's multiply: 4.
Cost rmsnorm_forward(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>, u64 N,
                     u64 C, float) {
    return {.flops = 4.0 * d(N) * d(C), .bytes = 4.0 * (2.0 * d(N) * d(C) + d(C) + d(N))};
}
// The residual's add first: 5; res read and written.
Cost residual_rmsnorm_forward(std::span<float>, std::span<float>, std::span<float>, std::span<const float>,
                              std::span<const float>, u64 N, u64 C, float) {
    return {.flops = 5.0 * d(N) * d(C), .bytes = 4.0 * (4.0 * d(N) * d(C) + d(C) + d(N))};
}
// Backward: x-hat (1), dout w (1), the row sum (2), dw (2), dinp (3): 9.
Cost rmsnorm_backward(std::span<float>, std::span<float>, std::span<const float>, ConstView inp,
                      std::span<const float>, std::span<const float>, u64 N, u64 C) {
    const double NC = d(N) * d(C);
    return {.flops = 9.0 * NC, .bytes = 4.0 * NC + NC * width(inp) + 8.0 * NC + 4.0 * (3.0 * d(C) + d(N))};
}

// ---- element-wise ------------------------------------------------------------------------
// GELU, tanh form: x^3 (2), its multiply-add (2), the scale (1), tanh (1),
// 1 + (1), 0.5 x (2): 9.
Cost gelu_forward(View out, ConstView inp) {
    return {.flops = 9.0 * d(out.size()), .bytes = d(out.size()) * (width(inp) + width(ConstView(out)))};
}
// Its derivative (tanh, sech^2 and the polynomial's: 15) times dout (1).
Cost gelu_backward(std::span<float> dinp, ConstView inp, std::span<const float>) {
    return {.flops = 16.0 * d(dinp.size()), .bytes = d(dinp.size()) * (width(inp) + 8.0)};
}
// silu(gate) (exp, add, divide: 3, with the multiply by gate 4) times up: 5.
Cost swiglu_forward(View out, ConstView gate, ConstView up) {
    return {.flops = 5.0 * d(out.size()), .bytes = d(out.size()) * (width(gate) + width(up) + width(ConstView(out)))};
}
// silu and its derivative (7), times dout and up (3): 10.
Cost swiglu_backward(std::span<float> dgate, std::span<float>, std::span<const float>, ConstView gate, ConstView up) {
    return {.flops = 10.0 * d(dgate.size()), .bytes = d(dgate.size()) * (4.0 + width(gate) + width(up) + 8.0)};
}
Cost residual_forward(std::span<float> out, std::span<const float>, std::span<const float>) {
    return {.flops = d(out.size()), .bytes = 12.0 * d(out.size())};
}
Cost accumulate(std::span<float> acc, std::span<const float>) {
    return {.flops = d(acc.size()), .bytes = 12.0 * d(acc.size())};
}
Cost cast(View dst, ConstView src) { return {.flops = 0, .bytes = d(dst.size()) * (width(ConstView(dst)) + width(src))}; }

// ---- attention ------------------------------------------------------------------------------
// Forward: per head and causal query-key pair, the score's hd multiply-adds
// and the value's: 4 hd. Backward: dP, dV, dQ and dK: 8 hd. The model's
// count (model.hpp's flops_per_step).
Cost attention_forward(std::span<float>, std::span<float>, std::span<const float>, u64 B, u64 T, u64 C, u64 NH) {
    const double hd = d(C) / d(NH), att = d(B) * d(NH) * d(T) * d(T);
    return {.flops = 4.0 * hd * causal_pairs(T) * d(B) * d(NH),
            .bytes = 4.0 * (d(B * T) * 3.0 * d(C) + d(B * T) * d(C) + att)};
}
Cost attention_backward(std::span<float>, std::span<float>, std::span<const float>, ConstView qkv, ConstView att,
                        u64 B, u64 T, u64 C, u64 NH) {
    const double hd = d(C) / d(NH), A = d(B) * d(NH) * d(T) * d(T), BT = d(B * T);
    return {.flops = 8.0 * hd * causal_pairs(T) * d(B) * d(NH),
            .bytes = 4.0 * BT * d(C) + BT * 3.0 * d(C) * width(qkv) + A * width(att) + 8.0 * A + 4.0 * BT * 3.0 * d(C)};
}
Cost attention_decode(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>,
                      std::span<const float>, u64 T, u64 C, u64 NH) {
    return {.flops = 4.0 * d(C) * d(T), .bytes = 4.0 * (2.0 * d(C) + 2.0 * d(T) * d(C) + d(NH) * d(T))};
}
Cost gqa_forward(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>,
                 std::span<const float>, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const double BT = d(B * T), q = BT * d(NH) * d(hd), kv = BT * d(KVH) * d(hd);
    return {.flops = 4.0 * d(hd) * causal_pairs(T) * d(B) * d(NH),
            .bytes = 4.0 * (2.0 * q + 2.0 * kv + d(B) * d(NH) * d(T) * d(T))};
}
Cost gqa_backward(std::span<float>, std::span<float>, std::span<float>, std::span<float>, std::span<const float>,
                  ConstView q, ConstView k, ConstView v, ConstView att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const double BT = d(B * T), nq = BT * d(NH) * d(hd), nkv = BT * d(KVH) * d(hd);
    const double A = d(B) * d(NH) * d(T) * d(T);
    return {.flops = 8.0 * d(hd) * causal_pairs(T) * d(B) * d(NH),
            .bytes = 8.0 * nq + 8.0 * nkv + nq * width(q) + nkv * (width(k) + width(v)) + A * width(att) + 8.0 * A};
}
Cost gqa_decode(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>,
                std::span<const float>, u64 T, u64 NH, u64 KVH, u64 hd) {
    return {.flops = 4.0 * d(NH) * d(hd) * d(T),
            .bytes = 4.0 * (2.0 * d(NH) * d(hd) + 2.0 * d(T) * d(KVH) * d(hd) + d(NH) * d(T))};
}
// ---- flash attention ------------------------------------------------------------------
// The model's FLOPs, as the GEMM path's (4 hd a causal pair forward, 8 hd
// backward): the backward's recomputation of S and dP (in both its dQ and
// its dK/dV pass: 6 hd more a pair) is not counted, so that the profile's
// FLOP/s of the two paths compare. Bytes: q, k, v and out once, lse; the
// backward dO, out, delta and the gradients. Nothing T x T.
Cost flash_attention_forward(std::span<float>, std::span<float>, std::span<const float>, u64 B, u64 T, u64 C,
                             u64 NH) {
    const double hd = d(C) / d(NH), BT = d(B * T);
    return {.flops = 4.0 * hd * causal_pairs(T) * d(B) * d(NH),
            .bytes = 4.0 * (BT * 3.0 * d(C) + BT * d(C) + d(B) * d(NH) * d(T))};
}
Cost flash_attention_backward(std::span<float>, std::span<float>, std::span<const float>, ConstView qkv,
                              ConstView out, std::span<const float>, u64 B, u64 T, u64 C, u64 NH) {
    const double hd = d(C) / d(NH), BT = d(B * T), rows = d(B) * d(NH) * d(T);
    return {.flops = 8.0 * hd * causal_pairs(T) * d(B) * d(NH),
            .bytes = BT * 3.0 * d(C) * width(qkv) + BT * d(C) * width(out) + 4.0 * BT * d(C) + 12.0 * rows +
                     4.0 * BT * 3.0 * d(C)};
}
Cost flash_gqa_forward(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>,
                       std::span<const float>, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const double BT = d(B * T), q = BT * d(NH) * d(hd), kv = BT * d(KVH) * d(hd);
    return {.flops = 4.0 * d(hd) * causal_pairs(T) * d(B) * d(NH),
            .bytes = 4.0 * (2.0 * q + 2.0 * kv + d(B) * d(NH) * d(T))};
}
Cost flash_gqa_backward(std::span<float>, std::span<float>, std::span<float>, std::span<float>,
                        std::span<const float>, ConstView q, ConstView k, ConstView v, ConstView out,
                        std::span<const float>, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const double BT = d(B * T), nq = BT * d(NH) * d(hd), nkv = BT * d(KVH) * d(hd), rows = d(B) * d(NH) * d(T);
    return {.flops = 8.0 * d(hd) * causal_pairs(T) * d(B) * d(NH),
            .bytes = 8.0 * nq + 8.0 * nkv + nq * (width(q) + width(out)) + nkv * (width(k) + width(v)) + 12.0 * rows};
}
// A pair turned: two multiplies and an add an element; x read and written,
// the table's rows of the T positions read.
Cost rope_forward(std::span<float>, std::span<const float>, u64 B, u64 T, u64 H, u64 hd, u64) {
    const double n = d(B * T) * d(H) * d(hd);
    return {.flops = 3.0 * n, .bytes = 8.0 * n + 4.0 * d(T) * d(hd)};
}
Cost rope_backward(std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    return rope_forward(dx, table, B, T, H, hd, pos0);
}

// ---- loss -------------------------------------------------------------------------------------
// The fused classifier (loss.cpp): a pass for the row's max and the sum of
// its shifted exponentials (4 an element), a pass that writes the gradient
// (exponential, normalise, subtract the one-hot, scale: 4; fp32 keeps the
// exponentials in the row between the two, bf16 recomputes them). Bytes:
// the V logits read twice at their width and the gradient written over
// them, the pad written (zeros); the targets read, the losses written. The
// forward alone reads the logits once.
Cost crossentropy_forward_backward(std::span<float>, View logits, std::span<const std::int32_t>, float, u64 N, u64 V,
                                   u64 ldl) {
    const double w = width(logits), pad = d(logits_stride(ldl, V) - V);
    return {.flops = 8.0 * d(N) * d(V), .bytes = d(N) * (3.0 * d(V) * w + pad * w) + 8.0 * d(N)};
}
Cost crossentropy_forward(std::span<float>, ConstView logits, std::span<const std::int32_t>, u64 N, u64 V, u64) {
    return {.flops = 4.0 * d(N) * d(V), .bytes = d(N) * d(V) * width(logits) + 8.0 * d(N)};
}

// ---- optimizer ------------------------------------------------------------------------------------
// AdamW an element: the two moments (3 and 4), their bias corrections (2),
// sqrt and eps (2), the ratio (1), decay and step (4): 16. The master and
// both moments read and written, the gradient read, the working copy written.
Cost adamw(const optim::Update& u, const optim::Scalars&) {
    const double n = d(u.size());
    const double grad = u.grad_bf16.empty() ? 4.0 : 2.0;
    const double param = (u.param_f32.empty() ? 0.0 : 4.0) + (u.param_bf16.empty() ? 0.0 : 2.0);
    return {.flops = 16.0 * n, .bytes = n * (24.0 + grad + param)};
}

}  // namespace zinf::device::cost

namespace zinf::device {

std::string gemm_detail(const Gemm& g, DType a, DType b) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%llux%llux%llu %c %c x%llu %s %s %s", static_cast<unsigned long long>(g.m),
                  static_cast<unsigned long long>(g.n), static_cast<unsigned long long>(g.k), g.ta ? 'T' : 'N',
                  g.tb ? 'T' : 'N', static_cast<unsigned long long>(g.batch), precision_name(g.inputs),
                  dtype_name(a), dtype_name(b));
    return buf;
}

std::optional<GemmShape> gemm_of_detail(std::string_view detail) {
    unsigned long long m = 0, n = 0, k = 0, batch = 0;
    char ta = 0, tb = 0, inputs[8] = {}, da[8] = {}, db[8] = {};
    int used = 0;
    const std::string text(detail);
    if (std::sscanf(text.c_str(), "%llux%llux%llu %c %c x%llu %7s %7s %7s%n", &m, &n, &k, &ta, &tb, &batch, inputs,
                    da, db, &used) != 9 ||
        static_cast<std::size_t>(used) != text.size())
        return std::nullopt;
    auto dtype = [](std::string_view t) -> std::optional<DType> {
        if (t == "fp32") return DType::f32;
        if (t == "bf16") return DType::bf16;
        return std::nullopt;
    };
    const auto a = dtype(da), b = dtype(db);
    const std::string_view in(inputs);
    if (!a || !b || (ta != 'N' && ta != 'T') || (tb != 'N' && tb != 'T') || (in != "fp32" && in != "bf16") ||
        !m || !n || !k || !batch)
        return std::nullopt;
    GemmShape s;
    s.g = Gemm{.ta = ta == 'T', .tb = tb == 'T', .m = m, .n = n, .k = k, .batch = batch,
               .inputs = in == "bf16" ? Precision::bf16 : Precision::fp32};
    s.a = *a;
    s.b = *b;
    return s;
}

}  // namespace zinf::device
