// The block, the tied output head, and the GPT that strings them together
// with activation checkpointing.
#include <zinf/family.hpp>
#include <zinf/gpt.hpp>

#include "checkpoints.hpp"

namespace zinf::model {

using device::Gemm;

Block::Block(ParamTable& t, std::uint64_t layer, const Config& cfg)
    : Module("h." + std::to_string(layer)), cfg_(cfg) {
    const std::string h = name() + ".";
    ln_1_ = std::make_unique<LayerNorm>(t, h + "ln_1", cfg.hidden);
    attn_ = std::make_unique<CausalSelfAttention>(t, h + "attn", cfg);
    ln_2_ = std::make_unique<LayerNorm>(t, h + "ln_2", cfg.hidden);
    mlp_ = std::make_unique<MLP>(t, h + "mlp", cfg);
}

void Block::forward(Context& c, std::span<float> out, std::span<const float> x, BlockActivations& a,
                    BlockScratch& s, std::uint64_t B, std::uint64_t T) {
    ForwardScope scope(c.engine, *this);
    const std::uint64_t N = B * T;
    const std::span<float> ln1 = a.ln1.made(s.dbt4c);
    ln_1_->forward(c, ln1, a.ln1_mean, a.ln1_rstd, x, N);
    a.ln1.keep(c, ln1);
    // Kept bf16, res2 is made in s.dqkv (the attention is done with the
    // q/k/v it staged there when c_proj writes it), rounded, and read back
    // widened there by the rest of the forward, as its backward reads it.
    const std::span<float> res2 = a.res2.made(s.dqkv);
    attn_->forward(c, res2, a.ln1.read(), a, s, B, T);
    // res2 = x + attn(ln_1(x)), kept (bf16: rounded, widened back), and
    // ln_2 of it: one pass (residual_layernorm_forward).
    const std::span<float> ln2 = a.ln2.made(s.dbt4c);
    ln_2_->forward_residual(c, ln2, a.ln2_mean, a.ln2_rstd, res2, x,
                            a.res2.is_bf16() ? device::View(a.res2.bf16) : device::View(), N);
    a.ln2.keep(c, ln2);
    mlp_->forward(c, out, a.ln2.read(), a, s, N);
    c.dev.accumulate(c.stream, out, res2);  // out = res2 + mlp(ln_2(res2))
}

void Block::backward(Context& c, std::span<float> dres, std::span<const float> x, BlockActivations& a,
                     BlockScratch& s, std::uint64_t B, std::uint64_t T, std::span<float> recompute_out) {
    BackwardScope scope(c.engine, *this);
    if (!recompute_out.empty()) forward(c, recompute_out, x, a, s, B, T);
    const std::uint64_t N = B * T;
    // dres holds d out; the MLP branch adds its part, giving d res2 ...
    mlp_->backward(c, s.dbtc, dres, a.ln2.read(), a, s, N);
    ln_2_->backward(c, dres, s.dbtc, a.res2.read(), a.ln2_mean, a.ln2_rstd, N);
    // ... and the attention branch its part, giving d x.
    attn_->backward(c, s.dbtc, dres, a.ln1.read(), a, s, B, T);
    ln_1_->backward(c, dres, s.dbtc, device::ConstView(x), a.ln1_mean, a.ln1_rstd, N);
}

void Block::decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st,
                   std::span<float> k, std::span<float> v, std::uint64_t pos) {
    ForwardScope scope(c.engine, *this);
    ln_1_->forward(c, st.ln, st.mean, st.rstd, x, 1);
    attn_->decode(c, st.res2, st.ln, st, k, v, pos);
    // res2 = x + attn(ln_1(x)), and ln_2 of it
    ln_2_->forward_residual(c, st.ln, st.mean, st.rstd, st.res2, x, {}, 1);
    mlp_->decode(c, out, st.ln, st);
    c.dev.accumulate(c.stream, out, st.res2);  // out = res2 + mlp(ln_2(res2))
}

// ---------------------------------------------------------------------------
LMHead::LMHead(ParamTable& t, std::size_t wte, const Config& cfg) : Module("lm_head"), cfg_(cfg), wte_(wte) {
    use_external(wte);
    t.add_user(this);
}

