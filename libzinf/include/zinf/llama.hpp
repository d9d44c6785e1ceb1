// zinf llama: the Llama family (Llama 2 and 3, SmolLM, TinyLlama, Mistral's
// shape, and Qwen2's) as modules declared to the same engine as the GPT
// (model.hpp, gpt.hpp): RMSNorm, rotary position embeddings ("rotate half", with
// Llama 3's frequency scaling), grouped-query attention, a SwiGLU MLP, no
// biases but a Qwen2's on q, k and v, the output head tied to the embedding
// or its own. Parameter names and shapes
// are Hugging Face's (shard::tensors), so an imported checkpoint is used as
// it is. Each module runs between the engine's hooks, as the GPT's do; the
// engine (zero/) knows nothing of the architecture.
//
//   auto m = zinf::model::make_model(zinf::model::Config::from(spec, tile));  // a Llama for a llama: spec
//   auto acts = m->plan(dev, {.batch = 4, .seq = 64});
//   m->forward(ctx, acts);  m->backward(ctx, acts);
//
// Module names are Hugging Face's too: model.embed_tokens, model.layers.<l>
// (.input_layernorm, .self_attn (.q_proj ... .o_proj), .post_attention_layernorm,
// .mlp (.gate_proj, .up_proj, .down_proj)), model.norm, lm_head.
#pragma once

#include <zinf/model.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace zinf::model {

// The rotary frequencies of a head of hd dimensions: theta^(-2i/hd) for i <
// hd/2, with Llama 3's scaling when the config has it (Hugging Face's
// _compute_llama3_parameters), in double.
std::vector<double> rope_frequencies(const Config& cfg);
// The table the device's rope kernels read (device.hpp): row p of
// `positions` holds cos(p f_i) for i < hd/2, then sin(p f_i), computed in
// double and rounded once.
std::vector<float> rope_table(const Config& cfg, std::uint64_t positions);

class RMSNorm : public Module {
public:
    RMSNorm(ParamTable& t, const std::string& name, std::uint64_t C, float eps);
    void forward(Context& c, std::span<float> out, std::span<float> rstd, std::span<const float> inp, std::uint64_t N);
    // res (N,C) += add, then forward of res: the residual add before the norm, in the same pass.
    void forward_residual(Context& c, std::span<float> out, std::span<float> rstd, std::span<float> res,
                          std::span<const float> add, std::uint64_t N);
    // dinp (N,C) +=; inp as kept (fp32, or bf16: a block's inner residual, Kept).
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                  std::span<const float> rstd, std::uint64_t N);

private:
    std::uint64_t C_;
    float eps_;
    std::size_t w_ = 0;
};

// A block's activations for one (B,T) (q and k after the rotation).
// q, k and v are one array, one after another (not interleaved), and so are
// gate and up. Where the projections of one input run as one GEMM (q, k and
// v; gate and up: joined_projections), the array here or its twin in
// LlamaScratch holds their (N, sum of outs) product or gradients, side by
// side, while the other holds the parts. The Kept ones are what the GEMMs,
// SwiGLU, the attention's and the second RMSNorm's backward read, the GPT's
// (gpt.hpp's BlockActivations) analogues: bf16 under Shape::activations,
// made in fp32 in LlamaScratch::dgate_up (res2, q, k and v in
// LlamaScratch::dqkv, the softmax in LlamaScratch::datt). Kept bf16, q, k
// and v are joined in LlamaScratch::dgate_up (the forward's product and the
// backward's gradients), and gate and up are not joined: their bf16 array
// cannot take the gradients' fp32 (N, 2F) side by side.
struct LlamaBlockActivations {
    Kept norm1;                          // (N,C)
    device::Array<float> rstd1;          // (N)
    Kept qkv;                            // q, k, v: (N,H*hd), (N,KV*hd), (N,KV*hd)
    Kept att;                            // (B,H,T,T) the softmax; flash: (B,H,T) lse, fp32
    bool flash = false;                  // Shape::attention flash
    Kept atty;                           // (N,H*hd)
    Kept res2;                           // (N,C), made in LlamaScratch::dqkv when bf16
    Kept norm2;                          // (N,C)
    device::Array<float> rstd2;          // (N)
    Kept gate_up;                        // gate, then up: (N,F) each
    Kept act;                            // (N,F)
};

