// Every backend's span checks, once (device.hpp: each kernel's public call
// checks its spans on the caller's thread, then hands them to the backend's
// do_ virtual): a span shorter than its shape needs is an InternalError at
// once, naming the kernel, its dimensions and the span (shape.hpp).
#include <zinf/device.hpp>

#include "kernels.hpp"
#include "shape.hpp"

#include <initializer_list>
#include <utility>

namespace zinf::device {

using u64 = std::uint64_t;

namespace {
// An element-wise kernel's inputs, each as long as the span it writes (n).
void need_elementwise(const char* kernel, u64 n, std::initializer_list<std::pair<const char*, std::size_t>> spans) {
    const Shape sh{kernel, {{"n", n}}};
    for (const auto& [name, size] : spans) sh.need(name, size, n);
}

// Grouped-query attention's q (B,T,NH*hd), k and v (B,T,KVH*hd) and att
// (B,NH,T,T), or (`grad`) their gradients of the same shapes.
void need_gqa(const Shape& sh, bool grad, std::size_t q, std::size_t k, std::size_t v, std::size_t att, u64 B, u64 T,
              u64 NH, u64 KVH, u64 hd) {
    check_groups(sh, NH, KVH, hd);
    sh.need(grad ? "dq" : "q", q, B * T * NH * hd);
    sh.need(grad ? "dk" : "k", k, B * T * KVH * hd);
    sh.need(grad ? "dv" : "v", v, B * T * KVH * hd);
    sh.need(grad ? "datt" : "att", att, B * NH * T * T);
}
// RMSNorm's forward: out and the input (`inp`, or the residual `res`) (N,C),
// rstd (N), w (C).
void need_rmsnorm(const Shape& sh, std::size_t out, std::size_t rstd, const char* input, std::size_t inp,
                  std::size_t w, u64 N, u64 C) {
    sh.need("out", out, N * C);
    sh.need("rstd", rstd, N);
    sh.need(input, inp, N * C);
    sh.need("w", w, C);
}
// embedding_forward's spans, whatever the tables' dtype (no wpe: none).
void need_embedding(std::size_t out, std::size_t tokens, std::size_t wte, std::size_t wpe, u64 B, u64 T, u64 C,
                    u64 V) {
    const Shape sh{"embedding_forward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}}};
    sh.need("out", out, B * T * C);
    sh.need("tokens", tokens, B * T);
    sh.need("wte", wte, V * C);
    if (wpe) sh.need("wpe", wpe, T * C);
}
}  // namespace

void Device::copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) {
    Shape{"copy", {}}.need("dst", dst.size(), src.size());
    do_copy(s, dst, src);
}

void Device::copy_rows(Stream& s, std::span<float> dst, u64 ld_dst, std::span<const float> src, u64 ld_src, u64 rows,
                       u64 cols) {
    const Shape sh{"copy_rows", {{"rows", rows}, {"cols", cols}, {"ld_dst", ld_dst}, {"ld_src", ld_src}}};
    if (ld_dst < cols || ld_src < cols) sh.fail("a row stride is less than cols");
    if (!rows || !cols) return;
    sh.need("dst", dst.size(), (rows - 1) * ld_dst + cols);
    sh.need("src", src.size(), (rows - 1) * ld_src + cols);
    do_copy_rows(s, dst, ld_dst, src, ld_src, rows, cols);
}

void Device::gemm(Stream& s, const Gemm& g, std::span<const float> a, std::span<const float> b, std::span<float> c) {
    const Gemm r = cpu::resolve(g);
    Shape sh{"gemm", {{"m", r.m}, {"n", r.n}, {"k", r.k}, {"batch", r.batch}}};
    sh.need("A", a.size(), cpu::gemm_extent_a(r));
    sh.need("B", b.size(), cpu::gemm_extent_b(r));
    sh.need("C", c.size(), cpu::gemm_extent_c(r));
    do_gemm(s, r, a, b, c);
}

namespace {
// A GEMM with a bf16 operand (`which`: "A" or "B"), resolved and checked:
// bf16 inputs, one product, and each span as long as the shape reaches.
Gemm checked_bf16_gemm(const Gemm& g, const char* which, std::size_t a, std::size_t b, std::size_t c) {
    const Gemm r = cpu::resolve(g);
    Shape sh{"gemm", {{"m", r.m}, {"n", r.n}, {"k", r.k}, {"batch", r.batch}}};
    if (r.inputs != Precision::bf16) sh.fail(std::string("a bf16 ") + which + " needs bf16 inputs");
    if (r.batch != 1) sh.fail(std::string("a bf16 ") + which + " takes one product");
    sh.need("A", a, cpu::gemm_extent_a(r));
    sh.need("B", b, cpu::gemm_extent_b(r));
    sh.need("C", c, cpu::gemm_extent_c(r));
    return r;
}
}  // namespace

void Device::gemm(Stream& s, const Gemm& g, std::span<const float> a, std::span<const std::uint16_t> b,
                  std::span<float> c) {
    do_gemm_bf16(s, checked_bf16_gemm(g, "B", a.size(), b.size(), c.size()), a, b, c);
}

void Device::gemm(Stream& s, const Gemm& g, std::span<const float> a, const Weight& b, std::span<float> c) {
    if (b.is_bf16()) return gemm(s, g, a, b.bf16, c);
    gemm(s, g, a, b.f32, c);
}

void Device::gemm(Stream& s, const Gemm& g, const Weight& a, const Weight& b, std::span<float> c) {
    if (!a.is_bf16()) return gemm(s, g, a.f32, b, c);
    do_gemm_bf16a(s, checked_bf16_gemm(g, "A", a.size(), b.size(), c.size()), a.bf16, b, c);
}

void Device::bias_add(Stream& s, std::span<float> out, std::span<const float> bias, u64 N, u64 OC) {
    Shape sh{"bias_add", {{"N", N}, {"OC", OC}}};
    sh.need("out", out.size(), N * OC);
    sh.need("bias", bias.size(), OC);
    do_bias_add(s, out, bias, N, OC);
}

void Device::bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) {
    Shape sh{"bias_backward", {{"N", N}, {"OC", OC}}};
    sh.need("dbias", dbias.size(), OC);
    sh.need("dout", dout.size(), N * OC);
    do_bias_backward(s, dbias, dout, N, OC);
}

