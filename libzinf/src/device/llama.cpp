// The cpu backend's Llama kernels (llama_kernels.hpp). RMSNorm follows
// layernorm's code path (a row per task, sums over rows per column block);
// attention follows attention_forward/backward (softmax.cpp) with the query
// and key-value heads apart: the backward's first pass is one task per
// (batch, query head, position) writing its datt row and dq, the second one
// task per (batch, kv head, block of key positions) summing dk and dv over
// the group's query heads, then the query positions, in that order.
#include "llama_kernels.hpp"
#include "../util/kernel_math.hpp"
#include "../util/cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace zinf::device::cpu {

namespace {
u64 column_blocks(u64 C) { return (C + kColumnBlock - 1) / kColumnBlock; }

// RMSNorm and RoPE do a few flops an element: below this many elements a
// pass takes less than a parallel region's fork and end barrier, which on a
// loaded machine is a wait for a descheduled thread (BENCHMARKS.md, the Llama
// section: a smollm-135m step spent 63% of its samples in libgomp's wait), so
// they run on the calling thread. Each element and each column sum is
// computed the same way on one thread or many: the bits do not change.
constexpr u64 kLightParallelMin = u64{1} << 20;
}  // namespace

// ---------------------------------------------------------------------------
namespace {
// Row r of RMSNorm's forward.
inline void rmsnorm_row(float* out, float* rstd, const float* inp, const float* w, u64 r, u64 C, float eps) {
    const float* x = inp + r * C;
    float* o = out + r * C;
    const float s = 1.0f / std::sqrt(dot(x, x, C) * (1.0f / static_cast<float>(C)) + eps);
    for (u64 c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
    rstd[r] = s;
}
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, u64 N, u64 C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kLightParallelMin)
    for (u64 r = 0; r < N; ++r) rmsnorm_row(out, rstd, inp, w, r, C, eps);
}

// The residual add is accumulate's (kernels.cpp) a row at a time, so the bits
// are those of the two kernels in turn; but one pass over the rows, and one
// parallel region where the add took one and the norm ran on one thread (a
// Llama block's post-attention norm: BENCHMARKS.md).
void residual_rmsnorm_forward(float* out, float* rstd, float* res, const float* add, const float* w, u64 N, u64 C,
                              float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
        float* h = res + r * C;
        const float* a = add + r * C;
        for (u64 c = 0; c < C; ++c) h[c] += a[c];
        rmsnorm_row(out, rstd, res, w, r, C, eps);
    }
}

namespace {
// In: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class In>
void rmsnorm_grad(float* dinp, float* dw, const float* dout, const In* inp, const float* w, const float* rstd, u64 N,
                  u64 C) {
    const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel if (N * C >= kLightParallelMin)
    {
        std::vector<float> norm(C), dnorm(C);
#pragma omp for schedule(static)
        for (u64 r = 0; r < N; ++r) {
            const In* x = inp + r * C;
            const float* d = dout + r * C;
            const float s = rstd[r];
            for (u64 c = 0; c < C; ++c) {
                norm[c] = widen(x[c]) * s;
                dnorm[c] = w[c] * d[c];
            }
            const float dnorm_norm_mean = dot(dnorm.data(), norm.data(), C) * inv_c;
            float* di = dinp + r * C;
            for (u64 c = 0; c < C; ++c) di[c] += (dnorm[c] - norm[c] * dnorm_norm_mean) * s;
        }
    }
#pragma omp parallel for schedule(static) if (N * C >= kLightParallelMin)
    for (u64 blk = 0; blk < column_blocks(C); ++blk) {
        const u64 c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
        for (u64 r = 0; r < N; ++r) {
            const In* x = inp + r * C;
            const float* d = dout + r * C;
            const float s = rstd[r];
            for (u64 c = c0; c < c1; ++c) dw[c] += widen(x[c]) * s * d[c];
        }
    }
}
}  // namespace

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      u64 N, u64 C) {
    rmsnorm_grad(dinp, dw, dout, inp, w, rstd, N, C);
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const std::uint16_t* inp, const float* w,
                      const float* rstd, u64 N, u64 C) {
    rmsnorm_grad(dinp, dw, dout, inp, w, rstd, N, C);
}

