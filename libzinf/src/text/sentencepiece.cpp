// SentencePiece tokenizers (sample.hpp) through Debian's libsentencepiece,
// when the build found its header (ZINF_HAVE_SENTENCEPIECE); without it,
// open() says how to get it.
#include <zinf/sample.hpp>

#if ZINF_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include <cerrno>
#include <filesystem>

namespace zinf::sample {

#if ZINF_HAVE_SENTENCEPIECE
struct SentencePiece::Impl {
    sentencepiece::SentencePieceProcessor sp;
    std::string path;
};
bool sentencepiece_available() { return true; }
#else
struct SentencePiece::Impl {};
bool sentencepiece_available() { return false; }
#endif

SentencePiece::SentencePiece(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePiece::~SentencePiece() = default;
SentencePiece::SentencePiece(SentencePiece&&) noexcept = default;
SentencePiece& SentencePiece::operator=(SentencePiece&&) noexcept = default;

SentencePiece SentencePiece::open(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw MissingInputError("no such tokenizer", {ENOENT, path, {}, -1});
#if ZINF_HAVE_SENTENCEPIECE
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    // Read through zinf: a FIFO is refused at once (libsentencepiece's own
    // open would wait for a writer, deaf to signals), and a model is at most
    // 1 GiB (Llama 2's is 500 KiB).
    const auto status = impl->sp.LoadFromSerializedProto(read_regular(path, GiB, "a SentencePiece model"));
    if (!status.ok())
        throw DataError("not a SentencePiece model, nor llm.c's tokenizer file (magic " +
                            std::to_string(kTokenizerMagic) + "): " + status.ToString(),
                        {0, path, {}, -1});
    return SentencePiece(std::move(impl));
#else
    throw UsageError(path + ": a SentencePiece model, but this build has no SentencePiece (install Debian's "
                     "libsentencepiece-dev, make deps does, and rebuild)");
#endif
}

#if ZINF_HAVE_SENTENCEPIECE
std::uint32_t SentencePiece::vocab() const { return static_cast<std::uint32_t>(impl_->sp.GetPieceSize()); }
std::optional<std::int32_t> SentencePiece::bos() const {
    const int id = impl_->sp.bos_id();
    return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}
std::optional<std::int32_t> SentencePiece::eos() const {
    const int id = impl_->sp.eos_id();
    return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}
std::vector<std::int32_t> SentencePiece::encode(std::string_view text) const {
    std::vector<int> ids;
    const auto status = impl_->sp.Encode(text, &ids);
    if (!status.ok()) throw DataError("SentencePiece could not encode the text: " + status.ToString(), {0, impl_->path, {}, -1});
    return {ids.begin(), ids.end()};
}
std::string SentencePiece::decode(std::span<const std::int32_t> ids) const {
    const std::vector<int> v(ids.begin(), ids.end());
    for (int id : v)
        if (id < 0 || id >= impl_->sp.GetPieceSize())
            throw DataError("token " + std::to_string(id) + " is not below the tokenizer's vocabulary " +
                                std::to_string(impl_->sp.GetPieceSize()),
                            {0, impl_->path, {}, -1});
    std::string text;
    const auto status = impl_->sp.Decode(v, &text);
    if (!status.ok()) throw DataError("SentencePiece could not decode: " + status.ToString(), {0, impl_->path, {}, -1});
    return text;
}
#else
std::uint32_t SentencePiece::vocab() const { return 0; }
std::optional<std::int32_t> SentencePiece::bos() const { return std::nullopt; }
std::optional<std::int32_t> SentencePiece::eos() const { return std::nullopt; }
std::vector<std::int32_t> SentencePiece::encode(std::string_view) const { return {}; }
std::string SentencePiece::decode(std::span<const std::int32_t>) const { return {}; }
#endif

std::string TextStream::next(std::int32_t id) {
    ids_.push_back(id);
    const std::string all = sp_.decode(ids_);
    // A character whose bytes have not all come yet decodes as U+FFFD:
    // held back until they have.
    static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    if (all.size() >= kReplacement.size() && all.compare(all.size() - kReplacement.size(), kReplacement.size(),
                                                         kReplacement) == 0)
        return {};
    std::size_t same = 0;  // what was written stays; the text grows past it
    while (same < written_.size() && same < all.size() && written_[same] == all[same]) ++same;
    std::string add = all.substr(same);
    written_ = all;
    return add;
}

}  // namespace zinf::sample