void Device::embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                               std::span<const float> wte, std::span<const float> wpe, u64 B, u64 T, u64 C, u64 V) {
    need_embedding(out.size(), tokens.size(), wte.size(), wpe.size(), B, T, C, V);
    do_embedding_forward(s, out, tokens, wte, wpe, B, T, C, V);
}

void Device::embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                               std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe, u64 B, u64 T,
                               u64 C, u64 V) {
    need_embedding(out.size(), tokens.size(), wte.size(), wpe.size(), B, T, C, V);
    do_embedding_forward_bf16(s, out, tokens, wte, wpe, B, T, C, V);
}

void Device::embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                               const Weight& wte, const Weight& wpe, u64 B, u64 T, u64 C, u64 V) {
    if (wpe.size() && wpe.is_bf16() != wte.is_bf16())
        Shape{"embedding_forward", {}}.fail("wte and wpe stored in different dtypes");
    if (wte.is_bf16()) return embedding_forward(s, out, tokens, wte.bf16, wpe.bf16, B, T, C, V);
    embedding_forward(s, out, tokens, wte.f32, wpe.f32, B, T, C, V);
}

void Device::embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                                std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) {
    Shape sh{"embedding_backward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}}};
    sh.need("dwte", dwte.size(), V * C);
    if (!dwpe.empty()) sh.need("dwpe", dwpe.size(), T * C);
    sh.need("dout", dout.size(), B * T * C);
    sh.need("tokens", tokens.size(), B * T);
    do_embedding_backward(s, dwte, dwpe, dout, tokens, B, T, C, V);
}

void Device::layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                               std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N,
                               u64 C) {
    Shape sh{"layernorm_forward", {{"N", N}, {"C", C}}};
    sh.need("out", out.size(), N * C);
    sh.need("mean", mean.size(), N);
    sh.need("rstd", rstd.size(), N);
    sh.need("inp", inp.size(), N * C);
    sh.need("w", w.size(), C);
    sh.need("b", b.size(), C);
    do_layernorm_forward(s, out, mean, rstd, inp, w, b, N, C);
}

