// The cpu backend's row-wise and element-wise kernels: bias, embedding,
// layernorm, GELU, residual, casts. Forward and backward follow llm.c's
// train_gpt2.c, with its sums over rows (dbias, dwte, dwpe, dw, db) done
// per column block so that each element's sum runs over the rows in order
// whatever the thread count.
#include "kernels.hpp"
#include "../util/kernel_math.hpp"

#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace zinf::device::cpu {

namespace {

u64 column_blocks(u64 C) { return (C + kColumnBlock - 1) / kColumnBlock; }

// tokens (B,T): each in [0, V), else DataError naming where.
void check_tokens(const std::int32_t* tokens, u64 B, u64 T, u64 V) {
    for (u64 b = 0; b < B; ++b)
        for (u64 t = 0; t < T; ++t) {
            const std::int64_t v = tokens[b * T + t];
            if (v < 0 || static_cast<u64>(v) >= V) throw bad_token(v, b, t, V);
        }
}

}  // namespace

// ---------------------------------------------------------------------------
}  // namespace zinf::device::cpu

namespace zinf::device {
using cpu::u64;
namespace {
std::string not_an_id(std::int64_t v, u64 V) {
    return v < 0 ? "a valid token id (negative)" : "below the vocabulary size " + std::to_string(V);
}
}  // namespace

DataError bad_token(std::int64_t v, u64 b, u64 t, u64 V) {
    return DataError("token " + std::to_string(v) + " at batch row " + std::to_string(b) + ", position " +
                     std::to_string(t) + " is not " + not_an_id(v, V));
}

DataError bad_target(std::int64_t v, u64 row, u64 V) {
    return DataError("target " + std::to_string(v) + " at row " + std::to_string(row) + " is not " + not_an_id(v, V));
}
}  // namespace zinf::device

namespace zinf::device::cpu {

// ---------------------------------------------------------------------------
void bias_add(float* out, const float* bias, u64 N, u64 OC) {
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
        float* row = out + r * OC;
        for (u64 o = 0; o < OC; ++o) row[o] += bias[o];
    }
}

void bias_backward(float* dbias, const float* dout, u64 N, u64 OC) {
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin)
    for (u64 blk = 0; blk < column_blocks(OC); ++blk) {
        const u64 c0 = blk * kColumnBlock, c1 = std::min(OC, c0 + kColumnBlock);
        for (u64 r = 0; r < N; ++r) {
            const float* row = dout + r * OC;
            for (u64 o = c0; o < c1; ++o) dbias[o] += row[o];
        }
    }
}

// ---------------------------------------------------------------------------
namespace {
template <class W>
void embedding_rows(float* out, const std::int32_t* tokens, const W* wte, const W* wpe, u64 B, u64 T, u64 C, u64 V) {
    check_tokens(tokens, B, T, V);
#pragma omp parallel for schedule(static) if (B * T * C >= kParallelMin)
    for (u64 bt = 0; bt < B * T; ++bt) {
        const u64 t = bt % T;
        const W* te = wte + static_cast<u64>(tokens[bt]) * C;
        float* o = out + bt * C;
        if (!wpe) {  // no position table (rotary embeddings)
            for (u64 c = 0; c < C; ++c) o[c] = widen(te[c]);
            continue;
        }
        const W* pe = wpe + t * C;
        for (u64 c = 0; c < C; ++c) o[c] = widen(te[c]) + widen(pe[c]);
    }
}
}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, u64 B, u64 T,
                       u64 C, u64 V) {
    embedding_rows(out, tokens, wte, wpe, B, T, C, V);
}

