// bf16 rounding, built at -O3 (Makefile) once per instruction set (for_cpu):
// it sits on the hot path of zinf-shard init and of bf16 reductions.
#include <zinf/util.hpp>

#include "cpu.hpp"
#include "kernel_math.hpp"

#include <cstring>

namespace zinf {
namespace {
// kernel_math's rounding, the cuda kernels' too.
inline std::uint16_t round_bits(std::uint32_t u) { return kernel_math::bf16_round_bits(u); }
}  // namespace

std::uint16_t to_bf16(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return round_bits(u);
}

namespace {
[[gnu::always_inline]] inline void round_all(const float* src, std::uint16_t* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, src + i, 4);
        dst[i] = round_bits(u);
    }
}
ZINF_TARGET_V4 void round_v4(const float* src, std::uint16_t* dst, std::size_t n) { round_all(src, dst, n); }
ZINF_TARGET_AVX2 void round_avx2(const float* src, std::uint16_t* dst, std::size_t n) { round_all(src, dst, n); }
void round_base(const float* src, std::uint16_t* dst, std::size_t n) { round_all(src, dst, n); }

[[gnu::always_inline]] inline void widen_all(const std::uint16_t* src, float* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}
ZINF_TARGET_V4 void widen_v4(const std::uint16_t* src, float* dst, std::size_t n) { widen_all(src, dst, n); }
ZINF_TARGET_AVX2 void widen_avx2(const std::uint16_t* src, float* dst, std::size_t n) { widen_all(src, dst, n); }
void widen_base(const std::uint16_t* src, float* dst, std::size_t n) { widen_all(src, dst, n); }
}  // namespace

void to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
    static const auto run = for_cpu(round_v4, round_avx2, round_base);
    run(in.data(), out.data(), in.size());
}

void from_bf16(std::span<const std::uint16_t> in, std::span<float> out) {
    static const auto run = for_cpu(widen_v4, widen_avx2, widen_base);
    run(in.data(), out.data(), in.size());
}

}  // namespace zinf
