// The cuda backend's loss kernel (kernels.def): the fused classifier, softmax
// cross-entropy and its gradient written over the logits in place. The
// targets are checked first (check_ids): a bad one's row is left untouched
// here and reported at the next synchronize.
//
// One block a row, two passes over it (llm.c's fused classifier): the first
// reads the row once for its max and the sum of its shifted exponentials at
// once (each thread an online max and a double sum, rescaled when its max
// grows), the block's pairs met by a fixed butterfly in each warp and the
// warps' in warp order; the second reads the row again and writes the
// gradient (fp32, or rounded once to bf16) over it, and 0 over the pad past
// V. A thread takes 16-byte chunks of the row (4 fp32 or 8 bf16 logits),
// chunk c on thread c mod blockDim, each read with one 128-bit load where
// the row is 16-byte aligned (the padded vocabulary guarantees it) and
// element by element where not: the same order either way, so the same bits
// whatever the alignment. The exponentials are expf and the sum a tree,
// not the cpu's four lanes: the cpu's results within rounding.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// A thread's, a warp's or the block's (max, sum of exp(x - max)).
struct MaxSum {
    float m;
    double s;
};

__device__ inline MaxSum combine(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    // An empty side (s 0, m -inf) adds nothing (and no -inf - -inf).
    const double sa = a.s != 0 ? a.s * static_cast<double>(expf(a.m - m)) : 0.0;
    const double sb = b.s != 0 ? b.s * static_cast<double>(expf(b.m - m)) : 0.0;
    return {m, sa + sb};
}

// The block's pair, the same on every thread: a butterfly in each warp
// (both partners add the same two terms: the same bits on every lane),
// then the warps' in warp order.
__device__ MaxSum block_max_sum(MaxSum v, float* sm, double* ss) {
    for (int o = 16; o > 0; o >>= 1) {
        const MaxSum other{__shfl_xor_sync(kFull, v.m, o), __shfl_xor_sync(kFull, v.s, o)};
        v = combine(v, other);
    }
    if ((threadIdx.x & 31u) == 0) {
        sm[threadIdx.x / 32] = v.m;
        ss[threadIdx.x / 32] = v.s;
    }
    __syncthreads();
    MaxSum all{sm[0], ss[0]};
    for (unsigned w = 1; w < kWarps; ++w) all = combine(all, MaxSum{sm[w], ss[w]});
    __syncthreads();
    return all;
}

// Elements of one 16-byte chunk.
template <class E>
inline constexpr unsigned kChunk = 16 / sizeof(E);

// Chunk c of a row (elements c*W .. c*W+W-1 that are below `end`) as fp32:
// one 128-bit load when `vec` (the row is aligned and the chunk whole).
template <class E>
__device__ inline void load_chunk(const E* row, u64 c, u64 end, bool vec, float (&v)[kChunk<E>]) {
    constexpr unsigned W = kChunk<E>;
    const u64 j0 = c * W;
    if (vec && j0 + W <= end) {
        alignas(16) E raw[W];
        *reinterpret_cast<uint4*>(raw) = *reinterpret_cast<const uint4*>(row + j0);
#pragma unroll
        for (unsigned k = 0; k < W; ++k) v[k] = widen(raw[k]);
    } else {
#pragma unroll
        for (unsigned k = 0; k < W; ++k) v[k] = j0 + k < end ? widen(row[j0 + k]) : 0.0f;
    }
}

template <class E>
__device__ inline void store_chunk(E* row, u64 c, u64 end, bool vec, const float (&v)[kChunk<E>]) {
    constexpr unsigned W = kChunk<E>;
    const u64 j0 = c * W;
    if (vec && j0 + W <= end) {
        alignas(16) E raw[W];
#pragma unroll
        for (unsigned k = 0; k < W; ++k) put(raw + k, v[k]);
        *reinterpret_cast<uint4*>(row + j0) = *reinterpret_cast<const uint4*>(raw);
    } else {
#pragma unroll
        for (unsigned k = 0; k < W; ++k)
            if (j0 + k < end) put(row + j0 + k, v[k]);
    }
}

