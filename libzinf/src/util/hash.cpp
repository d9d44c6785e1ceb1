#include <zinf/util.hpp>

#include <charconv>
#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace zinf {

std::uint64_t xxh3(std::span<const std::byte> data, std::uint64_t seed) {
    return XXH3_64bits_withSeed(data.data(), data.size(), seed);
}

std::string hex64(std::uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

std::uint64_t parse_hex64(std::string_view text) {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
    if (text.size() != 16 || ec != std::errc() || p != text.data() + text.size())
        throw DataError("invalid xxh3 digest '" + std::string(text) + "' (want 16 hex digits)");
    return v;
}

Xxh3Stream::Xxh3Stream(std::uint64_t seed) : state_(XXH3_createState()) {
    if (!state_) throw InternalError("XXH3_createState failed");
    XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::update(std::span<const std::byte> data) {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
}

std::uint64_t Xxh3Stream::digest() const {
    return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace zinf
