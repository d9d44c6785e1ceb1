// The cpu backend's attention kernels (kernels.def): the GPT's causal
// self-attention over a packed qkv and the Llama family's grouped-query
// attention with the query and key-value heads apart, both as the cuda
// backend's decomposition into GEMMs (OpenBLAS's cblas_sgemm, one call at a
// time on the task's thread) around row passes of the softmax; their
// decoding rows against a key-value cache; the rotary embedding of q and k.
//
//   forward   S = Q K^T into att; each row softmax(scale * S) over its
//             causal prefix, zero above; out = P V
//   backward  dP = dO V^T into datt; dS = P (dP - sum P dP) by rows;
//             dQ = scale dS K; dK = scale sum_group dS^T Q; dV = sum_group
//             P^T dO
//
// One task per (batch row, kv head) (the GPT: per head): its GEMMs are the
// same calls, of the same shapes, whatever the thread count or the batch,
// so the bits are too. The causal triangle is cut in blocks of kAttnRows
// query rows (keys 0 .. the block's last) or key columns (queries from the
// block's first), so about half of the T x T products are skipped as the
// scalar kernel skipped them. A group's dK and dV sum its query heads in
// order (beta 1). q, k, v and att stored bf16 are widened into the task's
// scratch as read: the fp32 kernel's arithmetic on their fp32 copies.
#include "kernels.hpp"
#include "../util/cpu.hpp"
#include "../util/kernel_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace zinf::device::cpu {

