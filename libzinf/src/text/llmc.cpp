// llm.c's tokenizer file (gpt2_tokenizer.bin): a header of 256 uint32 (magic
// 20240328, version 1 or 2, vocab_size, and in version 2 the end-of-text
// token), then every token's bytes as a uint8 length and that many bytes.
// Read whole and checked against its size: every length must fit, and
// nothing may be left after the last token. It decodes only: it has no
// merges, so text cannot be encoded with it.
#include "internal.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <sys/stat.h>

namespace zinf::text {

static_assert(std::endian::native == std::endian::little, "tokenizer files are little-endian");

namespace {

constexpr std::uint64_t kHeaderWords = 256, kHeaderBytes = kHeaderWords * 4;

class Llmc final : public Tokenizer {
public:
    static std::unique_ptr<Llmc> open(const std::string& path);
    std::string kind() const override {
        return "llm.c tokenizer file (" + std::to_string(offsets_.size()) + " tokens; decodes only)";
    }
    std::uint64_t vocab() const override { return offsets_.size(); }
    bool can_encode() const override { return false; }
    RoundTrip round_trip() const override { return RoundTrip::none; }
    std::unique_ptr<Encoder> encoder(std::uint64_t, std::shared_ptr<SharedCache>) const override {
        throw UsageError(path_ + " is llm.c's tokenizer file: it has no merges, so it decodes tokens but cannot "
                                 "encode text; give the model's tokenizer.json");
    }
    void decode(std::span<const Id> ids, Part, std::string& out) const override {
        for (Id id : ids) {
            if (id >= offsets_.size())
                throw DataError("token " + std::to_string(id) + " is past the vocabulary of " +
                                    std::to_string(offsets_.size()),
                                {0, path_, {}, -1});
            const auto [off, len] = offsets_[id];
            out.append(bytes_, off, len);
        }
    }
    std::optional<Id> end_of_text() const override { return eot_; }
    std::optional<Id> token_id(std::string_view token) const override {
        for (std::size_t id = 0; id < offsets_.size(); ++id)
            if (std::string_view(bytes_).substr(offsets_[id].first, offsets_[id].second) == token)
                return static_cast<Id>(id);
        return std::nullopt;
    }

private:
    std::string bytes_;
    std::vector<std::pair<std::uint32_t, std::uint8_t>> offsets_;  // into bytes_: (offset, length)
    std::optional<Id> eot_;
};

std::unique_ptr<Llmc> Llmc::open(const std::string& path) {
    auto t = std::make_unique<Llmc>();
    t->path_ = path;
    // Never blocks in open(2): a FIFO (or a folder) is refused at once (65).
    t->bytes_ = read_regular(path, kMaxTokenizerBytes, "an llm.c tokenizer file");
    const std::uint64_t size = t->bytes_.size();
    auto bad = [&](const std::string& what, std::uint64_t at) { return DataError(what, {0, path, at, -1}); };
    if (size < kHeaderBytes)
        throw bad("file is " + std::to_string(size) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                      "-byte header of an llm.c tokenizer file",
                  0);
    std::uint32_t h[4];
    std::memcpy(h, t->bytes_.data(), sizeof h);
    if (h[0] != kLlmcTokenizerMagic)
        throw bad("magic " + std::to_string(h[0]) + " is not an llm.c tokenizer file's " +
                      std::to_string(kLlmcTokenizerMagic),
                  0);
    if (h[1] != 1 && h[1] != 2) throw bad("tokenizer version " + std::to_string(h[1]) + " is not 1 or 2", 4);
    if (h[2] == 0) throw bad("the vocabulary size is 0", 8);
    if (h[1] == 2) {
        if (h[3] >= h[2])
            throw bad("the end-of-text token " + std::to_string(h[3]) + " is past the vocabulary of " +
                          std::to_string(h[2]),
                      12);
        t->eot_ = h[3];
    }
    // Every token takes a byte at least: a vocabulary the file cannot hold
    // is refused before room is made for it (0xFFFFFFFF tokens would have
    // asked for 32 GiB, and been "out of memory").
    if (h[2] > size - kHeaderBytes)
        throw bad("the vocabulary size " + std::to_string(h[2]) + " does not fit the file's " + std::to_string(size) +
                      " bytes",
                  8);
    std::uint64_t at = kHeaderBytes;
    t->offsets_.reserve(h[2]);
    for (std::uint32_t i = 0; i < h[2]; ++i) {
        if (at >= size)
            throw bad("the file ends after " + std::to_string(i) + " of its " + std::to_string(h[2]) + " tokens", at);
        const auto len = static_cast<std::uint8_t>(t->bytes_[at]);
        if (len == 0) throw bad("token " + std::to_string(i) + " has length 0", at);
        if (at + 1 + len > size)
            throw bad("token " + std::to_string(i) + " of " + std::to_string(len) + " bytes runs past the end", at);
        t->offsets_.emplace_back(static_cast<std::uint32_t>(at + 1), len);
        at += 1 + len;
    }
    if (at != size)
        throw bad(std::to_string(size - at) + " bytes follow the last of the " + std::to_string(h[2]) + " tokens", at);
    return t;
}

}  // namespace

std::unique_ptr<Tokenizer> open_llmc(const std::string& path) { return Llmc::open(path); }

}  // namespace zinf::text