// ---------------------------------------------------------------------------
void rope(float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
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

// ---------------------------------------------------------------------------
// SwiGLU's loops are built once per instruction-set level (util/cpu.hpp) and
// run over blocks of elements: its exp and two divisions made it the dearest
// of a smollm-135m step's element-wise kernels (about 3 times GELU's time an
// element forward and 4 times backward on 4-wide SSE; BENCHMARKS.md). Every
// level does kernel_math's operations in the same order with no fused
// multiply-add (-ffp-contract=off), so the bits are the scalar form's, the
// cuda kernels' too. The backward runs in place (dgate is dout): each element
// reads its own inputs before it writes, which `ivdep` tells the vectoriser
// (it would otherwise check the overlap at run time and take the scalar loop).
namespace {

[[gnu::always_inline]] inline void swiglu_forward_in(float* out, const float* gate, const float* up, u64 n) {
#pragma GCC ivdep
    for (u64 i = 0; i < n; ++i) out[i] = kernel_math::swiglu(gate[i], up[i]);
}
ZINF_TARGET_V4 void swiglu_forward_v4(float* out, const float* gate, const float* up, u64 n) {
    swiglu_forward_in(out, gate, up, n);
}
ZINF_TARGET_AVX2 void swiglu_forward_avx2(float* out, const float* gate, const float* up, u64 n) {
    swiglu_forward_in(out, gate, up, n);
}
void swiglu_forward_base(float* out, const float* gate, const float* up, u64 n) { swiglu_forward_in(out, gate, up, n); }

[[gnu::always_inline]] inline void swiglu_backward_in(float* dgate, float* dup, const float* dout, const float* gate,
                                                      const float* up, u64 n) {
#pragma GCC ivdep
    for (u64 i = 0; i < n; ++i) {
        float dg, du;
        kernel_math::swiglu_grad(gate[i], up[i], dout[i], &dg, &du);
        dgate[i] = dg;
        dup[i] = du;
    }
}
ZINF_TARGET_V4 void swiglu_backward_v4(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}
ZINF_TARGET_AVX2 void swiglu_backward_avx2(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}
void swiglu_backward_base(float* dgate, float* dup, const float* dout, const float* gate, const float* up, u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}

constexpr u64 kElementBlock = 4096;  // elements per task: a multiple of every level's vector width

// f(i, count) over [0, n) in blocks, on the team when n is large enough.
template <class F>
void element_blocks(u64 n, F&& f) {
    const u64 blocks = (n + kElementBlock - 1) / kElementBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 b = 0; b < blocks; ++b) f(b * kElementBlock, std::min(kElementBlock, n - b * kElementBlock));
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, u64 n) {
    static const auto run = for_cpu(swiglu_forward_v4, swiglu_forward_avx2, swiglu_forward_base);
    element_blocks(n, [&](u64 i, u64 count) { run(out + i, gate + i, up + i, count); });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, u64 n) {
    static const auto run = for_cpu(swiglu_backward_v4, swiglu_backward_avx2, swiglu_backward_base);
    element_blocks(n, [&](u64 i, u64 count) { run(dgate + i, dup + i, dout + i, gate + i, up + i, count); });
}

// From bf16 gate and up: each block widened (exact) into the task's own
// fp32 copies, then the fp32 loop of this level over them, the forward's
// block then rounded into out: the fp32 kernels' bits on the widened inputs.
namespace {
struct Widened {
    float gate[kElementBlock], up[kElementBlock], out[kElementBlock];
    Widened(const std::uint16_t* g, const std::uint16_t* u, u64 count) {
        zinf::from_bf16(std::span(g, count), std::span(gate, count));
        zinf::from_bf16(std::span(u, count), std::span(up, count));
    }
};
}  // namespace

void swiglu_forward(std::uint16_t* out, const std::uint16_t* gate, const std::uint16_t* up, u64 n) {
    static const auto run = for_cpu(swiglu_forward_v4, swiglu_forward_avx2, swiglu_forward_base);
    element_blocks(n, [&](u64 i, u64 count) {
        Widened w(gate + i, up + i, count);
        run(w.out, w.gate, w.up, count);
        zinf::to_bf16(std::span<const float>(w.out, count), std::span(out + i, count));
    });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const std::uint16_t* gate, const std::uint16_t* up,
                     u64 n) {
    static const auto run = for_cpu(swiglu_backward_v4, swiglu_backward_avx2, swiglu_backward_base);
    element_blocks(n, [&](u64 i, u64 count) {
        Widened w(gate + i, up + i, count);
        run(dgate + i, dup + i, dout + i, w.gate, w.up, count);
    });
}

// ---------------------------------------------------------------------------
// Attention's tasks are built once per instruction-set level too, as SwiGLU's
// loops: the same operations in the same order (dot's eight lanes, the
// per-element sums, libm's exp), so the bits are the same at every level and
// still the GPT's attention kernels' with as many kv heads as query heads.
namespace {

// One softmax row over keys 0..last (at k + t2 * kstride) for the query q,
// into a (len entries, zero past last), then o (hd) = sum_t2 a[t2] v[t2]:
// attention_forward's steps (softmax.cpp), in its order.
[[gnu::always_inline]] inline void attend_in(float* a, const float* q, const float* k, const float* v, u64 kstride,
                                             u64 last, u64 len, u64 hd, float scale, float* o) {
    float maxval = -std::numeric_limits<float>::infinity();
    for (u64 t2 = 0; t2 <= last; ++t2) {
        a[t2] = dot(q, k + t2 * kstride, hd) * scale;
        maxval = std::max(maxval, a[t2]);
    }
    float expsum = 0;
    for (u64 t2 = 0; t2 <= last; ++t2) {
        a[t2] = std::exp(a[t2] - maxval);
        expsum += a[t2];
    }
    const float inv = expsum == 0 ? 0.0f : 1.0f / expsum;
    for (u64 t2 = 0; t2 <= last; ++t2) a[t2] *= inv;
    for (u64 t2 = last + 1; t2 < len; ++t2) a[t2] = 0;
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

constexpr u64 kKeyBlock = 16;  // key positions per task in the backward's second pass

// E: float, or std::uint16_t for q, k, v and att stored bf16, each row
// widened (exact) into the task's scratch w as read: the same arithmetic on
// the same values as the fp32 kernel on their fp32 copies.
template <class E>
struct GqaBackward {
    float *dq, *dk, *dv, *datt;
    const float* dout;
    const E *q, *k, *v, *att;
    u64 B, T, NH, KVH, hd;
};

// 1: task (b, h, t): datt row t through the softmax, and dq[t]. w: T + hd floats.
template <class E>
[[gnu::always_inline]] inline void gqa_rows_in(const GqaBackward<E>& p, u64 task, float* w) {
    const u64 T = p.T, NH = p.NH, hd = p.hd, QC = NH * hd, KC = p.KVH * hd, group = NH / p.KVH;
    const float scale = kernel_math::attention_scale(hd);
    const u64 t = task % T, h = task / T % NH, b = task / T / NH, g = h / group;
    const float* a = wide(p.att + ((b * NH + h) * T + t) * T, t + 1, w);
    float* const wkv = w ? w + T : nullptr;  // fp32: no scratch
    float* da = p.datt + ((b * NH + h) * T + t) * T;
    const float* go = p.dout + (b * T + t) * QC + h * hd;
    const E* kb = p.k + b * T * KC + g * hd;
    const E* vb = p.v + b * T * KC + g * hd;
    for (u64 t2 = 0; t2 <= t; ++t2) da[t2] = dot(wide(vb + t2 * KC, hd, wkv), go, hd);
    const float s = dot(a, da, t + 1);
    for (u64 t2 = 0; t2 <= t; ++t2) da[t2] = a[t2] * (da[t2] - s);
    for (u64 t2 = t + 1; t2 < T; ++t2) da[t2] = 0;
    float* d = p.dq + (b * T + t) * QC + h * hd;
    std::fill(d, d + hd, 0.0f);
    for (u64 t2 = 0; t2 <= t; ++t2) {
        const float gs = da[t2] * scale;
        const float* kk = wide(kb + t2 * KC, hd, wkv);
        for (u64 i = 0; i < hd; ++i) d[i] += gs * kk[i];
    }
}

// 2: task (b, g, block of key positions): dk and dv summed over the group's
// query heads, then the query positions t >= t2, in order. w: hd floats.
template <class E>
[[gnu::always_inline]] inline void gqa_keys_in(const GqaBackward<E>& p, u64 task, float* w) {
    const u64 T = p.T, NH = p.NH, KVH = p.KVH, hd = p.hd, QC = NH * hd, KC = KVH * hd, group = NH / KVH;
    const float scale = kernel_math::attention_scale(hd);
    const u64 blocks = (T + kKeyBlock - 1) / kKeyBlock;
    const u64 blk = task % blocks, g = task / blocks % KVH, b = task / blocks / KVH;
    const u64 t0 = blk * kKeyBlock, t1 = std::min(T, t0 + kKeyBlock);
    for (u64 t2 = t0; t2 < t1; ++t2) {
        std::fill(p.dk + (b * T + t2) * KC + g * hd, p.dk + (b * T + t2) * KC + (g + 1) * hd, 0.0f);
        std::fill(p.dv + (b * T + t2) * KC + g * hd, p.dv + (b * T + t2) * KC + (g + 1) * hd, 0.0f);
    }
    for (u64 h = g * group; h < (g + 1) * group; ++h)
        for (u64 t = t0; t < T; ++t) {
            const E* a = p.att + ((b * NH + h) * T + t) * T;
            const float* da = p.datt + ((b * NH + h) * T + t) * T;
            const float* go = p.dout + (b * T + t) * QC + h * hd;
            const float* qq = wide(p.q + (b * T + t) * QC + h * hd, hd, w);
            for (u64 t2 = t0; t2 < std::min(t1, t + 1); ++t2) {
                float* dkk = p.dk + (b * T + t2) * KC + g * hd;
                float* dvv = p.dv + (b * T + t2) * KC + g * hd;
                const float wt = widen(a[t2]), gs = da[t2] * scale;
                for (u64 i = 0; i < hd; ++i) {
                    dvv[i] += wt * go[i];
                    dkk[i] += gs * qq[i];
                }
            }
        }
}

// A pass's task at each instruction-set level, for either storage.
#define ZINF_GQA_LEVELS(pass)                                                                  \
    template <class E>                                                                         \
    ZINF_TARGET_V4 void pass##_v4(const GqaBackward<E>& p, u64 task, float* w) {               \
        pass##_in(p, task, w);                                                                 \
    }                                                                                          \
    template <class E>                                                                         \
    ZINF_TARGET_AVX2 void pass##_avx2(const GqaBackward<E>& p, u64 task, float* w) {           \
        pass##_in(p, task, w);                                                                 \
    }                                                                                          \
    template <class E>                                                                         \
    void pass##_base(const GqaBackward<E>& p, u64 task, float* w) {                            \
        pass##_in(p, task, w);                                                                 \
    }
