// Host-side arithmetic the backends share: the division that turns a sum into
// an average, bf16 reductions (MPI has no bf16), and the staging area.
#include "internal.hpp"

#include <algorithm>
#include <cstring>

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

std::span<std::byte> Scratch::get(std::size_t bytes) {
    if (buf_.size() < bytes) buf_.resize(bytes);
    return {buf_.data(), bytes};
}

}  // namespace zinf::comm::detail