namespace {
// layernorm_backward's spans, whatever inp's dtype.
void need_layernorm_backward(std::size_t dinp, std::size_t dw, std::size_t db, std::size_t dout, std::size_t inp,
                             std::size_t w, std::size_t mean, std::size_t rstd, u64 N, u64 C) {
    Shape sh{"layernorm_backward", {{"N", N}, {"C", C}}};
    sh.need("dinp", dinp, N * C);
    sh.need("dw", dw, C);
    sh.need("db", db, C);
    sh.need("dout", dout, N * C);
    sh.need("inp", inp, N * C);
    sh.need("w", w, C);
    sh.need("mean", mean, N);
    sh.need("rstd", rstd, N);
}
}  // namespace

void Device::layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                                std::span<const float> dout, std::span<const float> inp, std::span<const float> w,
                                std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
    need_layernorm_backward(dinp.size(), dw.size(), db.size(), dout.size(), inp.size(), w.size(), mean.size(),
                            rstd.size(), N, C);
    do_layernorm_backward(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void Device::layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                                std::span<const float> dout, std::span<const std::uint16_t> inp,
                                std::span<const float> w, std::span<const float> mean, std::span<const float> rstd,
                                u64 N, u64 C) {
    need_layernorm_backward(dinp.size(), dw.size(), db.size(), dout.size(), inp.size(), w.size(), mean.size(),
                            rstd.size(), N, C);
    do_layernorm_backward_bf16(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void Device::gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp) {
    need_elementwise("gelu_forward", out.size(), {{"inp", inp.size()}});
    do_gelu_forward(s, out, inp);
}

void Device::gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp, std::span<const float> dout) {
    need_elementwise("gelu_backward", dinp.size(), {{"inp", inp.size()}, {"dout", dout.size()}});
    do_gelu_backward(s, dinp, inp, dout);
}

void Device::gelu_forward(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> inp) {
    need_elementwise("gelu_forward", out.size(), {{"inp", inp.size()}});
    do_gelu_forward_bf16(s, out, inp);
}

void Device::gelu_backward(Stream& s, std::span<float> dinp, std::span<const std::uint16_t> inp,
                           std::span<const float> dout) {
    need_elementwise("gelu_backward", dinp.size(), {{"inp", inp.size()}, {"dout", dout.size()}});
    do_gelu_backward_bf16(s, dinp, inp, dout);
}

