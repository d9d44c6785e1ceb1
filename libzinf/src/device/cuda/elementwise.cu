// The cuda backend's element-wise kernels (kernels.hpp): GELU and SwiGLU in
// util/kernel_math.hpp's arithmetic, the residual adds and the casts. Each is
// the cpu kernel's arithmetic per element, so with -fmad=false (this file's
// flag: the Makefile) it gives the same bits. One grid-stride loop
// (each_kernel) over groups of W elements: W = 8 where an operand is bf16
// (its 8 x 16 bits one 128-bit load or store; fp32 operands two float4s),
// 4 where all are fp32, when every pointer is 16-byte aligned; the tail
// (n mod W) by the first threads; W = 1 otherwise.
#include "common.cuh"

#include <type_traits>

namespace zinf::device::cuda {

namespace {

// op.run<W>(i) for every group of W elements from i, then op.run<1> for the tail.
template <int W, class Op>
__global__ void each_kernel(Op op, u64 n) {
    const u64 groups = n / W;
    for (u64 g = global_id(); g < groups; g += grid_threads()) op.template run<W>(g * W);
    if constexpr (W > 1) {
        const u64 i = groups * W + global_id();
        if (i < n) op.template run<1>(i);
    }
}

// The op over n elements: W as the file's head says.
template <class Op>
void each(cudaStream_t s, const Op& op, u64 n, bool bf16, std::initializer_list<const void*> ptrs) {
    if (!n) return;
    if (!aligned16(ptrs))
        each_kernel<1><<<blocks_for(n), kThreads, 0, s>>>(op, n);
    else if (bf16)
        each_kernel<8><<<blocks_for(n / 8 + 1), kThreads, 0, s>>>(op, n);
    else
        each_kernel<4><<<blocks_for(n / 4 + 1), kThreads, 0, s>>>(op, n);
}

struct Residual {
    float* out;
    const float *a, *b;
    template <int W>
    __device__ void run(u64 i) const {
        Pack<W> x = load<W>(a + i);
        const Pack<W> y = load<W>(b + i);
#pragma unroll
        for (int k = 0; k < W; ++k) x.v[k] = x.v[k] + y.v[k];
        store<W>(out + i, x);
    }
};

struct Accumulate {
    float* acc;
    const float* x;
    template <int W>
    __device__ void run(u64 i) const {
        Pack<W> a = load<W>(acc + i);
        const Pack<W> y = load<W>(x + i);
#pragma unroll
        for (int k = 0; k < W; ++k) a.v[k] += y.v[k];
        store<W>(acc + i, a);
    }
};

// E: float, or std::uint16_t for inp and out stored bf16; the arithmetic is fp32's.
template <class E>
struct GeluForward {
    E* out;
    const E* inp;
    template <int W>
    __device__ void run(u64 i) const {
        Pack<W> x = load<W>(inp + i);
#pragma unroll
        for (int k = 0; k < W; ++k) x.v[k] = kernel_math::gelu(x.v[k]);
        store<W>(out + i, x);
    }
};

template <class E>
struct GeluBackward {
    float* dinp;
    const E* inp;
    const float* dout;
    template <int W>
    __device__ void run(u64 i) const {
        const Pack<W> x = load<W>(inp + i);
        Pack<W> d = load<W>(dout + i);
#pragma unroll
        for (int k = 0; k < W; ++k) d.v[k] = kernel_math::gelu_grad(x.v[k], d.v[k]);
        store<W>(dinp + i, d);
    }
};

// E: float, or std::uint16_t for gate and up (and the forward's out) stored bf16.
template <class E>
struct SwigluForward {
    E* out;
    const E *gate, *up;
    template <int W>
    __device__ void run(u64 i) const {
        Pack<W> g = load<W>(gate + i);
        const Pack<W> u = load<W>(up + i);
#pragma unroll
        for (int k = 0; k < W; ++k) g.v[k] = kernel_math::swiglu(g.v[k], u.v[k]);
        store<W>(out + i, g);
    }
};

// dgate or dup may be dout: each group is read whole before it is written.
template <class E>
struct SwigluBackward {
    float *dgate, *dup;
    const float* dout;
    const E *gate, *up;
    template <int W>
    __device__ void run(u64 i) const {
        const Pack<W> g = load<W>(gate + i), u = load<W>(up + i), d = load<W>(dout + i);
        Pack<W> dg, du;
#pragma unroll
        for (int k = 0; k < W; ++k) kernel_math::swiglu_grad(g.v[k], u.v[k], d.v[k], &dg.v[k], &du.v[k]);
        store<W>(dgate + i, dg);
        store<W>(dup + i, du);
    }
};

// dst = src in the other storage: rounded to bf16, or widened.
template <class To, class From>
struct Cast {
    To* dst;
    const From* src;
    template <int W>
    __device__ void run(u64 i) const {
        store<W>(dst + i, load<W>(src + i));
    }
};

}  // namespace

cudaError_t preload_elementwise() {
    return load_kernels(
        each_kernel<1, Residual>, each_kernel<4, Residual>, each_kernel<8, Residual>, each_kernel<1, Accumulate>,
        each_kernel<4, Accumulate>, each_kernel<8, Accumulate>, each_kernel<1, GeluForward<float>>,
        each_kernel<4, GeluForward<float>>, each_kernel<1, GeluForward<std::uint16_t>>,
        each_kernel<8, GeluForward<std::uint16_t>>, each_kernel<1, GeluBackward<float>>,
        each_kernel<4, GeluBackward<float>>, each_kernel<1, GeluBackward<std::uint16_t>>,
        each_kernel<8, GeluBackward<std::uint16_t>>, each_kernel<1, SwigluForward<float>>,
        each_kernel<4, SwigluForward<float>>, each_kernel<1, SwigluForward<std::uint16_t>>,
        each_kernel<8, SwigluForward<std::uint16_t>>, each_kernel<1, SwigluBackward<float>>,
        each_kernel<4, SwigluBackward<float>>, each_kernel<1, SwigluBackward<std::uint16_t>>,
        each_kernel<8, SwigluBackward<std::uint16_t>>, each_kernel<1, Cast<std::uint16_t, float>>,
        each_kernel<8, Cast<std::uint16_t, float>>, each_kernel<1, Cast<float, std::uint16_t>>,
        each_kernel<8, Cast<float, std::uint16_t>>);
}

void to_bf16(cudaStream_t s, std::uint16_t* dst, const float* src, u64 n) {
    each(s, Cast<std::uint16_t, float>{dst, src}, n, true, {dst, src});
}

void gelu_forward(const Launch& l, View out, ConstView inp) {
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        const GeluForward<E> op{out.data<E>(), inp.data<E>()};
        each(l.stream, op, out.size(), out.is_bf16(), {op.out, op.inp});
    });
}

