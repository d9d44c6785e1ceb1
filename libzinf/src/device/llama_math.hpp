// The Llama family's element-wise arithmetic, one definition for the cpu
// kernels (llama.cpp, g++ with -ffp-contract=off) and the cuda ones
// (cuda/llama.cu, nvcc with -fmad=false): the same operations in the same
// order, so SwiGLU gives the same bits on both backends. No zinf header, no
// libm: exp is built from arithmetic, as GELU's tanh is (kernels.cpp), so
// that the cpu loops vectorise and the GPU needs no expf of its own.
#pragma once

#if defined(__CUDACC__)
#include <cstring>
#define ZINF_LLAMA_FN __host__ __device__ __forceinline__
#else
#include <bit>
#include <cmath>
#include <cstdint>
#define ZINF_LLAMA_FN inline
#endif

namespace zinf::device::llama_math {

ZINF_LLAMA_FN float bits_to_float(int i) {
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

// e^x, Cephes' expf: x clamped to [-87, 88] (where the result stays a
// normal float), n = round(x log2 e), r = x - n ln 2 in two parts, a
// degree-6 polynomial, times 2^n built in the exponent bits. A few ulp.
ZINF_LLAMA_FN float exp_arith(float x) {
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

// silu(g) * u, and its two gradients for an upstream d: the sigmoid
// s = 1 / (1 + e^-g), silu = g / (1 + e^-g) (torch's form), silu' = s (1 + g (1 - s)).
ZINF_LLAMA_FN float swiglu(float g, float u) { return g / (1.0f + exp_arith(-g)) * u; }
ZINF_LLAMA_FN void swiglu_grad(float g, float u, float d, float* dg, float* du) {
    const float e = exp_arith(-g);
    const float s = 1.0f / (1.0f + e);
    const float silu = g / (1.0f + e);
    *dg = d * u * (s * (1.0f + g * (1.0f - s)));
    *du = d * silu;
}

}  // namespace zinf::device::llama_math

#undef ZINF_LLAMA_FN