void LMHead::forward(Context& c, const device::View& logits, std::span<const float> x, std::uint64_t N,
                     std::uint64_t ld) {
    ForwardScope scope(c.engine, *this);
    // logits (N,V) = x (N,C) @ wte^T, wte stored (V,C), rows ld apart
    c.gemm(Gemm{.tb = true, .m = N, .n = cfg_.vocab, .k = cfg_.hidden, .ldc = ld}, x, c.engine.stored(*this, wte_),
           logits);
}

void LMHead::backward(Context& c, std::span<float> dx, const device::ConstView& dlogits, std::span<const float> x,
                      std::uint64_t N, std::uint64_t ld) {
    BackwardScope scope(c.engine, *this);
    // dx (N,C) = dlogits (N,V) @ wte (V,C); dwte (V,C) += dlogits^T @ x; dlogits' rows ld apart
    c.gemm(Gemm{.m = N, .n = cfg_.hidden, .k = cfg_.vocab, .lda = ld}, dlogits, c.engine.stored(*this, wte_), dx);
    c.gemm(Gemm{.ta = true, .m = cfg_.vocab, .n = cfg_.hidden, .k = N, .lda = ld, .beta = 1}, dlogits, x,
           c.engine.grad(*this, wte_));
}

// ---------------------------------------------------------------------------
GPT::GPT(const Config& cfg) : LanguageModel("gpt"), cfg_(cfg), table_(cfg) {
    if (shard::family(cfg.arch).modules != shard::Modules::gpt) throw InternalError("GPT: the config is another architecture's (make_model)");
    if (!cfg.layers || !cfg.hidden || !cfg.heads || !cfg.vocab || !cfg.max_seq || cfg.hidden % cfg.heads)
        throw UsageError("GPT: layers, hidden, heads, vocab and seq must be positive, hidden a multiple of heads");
    embed_ = std::make_unique<Embedding>(table_, cfg);
    for (std::uint64_t l = 0; l < cfg.layers; ++l) blocks_.push_back(std::make_unique<Block>(table_, l, cfg));
    ln_f_ = std::make_unique<LayerNorm>(table_, "ln_f", cfg.hidden);
    head_ = std::make_unique<LMHead>(table_, embed_->wte(), cfg);
    for (const auto& p : table_.all())
        if (!p.owner) throw InternalError("parameter " + p.name + " has no module");
}

GPT::~GPT() = default;

Activations GPT::plan(device::Device& dev, const Shape& shape) const { return plan_on(&dev, shape, nullptr); }

std::uint64_t GPT::plan_bytes(const Shape& shape) const {
    std::uint64_t arena = 0;
    plan_on(nullptr, shape, &arena);
    return arena;
}

