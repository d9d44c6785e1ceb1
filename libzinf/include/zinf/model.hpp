// zinf model: what every model family shares. Modules with explicit
// forward and backward, every one of them run through a ParamEngine's hooks:
// a module reaches its parameters only through the engine, so the engine
// decides where they live and when they move; a model author writes no data
// movement. The families' modules are declared beside it: GPT-2's in
// zinf/gpt.hpp, the Llama family's (Llama, Qwen2) in zinf/llama.hpp;
// make_model builds the one a Config's family names.
//
//   auto m = zinf::model::make_model(zinf::model::Config::from(spec, tile));
//   zinf::model::ResidentEngine engine(dev, numels(m->params_table()));  // every parameter on the device
//   auto acts = m->plan(dev, {.batch = 4, .seq = 64});       // all buffers, once
//   zinf::model::Context ctx{dev, dev.compute(), engine};
//   // copy the tokens into acts.inputs and the next tokens into acts.targets
//   m->forward(ctx, acts);                                    // losses in acts.losses
//   m->backward(ctx, acts);                                   // gradients through engine.grad()
//
// Parameter names, shapes and order are exactly zinf-shard's (shard::tensors).
//
// Hooks, in order, for a module M: before_forward(M), its children's hooks,
// after_forward(M); then in backward before_backward(M) ... after_backward(M).
// With activation checkpointing a block's forward runs again (hooks and all)
// inside its backward, between before_backward and its children's backward.
#pragma once

#include <zinf/device.hpp>
#include <zinf/shard.hpp>
#include <zinf/zero.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace zinf::model {

struct Config {
    std::uint64_t layers = 0, hidden = 0, heads = 0, vocab = 0, max_seq = 0;
    unsigned tile = 1;  // linear weights split into this many column tiles
    // The Llama family's (shard::ModelSpec's fields of the same names).
    shard::Arch arch = shard::Arch::gpt;
    std::uint64_t kv_heads = 0, ffn = 0;
    double rope_theta = 10000, norm_eps = 1e-5;
    bool tied = true;
    shard::RopeScaling rope_scaling;
    static Config from(const shard::ModelSpec& spec, unsigned tile = 1);
    shard::ModelSpec spec() const;
    std::uint64_t head_dim() const { return heads ? hidden / heads : 0; }
    bool qkv_bias() const;  // as shard::ModelSpec::qkv_bias
};

class Module;

// A parameter of the model: one tensor of the manifest (same index, name and shape).
struct Param {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::uint64_t numel = 0;
    const Module* owner = nullptr;  // the module that declared it
};

class ParamTable {
public:
    explicit ParamTable(const Config& c);
    std::span<const Param> all() const { return params_; }
    const Param& operator[](std::size_t i) const { return params_[i]; }
    std::size_t size() const { return params_.size(); }
    std::uint64_t numel() const;  // every parameter
    // Claims `name` for `owner`: InternalError when absent, of another shape,
    // or claimed already.
    std::size_t claim(const std::string& name, const std::vector<std::uint64_t>& shape, const Module* owner);
    // Every module that declares or uses a parameter, once, in the order they
    // were made (execution order): what an engine plans its memory over.
    void add_user(const Module* m);
    std::span<const zero::Module* const> users() const { return users_; }
    // A parameter for each of the manifest's tensors, by index, name and
    // shape: DataError naming `source` and the first tensor that differs.
    void check(const shard::Manifest& m, const std::string& source) const;

private:
    std::vector<Param> params_;
    std::vector<const zero::Module*> users_;
};

// A module of the model: the engine's view of it (zero::Module) plus the
// way a module declares its parameters.
class Module : public zero::Module {
public:
    using zero::Module::Module;

protected:
    std::size_t declare(ParamTable& t, const std::string& param_name, std::vector<std::uint64_t> shape);
};

// Where parameters live and when they move: zero's hook interface.
using ParamEngine = zero::ParamEngine;

