// The cpu backend's attention kernels (kernels.def): the GPT's causal
// self-attention over a packed qkv (llm.c's attention_forward/backward
// without the pre-softmax buffer), the Llama family's grouped-query attention
// with the query and key-value heads apart, their decoding rows against a
// key-value cache, and the rotary embedding of q and k. The backward of
// grouped-query attention is two passes: one task per (batch, query head,
// position) writing its datt row and dq, then one task per (batch, kv head,
// block of key positions) summing dk and dv over the group's query heads,
// then the query positions, in that order.
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

// ---------------------------------------------------------------------------
// Attention's tasks are built once per instruction-set level (util/cpu.hpp):
// the same operations in the same order at every level (dot's eight lanes,
// the per-element sums, libm's exp, no fused multiply-add), so the bits are
// the same at every level, and the same for the GPT's heads and for
// grouped-query heads with as many kv heads as query heads.
// One softmax row over keys 0..last (at k + t2 * kstride) for the query q,
// into a (len entries, zero past last), then o (hd) = sum_t2 a[t2] v[t2]:
// llm.c's attention_forward steps, in its order.
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

// attention_forward's row T-1 alone, over keys and values kept (T,C) each:
// one task per head, each step of it as attention_forward takes it, so a
// decoded position's output is the full forward's to the bit.
void attention_decode_heads(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 C,
                            u64 NH) {
    const u64 hs = C / NH;
    const float scale = kernel_math::attention_scale(hs);
#pragma omp parallel for schedule(static, 1) if (T * C >= kParallelMin)
    for (u64 h = 0; h < NH; ++h) {
        const float* qh = q + h * hs;
        float* a = att + h * T;
        float maxval = -std::numeric_limits<float>::infinity();
        for (u64 t2 = 0; t2 < T; ++t2) {
            a[t2] = dot(qh, k + t2 * C + h * hs, hs) * scale;
            maxval = std::max(maxval, a[t2]);
        }
        float expsum = 0;
        for (u64 t2 = 0; t2 < T; ++t2) {
            a[t2] = std::exp(a[t2] - maxval);
            expsum += a[t2];
        }
        const float inv = expsum == 0 ? 0.0f : 1.0f / expsum;
        for (u64 t2 = 0; t2 < T; ++t2) a[t2] *= inv;

        float* o = out + h * hs;
        std::fill(o, o + hs, 0.0f);
        for (u64 t2 = 0; t2 < T; ++t2) {
            const float* vh = v + t2 * C + h * hs;
            const float w = a[t2];
            for (u64 i = 0; i < hs; ++i) o[i] += w * vh[i];
        }
    }
}

