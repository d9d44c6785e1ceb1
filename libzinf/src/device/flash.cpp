// The cpu backend's flash attention (kernels.def: flash_*, zinf-train
// --attention flash): the causal attention of attention.cpp as an online
// softmax over tiles of keys, never forming the T x T scores, the same math
// as the cuda kernels (cuda/flash.cu):
//
//   forward   per query row i, key tiles in order: s = scale q_i.k_j;
//             m' = max(m, max s); l = l e^(m - m') + sum e^(s - m');
//             o = o e^(m - m') + sum e^(s - m') v_j; at the end o / l, and
//             lse_i = m + log l kept for the backward
//   backward  delta_i = dO_i . O_i; P_ij = e^(scale q_i.k_j - lse_i);
//             dS_ij = P_ij (dO_i.v_j - delta_i); dQ_i = scale sum_j dS_ij k_j
//             (a task per query tile, keys in order); dK_j = scale sum dS_ij
//             q_i, dV_j = sum P_ij dO_i (a task per key tile, a group's
//             query heads in order, each head's rows in order)
//
// Every task writes only its own rows, each sum has one order, so the bits
// do not depend on the thread count. bf16 q, k, v and out (kept activations)
// are widened into fp32 copies first: the fp32 kernel on the widened inputs.
#include "kernels.hpp"
#include "../util/kernel_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace zinf::device::cpu {

namespace {

// Query rows a forward or dQ task takes, and keys a dK/dV task takes.
constexpr u64 kTile = 64;

// One call's heads: row 0 of head 0 of batch row 0, and row strides
// (elements) of q, of k and v, and of out (and dO).
struct Heads {
    u64 B, T, NH, KVH, hd;
    const float *q, *k, *v;
    u64 qs, ks, os;
    const float* qrow(u64 b, u64 h, u64 t) const { return q + (b * T + t) * qs + h * hd; }
    const float* krow(u64 b, u64 g, u64 t) const { return k + (b * T + t) * ks + g * hd; }
    const float* vrow(u64 b, u64 g, u64 t) const { return v + (b * T + t) * ks + g * hd; }
    u64 orow(u64 b, u64 h, u64 t) const { return (b * T + t) * os + h * hd; }
    u64 group() const { return NH / KVH; }
};

void forward(const Heads& x, float* out, float* lse) {
    const u64 T = x.T, hd = x.hd, tiles = (T + kTile - 1) / kTile, tasks = x.B * x.NH * tiles;
    const float scale = kernel_math::attention_scale(hd), ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel if (tasks > 1 && x.B * T * x.NH * hd >= kParallelMin)
    {
        std::vector<float> s(kTile), acc(kTile * hd), m(kTile), l(kTile);
#pragma omp for schedule(dynamic)
        for (u64 task = 0; task < tasks; ++task) {
            const u64 b = task / tiles / x.NH, h = task / tiles % x.NH, i0 = task % tiles * kTile;
            const u64 i1 = std::min(T, i0 + kTile), g = h / x.group();
            std::fill(m.begin(), m.end(), ninf);
            std::fill(l.begin(), l.end(), 0.0f);
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (u64 j0 = 0; j0 < i1; j0 += kTile) {
                for (u64 i = std::max(i0, j0); i < i1; ++i) {
                    const u64 last = std::min(i, j0 + kTile - 1), r = i - i0;
                    const float* qi = x.qrow(b, h, i);
                    float mt = ninf;
                    for (u64 j = j0; j <= last; ++j) {
                        s[j - j0] = dot(qi, x.krow(b, g, j), hd) * scale;
                        mt = std::max(mt, s[j - j0]);
                    }
                    const float mn = std::max(m[r], mt), corr = std::exp(m[r] - mn);
                    float* o = acc.data() + r * hd;
                    float sum = l[r] * corr;
                    for (u64 d = 0; d < hd; ++d) o[d] *= corr;
                    for (u64 j = j0; j <= last; ++j) {
                        const float p = std::exp(s[j - j0] - mn);
                        sum += p;
                        const float* vj = x.vrow(b, g, j);
                        for (u64 d = 0; d < hd; ++d) o[d] += p * vj[d];
                    }
                    l[r] = sum;
                    m[r] = mn;
                }
            }
            for (u64 i = i0; i < i1; ++i) {
                const u64 r = i - i0;
                const float inv = 1.0f / l[r];
                float* o = out + x.orow(b, h, i);
                for (u64 d = 0; d < hd; ++d) o[d] = acc[r * hd + d] * inv;
                lse[(b * x.NH + h) * T + i] = m[r] + std::log(l[r]);
            }
        }
    }
}

// dq, dk, dv: row 0 of head 0 of batch row 0, at the row strides of q and
// of k and v. dout and out at x.os.
void backward(const Heads& x, const float* dout, const float* out, const float* lse, float* delta, float* dq,
              float* dk, float* dv) {
    const u64 B = x.B, T = x.T, NH = x.NH, KVH = x.KVH, hd = x.hd, group = x.group();
    const u64 tiles = (T + kTile - 1) / kTile;
    const float scale = kernel_math::attention_scale(hd);
    const bool parallel = B * T * NH * hd >= kParallelMin;
#pragma omp parallel for schedule(static) if (parallel)
    for (u64 row = 0; row < B * NH * T; ++row) {
        const u64 b = row / T / NH, h = row / T % NH, t = row % T;
        delta[row] = dot(dout + x.orow(b, h, t), out + x.orow(b, h, t), hd);
    }
    // dQ: a task per (b, h, query tile); each row's keys 0..i in order.
#pragma omp parallel if (parallel)
    {
        std::vector<float> acc(hd);
#pragma omp for schedule(dynamic)
        for (u64 task = 0; task < B * NH * tiles; ++task) {
            const u64 b = task / tiles / NH, h = task / tiles % NH, i0 = task % tiles * kTile;
            const u64 g = h / group;
            for (u64 i = i0; i < std::min(T, i0 + kTile); ++i) {
                const u64 row = (b * NH + h) * T + i;
                const float *qi = x.qrow(b, h, i), *doi = dout + x.orow(b, h, i);
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (u64 j = 0; j <= i; ++j) {
                    const float* kj = x.krow(b, g, j);
                    const float p = std::exp(dot(qi, kj, hd) * scale - lse[row]);
                    const float ds = p * (dot(doi, x.vrow(b, g, j), hd) - delta[row]);
                    for (u64 d = 0; d < hd; ++d) acc[d] += ds * kj[d];
                }
                float* o = dq + (b * T + i) * x.qs + h * hd;
                for (u64 d = 0; d < hd; ++d) o[d] = acc[d] * scale;
            }
        }
    }
    // dK and dV: a task per (b, kv head, key tile); each key's query heads
    // in order, each head's rows j..T-1 in order.
#pragma omp parallel if (parallel)
    {
        std::vector<float> ak(hd), av(hd);
#pragma omp for schedule(dynamic)
        for (u64 task = 0; task < B * KVH * tiles; ++task) {
            const u64 b = task / tiles / KVH, g = task / tiles % KVH, j0 = task % tiles * kTile;
            for (u64 j = j0; j < std::min(T, j0 + kTile); ++j) {
                const float *kj = x.krow(b, g, j), *vj = x.vrow(b, g, j);
                std::fill(ak.begin(), ak.end(), 0.0f);
                std::fill(av.begin(), av.end(), 0.0f);
                for (u64 h = g * group; h < (g + 1) * group; ++h)
                    for (u64 i = j; i < T; ++i) {
                        const u64 row = (b * NH + h) * T + i;
                        const float *qi = x.qrow(b, h, i), *doi = dout + x.orow(b, h, i);
                        const float p = std::exp(dot(qi, kj, hd) * scale - lse[row]);
                        const float ds = p * (dot(doi, vj, hd) - delta[row]);
                        for (u64 d = 0; d < hd; ++d) {
                            av[d] += p * doi[d];
                            ak[d] += ds * qi[d];
                        }
                    }
                float *ok = dk + (b * T + j) * x.ks + g * hd, *ov = dv + (b * T + j) * x.ks + g * hd;
                for (u64 d = 0; d < hd; ++d) {
                    ok[d] = ak[d] * scale;
                    ov[d] = av[d];
                }
            }
        }
    }
}

// A view as fp32: its own elements, or (bf16) widened into `keep`.
const float* as_f32(ConstView v, std::vector<float>& keep) {
    if (!v.is_bf16()) return v.data<float>();
    keep.resize(v.size());
    from_bf16(keep.data(), v.data<std::uint16_t>(), v.size());
    return keep.data();
}

}  // namespace