// What a forward or backward runs with. `precision` is the arithmetic of
// every GEMM's inputs (device.hpp's Precision: bf16 rounds the activations and
// weights a GEMM reads; everything else stays fp32). A module reads the
// parameters a GEMM or the embedding takes through engine.stored(), which
// may hand them over bf16 (a device::ConstView that says so), and the rest
// through engine.weight(), always fp32.
struct Context {
    device::Device& dev;
    device::Stream& stream;
    ParamEngine& engine;
    device::Precision precision = device::Precision::fp32;
    // dev.gemm on `stream` with `precision`'s inputs: how a module multiplies,
    // A and B each as stored (a parameter as the engine stores it,
    // ParamEngine::stored; an activation a block keeps, Kept).
    // C fp32, or bf16 (what the next op reads bf16: kernels.def's gemm).
    void gemm(device::Gemm g, device::ConstView a, device::ConstView b, device::View c) {
        g.inputs = precision;
        dev.gemm(stream, g, a, b, c);
    }
    // The same with an epilogue (kernels.def): + bias; + bias and GELU; the
    // bias's gradient from the operand that carries it.
    void gemm_bias(device::Gemm g, device::ConstView a, device::ConstView b, std::span<const float> bias,
                   device::View c) {
        g.inputs = precision;
        dev.gemm_bias(stream, g, a, b, bias, c);
    }
    void gemm_bias_gelu(device::Gemm g, device::ConstView a, device::ConstView b, std::span<const float> bias,
                        device::View pre, device::View out) {
        g.inputs = precision;
        dev.gemm_bias_gelu(stream, g, a, b, bias, pre, out);
    }
    void gemm_dbias(device::Gemm g, device::ConstView a, device::ConstView b, std::span<float> c,
                    std::span<float> dbias, bool of_a) {
        g.inputs = precision;
        dev.gemm_dbias(stream, g, a, b, c, dbias, of_a);
    }
    // dst (w.size()) = w widened to fp32 where it is stored bf16, else copied.
    void to_f32(std::span<float> dst, device::ConstView w) {
        if (w.is_bf16()) dev.cast(stream, dst, w);
        else dev.copy(stream, std::as_writable_bytes(dst), w.bytes());
    }
};

// Runs `m`'s forward (or backward) between the engine's two hooks.
class ForwardScope {
public:
    ForwardScope(ParamEngine& e, const Module& m) : e_(e), m_(m) { e_.before_forward(m_); }
    ~ForwardScope() noexcept(false) { if (!std::uncaught_exceptions()) e_.after_forward(m_); }
private:
    ParamEngine& e_;
    const Module& m_;
};
class BackwardScope {
public:
    BackwardScope(ParamEngine& e, const Module& m) : e_(e), m_(m) { e_.before_backward(m_); }
    ~BackwardScope() noexcept(false) { if (!std::uncaught_exceptions()) e_.after_backward(m_); }
private:
    ParamEngine& e_;
    const Module& m_;
};

// ---------------------------------------------------------------------------
// A linear layer: y (N,out) = x (N,in) @ W (+ b (out)), its weight as its
// family stores it: GPT-2's Conv1D, (in, out), or torch's nn.Linear, (out,
// in) (y = x @ W^T). With tiles > 1 the weight is split along its outputs
// (memory-centric tiling, paper §5.1.3): tile k is a module of its own,
// "<name>.tile<k>", with its own parameter "<name>.weight.tile<k>" holding
// outputs [tile_first(out,k), tile_first(out,k+1)) (Conv1D's columns,
// nn.Linear's rows: shard::tile_name, as zinf-shard lays them out), so an
// engine can fetch one tile at a time. The bias stays whole, this module's.
class Linear : public Module {
public:
    enum class Layout { in_out, out_in };
    Linear(ParamTable& t, const std::string& name, std::uint64_t in, std::uint64_t out, unsigned tiles, Layout layout,
           bool bias);
    ~Linear() override;
    // x stored fp32, or bf16 (an activation the block keeps bf16: Kept); y
    // fp32, or bf16 (kept so: the sum rounded once). The bias in the GEMM's
    // epilogue (gemm_bias).
    void forward(Context& c, const device::View& y, const device::ConstView& x, std::uint64_t N);
    // pre (N,out) = x W + b and out (N,out) = GELU(pre) in one GEMM's
    // epilogue (gemm_bias_gelu): GPT's c_fc. pre and out both fp32 or both
    // bf16; a layer with a bias.
    void forward_gelu(Context& c, const device::View& pre, const device::View& out, const device::ConstView& x,
                      std::uint64_t N);
    // dx (N,in) written, or added to with `accumulate`; the weight's (and
    // bias's, in the weight gradient's GEMM: gemm_dbias) gradient added to.
    void backward(Context& c, std::span<float> dx, std::span<const float> dy, const device::ConstView& x,
                  std::uint64_t N, bool accumulate = false);
    std::uint64_t in = 0, out = 0;
    bool tiled() const { return !tiles_.empty(); }
    // The one weight of an untiled layer (InternalError when tiled: each tile has its own).
    std::size_t weight_param() const;
    bool has_bias() const { return b_.has_value(); }

private:
    struct Tile;
    Layout layout_;
    std::vector<std::unique_ptr<Tile>> tiles_;  // none when untiled
    std::size_t w_whole_ = 0;                  // the weight, untiled
    std::optional<std::size_t> b_;             // the bias, if any
};

