// zinf gpt: GPT-2's family as modules declared to the model's engine
// (model.hpp): a learned position table, LayerNorm, fused q/k/v multi-head
// attention, a GELU MLP, every linear layer with a bias, the output head tied
// to the token embedding.
//
//   zinf::model::GPT gpt(zinf::model::Config::from(spec, tile));
//   zinf::model::ResidentEngine engine(dev, numels(gpt.params_table()));  // every parameter on the device
//   auto acts = gpt.plan(dev, {.batch = 4, .seq = 64});      // all buffers, once
//   zinf::model::Context ctx{dev, dev.compute(), engine};
//   // copy the tokens into acts.inputs and the next tokens into acts.targets
//   gpt.forward(ctx, acts);                                   // losses in acts.losses
//   gpt.backward(ctx, acts);                                  // gradients through engine.grad()
//
// Parameter names, shapes and order are exactly zinf-shard's (shard::tensors):
// wte.weight (V,C), wpe.weight (maxT,C), h.<l>.ln_1.weight (C), ... ln_f.bias,
// with linear weights (in, out) as GPT-2's Conv1D (model.hpp's Linear,
// Layout::in_out) and, with a tile factor, split by output columns into
// "<name>.tile<k>".
#pragma once

#include <zinf/model.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zinf::model {

class LayerNorm : public Module {
public:
    LayerNorm(ParamTable& t, const std::string& name, std::uint64_t C);
    // out (N,C), mean (N), rstd (N) from inp (N,C).
    void forward(Context& c, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                 std::span<const float> inp, std::uint64_t N);
    // res (N,C) += add, then out, mean, rstd from res, in one pass over the
    // rows (residual_layernorm_forward); kept (empty, or bf16 (N,C)): res
    // rounded into it and widened back first (Kept::keep_widened).
    void forward_residual(Context& c, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                          std::span<float> res, std::span<const float> add, const device::View& kept, std::uint64_t N);
    // dinp (N,C) +=; inp as kept (fp32, or bf16: a block's inner residual, Kept).
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                  std::span<const float> mean, std::span<const float> rstd, std::uint64_t N);

private:
    std::uint64_t C_;
    std::size_t w_ = 0, b_ = 0;
};

// wte (V,C) and wpe (maxT,C): out (B,T,C) = wte[token] + wpe[t].
class Embedding : public Module {
public:
    Embedding(ParamTable& t, const Config& cfg);
    void forward(Context& c, std::span<float> out, std::span<const std::int32_t> tokens, std::uint64_t B,
                 std::uint64_t T);
    void backward(Context& c, std::span<const float> dout, std::span<const std::int32_t> tokens, std::uint64_t B,
                  std::uint64_t T);
    std::size_t wte() const { return wte_; }
    // Forward of B rows of T tokens from position `first` on (the sampler's
    // one row at its position): wpe's rows first..first+T-1.
    void forward(Context& c, std::span<float> out, std::span<const std::int32_t> tokens, std::uint64_t B,
                 std::uint64_t T, std::uint64_t first);

private:
    Config cfg_;
    std::size_t wte_ = 0, wpe_ = 0;
};

// What the GPT's one-position forward keeps (LanguageModel::decode): the
// key-value cache and one position's buffers.
struct GPTDecodeState : LanguageModel::DecodeState {
    std::uint64_t positions = 0;
    std::vector<device::Array<float>> k, v;             // per layer, (positions, C) each
    device::Array<float> x, out, res2, ln, mean, rstd;  // (C), (C), (C), (C), (1), (1)
    device::Array<float> qkv, atty, att;                // (3C), (C), (NH, positions)
    device::Array<float> fch, fch_gelu;                 // (4C), (4C)
};

// A block's activations for one (B,T): what its backward needs. The Kept
// ones are what its GEMMs, GELU and attention's backward read: bf16 under
// Shape::activations.
struct BlockActivations {
    Kept ln1;                                      // (N,C)
    device::Array<float> ln1_mean, ln1_rstd;       // (N), (N)
    Kept qkv;                                      // (N,3C)
    Kept att;                                      // (B,NH,T,T) the softmax; flash: (B,NH,T) lse, fp32
    bool flash = false;                            // Shape::attention flash
    Kept atty;                                     // (N,C)
    Kept res2;                                     // (N,C) the residual after attention
    Kept ln2;                                      // (N,C)
    device::Array<float> ln2_mean, ln2_rstd;       // (N), (N)
    Kept fch, fch_gelu;                            // (N,4C)
};

// The backward's scratch, shared by all blocks. dbt4c, dqkv (q/k/v, then
// the inner residual) and datt (the softmax) are also the forward's fp32
// staging of the activations a block keeps bf16 (Kept::made): the backward
// writes them only after its block's forward (or recompute) is done.
struct BlockScratch {
    device::Array<float> dbtc;    // (N,C)
    device::Array<float> dqkv;    // (N,3C)
    device::Array<float> datt;    // (B,NH,T,T); flash: (B,NH,T), its backward's delta
    device::Array<float> dbt4c;   // (N,4C)
};

