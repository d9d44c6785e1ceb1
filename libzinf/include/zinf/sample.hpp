// zinf sample: text from a trained GPT or Llama, one token at a time, as zinf-sample
// runs it. The Decoder runs the model's forward for one new position with a
// key-value cache (every earlier position's keys and values kept per layer),
// so a token costs one position's forward, not the whole sequence's. It
// reaches the weights only through an Engine's hooks, module by module as the
// training forward does: the resident engine, or the ZeRO-Infinity engine
// fetching each module's partitions from their tier, so a model larger than
// the device (or the host) can be sampled.
//
//   zinf::sample::Decoder dec(gpt, dev, positions);
//   dec.step(dev.compute(), engine, token, logits);   // enqueued; logits (V) on the host
//   dev.synchronize(dev.compute());
//   zinf::sample::Chooser pick(seed);
//   next = pick(logits, {.temperature = 0.8, .top_k = 40});
//
// The cached forward is the training forward's arithmetic, op for op (the
// same kernels; attention through attention_decode, the full forward's row
// at that position): its logits equal a full forward's at every position to
// within rounding of the GEMMs, which the device may block by row count.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/device.hpp>
#include <zinf/model.hpp>
#include <zinf/zero.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::sample {

class Decoder {
public:
    // Buffers for `positions` positions (1 to the model's max_seq), taken
    // from the device's arena now (OutOfMemory naming them). A Llama-family
    // model runs its own blocks' one-position forward (Llama::decode), its
    // grouped-query heads cached once per kv head.
    Decoder(model::LanguageModel& model, device::Device& dev, std::uint64_t positions);
    ~Decoder();
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;

    // The arena bytes a Decoder of `positions` takes (for budgeting the
    // engine beside it): the caches, 2 x layers x (positions, C) fp32 (a
    // Llama's: (positions, kv_heads x head size)), and one position's
    // activations.
    static std::uint64_t device_bytes(const model::Config& c, std::uint64_t positions);

    std::uint64_t vocab() const;      // logits per step
    std::uint64_t positions() const;  // the capacity
    std::uint64_t position() const;   // positions cached so far
    void reset();                     // forget them (the next step is position 0)

    // Enqueues on `s` the forward of `token` at position(), through
    // `engine`'s hooks (inside an engine pass where the engine has them):
    // its keys and values join the cache, and the logits (V) predicting the
    // next token are copied into `logits`, host memory, which must stay
    // alive and untouched until `s` is synchronized. UsageError when the
    // cache is full; a token past the vocabulary is a DataError at the
    // synchronize.
    void step(device::Stream& s, zero::ParamEngine& engine, std::int32_t token, std::span<float> logits);

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// How the next token is drawn from the logits.
struct Choice {
    double temperature = 1.0;  // 0: greedy (the largest logit, the lowest id on a tie)
    std::uint64_t top_k = 0;   // only the k largest logits (0: all)
    std::uint64_t limit = 0;   // only ids below this (a tokenizer's vocabulary; 0: all)
};

// Draws tokens from softmax(logits / temperature), restricted to the top k,
// with a 64-bit Mersenne Twister seeded once: the same seed and logits give
// the same tokens on every machine (the uniform draw is built from the
// generator's bits here, not by the standard library's distributions).
class Chooser {
public:
    explicit Chooser(std::uint64_t seed) : rng_(seed) {}
    // UsageError for a negative or non-finite temperature.
    std::int32_t operator()(std::span<const float> logits, const Choice& c);

private:
    std::mt19937_64 rng_;
};

// llm.c's tokenizer file (gpt2_tokenizer.bin): a header of 256 uint32 (magic
// 20240328, version 1 or 2, vocab_size, and in version 2 the end-of-text
// token), then every token's bytes as a uint8 length and that many bytes.
// Decodes only: it has no merges, so text cannot be encoded with it.
class Tokenizer {
public:
    // MissingInputError when absent; DataError naming the file and the byte
    // offset of what is wrong (magic, version, a length past the end, bytes
    // left over).
    static Tokenizer open(const std::string& path);
    std::uint32_t vocab() const { return static_cast<std::uint32_t>(offsets_.size()); }
    std::optional<std::uint32_t> eot() const { return eot_; }
    // DataError naming the file when its end-of-text token is past the
    // model's vocabulary (it would start or stop the text).
    void check_model(std::uint64_t model_vocab) const;
    // The token's bytes; DataError for an id past the vocabulary.
    std::string_view decode(std::uint32_t token) const;

private:
    std::string path_, bytes_;
    std::vector<std::pair<std::uint32_t, std::uint8_t>> offsets_;  // into bytes_: (offset, length)
    std::optional<std::uint32_t> eot_;
};

inline constexpr std::uint32_t kTokenizerMagic = 20240328;

// A SentencePiece model (tokenizer.model of Llama 2, TinyLlama, Mistral):
// text to ids and ids back to text, through Debian's libsentencepiece when
// the build found it (sentencepiece_available()).
class SentencePiece {
public:
    // MissingInputError when absent; DataError naming the file when it is
    // not a SentencePiece model; UsageError when the build has no
    // SentencePiece (it says so, and how to get it).
    static SentencePiece open(const std::string& path);
    ~SentencePiece();
    SentencePiece(SentencePiece&&) noexcept;
    SentencePiece& operator=(SentencePiece&&) noexcept;

