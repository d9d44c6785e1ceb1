// zinf kernels: what a Device's kernels take (device.hpp), and the list that
// declares each of them once (kernels.def). Light on purpose, the standard
// library's spans and integers only: the cuda backend's .cu files include it,
// and nvcc pays for every header.
//
// A kernel is one entry of kernels.def: its name, its arguments (type and
// name) and a comment with their shapes. From that one entry are made
//   Device::name     the public call: checks the spans against the shape on
//                    the caller's thread (device/checks.cpp's check_name),
//                    then hands them to the backend
//   Device::do_name  the backend's virtual, which the backends define by
//                    enqueueing their body
//   cpu::name        the cpu backend's body (device/<kind of op>.cpp), run
//                    on the stream's worker thread
//   cuda::name       the cuda backend's body (device/cuda/<kind of op>.cu),
//                    called with the stream
// so a new kernel is written in its entry, its check, its two bodies and its
// test, and nowhere else.
//
// An argument that may be stored fp32 or bf16 is a View (written) or a
// ConstView (read): a span that carries its element type, so one kernel
// serves both storages and its check says which it takes. An argument that
// is always fp32 stays a std::span<float>, and the compiler refuses the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

namespace zinf::optim {
struct Update;   // optim.hpp: adamw's arguments
struct Scalars;
}  // namespace zinf::optim

namespace zinf::device {

using u64 = std::uint64_t;

// How an element is stored: fp32, or bf16 (a std::uint16_t: the top half of
// an fp32, rounded to nearest even by zinf::to_bf16, widened exactly).
enum class DType : std::uint8_t { f32, bf16 };
const char* dtype_name(DType t);  // "fp32", "bf16"

// f(float{}) or f(std::uint16_t{}) as `t` says: a body templated on the
// element type, called for the one a view holds.
template <class F>
void with_dtype(DType t, F&& f) {
    if (t == DType::bf16)
        f(std::uint16_t{});
    else
        f(float{});
}

template <class T>
class Array;  // device.hpp

// `size` elements of device memory, fp32 or bf16 as dtype() says: a
// std::span<float> or std::span<std::uint16_t> that remembers which.
// Writable (View) or read-only (ConstView; a View converts to one). Made
// where a kernel takes one from either span, a pointer and a count, or an
// Array; a default one is empty.
template <bool Writable>
class BasicView {
    template <class T>
    using E = std::conditional_t<Writable, T, const T>;

public:
    constexpr BasicView() noexcept = default;
    constexpr BasicView(std::span<float> s) noexcept : BasicView(s.data(), s.size(), DType::f32) {}
    constexpr BasicView(std::span<std::uint16_t> s) noexcept : BasicView(s.data(), s.size(), DType::bf16) {}
    constexpr BasicView(std::span<const float> s) noexcept
        requires(!Writable)
        : BasicView(s.data(), s.size(), DType::f32) {}
    constexpr BasicView(std::span<const std::uint16_t> s) noexcept
        requires(!Writable)
        : BasicView(s.data(), s.size(), DType::bf16) {}
    constexpr BasicView(E<float>* p, std::size_t n) noexcept : BasicView(p, n, DType::f32) {}
    constexpr BasicView(E<std::uint16_t>* p, std::size_t n) noexcept : BasicView(p, n, DType::bf16) {}
    template <class T>
    BasicView(const Array<T>& a) noexcept : BasicView(a.span()) {}
    template <bool W>
        requires(W && !Writable)
    constexpr BasicView(const BasicView<W>& v) noexcept : BasicView(v.p_, v.n_, v.t_) {}

