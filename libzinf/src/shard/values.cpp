// Initial values: GPT-2's scheme (normal 0.02, residual projections scaled by
// 1/sqrt(2L), biases zero, LayerNorm weights one), every value a function of
// (seed, tensor, element) alone.
#include <zinf/shard.hpp>

#include "generate.hpp"

#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zinf::shard {

std::array<std::uint32_t, 4> philox(std::uint64_t seed, std::uint64_t counter_lo, std::uint64_t counter_hi) {
    r123::Philox4x32 rng;
    r123::Philox4x32::key_type k = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
    r123::Philox4x32::ctr_type c = {{static_cast<std::uint32_t>(counter_lo), static_cast<std::uint32_t>(counter_lo >> 32),
                                     static_cast<std::uint32_t>(counter_hi), static_cast<std::uint32_t>(counter_hi >> 32)}};
    auto r = rng(c, k);
    return {r.v[0], r.v[1], r.v[2], r.v[3]};
}

void fill_fp32(const Tensor& t, const ModelSpec& spec, std::uint64_t seed, std::uint64_t first, std::span<float> out) {
    const std::uint64_t data = first < t.numel ? std::min<std::uint64_t>(out.size(), t.numel - first) : 0;
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(data), out.end(), 0.0f);  // padding
    if (data == 0) return;
    switch (t.init) {
    case InitKind::zeros: std::fill_n(out.begin(), data, 0.0f); return;
    case InitKind::ones: std::fill_n(out.begin(), data, 1.0f); return;
    case InitKind::normal:
    case InitKind::residual: break;
    }
    const float sd = t.init == InitKind::normal ? 0.02f
                                                : static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(spec.layers)));
    // The stream is the untiled tensor's name, so a tile holds exactly the
    // values of its columns of the untiled weight.
    const std::uint64_t stream = xxh3(std::as_bytes(std::span(t.key.data(), t.key.size())));
    if (t.cols == t.key_cols) {
        detail::normals(seed, stream, first, data, sd, out.data());
        return;
    }
    // A tile: one run of consecutive key elements per row segment.
    for (std::uint64_t e = first, done = 0; done < data;) {
        const std::uint64_t row = e / t.cols, col = e % t.cols;
        const std::uint64_t run = std::min(t.cols - col, data - done);
        detail::normals(seed, stream, row * t.key_cols + t.col0 + col, run, sd, out.data() + done);
        e += run;
        done += run;
    }
}

}  // namespace zinf::shard
