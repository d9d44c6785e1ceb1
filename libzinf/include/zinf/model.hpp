// zinf model: a GPT-2 built from modules with explicit forward and backward,
// every one of them run through an Engine's hooks. A module reaches its
// parameters only through the engine, so the engine decides where they live
// and when they move; a model author writes no data movement.
//
//   zinf::model::GPT gpt(zinf::model::Config::from(spec, tile));
//   zinf::model::ResidentEngine engine(dev, gpt.params());   // every parameter on the device
//   auto acts = gpt.plan(dev, {.batch = 4, .seq = 64});      // all buffers, once
//   gpt.forward(ctx, acts, inputs, targets);                  // losses in acts.losses
//   gpt.backward(ctx, acts, inputs, targets);                 // gradients through engine.grad()
//
// Parameter names, shapes and order are exactly zinf-shard's (shard::tensors):
// wte.weight (V,C), wpe.weight (maxT,C), h.<l>.ln_1.weight (C), ... ln_f.bias,
// with linear weights (in, out) as GPT-2's Conv1D and, with a tile factor,
// split by output columns into "<name>.tile<k>".
//
// Hooks, in order, for a module M: before_forward(M), its children's hooks,
// after_forward(M); then in backward before_backward(M) ... after_backward(M).
// With activation checkpointing a block's forward runs again (hooks and all)
// inside its backward, between before_backward and its children's backward.
#pragma once

#include <zinf/device.hpp>
#include <zinf/shard.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zinf::model {

struct Config {
    std::uint64_t layers = 0, hidden = 0, heads = 0, vocab = 0, max_seq = 0;
    unsigned tile = 1;  // linear weights split into this many column tiles
    static Config from(const shard::ModelSpec& spec, unsigned tile = 1);
    shard::ModelSpec spec() const;
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

private:
    std::vector<Param> params_;
};

class Module {
public:
    explicit Module(std::string name) : name_(std::move(name)) {}
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    const std::string& name() const { return name_; }
    std::span<const std::size_t> params() const { return own_; }         // declared here
    std::span<const std::size_t> external() const { return external_; }  // other modules', used here
    bool uses(std::size_t param) const;

protected:
    std::size_t declare(ParamTable& t, const std::string& param_name, std::vector<std::uint64_t> shape);
    void use_external(std::size_t param) { external_.push_back(param); }

private:
    std::string name_;
    std::vector<std::size_t> own_, external_;
};

// Where parameters live and when they move. The model calls the hooks around
// every module's forward and backward, and asks for each parameter's values
// and gradient inside them. weight() and grad() refuse (InternalError) a
// parameter the module neither declared nor registered as external.
class Engine {
public:
    virtual ~Engine() = default;
    virtual void before_forward(const Module&) {}
    virtual void after_forward(const Module&) {}
    virtual void before_backward(const Module&) {}
    virtual void after_backward(const Module&) {}

    // Device memory: the values (numel), and the gradient the backward adds to.
    std::span<const float> weight(const Module& m, std::size_t param);
    std::span<float> grad(const Module& m, std::size_t param);

protected:
    virtual std::span<const float> weight_of(std::size_t param) = 0;
    virtual std::span<float> grad_of(std::size_t param) = 0;
};

// What a forward or backward runs with.
struct Context {
    device::Device& dev;
    device::Stream& stream;
    Engine& engine;
};

// Runs `m`'s forward (or backward) between the engine's two hooks.
class ForwardScope {
public:
    ForwardScope(Engine& e, const Module& m) : e_(e), m_(m) { e_.before_forward(m_); }
    ~ForwardScope() noexcept(false) { if (!std::uncaught_exceptions()) e_.after_forward(m_); }
private:
    Engine& e_;
    const Module& m_;
};
class BackwardScope {
public:
    BackwardScope(Engine& e, const Module& m) : e_(e), m_(m) { e_.before_backward(m_); }
    ~BackwardScope() noexcept(false) { if (!std::uncaught_exceptions()) e_.after_backward(m_); }
private:
    Engine& e_;
    const Module& m_;
};

// ---------------------------------------------------------------------------
// Linear: out (N,out) = inp (N,in) @ W (in,out) [+ b (out)].
class LinearBase : public Module {
public:
    using Module::Module;
    virtual void forward(Context& c, std::span<float> out, std::span<const float> inp, std::uint64_t N) = 0;
    // dinp (N,in) written; the weight's (and bias's) gradient added to.
    virtual void backward(Context& c, std::span<float> dinp, std::span<const float> dout,
                          std::span<const float> inp, std::uint64_t N) = 0;
    std::uint64_t in = 0, out = 0;
};