// With a device, allocates every buffer; without one, only adds up the
// arena bytes they would take (each rounded up to the arena's unit).
Activations GPT::plan_on(device::Device* dev, const Shape& shape, std::uint64_t* arena) const {
    const std::uint64_t B = shape.batch, T = shape.seq, C = cfg_.hidden, NH = cfg_.heads, V = cfg_.vocab;
    if (!B || !T) throw UsageError("batch and sequence length must be positive");
    if (T > cfg_.max_seq)
        throw UsageError("sequence length " + std::to_string(T) + " is longer than the model's " +
                         std::to_string(cfg_.max_seq) + " positions");
    const std::uint64_t N = B * T;
    Activations a;
    a.shape = shape;
    auto take = [&]<class E>(std::uint64_t n, const char* what) {
        a.bytes += n * sizeof(E);
        if (arena) *arena += align_up(std::max<std::uint64_t>(n * sizeof(E), 1), mem::kArenaAlignment);
        return dev ? dev->alloc<E>(n, what) : device::Array<E>{};
    };
    auto f = [&](std::uint64_t n, const char* what) { return take.template operator()<float>(n, what); };
    const bool bf16 = shape.activations == device::Precision::bf16;
    auto kept = [&](std::uint64_t n, const char* what) { return checkpoints::kept(take, bf16, n, what); };
    a.inputs = take.template operator()<std::int32_t>(N, "inputs");
    a.targets = take.template operator()<std::int32_t>(N, "targets");
    checkpoints::plan(a, shape, cfg_.layers, N * C, take);
    auto own = std::make_unique<GPTBuffers>();
    const std::uint64_t sets = shape.checkpoint ? 1 : cfg_.layers;
    for (std::uint64_t l = 0; l < sets; ++l) {
        BlockActivations b;
        b.ln1 = kept(N * C, "ln_1");
        b.ln1_mean = f(N, "ln_1 mean");
        b.ln1_rstd = f(N, "ln_1 rstd");
        b.qkv = kept(N * 3 * C, "qkv");
        b.flash = shape.attention == Attention::flash;
        b.att = b.flash ? Kept{.f32 = f(B * NH * T, "attention log-sum-exp")} : kept(B * NH * T * T, "attention");
        b.atty = kept(N * C, "attention output");
        b.res2 = kept(N * C, "residual 2");
        b.ln2 = kept(N * C, "ln_2");
        b.ln2_mean = f(N, "ln_2 mean");
        b.ln2_rstd = f(N, "ln_2 rstd");
        b.fch = kept(N * 4 * C, "fc");
        b.fch_gelu = kept(N * 4 * C, "gelu");
        own->blocks.push_back(std::move(b));
    }
    own->scratch.dbtc = f(N * C, "d (N,C)");
    own->scratch.dqkv = f(N * 3 * C, "d qkv");
    own->scratch.datt = f(B * NH * T * (shape.attention == Attention::flash ? 1 : T), "d attention");
    own->scratch.dbt4c = f(N * 4 * C, "d fc");
    own->lnf = f(N * C, "ln_f");
    own->lnf_mean = f(N, "ln_f mean");
    own->lnf_rstd = f(N, "ln_f rstd");
    if (bf16)
        a.logits_bf16 = take.template operator()<std::uint16_t>(N * padded_vocab(V), "logits");
    else
        a.logits = f(N * padded_vocab(V), "logits");
    a.losses = f(N, "losses");
    a.dres = f(N * C, "d residual");
    a.own = std::move(own);
    return a;
}

void GPT::forward(Context& c, Activations& a, bool for_backward) {
    ForwardScope scope(c.engine, *this);
    GPTBuffers& own = buffers(a);
    const std::uint64_t B = a.shape.batch, T = a.shape.seq, N = B * T;
    const std::span<const float> x = checkpoints::forward(
        c, a, cfg_, for_backward, "GPT", [&](std::span<float> out) { embed_->forward(c, out, a.inputs, B, T); },
        [&](std::uint64_t l, std::span<float> out, std::span<const float> in) {
            blocks_[l]->forward(c, out, in, own.blocks[a.shape.checkpoint ? 0 : l], own.scratch, B, T);
        });
    ln_f_->forward(c, own.lnf, own.lnf_mean, own.lnf_rstd, x, N);
    const device::View logits = a.logits_view();
    head_->forward(c, logits, own.lnf, N, padded_vocab(cfg_.vocab));
    if (for_backward)  // the mean loss: each token's gradient scaled by 1/N
        c.dev.crossentropy_forward_backward(c.stream, a.losses, logits, a.targets, 1.0f / static_cast<float>(N), N,
                                            cfg_.vocab, padded_vocab(cfg_.vocab));
    else
        c.dev.crossentropy_forward(c.stream, a.losses, logits, a.targets, N, cfg_.vocab, padded_vocab(cfg_.vocab));
}

void GPT::backward(Context& c, Activations& a) {
    BackwardScope scope(c.engine, *this);
    GPTBuffers& own = buffers(a);
    const std::uint64_t B = a.shape.batch, T = a.shape.seq, N = B * T;
    head_->backward(c, own.scratch.dbtc, a.logits_view(), own.lnf, N, padded_vocab(cfg_.vocab));
    c.dev.zero(c.stream, a.dres);
    ln_f_->backward(c, a.dres, own.scratch.dbtc, device::ConstView(checkpoints::last(c, a, cfg_)), own.lnf_mean,
                    own.lnf_rstd, N);
    checkpoints::backward(c, a, cfg_, own.scratch.dbtc,
                          [&](std::uint64_t l, std::span<const float> x, std::span<float> recompute_out) {
                              blocks_[l]->backward(c, a.dres, x, own.blocks[a.shape.checkpoint ? 0 : l], own.scratch,
                                                   B, T, recompute_out);
                          });
    embed_->backward(c, a.dres, a.inputs, B, T);
}

