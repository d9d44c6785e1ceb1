// Span checks Device's public kernels make (checks.cpp), for every backend,
// on the caller's thread before the backend enqueues the kernel: a span
// shorter than its shape needs is a bug (InternalError at once, naming the
// kernel, its dimensions and the span).
#pragma once

#include <zinf/util.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace zinf::device {

// A kernel's name and shape, for the InternalError a short span gets.
class Shape {
public:
    Shape(const char* kernel, std::initializer_list<std::pair<const char*, std::uint64_t>> dims) : kernel_(kernel) {
        for (const auto& d : dims)
            if (n_ < dims_.size()) dims_[n_++] = d;
    }
    void need(const char* span, std::size_t have, std::uint64_t want) const {
        if (have < want) short_span(span, have, want);
    }
    [[noreturn, gnu::noinline, gnu::cold]] void short_span(const char* span, std::size_t have, std::uint64_t want) const {
        std::string what = span;
        what.append(" has ").append(std::to_string(have)).append(" elements, the shape needs ");
        fail(what.append(std::to_string(want)));
    }
    [[noreturn, gnu::noinline, gnu::cold]] void fail(const std::string& what) const {
        std::string msg = "device: ";
        msg.append(kernel_);
        for (std::size_t i = 0; i < n_; ++i)
            msg.append(i ? ", " : " (").append(dims_[i].first).append("=").append(std::to_string(dims_[i].second));
        throw InternalError(msg.append(n_ ? "): " : ": ").append(what));
    }

private:
    const char* kernel_;
    std::array<std::pair<const char*, std::uint64_t>, 6> dims_{};
    std::size_t n_ = 0;
};

// Attention's heads split C evenly.
inline void check_heads(const Shape& sh, std::uint64_t C, std::uint64_t NH) {
    if (NH == 0 || C % NH != 0) sh.fail("C is not a multiple of NH");
}

// Grouped-query attention: every kv head serves the same number of query heads.
inline void check_groups(const Shape& sh, std::uint64_t NH, std::uint64_t KVH, std::uint64_t hd) {
    if (NH == 0 || KVH == 0 || hd == 0 || NH % KVH != 0) sh.fail("NH is not a positive multiple of KVH, or hd is 0");
}

// Rotary embeddings pair the two halves of a head.
inline void check_rope(const Shape& sh, std::uint64_t hd) {
    if (hd == 0 || hd % 2 != 0) sh.fail("hd is not a positive even number");
}

}  // namespace zinf::device