struct LlamaScratch {
    device::Array<float> dbtc;           // (N,C)
    device::Array<float> dqkv;           // dq, dk, dv
    std::span<float> dq, dk, dv;         // as q, k, v, in dqkv
    device::Array<float> datt;           // (B,H,T,T); flash: (B,H,T), its backward's delta
    // dgate, dup; in the forward, under Shape::activations bf16, the fp32
    // staging of what the block keeps bf16 (Kept::made), and of q, k and v's
    // joined product and gradients: (N, max(2F, C, H*hd + 2 KV*hd joined)).
    device::Array<float> dgate_up;
    std::span<float> dgate, dup;         // (N,F) each, in dgate_up
    // A joined group's weights (their copies where the engine keeps them
    // apart), then its gradients: twice the largest joined group's (sum of
    // outs, C); empty when no group is joined.
    device::Array<float> joined;
};

// The Llama's own activations (Activations::own): its blocks', their
// scratch, the rotation table and the final RMSNorm's.
struct LlamaBuffers : Activations::Own {
    std::vector<LlamaBlockActivations> blocks;  // layers of them, or 1 with checkpointing
    LlamaScratch scratch;
    device::Array<float> rope;                  // (T, hd)
    device::Array<float> norm, norm_rstd;       // (N,C), (N)
};

// Whether a group of projections of one input, of `outs` outputs together
// from C inputs, runs as one GEMM (q, k and v: H*hd + 2 KV*hd; gate and up:
// 2F): untiled, and their weights together at most 32 MiB, the scratch a
// copy of them takes. Small GEMMs are where a Llama's step is cut into the
// most OpenMP regions; large ones fill the team alone. A property of the
// config, so that every engine runs the same GEMMs and gets the same bits
// (gate and up kept bf16, Shape::activations, are never joined:
// LlamaBlockActivations).
bool joined_projections(const Config& cfg, std::uint64_t outs);

// One new position's keys and values per layer (the sampler's cache):
// k and v (positions, KV*hd) each, every kv head once for its group.
struct KVCache {
    std::vector<device::Array<float>> k, v;  // per layer
    std::uint64_t positions = 0;
};

// What the one-position forward keeps: the cache and one position's buffers
// (its att (H, positions)), the rotation table for the positions.
struct LlamaDecodeState : LanguageModel::DecodeState {
    KVCache cache;
    LlamaBlockActivations one;
    device::Array<float> x, out, norm, rstd, rope;
};

class LlamaAttention : public Module {
public:
    LlamaAttention(ParamTable& t, const std::string& name, const Config& cfg);
    // out (N,C) = o_proj(attention(rope(q_proj(x)), rope(k_proj(x)), v_proj(x))).
    // `s`: the scratch q, k and v take as one GEMM (joined_projections) and
    // a bf16 atty is made in; null: a GEMM each (and atty fp32).
    void forward(Context& c, std::span<float> out, const device::ConstView& x, LlamaBlockActivations& a,
                 std::span<const float> rope, std::uint64_t B, std::uint64_t T, LlamaScratch* s = nullptr);
    // dx (N,C) written.
    void backward(Context& c, std::span<float> dx, std::span<const float> dout, const device::ConstView& x,
                  LlamaBlockActivations& a, LlamaScratch& s, std::span<const float> rope, std::uint64_t B,
                  std::uint64_t T);
    // Position `pos` alone (x (C)): its key and value join the cache (k, v
    // (positions, KV*hd)), then it attends to positions 0..pos. q, kk, vv,
    // atty and att are one position's buffers (att (H, positions)).
    void decode(Context& c, std::span<float> out, std::span<const float> x, std::span<float> q,
                std::span<float> att, std::span<float> atty, std::span<float> k, std::span<float> v,
                std::span<const float> rope, std::uint64_t pos);

private:
    Config cfg_;
    std::unique_ptr<Linear> q_, k_, v_, o_;
};