double GPT::flops_per_step(std::uint64_t B, std::uint64_t T) const {
    // Every weight but the position table is used in one multiply-add per
    // token forward and two backward: 6 FLOPs per parameter per token. The
    // causal attention scores and their use take 4*C*(t+1) FLOPs at position t
    // forward, twice that backward: 6*C*T*(T+1) per row per layer in all.
    const double N = static_cast<double>(B * T);
    const double weights = static_cast<double>(table_.numel() - cfg_.max_seq * cfg_.hidden);
    return 6.0 * weights * N +
           6.0 * static_cast<double>(cfg_.layers * B * cfg_.hidden) * static_cast<double>(T) * static_cast<double>(T + 1);
}

// ---------------------------------------------------------------------------
// The one-position forward (LanguageModel::decode): Block::forward's modules
// and kernels on the row at position p, attention through attention_decode
// over the layer's cache, where the row's key and value join rows 0..p-1.
namespace {

// Every buffer of a decoder of n positions, taken by f(count, what) in this
// order (which allocates, or only counts the bytes).
template <class F>
void decode_plan(const Config& cfg, std::uint64_t n, GPTDecodeState& st, F&& f) {
    const std::uint64_t C = cfg.hidden;
    st.positions = n;
    for (std::uint64_t l = 0; l < cfg.layers; ++l) {
        st.k.push_back(f(n * C, "key cache"));
        st.v.push_back(f(n * C, "value cache"));
    }
    st.x = f(C, "x");
    st.out = f(C, "block output");
    st.res2 = f(C, "residual 2");
    st.ln = f(C, "layernorm");
    st.mean = f(1, "mean");
    st.rstd = f(1, "rstd");
    st.qkv = f(3 * C, "qkv");
    st.atty = f(C, "attention output");
    st.att = f(cfg.heads * n, "attention");
    st.fch = f(4 * C, "fc");
    st.fch_gelu = f(4 * C, "gelu");
}

}  // namespace

std::uint64_t GPT::decode_bytes(std::uint64_t positions) const {
    std::uint64_t bytes = 0;
    GPTDecodeState none;
    decode_plan(cfg_, positions, none, [&](std::uint64_t count, const char*) {
        bytes += align_up(std::max<std::uint64_t>(count * 4, 1), mem::kArenaAlignment);
        return device::Array<float>{};
    });
    return bytes;
}

std::unique_ptr<LanguageModel::DecodeState> GPT::decode_state(device::Device& dev, std::uint64_t positions) const {
    if (positions == 0 || positions > cfg_.max_seq)
        throw UsageError("the decoder's positions must be 1 to the model's " + std::to_string(cfg_.max_seq) +
                         ", not " + std::to_string(positions));
    auto st = std::make_unique<GPTDecodeState>();
    decode_plan(cfg_, positions, *st, [&](std::uint64_t count, const char* what) { return dev.alloc<float>(count, what); });
    return st;
}

void GPT::decode(Context& c, DecodeState& state, std::span<const std::int32_t> token, std::uint64_t pos,
                 std::span<float> logits) {
    GPTDecodeState& st = decode_buffers(state);
    if (pos >= st.positions)
        throw UsageError("the decoder's " + std::to_string(st.positions) + " positions are all used");
    ForwardScope scope(c.engine, *this);
    embed_->forward(c, st.x, token, 1, 1, pos);  // x = wte[token] + wpe[pos]
    for (std::uint64_t l = 0; l < cfg_.layers; ++l) {
        blocks_[l]->decode(c, st.out, st.x, st, st.k[l], st.v[l], pos);
        std::swap(st.x, st.out);
    }
    ln_f_->forward(c, st.ln, st.mean, st.rstd, st.x, 1);
    head_->forward(c, logits, st.ln, 1, cfg_.vocab);  // one row: no pad
}

}  // namespace zinf::model
