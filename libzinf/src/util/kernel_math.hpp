// The element arithmetic every backend evaluates, written once: the cpu
// kernels (device/, g++ with -ffp-contract=off), the cuda kernels
// (device/cuda/*.cu, nvcc with -fmad=false) and the CPU AdamW (optim/)
// include this, so that a formula gives the same bits wherever it runs. No
// zinf header and no libm call: exp is built from arithmetic, so that the cpu
// loops vectorise (libm's expf and tanhf are scalar: tanhf was an eighth of a
// gpt2-124m training step) and the vector body, the scalar tail and the GPU
// round alike.
#pragma once

#if defined(__CUDACC__)
#include <cstdint>
#include <cstring>
#define ZINF_MATH_FN __host__ __device__ __forceinline__
#else
#include <bit>
#include <cmath>
#include <cstdint>
#define ZINF_MATH_FN inline
#endif

namespace zinf::kernel_math {

// LayerNorm's epsilon (GPT-2's, torch's default).
inline constexpr float kLayerNormEps = 1e-5f;
// GELU's tanh form (GPT-2; torch's gelu(approximate='tanh')): sqrt(2/pi)
// rounded once from double, as torch's kBeta (the test holds the literal to
// it), and the cube's coefficient.
inline constexpr float kGeluScale = 0x1.988454p-1f;
inline constexpr float kGeluCube = 0.044715f;
// Column sums (a bias's gradient, a norm's weight and bias gradients: one
// sum over every row for each column) on both backends, in one order: the
// rows in chunks of kSumRows, each chunk summed in row order from zero, the
// chunks' sums added in chunk order from zero, the total then added to the
// output. The GPU runs chunks x column tiles of blocks (a 132-SM chip full
// at a few thousand rows) and the cpu the same sums, so the bits agree.
inline constexpr std::uint64_t kSumRows = 128;

// Internal linkage: optim's files are each compiled for their own
// instruction set (#pragma GCC target), and one shared copy of an inline
// function could be the AVX-512 one called from the portable path.
namespace {

ZINF_MATH_FN float bits_to_float(int i) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(i);
#elif defined(__CUDACC__)
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
#else
    return std::bit_cast<float>(static_cast<std::int32_t>(i));
#endif
}

ZINF_MATH_FN std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#elif defined(__CUDACC__)
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#else
    return std::bit_cast<std::uint32_t>(f);
#endif
}

// bf16 from an fp32's bits, rounded to nearest even; a NaN stays a quiet NaN
// (util's to_bf16, every backend's).
ZINF_MATH_FN std::uint16_t bf16_round_bits(std::uint32_t u) {
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
    return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40 : rounded);
}
ZINF_MATH_FN std::uint16_t bf16_round(float f) { return bf16_round_bits(float_bits(f)); }
// A bf16 as the fp32 it is (exact).
ZINF_MATH_FN float bf16_widen(std::uint16_t b) { return bits_to_float(static_cast<int>(std::uint32_t{b} << 16)); }

// e^x, Cephes' expf: x clamped to [-87, 88] (where the result stays a
// normal float), n = round(x log2 e), r = x - n ln 2 in two parts, a
// degree-6 polynomial, times 2^n built in the exponent bits. A few ulp.
ZINF_MATH_FN float exp_arith(float x) {
    // Selects, not fminf/fmaxf (GCC vectorises these); a NaN passes through.
    float c = x < -87.0f ? -87.0f : x;
    c = c > 88.0f ? 88.0f : c;
    const float n = floorf(c * 1.44269504088896341f + 0.5f);
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * bits_to_float((static_cast<int>(n) + 127) << 23);
}

// tanh u = (e - 1) / (e + 1) with e = e^(2u), u clamped to [-9, 9] where
// tanh is +-1 in fp32 anyway (so exp's own clamp never bites). Error: a few
// ulp of 1 + tanh, which is what GELU uses.
ZINF_MATH_FN float tanh_arith(float u) {
    float c = u < -9.0f ? -9.0f : u;
    c = c > 9.0f ? 9.0f : c;
    const float e = exp_arith(2.0f * c);
    return (e - 1.0f) / (e + 1.0f);
}

// GELU, tanh form: 0.5 x (1 + tanh(s (x + a x^3))).
ZINF_MATH_FN float gelu(float x) {
    const float cube = kGeluCube * x * x * x;
    return 0.5f * x * (1.0f + tanh_arith(kGeluScale * (x + cube)));
}

// d gelu(x) * d for an upstream d, as torch writes the derivative:
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 a x^2), u = s (x + a x^3).
ZINF_MATH_FN float gelu_grad(float x, float d) {
    const float th = tanh_arith(kGeluScale * (x + kGeluCube * x * x * x));
    const float inner = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    const float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * inner;
    return local * d;
}

// silu(g) * u, and its two gradients for an upstream d: the sigmoid
// s = 1 / (1 + e^-g), silu = g / (1 + e^-g) (torch's form), silu' = s (1 + g (1 - s)).
ZINF_MATH_FN float swiglu(float g, float u) { return g / (1.0f + exp_arith(-g)) * u; }
ZINF_MATH_FN void swiglu_grad(float g, float u, float d, float* dg, float* du) {
    const float e = exp_arith(-g);
    const float s = 1.0f / (1.0f + e);
    const float silu = g / (1.0f + e);
    *dg = d * u * (s * (1.0f + g * (1.0f - s)));
    *du = d * silu;
}

// Attention's softmax scale for heads of hd: 1 / sqrt(hd).
ZINF_MATH_FN float attention_scale(std::uint64_t hd) { return 1.0f / sqrtf(static_cast<float>(hd)); }

// optim.hpp's AdamW update of element i: p (optim's detail::Ptrs: the
// master w, the moments m and v updated in place, the gradient g32 or g16,
// the working parameter p32 or p16 or neither written) by the step's scalars
// s (optim::Scalars). Templates, so that this header includes none of ours.
template <class P, class S>
ZINF_MATH_FN void adamw_update(const P& p, std::uint64_t i, const S& s) {
    const float g = (p.g32 ? p.g32[i] : bf16_widen(p.g16[i])) * s.grad_scale;
    const float m = s.beta1 * p.m[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * p.v[i] + s.one_minus_beta2 * (g * g);
    const float d = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
    const float w = p.w[i] * s.decay - s.step_size * (m / d);
    p.m[i] = m;
    p.v[i] = v;
    p.w[i] = w;
    if (p.p32) p.p32[i] = w;
    if (p.p16) p.p16[i] = bf16_round(w);
}

}  // namespace
}  // namespace zinf::kernel_math

#undef ZINF_MATH_FN