// An activation a block keeps for its backward, stored fp32 or bf16
// (Shape::activations): one of the two is planned. The forward makes it in
// fp32 where made() says (its own buffer, or bf16: fp32 staging) and keep()
// rounds it into its bf16 buffer (nearest even); readers take read().
struct Kept {
    device::Array<float> f32;
    device::Array<std::uint16_t> bf16;
    bool is_bf16() const { return bool(bf16); }
    std::span<float> made(std::span<float> staging) const {
        if (!is_bf16()) return f32.span();
        if (staging.size() < bf16.size()) throw InternalError("a kept activation's fp32 staging is too short");
        return staging.first(bf16.size());
    }
    void keep(Context& c, std::span<const float> made) const {
        if (is_bf16()) c.dev.cast(c.stream, bf16.span(), made);
    }
    // keep(), and `made` then holds what was kept (bf16: widened back), so
    // that a forward reading it there sees what its backward will.
    void keep_widened(Context& c, std::span<float> made) const {
        keep(c, made);
        if (is_bf16()) c.dev.cast(c.stream, made, std::span<const std::uint16_t>(bf16.span()));
    }
    device::ConstView read() const { return is_bf16() ? device::ConstView(bf16) : device::ConstView(f32); }
};


// Where activation checkpoints wait for the backward pass, and the store
// the model hands them to: the engine's (zero.hpp, ActivationStore).
using Offload = zero::Offload;
using zero::offload_name;
using zero::parse_offload;
using ActivationStore = zero::ActivationStore;

// Which attention kernels a block runs (zinf-train --attention): the GEMM
// path (attention_forward, gqa_forward: the (B,NH,T,T) softmax kept for the
// backward) or flash (flash_*: an online softmax, a (B,NH,T) log-sum-exp
// kept instead, fp32 whatever Shape::activations says, and the softmax
// recomputed a tile at a time by the backward). Decoding is the same for both.
enum class Attention : std::uint8_t { gemm, flash };

