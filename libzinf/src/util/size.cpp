#include <zinf/util.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace zinf {
namespace {

struct Unit {
    std::string_view suffix;
    std::uint64_t factor;
};

// Longest suffixes first so that "KiB" is not read as "K" + "iB". Case matters
// only where it must: "k"/"K" both mean KiB, "kB"/"KB" both mean 1000.
constexpr Unit kUnits[] = {
    {"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", GiB * 1024},
    {"kiB", KiB},
    {"KB", 1000}, {"kB", 1000}, {"MB", 1000'000}, {"GB", 1000'000'000ull},
    {"TB", 1000'000'000'000ull},
    {"K", KiB}, {"k", KiB}, {"M", MiB}, {"m", MiB}, {"G", GiB}, {"g", GiB},
    {"T", GiB * 1024}, {"t", GiB * 1024},
    {"B", 1}, {"", 1},
};

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::uint64_t parse_size(std::string_view text) {
    auto bad = [&](const char* why) -> UsageError {
        return UsageError("invalid size '" + std::string(text) + "': " + why +
                          " (examples: 4096, 512k, 1M, 4GiB, 2GB)");
    };
    std::string_view s = text;
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    if (s.empty()) throw bad("empty");
    for (const Unit& u : kUnits) {
        if (!ends_with(s, u.suffix)) continue;
        std::string_view num = s.substr(0, s.size() - u.suffix.size());
        if (num.empty()) continue;
        if (!std::isdigit(static_cast<unsigned char>(num.back())) && num.back() != '.') continue;
        // Whole numbers exactly; a fraction ("1.5G") is allowed when the result
        // is a whole number of bytes.
        if (num.find('.') == std::string_view::npos) {
            std::uint64_t v = 0;
            auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
            if (ec != std::errc() || p != num.data() + num.size()) throw bad("not a number");
            if (v > std::numeric_limits<std::uint64_t>::max() / u.factor) throw bad("too large");
            return v * u.factor;
        }
        // Exact decimal arithmetic: "4.096kB" is 4096 bytes, not 4095.99...
        const std::size_t dot = num.find('.');
        std::string_view whole = num.substr(0, dot), frac = num.substr(dot + 1);
        if (frac.find('.') != std::string_view::npos || frac.size() > 12 || (whole.empty() && frac.empty()))
            throw bad("not a number");
        unsigned __int128 w = 0, f = 0, scale = 1;
        for (char c : whole) {
            if (c < '0' || c > '9') throw bad("not a number");
            w = w * 10 + static_cast<unsigned>(c - '0');
            if (w > UINT64_MAX) throw bad("too large");
        }
        for (char c : frac) {
            if (c < '0' || c > '9') throw bad("not a number");
            f = f * 10 + static_cast<unsigned>(c - '0');
            scale *= 10;
        }
        // w*factor < 2^64 and scale <= 10^12 keep every product under 2^128.
        if (w * u.factor > UINT64_MAX) throw bad("too large");
        const unsigned __int128 num_bytes = w * u.factor * scale + f * u.factor;
        if (num_bytes % scale != 0) throw bad("not a whole number of bytes");
        const unsigned __int128 bytes = num_bytes / scale;
        if (bytes > UINT64_MAX) throw bad("too large");
        return static_cast<std::uint64_t>(bytes);
    }
    throw bad("unknown unit");
}

std::string format_size(std::uint64_t bytes) {
    // Up to TiB, the largest unit parse_size reads: 2^50 is "1024TiB", never "1PiB".
    static constexpr const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    constexpr int top = 4;
    int i = 0;
    std::uint64_t v = bytes;
    while (v >= 1024 && v % 1024 == 0 && i < top) { v /= 1024; ++i; }
    if (v < 1024 || i == top) return std::to_string(v) + names[i];
    // Not an exact multiple: one decimal of the largest unit below the value.
    double d = static_cast<double>(bytes);
    i = 0;
    while (d >= 1024 && i < top) { d /= 1024; ++i; }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%s", d, names[i]);
    return buf;
}

std::chrono::nanoseconds parse_duration(std::string_view text) {
    struct DUnit { std::string_view suffix; double ns; };
    static constexpr DUnit units[] = {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9},
                                      {"m", 60e9}, {"h", 3600e9}, {"", 1e9}};
    for (const DUnit& u : units) {
        if (!ends_with(text, u.suffix)) continue;
        std::string_view num = text.substr(0, text.size() - u.suffix.size());
        if (num.empty()) continue;
        double d = 0;
        auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), d);
        if (ec != std::errc() || p != num.data() + num.size()) continue;
        if (d < 0 || !std::isfinite(d) || d * u.ns >= 9.2e18) break;  // int64 nanoseconds
        return std::chrono::nanoseconds(static_cast<std::int64_t>(d * u.ns));
    }
    throw UsageError("invalid duration '" + std::string(text) +
                     "' (examples: 10s, 500ms, 2m, 1.5)");
}

}  // namespace zinf
