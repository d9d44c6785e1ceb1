// The AdamW update and the block sum of squares for AVX2: 8 elements a step,
// the same operations in the same order as update_one (no FMA).
#if !defined(__clang__)
#pragma GCC target("avx2")
#endif
#include "kernels.hpp"

#include <immintrin.h>

// clang ignores #pragma GCC target (make fuzz builds the library with it):
// this file's own functions take the target from here on, the headers' not.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#endif

namespace zinf::optim::detail {
namespace {
inline __m128i load8_u16(const std::uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

inline __m256 load_grad(const Ptrs& p, std::size_t i) {
    return p.g32 ? _mm256_loadu_ps(p.g32 + i) : widen_bf16(load8_u16(p.g16 + i));
}

// to_bf16 on 8 lanes: round to nearest even, a NaN kept quiet.
inline __m128i round_bf16(__m256 w) {
    const __m256i u = _mm256_castps_si256(w);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    // |u| > 0x7f800000 as signed compare: both sides are below 2^31.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane is below 2^16, so the saturating pack is exact; it packs
    // within 128-bit halves, so gather the two low quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}
}  // namespace

void update_avx2(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s) {
    const __m256 gs = _mm256_set1_ps(s.grad_scale), b1 = _mm256_set1_ps(s.beta1),
                 ob1 = _mm256_set1_ps(s.one_minus_beta1), b2 = _mm256_set1_ps(s.beta2),
                 ob2 = _mm256_set1_ps(s.one_minus_beta2), ibc2 = _mm256_set1_ps(s.inv_sqrt_bc2),
                 eps = _mm256_set1_ps(s.eps), decay = _mm256_set1_ps(s.decay), step = _mm256_set1_ps(s.step_size);
    std::size_t i = first;
    for (; i + 8 <= last; i += 8) {
        const __m256 g = _mm256_mul_ps(load_grad(p, i), gs);
        const __m256 m = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(p.m + i)), _mm256_mul_ps(ob1, g));
        const __m256 v =
            _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(p.v + i)), _mm256_mul_ps(ob2, _mm256_mul_ps(g, g)));
        const __m256 d = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), ibc2), eps);
        const __m256 w = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p.w + i), decay),
                                       _mm256_mul_ps(step, _mm256_div_ps(m, d)));
        _mm256_storeu_ps(p.m + i, m);
        _mm256_storeu_ps(p.v + i, v);
        _mm256_storeu_ps(p.w + i, w);
        if (p.p32) _mm256_storeu_ps(p.p32 + i, w);
        if (p.p16) _mm_storeu_si128(reinterpret_cast<__m128i*>(p.p16 + i), round_bf16(w));
    }
    for (; i < last; ++i) update_one(p, i, s);
}

double block_squares_avx2(const float* f32, const std::uint16_t* b16, std::size_t n) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0-3 and 4-7
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = f32 ? _mm256_loadu_ps(f32 + i) : widen_bf16(load8_u16(b16 + i));
        const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    alignas(32) double lanes[8];
    _mm256_store_pd(lanes, lo);
    _mm256_store_pd(lanes + 4, hi);
    square_tail(f32, b16, i, n, lanes);
    return add_lanes(lanes);
}

}  // namespace zinf::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#endif