void Device::attention_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B,
                               u64 T, u64 C, u64 NH) {
    Shape sh{"attention_forward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("out", out.size(), B * T * C);
    sh.need("att", att.size(), B * NH * T * T);
    sh.need("qkv", qkv.size(), B * T * 3 * C);
    do_attention_forward(s, out, att, qkv, B, T, C, NH);
}

namespace {
// attention_backward's spans, whatever qkv's and att's dtype.
void need_attention_backward(std::size_t dqkv, std::size_t datt, std::size_t dout, std::size_t qkv, std::size_t att,
                             u64 B, u64 T, u64 C, u64 NH) {
    Shape sh{"attention_backward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("dqkv", dqkv, B * T * 3 * C);
    sh.need("datt", datt, B * NH * T * T);
    sh.need("dout", dout, B * T * C);
    sh.need("qkv", qkv, B * T * 3 * C);
    sh.need("att", att, B * NH * T * T);
}
}  // namespace

void Device::attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                                std::span<const float> qkv, std::span<const float> att, u64 B, u64 T, u64 C, u64 NH) {
    need_attention_backward(dqkv.size(), datt.size(), dout.size(), qkv.size(), att.size(), B, T, C, NH);
    do_attention_backward(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void Device::attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                                std::span<const std::uint16_t> qkv, std::span<const std::uint16_t> att, u64 B, u64 T,
                                u64 C, u64 NH) {
    need_attention_backward(dqkv.size(), datt.size(), dout.size(), qkv.size(), att.size(), B, T, C, NH);
    do_attention_backward_bf16(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void Device::attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                              std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) {
    Shape sh{"attention_decode", {{"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("out", out.size(), C);
    sh.need("att", att.size(), NH * T);
    sh.need("q", q.size(), C);
    sh.need("k", k.size(), T * C);
    sh.need("v", v.size(), T * C);
    do_attention_decode(s, out, att, q, k, v, T, C, NH);
}

void Device::rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                             std::span<const float> w, u64 N, u64 C, float eps) {
    need_rmsnorm(Shape{"rmsnorm_forward", {{"N", N}, {"C", C}}}, out.size(), rstd.size(), "inp", inp.size(),
                 w.size(), N, C);
    // Read, never written: no `add`.
    do_rmsnorm_forward(s, out, rstd, {const_cast<float*>(inp.data()), inp.size()}, {}, w, N, C, eps);
}

void Device::residual_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<float> res,
                                      std::span<const float> add, std::span<const float> w, u64 N, u64 C, float eps) {
    const Shape sh{"residual_rmsnorm_forward", {{"N", N}, {"C", C}}};
    need_rmsnorm(sh, out.size(), rstd.size(), "res", res.size(), w.size(), N, C);
    sh.need("add", add.size(), N * C);
    if (N && C) do_rmsnorm_forward(s, out, rstd, res, add, w, N, C, eps);
}

namespace {
// rmsnorm_backward's spans, whatever inp's dtype.
void need_rmsnorm_backward(std::size_t dinp, std::size_t dw, std::size_t dout, std::size_t inp, std::size_t w,
                           std::size_t rstd, u64 N, u64 C) {
    Shape sh{"rmsnorm_backward", {{"N", N}, {"C", C}}};
    sh.need("dinp", dinp, N * C);
    sh.need("dw", dw, C);
    sh.need("dout", dout, N * C);
    sh.need("inp", inp, N * C);
    sh.need("w", w, C);
    sh.need("rstd", rstd, N);
}
}  // namespace

void Device::rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                              std::span<const float> inp, std::span<const float> w, std::span<const float> rstd, u64 N,
                              u64 C) {
    need_rmsnorm_backward(dinp.size(), dw.size(), dout.size(), inp.size(), w.size(), rstd.size(), N, C);
    do_rmsnorm_backward(s, dinp, dw, dout, inp, w, rstd, N, C);
}

void Device::rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                              std::span<const std::uint16_t> inp, std::span<const float> w,
                              std::span<const float> rstd, u64 N, u64 C) {
    need_rmsnorm_backward(dinp.size(), dw.size(), dout.size(), inp.size(), w.size(), rstd.size(), N, C);
    do_rmsnorm_backward_bf16(s, dinp, dw, dout, inp, w, rstd, N, C);
}

void Device::swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate, std::span<const float> up) {
    need_elementwise("swiglu_forward", out.size(), {{"gate", gate.size()}, {"up", up.size()}});
    do_swiglu_forward(s, out, gate, up);
}

void Device::swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                             std::span<const float> gate, std::span<const float> up) {
    need_elementwise("swiglu_backward", dgate.size(),
                     {{"dup", dup.size()}, {"dout", dout.size()}, {"gate", gate.size()}, {"up", up.size()}});
    do_swiglu_backward(s, dgate, dup, dout, gate, up);
}

void Device::swiglu_forward(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> gate,
                            std::span<const std::uint16_t> up) {
    need_elementwise("swiglu_forward", out.size(), {{"gate", gate.size()}, {"up", up.size()}});
    do_swiglu_forward_bf16(s, out, gate, up);
}

void Device::swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                             std::span<const std::uint16_t> gate, std::span<const std::uint16_t> up) {
    need_elementwise("swiglu_backward", dgate.size(),
                     {{"dup", dup.size()}, {"dout", dout.size()}, {"gate", gate.size()}, {"up", up.size()}});
    do_swiglu_backward_bf16(s, dgate, dup, dout, gate, up);
}

void Device::gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    Shape sh{"gqa_forward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    need_gqa(sh, false, q.size(), k.size(), v.size(), att.size(), B, T, NH, KVH, hd);
    sh.need("out", out.size(), B * T * NH * hd);
    do_gqa_forward(s, out, att, q, k, v, B, T, NH, KVH, hd);
}