void gelu_backward(const Launch& l, std::span<float> dinp, ConstView inp, std::span<const float> dout) {
    with_dtype(inp.dtype(), [&](auto e) {
        using E = decltype(e);
        const GeluBackward<E> op{dinp.data(), inp.data<E>(), dout.data()};
        each(l.stream, op, dinp.size(), inp.is_bf16(), {op.dinp, op.inp, op.dout});
    });
}

void swiglu_forward(const Launch& l, View out, ConstView gate, ConstView up) {
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        const SwigluForward<E> op{out.data<E>(), gate.data<E>(), up.data<E>()};
        each(l.stream, op, out.size(), out.is_bf16(), {op.out, op.gate, op.up});
    });
}

void swiglu_backward(const Launch& l, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     ConstView gate, ConstView up) {
    with_dtype(gate.dtype(), [&](auto e) {
        using E = decltype(e);
        const SwigluBackward<E> op{dgate.data(), dup.data(), dout.data(), gate.data<E>(), up.data<E>()};
        each(l.stream, op, dgate.size(), gate.is_bf16(), {op.dgate, op.dup, op.dout, op.gate, op.up});
    });
}

void residual_forward(const Launch& l, std::span<float> out, std::span<const float> a, std::span<const float> b) {
    each(l.stream, Residual{out.data(), a.data(), b.data()}, out.size(), false, {out.data(), a.data(), b.data()});
}

void accumulate(const Launch& l, std::span<float> acc, std::span<const float> x) {
    each(l.stream, Accumulate{acc.data(), x.data()}, acc.size(), false, {acc.data(), x.data()});
}

void cast(const Launch& l, View dst, ConstView src) {
    if (dst.is_bf16())
        to_bf16(l.stream, dst.data<std::uint16_t>(), src.data<float>(), dst.size());
    else
        each(l.stream, Cast<float, std::uint16_t>{dst.data<float>(), src.data<std::uint16_t>()}, dst.size(), true,
             {dst.data<float>(), src.data<std::uint16_t>()});
}

}  // namespace zinf::device::cuda