void flash_attention_forward(std::span<float> out, std::span<float> lse, std::span<const float> qkv, u64 B, u64 T,
                             u64 C, u64 NH) {
    const float* p = qkv.data();
    forward({B, T, NH, NH, C / NH, p, p + C, p + 2 * C, 3 * C, 3 * C, C}, out.data(), lse.data());
}

void flash_attention_backward(std::span<float> dqkv, std::span<float> delta, std::span<const float> dout,
                              ConstView qkv, ConstView out, std::span<const float> lse, u64 B, u64 T, u64 C, u64 NH) {
    std::vector<float> wide_qkv, wide_out;
    const float *p = as_f32(qkv, wide_qkv), *o = as_f32(out, wide_out);
    float* d = dqkv.data();
    backward({B, T, NH, NH, C / NH, p, p + C, p + 2 * C, 3 * C, 3 * C, C}, dout.data(), o, lse.data(), delta.data(), d,
             d + C, d + 2 * C);
}

void flash_gqa_forward(std::span<float> out, std::span<float> lse, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    forward({B, T, NH, KVH, hd, q.data(), k.data(), v.data(), NH * hd, KVH * hd, NH * hd}, out.data(), lse.data());
}

void flash_gqa_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv, std::span<float> delta,
                        std::span<const float> dout, ConstView q, ConstView k, ConstView v, ConstView out,
                        std::span<const float> lse, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    std::vector<float> wq, wk, wv, wo;
    backward({B, T, NH, KVH, hd, as_f32(q, wq), as_f32(k, wk), as_f32(v, wv), NH * hd, KVH * hd, NH * hd},
             dout.data(), as_f32(out, wo), lse.data(), delta.data(), dq.data(), dk.data(), dv.data());
}

}  // namespace zinf::device::cpu