class Linear : public LinearBase {
public:
    // name "h.0.attn.c_attn": declares <name>.weight (in,out) and <name>.bias (out).
    Linear(ParamTable& t, const std::string& name, std::uint64_t in, std::uint64_t out);
    void forward(Context& c, std::span<float> out, std::span<const float> inp, std::uint64_t N) override;
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                  std::uint64_t N) override;

private:
    std::size_t w_ = 0, b_ = 0;
};

// The same function as Linear computed tile by tile: tile k is its own module
// ("<name>.tile<k>") with its own parameter <name>.weight.tile<k> (in, c1-c0)
// holding output columns [c0, c1), so an engine can fetch one tile at a time
// (memory-centric tiling, paper §5.1.3). The bias stays whole.
class TiledLinear : public LinearBase {
public:
    TiledLinear(ParamTable& t, const std::string& name, std::uint64_t in, std::uint64_t out, unsigned tiles);
    ~TiledLinear() override;
    void forward(Context& c, std::span<float> out, std::span<const float> inp, std::uint64_t N) override;
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                  std::uint64_t N) override;

private:
    struct Tile;
    std::vector<std::unique_ptr<Tile>> tiles_;
    std::size_t b_ = 0;
};

std::unique_ptr<LinearBase> make_linear(ParamTable& t, const std::string& name, std::uint64_t in,
                                        std::uint64_t out, unsigned tiles);

class LayerNorm : public Module {
public:
    LayerNorm(ParamTable& t, const std::string& name, std::uint64_t C);
    // out (N,C), mean (N), rstd (N) from inp (N,C).
    void forward(Context& c, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                 std::span<const float> inp, std::uint64_t N);
    // dinp (N,C) +=.
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
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

private:
    Config cfg_;
    std::size_t wte_ = 0, wpe_ = 0;
};

// A block's activations for one (B,T): what its backward needs.
struct BlockActivations {
    device::Array<float> ln1, ln1_mean, ln1_rstd;  // (N,C), (N), (N)
    device::Array<float> qkv;                      // (N,3C)
    device::Array<float> att;                      // (B,NH,T,T)
    device::Array<float> atty;                     // (N,C)
    device::Array<float> res2;                     // (N,C) the residual after attention
    device::Array<float> ln2, ln2_mean, ln2_rstd;  // (N,C), (N), (N)
    device::Array<float> fch, fch_gelu;            // (N,4C)
};

// The backward's scratch, shared by all blocks.
struct BlockScratch {
    device::Array<float> dbtc;    // (N,C)
    device::Array<float> dqkv;    // (N,3C)
    device::Array<float> datt;    // (B,NH,T,T)
    device::Array<float> dbt4c;   // (N,4C)
};

class CausalSelfAttention : public Module {
public:
    CausalSelfAttention(ParamTable& t, const std::string& name, const Config& cfg);
    // out (N,C) = c_proj(attention(c_attn(inp))), keeping qkv, att and atty in `a`.
    void forward(Context& c, std::span<float> out, std::span<const float> inp, BlockActivations& a,
                 std::uint64_t B, std::uint64_t T);
    // dinp (N,C) written.
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                  BlockActivations& a, BlockScratch& s, std::uint64_t B, std::uint64_t T);

private:
    Config cfg_;
    std::unique_ptr<LinearBase> c_attn_, c_proj_;
};

class MLP : public Module {
public:
    MLP(ParamTable& t, const std::string& name, const Config& cfg);
    void forward(Context& c, std::span<float> out, std::span<const float> inp, BlockActivations& a,
                 std::uint64_t N);
    // dinp (N,C) written.
    void backward(Context& c, std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                  BlockActivations& a, BlockScratch& s, std::uint64_t N);

private:
    Config cfg_;
    std::unique_ptr<LinearBase> c_fc_, c_proj_;
};

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public Module {
public:
    Block(ParamTable& t, std::uint64_t layer, const Config& cfg);
    // out (N,C) from inp (N,C).
    void forward(Context& c, std::span<float> out, std::span<const float> inp, BlockActivations& a,
                 std::uint64_t B, std::uint64_t T);
    // dres (N,C): the gradient of the block's output in, of its input out
    // (in place, as the residual stream carries it). With activation
    // checkpointing `recompute_out` (N,C) is given: the forward runs again
    // first, filling `a` (and writing the output there).
    void backward(Context& c, std::span<float> dres, std::span<const float> inp, BlockActivations& a,
                  BlockScratch& s, std::uint64_t B, std::uint64_t T, std::span<float> recompute_out = {});

private:
    Config cfg_;
    std::unique_ptr<LayerNorm> ln_1_, ln_2_;
    std::unique_ptr<CausalSelfAttention> attn_;
    std::unique_ptr<MLP> mlp_;
};

