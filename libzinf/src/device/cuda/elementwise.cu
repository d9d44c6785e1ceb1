// The cuda backend's element-wise kernels (bias_add, GELU, residual,
// accumulate, casts, AdamW, C = beta C) and its plumbing (the id check, the
// host-flag wait). Each is the cpu kernel's arithmetic per element, so with
// -fmad=false it gives the same bits (kernels.hpp).
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

__global__ void check_ids_kernel(const std::int32_t* ids, u64 n, u64 V, IdScratch* scratch) {
    for (u64 i = global_id(); i < n; i += grid_threads()) {
        const long long v = ids[i];
        if (v < 0 || static_cast<u64>(v) >= V) atomicMin(&scratch->first_bad, static_cast<unsigned long long>(i));
    }
}

// One thread: moves the first bad index into the record (unless it holds an
// earlier launch's) and resets the scratch for the next check.
__global__ void record_ids_kernel(const std::int32_t* ids, u64 T, u64 V, int kind, u64 ticket, IdScratch* scratch,
                                  IdRecord* rec) {
    const unsigned long long bad = scratch->first_bad;
    if (bad == ~0ull) return;
    if (!rec->set) {
        rec->kind = kind;
        rec->value = ids[bad];
        rec->index = bad;
        rec->ticket = ticket;
        rec->T = T;
        rec->V = V;
        __threadfence_system();
        rec->set = 1;
        __threadfence_system();
    }
    scratch->first_bad = ~0ull;
}

__global__ void reset_scratch_kernel(IdScratch* scratch) { scratch->first_bad = ~0ull; }

__global__ void wait_flag_kernel(const volatile unsigned* flag, unsigned value) {
    while (static_cast<int>(*flag - value) < 0) __nanosleep(1000);
}

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


__global__ void residual_kernel(float* out, const float* a, const float* b, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* acc, const float* x, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) acc[i] += x[i];
}

// In and Out float or bf16 (std::uint16_t): the arithmetic is fp32's.
template <class In, class Out>
__global__ void gelu_forward_kernel(Out* out, const In* inp, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) put(out + i, kernel_math::gelu(widen(inp[i])));
}

template <class In>
__global__ void gelu_backward_kernel(float* dinp, const In* inp, const float* dout, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) dinp[i] = kernel_math::gelu_grad(widen(inp[i]), dout[i]);
}

__global__ void to_bf16_kernel(std::uint16_t* dst, const float* src, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) dst[i] = round_bf16(src[i]);
}

// A (rows, cols) block of row stride ld_src into packed bf16 rows.
__global__ void to_bf16_rows_kernel(std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src) {
    for (u64 i = global_id(); i < rows * cols; i += grid_threads()) dst[i] = round_bf16(src[i / cols * ld_src + i % cols]);
}

__global__ void from_bf16_kernel(float* dst, const std::uint16_t* src, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) dst[i] = __uint_as_float(unsigned{src[i]} << 16);
}

// optim/kernels.hpp's update_one.
__global__ void adamw_kernel(AdamPtrs p, u64 n, AdamScalars s) {
    for (u64 i = global_id(); i < n; i += grid_threads()) {
        const kernel_math::AdamState r =
            kernel_math::adamw(s, p.g32 ? p.g32[i] : widen(p.g16[i]), p.m[i], p.v[i], p.w[i]);
        p.m[i] = r.m;
        p.v[i] = r.v;
        p.w[i] = r.w;
        if (p.p32) p.p32[i] = r.w;
        if (p.p16) p.p16[i] = round_bf16(r.w);
    }
}

}  // namespace

cudaError_t preload_elementwise() {
    return load_kernels(check_ids_kernel, record_ids_kernel, reset_scratch_kernel, wait_flag_kernel,
                        scale_matrix_kernel, bias_add_kernel, gelu_forward_kernel<float, float>,
                        gelu_forward_kernel<std::uint16_t, std::uint16_t>, gelu_backward_kernel<float>,
                        gelu_backward_kernel<std::uint16_t>,
                        residual_kernel, accumulate_kernel, to_bf16_kernel, to_bf16_rows_kernel, from_bf16_kernel, adamw_kernel);
}

void check_ids(cudaStream_t s, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind, u64 ticket,
               IdScratch* scratch, IdRecord* rec) {
    if (n == 0) return;
    check_ids_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, n, V, scratch);
    record_ids_kernel<<<1, 1, 0, s>>>(ids, T, V, kind, ticket, scratch, rec);
}

void reset_scratch(cudaStream_t s, IdScratch* scratch) { reset_scratch_kernel<<<1, 1, 0, s>>>(scratch); }

void wait_flag(cudaStream_t s, const unsigned* flag, unsigned value) {
    wait_flag_kernel<<<1, 1, 0, s>>>(flag, value);
}

void scale_matrix(cudaStream_t s, float* c, u64 m, u64 n, u64 ldc, u64 batch, u64 stride_c, float beta) {
    if (!m || !n || !batch) return;
    scale_matrix_kernel<<<blocks_for(batch * m * n), kThreads, 0, s>>>(c, m, n, ldc, batch, stride_c, beta);
}

void bias_add(cudaStream_t s, float* out, const float* bias, u64 N, u64 OC) {
    if (!N || !OC) return;
    bias_add_kernel<<<blocks_for(N * OC), kThreads, 0, s>>>(out, bias, N, OC);
}

void gelu_forward(cudaStream_t s, float* out, const float* inp, u64 n) {
    if (n) gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, inp, n);
}

void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, u64 n) {
    if (n) gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
}

void gelu_forward(cudaStream_t s, std::uint16_t* out, const std::uint16_t* inp, u64 n) {
    if (n) gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, inp, n);
}

void gelu_backward(cudaStream_t s, float* dinp, const std::uint16_t* inp, const float* dout, u64 n) {
    if (n) gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
}

void residual_forward(cudaStream_t s, float* out, const float* a, const float* b, u64 n) {
    if (n) residual_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, b, n);
}

void accumulate(cudaStream_t s, float* acc, const float* x, u64 n) {
    if (n) accumulate_kernel<<<blocks_for(n), kThreads, 0, s>>>(acc, x, n);
}

void to_bf16(cudaStream_t s, std::uint16_t* dst, const float* src, u64 n) {
    if (n) to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n);
}

void to_bf16_rows(cudaStream_t s, std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src) {
    if (rows && cols) to_bf16_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(dst, src, rows, cols, ld_src);
}

void from_bf16(cudaStream_t s, float* dst, const std::uint16_t* src, u64 n) {
    if (n) from_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n);
}

void adamw(cudaStream_t s, const AdamPtrs& p, u64 n, const AdamScalars& k) {
    if (n) adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, n, k);
}

}  // namespace zinf::device::cuda
