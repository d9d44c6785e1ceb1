// The cuda backend's element-wise kernels (kernels.hpp): GELU and SwiGLU in
// util/kernel_math.hpp's arithmetic, the residual adds and the casts. Each is
// the cpu kernel's arithmetic per element, so with -fmad=false it gives the
// same bits. One thread an element, a grid-stride loop.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

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

// E: float, or std::uint16_t for gate and up (and the forward's out) stored bf16.
template <class E>
__global__ void swiglu_forward_kernel(E* out, const E* gate, const E* up, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) put(out + i, kernel_math::swiglu(widen(gate[i]), widen(up[i])));
}

template <class E>
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const E* gate, const E* up, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) {
        float dg, du;
        kernel_math::swiglu_grad(widen(gate[i]), widen(up[i]), dout[i], &dg, &du);
        dgate[i] = dg;
        dup[i] = du;
    }
}

__global__ void to_bf16_kernel(std::uint16_t* dst, const float* src, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) dst[i] = round_bf16(src[i]);
}

__global__ void from_bf16_kernel(float* dst, const std::uint16_t* src, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) dst[i] = __uint_as_float(unsigned{src[i]} << 16);
}

}  // namespace

cudaError_t preload_elementwise() {
    return load_kernels(residual_kernel, accumulate_kernel, gelu_forward_kernel<float, float>,
                        gelu_forward_kernel<std::uint16_t, std::uint16_t>, gelu_backward_kernel<float>,
                        gelu_backward_kernel<std::uint16_t>, swiglu_forward_kernel<float>,
                        swiglu_forward_kernel<std::uint16_t>, swiglu_backward_kernel<float>,
                        swiglu_backward_kernel<std::uint16_t>, to_bf16_kernel, from_bf16_kernel);
}

void to_bf16(cudaStream_t s, std::uint16_t* dst, const float* src, u64 n) {
    if (n) to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n);
}

void gelu_forward(const Launch& l, View out, ConstView inp) {
    const u64 n = out.size();
    if (!n) return;
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        gelu_forward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(out.data<E>(), inp.data<E>(), n);
    });
}

void gelu_backward(const Launch& l, std::span<float> dinp, ConstView inp, std::span<const float> dout) {
    const u64 n = dinp.size();
    if (!n) return;
    with_dtype(inp.dtype(), [&](auto e) {
        gelu_backward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(dinp.data(), inp.data<decltype(e)>(),
                                                                       dout.data(), n);
    });
}

void swiglu_forward(const Launch& l, View out, ConstView gate, ConstView up) {
    const u64 n = out.size();
    if (!n) return;
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(out.data<E>(), gate.data<E>(), up.data<E>(),
                                                                        n);
    });
}

void swiglu_backward(const Launch& l, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     ConstView gate, ConstView up) {
    const u64 n = dgate.size();
    if (!n) return;
    with_dtype(gate.dtype(), [&](auto e) {
        using E = decltype(e);
        swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(dgate.data(), dup.data(), dout.data(),
                                                                         gate.data<E>(), up.data<E>(), n);
    });
}

void residual_forward(const Launch& l, std::span<float> out, std::span<const float> a, std::span<const float> b) {
    const u64 n = out.size();
    if (n) residual_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(out.data(), a.data(), b.data(), n);
}

void accumulate(const Launch& l, std::span<float> acc, std::span<const float> x) {
    const u64 n = acc.size();
    if (n) accumulate_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(acc.data(), x.data(), n);
}

void cast(const Launch& l, View dst, ConstView src) {
    const u64 n = dst.size();
    if (!n) return;
    if (dst.is_bf16())
        to_bf16_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(dst.data<std::uint16_t>(), src.data<float>(), n);
    else
        from_bf16_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(dst.data<float>(), src.data<std::uint16_t>(), n);
}

}  // namespace zinf::device::cuda
