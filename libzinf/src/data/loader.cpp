// Batches by index: llm.c's DataLoader order (rank r's window follows rank
// r-1's, global batch after global batch), or Philox-drawn offsets, with no
// state between calls.
#include <zinf/data.hpp>

#include <Random123/philox.h>

#include <limits>

namespace zinf::data {

namespace {

// Uniform in [0, range) from (seed, index, rank): Philox4x32-10 keyed by the
// seed, counter (index, rank, attempt); Lemire's multiply-shift with rejection
// of the few values that would bias it, so the draw is exactly uniform.
std::uint64_t draw(std::uint64_t seed, std::uint64_t index, unsigned rank, std::uint64_t range) {
    const r123::Philox4x32::key_type key = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
    const std::uint64_t reject_below = (0 - range) % range;  // 2^64 mod range
    for (std::uint32_t attempt = 0;; ++attempt) {
        const r123::Philox4x32::ctr_type ctr = {
            {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), rank, attempt}};
        const auto r = r123::Philox4x32{}(ctr, key);
        for (int half = 0; half < 2; ++half) {
            const std::uint64_t x = std::uint64_t{r.v[2 * half]} | std::uint64_t{r.v[2 * half + 1]} << 32;
            const auto m = static_cast<unsigned __int128>(x) * range;
            if (static_cast<std::uint64_t>(m) >= reject_below) return static_cast<std::uint64_t>(m >> 64);
        }
    }
}

}  // namespace

Loader::Loader(TokenSpan tokens, std::string source, LoaderOptions opts)
    : tokens_(tokens), source_(std::move(source)), opts_(opts) {
    if (opts_.batch == 0 || opts_.seq == 0)
        throw UsageError("batch " + std::to_string(opts_.batch) + " and sequence length " + std::to_string(opts_.seq) +
                         " must both be at least 1");
    if (opts_.ranks == 0 || opts_.rank >= opts_.ranks)
        throw InternalError("loader for rank " + std::to_string(opts_.rank) + " of " + std::to_string(opts_.ranks) +
                            " ranks");
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    if (opts_.seq > kMax / opts_.batch || opts_.batch * opts_.seq > (kMax - 1) / opts_.ranks)
        throw UsageError("batch " + std::to_string(opts_.batch) + " * sequence length " + std::to_string(opts_.seq) +
                         " * " + std::to_string(opts_.ranks) + " ranks overflows");
    bt_ = opts_.batch * opts_.seq;
    const std::uint64_t global = opts_.ranks * bt_;
    const std::uint64_t n = tokens_.size();
    windows_ = n > 0 ? (n - 1) / global : 0;
    if (windows_ == 0)
        throw DataError(std::to_string(n) + " tokens, fewer than one global batch needs (" +
                            std::to_string(opts_.ranks) + " ranks * batch " + std::to_string(opts_.batch) +
                            " * seq " + std::to_string(opts_.seq) + " + 1 = " + std::to_string(global + 1) + ")",
                        {0, source_, {}, -1});
}

std::uint64_t Loader::offset(std::uint64_t index) const {
    if (opts_.shuffle) return draw(opts_.seed, index, opts_.rank, tokens_.size() - bt_);
    return (opts_.rank + (index % windows_) * opts_.ranks) * bt_;
}

void Loader::batch(std::uint64_t index, std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const {
    if (inputs.size() != bt_ || targets.size() != bt_)
        throw InternalError("batch spans of " + std::to_string(inputs.size()) + " inputs and " +
                            std::to_string(targets.size()) + " targets, not batch * seq = " + std::to_string(bt_));
    // The window read at once (a file's: one pread, checked), then cut.
    std::vector<std::uint32_t> w(bt_ + 1);
    tokens_.read(offset(index), w);
    for (std::uint64_t i = 0; i < bt_; ++i) {
        inputs[i] = static_cast<std::int32_t>(w[i]);
        targets[i] = static_cast<std::int32_t>(w[i + 1]);
    }
}

}  // namespace zinf::data
