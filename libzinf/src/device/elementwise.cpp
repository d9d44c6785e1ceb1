// The cpu backend's element-wise kernels (kernels.def): GELU and SwiGLU in
// kernel_math's arithmetic (no libm, so that the loops vectorise), the
// residual adds, the casts, and AdamW (optim's kernel, on the stream).
#include "kernels.hpp"
#include "../util/cpu.hpp"
#include "../util/kernel_math.hpp"

#include <zinf/optim.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>

namespace zinf::device::cpu {

namespace {

template <class Out>
Out store(float x) {
    if constexpr (std::is_same_v<Out, float>) return x;
    else return zinf::to_bf16(x);
}

// GELU's tanh form in kernel_math's arithmetic (its tanh has no libm, so
// that the loops vectorise).
template <class In, class Out>
void gelu_rows(Out* out, const In* inp, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) out[i] = store<Out>(kernel_math::gelu(widen(inp[i])));
}

template <class In>
void gelu_grad(float* dinp, const In* inp, const float* dout, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) dinp[i] = kernel_math::gelu_grad(widen(inp[i]), dout[i]);
}

void residual_rows(float* out, const float* a, const float* b, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate_rows(float* acc, const float* x, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) acc[i] += x[i];
}

// util's vectorised conversion, one piece per task.
template <class To, class From>
void convert(To* dst, const From* src, u64 n) {
    constexpr u64 kPiece = 1 << 16;
    const u64 pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (u64 p = 0; p < pieces; ++p) {
        const u64 first = p * kPiece, len = std::min(kPiece, n - first);
        if constexpr (std::is_same_v<To, float>)
            zinf::from_bf16(std::span<const From>(src + first, len), std::span<To>(dst + first, len));
        else
            zinf::to_bf16(std::span<const From>(src + first, len), std::span<To>(dst + first, len));
    }
}

}  // namespace

void copy_rows(float* dst, u64 ld_dst, const float* src, u64 ld_src, u64 rows, u64 cols) {
    for (u64 r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, cols * sizeof(float));
}

void to_bf16(std::uint16_t* dst, const float* src, u64 n) { convert(dst, src, n); }
void from_bf16(float* dst, const std::uint16_t* src, u64 n) { convert(dst, src, n); }

// ---------------------------------------------------------------------------
// SwiGLU's loops are built once per instruction-set level (util/cpu.hpp) and
// run over blocks of elements: its exp and two divisions made it the dearest
// of a smollm-135m step's element-wise kernels (about 3 times GELU's time an
// element forward and 4 times backward on 4-wide SSE; BENCHMARKS.md). Every
// level does kernel_math's operations in the same order with no fused
// multiply-add (-ffp-contract=off), so the bits are the scalar form's, the
// cuda kernels' too. The backward runs in place (dgate is dout): each element
// reads its own inputs before it writes, which `ivdep` tells the vectoriser
// (it would otherwise check the overlap at run time and take the scalar loop).
namespace {

[[gnu::always_inline]] inline void swiglu_forward_in(float* out, const float* gate, const float* up, u64 n) {
#pragma GCC ivdep
    for (u64 i = 0; i < n; ++i) out[i] = kernel_math::swiglu(gate[i], up[i]);
}
ZINF_TARGET_V4 void swiglu_forward_v4(float* out, const float* gate, const float* up, u64 n) {
    swiglu_forward_in(out, gate, up, n);
}
ZINF_TARGET_AVX2 void swiglu_forward_avx2(float* out, const float* gate, const float* up, u64 n) {
    swiglu_forward_in(out, gate, up, n);
}
void swiglu_forward_base(float* out, const float* gate, const float* up, u64 n) { swiglu_forward_in(out, gate, up, n); }

[[gnu::always_inline]] inline void swiglu_backward_in(float* dgate, float* dup, const float* dout, const float* gate,
                                                      const float* up, u64 n) {
#pragma GCC ivdep
    for (u64 i = 0; i < n; ++i) {
        float dg, du;
        kernel_math::swiglu_grad(gate[i], up[i], dout[i], &dg, &du);
        dgate[i] = dg;
        dup[i] = du;
    }
}
ZINF_TARGET_V4 void swiglu_backward_v4(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}
ZINF_TARGET_AVX2 void swiglu_backward_avx2(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}
void swiglu_backward_base(float* dgate, float* dup, const float* dout, const float* gate, const float* up, u64 n) {
    swiglu_backward_in(dgate, dup, dout, gate, up, n);
}

constexpr u64 kElementBlock = 4096;  // elements per task: a multiple of every level's vector width

// f(i, count) over [0, n) in blocks, on the team when n is large enough.
template <class F>
void element_blocks(u64 n, F&& f) {
    const u64 blocks = (n + kElementBlock - 1) / kElementBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 b = 0; b < blocks; ++b) f(b * kElementBlock, std::min(kElementBlock, n - b * kElementBlock));
}

