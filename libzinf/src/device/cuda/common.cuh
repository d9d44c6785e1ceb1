// What the cuda kernel files share: launch sizes, the cpu backend's
// reduction orders (device/kernels.hpp: dot and sum in eight lanes), and the
// attention row both families' kernels run (attention.cu).
#pragma once

#include "kernels.hpp"

#include "../../util/kernel_math.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace zinf::device::cuda {

inline constexpr unsigned kThreads = 256;  // per block, every kernel
inline constexpr unsigned kFull = 0xffffffffu;

// Blocks for n independent items of `per` threads' work, capped so that a
// grid-stride loop covers the rest (grid.x takes 2^31 - 1).
inline unsigned blocks_for(u64 n, u64 per_block = kThreads) {
    const u64 b = (n + per_block - 1) / per_block;
    return static_cast<unsigned>(b < (1u << 30) ? (b ? b : 1) : (1u << 30));
}

// cudaFuncGetAttributes on each kernel: the first error, or cudaSuccess.
template <class... K>
cudaError_t load_kernels(K... kernels) {
    cudaError_t first = cudaSuccess;
    cudaFuncAttributes attr;
    ((first = first == cudaSuccess ? cudaFuncGetAttributes(&attr, kernels) : first), ...);
    return first;
}

__device__ inline u64 global_id() { return u64{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ inline u64 grid_threads() { return u64{gridDim.x} * blockDim.x; }

// To bf16, nearest even (kernel_math's, util's to_bf16).
__device__ inline std::uint16_t round_bf16(float f) { return kernel_math::bf16_round(f); }

// An element stored fp32 or bf16 (std::uint16_t), read as fp32 (exact) and
// written from fp32 (bf16: rounded): kernels templated on the storage.
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(std::uint16_t x) { return kernel_math::bf16_widen(x); }
__device__ inline void put(float* p, float x) { *p = x; }
__device__ inline void put(std::uint16_t* p, float x) { *p = round_bf16(x); }

// The cpu backend's dot(a, b, n) on one thread, every operation in its order
// (a stored fp32 or bf16: widened as read).
template <class A>
__device__ inline float dot8(const A* a, const float* b, u64 n) {
    float acc[8] = {};
    u64 i = 0;
    for (; i + 8 <= n; i += 8)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += widen(a[i + j]) * b[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += widen(a[i]) * b[i];
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

// The same order over eight threads of a warp (an aligned group: lane j of
// the group is threadIdx.x % 8) for sum_i elem(i): lane j walks i = j mod 8
// over the whole groups of eight, the lanes meet by xor-shuffles 1, 2, 4
// (which is ((0+1)+(2+3))+((4+5)+(6+7)): float addition commutes exactly),
// and each adds the tail in order. Every lane of the warp must call it.
template <class F>
__device__ inline float lanes8(F elem, u64 n) {
    const unsigned j = threadIdx.x & 7u;
    const u64 full = n / 8 * 8;
    float acc = 0;
    for (u64 i = j; i < full; i += 8) acc += elem(i);
    acc = acc + __shfl_xor_sync(kFull, acc, 1);
    acc = acc + __shfl_xor_sync(kFull, acc, 2);
    acc = acc + __shfl_xor_sync(kFull, acc, 4);
    float tail = 0;
    for (u64 i = full; i < n; ++i) tail += elem(i);
    return acc + tail;
}

// ---- 128-bit loads and stores (norms.cu, elementwise.cu) -------------------------
// W consecutive elements (W 1, 4 or 8), stored fp32 or bf16, as fp32:
// float4 loads and stores for fp32 (two for W 8), one 64-bit (W 4) or
// 128-bit (W 8) load or store for bf16, widened exactly or rounded to
// nearest even as widen() and put() do. The caller has checked the
// alignment (aligned16).
template <int W>
struct Pack {
    float v[W];
};
template <int W>
__device__ inline Pack<W> load(const float* p) {
    Pack<W> a;
    if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4) {
            const float4 t = *reinterpret_cast<const float4*>(p + k);
            a.v[k] = t.x, a.v[k + 1] = t.y, a.v[k + 2] = t.z, a.v[k + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) a.v[k] = p[k];
    }
    return a;
}
// Two bf16 in a 32-bit word, the first in the low half (little-endian).
__device__ inline void widen2(unsigned u, float* two) {
    two[0] = __uint_as_float(u << 16);
    two[1] = __uint_as_float(u & 0xffff0000u);
}
__device__ inline unsigned round2(float a, float b) {
    return unsigned{round_bf16(a)} | (unsigned{round_bf16(b)} << 16);
}
template <int W>
__device__ inline Pack<W> load(const std::uint16_t* p) {
    Pack<W> a;
    if constexpr (W % 8 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 8) {
            const uint4 t = *reinterpret_cast<const uint4*>(p + k);
            widen2(t.x, a.v + k), widen2(t.y, a.v + k + 2), widen2(t.z, a.v + k + 4), widen2(t.w, a.v + k + 6);
        }
    } else if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4) {
            const uint2 t = *reinterpret_cast<const uint2*>(p + k);
            widen2(t.x, a.v + k), widen2(t.y, a.v + k + 2);
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) a.v[k] = widen(p[k]);
    }
    return a;
}
template <int W>
__device__ inline void store(float* p, const Pack<W>& a) {
    if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4)
            *reinterpret_cast<float4*>(p + k) = make_float4(a.v[k], a.v[k + 1], a.v[k + 2], a.v[k + 3]);
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) p[k] = a.v[k];
    }
}
template <int W>
__device__ inline void store(std::uint16_t* p, const Pack<W>& a) {
    if constexpr (W % 8 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 8)
            *reinterpret_cast<uint4*>(p + k) = make_uint4(round2(a.v[k], a.v[k + 1]), round2(a.v[k + 2], a.v[k + 3]),
                                                          round2(a.v[k + 4], a.v[k + 5]), round2(a.v[k + 6], a.v[k + 7]));
    } else if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4)
            *reinterpret_cast<uint2*>(p + k) = make_uint2(round2(a.v[k], a.v[k + 1]), round2(a.v[k + 2], a.v[k + 3]));
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) put(p + k, a.v[k]);
    }
}

