// The cuda backend's attention kernels (kernels.hpp) apart from the GEMMs:
// the causal softmax and its backward that attention_gemm.cpp runs between
// its strided-batched cuBLASLt GEMMs (Q K^T, P V; dO V^T, dS K, dS^T Q,
// P^T dO), a causal copy of the kept probabilities and a bf16 widening for
// those GEMMs' operands, the decoding rows against a key-value cache (one
// warp per head, common.cuh's attend), and the rotary embedding of q and k.
// No atomics: every sum has one order (a fixed shuffle tree or one thread).
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// ---- the GEMM decomposition's kernels (attention_gemm.cpp issues the GEMMs) --
// One warp per row r of the (rows, T) scores, its query position r % T: x =
// a[t2] * scale for t2 <= r % T, then a = exp(x - max) / sum, zero above the
// diagonal. Each lane keeps an online (max, sum) over its positions; the
// lanes meet by xor-shuffles (a fixed tree: the same bits every run), and a
// second sweep writes the row.
__global__ void softmax_causal_kernel(float* att, u64 rows, u64 T, float scale) {
    const u64 r = warp_task();
    if (r >= rows) return;  // the whole warp
    const unsigned lane = lane_id();
    const u64 last = r % T;
    float* a = att + r * T;
    float m = minus_inf(), s = 0;
    for (u64 t2 = lane; t2 <= last; t2 += 32) {
        const float x = a[t2] * scale;
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(kFull, m, o), s2 = __shfl_xor_sync(kFull, s, o);
        const float mm = fmaxf(m, m2);
        // A lane with no position holds (-inf, 0): its share is nothing.
        const float a1 = s == 0 ? 0.0f : s * expf(m - mm), a2 = s2 == 0 ? 0.0f : s2 * expf(m2 - mm);
        m = mm;
        s = a1 + a2;
    }
    const float inv = s == 0 ? 0.0f : 1.0f / s;
    for (u64 t2 = lane; t2 <= last; t2 += 32) a[t2] = expf(a[t2] * scale - m) * inv;
    for (u64 t2 = last + 1 + lane; t2 < T; t2 += 32) a[t2] = 0;
}

// The softmax's backward, one warp per row r: da (dp = dout . v on entry)
// becomes a * (da - sum_{t2 <= r % T} a da), zero above the diagonal (the
// scale is the next GEMMs' alpha). a stored fp32 or bf16 (widened); the sum
// in lanes8's order.
template <class E>
__global__ void softmax_causal_backward_kernel(float* datt, const E* att, u64 rows, u64 T) {
    const u64 r = warp_task();
    if (r >= rows) return;
    softmax_row_backward(datt + r * T, att + r * T, r % T, T);
}

// dst (rows, T) = the probabilities a (stored fp32 or bf16) on and below
// each row's diagonal (row r's query position r % T), zero above: P for dV's
// GEMM, whatever the kept att holds above the diagonal.
template <class E>
__global__ void causal_copy_kernel(float* dst, const E* att, u64 rows, u64 T) {
    for (u64 i = global_id(); i < rows * T; i += grid_threads()) {
        const u64 t2 = i % T, t = i / T % T;
        dst[i] = t2 <= t ? widen(att[i]) : 0.0f;
    }
}

// dst (rows, cols) of row stride ld_dst = src (bf16, row stride ld_src) widened.
__global__ void widen_rows_kernel(float* dst, u64 ld_dst, const std::uint16_t* src, u64 ld_src, u64 rows, u64 cols) {
    for (u64 i = global_id(); i < rows * cols; i += grid_threads()) {
        const u64 r = i / cols, c = i % cols;
        dst[r * ld_dst + c] = widen(src[r * ld_src + c]);
    }
}

// ---- decoding: one warp per head, common.cuh's attend ------------------------
__global__ void attention_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v,
                                        u64 T, u64 C, u64 NH, float scale) {
    const u64 h = warp_task();
    if (h >= NH) return;
    const u64 hs = C / NH;
    attend(att + h * T, q + h * hs, k + h * hs, v + h * hs, C, T - 1, T, hs, scale, out + h * hs);
}