// One task per (b, h): it owns the q, k and v gradient columns of head h in
// batch row b for every t, so each dqkv element is written by one thread,
// and the k and v gradients sum over t in order. The softmax backward is
// datt_pre[t2] = att[t2] * (datt[t2] - sum_t3 att[t3] datt[t3]), in place in
// datt. qkv and att stored bf16 (E std::uint16_t) are widened a row at a
// time into the task's scratch and read there: the same arithmetic on the
// same values as the fp32 kernel on their fp32 copies.
template <class E>
void attention_grad(float* dqkv, float* datt, const float* dout, const E* qkv, const E* att, u64 B, u64 T, u64 C,
                    u64 NH) {
    const u64 hs = C / NH, C3 = 3 * C;
    const float scale = kernel_math::attention_scale(hs);
    constexpr bool kWiden = !std::is_same_v<E, float>;
#pragma omp parallel if (B * T * T * C >= kParallelMin)
    {
        // bf16: a softmax row, q, and a v or k row, widened.
        std::vector<float> scratch(kWiden ? T + 2 * hs : 0);
        float* const wa = scratch.data();
        float* const wq = wa + (kWiden ? T : 0);
        float* const wkv = wq + (kWiden ? hs : 0);
#pragma omp for schedule(static, 1)
        for (u64 task = 0; task < B * NH; ++task) {
            const u64 h = task % NH, b = task / NH;
            for (u64 t = 0; t < T; ++t) {
                float* d = dqkv + (b * T + t) * C3 + h * hs;
                std::fill(d, d + hs, 0.0f);
                std::fill(d + C, d + C + hs, 0.0f);
                std::fill(d + 2 * C, d + 2 * C + hs, 0.0f);
            }
            for (u64 t = 0; t < T; ++t) {
                const float* a = wide(att + ((b * NH + h) * T + t) * T, t + 1, wa);
                float* da = datt + ((b * NH + h) * T + t) * T;
                const float* go = dout + (b * T + t) * C + h * hs;
                const float* q = wide(qkv + (b * T + t) * C3 + h * hs, hs, wq);
                float* dq = dqkv + (b * T + t) * C3 + h * hs;

                // out = sum_t2 a[t2] v[t2]: into datt and dv.
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const float* v = wide(qkv + (b * T + t2) * C3 + 2 * C + h * hs, hs, wkv);
                    float* dv = dqkv + (b * T + t2) * C3 + 2 * C + h * hs;
                    da[t2] = dot(v, go, hs);
                    const float w = a[t2];
                    for (u64 i = 0; i < hs; ++i) dv[i] += w * go[i];
                }
                // Through the softmax.
                const float s = dot(a, da, t + 1);
                for (u64 t2 = 0; t2 <= t; ++t2) da[t2] = a[t2] * (da[t2] - s);
                for (u64 t2 = t + 1; t2 < T; ++t2) da[t2] = 0;
                // pre[t2] = scale * q . k[t2]: into dq and dk.
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const float* k = wide(qkv + (b * T + t2) * C3 + C + h * hs, hs, wkv);
                    float* dk = dqkv + (b * T + t2) * C3 + C + h * hs;
                    const float g = da[t2] * scale;
                    for (u64 i = 0; i < hs; ++i) {
                        dq[i] += g * k[i];
                        dk[i] += g * q[i];
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
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
// of each third. One task per (b, t, h): its softmax row and its output slice.
void attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B, u64 T, u64 C,
                       u64 NH) {
    const u64 hs = C / NH, C3 = 3 * C;
    const float scale = kernel_math::attention_scale(hs);
#pragma omp parallel for schedule(static, 1) if (B * T * T * C >= kParallelMin)
    for (u64 task = 0; task < B * T * NH; ++task) {
        const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
        const float* base = qkv.data() + b * T * C3 + h * hs;  // head h's q at position 0
        attend(att.data() + ((b * NH + h) * T + t) * T, base + t * C3, base + C, base + 2 * C, C3, t, T, hs, scale,
               out.data() + (b * T + t) * C + h * hs);
    }
}

void attention_backward(std::span<float> dqkv, std::span<float> datt, std::span<const float> dout, ConstView qkv,
                        ConstView att, u64 B, u64 T, u64 C, u64 NH) {
    with_dtype(qkv.dtype(), [&](auto e) {
        using E = decltype(e);
        attention_grad(dqkv.data(), datt.data(), dout.data(), qkv.data<E>(), att.data<E>(), B, T, C, NH);
    });
}

void attention_decode(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, u64 T, u64 C, u64 NH) {
    attention_decode_heads(out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH);
}

void gqa_forward(std::span<float> out, std::span<float> att, std::span<const float> q, std::span<const float> k,
                 std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const u64 QC = NH * hd, KC = KVH * hd, group = NH / KVH;
    const float scale = kernel_math::attention_scale(hd);
#pragma omp parallel for schedule(static, 1) if (B * T * T * QC >= kParallelMin)
    for (u64 task = 0; task < B * T * NH; ++task) {
        const u64 h = task % NH, t = task / NH % T, b = task / NH / T, g = h / group;
        attend(att.data() + ((b * NH + h) * T + t) * T, q.data() + (b * T + t) * QC + h * hd,
               k.data() + b * T * KC + g * hd, v.data() + b * T * KC + g * hd, KC, t, T, hd, scale,
               out.data() + (b * T + t) * QC + h * hd);
    }
}

void gqa_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv, std::span<float> datt,
                  std::span<const float> dout, ConstView q, ConstView k, ConstView v, ConstView att, u64 B, u64 T,
                  u64 NH, u64 KVH, u64 hd) {
    with_dtype(q.dtype(), [&](auto e) {
        using E = decltype(e);
        gqa_grad(GqaBackward<E>{dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), q.data<E>(), k.data<E>(),
                                v.data<E>(), att.data<E>(), B, T, NH, KVH, hd});
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