namespace {
// gqa_backward's spans, whatever q's, k's, v's and att's dtype.
void need_gqa_backward(std::size_t dq, std::size_t dk, std::size_t dv, std::size_t datt, std::size_t dout,
                       std::size_t q, std::size_t k, std::size_t v, std::size_t att, u64 B, u64 T, u64 NH, u64 KVH,
                       u64 hd) {
    Shape sh{"gqa_backward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    need_gqa(sh, true, dq, dk, dv, datt, B, T, NH, KVH, hd);
    need_gqa(sh, false, q, k, v, att, B, T, NH, KVH, hd);
    sh.need("dout", dout, B * T * NH * hd);
}
}  // namespace

void Device::gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                          std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                          std::span<const float> k, std::span<const float> v, std::span<const float> att, u64 B, u64 T,
                          u64 NH, u64 KVH, u64 hd) {
    need_gqa_backward(dq.size(), dk.size(), dv.size(), datt.size(), dout.size(), q.size(), k.size(), v.size(),
                      att.size(), B, T, NH, KVH, hd);
    do_gqa_backward(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
}

void Device::gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                          std::span<float> datt, std::span<const float> dout, std::span<const std::uint16_t> q,
                          std::span<const std::uint16_t> k, std::span<const std::uint16_t> v,
                          std::span<const std::uint16_t> att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    need_gqa_backward(dq.size(), dk.size(), dv.size(), datt.size(), dout.size(), q.size(), k.size(), v.size(),
                      att.size(), B, T, NH, KVH, hd);
    do_gqa_backward_bf16(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
}

void Device::gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    Shape sh{"gqa_decode", {{"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    check_groups(sh, NH, KVH, hd);
    if (T == 0) sh.fail("no positions");
    sh.need("out", out.size(), NH * hd);
    sh.need("att", att.size(), NH * T);
    sh.need("q", q.size(), NH * hd);
    sh.need("k", k.size(), T * KVH * hd);
    sh.need("v", v.size(), T * KVH * hd);
    do_gqa_decode(s, out, att, q, k, v, T, NH, KVH, hd);
}

void Device::crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                           std::span<const std::int32_t> targets, float dloss, u64 N, u64 V) {
    Shape sh{"crossentropy_forward_backward", {{"N", N}, {"V", V}}};
    sh.need("losses", losses.size(), N);
    sh.need("logits", logits.size(), N * V);
    sh.need("targets", targets.size(), N);
    do_crossentropy_forward_backward(s, losses, logits, targets, dloss, N, V);
}

void Device::crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                                  std::span<const std::int32_t> targets, u64 N, u64 V) {
    Shape sh{"crossentropy_forward", {{"N", N}, {"V", V}}};
    sh.need("losses", losses.size(), N);
    sh.need("logits", logits.size(), N * V);
    sh.need("targets", targets.size(), N);
    do_crossentropy_forward(s, losses, logits, targets, N, V);
}

void Device::residual_forward(Stream& s, std::span<float> out, std::span<const float> a, std::span<const float> b) {
    need_elementwise("residual_forward", out.size(), {{"a", a.size()}, {"b", b.size()}});
    do_residual_forward(s, out, a, b);
}

void Device::accumulate(Stream& s, std::span<float> acc, std::span<const float> x) {
    need_elementwise("accumulate", acc.size(), {{"x", x.size()}});
    do_accumulate(s, acc, x);
}

void Device::cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src) {
    need_elementwise("cast to bf16", dst.size(), {{"src", src.size()}});
    do_cast(s, dst, src);
}

void Device::cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src) {
    need_elementwise("cast from bf16", dst.size(), {{"src", src.size()}});
    do_cast(s, dst, src);
}

void Device::adamw(Stream& s, const optim::Update& u, const optim::Scalars& k) {
    u.check();
    do_adamw(s, u, k);
}

void Device::rope_forward(Stream& s, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                          u64 pos0) {
    check_rope_spans("rope_forward", x, table, B, T, H, hd, pos0);
    do_rope(s, x, table, B, T, H, hd, pos0, false);
}

void Device::rope_backward(Stream& s, std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                           u64 pos0) {
    check_rope_spans("rope_backward", dx, table, B, T, H, hd, pos0);
    do_rope(s, dx, table, B, T, H, hd, pos0, true);
}

void Device::check_rope_spans(const char* kernel, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H,
                              u64 hd, u64 pos0) {
    Shape sh{kernel, {{"B", B}, {"T", T}, {"H", H}, {"hd", hd}, {"pos0", pos0}}};
    check_rope(sh, hd);
    sh.need("x", x.size(), B * T * H * hd);
    sh.need("table", table.size(), (pos0 + T) * hd);
}

}  // namespace zinf::device
