// The cpu backend's norms (kernels.def): LayerNorm (GPT-2, llm.c's
// layernorm) and RMSNorm (the Llama family). A row per task forward; the
// backward's dinp a row per task, its weight (and bias) gradients column
// sums (kernels.hpp's column_sums: chunks of rows, then the chunks, in one
// order whatever the thread count). RMSNorm
// is LayerNorm's code path without the mean.
#include "kernels.hpp"
#include "../util/kernel_math.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace zinf::device::cpu {

namespace {

// Row r of LayerNorm's forward.
inline void layernorm_row(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                          u64 r, u64 C) {
    const float inv_c = 1.0f / static_cast<float>(C);
    const float* x = inp + r * C;
    float* o = out + r * C;
    const float m = sum(x, C) * inv_c;
    // The centred values go through `o` first: a two-pass variance.
    for (u64 c = 0; c < C; ++c) o[c] = x[c] - m;
    const float var = dot(o, o, C) * inv_c;  // biased, as torch
    const float s = 1.0f / std::sqrt(var + kernel_math::kLayerNormEps);
    for (u64 c = 0; c < C; ++c) o[c] = o[c] * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
}

void layernorm_rows(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, u64 N,
                    u64 C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 r = 0; r < N; ++r) layernorm_row(out, mean, rstd, inp, w, b, r, C);
}

// The residual add (accumulate's), the row rounded into `kept` and widened
// back where it is given (cast's, both ways), then the norm: a row at a
// time, the bits of the kernels in turn.
void residual_layernorm_rows(float* out, float* mean, float* rstd, float* res, const float* add, std::uint16_t* kept,
                             const float* w, const float* b, u64 N, u64 C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
        float* h = res + r * C;
        const float* a = add + r * C;
        for (u64 c = 0; c < C; ++c) h[c] += a[c];
        if (kept) {
            std::uint16_t* k = kept + r * C;
            for (u64 c = 0; c < C; ++c) {
                k[c] = zinf::to_bf16(h[c]);
                h[c] = zinf::from_bf16(k[c]);
            }
        }
        layernorm_row(out, mean, rstd, res, w, b, r, C);
    }
}

// Row r of RMSNorm's forward.
inline void rmsnorm_row(float* out, float* rstd, const float* inp, const float* w, u64 r, u64 C, float eps) {
    const float* x = inp + r * C;
    float* o = out + r * C;
    const float s = 1.0f / std::sqrt(dot(x, x, C) * (1.0f / static_cast<float>(C)) + eps);
    for (u64 c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
    rstd[r] = s;
}

void rmsnorm_rows(float* out, float* rstd, const float* inp, const float* w, u64 N, u64 C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kLightParallelMin)
    for (u64 r = 0; r < N; ++r) rmsnorm_row(out, rstd, inp, w, r, C, eps);
}

// The residual add is accumulate's (elementwise.cpp) a row at a time, so the
// bits are those of the two kernels in turn; but one pass over the rows, and
// one parallel region where the add took one and the norm ran on one thread
// (a Llama block's post-attention norm: BENCHMARKS.md).
void residual_rmsnorm_rows(float* out, float* rstd, float* res, const float* add, const float* w, u64 N, u64 C,
                           float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
        float* h = res + r * C;
        const float* a = add + r * C;
        for (u64 c = 0; c < C; ++c) h[c] += a[c];
        rmsnorm_row(out, rstd, res, w, r, C, eps);
    }
}

// The norms' backward, LayerNorm's (kMean) or RMSNorm's (no mean, no bias):
// dinp a row per task; dw (and db) column_sums. Each
// element's expression is its norm's own, in its order. In: float, or
// std::uint16_t for inp stored bf16 (widened as read). Below parallel_min
// elements, on the calling thread.
template <bool kMean, class In>
void norm_grad(float* dinp, float* dw, float* db, const float* dout, const In* inp, const float* w,
               const float* mean, const float* rstd, u64 N, u64 C, u64 parallel_min) {
    const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel if (N * C >= parallel_min)
    {
        std::vector<float> norm(C), dnorm(C);
#pragma omp for schedule(static)
        for (u64 r = 0; r < N; ++r) {
            const In* x = inp + r * C;
            const float* d = dout + r * C;
            const float m = kMean ? mean[r] : 0.0f, s = rstd[r];
            for (u64 c = 0; c < C; ++c) {
                if constexpr (kMean)
                    norm[c] = (widen(x[c]) - m) * s;
                else
                    norm[c] = widen(x[c]) * s;
                dnorm[c] = w[c] * d[c];
            }
            const float dnorm_norm_mean = dot(dnorm.data(), norm.data(), C) * inv_c;
            float* di = dinp + r * C;
            if constexpr (kMean) {
                const float dnorm_mean = sum(dnorm.data(), C) * inv_c;
                for (u64 c = 0; c < C; ++c) di[c] += (dnorm[c] - dnorm_mean - norm[c] * dnorm_norm_mean) * s;
            } else {
                for (u64 c = 0; c < C; ++c) di[c] += (dnorm[c] - norm[c] * dnorm_norm_mean) * s;
            }
        }
    }
    if constexpr (kMean) {
        float* const out[2] = {dw, db};
        column_sums(out, N, C, parallel_min, [&](u64 r, u64 c, float* v) {
            const float d = dout[r * C + c];
            v[0] = (widen(inp[r * C + c]) - mean[r]) * rstd[r] * d;
            v[1] = d;
        });
    } else {
        float* const out[1] = {dw};
        column_sums(out, N, C, parallel_min,
                    [&](u64 r, u64 c, float* v) { v[0] = widen(inp[r * C + c]) * rstd[r] * dout[r * C + c]; });
    }
}

}  // namespace

void layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N, u64 C) {
    layernorm_rows(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
}

void residual_layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                std::span<float> res, std::span<const float> add, View kept, std::span<const float> w,
                                std::span<const float> b, u64 N, u64 C) {
    residual_layernorm_rows(out.data(), mean.data(), rstd.data(), res.data(), add.data(),
                            kept.empty() ? nullptr : kept.data<std::uint16_t>(), w.data(), b.data(), N, C);
}

void layernorm_backward(std::span<float> dinp, std::span<float> dw, std::span<float> db, std::span<const float> dout,
                        ConstView inp, std::span<const float> w, std::span<const float> mean,
                        std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        norm_grad<true>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data<decltype(e)>(), w.data(), mean.data(),
                        rstd.data(), N, C, kParallelMin);
    });
}

void rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                     std::span<const float> w, u64 N, u64 C, float eps) {
    rmsnorm_rows(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
}

void residual_rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<float> res,
                              std::span<const float> add, std::span<const float> w, u64 N, u64 C, float eps) {
    residual_rmsnorm_rows(out.data(), rstd.data(), res.data(), add.data(), w.data(), N, C, eps);
}

void rmsnorm_backward(std::span<float> dinp, std::span<float> dw, std::span<const float> dout, ConstView inp,
                      std::span<const float> w, std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        norm_grad<false>(dinp.data(), dw.data(), nullptr, dout.data(), inp.data<decltype(e)>(), w.data(), nullptr,
                         rstd.data(), N, C, kLightParallelMin);
    });
}

}  // namespace zinf::device::cpu
