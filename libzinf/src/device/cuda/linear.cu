// The cuda backend's linear kernels (kernels.hpp): the bias and its
// gradient, and GEMM's helpers (C = beta C when there is nothing to
// multiply, operands rounded to bf16 for cuBLASLt). The bias gradient is a
// column sum (common.cuh's column_sums: chunks of rows over the whole chip,
// then the chunks in order), the cpu kernel's order, so its bits are the cpu
// backend's (no atomics).
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

__global__ void scale_matrix_kernel(float* c, u64 m, u64 n, u64 ldc, u64 batch, u64 stride_c, float beta) {
    const u64 total = batch * m * n;
    for (u64 i = global_id(); i < total; i += grid_threads()) {
        const u64 j = i % n, r = i / n % m, e = i / n / m;
        float& x = c[e * stride_c + r * ldc + j];
        x = beta == 0 ? 0.0f : beta * x;
    }
}

__global__ void bias_add_kernel(float* out, const float* bias, u64 N, u64 OC) {
    for (u64 i = global_id(); i < N * OC; i += grid_threads()) out[i] += bias[i % OC];
}

// A term of the bias gradient's column sums: dout[r][o].
struct BiasTerm {
    const float* dout;
    u64 OC;
    __device__ void operator()(u64 r, u64 o, float* v) const { v[0] = dout[r * OC + o]; }
};

// bias (n) added to every row of c (m rows of n at row stride ld), fp32 or
// bf16 (widened, added, rounded): the epilogue's stand-in (gemm.cpp).
template <class E>
__global__ void bias_rows_kernel(E* c, u64 ld, const float* bias, u64 m, u64 n) {
    for (u64 i = global_id(); i < m * n; i += grid_threads()) {
        E* x = c + i / n * ld + i % n;
        put(x, widen(*x) + bias[i % n]);
    }
}

// A (rows, cols) block of row stride ld_src into bf16 rows of stride ld_dst.
__global__ void to_bf16_rows_kernel(std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src,
                                    u64 ld_dst) {
    for (u64 i = global_id(); i < rows * cols; i += grid_threads())
        dst[i / cols * ld_dst + i % cols] = round_bf16(src[i / cols * ld_src + i % cols]);
}

}  // namespace

cudaError_t preload_linear() {
    return load_kernels(scale_matrix_kernel, bias_add_kernel, column_partials_kernel<1, BiasTerm>,
                        column_totals_kernel<1>, to_bf16_rows_kernel, bias_rows_kernel<float>,
                        bias_rows_kernel<std::uint16_t>);
}

void bias_rows(cudaStream_t s, void* c, bool bf16, u64 ld, const float* bias, u64 m, u64 n) {
    if (!m || !n) return;
    if (bf16)
        bias_rows_kernel<<<blocks_for(m * n), kThreads, 0, s>>>(static_cast<std::uint16_t*>(c), ld, bias, m, n);
    else
        bias_rows_kernel<<<blocks_for(m * n), kThreads, 0, s>>>(static_cast<float*>(c), ld, bias, m, n);
}

void bias_grad_rows(const Launch& l, float* dbias, const float* x, u64 ld, u64 rows, u64 cols) {
    column_sums(l, SumOuts<1>{{dbias}}, rows, cols, BiasTerm{x, ld});
}

void scale_matrix(cudaStream_t s, float* c, u64 m, u64 n, u64 ldc, u64 batch, u64 stride_c, float beta) {
    if (!m || !n || !batch) return;
    scale_matrix_kernel<<<blocks_for(batch * m * n), kThreads, 0, s>>>(c, m, n, ldc, batch, stride_c, beta);
}

void to_bf16_rows(cudaStream_t s, std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src, u64 ld_dst) {
    if (rows && cols)
        to_bf16_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(dst, src, rows, cols, ld_src,
                                                                         ld_dst ? ld_dst : cols);
}

void bias_add(const Launch& l, std::span<float> out, std::span<const float> bias, u64 N, u64 OC) {
    if (!N || !OC) return;
    bias_add_kernel<<<blocks_for(N * OC), kThreads, 0, l.stream>>>(out.data(), bias.data(), N, OC);
}

void bias_backward(const Launch& l, std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) {
    column_sums(l, SumOuts<1>{{dbias.data()}}, N, OC, BiasTerm{dout.data(), OC});
}

}  // namespace zinf::device::cuda
