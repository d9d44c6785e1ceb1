// SentencePiece models (tokenizer.model of Llama 2, TinyLlama, Mistral)
// through Debian's libsentencepiece, when the build found its header
// (ZINF_HAVE_SENTENCEPIECE); without it, open() says how to get it.
#include "internal.hpp"

#if ZINF_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace zinf::text {

#if ZINF_HAVE_SENTENCEPIECE
bool sentencepiece_available() { return true; }

namespace {

class SentencePiece final : public Tokenizer {
public:
    explicit SentencePiece(const std::string& path) {
        path_ = path;
        // Read through zinf: a FIFO is refused at once (libsentencepiece's own
        // open would wait for a writer, deaf to signals).
        const auto status = sp_.LoadFromSerializedProto(read_regular(path, kMaxTokenizerBytes, "a SentencePiece model"));
        if (!status.ok())
            throw DataError("not a tokenizer: not a Hugging Face tokenizer.json (JSON), nor llm.c's tokenizer file "
                            "(magic " + std::to_string(kLlmcTokenizerMagic) + "), nor a SentencePiece model (" +
                                status.ToString() + ")",
                            {0, path, {}, -1});
    }
    std::string kind() const override {
        return "SentencePiece model (" + std::to_string(sp_.GetPieceSize()) + " pieces)";
    }
    std::uint64_t vocab() const override { return static_cast<std::uint64_t>(sp_.GetPieceSize()); }
    // Its normalization (NFKC, spaces) and the dummy prefix before a text's
    // first word: not the same bytes back.
    RoundTrip round_trip() const override { return RoundTrip::none; }
    std::unique_ptr<Encoder> encoder(std::uint64_t, std::shared_ptr<SharedCache>) const override;
    void decode(std::span<const Id> ids, Part part, std::string& out) const override {
        std::vector<int> v;
        v.reserve(ids.size() + 1);
        // A part after the first keeps its leading space: decoded after the
        // piece before it, whose space the library would drop.
        const bool prefix = !part.starts && !ids.empty();
        for (Id id : ids) {
            if (id >= vocab())
                throw DataError("token " + std::to_string(id) + " is past the vocabulary of " + std::to_string(vocab()),
                                {0, path_, {}, -1});
            v.push_back(static_cast<int>(id));
        }
        std::string text;
        const auto status = sp_.Decode(v, &text);
        if (!status.ok()) throw DataError("SentencePiece could not decode: " + status.ToString(), {0, path_, {}, -1});
        if (prefix && sp_.IdToPiece(v[0]).starts_with("\xE2\x96\x81")) out += ' ';
        out += text;
    }
    std::optional<Id> end_of_text() const override { return id_of(sp_.eos_id()); }
    std::vector<Id> begin_ids() const override {
        if (const auto b = id_of(sp_.bos_id())) return {*b};
        return {};
    }
    std::optional<Id> token_id(std::string_view token) const override {
        const int id = sp_.PieceToId(token);
        if (id < 0 || sp_.IdToPiece(id) != token) return std::nullopt;
        return static_cast<Id>(id);
    }
    const sentencepiece::SentencePieceProcessor& processor() const { return sp_; }

private:
    static std::optional<Id> id_of(int id) { return id >= 0 ? std::optional<Id>(static_cast<Id>(id)) : std::nullopt; }
    sentencepiece::SentencePieceProcessor sp_;
};

// The library's Encode is const: one processor serves every thread.
class SentencePieceEncoder final : public Encoder {
public:
    explicit SentencePieceEncoder(const SentencePiece& t) : t_(t) {}
    std::size_t encode(std::string_view text, std::size_t end, Part part, std::vector<Id>& ids) override {
        if (!part.ends) throw InternalError("a part of a document for SentencePiece, which cannot cut one");
        std::vector<int> v;
        const auto status = t_.processor().Encode(text.substr(0, end), &v);
        if (!status.ok())
            throw DataError("SentencePiece could not encode the text: " + status.ToString(), {0, t_.path(), {}, -1});
        for (int id : v) ids.push_back(static_cast<Id>(id));
        return end;
    }

private:
    const SentencePiece& t_;
};

std::unique_ptr<Encoder> SentencePiece::encoder(std::uint64_t, std::shared_ptr<SharedCache>) const { return std::make_unique<SentencePieceEncoder>(*this); }

}  // namespace

std::unique_ptr<Tokenizer> open_sentencepiece(const std::string& path) { return std::make_unique<SentencePiece>(path); }

#else
bool sentencepiece_available() { return false; }

std::unique_ptr<Tokenizer> open_sentencepiece(const std::string& path) {
    throw UsageError(path + ": not a tokenizer.json nor llm.c's tokenizer file, so a SentencePiece model, but this "
                            "build has no SentencePiece (install Debian's libsentencepiece-dev, make deps does, and "
                            "rebuild)");
}
#endif

}  // namespace zinf::text
