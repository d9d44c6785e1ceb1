// The cpu backend's softmax kernels: causal self-attention (llm.c's
// attention_forward/backward without the pre-softmax buffer) and the softmax
// cross-entropy with its fused gradient.
#include "kernels.hpp"
#include "../util/kernel_math.hpp"

#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace zinf::device::cpu {

// ---------------------------------------------------------------------------
// qkv (B,T,3C) is [q | k | v] per position, head h the columns [h*hs, (h+1)*hs)
// of each third. One task per (b, t, h): its softmax row and its output slice.
void attention_forward(float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH) {
    const u64 hs = C / NH, C3 = 3 * C;
    const float scale = kernel_math::attention_scale(hs);
#pragma omp parallel for schedule(static, 1) if (B * T * T * C >= kParallelMin)
    for (u64 task = 0; task < B * T * NH; ++task) {
        const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
        const float* q = qkv + (b * T + t) * C3 + h * hs;
        float* a = att + ((b * NH + h) * T + t) * T;

        float maxval = -std::numeric_limits<float>::infinity();
        for (u64 t2 = 0; t2 <= t; ++t2) {
            const float* k = qkv + (b * T + t2) * C3 + C + h * hs;
            a[t2] = dot(q, k, hs) * scale;
            maxval = std::max(maxval, a[t2]);
        }
        float expsum = 0;
        for (u64 t2 = 0; t2 <= t; ++t2) {
            a[t2] = std::exp(a[t2] - maxval);
            expsum += a[t2];
        }
        const float inv = expsum == 0 ? 0.0f : 1.0f / expsum;
        for (u64 t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (u64 t2 = t + 1; t2 < T; ++t2) a[t2] = 0;

        float* o = out + (b * T + t) * C + h * hs;
        std::fill(o, o + hs, 0.0f);
        for (u64 t2 = 0; t2 <= t; ++t2) {
            const float* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
            const float w = a[t2];
            for (u64 i = 0; i < hs; ++i) o[i] += w * v[i];
        }
    }
}

// attention_forward's row T-1 alone, over keys and values kept (T,C) each:
// one task per head, each step of it as attention_forward takes it, so a
// decoded position's output is the full forward's to the bit.
void attention_decode(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 C, u64 NH) {
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
namespace {
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
}  // namespace

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, u64 B,
                        u64 T, u64 C, u64 NH) {
    attention_grad(dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void attention_backward(float* dqkv, float* datt, const float* dout, const std::uint16_t* qkv,
                        const std::uint16_t* att, u64 B, u64 T, u64 C, u64 NH) {
    attention_grad(dqkv, datt, dout, qkv, att, B, T, C, NH);
}

// ---------------------------------------------------------------------------
namespace {

void check_targets(const std::int32_t* targets, u64 N, u64 V) {
    for (u64 i = 0; i < N; ++i) {
        const std::int64_t v = targets[i];
        if (v < 0 || static_cast<u64>(v) >= V) throw bad_target(v, i, V);
    }
}

float row_max(const float* x, u64 V) {
    float m = -std::numeric_limits<float>::infinity();
    for (u64 j = 0; j < V; ++j) m = std::max(m, x[j]);
    return m;
}

// sum_j e[j] in double, four lanes (j mod 4) added pairwise.
double sum_double(const float* e, u64 V) {
    double acc[4] = {};
    u64 j = 0;
    for (; j + 4 <= V; j += 4)
        for (int l = 0; l < 4; ++l) acc[l] += e[j + l];
    double tail = 0;
    for (; j < V; ++j) tail += e[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + tail;
}

// -log softmax(x)[target] = log sum_j exp(x[j] - max) - (x[target] - max).
float nll(double expsum, float xt, float maxval) {
    return static_cast<float>(std::log(expsum) - (static_cast<double>(xt) - maxval));
}

}  // namespace

void crossentropy_forward_backward(float* losses, float* logits, const std::int32_t* targets, float dloss, u64 N,
                                   u64 V) {
    check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
    for (u64 i = 0; i < N; ++i) {
        float* x = logits + i * V;
        const u64 target = static_cast<u64>(targets[i]);
        const float maxval = row_max(x, V), xt = x[target];
        for (u64 j = 0; j < V; ++j) x[j] = std::exp(x[j] - maxval);  // the row now holds the exps
        const double expsum = sum_double(x, V);
        losses[i] = nll(expsum, xt, maxval);
        const float inv = static_cast<float>(1.0 / expsum);
        for (u64 j = 0; j < V; ++j) x[j] = dloss * (x[j] * inv - (j == target ? 1.0f : 0.0f));
    }
}

void crossentropy_forward(float* losses, const float* logits, const std::int32_t* targets, u64 N, u64 V) {
    check_targets(targets, N, V);
#pragma omp parallel if (N * V >= kParallelMin)
    {
        std::vector<float> e(V);
#pragma omp for schedule(static)
        for (u64 i = 0; i < N; ++i) {
            const float* x = logits + i * V;
            const float maxval = row_max(x, V);
            for (u64 j = 0; j < V; ++j) e[j] = std::exp(x[j] - maxval);
            losses[i] = nll(sum_double(e.data(), V), x[targets[i]], maxval);
        }
    }
}

}  // namespace zinf::device::cpu
