// The cached forward (sample.hpp): the model's own one-position forward
// (LanguageModel::decode, each family's modules between the engine's hooks
// with the kernels the training forward uses) on the new position, its
// key-value cache in the family's decode state.
#include <zinf/sample.hpp>

namespace zinf::sample {

struct Decoder::Impl {
    model::LanguageModel& model;
    device::Device& dev;
    std::uint64_t positions = 0, pos = 0;
    std::unique_ptr<model::LanguageModel::DecodeState> state;
    std::vector<std::int32_t> tokens;  // host: each position's token, the copy's source
    device::Array<std::int32_t> token;  // (1)
    device::Array<float> logits;        // (V)
};

std::uint64_t Decoder::device_bytes(const model::LanguageModel& m, std::uint64_t positions) {
    // the model's state, the token and the logits
    return m.decode_bytes(positions) + align_up(4, mem::kArenaAlignment) +
           align_up(m.config().vocab * 4, mem::kArenaAlignment);
}

Decoder::Decoder(model::LanguageModel& m, device::Device& dev, std::uint64_t positions)
    : impl_(std::make_unique<Impl>(Impl{.model = m, .dev = dev, .positions = positions})) {
    impl_->state = m.decode_state(dev, positions);  // refuses positions outside 1..max_seq
    impl_->token = dev.alloc<std::int32_t>(1, "token");
    impl_->logits = dev.alloc<float>(m.config().vocab, "logits");
    impl_->tokens.assign(positions, 0);
}

Decoder::~Decoder() = default;

std::uint64_t Decoder::vocab() const { return impl_->model.config().vocab; }
std::uint64_t Decoder::positions() const { return impl_->positions; }
std::uint64_t Decoder::position() const { return impl_->pos; }
void Decoder::reset() { impl_->pos = 0; }

void Decoder::step(device::Stream& s, zero::ParamEngine& e, std::int32_t tok, std::span<float> logits_host) {
    Impl& I = *impl_;
    const std::uint64_t V = I.model.config().vocab, p = I.pos;
    if (p >= I.positions)
        throw UsageError("the decoder's " + std::to_string(I.positions) + " positions are all used");
    if (logits_host.size() < V) throw InternalError("decoder: the logits need " + std::to_string(V) + " floats");
    I.tokens[p] = tok;
    I.dev.copy(s, std::as_writable_bytes(I.token.span()), std::as_bytes(std::span(I.tokens).subspan(p, 1)));
    model::Context ctx{I.dev, s, e};
    I.model.decode(ctx, *I.state, I.token, p, I.logits);
    I.dev.copy(s, std::as_writable_bytes(logits_host.first(V)), std::as_bytes(I.logits.span()));
    ++I.pos;
}

}  // namespace zinf::sample
