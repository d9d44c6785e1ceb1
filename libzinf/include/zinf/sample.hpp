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
    // from the device's arena now (OutOfMemory naming them): the model's
    // decode state (LanguageModel::decode_state), the token and the logits.
    // Each step runs the model's own one-position forward
    // (LanguageModel::decode), whatever its family.
    Decoder(model::LanguageModel& model, device::Device& dev, std::uint64_t positions);
    ~Decoder();
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;

    // The arena bytes a Decoder of `positions` takes (for budgeting the
    // engine beside it): the model's decode state (LanguageModel::
    // decode_bytes: the caches, 2 x layers x (positions, C) fp32 for a GPT,
    // (positions, kv_heads x head size) for a Llama, and one position's
    // activations), the token and the logits.
    static std::uint64_t device_bytes(const model::LanguageModel& model, std::uint64_t positions);

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
