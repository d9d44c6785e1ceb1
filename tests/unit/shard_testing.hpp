// What the shard unit tests share (test_shard, test_shard_values,
// test_shard_disk): one small model and a few lookups.
#pragma once

#include "io_testing.hpp"

#include <zinf/mem.hpp>
#include <zinf/shard.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <set>
#include <sstream>
#include <tuple>
#include <unistd.h>

namespace zinf::testing {

// A model small enough to lay out, write and read in milliseconds.
constexpr const char* kSmall = "gpt:layers=2,hidden=64,heads=2,vocab=97,seq=16";

inline std::uint64_t parse_label(std::string_view label) {
    std::size_t used = 0;
    const double v = std::stod(std::string(label), &used);
    const std::string unit(label.substr(used));
    const double scale = unit == "K" ? 1e3 : unit == "M" ? 1e6 : unit == "B" ? 1e9 : unit == "T" ? 1e12 : 0;
    BOOST_REQUIRE_MESSAGE(scale > 0, "label '" << label << "' has no K/M/B/T unit");
    return static_cast<std::uint64_t>(std::llround(v * scale));
}

inline std::vector<float> values(const shard::Tensor& t, const shard::ModelSpec& spec, std::uint64_t seed,
                                 std::uint64_t first, std::size_t n) {
    std::vector<float> v(n, std::numeric_limits<float>::quiet_NaN());
    shard::fill_fp32(t, spec, seed, first, v);
    return v;
}

inline bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

inline const shard::Tensor& named(const std::vector<shard::Tensor>& ts, const std::string& name) {
    auto it = std::find_if(ts.begin(), ts.end(), [&](const shard::Tensor& t) { return t.name == name; });
    BOOST_REQUIRE_MESSAGE(it != ts.end(), "no tensor " << name);
    return *it;
}

}  // namespace zinf::testing