ZINF_GQA_LEVELS(gqa_rows)
ZINF_GQA_LEVELS(gqa_keys)
#undef ZINF_GQA_LEVELS

template <class E>
void gqa_grad(const GqaBackward<E>& p) {
    static const auto rows = for_cpu(gqa_rows_v4<E>, gqa_rows_avx2<E>, gqa_rows_base<E>);
    static const auto keys = for_cpu(gqa_keys_v4<E>, gqa_keys_avx2<E>, gqa_keys_base<E>);
    const u64 B = p.B, T = p.T, NH = p.NH, KVH = p.KVH, hd = p.hd;
    const bool parallel = B * T * T * NH * hd >= kParallelMin;
    const u64 blocks = (T + kKeyBlock - 1) / kKeyBlock;
#pragma omp parallel if (parallel)
    {
        // bf16: a softmax row and a k or v row, widened (the second pass: a q row).
        std::vector<float> scratch(std::is_same_v<E, float> ? 0 : T + hd);
        float* const w = scratch.data();
#pragma omp for schedule(static, 1)
        for (u64 task = 0; task < B * NH * T; ++task) rows(p, task, w);
#pragma omp for schedule(static, 1)
        for (u64 task = 0; task < B * KVH * blocks; ++task) keys(p, task, w);
    }
}

}  // namespace

