// Every backend's checks, once: each public kernel (kernels.def) runs its
// check_<name> here on the caller's thread, then hands its arguments to the
// backend's do_<name>. A span shorter than its shape needs, or stored in an
// element type the kernel does not take, is an InternalError at once, naming
// the kernel, its dimensions and the span (shape.hpp).
#include <zinf/device.hpp>
#include <zinf/profile.hpp>

#include "kernels.hpp"
#include "shape.hpp"

#include <initializer_list>
#include <string>
#include <utility>

namespace zinf::device {

const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }

namespace {

// A named view of the call, for the checks of its element type.
struct Named {
    const char* name;
    ConstView view;
};

// `v` stored fp32: a kernel that computes on it takes nothing else.
void need_f32(const Shape& sh, Named v) {
    if (v.view.is_bf16()) sh.fail(std::string(v.name) + " is bf16; the kernel takes it fp32");
}

// Views of one activation, or an output and its input, stored alike.
void same_dtype(const Shape& sh, std::initializer_list<Named> vs) {
    const Named& first = *vs.begin();
    for (const Named& v : vs)
        if (v.view.dtype() != first.view.dtype())
            sh.fail(std::string(v.name) + " is " + dtype_name(v.view.dtype()) + " and " + first.name + " " +
                    dtype_name(first.view.dtype()) + "; the kernel takes them stored alike");
}

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

// ---- linear ------------------------------------------------------------------
// Resolves g in place (the backends get every stride filled in). An operand
// stored bf16 needs bf16 inputs and one product; a bf16 C beta 0 and one
// product.
void need_gemm(const char* kernel, Gemm& g, ConstView a, ConstView b, ConstView c) {
    g = cpu::resolve(g);
    const Shape sh{kernel, {{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}}};
    if (a.is_bf16() || b.is_bf16()) {
        const std::string which = a.is_bf16() ? "A" : "B";
        if (g.inputs != Precision::bf16) sh.fail("a bf16 " + which + " needs bf16 inputs");
        if (g.batch != 1) sh.fail("a bf16 " + which + " takes one product");
    }
    if (c.is_bf16() && (g.beta != 0 || g.batch != 1)) sh.fail("a bf16 C takes beta 0 and one product");
    sh.need("A", a.size(), cpu::gemm_extent_a(g));
    sh.need("B", b.size(), cpu::gemm_extent_b(g));
    sh.need("C", c.size(), cpu::gemm_extent_c(g));
}

void check_gemm(Gemm& g, ConstView a, ConstView b, View c) { need_gemm("gemm", g, a, b, c); }

// The epilogues' GEMMs: one product.
void need_one_product(const char* kernel, const Gemm& g) {
    if (g.batch != 1) Shape{kernel, {{"batch", g.batch}}}.fail("an epilogue's GEMM takes one product");
}

void check_gemm_bias(Gemm& g, ConstView a, ConstView b, std::span<const float> bias, View c) {
    need_one_product("gemm_bias", g);
    need_gemm("gemm_bias", g, a, b, c);
    Shape{"gemm_bias", {{"n", g.n}}}.need("bias", bias.size(), g.n);
}

void check_gemm_bias_gelu(Gemm& g, ConstView a, ConstView b, std::span<const float> bias, View pre, View out) {
    need_one_product("gemm_bias_gelu", g);
    need_gemm("gemm_bias_gelu", g, a, b, pre);
    const Shape sh{"gemm_bias_gelu", {{"m", g.m}, {"n", g.n}}};
    if (g.alpha != 1 || g.beta != 0) sh.fail("alpha 1 and beta 0 only");
    same_dtype(sh, {{"pre", pre}, {"out", out}});
    sh.need("bias", bias.size(), g.n);
    sh.need("out", out.size(), cpu::gemm_extent_c(g));
}

void check_gemm_dbias(Gemm& g, ConstView a, ConstView b, View c, std::span<float> dbias, bool of_a) {
    need_one_product("gemm_dbias", g);
    need_gemm("gemm_dbias", g, a, b, c);
    const Shape sh{"gemm_dbias", {{"m", g.m}, {"n", g.n}, {"k", g.k}}};
    need_f32(sh, {"C", c});
    if (of_a) {
        if (!g.ta) sh.fail("the bias's gradient from A needs A stored (k,m) (ta)");
        need_f32(sh, {"A", a});
        sh.need("dbias", dbias.size(), g.m);
    } else {
        if (g.tb) sh.fail("the bias's gradient from B needs B stored (k,n) (not tb)");
        need_f32(sh, {"B", b});
        sh.need("dbias", dbias.size(), g.n);
    }
}

void check_bias_add(std::span<float> out, std::span<const float> bias, u64 N, u64 OC) {
    const Shape sh{"bias_add", {{"N", N}, {"OC", OC}}};
    sh.need("out", out.size(), N * OC);
    sh.need("bias", bias.size(), OC);
}

void check_bias_backward(std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) {
    const Shape sh{"bias_backward", {{"N", N}, {"OC", OC}}};
    sh.need("dbias", dbias.size(), OC);
    sh.need("dout", dout.size(), N * OC);
}

// ---- embedding ---------------------------------------------------------------
void check_embedding_forward(std::span<float> out, std::span<const std::int32_t> tokens, ConstView wte,
                             ConstView wpe, u64 B, u64 T, u64 C, u64 V) {
    if (!wpe.empty() && wpe.dtype() != wte.dtype())
        Shape{"embedding_forward", {}}.fail("wte and wpe stored in different dtypes");
    const Shape sh{"embedding_forward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}}};
    sh.need("out", out.size(), B * T * C);
    sh.need("tokens", tokens.size(), B * T);
    sh.need("wte", wte.size(), V * C);
    if (!wpe.empty()) sh.need("wpe", wpe.size(), T * C);
}

void check_embedding_backward(std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                              std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) {
    const Shape sh{"embedding_backward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}}};
    sh.need("dwte", dwte.size(), V * C);
    if (!dwpe.empty()) sh.need("dwpe", dwpe.size(), T * C);
    sh.need("dout", dout.size(), B * T * C);
    sh.need("tokens", tokens.size(), B * T);
}

// ---- norms -------------------------------------------------------------------
// LayerNorm's forward: out and the input (`inp`, or the residual `res`)
// (N,C), mean and rstd (N), w and b (C).
void need_layernorm(const Shape& sh, std::size_t out, std::size_t mean, std::size_t rstd, const char* input,
                    std::size_t inp, std::size_t w, std::size_t b, u64 N, u64 C) {
    sh.need("out", out, N * C);
    sh.need("mean", mean, N);
    sh.need("rstd", rstd, N);
    sh.need(input, inp, N * C);
    sh.need("w", w, C);
    sh.need("b", b, C);
}

void check_layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                             std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N,
                             u64 C) {
    need_layernorm(Shape{"layernorm_forward", {{"N", N}, {"C", C}}}, out.size(), mean.size(), rstd.size(), "inp",
                   inp.size(), w.size(), b.size(), N, C);
}

void check_residual_layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                      std::span<float> res, std::span<const float> add, View kept,
                                      std::span<const float> w, std::span<const float> b, u64 N, u64 C) {
    const Shape sh{"residual_layernorm_forward", {{"N", N}, {"C", C}}};
    need_layernorm(sh, out.size(), mean.size(), rstd.size(), "res", res.size(), w.size(), b.size(), N, C);
    sh.need("add", add.size(), N * C);
    if (!kept.empty()) {
        if (!kept.is_bf16()) sh.fail("kept is fp32; the kernel keeps the residual bf16 or not at all");
        sh.need("kept", kept.size(), N * C);
    }
}

void check_layernorm_backward(std::span<float> dinp, std::span<float> dw, std::span<float> db,
                              std::span<const float> dout, ConstView inp, std::span<const float> w,
                              std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
    const Shape sh{"layernorm_backward", {{"N", N}, {"C", C}}};
    sh.need("dinp", dinp.size(), N * C);
    sh.need("dw", dw.size(), C);
    sh.need("db", db.size(), C);
    sh.need("dout", dout.size(), N * C);
    sh.need("inp", inp.size(), N * C);
    sh.need("w", w.size(), C);
    sh.need("mean", mean.size(), N);
    sh.need("rstd", rstd.size(), N);
}

void check_rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                           std::span<const float> w, u64 N, u64 C, float) {
    need_rmsnorm(Shape{"rmsnorm_forward", {{"N", N}, {"C", C}}}, out.size(), rstd.size(), "inp", inp.size(),
                 w.size(), N, C);
}

