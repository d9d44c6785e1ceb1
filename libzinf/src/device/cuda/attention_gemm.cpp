// The cuda backend's attention forward and backward (kernels.def: the GPT's
// attention_forward/backward, the Llama family's gqa_forward/backward) as
// strided-batched cuBLASLt GEMMs around two row kernels (attention.cu),
// llm.c's decomposition without its permutes:
//   forward   S = Q K^T into att; att = softmax_causal(scale * S); out = P V
//   backward  dP = dO V^T into datt; dS = softmax_causal_backward (in datt);
//             dK = scale dS^T Q; dQ = scale dS K; P (causal copy) into datt;
//             dV = P^T dO
// Host code, as gemm.cpp: the GEMMs are CudaDevice::multiply's (one plan per
// shape, fp32 with CUBLAS_COMPUTE_32F: no TF32, so not yet the tensor cores;
// docs/cuda-backend.md says what bf16 would take).
//
// No layout copies: q, k and v are read where they lie, a head's rows
// (T, hd) at a row stride (3C in the GPT's packed qkv, NH*hd or KVH*hd apart),
// the heads one batch of a GEMM at a stride of hd. Query head h = g * group +
// j reads kv head g: for each batch row b and each j < group, one GEMM
// batched over the KVH kv heads (query heads at a stride of group * hd, kv
// heads at hd), so K and V are never copied per query head. dK and dV sum
// over a group's query heads as GEMMs accumulating (beta 1) in j's order, one
// after another on the stream: the same bits every run.
//
// bf16 q, k, v and att (a block's kept under Shape::activations bf16): the
// GEMMs multiply their fp32 widenings (exact), the arithmetic of the fp32
// kernel on the widened copies, staged in the outputs' own buffers before
// those are written (dv holds V, then K; dq holds Q), so no scratch beyond
// datt is needed.
#include "backend.hpp"

#include "../../util/kernel_math.hpp"

