// The cuda backend's softmax kernels: causal self-attention forward, backward
// and decode, and the softmax cross-entropy. Attention is one warp per
// (batch, query position, head) as the cpu kernel's task, each dot product
// on one thread in the cpu's eight-lane order and each sum over positions on
// one thread in position order; only expf differs from the cpu's std::exp.
// The backward splits the cpu's (batch, head) loop in three launches, so
// that every dq, dk and dv element is summed by one thread over the same
// terms in the same order as there: no atomics.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

__global__ void attention_forward_kernel(float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH,
                                         float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * T * NH) return;  // the whole warp
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
    const float* base = qkv + b * T * C3 + h * hs;
    attend(att + ((b * NH + h) * T + t) * T, base + t * C3, base + C, base + 2 * C, C3, t, T, hs, scale,
           out + (b * T + t) * C + h * hs);
}

__global__ void attention_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v,
                                        u64 T, u64 C, u64 NH, float scale) {
    const u64 h = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (h >= NH) return;
    const u64 hs = C / NH;
    attend(att + h * T, q + h * hs, k + h * hs, v + h * hs, C, T - 1, T, hs, scale, out + h * hs);
}

// Backward, 1 of 3, per (b, h, t): datt row t = the softmax's backward of
// dout . v, as the cpu kernel leaves it in datt (before the scale). E, in
// the three: float, or std::uint16_t for qkv and att stored bf16 (widened
// as read: the fp32 kernels' bits on their copies).
template <class E>
__global__ void attention_datt_kernel(float* datt, const float* dout, const E* qkv, const E* att, u64 B,
                                      u64 T, u64 C, u64 NH) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * NH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 t = task % T, h = task / T % NH, b = task / T / NH;
    const E* a = att + ((b * NH + h) * T + t) * T;
    float* da = datt + ((b * NH + h) * T + t) * T;
    const float* go = dout + (b * T + t) * C + h * hs;
    for (u64 t2 = lane; t2 <= t; t2 += 32) da[t2] = dot8(qkv + (b * T + t2) * C3 + 2 * C + h * hs, go, hs);
    softmax_row_backward(da, a, t, T);
}

// 2 of 3, per (b, h, t): dq[t] = sum over t2 <= t of (datt[t][t2] * scale) k[t2].
template <class E>
__global__ void attention_dq_kernel(float* dqkv, const float* datt, const E* qkv, u64 B, u64 T, u64 C, u64 NH,
                                    float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * NH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 t = task % T, h = task / T % NH, b = task / T / NH;
    const float* da = datt + ((b * NH + h) * T + t) * T;
    const E* k = qkv + b * T * C3 + C + h * hs;
    for (u64 i = lane; i < hs; i += 32) {
        float acc = 0;
        for (u64 t2 = 0; t2 <= t; ++t2) acc += (da[t2] * scale) * widen(k[t2 * C3 + i]);
        dqkv[(b * T + t) * C3 + h * hs + i] = acc;
    }
}

// 3 of 3, per (b, h, t2): dk[t2] and dv[t2], sums over t >= t2 in order.
template <class E>
__global__ void attention_dkv_kernel(float* dqkv, const float* datt, const float* dout, const E* qkv, const E* att,
                                     u64 B, u64 T, u64 C, u64 NH, float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * NH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 t2 = task % T, h = task / T % NH, b = task / T / NH;
    const u64 row0 = (b * NH + h) * T * T;
    const E* q = qkv + b * T * C3 + h * hs;
    const float* go = dout + b * T * C + h * hs;
    for (u64 i = lane; i < hs; i += 32) {
        float dk = 0, dv = 0;
        for (u64 t = t2; t < T; ++t) {
            dv += widen(att[row0 + t * T + t2]) * go[t * C + i];
            dk += (datt[row0 + t * T + t2] * scale) * widen(q[t * C3 + i]);
        }
        float* d = dqkv + (b * T + t2) * C3 + h * hs + i;
        d[C] = dk;
        d[2 * C] = dv;
    }
}

// ---------------------------------------------------------------------------
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

cudaError_t preload_softmax() {
    return load_kernels(attention_forward_kernel, attention_decode_kernel, attention_datt_kernel<float>,
                        attention_dq_kernel<float>, attention_dkv_kernel<float>, attention_datt_kernel<std::uint16_t>,
                        attention_dq_kernel<std::uint16_t>, attention_dkv_kernel<std::uint16_t>,
                        crossentropy_kernel<true>, crossentropy_kernel<false>);
}

void attention_forward(cudaStream_t s, float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH) {
    if (!B || !T || !C) return;
    attention_forward_kernel<<<blocks_for(B * T * NH, kWarps), kThreads, 0, s>>>(out, att, qkv, B, T, C, NH,
                                                                                kernel_math::attention_scale(C / NH));
}

void attention_decode(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 T,
                      u64 C, u64 NH) {
    if (!T || !C) return;
    attention_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, s>>>(out, att, q, k, v, T, C, NH,
                                                                       kernel_math::attention_scale(C / NH));
}

namespace {
template <class E>
void attention_grad(cudaStream_t s, float* dqkv, float* datt, const float* dout, const E* qkv, const E* att, u64 B,
                    u64 T, u64 C, u64 NH) {
    if (!B || !T || !C) return;
    const unsigned grid = blocks_for(B * NH * T, kWarps);
    const float scale = kernel_math::attention_scale(C / NH);
    attention_datt_kernel<<<grid, kThreads, 0, s>>>(datt, dout, qkv, att, B, T, C, NH);
    attention_dq_kernel<<<grid, kThreads, 0, s>>>(dqkv, datt, qkv, B, T, C, NH, scale);
    attention_dkv_kernel<<<grid, kThreads, 0, s>>>(dqkv, datt, dout, qkv, att, B, T, C, NH, scale);
}
}  // namespace

void attention_backward(cudaStream_t s, float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, u64 B, u64 T, u64 C, u64 NH) {
    attention_grad(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void attention_backward(cudaStream_t s, float* dqkv, float* datt, const float* dout, const std::uint16_t* qkv,
                        const std::uint16_t* att, u64 B, u64 T, u64 C, u64 NH) {
    attention_grad(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void crossentropy_forward_backward(cudaStream_t s, float* losses, float* logits, const std::int32_t* targets,
                                   float dloss, u64 N, u64 V) {
    if (N && V) crossentropy_kernel<true><<<blocks_for(N, 1), kThreads, 0, s>>>(losses, logits, targets, dloss, N, V);
}

void crossentropy_forward(cudaStream_t s, float* losses, const float* logits, const std::int32_t* targets, u64 N,
                          u64 V) {
    if (N && V)
        crossentropy_kernel<false><<<blocks_for(N, 1), kThreads, 0, s>>>(losses, const_cast<float*>(logits), targets,
                                                                         0.0f, N, V);
}

}  // namespace zinf::device::cuda