void gqa_forward(float* out, float* att, const float* q, const float* k, const float* v, u64 B, u64 T, u64 NH,
                 u64 KVH, u64 hd) {
    const u64 QC = NH * hd, KC = KVH * hd, group = NH / KVH;
    const float scale = kernel_math::attention_scale(hd);
#pragma omp parallel for schedule(static, 1) if (B * T * T * QC >= kParallelMin)
    for (u64 task = 0; task < B * T * NH; ++task) {
        const u64 h = task % NH, t = task / NH % T, b = task / NH / T, g = h / group;
        attend(att + ((b * NH + h) * T + t) * T, q + (b * T + t) * QC + h * hd, k + b * T * KC + g * hd,
               v + b * T * KC + g * hd, KC, t, T, hd, scale, out + (b * T + t) * QC + h * hd);
    }
}

void gqa_decode(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 NH, u64 KVH,
                u64 hd) {
    const u64 KC = KVH * hd, group = NH / KVH;
    const float scale = kernel_math::attention_scale(hd);
#pragma omp parallel for schedule(static, 1) if (T * NH * hd >= kParallelMin)
    for (u64 h = 0; h < NH; ++h) {
        const u64 g = h / group;
        attend(att + h * T, q + h * hd, k + g * hd, v + g * hd, KC, T - 1, T, hd, scale, out + h * hd);
    }
}

void gqa_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q, const float* k,
                  const float* v, const float* att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    gqa_grad(GqaBackward<float>{dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd});
}

void gqa_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const std::uint16_t* q,
                  const std::uint16_t* k, const std::uint16_t* v, const std::uint16_t* att, u64 B, u64 T, u64 NH,
                  u64 KVH, u64 hd) {
    gqa_grad(GqaBackward<std::uint16_t>{dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd});
}

}  // namespace zinf::device::cpu
