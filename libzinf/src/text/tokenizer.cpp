// The tokenizer interface's shared parts, the byte-level tokenizer, open()'s
// choice by a file's first bytes, and TextStream.
#include "internal.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace zinf::text {

const char* round_trip_name(RoundTrip r) {
    switch (r) {
    case RoundTrip::bytes: return "bytes";
    case RoundTrip::utf8: return "utf8";
    case RoundTrip::none: return "none";
    }
    return "?";
}

std::optional<Id> Tokenizer::token_id(std::string_view) const { return std::nullopt; }

std::vector<Id> Tokenizer::encode(std::string_view text) const {
    std::vector<Id> ids;
    encoder()->encode(text, text.size(), Part{}, ids);
    return ids;
}

std::string Tokenizer::decode(std::span<const Id> ids) const {
    std::string out;
    decode(ids, Part{}, out);
    return out;
}

void Tokenizer::check_model(std::uint64_t model_vocab) const {
    if (vocab() > model_vocab)
        throw DataError("the tokenizer's vocabulary of " + std::to_string(vocab()) + " ids does not fit the model's " +
                            std::to_string(model_vocab) + ": this tokenizer is not the model's",
                        {0, path_, {}, -1});
}

namespace {

class Bytes final : public Tokenizer {
public:
    Bytes() { path_ = "bytes"; }
    std::string kind() const override { return "bytes (one id per byte)"; }
    std::uint64_t vocab() const override { return 256; }
    RoundTrip round_trip() const override { return RoundTrip::bytes; }
    bool cuts_lines() const override { return true; }
    std::unique_ptr<Encoder> encoder(std::uint64_t, std::shared_ptr<SharedCache>) const override {
        struct E final : Encoder {
            std::size_t encode(std::string_view text, std::size_t end, Part, std::vector<Id>& ids) override {
                for (std::size_t i = 0; i < end; ++i) ids.push_back(static_cast<unsigned char>(text[i]));
                return end;
            }
        };
        return std::make_unique<E>();
    }
    void decode(std::span<const Id> ids, Part, std::string& out) const override {
        for (Id id : ids) {
            if (id > 255)
                throw DataError("token " + std::to_string(id) + " is past the byte-level vocabulary of 256");
            out += static_cast<char>(id);
        }
    }
    std::optional<Id> token_id(std::string_view token) const override {
        if (token.size() == 1) return static_cast<unsigned char>(token[0]);
        return std::nullopt;
    }
};

}  // namespace

std::unique_ptr<Tokenizer> bytes() { return std::make_unique<Bytes>(); }

std::unique_ptr<Tokenizer> open(const std::string& path) {
    if (path == "bytes") return bytes();
    // By its first bytes: llm.c's magic, JSON's brace, else SentencePiece's protobuf.
    const Fd fd = open_input(path, Input::regular);
    char head[64] = {};
    long n;
    do {
        n = sys::pread(fd.get(), head, sizeof head, 0, path);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw_errno("read", errno, path, 0);
    std::uint32_t magic = 0;
    if (n >= 4) std::memcpy(&magic, head, 4);
    if (magic == kLlmcTokenizerMagic) return open_llmc(path);
    for (long i = 0; i < n; ++i) {
        if (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t') continue;
        if (head[i] == '{') return open_hf(path);
        break;
    }
    if (n == 0) throw DataError("not a tokenizer: the file is empty", {0, path, {}, -1});
    return open_sentencepiece(path);
}

std::string TextStream::next(Id id) {
    ids_.push_back(id);
    const std::string all = t_.decode(ids_);
    // A character whose bytes have not all come yet: held back until they
    // have (as raw bytes, or as the U+FFFD a decoder made of them).
    static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    if (utf8_incomplete_tail(all) > 0 || std::string_view(all).ends_with(kReplacement)) return {};
    std::size_t same = 0;  // what was written stays; the text grows past it
    while (same < written_.size() && same < all.size() && written_[same] == all[same]) ++same;
    std::string add = all.substr(same);
    written_ = all;
    return add;
}

}  // namespace zinf::text