void swiglu_rows(float* out, const float* gate, const float* up, u64 n) {
    static const auto run = for_cpu(swiglu_forward_v4, swiglu_forward_avx2, swiglu_forward_base);
    element_blocks(n, [&](u64 i, u64 count) { run(out + i, gate + i, up + i, count); });
}

void swiglu_grad(float* dgate, float* dup, const float* dout, const float* gate, const float* up, u64 n) {
    static const auto run = for_cpu(swiglu_backward_v4, swiglu_backward_avx2, swiglu_backward_base);
    element_blocks(n, [&](u64 i, u64 count) { run(dgate + i, dup + i, dout + i, gate + i, up + i, count); });
}

// From bf16 gate and up: each block widened (exact) into the task's own
// fp32 copies, then the fp32 loop of this level over them, the forward's
// block then rounded into out: the fp32 kernels' bits on the widened inputs.
struct Widened {
    float gate[kElementBlock], up[kElementBlock], out[kElementBlock];
    Widened(const std::uint16_t* g, const std::uint16_t* u, u64 count) {
        zinf::from_bf16(std::span(g, count), std::span(gate, count));
        zinf::from_bf16(std::span(u, count), std::span(up, count));
    }
};

void swiglu_rows(std::uint16_t* out, const std::uint16_t* gate, const std::uint16_t* up, u64 n) {
    static const auto run = for_cpu(swiglu_forward_v4, swiglu_forward_avx2, swiglu_forward_base);
    element_blocks(n, [&](u64 i, u64 count) {
        Widened w(gate + i, up + i, count);
        run(w.out, w.gate, w.up, count);
        zinf::to_bf16(std::span<const float>(w.out, count), std::span(out + i, count));
    });
}

void swiglu_grad(float* dgate, float* dup, const float* dout, const std::uint16_t* gate, const std::uint16_t* up,
                 u64 n) {
    static const auto run = for_cpu(swiglu_backward_v4, swiglu_backward_avx2, swiglu_backward_base);
    element_blocks(n, [&](u64 i, u64 count) {
        Widened w(gate + i, up + i, count);
        run(dgate + i, dup + i, dout + i, w.gate, w.up, count);
    });
}

}  // namespace

// ---------------------------------------------------------------------------
void gelu_forward(View out, ConstView inp) {
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        gelu_rows(out.data<E>(), inp.data<E>(), out.size());
    });
}

void gelu_backward(std::span<float> dinp, ConstView inp, std::span<const float> dout) {
    with_dtype(inp.dtype(), [&](auto e) { gelu_grad(dinp.data(), inp.data<decltype(e)>(), dout.data(), dinp.size()); });
}

void swiglu_forward(View out, ConstView gate, ConstView up) {
    with_dtype(out.dtype(), [&](auto e) {
        using E = decltype(e);
        swiglu_rows(out.data<E>(), gate.data<E>(), up.data<E>(), out.size());
    });
}

void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout, ConstView gate,
                     ConstView up) {
    with_dtype(gate.dtype(), [&](auto e) {
        using E = decltype(e);
        swiglu_grad(dgate.data(), dup.data(), dout.data(), gate.data<E>(), up.data<E>(), dgate.size());
    });
}

void residual_forward(std::span<float> out, std::span<const float> a, std::span<const float> b) {
    residual_rows(out.data(), a.data(), b.data(), out.size());
}

void accumulate(std::span<float> acc, std::span<const float> x) { accumulate_rows(acc.data(), x.data(), acc.size()); }

void cast(View dst, ConstView src) {
    if (dst.is_bf16())
        to_bf16(dst.data<std::uint16_t>(), src.data<float>(), dst.size());
    else
        from_bf16(dst.data<float>(), src.data<std::uint16_t>(), dst.size());
}

// optim's AdamW on the stream's team: the device's threads on compute.
void adamw(const optim::Update& u, const optim::Scalars& k) {
    optim::adamw(u, k, optim::Kernel{.isa = optim::default_isa(), .threads = 0});
}

}  // namespace zinf::device::cpu
