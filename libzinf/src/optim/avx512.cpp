// The AdamW update and the block sum of squares for AVX-512 (F + BW): 16
// elements a step, the same operations in the same order as update_one.
#if !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx2")
#endif
// GCC 12 warns inside its own headers about _mm512_undefined_*(), the
// deliberately undefined pass-through of unmasked intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels.hpp"

#include <immintrin.h>

// clang ignores #pragma GCC target (make fuzz builds the library with it):
// this file's own functions take the target from here on, the headers' not.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx2"))), apply_to = function)
#endif

namespace zinf::optim::detail {
namespace {
inline __m512 load_grad(const Ptrs& p, std::size_t i) {
    if (p.g32) return _mm512_loadu_ps(p.g32 + i);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.g16 + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// to_bf16 on 16 lanes: round to nearest even, a NaN kept quiet.
inline __m256i round_bf16(__m512 w) {
    const __m512i u = _mm512_castps_si512(w);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
}  // namespace

void update_avx512(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s) {
    const __m512 gs = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1),
                 ob1 = _mm512_set1_ps(s.one_minus_beta1), b2 = _mm512_set1_ps(s.beta2),
                 ob2 = _mm512_set1_ps(s.one_minus_beta2), ibc2 = _mm512_set1_ps(s.inv_sqrt_bc2),
                 eps = _mm512_set1_ps(s.eps), decay = _mm512_set1_ps(s.decay), step = _mm512_set1_ps(s.step_size);
    std::size_t i = first;
    for (; i + 16 <= last; i += 16) {
        const __m512 g = _mm512_mul_ps(load_grad(p, i), gs);
        const __m512 m = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(p.m + i)), _mm512_mul_ps(ob1, g));
        const __m512 v =
            _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(p.v + i)), _mm512_mul_ps(ob2, _mm512_mul_ps(g, g)));
        const __m512 d = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), ibc2), eps);
        const __m512 w = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(p.w + i), decay),
                                       _mm512_mul_ps(step, _mm512_div_ps(m, d)));
        _mm512_storeu_ps(p.m + i, m);
        _mm512_storeu_ps(p.v + i, v);
        _mm512_storeu_ps(p.w + i, w);
        if (p.p32) _mm512_storeu_ps(p.p32 + i, w);
        if (p.p16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.p16 + i), round_bf16(w));
    }
    for (; i < last; ++i) update_one(p, i, s);
}

double block_squares_avx512(const float* f32, const std::uint16_t* b16, std::size_t n) {
    __m512d acc = _mm512_setzero_pd();  // lane j holds the elements i = j mod 8
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = f32 ? _mm256_loadu_ps(f32 + i)
                             : _mm256_castsi256_ps(_mm256_slli_epi32(
                                   _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b16 + i))), 16));
        const __m512d d = _mm512_cvtps_pd(x);
        acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
    }
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, acc);
    square_tail(f32, b16, i, n, lanes);
    return add_lanes(lanes);
}

}  // namespace zinf::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#endif
