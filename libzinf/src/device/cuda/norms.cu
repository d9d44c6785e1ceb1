// The cuda backend's norms (kernels.hpp): LayerNorm and RMSNorm. Forward and
// the backward's dinp are eight threads per row (32 rows per block of 256),
// each row's sums in the cpu backend's lane order (common.cuh's lanes8); the
// weight (and bias) gradients column sums (common.cuh's column_sums: chunks
// of rows over the whole chip, then the chunks in order), the cpu kernel's
// order, so the bits are the cpu backend's and never depend on the GPU (no
// atomics).
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// Eight threads per row (32 rows per block of 256). Rows past N compute on
// row N-1 and write nothing: every lane must reach the shuffles.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, u64 N, u64 C, float eps) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const float* x = inp + (valid ? row : N - 1) * C;
    const float inv_c = 1.0f / static_cast<float>(C);
    const float m = lanes8([&](u64 c) { return x[c]; }, C) * inv_c;
    // The cpu kernel centres into `out`, then takes the dot of it with itself.
    const float var = lanes8([&](u64 c) { const float d = x[c] - m; return d * d; }, C) * inv_c;
    const float s = 1.0f / sqrtf(var + eps);
    if (!valid) return;
    float* o = out + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) o[c] = (x[c] - m) * s * w[c] + b[c];
    if ((threadIdx.x & 7u) == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class E>
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                               const float* mean, const float* rstd, u64 N, u64 C) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const u64 r = valid ? row : N - 1;
    const E* x = inp + r * C;
    const float* d = dout + r * C;
    const float m = mean[r], s = rstd[r];
    const float inv_c = 1.0f / static_cast<float>(C);
    const float dnorm_mean = lanes8([&](u64 c) { return w[c] * d[c]; }, C) * inv_c;
    const float dnorm_norm_mean =
        lanes8([&](u64 c) { return (w[c] * d[c]) * ((widen(x[c]) - m) * s); }, C) * inv_c;
    if (!valid) return;
    float* di = dinp + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) {
        const float norm = (widen(x[c]) - m) * s, dnorm = w[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// The weight and bias gradients' terms (common.cuh's column_sums): LayerNorm's
// (x - mean) * rstd * dout and dout; RMSNorm's x * rstd * dout.
template <class E>
struct LayerNormTerm {
    const float* dout;
    const E* inp;
    const float *mean, *rstd;
    u64 C;
    __device__ void operator()(u64 r, u64 c, float* v) const {
        const float d = dout[r * C + c];
        v[0] = (widen(inp[r * C + c]) - mean[r]) * rstd[r] * d;
        v[1] = d;
    }
};

template <class E>
struct RmsNormTerm {
    const float* dout;
    const E* inp;
    const float* rstd;
    u64 C;
    __device__ void operator()(u64 r, u64 c, float* v) const {
        v[0] = widen(inp[r * C + c]) * rstd[r] * dout[r * C + c];
    }
};

// `add` not null: the row of inp (res) += add first, each lane its columns,
// then the norm of the sum (residual_rmsnorm_forward).
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                                       u64 C, float eps) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    float* x = inp + (valid ? row : N - 1) * C;
    if (add && valid)
        for (u64 c = threadIdx.x & 7u; c < C; c += 8) x[c] += add[row * C + c];
    __syncwarp();  // the row's eight lanes: each reads the others' sums below
    const float inv_c = 1.0f / static_cast<float>(C);
    const float ss = lanes8([&](u64 c) { return x[c] * x[c]; }, C);
    const float s = 1.0f / sqrtf(ss * inv_c + eps);
    if (!valid) return;
    float* o = out + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) o[c] = x[c] * s * w[c];
    if ((threadIdx.x & 7u) == 0) rstd[row] = s;
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class E>
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                             const float* rstd, u64 N, u64 C) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const u64 r = valid ? row : N - 1;
    const E* x = inp + r * C;
    const float* d = dout + r * C;
    const float s = rstd[r];
    const float inv_c = 1.0f / static_cast<float>(C);
    const float m = lanes8([&](u64 c) { return (w[c] * d[c]) * (widen(x[c]) * s); }, C) * inv_c;
    if (!valid) return;
    float* di = dinp + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) {
        const float norm = widen(x[c]) * s, dnorm = w[c] * d[c];
        di[c] += (dnorm - norm * m) * s;
    }
}

// The backward's two launches, for inp stored either way.
template <class E>
void layernorm_grad(const Launch& l, float* dinp, float* dw, float* db, const float* dout, const E* inp,
                    const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    layernorm_backward_dinp_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, l.stream>>>(dinp, dout, inp, w, mean,
                                                                                           rstd, N, C);
    column_sums(l, SumOuts<2>{{dw, db}}, N, C, LayerNormTerm<E>{dout, inp, mean, rstd, C});
}

template <class E>
void rmsnorm_grad(const Launch& l, float* dinp, float* dw, const float* dout, const E* inp, const float* w,
                  const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    rmsnorm_backward_dinp_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, l.stream>>>(dinp, dout, inp, w, rstd, N,
                                                                                         C);
    column_sums(l, SumOuts<1>{{dw}}, N, C, RmsNormTerm<E>{dout, inp, rstd, C});
}

}  // namespace

cudaError_t preload_norms() {
    return load_kernels(layernorm_forward_kernel, layernorm_backward_dinp_kernel<float>,
                        column_partials_kernel<2, LayerNormTerm<float>>, layernorm_backward_dinp_kernel<std::uint16_t>,
                        column_partials_kernel<2, LayerNormTerm<std::uint16_t>>, column_totals_kernel<2>,
                        rmsnorm_forward_kernel, rmsnorm_backward_dinp_kernel<float>,
                        column_partials_kernel<1, RmsNormTerm<float>>, rmsnorm_backward_dinp_kernel<std::uint16_t>,
                        column_partials_kernel<1, RmsNormTerm<std::uint16_t>>, column_totals_kernel<1>);
}

void layernorm_forward(const Launch& l, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N, u64 C) {
    if (!N || !C) return;
    layernorm_forward_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, l.stream>>>(
        out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C, kernel_math::kLayerNormEps);
}

void layernorm_backward(const Launch& l, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                        std::span<const float> dout, ConstView inp, std::span<const float> w,
                        std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        layernorm_grad(l, dinp.data(), dw.data(), db.data(), dout.data(), inp.data<decltype(e)>(), w.data(),
                       mean.data(), rstd.data(), N, C);
    });
}

void rmsnorm_forward(const Launch& l, std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                     std::span<const float> w, u64 N, u64 C, float eps) {
    if (!N || !C) return;
    // inp is only read: the kernel writes its row only where `add` is given.
    rmsnorm_forward_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, l.stream>>>(
        out.data(), rstd.data(), const_cast<float*>(inp.data()), nullptr, w.data(), N, C, eps);
}

void residual_rmsnorm_forward(const Launch& l, std::span<float> out, std::span<float> rstd, std::span<float> res,
                              std::span<const float> add, std::span<const float> w, u64 N, u64 C, float eps) {
    if (!N || !C) return;
    rmsnorm_forward_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, l.stream>>>(out.data(), rstd.data(), res.data(),
                                                                                  add.data(), w.data(), N, C, eps);
}

void rmsnorm_backward(const Launch& l, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                      ConstView inp, std::span<const float> w, std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        rmsnorm_grad(l, dinp.data(), dw.data(), dout.data(), inp.data<decltype(e)>(), w.data(), rstd.data(),
                     N, C);
    });
}

}  // namespace zinf::device::cuda
