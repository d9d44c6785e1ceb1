// The residual stream through a model's blocks as the activations keep it
// (model.hpp's Shape: checkpointing, offload, the checkpoints' precision):
// the one walk the GPT and the Llama share, forward and backward.
//
// fp32 checkpoints (the reference): block l reads checkpoint l in place and
// writes checkpoint l+1; with checkpointing its backward recomputes into
// checkpoint l+1's buffer. bf16 checkpoints: each checkpoint is made in an
// fp32 buffer (the embedding's and the final norm's input in `widened`, a
// block's output in `dres`, free until backward), rounded into its bf16
// buffer and widened back into `widened`, which the next block reads; in
// backward checkpoint l is widened again into `widened` for block l, and
// the recompute writes its (unused) output into the caller's scratch.
// Offloading, checkpoints 0 .. layers-3 leave the device as they are made
// (bf16: their bf16 bytes) and come back one block ahead of their backward.
#pragma once

#include <zinf/model.hpp>

#include <algorithm>
#include <functional>

namespace zinf::model::checkpoints {

// The checkpoints' buffers for `shape` added to `a`, by plan_on's
// take<E>(count, what) (which allocates, or only counts the bytes).
template <class Take>
void plan(Activations& a, const Shape& shape, std::uint64_t layers, std::uint64_t NC, Take&& take) {
    if (shape.offload != Offload::none && !shape.checkpoint)
        throw UsageError("offloading activation checkpoints needs activation checkpointing (not --checkpoint none)");
    // Offloading, checkpoint j lives in buffer j % 3: blocks l and l+1's
    // inputs and outputs, with one buffer coming back or going out.
    const std::uint64_t n = shape.offload != Offload::none ? std::min<std::uint64_t>(3, layers + 1) : layers + 1;
    const bool bf16 = shape.checkpoints == device::Precision::bf16;
    for (std::uint64_t j = 0; j < n; ++j) {
        if (bf16) a.residual_bf16.push_back(take.template operator()<std::uint16_t>(NC, "checkpoint (bf16)"));
        else a.residual.push_back(take.template operator()<float>(NC, "residual"));
    }
    if (bf16) a.widened = take.template operator()<float>(NC, "checkpoint widened");
}

// A block's kept activation of n values, bf16 or fp32 (Shape::activations),
// by plan_on's take<E>(count, what).
template <class Take>
Kept kept(Take&& take, bool bf16, std::uint64_t n, const char* what) {
    Kept k;
    if (bf16) k.bf16 = take.template operator()<std::uint16_t>(n, what);
    else k.f32 = take.template operator()<float>(n, what);
    return k;
}

// Block l's forward: out (N,C) from in (N,C).
using BlockForward = std::function<void(std::uint64_t l, std::span<float> out, std::span<const float> in)>;
// Block l's backward from its input x; with checkpointing `recompute_out`
// (N,C) is where its forward runs again (empty without).
using BlockBackward =
    std::function<void(std::uint64_t l, std::span<const float> x, std::span<float> recompute_out)>;

// The embedding (`embed` writes checkpoint 0 into the span it is given),
// then every block; returns the last block's output as the final norm reads
// it. With `for_backward` the checkpoints an offloading Shape sends out go
// out (`model` names the caller in the error when the store is missing).
std::span<const float> forward(Context& c, Activations& a, const Config& cfg, bool for_backward, const char* model,
                               const std::function<void(std::span<float>)>& embed, const BlockForward& block);

// The last block's output as the final norm's backward reads it (bf16:
// widened again).
std::span<const float> last(Context& c, Activations& a, const Config& cfg);

// Every block's backward, last to first. `scratch` (N,C) takes a bf16
// walk's recomputed outputs: a buffer the blocks' forward does not use and
// their backward writes only after it (the blocks' d (N,C)).
void backward(Context& c, Activations& a, const Config& cfg, std::span<float> scratch, const BlockBackward& block);

}  // namespace zinf::model::checkpoints