class CausalSelfAttention : public Module {
public:
    CausalSelfAttention(ParamTable& t, const std::string& name, const Config& cfg);
    // out (N,C) = c_proj(attention(c_attn(inp))), keeping qkv, att and atty in `a`.
    void forward(Context& c, std::span<float> out, const device::ConstView& inp, BlockActivations& a,
                 BlockScratch& s, std::uint64_t B, std::uint64_t T);
    // dinp (N,C) written.
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                  BlockActivations& a, BlockScratch& s, std::uint64_t B, std::uint64_t T);
    // Position `pos` alone (x (C)): its key and value join the layer's cache
    // (k, v (positions, C)), then it attends to positions 0..pos; out (C).
    void decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st, std::span<float> k,
                std::span<float> v, std::uint64_t pos);

private:
    Config cfg_;
    std::unique_ptr<Linear> c_attn_, c_proj_;
};

class MLP : public Module {
public:
    MLP(ParamTable& t, const std::string& name, const Config& cfg);
    void forward(Context& c, std::span<float> out, const device::ConstView& inp, BlockActivations& a,
                 BlockScratch& s, std::uint64_t N);
    // dinp (N,C) written.
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                  BlockActivations& a, BlockScratch& s, std::uint64_t N);
    // One position: out (C) from x (C), through st's fch and fch_gelu.
    void decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st);

private:
    Config cfg_;
    std::unique_ptr<Linear> c_fc_, c_proj_;
};

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public Module {
public:
    Block(ParamTable& t, std::uint64_t layer, const Config& cfg);
    // out (N,C) from inp (N,C); s.dbt4c stages what `a` keeps bf16.
    void forward(Context& c, std::span<float> out, std::span<const float> inp, BlockActivations& a,
                 BlockScratch& s, std::uint64_t B, std::uint64_t T);
    // dres (N,C): the gradient of the block's output in, of its input out
    // (in place, as the residual stream carries it). With activation
    // checkpointing `recompute_out` (N,C) is given: the forward runs again
    // first, filling `a` (and writing the output there).
    void backward(Context& c, std::span<float> dres, std::span<const float> inp, BlockActivations& a,
                  BlockScratch& s, std::uint64_t B, std::uint64_t T, std::span<float> recompute_out = {});
    // One position through the block with the layer's cache (k, v).
    void decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st, std::span<float> k,
                std::span<float> v, std::uint64_t pos);

private:
    Config cfg_;
    std::unique_ptr<LayerNorm> ln_1_, ln_2_;
    std::unique_ptr<CausalSelfAttention> attn_;
    std::unique_ptr<MLP> mlp_;
};

// The output projection, tied to wte: logits (N,V) = x (N,C) @ wte^T, rows
// `ld` apart (padded_vocab(V) in training, V for the decoder's one row),
// then softmax cross-entropy. wte is registered as its external parameter.
class LMHead : public Module {
public:
    LMHead(ParamTable& t, std::size_t wte, const Config& cfg);
    // logits fp32, or bf16 (Activations::logits_bf16).
    void forward(Context& c, const device::View& logits, std::span<const float> x, std::uint64_t N,
                 std::uint64_t ld);
    // dlogits (N,V) at row stride ld in (the pad not read; fp32 or bf16), dx (N,C) written.
    void backward(Context& c, std::span<float> dx, const device::ConstView& dlogits, std::span<const float> x,
                  std::uint64_t N, std::uint64_t ld);

private:
    Config cfg_;
    std::size_t wte_;
};

// The GPT's own activations (Activations::own): its blocks', their
// scratch, and the final LayerNorm's.
struct GPTBuffers : Activations::Own {
    std::vector<BlockActivations> blocks;          // layers of them, or 1 with checkpointing
    BlockScratch scratch;
    device::Array<float> lnf, lnf_mean, lnf_rstd;  // (N,C), (N), (N)
};

class GPT : public LanguageModel {
public:
    explicit GPT(const Config& cfg);
    ~GPT() override;
    const Config& config() const override { return cfg_; }
    const ParamTable& params_table() const override { return table_; }

    Activations plan(device::Device& dev, const Shape& shape) const override;
    std::uint64_t plan_bytes(const Shape& shape) const override;
    void forward(Context& c, Activations& acts, bool for_backward = true) override;
    void backward(Context& c, Activations& acts) override;
    double flops_per_step(std::uint64_t B, std::uint64_t T) const override;
    // Activations::own as plan() made it (InternalError for another model's).
    static GPTBuffers& buffers(Activations& a) { return a.own_as<GPTBuffers>("GPT"); }

    std::unique_ptr<DecodeState> decode_state(device::Device& dev, std::uint64_t positions) const override;
    std::uint64_t decode_bytes(std::uint64_t positions) const override;
    void decode(Context& c, DecodeState& state, std::span<const std::int32_t> token, std::uint64_t pos,
                std::span<float> logits) override;
    // A state as decode_state() made it (InternalError for another model's).
    static GPTDecodeState& decode_buffers(DecodeState& s) { return family_part<GPTDecodeState>(&s, "GPT"); }

private:
    Activations plan_on(device::Device* dev, const Shape& shape, std::uint64_t* arena) const;
    Config cfg_;
    ParamTable table_;
    std::unique_ptr<Embedding> embed_;
    std::vector<std::unique_ptr<Block>> blocks_;
    std::unique_ptr<LayerNorm> ln_f_;
    std::unique_ptr<LMHead> head_;
};


}  // namespace zinf::model