// The output projection, tied to wte: logits (N,V) = x (N,C) @ wte^T, then
// softmax cross-entropy. wte is registered as its external parameter.
class LMHead : public Module {
public:
    LMHead(ParamTable& t, std::size_t wte, const Config& cfg);
    void forward(Context& c, std::span<float> logits, std::span<const float> x, std::uint64_t N);
    // dlogits (N,V) in, dx (N,C) written.
    void backward(Context& c, std::span<float> dx, std::span<const float> dlogits, std::span<const float> x,
                  std::uint64_t N);

private:
    Config cfg_;
    std::size_t wte_;
};

struct Shape {
    std::uint64_t batch = 0, seq = 0;  // B rows of T tokens, T <= max_seq
    bool checkpoint = true;            // keep block inputs only, recompute in backward
};

// Every buffer a training step needs, planned once for a Shape.
struct Activations {
    Shape shape;
    device::Array<std::int32_t> inputs, targets;   // (B,T)
    std::vector<device::Array<float>> residual;    // layers+1 of (N,C): block inputs, then the last output
    std::vector<BlockActivations> blocks;          // layers of them, or 1 with checkpointing
    BlockScratch scratch;
    device::Array<float> lnf, lnf_mean, lnf_rstd;  // (N,C), (N), (N)
    device::Array<float> logits;                   // (N,V); the logits' gradient after backward's start
    device::Array<float> losses;                   // (N)
    device::Array<float> dres;                     // (N,C)
    std::uint64_t bytes = 0;                       // all of the above
};

class GPT : public Module {
public:
    explicit GPT(const Config& cfg);
    ~GPT() override;
    const Config& config() const { return cfg_; }
    const ParamTable& params_table() const { return table_; }

    Activations plan(device::Device& dev, const Shape& shape) const;

    // Forward over acts.inputs: the per-token losses against acts.targets in
    // acts.losses (and, with `for_backward`, the logits' gradient of the mean
    // loss left in acts.logits for backward()). Enqueued on c.stream.
    void forward(Context& c, Activations& acts, bool for_backward = true);
    // Every parameter's gradient of the mean loss added through the engine.
    void backward(Context& c, Activations& acts);

    // Model FLOPs of one forward+backward over B*T tokens: 6 per weight per
    // token (every parameter but wpe), plus the causal attention's
    // 6*C*T*(T+1) per row per layer; no recomputation counted.
    double flops_per_step(std::uint64_t B, std::uint64_t T) const;

private:
    Config cfg_;
    ParamTable table_;
    std::unique_ptr<Embedding> embed_;
    std::vector<std::unique_ptr<Block>> blocks_;
    std::unique_ptr<LayerNorm> ln_f_;
    std::unique_ptr<LMHead> head_;
};

// ---------------------------------------------------------------------------
// The engine of this stage: every parameter and its gradient resident in
// device memory, one Array each for all values and all gradients (fp32).
// Records the hooks it sees when tracing (the order of modules a step runs,
// which the ZeRO-Infinity engine's prefetcher will replay).
class ResidentEngine : public Engine {
public:
    ResidentEngine(device::Device& dev, const ParamTable& params);

    std::span<float> values(std::size_t param);   // for loading and updating
    std::span<float> gradient(std::size_t param);
    std::span<float> all_values() { return values_.span(); }
    std::span<float> all_gradients() { return grads_.span(); }
    std::uint64_t offset(std::size_t param) const { return offsets_[param]; }  // elements
    void zero_grad(device::Stream& s);

    struct Hook {
        enum Kind { before_forward, after_forward, before_backward, after_backward } kind;
        std::string module;
    };
    bool tracing = false;
    std::vector<Hook> trace;

    void before_forward(const Module& m) override;
    void after_forward(const Module& m) override;
    void before_backward(const Module& m) override;
    void after_backward(const Module& m) override;

protected:
    std::span<const float> weight_of(std::size_t param) override { return values(param); }
    std::span<float> grad_of(std::size_t param) override { return gradient(param); }

private:
    device::Device& dev_;
    std::vector<std::uint64_t> offsets_, sizes_;
    device::Array<float> values_, grads_;
};

}  // namespace zinf::model
