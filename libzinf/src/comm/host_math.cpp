// Host-side arithmetic the backends share: the division that turns a sum into
// an average, bf16 reductions (MPI has no bf16), the rank-order reduction of
// MPI's reduce-scatter, and the staging area. Built at -O3 (Makefile): the
// loops below are vectorised.
#include "internal.hpp"
#include "../util/cpu.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace zinf::comm::detail {

void divide(std::span<std::byte> buf, DType dtype, int n) {
    if (n == 1) return;
    switch (dtype) {
    case DType::f32: {
        auto* p = reinterpret_cast<float*>(buf.data());
        const float d = static_cast<float>(n);
        for (std::size_t i = 0, e = buf.size() / 4; i < e; ++i) p[i] /= d;
        return;
    }
    case DType::f64: {
        auto* p = reinterpret_cast<double*>(buf.data());
        const double d = n;
        for (std::size_t i = 0, e = buf.size() / 8; i < e; ++i) p[i] /= d;
        return;
    }
    case DType::bf16: {
        auto* p = reinterpret_cast<std::uint16_t*>(buf.data());
        const float d = static_cast<float>(n);
        for (std::size_t i = 0, e = buf.size() / 2; i < e; ++i) p[i] = to_bf16(from_bf16(p[i]) / d);
        return;
    }
    case DType::u8:
    case DType::i32:
    case DType::i64: break;
    }
    throw InternalError("comm: avg of integers (" + std::string(name(dtype)) + ") reached the division");
}

void bf16_reduce(std::uint16_t* acc, const std::uint16_t* in, std::size_t n, Reduce r) {
    if (r == Reduce::max) {
        for (std::size_t i = 0; i < n; ++i) acc[i] = to_bf16(std::max(from_bf16(acc[i]), from_bf16(in[i])));
        return;
    }
    for (std::size_t i = 0; i < n; ++i) acc[i] = to_bf16(from_bf16(acc[i]) + from_bf16(in[i]));
}

namespace {

// The running result of a tile stays in L1 while the n inputs stream past it
// once: one read of each input and one write of out, whatever n is.
constexpr std::size_t kTileBytes = 8192;

// Integer sums wrap, as MPI's do (without signed overflow's undefined behaviour).
template <class T>
T add(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
        return a + b;
    }
}

template <class T>
[[gnu::always_inline]] inline void fold(std::span<std::byte> out_bytes, std::span<const std::byte* const> in, Reduce r) {
    constexpr std::size_t tile = kTileBytes / sizeof(T);
    T* out = reinterpret_cast<T*>(out_bytes.data());
    const std::size_t count = out_bytes.size() / sizeof(T);
    const bool max = r == Reduce::max;
    for (std::size_t at = 0; at < count; at += tile) {
        const std::size_t m = std::min(tile, count - at);
        T* __restrict o = out + at;
        const T* __restrict a = reinterpret_cast<const T*>(in[0]) + at;
        if (in.size() == 1) {
            std::memcpy(o, a, m * sizeof(T));
            continue;
        }
        const T* __restrict b = reinterpret_cast<const T*>(in[1]) + at;
        if (max)
            for (std::size_t i = 0; i < m; ++i) o[i] = std::max(a[i], b[i]);
        else
            for (std::size_t i = 0; i < m; ++i) o[i] = add(a[i], b[i]);
        for (std::size_t k = 2; k < in.size(); ++k) {
            const T* __restrict x = reinterpret_cast<const T*>(in[k]) + at;
            if (max)
                for (std::size_t i = 0; i < m; ++i) o[i] = std::max(o[i], x[i]);
            else
                for (std::size_t i = 0; i < m; ++i) o[i] = add(o[i], x[i]);
        }
    }
}

// bf16 as bf16_reduce does it: each step in f32, rounded back to bf16.
[[gnu::always_inline]] inline void fold_bf16(std::span<std::byte> out_bytes, std::span<const std::byte* const> in,
                                             Reduce r) {
    constexpr std::size_t tile = kTileBytes / sizeof(float);
    auto* out = reinterpret_cast<std::uint16_t*>(out_bytes.data());
    const std::size_t count = out_bytes.size() / 2;
    const bool max = r == Reduce::max;
    float step[tile];
    for (std::size_t at = 0; at < count; at += tile) {
        const std::size_t m = std::min(tile, count - at);
        std::uint16_t* o = out + at;
        const auto* a = reinterpret_cast<const std::uint16_t*>(in[0]) + at;
        if (in.size() == 1) {
            std::memcpy(o, a, m * 2);
            continue;
        }
        for (std::size_t k = 1; k < in.size(); ++k) {
            const auto* __restrict acc = k == 1 ? a : o;
            const auto* __restrict x = reinterpret_cast<const std::uint16_t*>(in[k]) + at;
            if (max)
                for (std::size_t i = 0; i < m; ++i) step[i] = std::max(from_bf16(acc[i]), from_bf16(x[i]));
            else
                for (std::size_t i = 0; i < m; ++i) step[i] = from_bf16(acc[i]) + from_bf16(x[i]);
            to_bf16(std::span<const float>(step, m), std::span<std::uint16_t>(o, m));
        }
    }
}

[[gnu::always_inline]] inline void fold_any(std::span<std::byte> out, std::span<const std::byte* const> in,
                                            DType dtype, Reduce r) {
    switch (dtype) {
    case DType::f32: return fold<float>(out, in, r);
    case DType::f64: return fold<double>(out, in, r);
    case DType::i32: return fold<std::int32_t>(out, in, r);
    case DType::i64: return fold<std::int64_t>(out, in, r);
    case DType::u8: return fold<std::uint8_t>(out, in, r);
    case DType::bf16: return fold_bf16(out, in, r);
    }
}

// One build per instruction set, as util's bf16 rounding: the reduction
// runs on data in cache, where AVX2 and AVX-512 are worth having.
using Out = std::span<std::byte>;
using Ins = std::span<const std::byte* const>;
ZINF_TARGET_V4 void fold_v4(Out out, Ins in, DType dtype, Reduce r) { fold_any(out, in, dtype, r); }
ZINF_TARGET_AVX2 void fold_avx2(Out out, Ins in, DType dtype, Reduce r) { fold_any(out, in, dtype, r); }
void fold_base(Out out, Ins in, DType dtype, Reduce r) { fold_any(out, in, dtype, r); }

}  // namespace

void reduce_in_order(std::span<std::byte> out, std::span<const std::byte* const> in, DType dtype, Reduce r) {
    if (in.empty()) throw InternalError("comm: a reduction of no inputs");
    static const auto run = for_cpu(fold_v4, fold_avx2, fold_base);
    run(out, in, dtype, r);
}

std::span<std::byte> Scratch::get(std::size_t bytes) {
    if (buf_.size() < bytes) buf_.resize(bytes);
    return {buf_.data(), bytes};
}

}  // namespace zinf::comm::detail
