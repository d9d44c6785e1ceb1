// bf16 rounding, built at -O3 with clones per instruction set (Makefile): it
// sits on the hot path of zinf-shard init and of bf16 reductions.
#include <zinf/util.hpp>

#include <cstring>

namespace zinf {
namespace {
inline std::uint16_t round_bits(std::uint32_t u) {
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
    return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40 : rounded);
}
}  // namespace

std::uint16_t to_bf16(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return round_bits(u);
}

float from_bf16(std::uint16_t v) {
    const std::uint32_t u = std::uint32_t{v} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
void to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
    const float* src = in.data();
    std::uint16_t* dst = out.data();
    for (std::size_t i = 0, n = in.size(); i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, src + i, 4);
        dst[i] = round_bits(u);
    }
}

}  // namespace zinf