class LlamaMLP : public Module {
public:
    LlamaMLP(ParamTable& t, const std::string& name, const Config& cfg);
    // out (N,C) = down_proj(silu(gate_proj(x)) * up_proj(x)), keeping gate,
    // up and their product in `a`. `s` as the attention's. `out` empty: gate,
    // up and their product only (a recompute for the backward).
    void forward(Context& c, std::span<float> out, const device::ConstView& x, LlamaBlockActivations& a,
                 std::uint64_t N, LlamaScratch* s = nullptr);
    // dx (N,C) written.
    void backward(Context& c, std::span<float> dx, std::span<const float> dout, const device::ConstView& x,
                  LlamaBlockActivations& a, LlamaScratch& s, std::uint64_t N);

private:
    Config cfg_;
    std::unique_ptr<Linear> gate_, up_, down_;
};

// x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)).
class LlamaBlock : public Module {
public:
    LlamaBlock(ParamTable& t, std::uint64_t layer, const Config& cfg);
    // `s`: scratch for joined projections (LlamaAttention::forward); null: none.
    // `out` empty: every activation the backward reads, not the output.
    void forward(Context& c, std::span<float> out, std::span<const float> x, LlamaBlockActivations& a,
                 std::span<const float> rope, std::uint64_t B, std::uint64_t T, LlamaScratch* s = nullptr);
    // As Block::backward (gpt.hpp): dres in, d x out, in place. With
    // `recompute_out` given the forward runs again first, up to the MLP's
    // activation (recompute_out itself is not written).
    void backward(Context& c, std::span<float> dres, std::span<const float> x, LlamaBlockActivations& a,
                  LlamaScratch& s, std::span<const float> rope, std::uint64_t B, std::uint64_t T,
                  std::span<float> recompute_out = {});
    // One position through the block with the layer's cache (KVCache's k
    // and v of this layer); `a` holds one position's buffers (its q, k, v
    // unused: the cache's row `pos` takes the key and value).
    void decode(Context& c, std::span<float> out, std::span<const float> x, LlamaBlockActivations& a,
                std::span<float> k, std::span<float> v, std::span<const float> rope, std::uint64_t pos);

private:
    Config cfg_;
    std::unique_ptr<RMSNorm> ln_1_, ln_2_;
    std::unique_ptr<LlamaAttention> attn_;
    std::unique_ptr<LlamaMLP> mlp_;
};

class Llama : public LanguageModel {
public:
    explicit Llama(const Config& cfg);
    ~Llama() override;
    const Config& config() const override { return cfg_; }
    const ParamTable& params_table() const override { return table_; }

    Activations plan(device::Device& dev, const Shape& shape) const override;
    std::uint64_t plan_bytes(const Shape& shape) const override;
    void forward(Context& c, Activations& acts, bool for_backward = true) override;
    void backward(Context& c, Activations& acts) override;
    double flops_per_step(std::uint64_t B, std::uint64_t T) const override;
    // Activations::own as plan() made it (InternalError for another model's).
    static LlamaBuffers& buffers(Activations& a) { return a.own_as<LlamaBuffers>("Llama"); }

    // The sampler's forward of one position, through the same blocks with a
    // cache (its grouped-query heads' keys and values once per kv head).
    std::unique_ptr<DecodeState> decode_state(device::Device& dev, std::uint64_t positions) const override;
    std::uint64_t decode_bytes(std::uint64_t positions) const override;
    void decode(Context& c, DecodeState& state, std::span<const std::int32_t> token, std::uint64_t pos,
                std::span<float> logits) override;
    // A state as decode_state() made it (InternalError for another model's).
    static LlamaDecodeState& decode_buffers(DecodeState& s) { return family_part<LlamaDecodeState>(&s, "Llama"); }

private:
    Activations plan_on(device::Device* dev, const Shape& shape, std::uint64_t* arena) const;
    Config cfg_;
    ParamTable table_;
    class Embed;
    class Head;
    std::unique_ptr<Embed> embed_;
    std::vector<std::unique_ptr<LlamaBlock>> blocks_;
    std::unique_ptr<RMSNorm> norm_;
    std::unique_ptr<Head> head_;
};

}  // namespace zinf::model