template <bool kBackward, class E>
__global__ void crossentropy_kernel(float* losses, E* logits, const std::int32_t* targets, float dloss, u64 N, u64 V,
                                    u64 ld) {
    constexpr unsigned W = kChunk<E>;
    __shared__ float sm[kWarps];
    __shared__ double ss[kWarps];
    // Every row 16-byte aligned: the base and the stride both.
    const bool vec = reinterpret_cast<std::uintptr_t>(logits) % 16 == 0 && (ld * sizeof(E)) % 16 == 0;
    // Pass 1 reads only the V logits (whole chunks may read into the pad,
    // masked); pass 2 writes the pad too.
    const u64 read_chunks = (V + W - 1) / W, write_chunks = (ld + W - 1) / W;
    const u64 read_end = vec ? ld : V;  // a vector load of the last chunk reads pad (in bounds), masked below
    for (u64 row = blockIdx.x; row < N; row += gridDim.x) {
        const long long target = targets[row];
        if (target < 0 || static_cast<u64>(target) >= V) continue;  // check_ids reports it; uniform per block
        E* x = logits + row * ld;
        const float xt = widen(x[target]);  // before block_max_sum's barriers, so before any thread writes the row
        MaxSum t{minus_inf(), 0.0};
        for (u64 c = threadIdx.x; c < read_chunks; c += blockDim.x) {
            float v[W];
            load_chunk(x, c, read_end, vec, v);
#pragma unroll
            for (unsigned k = 0; k < W; ++k) {
                if (c * W + k >= V) break;
                const float e = v[k];
                if (e > t.m) {
                    t.s = t.s * static_cast<double>(expf(t.m - e)) + 1.0;
                    t.m = e;
                } else if (e != minus_inf()) {  // a NaN adds NaN
                    t.s += static_cast<double>(expf(e - t.m));
                }
            }
        }
        const MaxSum all = block_max_sum(t, sm, ss);
        if (threadIdx.x == 0) losses[row] = static_cast<float>(log(all.s) - (static_cast<double>(xt) - all.m));
        if (kBackward) {
            const float inv = static_cast<float>(1.0 / all.s);
            for (u64 c = threadIdx.x; c < write_chunks; c += blockDim.x) {
                float v[W];
                load_chunk(x, c, read_end, vec, v);
#pragma unroll
                for (unsigned k = 0; k < W; ++k) {
                    const u64 j = c * W + k;
                    v[k] = j < V ? dloss * (expf(v[k] - all.m) * inv - (j == static_cast<u64>(target) ? 1.0f : 0.0f))
                                 : 0.0f;
                }
                store_chunk(x, c, ld, vec, v);
            }
        }
    }
}

template <bool kBackward>
void launch(const Launch& l, float* losses, ConstView logits, const std::int32_t* targets, float dloss, u64 N, u64 V,
            u64 ld) {
    with_dtype(logits.dtype(), [&](auto e) {
        using E = decltype(e);
        crossentropy_kernel<kBackward, E><<<blocks_for(N, 1), kThreads, 0, l.stream>>>(
            losses, const_cast<E*>(logits.data<E>()), targets, dloss, N, V, ld);
    });
}

}  // namespace

cudaError_t preload_loss() {
    return load_kernels(crossentropy_kernel<true, float>, crossentropy_kernel<false, float>,
                        crossentropy_kernel<true, std::uint16_t>, crossentropy_kernel<false, std::uint16_t>);
}

void crossentropy_forward_backward(const Launch& l, std::span<float> losses, View logits,
                                   std::span<const std::int32_t> targets, float dloss, u64 N, u64 V, u64 ldl) {
    check_ids(l, targets.data(), N, 1, V, kTargets);
    if (N && V) launch<true>(l, losses.data(), logits, targets.data(), dloss, N, V, logits_stride(ldl, V));
}

void crossentropy_forward(const Launch& l, std::span<float> losses, ConstView logits,
                          std::span<const std::int32_t> targets, u64 N, u64 V, u64 ldl) {
    check_ids(l, targets.data(), N, 1, V, kTargets);
    if (N && V)  // the forward only reads the logits
        launch<false>(l, losses.data(), logits, targets.data(), 0.0f, N, V, logits_stride(ldl, V));
}

}  // namespace zinf::device::cuda
