// The per-instruction-set kernels behind optim.hpp. Each file is compiled
// for its own instruction set (#pragma GCC target) and only called when the
// CPU has it. Every kernel computes the element update of optim.hpp in the
// same order, so they agree bit for bit; tails go through the portable one.
#pragma once

#include <zinf/optim.hpp>

#include "../util/kernel_math.hpp"

#include <cstdint>

namespace zinf::optim::detail {

// Raw pointers inside the library only: spans checked by the caller.
struct Ptrs {
    float* w;
    float* m;
    float* v;
    const float* g32;           // one of g32, g16
    const std::uint16_t* g16;
    float* p32;                 // at most one of p32, p16
    std::uint16_t* p16;
};

// Internal linkage for everything defined here: each file is compiled for
// its own instruction set, and one shared copy of an inline function could be
// the AVX-512 one called from the portable path.
namespace {

inline Ptrs ptrs(const Update& u) {
    return {u.master.data(),   u.exp_avg.data(),   u.exp_avg_sq.data(), u.grad_f32.data(),
            u.grad_bf16.data(), u.param_f32.data(), u.param_bf16.data()};
}

// The definition of the update, one element (optim.hpp): kernel_math's, the
// cuda kernel's too.
inline void update_one(const Ptrs& p, std::size_t i, const Scalars& s) { kernel_math::adamw_update(p, i, s); }

}  // namespace

void update_portable(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s);
void update_avx2(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s);
void update_avx512(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s);

// Sum of squares of one block (at most kNormBlock elements) in the fixed lane
// order of optim.hpp; exactly one of f32, b16 is non-null.
double block_squares_portable(const float* f32, const std::uint16_t* b16, std::size_t n);
double block_squares_avx2(const float* f32, const std::uint16_t* b16, std::size_t n);
double block_squares_avx512(const float* f32, const std::uint16_t* b16, std::size_t n);

namespace {
// The lanes of a block added in the one order.
inline double add_lanes(const double a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
// The elements the vector loop left, into their lanes (i mod 8), in order.
inline void square_tail(const float* f32, const std::uint16_t* b16, std::size_t from, std::size_t n,
                        double acc[8]) {
    for (std::size_t i = from; i < n; ++i) {
        const double x = f32 ? f32[i] : kernel_math::bf16_widen(b16[i]);
        acc[i % 8] += x * x;
    }
}
}  // namespace

}  // namespace zinf::optim::detail