// Every pointer given (null ones skipped) 16-byte aligned.
inline bool aligned16(std::initializer_list<const void*> ps) {
    for (const void* p : ps)
        if (p && reinterpret_cast<std::uintptr_t>(p) % 16) return false;
    return true;
}

// One task a warp: the attention kernels' warps per block.
inline constexpr unsigned kWarps = kThreads / 32;

// A warp's task, and a thread's lane in its warp.
__device__ inline u64 warp_task() { return u64{blockIdx.x} * kWarps + threadIdx.x / 32; }
__device__ inline unsigned lane_id() { return threadIdx.x & 31u; }

// The attention backward's task of a warp over (b, h, t), t fastest, and
// the thread's lane; `live` false past the last task (for the whole warp).
struct HeadRow {
    u64 b, h, t;
    unsigned lane;
    bool live;
};
__device__ inline HeadRow head_row(u64 B, u64 H, u64 T) {
    const u64 task = warp_task();
    return {task / T / H, task / T % H, task % T, lane_id(), task < B * H * T};
}

__device__ inline float minus_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

// One softmax row over positions 0..last of a (len long: zero past last)
// for the query q against keys at k + t2 * stride, then out (hs) = sum_t2
// a[t2] v[t2] (values as far apart) in position order. One warp: each dot
// product on one thread in dot8's order, each sum over positions on one
// thread in position order, as the cpu kernels (softmax.cu's heads of a qkv
// row, llama.cu's query and key-value heads apart).
__device__ inline void attend(float* a, const float* q, const float* k, const float* v, u64 stride, u64 last, u64 len,
                       u64 hs, float scale, float* out) {
    const unsigned lane = lane_id();
    float mx = minus_inf();
    for (u64 t2 = lane; t2 <= last; t2 += 32) {
        const float x = dot8(q, k + t2 * stride, hs) * scale;
        a[t2] = x;
        mx = fmaxf(mx, x);
    }
    mx = warp_max(mx);
    for (u64 t2 = lane; t2 <= last; t2 += 32) a[t2] = expf(a[t2] - mx);
    __syncwarp();
    float expsum = 0;
    if (lane == 0)
        for (u64 t2 = 0; t2 <= last; ++t2) expsum += a[t2];
    expsum = __shfl_sync(kFull, expsum, 0);
    const float inv = expsum == 0 ? 0.0f : 1.0f / expsum;
    for (u64 t2 = lane; t2 <= last; t2 += 32) a[t2] *= inv;
    for (u64 t2 = last + 1 + lane; t2 < len; t2 += 32) a[t2] = 0;
    __syncwarp();
    for (u64 i = lane; i < hs; i += 32) {
        float o = 0;
        for (u64 t2 = 0; t2 <= last; ++t2) o += a[t2] * v[t2 * stride + i];
        out[i] = o;
    }
}