struct Shape {
    std::uint64_t batch = 0, seq = 0;  // B rows of T tokens, T <= max_seq
    bool checkpoint = true;            // keep block inputs only, recompute in backward
    // With checkpointing: every block's input but the last two goes to an
    // ActivationStore after the block's forward, and comes back one block
    // ahead of its backward. The device then holds three (N,C) residuals
    // instead of layers+1.
    Offload offload = Offload::none;
    // How the checkpoints (the residual stream at every block boundary) are
    // stored: fp32, the reference, or bf16 (zinf-train --precision bf16, as
    // llm.c keeps its residual stream): each block's output rounded to bf16
    // (nearest even) as it is made, kept and offloaded so, half the bytes,
    // and widened into one fp32 (N,C) buffer for the block (or the final
    // norm) that reads it, forward and backward alike, so the recompute sees
    // what the forward saw.
    device::Precision checkpoints = device::Precision::fp32;
    // How a block keeps the activations its GEMMs, GELU or SwiGLU and its
    // attention's and second norm's backward read for its backward (Kept: a
    // GPT's BlockActivations' layernorms' outputs, q/k/v, attention's
    // softmax and output, the residual between attention and MLP, MLP's
    // pre- and post-GELU, all 15 of its (N,C) values a token and the
    // (B,NH,T,T) softmax; a Llama's LlamaBlockActivations' RMSNorms'
    // outputs, q, k and v (after the rotation), attention's softmax and
    // output, the residual between attention and MLP, SwiGLU's gate, up and
    // product, all 5C + 3F + 2KV*hd of its values a token and the (B,H,T,T)
    // softmax): fp32, or bf16 (zinf-train --precision bf16, as llm.c), made
    // in fp32, rounded as made and read bf16 by the GEMMs (which need bf16
    // inputs then: Context::precision bf16), GELU, SwiGLU, the attention's
    // backward and the norms' backward; the forward reads q/k/v and the
    // inner residual rounded too (widened back into scratch, as the
    // checkpoints are). The norms' statistics stay fp32.
    device::Precision activations = device::Precision::fp32;
    Attention attention = Attention::gemm;
};

// The checkpoints an offloading step stores (the inputs of blocks 0 ..
// layers-3); the bytes of one for a batch of B x T stored as `p`
// (Shape::checkpoints), and of all it stores.
std::uint64_t offloaded_checkpoints(const Config& cfg);
std::uint64_t checkpoint_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T, device::Precision p);
std::uint64_t offload_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T,
                            device::Precision p = device::Precision::fp32);

// The output head's logits rows, padded (the vocabulary rounded up to a
// multiple of kLogitsAlign: GPT-2's 50257 to 50304) so that every row starts
// 16-byte aligned whatever the element type (the fused classifier's 128-bit
// loads on cuda). The padding is the logits' row stride alone (the head's
// GEMM writes V columns at ldc = padded_vocab(V), its backward reads them at
// that lda): no parameter, manifest, checkpoint, import or export is
// padded, the pad is never read, the classifier writes it 0 (no probability
// mass, no gradient), and the decoder's one row of logits (V) has none.
inline constexpr std::uint64_t kLogitsAlign = 64;
constexpr std::uint64_t padded_vocab(std::uint64_t V) { return (V + kLogitsAlign - 1) / kLogitsAlign * kLogitsAlign; }

// A family's own part of a generic object (Activations::own, a
// LanguageModel::DecodeState) as the family's type T: the one cast each
// family's typed accessor makes (GPT::buffers, Llama::decode_buffers, ...);
// InternalError naming `model` when another model made it.
template <class T, class Base>
T& family_part(Base* b, const char* model) {
    auto* t = dynamic_cast<T*>(b);
    if (!t) throw InternalError(std::string(model) + ": buffers made by another model");
    return *t;
}

// Every buffer a training step needs, planned once for a Shape: here what
// every family has (the tokens, the checkpoints, the logits and losses, the
// residual's gradient); a family's own (its blocks' activations, their
// scratch, its final norm's) in `own`, of its own type.
struct Activations {
    Shape shape;
    device::Array<std::int32_t> inputs, targets;   // (B,T)
    // The checkpoints: layers+1 of (N,C), the blocks' inputs then the last
    // output (three when offloading), in `residual` (fp32) or
    // `residual_bf16` (Shape::checkpoints bf16, with `widened` (N,C): the
    // one a block reads, as fp32). Reached through the walk of checkpoints.hpp.
    std::vector<device::Array<float>> residual;
    std::vector<device::Array<std::uint16_t>> residual_bf16;
    device::Array<float> widened;
    // (N, padded_vocab(V)): row i's V logits then the pad (never read);
    // the logits' gradient (the pad 0) after a forward for backward. fp32
    // in `logits`, or bf16 in `logits_bf16` (a GPT under Shape::activations
    // bf16, as llm.c: the head's GEMM writes them bf16, the fused
    // classifier reads and rewrites them so, and the head's backward GEMMs
    // read the gradient bf16, in one GEMM each, nothing staged).
    device::Array<float> logits;
    device::Array<std::uint16_t> logits_bf16;
    device::View logits_view() const {
        return logits_bf16 ? device::View(logits_bf16) : device::View(logits);
    }
    device::Array<float> losses;                   // (N)
    device::Array<float> dres;                     // (N,C)
    // The family's own buffers, as its model's plan() made them (the GPT's
    // GPTBuffers, the Llama's LlamaBuffers): each family reaches them
    // through its one typed accessor (own_as), which refuses activations
    // another model planned.
    struct Own {
        virtual ~Own() = default;
    };
    std::unique_ptr<Own> own;
    std::uint64_t bytes = 0;                       // all of the above and `own`'s
    // Shape::offload: where the checkpoints go (set by whoever plans the
    // step; a forward for backward without it is refused).
    std::shared_ptr<ActivationStore> store;
    // The buffer of checkpoint j (fp32 checkpoints): its own, or one of
    // three when offloading.
    std::span<float> res(std::uint64_t j) const { return residual[j % residual.size()]; }
    // `own` as family type B (family_part).
    template <class B>
    B& own_as(const char* model) {
        return family_part<B>(own.get(), model);
    }
};