__global__ void gqa_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v, u64 T,
                                  u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 h = warp_task();
    if (h >= NH) return;
    const u64 g = h / (NH / KVH);
    attend(att + h * T, q + h * hd, k + g * hd, v + g * hd, KVH * hd, T - 1, T, hd, scale, out + h * hd);
}

// ---- rotary embeddings: x (B,T,H,hd), a thread per pair (i, i + hd/2) ------
__global__ void rope_kernel(float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 half = hd / 2;
    for (u64 e = global_id(); e < B * T * H * half; e += grid_threads()) {
        const u64 i = e % half, bth = e / half, bt = bth / H;
        const float* cs = table + (pos0 + bt % T) * hd;
        float* a = x + bth * hd;
        const float c = cs[i], sn = cs[half + i], x1 = a[i], x2 = a[half + i];
        if (!inverse) {
            a[i] = x1 * c - x2 * sn;
            a[half + i] = x2 * c + x1 * sn;
        } else {
            a[i] = x1 * c + x2 * sn;
            a[half + i] = x2 * c - x1 * sn;
        }
    }
}

// `inverse`: the backward's turn the other way.
void rope(cudaStream_t s, float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 n = B * T * H * (hd / 2);
    if (n) rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, table, B, T, H, hd, pos0, inverse);
}

}  // namespace

cudaError_t preload_attention() {
    return load_kernels(softmax_causal_kernel, softmax_causal_backward_kernel<float>,
                        softmax_causal_backward_kernel<std::uint16_t>, causal_copy_kernel<float>,
                        causal_copy_kernel<std::uint16_t>, widen_rows_kernel, attention_decode_kernel,
                        gqa_decode_kernel, rope_kernel);
}

void softmax_causal(cudaStream_t s, float* att, u64 rows, u64 T, float scale) {
    if (rows && T) softmax_causal_kernel<<<blocks_for(rows, kWarps), kThreads, 0, s>>>(att, rows, T, scale);
}

void softmax_causal_backward(cudaStream_t s, float* datt, ConstView att, u64 rows, u64 T) {
    if (!rows || !T) return;
    with_dtype(att.dtype(), [&](auto e) {
        using E = decltype(e);
        softmax_causal_backward_kernel<<<blocks_for(rows, kWarps), kThreads, 0, s>>>(datt, att.data<E>(), rows, T);
    });
}

void causal_copy(cudaStream_t s, float* dst, ConstView att, u64 rows, u64 T) {
    if (!rows || !T) return;
    with_dtype(att.dtype(), [&](auto e) {
        using E = decltype(e);
        causal_copy_kernel<<<blocks_for(rows * T), kThreads, 0, s>>>(dst, att.data<E>(), rows, T);
    });
}

void widen_rows(cudaStream_t s, float* dst, u64 ld_dst, const std::uint16_t* src, u64 ld_src, u64 rows, u64 cols) {
    if (rows && cols)
        widen_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(dst, ld_dst, src, ld_src, rows, cols);
}

void attention_decode(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) {
    if (!T || !C) return;
    attention_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, l.stream>>>(
        out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH, kernel_math::attention_scale(C / NH));
}

void gqa_decode(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    if (NH && T)
        gqa_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, l.stream>>>(
            out.data(), att.data(), q.data(), k.data(), v.data(), T, NH, KVH, hd, kernel_math::attention_scale(hd));
}

void rope_forward(const Launch& l, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                  u64 pos0) {
    rope(l.stream, x.data(), table.data(), B, T, H, hd, pos0, false);
}

void rope_backward(const Launch& l, std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                   u64 pos0) {
    rope(l.stream, dx.data(), table.data(), B, T, H, hd, pos0, true);
}

}  // namespace zinf::device::cuda