    constexpr DType dtype() const noexcept { return t_; }
    constexpr bool is_bf16() const noexcept { return t_ == DType::bf16; }
    constexpr std::size_t size() const noexcept { return n_; }
    constexpr bool empty() const noexcept { return n_ == 0; }
    constexpr std::size_t size_bytes() const noexcept { return n_ * (is_bf16() ? 2 : 4); }
    std::span<E<std::byte>> bytes() const noexcept { return {static_cast<E<std::byte>*>(p_), size_bytes()}; }
    // The elements as T: float where fp32, std::uint16_t where bf16.
    // Unchecked, as a span's data(): a kernel's body reads what its check
    // let through.
    template <class T>
    E<T>* data() const noexcept {
        return static_cast<E<T>*>(p_);
    }
    template <class T>
    std::span<E<T>> span() const noexcept {
        return {data<T>(), n_};
    }

private:
    template <bool>
    friend class BasicView;
    constexpr BasicView(E<void>* p, std::size_t n, DType t) noexcept : p_(p), n_(n), t_(t) {}

    E<void>* p_ = nullptr;
    std::size_t n_ = 0;
    DType t_ = DType::f32;
};
using View = BasicView<true>;
using ConstView = BasicView<false>;

// The arithmetic of a GEMM's inputs. fp32: the reference. bf16: A and B
// rounded to bf16 (nearest even), the products accumulated and C written in
// fp32, as llm.c's and every mixed-precision trainer's GEMMs on tensor cores.
// On cpu the inputs are rounded (or a bf16 operand widened) into scratch and
// OpenBLAS's cblas_sgemm multiplies them (Debian 12's OpenBLAS 0.3.21 is
// built without cblas_sbgemm), so the bf16 arithmetic is exact up to fp32
// accumulation, the host's reference; on cuda cuBLASLt multiplies fp32
// spans with CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor cores, inputs
// converted inside the kernel), and a bf16 operand with the other rounded to
// bf16 as bf16 x bf16 -> fp32 (CUBLAS_COMPUTE_32F). zinf-train --precision
// bf16 runs every GEMM of the model so, and where the manifest's working
// parameters are bf16 (zinf-shard layout's default) every engine
// (ZeRO-Infinity, and the resident reference) keeps the matrices and
// embedding tables bf16 on the device too (a bf16 ConstView from zero.hpp's
// stored()): gathered or installed and held as bf16, read as bf16 by the
// GEMMs and the embedding, never widened nor staged. A GEMM writes bf16
// where the next op reads bf16 (kernels.def's gemm: a GPT's q/k/v, its
// MLP's pre-activation and GELU, the logits under bf16 activations, which
// the loss is then taken from, as llm.c's). The activation checkpoints (the
// residual stream at each block boundary, model.hpp's Shape::checkpoints)
// are rounded to bf16 as they are made and kept, offloaded and read back
// bf16, widened to fp32 for the block that reads them: half the bytes on the
// device, in host memory and on NVMe. Layernorm and RMSNorm weights and
// biases are widened to fp32. The blocks keep the activations their GEMMs
// read (the norms' outputs, the attention's output, the GPT's MLP's pre- and
// post-GELU, the Llama's SwiGLU's gate, up and product) bf16 too (model.hpp's
// Shape::activations), written bf16 by the forward and read bf16 by the
// backward: a GEMM of a bf16 A (or, in a Llama weight's gradient dy^T x, a
// bf16 B), and GELU and SwiGLU from and to bf16 (a GEMM's input rounded to
// bf16 is what the bf16 GEMM reads anyway, so only GELU's and SwiGLU's
// inputs change the arithmetic). A block keeps the residual between its
// attention and MLP bf16 too (its norm's backward reads it so), and its
// q/k/v and attention softmax, the attention's backward (the GPT's
// attention_backward, the Llama's gqa_backward) reading them bf16. The loss,
// gradients handed to the optimizer, master weights and optimizer state stay
// fp32.
enum class Precision { fp32, bf16 };
const char* precision_name(Precision p);
Precision parse_precision(std::string_view text);  // UsageError naming the text and the choices

// C (m,n) = alpha * op(A) (m,k) * op(B) (k,n) + beta * C, row-major, `batch`
// times with the given element strides between matrices. op(X) is X or its
// transpose; lda is the row stride of A as stored ((m,k) or (k,m) when ta).
struct Gemm {
    bool ta = false, tb = false;
    u64 m = 0, n = 0, k = 0;
    u64 lda = 0, ldb = 0, ldc = 0;  // 0 = packed (the stored row length)
    float alpha = 1, beta = 0;
    u64 batch = 1;
    u64 stride_a = 0, stride_b = 0, stride_c = 0;  // 0 = packed (one matrix)
    Precision inputs = Precision::fp32;            // A's and B's arithmetic (see Precision)
};

// The cross-entropy's row stride (kernels.def): ldl, or V where 0 (packed).
constexpr u64 logits_stride(u64 ldl, u64 V) noexcept { return ldl ? ldl : V; }

}  // namespace zinf::device