namespace zinf::device {

namespace {

// One attention call's operands: element pointers at row 0 of head 0 of
// batch row 0, and row strides (elements).
struct Heads {
    u64 B, T, NH, KVH, hd;
    const float *q, *k, *v;  // fp32 (or the fp32 widenings)
    u64 qs, ks;              // row strides of q, and of k and v
};

// C = alpha op(A) op(B) + beta C on the stream (spans sized to the shape's
// reach, as multiply's checks want them).
void product(const cuda::Launch& l, const Gemm& g, const float* a, const float* b, float* c) {
    l.device->multiply(*l.owner, g, ConstView(a, cpu::gemm_extent_a(g)), ConstView(b, cpu::gemm_extent_b(g)),
                       View(c, cpu::gemm_extent_c(g)));
}

// For each batch row b and query head j of a group, `each(b, j)` issues the
// GEMM batched over the kv heads.
template <class F>
void over_groups(const Heads& x, F&& each) {
    const u64 group = x.NH / x.KVH;
    for (u64 b = 0; b < x.B; ++b)
        for (u64 j = 0; j < group; ++j) each(b, j);
}

void forward(const cuda::Launch& l, const Heads& x, float* out, u64 os, float* att) {
    const u64 B = x.B, T = x.T, NH = x.NH, KVH = x.KVH, hd = x.hd, group = NH / KVH, TT = T * T;
    if (!B || !T || !NH || !hd) return;
    // S_(b,h) (T,T) = Q_(b,h) (T,hd) K_(b,g)^T.
    const Gemm s{.ta = false, .tb = true, .m = T, .n = T, .k = hd, .lda = x.qs, .ldb = x.ks, .ldc = T,
                 .alpha = 1, .beta = 0, .batch = KVH, .stride_a = group * hd, .stride_b = hd,
                 .stride_c = group * TT};
    over_groups(x, [&](u64 b, u64 j) {
        product(l, s, x.q + b * T * x.qs + j * hd, x.k + b * T * x.ks, att + (b * NH + j) * TT);
    });
    cuda::softmax_causal(l.stream, att, B * NH * T, T, kernel_math::attention_scale(hd));
    cuda_backend::launched("softmax_causal");
    // out_(b,h) (T,hd) = P_(b,h) (T,T) V_(b,g).
    const Gemm pv{.ta = false, .tb = false, .m = T, .n = hd, .k = T, .lda = T, .ldb = x.ks, .ldc = os,
                  .alpha = 1, .beta = 0, .batch = KVH, .stride_a = group * TT, .stride_b = hd,
                  .stride_c = group * hd};
    over_groups(x, [&](u64 b, u64 j) {
        product(l, pv, att + (b * NH + j) * TT, x.v + b * T * x.ks, out + b * T * os + j * hd);
    });
}

// Gradients dq (row stride dqs), dk and dv (row stride dks), all written.
struct Grads {
    float *dq, *dk, *dv;
    u64 dqs, dks;
};

// x's q, k, v are fp32 (read in place) unless `wide` holds their bf16
// sources: then each is widened into an output buffer just before its GEMM.
struct Bf16Sources {
    const std::uint16_t *q = nullptr, *k = nullptr, *v = nullptr;
};

void backward(const cuda::Launch& l, Heads x, const Grads& d, float* datt, const float* dout, u64 os, ConstView att,
              const Bf16Sources& wide) {
    const u64 B = x.B, T = x.T, NH = x.NH, KVH = x.KVH, hd = x.hd, group = NH / KVH, TT = T * T;
    if (!B || !T || !NH || !hd) return;
    const float scale = kernel_math::attention_scale(hd);
    const bool bf16 = wide.q != nullptr;
    auto widen_into = [&](float* dst, u64 ld_dst, const std::uint16_t* src, u64 ld_src, u64 cols) {
        cuda::widen_rows(l.stream, dst, ld_dst, src, ld_src, B * T, cols);
        cuda_backend::launched("widen_rows");
    };
    // 1. dP_(b,h) (T,T) = dO_(b,h) (T,hd) V_(b,g)^T, into datt (V widened into dv).
    if (bf16) {
        widen_into(d.dv, d.dks, wide.v, x.ks, KVH * hd);
        x.v = d.dv;
    }
    const u64 vs = bf16 ? d.dks : x.ks;
    const Gemm dp{.ta = false, .tb = true, .m = T, .n = T, .k = hd, .lda = os, .ldb = vs, .ldc = T,
                  .alpha = 1, .beta = 0, .batch = KVH, .stride_a = group * hd, .stride_b = hd,
                  .stride_c = group * TT};
    over_groups(x, [&](u64 b, u64 j) {
        product(l, dp, dout + b * T * os + j * hd, x.v + b * T * vs, datt + (b * NH + j) * TT);
    });
    // 2. dS in place (unscaled: the scale is the next GEMMs' alpha).
    cuda::softmax_causal_backward(l.stream, datt, att, B * NH * T, T);
    cuda_backend::launched("softmax_causal_backward");
    // 3. dK_(b,g) (T,hd) = scale sum_j dS_(b,h)^T Q_(b,h) (Q widened into dq).
    if (bf16) {
        widen_into(d.dq, d.dqs, wide.q, x.qs, NH * hd);
        x.q = d.dq;
    }
    const u64 qs = bf16 ? d.dqs : x.qs;
    for (u64 b = 0; b < B; ++b)
        for (u64 j = 0; j < group; ++j) {
            const Gemm dk{.ta = true, .tb = false, .m = T, .n = hd, .k = T, .lda = T, .ldb = qs, .ldc = d.dks,
                          .alpha = scale, .beta = j ? 1.0f : 0.0f, .batch = KVH, .stride_a = group * TT,
                          .stride_b = group * hd, .stride_c = hd};
            product(l, dk, datt + (b * NH + j) * TT, x.q + b * T * qs + j * hd, d.dk + b * T * d.dks);
        }
    // 4. dQ_(b,h) (T,hd) = scale dS_(b,h) K_(b,g) (K widened into dv: V is done).
    if (bf16) {
        widen_into(d.dv, d.dks, wide.k, x.ks, KVH * hd);
        x.k = d.dv;
    }
    const u64 ks = bf16 ? d.dks : x.ks;
    const Gemm dq{.ta = false, .tb = false, .m = T, .n = hd, .k = T, .lda = T, .ldb = ks, .ldc = d.dqs,
                  .alpha = scale, .beta = 0, .batch = KVH, .stride_a = group * TT, .stride_b = hd,
                  .stride_c = group * hd};
    over_groups(x, [&](u64 b, u64 j) {
        product(l, dq, datt + (b * NH + j) * TT, x.k + b * T * ks, d.dq + b * T * d.dqs + j * hd);
    });
    // 5. dV_(b,g) (T,hd) = sum_j P_(b,h)^T dO_(b,h): P (zero above the
    // diagonal, fp32) into datt, dS being done.
    cuda::causal_copy(l.stream, datt, att, B * NH * T, T);
    cuda_backend::launched("causal_copy");
    for (u64 b = 0; b < B; ++b)
        for (u64 j = 0; j < group; ++j) {
            const Gemm dv{.ta = true, .tb = false, .m = T, .n = hd, .k = T, .lda = T, .ldb = os, .ldc = d.dks,
                          .alpha = 1, .beta = j ? 1.0f : 0.0f, .batch = KVH, .stride_a = group * TT,
                          .stride_b = group * hd, .stride_c = hd};
            product(l, dv, datt + (b * NH + j) * TT, dout + b * T * os + j * hd, d.dv + b * T * d.dks);
        }
}

}  // namespace

void cuda::attention_forward(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> qkv,
                             u64 B, u64 T, u64 C, u64 NH) {
    if (!NH) return;
    const float* p = qkv.data();
    forward(l, Heads{B, T, NH, NH, C / NH, p, p + C, p + 2 * C, 3 * C, 3 * C}, out.data(), C, att.data());
}

void cuda::attention_backward(const Launch& l, std::span<float> dqkv, std::span<float> datt,
                              std::span<const float> dout, ConstView qkv, ConstView att, u64 B, u64 T, u64 C,
                              u64 NH) {
    if (!NH) return;
    float* g = dqkv.data();
    const Grads d{g, g + C, g + 2 * C, 3 * C, 3 * C};
    if (qkv.is_bf16()) {
        const std::uint16_t* p = qkv.data<std::uint16_t>();
        backward(l, Heads{B, T, NH, NH, C / NH, nullptr, nullptr, nullptr, 3 * C, 3 * C}, d, datt.data(),
                 dout.data(), C, att, Bf16Sources{p, p + C, p + 2 * C});
    } else {
        const float* p = qkv.data<float>();
        backward(l, Heads{B, T, NH, NH, C / NH, p, p + C, p + 2 * C, 3 * C, 3 * C}, d, datt.data(), dout.data(), C,
                 att, {});
    }
}

void cuda::gqa_forward(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    if (!KVH) return;
    forward(l, Heads{B, T, NH, KVH, hd, q.data(), k.data(), v.data(), NH * hd, KVH * hd}, out.data(), NH * hd,
            att.data());
}

void cuda::gqa_backward(const Launch& l, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<float> datt, std::span<const float> dout, ConstView q, ConstView k, ConstView v,
                        ConstView att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    if (!KVH) return;
    const Grads d{dq.data(), dk.data(), dv.data(), NH * hd, KVH * hd};
    if (q.is_bf16())
        backward(l, Heads{B, T, NH, KVH, hd, nullptr, nullptr, nullptr, NH * hd, KVH * hd}, d, datt.data(),
                 dout.data(), NH * hd, att,
                 Bf16Sources{q.data<std::uint16_t>(), k.data<std::uint16_t>(), v.data<std::uint16_t>()});
    else
        backward(l, Heads{B, T, NH, KVH, hd, q.data<float>(), k.data<float>(), v.data<float>(), NH * hd, KVH * hd}, d,
                 datt.data(), dout.data(), NH * hd, att, {});
}

}  // namespace zinf::device