namespace {

// A row of scores in place: softmax(scale * a) over positions 0..last, zero
// from last + 1 to len. The forward's rows and the decode's, one arithmetic
// (libm's exp, sums in position order).
inline void softmax_row(float* a, u64 last, u64 len, float scale) {
    float maxval = -std::numeric_limits<float>::infinity();
    for (u64 t2 = 0; t2 <= last; ++t2) {
        a[t2] *= scale;
        maxval = std::max(maxval, a[t2]);
    }
    float expsum = 0;
    for (u64 t2 = 0; t2 <= last; ++t2) {
        a[t2] = std::exp(a[t2] - maxval);
        expsum += a[t2];
    }
    const float inv = expsum == 0 ? 0.0f : 1.0f / expsum;
    for (u64 t2 = 0; t2 <= last; ++t2) a[t2] *= inv;
    std::fill(a + last + 1, a + len, 0.0f);
}

// ---------------------------------------------------------------------------
// Decoding: one row against a key-value cache, built once per
// instruction-set level (util/cpu.hpp): the same operations in the same order
// at every level (dot's eight lanes, the per-element sums, libm's exp, no
// fused multiply-add). The scores of the query q against keys 0..last (at k
// + t2 * kstride), softmax_row into a (len entries, zero past last), then o
// (hd) = sum_t2 a[t2] v[t2]: llm.c's attention_forward steps, in its order.
[[gnu::always_inline]] inline void attend_in(float* a, const float* q, const float* k, const float* v, u64 kstride,
                                             u64 last, u64 len, u64 hd, float scale, float* o) {
    for (u64 t2 = 0; t2 <= last; ++t2) a[t2] = dot(q, k + t2 * kstride, hd);
    softmax_row(a, last, len, scale);
    std::fill(o, o + hd, 0.0f);
    for (u64 t2 = 0; t2 <= last; ++t2) {
        const float* vv = v + t2 * kstride;
        const float w = a[t2];
        for (u64 i = 0; i < hd; ++i) o[i] += w * vv[i];
    }
}

#define ZINF_ATTEND_ARGS                                                                                            \
    float *a, const float *q, const float *k, const float *v, u64 kstride, u64 last, u64 len, u64 hd, float scale, \
        float *o
ZINF_TARGET_V4 void attend_v4(ZINF_ATTEND_ARGS) { attend_in(a, q, k, v, kstride, last, len, hd, scale, o); }
ZINF_TARGET_AVX2 void attend_avx2(ZINF_ATTEND_ARGS) { attend_in(a, q, k, v, kstride, last, len, hd, scale, o); }
void attend_base(ZINF_ATTEND_ARGS) { attend_in(a, q, k, v, kstride, last, len, hd, scale, o); }
#undef ZINF_ATTEND_ARGS

void attend(float* a, const float* q, const float* k, const float* v, u64 kstride, u64 last, u64 len, u64 hd,
            float scale, float* o) {
    static const auto run = for_cpu(attend_v4, attend_avx2, attend_base);
    run(a, q, k, v, kstride, last, len, hd, scale, o);
}

// attention_forward's row T-1 alone, over keys and values kept (T,C) each:
// one task per head, the softmax row in the forward's arithmetic, the dot
// products and the sum over positions on one thread (the forward's are
// OpenBLAS's: the same within rounding, not to the bit).
void attention_decode_heads(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 C,
                            u64 NH) {
    const u64 hs = C / NH;
    const float scale = kernel_math::attention_scale(hs);
#pragma omp parallel for schedule(static, 1) if (T * C >= kParallelMin)
    for (u64 h = 0; h < NH; ++h) {
        const float* qh = q + h * hs;
        float* a = att + h * T;
        for (u64 t2 = 0; t2 < T; ++t2) a[t2] = dot(qh, k + t2 * C + h * hs, hs);
        softmax_row(a, T - 1, T, scale);

        float* o = out + h * hs;
        std::fill(o, o + hs, 0.0f);
        for (u64 t2 = 0; t2 < T; ++t2) {
            const float* vh = v + t2 * C + h * hs;
            const float w = a[t2];
            for (u64 i = 0; i < hs; ++i) o[i] += w * vh[i];
        }
    }
}

// ---------------------------------------------------------------------------
// The GEMM decomposition.
constexpr u64 kAttnRows = 64;  // query rows (or key columns) per block of the causal triangle

// One GEMM of the task on its thread (no batch): C (m,n) = alpha op(A) op(B) + beta C.
void product(bool ta, bool tb, u64 m, u64 n, u64 k, float alpha, const float* a, u64 lda, const float* b, u64 ldb,
             float beta, float* c, u64 ldc) {
    gemm_serial(Gemm{.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha,
                     .beta = beta},
                a, b, c);
}

// One call's heads: q (B,T,..) of row stride qs, head h at h * hd; k and v
// of row stride ks, kv head g at g * hd; out and dout of row stride os.
struct Heads {
    u64 B, T, NH, KVH, hd;
    u64 qs, ks, os;
    u64 group() const { return NH / KVH; }
};

// Task (b, h): its att (T,T) and out rows.
void forward_head(const Heads& x, const float* q, const float* k, const float* v, float* att, float* out, u64 b,
                  u64 h) {
    const u64 T = x.T, hd = x.hd, g = h / x.group();
    const float scale = kernel_math::attention_scale(hd);
    const float* Q = q + b * T * x.qs + h * hd;
    const float* K = k + b * T * x.ks + g * hd;
    const float* V = v + b * T * x.ks + g * hd;
    float* A = att + (b * x.NH + h) * T * T;
    float* O = out + b * T * x.os + h * hd;
    for (u64 r0 = 0; r0 < T; r0 += kAttnRows) {
        const u64 r1 = std::min(T, r0 + kAttnRows), rows = r1 - r0;
        // S[r0:r1, 0:r1] = Q[r0:r1] K[0:r1]^T; the rest of the rows is zero after the softmax.
        product(false, true, rows, r1, hd, 1.0f, Q + r0 * x.qs, x.qs, K, x.ks, 0.0f, A + r0 * T, T);
        for (u64 t = r0; t < r1; ++t) softmax_row(A + t * T, t, T, scale);
        // out[r0:r1] = P[r0:r1, 0:r1] V[0:r1].
        product(false, false, rows, hd, r1, 1.0f, A + r0 * T, T, V, x.ks, 0.0f, O + r0 * x.os, x.os);
    }
}

void forward(const Heads& x, const float* q, const float* k, const float* v, float* att, float* out) {
#pragma omp parallel for schedule(static, 1) if (x.B * x.T * x.T * x.NH * x.hd >= kParallelMin)
    for (u64 task = 0; task < x.B * x.NH; ++task) forward_head(x, q, k, v, att, out, task / x.NH, task % x.NH);
}

// rows x cols from src (row stride ld) into dst packed: fp32 read in place
// (dst unused), bf16 widened.
const float* rows_of(const float* src, u64, u64, u64, float*) { return src; }
const float* rows_of(const std::uint16_t* src, u64 rows, u64 cols, u64 ld, float* dst) {
    for (u64 r = 0; r < rows; ++r)
        for (u64 c = 0; c < cols; ++c) dst[r * cols + c] = zinf::from_bf16(src[r * ld + c]);
    return dst;
}

// The backward's pointers: gradients dq (row stride dqs), dk and dv (dks),
// all written; datt (B,NH,T,T) scratch.
struct Grads {
    float *dq, *dk, *dv, *datt;
    u64 dqs, dks;
};

// Task (b, g): the group's query heads in order. w: the thread's scratch,
// T*T + 3*T*hd floats (P, and q, k, v widened where bf16).
template <class E>
void backward_group(const Heads& x, const Grads& d, const float* dout, const E* q, const E* k, const E* v,
                    const E* att, u64 b, u64 g, float* w) {
    const u64 T = x.T, hd = x.hd, group = x.group(), TT = T * T;
    const float scale = kernel_math::attention_scale(hd);
    constexpr bool kWide = !std::is_same_v<E, float>;
    float* P = w;  // (T,T): the probabilities, zero above the diagonal, fp32
    float* wq = P + TT;
    float* wk = wq + T * hd;
    float* wv = wk + T * hd;
    // k and v of kv head g (bf16: widened, packed with row stride hd).
    const u64 lk = kWide ? hd : x.ks, lq = kWide ? hd : x.qs;
    const float* K = rows_of(k + b * T * x.ks + g * hd, T, hd, x.ks, wk);
    const float* V = rows_of(v + b * T * x.ks + g * hd, T, hd, x.ks, wv);
    float* dK = d.dk + b * T * d.dks + g * hd;
    float* dV = d.dv + b * T * d.dks + g * hd;
    for (u64 j = 0; j < group; ++j) {
        const u64 h = g * group + j;
        const float* Q = rows_of(q + b * T * x.qs + h * hd, T, hd, x.qs, wq);
        const float* dO = dout + b * T * x.os + h * hd;
        const E* A = att + (b * x.NH + h) * TT;
        float* dS = d.datt + (b * x.NH + h) * TT;
        float* dQ = d.dq + b * T * d.dqs + h * hd;
        for (u64 t = 0; t < T; ++t) {
            for (u64 t2 = 0; t2 <= t; ++t2) P[t * T + t2] = widen(A[t * T + t2]);
            std::fill(P + t * T + t + 1, P + (t + 1) * T, 0.0f);
        }
        for (u64 r0 = 0; r0 < T; r0 += kAttnRows) {
            const u64 r1 = std::min(T, r0 + kAttnRows), rows = r1 - r0;
            // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T, then through the softmax.
            product(false, true, rows, r1, hd, 1.0f, dO + r0 * x.os, x.os, V, lk, 0.0f, dS + r0 * T, T);
            for (u64 t = r0; t < r1; ++t) {
                const float* a = P + t * T;
                float* da = dS + t * T;
                const float s = dot(a, da, t + 1);
                for (u64 t2 = 0; t2 <= t; ++t2) da[t2] = a[t2] * (da[t2] - s);
                std::fill(da + t + 1, da + T, 0.0f);
            }
            // dQ[r0:r1] = scale dS[r0:r1, 0:r1] K[0:r1].
            product(false, false, rows, hd, r1, scale, dS + r0 * T, T, K, lk, 0.0f, dQ + r0 * d.dqs, d.dqs);
        }
        // Key columns c0:c1 see the queries c0:T: dK[c0:c1] (+)= scale
        // dS[c0:T, c0:c1]^T Q[c0:T], dV[c0:c1] (+)= P[c0:T, c0:c1]^T dO[c0:T].
        const float beta = j ? 1.0f : 0.0f;
        for (u64 c0 = 0; c0 < T; c0 += kAttnRows) {
            const u64 c1 = std::min(T, c0 + kAttnRows), cols = c1 - c0;
            product(true, false, cols, hd, T - c0, scale, dS + c0 * T + c0, T, Q + c0 * lq, lq, beta,
                    dK + c0 * d.dks, d.dks);
            product(true, false, cols, hd, T - c0, 1.0f, P + c0 * T + c0, T, dO + c0 * x.os, x.os, beta,
                    dV + c0 * d.dks, d.dks);
        }
    }
}

template <class E>
void backward(const Heads& x, const Grads& d, const float* dout, const E* q, const E* k, const E* v, const E* att) {
    const bool parallel = x.B * x.T * x.T * x.NH * x.hd >= kParallelMin;
#pragma omp parallel if (parallel)
    {
        std::vector<float> w(x.T * x.T + 3 * x.T * x.hd);
#pragma omp for schedule(static, 1)
        for (u64 task = 0; task < x.B * x.KVH; ++task)
            backward_group(x, d, dout, q, k, v, att, task / x.KVH, task % x.KVH, w.data());
    }
}

// `inverse`: the backward's turn the other way.
void rope_turn(float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 half = hd / 2;
#pragma omp parallel for schedule(static) if (B * T * H * hd >= kLightParallelMin)
    for (u64 bt = 0; bt < B * T; ++bt) {
        const float* cs = table + (pos0 + bt % T) * hd;
        const float* sn = cs + half;
        for (u64 h = 0; h < H; ++h) {
            float* a = x + (bt * H + h) * hd;
            float* b = a + half;
            if (!inverse)
                for (u64 i = 0; i < half; ++i) {
                    const float x1 = a[i], x2 = b[i];
                    a[i] = x1 * cs[i] - x2 * sn[i];
                    b[i] = x2 * cs[i] + x1 * sn[i];
                }
            else
                for (u64 i = 0; i < half; ++i) {
                    const float d1 = a[i], d2 = b[i];
                    a[i] = d1 * cs[i] + d2 * sn[i];
                    b[i] = d2 * cs[i] - d1 * sn[i];
                }
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// qkv (B,T,3C) is [q | k | v] per position, head h the columns [h*hs, (h+1)*hs)
// of each third: the grouped-query kernels' heads with as many kv heads as
// query heads, read at a row stride of 3C.
void attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B, u64 T, u64 C,
                       u64 NH) {
    if (!NH) return;
    const float* p = qkv.data();
    forward(Heads{B, T, NH, NH, C / NH, 3 * C, 3 * C, C}, p, p + C, p + 2 * C, att.data(), out.data());
}

void attention_backward(std::span<float> dqkv, std::span<float> datt, std::span<const float> dout, ConstView qkv,
                        ConstView att, u64 B, u64 T, u64 C, u64 NH) {
    if (!NH) return;
    float* g = dqkv.data();
    with_dtype(qkv.dtype(), [&](auto e) {
        using E = decltype(e);
        const E* p = qkv.data<E>();
        backward(Heads{B, T, NH, NH, C / NH, 3 * C, 3 * C, C}, Grads{g, g + C, g + 2 * C, datt.data(), 3 * C, 3 * C},
                 dout.data(), p, p + C, p + 2 * C, att.data<E>());
    });
}

void attention_decode(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, u64 T, u64 C, u64 NH) {
    attention_decode_heads(out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH);
}

void gqa_forward(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                 std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    if (!KVH) return;
    forward(Heads{B, T, NH, KVH, hd, NH * hd, KVH * hd, NH * hd}, q.data(), k.data(), v.data(), att.data(),
            out.data());
}

void gqa_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv, std::span<float> datt,
                  std::span<const float> dout, ConstView q, ConstView k, ConstView v, ConstView att, u64 B, u64 T,
                  u64 NH, u64 KVH, u64 hd) {
    if (!KVH) return;
    with_dtype(q.dtype(), [&](auto e) {
        using E = decltype(e);
        backward(Heads{B, T, NH, KVH, hd, NH * hd, KVH * hd, NH * hd},
                 Grads{dq.data(), dk.data(), dv.data(), datt.data(), NH * hd, KVH * hd}, dout.data(), q.data<E>(),
                 k.data<E>(), v.data<E>(), att.data<E>());
    });
}

void gqa_decode(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    const u64 KC = KVH * hd, group = NH / KVH;
    const float scale = kernel_math::attention_scale(hd);
#pragma omp parallel for schedule(static, 1) if (T * NH * hd >= kParallelMin)
    for (u64 h = 0; h < NH; ++h) {
        const u64 g = h / group;
        attend(att.data() + h * T, q.data() + h * hd, k.data() + g * hd, v.data() + g * hd, KC, T - 1, T, hd, scale,
               out.data() + h * hd);
    }
}

void rope_forward(std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    rope_turn(x.data(), table.data(), B, T, H, hd, pos0, false);
}

void rope_backward(std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    rope_turn(dx.data(), table.data(), B, T, H, hd, pos0, true);
}

}  // namespace zinf::device::cpu