void embedding_forward(float* out, const std::int32_t* tokens, const std::uint16_t* wte, const std::uint16_t* wpe,
                       u64 B, u64 T, u64 C, u64 V) {
    embedding_rows(out, tokens, wte, wpe, B, T, C, V);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, u64 B, u64 T,
                        u64 C, u64 V) {
    check_tokens(tokens, B, T, V);
#pragma omp parallel for schedule(static) if (B * T * C >= kParallelMin)
    for (u64 blk = 0; blk < column_blocks(C); ++blk) {
        const u64 c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
        for (u64 bt = 0; bt < B * T; ++bt) {
            const float* d = dout + bt * C;
            float* te = dwte + static_cast<u64>(tokens[bt]) * C;
            if (!dwpe) {
                for (u64 c = c0; c < c1; ++c) te[c] += d[c];
                continue;
            }
            float* pe = dwpe + (bt % T) * C;
            for (u64 c = c0; c < c1; ++c) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

// ---------------------------------------------------------------------------
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       u64 N, u64 C) {
    const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
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
}

namespace {
// In: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class In>
void layernorm_grad(float* dinp, float* dw, float* db, const float* dout, const In* inp, const float* w,
                    const float* mean, const float* rstd, u64 N, u64 C) {
    const float inv_c = 1.0f / static_cast<float>(C);
    // dinp: each row on its own.
#pragma omp parallel if (N * C >= kParallelMin)
    {
        std::vector<float> norm(C), dnorm(C);
#pragma omp for schedule(static)
        for (u64 r = 0; r < N; ++r) {
            const In* x = inp + r * C;
            const float* d = dout + r * C;
            const float m = mean[r], s = rstd[r];
            for (u64 c = 0; c < C; ++c) {
                norm[c] = (widen(x[c]) - m) * s;
                dnorm[c] = w[c] * d[c];
            }
            const float dnorm_mean = sum(dnorm.data(), C) * inv_c;
            const float dnorm_norm_mean = dot(dnorm.data(), norm.data(), C) * inv_c;
            float* di = dinp + r * C;
            for (u64 c = 0; c < C; ++c) di[c] += (dnorm[c] - dnorm_mean - norm[c] * dnorm_norm_mean) * s;
        }
    }
    // dw, db: sums over the rows, per column block.
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (u64 blk = 0; blk < column_blocks(C); ++blk) {
        const u64 c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
        for (u64 r = 0; r < N; ++r) {
            const In* x = inp + r * C;
            const float* d = dout + r * C;
            const float m = mean[r], s = rstd[r];
            for (u64 c = c0; c < c1; ++c) {
                dw[c] += (widen(x[c]) - m) * s * d[c];
                db[c] += d[c];
            }
        }
    }
}
}  // namespace

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, u64 N, u64 C) {
    layernorm_grad(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const std::uint16_t* inp,
                        const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    layernorm_grad(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

// ---------------------------------------------------------------------------
namespace {
template <class Out>
Out store(float x) {
    if constexpr (std::is_same_v<Out, float>) return x;
    else return zinf::to_bf16(x);
}

// GELU's tanh form in kernel_math's arithmetic (its tanh has no libm, so
// that the loops vectorise).
template <class In, class Out>
void gelu_rows(Out* out, const In* inp, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) out[i] = store<Out>(kernel_math::gelu(widen(inp[i])));
}

template <class In>
void gelu_grad(float* dinp, const In* inp, const float* dout, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) dinp[i] = kernel_math::gelu_grad(widen(inp[i]), dout[i]);
}
}  // namespace

void gelu_forward(float* out, const float* inp, u64 n) { gelu_rows(out, inp, n); }
void gelu_forward(std::uint16_t* out, const std::uint16_t* inp, u64 n) { gelu_rows(out, inp, n); }
void gelu_backward(float* dinp, const float* inp, const float* dout, u64 n) { gelu_grad(dinp, inp, dout, n); }
void gelu_backward(float* dinp, const std::uint16_t* inp, const float* dout, u64 n) { gelu_grad(dinp, inp, dout, n); }

// ---------------------------------------------------------------------------
void copy_rows(float* dst, u64 ld_dst, const float* src, u64 ld_src, u64 rows, u64 cols) {
    for (u64 r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, cols * sizeof(float));
}

void residual_forward(float* out, const float* a, const float* b, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* acc, const float* x, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) acc[i] += x[i];
}

namespace {
// util's vectorised conversion, one piece per task.
template <class To, class From>
void convert(To* dst, const From* src, u64 n) {
    constexpr u64 kPiece = 1 << 16;
    const u64 pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (u64 p = 0; p < pieces; ++p) {
        const u64 first = p * kPiece, len = std::min(kPiece, n - first);
        if constexpr (std::is_same_v<To, float>)
            zinf::from_bf16(std::span<const From>(src + first, len), std::span<To>(dst + first, len));
        else
            zinf::to_bf16(std::span<const From>(src + first, len), std::span<To>(dst + first, len));
    }
}
}  // namespace

void to_bf16(std::uint16_t* dst, const float* src, u64 n) { convert(dst, src, n); }
void from_bf16(float* dst, const std::uint16_t* src, u64 n) { convert(dst, src, n); }

}  // namespace zinf::device::cpu