// kernels.def's entries, ZINF_KERNEL(name, (type, argument)...), read by a
// ZINF_KERNEL defined for the purpose: ZINF_KERNEL_PARAMS(...) of the
// arguments is "type argument, ...", a parameter list; ZINF_KERNEL_ARGS(...)
// is "argument, ...", the call that passes them on. Up to 16 arguments.
#define ZINF_KERNEL_PARAMS(...) ZINF_KERNEL_EACH_(ZINF_KERNEL_PARAM_, __VA_ARGS__)
#define ZINF_KERNEL_ARGS(...) ZINF_KERNEL_EACH_(ZINF_KERNEL_ARG_, __VA_ARGS__)

#define ZINF_KERNEL_PARAM_(pair) ZINF_KERNEL_TYPE_NAME_ pair
#define ZINF_KERNEL_ARG_(pair) ZINF_KERNEL_NAME_ pair
#define ZINF_KERNEL_TYPE_NAME_(type, name) type name
#define ZINF_KERNEL_NAME_(type, name) name
#define ZINF_KERNEL_EACH_(f, ...) ZINF_KERNEL_CAT_(ZINF_KERNEL_EACH_N, ZINF_KERNEL_COUNT_(__VA_ARGS__))(f, __VA_ARGS__)
#define ZINF_KERNEL_CAT_(a, b) ZINF_KERNEL_CAT2_(a, b)
#define ZINF_KERNEL_CAT2_(a, b) a##b
#define ZINF_KERNEL_COUNT_(...) \
    ZINF_KERNEL_16TH_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define ZINF_KERNEL_16TH_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, ...) n
#define ZINF_KERNEL_EACH_N1(f, x) f(x)
#define ZINF_KERNEL_EACH_N2(f, x, ...) f(x), ZINF_KERNEL_EACH_N1(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N3(f, x, ...) f(x), ZINF_KERNEL_EACH_N2(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N4(f, x, ...) f(x), ZINF_KERNEL_EACH_N3(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N5(f, x, ...) f(x), ZINF_KERNEL_EACH_N4(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N6(f, x, ...) f(x), ZINF_KERNEL_EACH_N5(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N7(f, x, ...) f(x), ZINF_KERNEL_EACH_N6(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N8(f, x, ...) f(x), ZINF_KERNEL_EACH_N7(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N9(f, x, ...) f(x), ZINF_KERNEL_EACH_N8(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N10(f, x, ...) f(x), ZINF_KERNEL_EACH_N9(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N11(f, x, ...) f(x), ZINF_KERNEL_EACH_N10(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N12(f, x, ...) f(x), ZINF_KERNEL_EACH_N11(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N13(f, x, ...) f(x), ZINF_KERNEL_EACH_N12(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N14(f, x, ...) f(x), ZINF_KERNEL_EACH_N13(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N15(f, x, ...) f(x), ZINF_KERNEL_EACH_N14(f, __VA_ARGS__)
#define ZINF_KERNEL_EACH_N16(f, x, ...) f(x), ZINF_KERNEL_EACH_N15(f, __VA_ARGS__)
