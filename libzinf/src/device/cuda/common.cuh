// What the cuda kernel files share: launch sizes and the cpu backend's
// reduction orders (device/kernels.hpp: dot and sum in eight lanes).
#pragma once

#include "kernels.hpp"

#include <cuda_runtime.h>

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

// The cpu backend's dot(a, b, n) on one thread, every operation in its order.
__device__ inline float dot8(const float* a, const float* b, u64 n) {
    float acc[8] = {};
    u64 i = 0;
    for (; i + 8 <= n; i += 8)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += a[i] * b[i];
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

}  // namespace zinf::device::cuda
