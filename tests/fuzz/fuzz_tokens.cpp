// The llm.c token file (data loader): any bytes as a token file, opened by
// name as zinf-train opens --data. Bad input is a DataError (65); a file it
// accepts has exactly the tokens its header counts, and the loader cuts
// batches from them whose targets are the inputs one token later.
#include "fuzz.hpp"

#include <zinf/data.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

using namespace zinf;

ZINF_FUZZ_TARGET(tokens) {
    const auto& file = fuzz::MemFile::with(data, size);
    data::Tokens toks;
    if (!fuzz::documented<DataError>([&] { toks = data::Tokens::open(file.path()); })) return 0;
    fuzz::accepted();

    const auto t = toks.tokens();
    std::int32_t count = 0;
    std::memcpy(&count, data + 8, sizeof count);
    const std::size_t width = t.wide() ? 4 : 2;  // version 2 files hold uint32 tokens
    if (t.size() != static_cast<std::size_t>(count) || size != data::kHeaderBytes + width * t.size())
        fuzz::finding("accepted a file of " + std::to_string(size) + " bytes holding " + std::to_string(t.size()) +
                      " tokens, its header says " + std::to_string(count));
    // (read, as the loader reads them: the file is not mapped)
    std::vector<std::uint32_t> all(t.size());
    t.read(0, all);
    for (std::size_t i = 0; i < all.size(); ++i) {
        std::uint32_t v = 0;
        std::memcpy(&v, data + data::kHeaderBytes + width * i, width);
        if (all[i] != v) {
            fuzz::finding("the tokens are not the file's bytes after the header");
            break;
        }
    }
    if (toks.max_token() != *std::max_element(all.begin(), all.end())) fuzz::finding("max_token is not the largest");
    fuzz::documented<DataError>([&] { data::check_vocab(toks, 50257); });

    const auto parts = data::split(t, 0.25);
    const data::TokenSpan train = parts.first;  // a lambda below uses it: no structured binding (clang 14)
    if (train.size() + parts.second.size() != t.size()) fuzz::finding("the split loses tokens");
    // One window of B*T = 2*3 tokens, on two ranks.
    for (unsigned rank = 0; rank < 2; ++rank) {
        std::optional<data::Loader> loader;
        if (!fuzz::documented<DataError>([&] {
                loader.emplace(train, toks.path(), data::LoaderOptions{.batch = 2, .seq = 3, .rank = rank, .ranks = 2});
            }))
            return 0;
        std::vector<std::int32_t> x(6), y(6);
        for (std::uint64_t i = 0; i < 3; ++i) {
            loader->batch(i, x, y);
            const std::uint64_t at = loader->offset(i);
            if (at + 7 > train.size()) fuzz::finding("batch " + std::to_string(i) + " reads past the tokens");
            for (std::size_t k = 0; k < 6; ++k)
                if (std::uint32_t(x[k]) != train[at + k] || std::uint32_t(y[k]) != train[at + k + 1])
                    fuzz::finding("batch " + std::to_string(i) + " is not the tokens at its offset");
        }
    }
    return 0;
}
