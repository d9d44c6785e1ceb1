// What the device suites share (test_device, test_cuda): a fresh seed named
// in the log, random inputs (never zeros), bf16 copies of them.
#pragma once

#include "testing.hpp"

#include <zinf/util.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace zinf::testing {

inline std::uint64_t fresh_seed(const char* what) {
    const std::uint64_t s = seed(what);
    BOOST_TEST_MESSAGE(what << ": seed " << s << " (replay with ZINF_TEST_SEED=" << s << ")");
    return s;
}

inline std::vector<float> randn(std::size_t n, std::mt19937_64& rng, float scale = 1) {
    std::normal_distribution<float> normal;
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng) * scale;
    return v;
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, std::int32_t V, std::mt19937_64& rng) {
    std::uniform_int_distribution<std::int32_t> d(0, V - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// v rounded to bf16 (nearest even), as the host rounds; and back (exact).
inline std::vector<std::uint16_t> halves(const std::vector<float>& v) {
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = to_bf16(v[i]);
    return h;
}
inline std::vector<float> widened(const std::vector<std::uint16_t>& h) {
    std::vector<float> v(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) v[i] = from_bf16(h[i]);
    return v;
}

}  // namespace zinf::testing