void check_residual_rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<float> res,
                                    std::span<const float> add, std::span<const float> w, u64 N, u64 C, float) {
    const Shape sh{"residual_rmsnorm_forward", {{"N", N}, {"C", C}}};
    need_rmsnorm(sh, out.size(), rstd.size(), "res", res.size(), w.size(), N, C);
    sh.need("add", add.size(), N * C);
}

void check_rmsnorm_backward(std::span<float> dinp, std::span<float> dw, std::span<const float> dout, ConstView inp,
                            std::span<const float> w, std::span<const float> rstd, u64 N, u64 C) {
    const Shape sh{"rmsnorm_backward", {{"N", N}, {"C", C}}};
    sh.need("dinp", dinp.size(), N * C);
    sh.need("dw", dw.size(), C);
    sh.need("dout", dout.size(), N * C);
    sh.need("inp", inp.size(), N * C);
    sh.need("w", w.size(), C);
    sh.need("rstd", rstd.size(), N);
}

// ---- element-wise --------------------------------------------------------------
void check_gelu_forward(View out, ConstView inp) {
    same_dtype(Shape{"gelu_forward", {}}, {{"out", out}, {"inp", inp}});
    need_elementwise("gelu_forward", out.size(), {{"inp", inp.size()}});
}

void check_gelu_backward(std::span<float> dinp, ConstView inp, std::span<const float> dout) {
    need_elementwise("gelu_backward", dinp.size(), {{"inp", inp.size()}, {"dout", dout.size()}});
}