// The softmax's backward over row 0..last of the probabilities a (stored
// fp32 or bf16), in place over da (dout . v on entry, positions 0..last):
// da = a * (da - sum a*da), the sum in lanes8's order; zero from last + 1 to
// len. One warp, after the lanes' writes of da.
template <class A>
__device__ inline void softmax_row_backward(float* da, const A* a, u64 last, u64 len) {
    const unsigned lane = lane_id();
    __syncwarp();
    const float s = lanes8([&](u64 i) { return widen(a[i]) * da[i]; }, last + 1);
    __syncwarp();
    for (u64 t2 = lane; t2 <= last; t2 += 32) da[t2] = widen(a[t2]) * (da[t2] - s);
    for (u64 t2 = last + 1 + lane; t2 < len; t2 += 32) da[t2] = 0;
}

// ---- column sums: kernel_math::kSumRows's order (device/kernels.hpp's
// column_sums, the cpu backend's) ------------------------------------------
// out.p[k][c] += sum over rows of term(r, c, v)[k]. Pass 1: a block per
// (column tile, chunk of rows), a thread per column summing its chunk's rows
// in order from zero into the partials; pass 2: a thread per column adds the
// chunks' partials in order from zero, then the total to the output. No
// atomics: the same bits every run and the cpu backend's.
template <int K>
struct SumOuts {
    float* p[K];
};

inline constexpr unsigned kSumThreads = 128;  // columns per block

template <int K, class F>
__global__ void column_partials_kernel(float* part, u64 N, u64 c0, u64 cols, u64 chunks, F term) {
    const u64 j = global_id();
    if (j >= cols) return;
    const u64 i = blockIdx.y, r1 = (i + 1) * kernel_math::kSumRows < N ? (i + 1) * kernel_math::kSumRows : N;
    float acc[K] = {};
    float v[K];
    for (u64 r = i * kernel_math::kSumRows; r < r1; ++r) {
        term(r, c0 + j, v);
#pragma unroll
        for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
#pragma unroll
    for (int k = 0; k < K; ++k) part[(k * chunks + i) * cols + j] = acc[k];
}

template <int K>
__global__ void column_totals_kernel(SumOuts<K> out, const float* part, u64 c0, u64 cols, u64 chunks) {
    const u64 j = global_id();
    if (j >= cols) return;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float total = 0;
        for (u64 i = 0; i < chunks; ++i) total += part[(k * chunks + i) * cols + j];
        out.p[k][c0 + j] += total;
    }
}

// The two passes over C columns of N rows, as many columns at a time as the
// stream's partials hold (l.sums: chunks x columns x K floats).
template <int K, class F>
void column_sums(const Launch& l, SumOuts<K> out, u64 N, u64 C, F term) {
    if (!N || !C) return;
    const u64 chunks = (N + kernel_math::kSumRows - 1) / kernel_math::kSumRows;
    u64 slab = l.sums_floats / (K * chunks);
    if (slab >= kSumThreads) slab = slab / kSumThreads * kSumThreads;
    if (!slab || chunks > 65535)
        throw std::length_error("cuda: a column sum over " + std::to_string(N) +
                                " rows is past the stream's partials (" + std::to_string(l.sums_floats) + " floats)");
    for (u64 c0 = 0; c0 < C; c0 += slab) {
        const u64 cols = C - c0 < slab ? C - c0 : slab;
        const dim3 grid(blocks_for(cols, kSumThreads), static_cast<unsigned>(chunks));
        column_partials_kernel<K><<<grid, kSumThreads, 0, l.stream>>>(l.sums, N, c0, cols, chunks, term);
        column_totals_kernel<K><<<blocks_for(cols, kSumThreads), kSumThreads, 0, l.stream>>>(out, l.sums, c0, cols,
                                                                                              chunks);
    }
}

}  // namespace zinf::device::cuda