// A decoder-only language model as the trainer and the sampler drive it:
// GPT-2's (zinf/gpt.hpp), or the Llama family's (zinf/llama.hpp). make_model
// picks the one a Config's family names.
class LanguageModel : public Module {
public:
    using Module::Module;
    virtual const Config& config() const = 0;
    virtual const ParamTable& params_table() const = 0;
    // Every module that uses a parameter (ParamTable::users).
    std::span<const zero::Module* const> modules() const { return params_table().users(); }

    virtual Activations plan(device::Device& dev, const Shape& shape) const = 0;
    // The arena bytes plan() takes for `shape` (every buffer rounded to the
    // arena's allocation unit), without allocating.
    virtual std::uint64_t plan_bytes(const Shape& shape) const = 0;

    // Forward over acts.inputs: the per-token losses against acts.targets in
    // acts.losses (and, with `for_backward`, the logits' gradient of the mean
    // loss left in acts.logits for backward()). Enqueued on c.stream.
    virtual void forward(Context& c, Activations& acts, bool for_backward = true) = 0;
    // Every parameter's gradient of the mean loss added through the engine.
    virtual void backward(Context& c, Activations& acts) = 0;

    // Model FLOPs of one forward+backward over B*T tokens: 6 per weight per
    // token (every parameter a token multiplies: not a position or input
    // embedding table), plus the causal attention's 6*C*T*(T+1) per row per
    // layer; no recomputation counted.
    virtual double flops_per_step(std::uint64_t B, std::uint64_t T) const = 0;

    // The sampler's forward of one position with a key-value cache (every
    // earlier position's keys and values kept per layer): the same modules,
    // kernels and hooks as forward() on the one new row, so a token costs
    // one position's forward. A family's state (its own type: its typed
    // accessor) holds its cache and one position's buffers.
    struct DecodeState {
        virtual ~DecodeState() = default;
    };
    // A state for `positions` positions (1 to max_seq, else UsageError),
    // its buffers taken from the device's arena now (OutOfMemory naming them).
    virtual std::unique_ptr<DecodeState> decode_state(device::Device& dev, std::uint64_t positions) const = 0;
    // The arena bytes decode_state(positions) takes, without allocating.
    virtual std::uint64_t decode_bytes(std::uint64_t positions) const = 0;
    // `token` (1, device memory) at position `pos` (below the state's
    // positions, else UsageError): its keys and values join the cache, and
    // logits (V, device memory) predict the next token. Enqueued on c.stream.
    virtual void decode(Context& c, DecodeState& state, std::span<const std::int32_t> token, std::uint64_t pos,
                        std::span<float> logits) = 0;
};

// The model a Config describes: a GPT, or a Llama.
std::unique_ptr<LanguageModel> make_model(const Config& cfg);

// ---------------------------------------------------------------------------
// The reference engine (zero::ResidentEngine) for a model's parameters.
using ResidentEngine = zero::ResidentEngine;
std::vector<std::uint64_t> numels(const ParamTable& t);

}  // namespace zinf::model