void check_swiglu_forward(View out, ConstView gate, ConstView up) {
    same_dtype(Shape{"swiglu_forward", {}}, {{"out", out}, {"gate", gate}, {"up", up}});
    need_elementwise("swiglu_forward", out.size(), {{"gate", gate.size()}, {"up", up.size()}});
}

void check_swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout, ConstView gate,
                           ConstView up) {
    same_dtype(Shape{"swiglu_backward", {}}, {{"gate", gate}, {"up", up}});
    need_elementwise("swiglu_backward", dgate.size(),
                     {{"dup", dup.size()}, {"dout", dout.size()}, {"gate", gate.size()}, {"up", up.size()}});
}

void check_residual_forward(std::span<float> out, std::span<const float> a, std::span<const float> b) {
    need_elementwise("residual_forward", out.size(), {{"a", a.size()}, {"b", b.size()}});
}

void check_accumulate(std::span<float> acc, std::span<const float> x) {
    need_elementwise("accumulate", acc.size(), {{"x", x.size()}});
}

void check_cast(View dst, ConstView src) {
    const char* kernel = dst.is_bf16() ? "cast to bf16" : "cast from bf16";
    if (dst.dtype() == src.dtype())
        Shape{kernel, {}}.fail("dst and src are both " + std::string(dtype_name(dst.dtype())));
    need_elementwise(kernel, dst.size(), {{"src", src.size()}});
}

