// The hot loop of initialisation: normal values from Philox4x32-10 counters,
// four per block (Box-Muller on two pairs). Built for AVX-512, AVX2 and the
// baseline (for_cpu), so the rounds and the polynomials run in vector registers: about
// 450M values/s per core with SSE4.2 and 680M with AVX2, against 140M for the
// scalar library call and libm's sincosf. philox() in values.cpp is the
// reference it is tested against.
//
// Every value must be the same bits on every x86-64 machine (a rank's
// partition may be made on any node), so nothing here depends on the vector
// width: only IEEE-exact operations (+ - * / sqrt, conversions, rounding),
// no fused multiply-add (-ffp-contract=off in the Makefile), and our own log
// and sincos polynomials in place of libm's, whose vector versions differ in
// the last bit from one instruction set to the next.
#include "generate.hpp"
#include "../util/cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zinf::shard::detail {

namespace {

constexpr std::size_t kGroups = 256;  // Philox blocks per batch

// Natural log of a in (0, 1]: a = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(f), f = (m-1)/(m+1), by its series to f^9 (|f| < 0.172,
// relative error below 1e-7).
inline float log_unit(float a) {
    std::uint32_t u;
    std::memcpy(&u, &a, 4);
    int e = static_cast<int>(u >> 23) - 127;
    std::uint32_t mu = (u & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
    float m;
    std::memcpy(&m, &mu, 4);
    const bool big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    const float f = (m - 1.f) / (m + 1.f);
    const float f2 = f * f;
    const float series = 1.f + f2 * (1.f / 3 + f2 * (1.f / 5 + f2 * (1.f / 7 + f2 * (1.f / 9))));
    return static_cast<float>(e) * 0.693147180559945f + 2.f * f * series;
}

// sin and cos of 2*pi*t for t in [0, 1): the quadrant from round(4t), then
// Taylor polynomials on [-pi/4, pi/4]; error below 4e-7 (tested).
inline void sincos2pi(float t, float& s, float& c) {
    const float y = 4.f * t;
    const float k = std::nearbyint(y);
    const float r = (y - k) * 1.5707963267948966f;
    const float r2 = r * r;
    const float sp = r * (1.f + r2 * (-1.f / 6 + r2 * (1.f / 120 + r2 * (-1.f / 5040))));
    const float cp = 1.f + r2 * (-0.5f + r2 * (1.f / 24 + r2 * (-1.f / 720 + r2 * (1.f / 40320))));
    const int q = static_cast<int>(k) & 3;
    const float ss = (q & 1) ? cp : sp, cc = (q & 1) ? sp : cp;
    s = (q & 2) ? -ss : ss;
    c = ((q + 1) & 2) ? -cc : cc;
}

// log u for the radius, u = (k + 0.5) 2^-24 with k the draw's top 24 bits
// and `u` its fp32 value. The largest draw, u = 1 - 2^-25, rounds to 1.0 in
// fp32 (its 25 significant bits do not fit), where log u would be 0 and the
// radius vanish (a value of -0 where it should be about 1e-4 sd); its
// complement 1 - u = ((2^24 - k) - 0.5) 2^-24 is exact, and log u = -(1 - u)
// to fp32's precision there. Every other u is below 1.0 and keeps log_unit,
// so no other value changes.
inline float log_u(std::uint32_t word, float u) {
    const float complement = (static_cast<float>(static_cast<std::int32_t>(0x1000000u - (word >> 8))) - 0.5f) *
                             (1.0f / 16777216.0f);
    return u < 1.f ? log_unit(u) : -complement;
}

[[gnu::always_inline]] inline void normals_in(std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
                                              std::size_t n, float sd, float* out) {
    alignas(64) std::uint32_t x0[kGroups], x1[kGroups], x2[kGroups], x3[kGroups];
    alignas(64) float z[4][kGroups];
    std::uint64_t g = first / 4;          // the block holding element `first`
    std::size_t skip = first % 4;         // values of that block before it
    while (n > 0) {
        for (std::size_t i = 0; i < kGroups; ++i) {
            const std::uint64_t c = g + i;
            x0[i] = static_cast<std::uint32_t>(c);
            x1[i] = static_cast<std::uint32_t>(c >> 32);
            x2[i] = static_cast<std::uint32_t>(stream);
            x3[i] = static_cast<std::uint32_t>(stream >> 32);
        }
        std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
        for (int round = 0; round < 10; ++round) {
            for (std::size_t i = 0; i < kGroups; ++i) {
                const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * x0[i];
                const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * x2[i];
                const std::uint32_t y0 = static_cast<std::uint32_t>(p1 >> 32) ^ x1[i] ^ k0;
                const std::uint32_t y2 = static_cast<std::uint32_t>(p0 >> 32) ^ x3[i] ^ k1;
                x1[i] = static_cast<std::uint32_t>(p1);
                x3[i] = static_cast<std::uint32_t>(p0);
                x0[i] = y0;
                x2[i] = y2;
            }
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        // 24-bit uniforms: u in (0, 1) for the radius, [0, 1) for the angle.
        constexpr float s = 1.0f / 16777216.0f;
        for (std::size_t i = 0; i < kGroups; ++i) {
            const float a = (static_cast<float>(static_cast<std::int32_t>(x0[i] >> 8)) + 0.5f) * s;
            const float b = static_cast<float>(static_cast<std::int32_t>(x1[i] >> 8)) * s;
            const float c = (static_cast<float>(static_cast<std::int32_t>(x2[i] >> 8)) + 0.5f) * s;
            const float d = static_cast<float>(static_cast<std::int32_t>(x3[i] >> 8)) * s;
            const float ra = sd * std::sqrt(-2.f * log_u(x0[i], a)), rc = sd * std::sqrt(-2.f * log_u(x2[i], c));
            float sb, cb, sdd, cd;
            sincos2pi(b, sb, cb);
            sincos2pi(d, sdd, cd);
            z[0][i] = ra * cb;
            z[1][i] = ra * sb;
            z[2][i] = rc * cd;
            z[3][i] = rc * sdd;
        }
        const std::size_t have = kGroups * 4 - skip, take = std::min(n, have);
        if (take == kGroups * 4) {  // a whole batch: interleave in vector registers
            for (std::size_t i = 0; i < kGroups; ++i) {
                out[4 * i] = z[0][i];
                out[4 * i + 1] = z[1][i];
                out[4 * i + 2] = z[2][i];
                out[4 * i + 3] = z[3][i];
            }
        } else {
            for (std::size_t j = 0; j < take; ++j) {
                const std::size_t v = skip + j;
                out[j] = z[v % 4][v / 4];
            }
        }
        out += take;
        n -= take;
        g += kGroups;
        skip = 0;
    }
}

ZINF_TARGET_V4 void normals_v4(std::uint64_t seed, std::uint64_t stream, std::uint64_t first, std::size_t n,
                               float sd, float* out) {
    normals_in(seed, stream, first, n, sd, out);
}
ZINF_TARGET_AVX2 void normals_avx2(std::uint64_t seed, std::uint64_t stream, std::uint64_t first, std::size_t n,
                                   float sd, float* out) {
    normals_in(seed, stream, first, n, sd, out);
}
void normals_base(std::uint64_t seed, std::uint64_t stream, std::uint64_t first, std::size_t n, float sd,
                  float* out) {
    normals_in(seed, stream, first, n, sd, out);
}

}  // namespace

void normals(std::uint64_t seed, std::uint64_t stream, std::uint64_t first, std::size_t n, float sd, float* out) {
    static const auto run = for_cpu(normals_v4, normals_avx2, normals_base);
    run(seed, stream, first, n, sd, out);
}

}  // namespace zinf::shard::detail