    std::uint32_t vocab() const;
    std::optional<std::int32_t> bos() const;  // <s>, which Llama's tokenizer puts first
    std::optional<std::int32_t> eos() const;  // </s>, which ends a text
    // The text's ids (without bos).
    std::vector<std::int32_t> encode(std::string_view text) const;
    // The text of `ids`, as the tokenizer decodes them ("▁" a space, byte
    // pieces joined into their UTF-8, the leading space of the text dropped).
    std::string decode(std::span<const std::int32_t> ids) const;

private:
    struct Impl;
    explicit SentencePiece(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};
bool sentencepiece_available();

// The text a stream of ids adds as each comes: decode() of all the ids so
// far, less what was already written (a byte piece or a word's start can
// change the text before it only within its own token).
class TextStream {
public:
    explicit TextStream(const SentencePiece& sp) : sp_(sp) {}
    std::string next(std::int32_t id);

private:
    const SentencePiece& sp_;
    std::vector<std::int32_t> ids_;
    std::string written_;
};

// What one engine pass is: the engine the Decoder runs through and the
// brackets around each pass (a run's engine's begin_forward() and end();
// nothing for a bare resident engine).
struct Passes {
    zero::ParamEngine& engine;
    std::function<void()> begin, end, reset;
};

struct GenerateOptions {
    std::uint64_t tokens = 200;          // drawn after the prompt
    Choice choice;
    std::uint64_t seed = 0;
    std::optional<std::int32_t> stop;    // a token that ends the text (the tokenizer's end-of-text)
};

// Feeds `prompt` (at least one token) position by position, then draws up to
// `tokens` tokens, each handed to `emit` as it comes (it may throw to stop).
// Every rank runs the same passes; rank 0 draws and broadcasts each token,
// so every rank feeds the same one and stops together; a rank's failure is
// every rank's (comm::agree). Returns the tokens drawn.
std::uint64_t generate(Decoder& dec, device::Device& dev, const Passes& passes, comm::Communicator& comm,
                       std::span<const std::int32_t> prompt, const GenerateOptions& o,
                       const std::function<void(std::int32_t)>& emit);
// The same through a run's engine (zero::Engine, opened for forward passes:
// EngineOptions::persist_if_fits keeps every parameter on the device when
// they fit beside the decoder, one fetch for the whole text), each pass one
// of its begin_forward() ... end().
std::uint64_t generate(Decoder& dec, device::Device& dev, zero::Engine& engine, comm::Communicator& comm,
                       std::span<const std::int32_t> prompt, const GenerateOptions& o,
                       const std::function<void(std::int32_t)>& emit);

}  // namespace zinf::sample