// ---- attention -----------------------------------------------------------------
void check_attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B, u64 T,
                             u64 C, u64 NH) {
    const Shape sh{"attention_forward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("out", out.size(), B * T * C);
    sh.need("att", att.size(), B * NH * T * T);
    sh.need("qkv", qkv.size(), B * T * 3 * C);
}

void check_attention_backward(std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                              ConstView qkv, ConstView att, u64 B, u64 T, u64 C, u64 NH) {
    const Shape sh{"attention_backward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    same_dtype(sh, {{"qkv", qkv}, {"att", att}});
    check_heads(sh, C, NH);
    sh.need("dqkv", dqkv.size(), B * T * 3 * C);
    sh.need("datt", datt.size(), B * NH * T * T);
    sh.need("dout", dout.size(), B * T * C);
    sh.need("qkv", qkv.size(), B * T * 3 * C);
    sh.need("att", att.size(), B * NH * T * T);
}

void check_attention_decode(std::span<float> out, std::span<float> att, std::span<const float> q,
                            std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) {
    const Shape sh{"attention_decode", {{"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("out", out.size(), C);
    sh.need("att", att.size(), NH * T);
    sh.need("q", q.size(), C);
    sh.need("k", k.size(), T * C);
    sh.need("v", v.size(), T * C);
}

void check_gqa_forward(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const Shape sh{"gqa_forward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    need_gqa(sh, false, q.size(), k.size(), v.size(), att.size(), B, T, NH, KVH, hd);
    sh.need("out", out.size(), B * T * NH * hd);
}

void check_gqa_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv, std::span<float> datt,
                        std::span<const float> dout, ConstView q, ConstView k, ConstView v, ConstView att, u64 B,
                        u64 T, u64 NH, u64 KVH, u64 hd) {
    const Shape sh{"gqa_backward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    same_dtype(sh, {{"q", q}, {"k", k}, {"v", v}, {"att", att}});
    need_gqa(sh, true, dq.size(), dk.size(), dv.size(), datt.size(), B, T, NH, KVH, hd);
    need_gqa(sh, false, q.size(), k.size(), v.size(), att.size(), B, T, NH, KVH, hd);
    sh.need("dout", dout.size(), B * T * NH * hd);
}

void check_gqa_decode(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    const Shape sh{"gqa_decode", {{"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    check_groups(sh, NH, KVH, hd);
    if (T == 0) sh.fail("no positions");
    sh.need("out", out.size(), NH * hd);
    sh.need("att", att.size(), NH * T);
    sh.need("q", q.size(), NH * hd);
    sh.need("k", k.size(), T * KVH * hd);
    sh.need("v", v.size(), T * KVH * hd);
}

// Both turns of the rotary embedding: x (B,T,H,hd), table (pos0 + T, hd).
void need_rope(const char* kernel, std::size_t x, std::size_t table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    const Shape sh{kernel, {{"B", B}, {"T", T}, {"H", H}, {"hd", hd}, {"pos0", pos0}}};
    check_rope(sh, hd);
    sh.need("x", x, B * T * H * hd);
    sh.need("table", table, (pos0 + T) * hd);
}

// ---- flash attention (kernels.def: flash_*) ---------------------------------------
void check_flash_attention_forward(std::span<float> out, std::span<float> lse, std::span<const float> qkv, u64 B,
                                   u64 T, u64 C, u64 NH) {
    const Shape sh{"flash_attention_forward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    check_heads(sh, C, NH);
    sh.need("out", out.size(), B * T * C);
    sh.need("lse", lse.size(), B * NH * T);
    sh.need("qkv", qkv.size(), B * T * 3 * C);
}

void check_flash_attention_backward(std::span<float> dqkv, std::span<float> delta, std::span<const float> dout,
                                    ConstView qkv, ConstView out, std::span<const float> lse, u64 B, u64 T, u64 C,
                                    u64 NH) {
    const Shape sh{"flash_attention_backward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}};
    same_dtype(sh, {{"qkv", qkv}, {"out", out}});
    check_heads(sh, C, NH);
    sh.need("dqkv", dqkv.size(), B * T * 3 * C);
    sh.need("delta", delta.size(), B * NH * T);
    sh.need("dout", dout.size(), B * T * C);
    sh.need("qkv", qkv.size(), B * T * 3 * C);
    sh.need("out", out.size(), B * T * C);
    sh.need("lse", lse.size(), B * NH * T);
}

void check_flash_gqa_forward(std::span<float> out, std::span<float> lse, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH,
                             u64 hd) {
    const Shape sh{"flash_gqa_forward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    need_gqa(sh, false, q.size(), k.size(), v.size(), B * NH * T * T, B, T, NH, KVH, hd);
    sh.need("out", out.size(), B * T * NH * hd);
    sh.need("lse", lse.size(), B * NH * T);
}

void check_flash_gqa_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv, std::span<float> delta,
                              std::span<const float> dout, ConstView q, ConstView k, ConstView v, ConstView out,
                              std::span<const float> lse, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const Shape sh{"flash_gqa_backward", {{"B", B}, {"T", T}, {"NH", NH}, {"KVH", KVH}, {"hd", hd}}};
    same_dtype(sh, {{"q", q}, {"k", k}, {"v", v}, {"out", out}});
    // need_gqa's att/datt: not this kernel's (given what they need, so never short).
    need_gqa(sh, true, dq.size(), dk.size(), dv.size(), B * NH * T * T, B, T, NH, KVH, hd);
    need_gqa(sh, false, q.size(), k.size(), v.size(), B * NH * T * T, B, T, NH, KVH, hd);
    sh.need("delta", delta.size(), B * NH * T);
    sh.need("dout", dout.size(), B * T * NH * hd);
    sh.need("out", out.size(), B * T * NH * hd);
    sh.need("lse", lse.size(), B * NH * T);
}

void check_rope_forward(std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    need_rope("rope_forward", x.size(), table.size(), B, T, H, hd, pos0);
}

void check_rope_backward(std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    need_rope("rope_backward", dx.size(), table.size(), B, T, H, hd, pos0);
}

// ---- loss ----------------------------------------------------------------------
// Both cross-entropies: losses (N), logits (N, ldl) with ldl >= V (0: V),
// targets (N).
void need_crossentropy(const char* kernel, std::size_t losses, ConstView logits, std::size_t targets, u64 N, u64 V,
                       u64 ldl) {
    const Shape sh{kernel, {{"N", N}, {"V", V}, {"ldl", ldl}}};
    const u64 ld = logits_stride(ldl, V);
    if (ld < V) sh.fail("the logits' row stride ldl is less than V");
    sh.need("losses", losses, N);
    sh.need("logits", logits.size(), N * ld);
    sh.need("targets", targets, N);
}

void check_crossentropy_forward_backward(std::span<float> losses, View logits, std::span<const std::int32_t> targets,
                                         float, u64 N, u64 V, u64 ldl) {
    need_crossentropy("crossentropy_forward_backward", losses.size(), logits, targets.size(), N, V, ldl);
}

void check_crossentropy_forward(std::span<float> losses, ConstView logits, std::span<const std::int32_t> targets,
                                u64 N, u64 V, u64 ldl) {
    need_crossentropy("crossentropy_forward", losses.size(), logits, targets.size(), N, V, ldl);
}

// ---- optimizer -------------------------------------------------------------------
// The instruction set too, so that a ZINF_SIMD the CPU lacks is refused at
// the call rather than at the next synchronize.
void check_adamw(const optim::Update& u, const optim::Scalars&) {
    u.check();
    (void)optim::default_isa();
}

}  // namespace

void Device::copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) {
    Shape{"copy", {}}.need("dst", dst.size(), src.size());
    const bool dst_dev = arena_->contains(dst.data()), src_dev = arena_->contains(src.data());
    if (!src.empty()) {
        if ((!dst_dev && !mem::from_pool(dst.data())) || (!src_dev && !mem::from_pool(src.data())))
            pageable_.fetch_add(1);
        if (dst_dev && !src_dev) h2d_.fetch_add(src.size());
        if (src_dev && !dst_dev) d2h_.fetch_add(src.size());
    }
    if (profile_) [[unlikely]] {
        Stamp a = profile_->begin(s);
        do_copy(s, dst, src);
        // Read once, written once.
        profile_->end(s, "copy", {.bytes = 2.0 * static_cast<double>(src.size())}, std::move(a));
        return;
    }
    do_copy(s, dst, src);
}

void Device::copy_rows(Stream& s, std::span<float> dst, u64 ld_dst, std::span<const float> src, u64 ld_src, u64 rows,
                       u64 cols) {
    const Shape sh{"copy_rows", {{"rows", rows}, {"cols", cols}, {"ld_dst", ld_dst}, {"ld_src", ld_src}}};
    if (ld_dst < cols || ld_src < cols) sh.fail("a row stride is less than cols");
    if (!rows || !cols) return;
    sh.need("dst", dst.size(), (rows - 1) * ld_dst + cols);
    sh.need("src", src.size(), (rows - 1) * ld_src + cols);
    if (profile_) [[unlikely]] {
        Stamp a = profile_->begin(s);
        do_copy_rows(s, dst, ld_dst, src, ld_src, rows, cols);
        profile_->end(s, "copy_rows", {.bytes = 2.0 * 4.0 * static_cast<double>(rows * cols)}, std::move(a));
        return;
    }
    do_copy_rows(s, dst, ld_dst, src, ld_src, rows, cols);
}

// Every kernel's public call: its check, then the backend's; under a
// profile, between two stamps on its stream, with its cost (cost.cpp).
#define ZINF_KERNEL(name, ...)                                                           \
    void Device::name(Stream& s, ZINF_KERNEL_PARAMS(__VA_ARGS__)) {                        \
        check_##name(ZINF_KERNEL_ARGS(__VA_ARGS__));                                     \
        if (profile_) [[unlikely]] {                                                     \
            Stamp zinf_before_ = profile_->begin(s);                                     \
            do_##name(s, ZINF_KERNEL_ARGS(__VA_ARGS__));                                 \
            profile_->end(s, #name, cost::name(ZINF_KERNEL_ARGS(__VA_ARGS__)), std::move(zinf_before_)); \
            return;                                                                      \
        }                                                                                \
        do_##name(s, ZINF_KERNEL_ARGS(__VA_ARGS__));                                     \
    }
#include <zinf/kernels.def>

}  // namespace zinf::device
