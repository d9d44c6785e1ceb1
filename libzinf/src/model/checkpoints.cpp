// The residual stream through the blocks (checkpoints.hpp).
#include "checkpoints.hpp"

namespace zinf::model::checkpoints {

namespace {

bool is_bf16(const Activations& a) { return !a.residual_bf16.empty(); }

std::span<std::uint16_t> bf16_of(const Activations& a, std::uint64_t j) {
    return a.residual_bf16[j % a.residual_bf16.size()];
}

// Checkpoint j's device bytes, as the store moves them.
std::span<std::byte> bytes_of(const Activations& a, std::uint64_t j) {
    return is_bf16(a) ? std::as_writable_bytes(bf16_of(a, j)) : std::as_writable_bytes(a.res(j));
}

// The checkpoints that leave the device in this pass.
std::uint64_t sent(const Activations& a, const Config& cfg) {
    return a.shape.offload != Offload::none ? offloaded_checkpoints(cfg) : 0;
}

}  // namespace

std::span<const float> forward(Context& c, Activations& a, const Config& cfg, bool for_backward, const char* model,
                               const std::function<void(std::span<float>)>& embed, const BlockForward& block) {
    const std::uint64_t L = cfg.layers;
    const bool bf16 = is_bf16(a);
    // Checkpoints 0 .. L-3 leave the device as soon as they are made (the
    // last ones stay: backward starts with them); checkpoint l+1 takes the
    // buffer of checkpoint l-2, once that is out.
    const bool offload = for_backward && a.shape.offload != Offload::none;
    const std::uint64_t out = offload ? offloaded_checkpoints(cfg) : 0;
    if (offload && (!a.store || a.store->kind() != a.shape.offload))
        throw InternalError(std::string(model) + "::forward: activations planned for offload without their store");
    // Checkpoint j, made in `made`: bf16 rounds it into its buffer and
    // widens it back for the next reader; then out it goes.
    auto keep = [&](std::uint64_t j, std::span<float> made) {
        if (bf16) {
            c.dev.cast(c.stream, bf16_of(a, j), made);
            c.dev.cast(c.stream, a.widened.span(), bf16_of(a, j));
        }
        if (j < out) a.store->save(c.dev, c.stream, j, bytes_of(a, j));
    };
    const std::span<float> first = bf16 ? a.widened.span() : a.res(0);
    embed(first);
    keep(0, first);
    for (std::uint64_t l = 0; l < L; ++l) {
        if (l >= 2 && l - 2 < out) a.store->wait_saved(c.dev, c.stream, l - 2);
        const std::span<float> made = bf16 ? a.dres.span() : a.res(l + 1);
        block(l, made, bf16 ? a.widened.span() : a.res(l));
        keep(l + 1, made);
    }
    return bf16 ? a.widened.span() : a.res(L);
}

std::span<const float> last(Context& c, Activations& a, const Config& cfg) {
    if (!is_bf16(a)) return a.res(cfg.layers);
    c.dev.cast(c.stream, a.widened.span(), bf16_of(a, cfg.layers));
    return a.widened.span();
}

void backward(Context& c, Activations& a, const Config& cfg, std::span<float> scratch, const BlockBackward& block) {
    const bool bf16 = is_bf16(a);
    // Block l's backward uses checkpoints l (its input) and l+1 (the
    // recomputed output, fp32); offloaded checkpoint l-1 comes back into
    // the third buffer meanwhile (checkpoint l+2's, done with since block
    // l+1's).
    const std::uint64_t out = sent(a, cfg);
    for (std::uint64_t l = cfg.layers; l-- > 0;) {
        if (l < out) a.store->wait_loaded(c.dev, c.stream, l);
        if (l >= 1 && l - 1 < out) a.store->load(c.dev, c.stream, l - 1, bytes_of(a, l - 1));
        if (bf16) c.dev.cast(c.stream, a.widened.span(), bf16_of(a, l));
        const std::span<const float> x = bf16 ? a.widened.span() : a.res(l);
        block(l, x, !a.shape.checkpoint ? std::span<float>{} : bf16 ? scratch : a.res(l + 1));
    }
}

}  // namespace zinf::model::checkpoints
