// The cuda backend's loss kernel (kernels.hpp): the softmax cross-entropy and
// its fused gradient. The targets are checked first (check_ids): a bad one's
// row is left untouched here and reported at the next synchronize.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// Cross-entropy: one block per row. The max is exact in any order; the sum
// of the exps is in double as on the cpu, but as a fixed tree over the
// block (the same for every run), not the cpu's four lanes.
__device__ float block_max(float v, float* shared) {
    v = warp_max(v);
    if ((threadIdx.x & 31u) == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    float m = shared[0];
    for (unsigned w = 1; w < kWarps; ++w) m = fmaxf(m, shared[w]);
    __syncthreads();
    return m;
}

__device__ double block_sum(double v, double* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    if ((threadIdx.x & 31u) == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    double s = shared[0];
    for (unsigned w = 1; w < kWarps; ++w) s += shared[w];
    __syncthreads();
    return s;
}

template <bool kBackward>
__global__ void crossentropy_kernel(float* losses, float* logits, const std::int32_t* targets, float dloss, u64 N,
                                    u64 V) {
    __shared__ float smax[kWarps];
    __shared__ double ssum[kWarps];
    for (u64 row = blockIdx.x; row < N; row += gridDim.x) {
        const long long target = targets[row];
        if (target < 0 || static_cast<u64>(target) >= V) continue;  // check_ids reports it; uniform per block
        float* x = logits + row * V;
        const float xt = x[target];  // before block_max's barriers, so before any thread writes the row
        float mx = minus_inf();
        for (u64 j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
        mx = block_max(mx, smax);
        double part = 0;
        for (u64 j = threadIdx.x; j < V; j += blockDim.x) {
            const float e = expf(x[j] - mx);
            if (kBackward) x[j] = e;
            part += e;
        }
        const double expsum = block_sum(part, ssum);
        if (threadIdx.x == 0)
            losses[row] = static_cast<float>(log(expsum) - (static_cast<double>(xt) - mx));
        if (kBackward) {
            const float inv = static_cast<float>(1.0 / expsum);
            for (u64 j = threadIdx.x; j < V; j += blockDim.x)
                x[j] = dloss * (x[j] * inv - (j == static_cast<u64>(target) ? 1.0f : 0.0f));
        }
    }
}

}  // namespace

cudaError_t preload_loss() { return load_kernels(crossentropy_kernel<true>, crossentropy_kernel<false>); }

void crossentropy_forward_backward(const Launch& l, std::span<float> losses, std::span<float> logits,
                                   std::span<const std::int32_t> targets, float dloss, u64 N, u64 V) {
    check_ids(l, targets.data(), N, 1, V, kTargets);
    if (N && V)
        crossentropy_kernel<true><<<blocks_for(N, 1), kThreads, 0, l.stream>>>(losses.data(), logits.data(),
                                                                               targets.data(), dloss, N, V);
}

void crossentropy_forward(const Launch& l, std::span<float> losses, std::span<const float> logits,
                          std::span<const std::int32_t> targets, u64 N, u64 V) {
    check_ids(l, targets.data(), N, 1, V, kTargets);
    if (N && V)  // the forward only reads the logits
        crossentropy_kernel<false><<<blocks_for(N, 1), kThreads, 0, l.stream>>>(
            losses.data(), const_cast<float*>(logits.data()), targets.data(), 0.0f, N, V);
}

}  // namespace zinf::device::cuda
