// GPT-2's modules below the block (gpt.hpp): LayerNorm, Embedding,
// attention and MLP (their linear layers model.hpp's Linear). Every forward and backward runs
// between the engine's hooks and reaches its parameters through the engine.
#include <zinf/gpt.hpp>

namespace zinf::model {

using device::Gemm;

// ---------------------------------------------------------------------------
LayerNorm::LayerNorm(ParamTable& t, const std::string& name, std::uint64_t C) : Module(name), C_(C) {
    w_ = declare(t, name + ".weight", {C});
    b_ = declare(t, name + ".bias", {C});
}

void LayerNorm::forward(Context& c, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                        std::span<const float> inp, std::uint64_t N) {
    ForwardScope scope(c.engine, *this);
    c.dev.layernorm_forward(c.stream, out, mean, rstd, inp, c.engine.weight(*this, w_), c.engine.weight(*this, b_),
                            N, C_);
}

void LayerNorm::forward_residual(Context& c, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                 std::span<float> res, std::span<const float> add, const device::View& kept,
                                 std::uint64_t N) {
    ForwardScope scope(c.engine, *this);
    c.dev.residual_layernorm_forward(c.stream, out, mean, rstd, res, add, kept, c.engine.weight(*this, w_),
                                     c.engine.weight(*this, b_), N, C_);
}

void LayerNorm::backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                         std::span<const float> mean, std::span<const float> rstd, std::uint64_t N) {
    BackwardScope scope(c.engine, *this);
    const auto dw = c.engine.grad(*this, w_), db = c.engine.grad(*this, b_);
    const auto w = c.engine.weight(*this, w_);
    c.dev.layernorm_backward(c.stream, dinp, dw, db, dout, inp, w, mean, rstd, N, C_);
}

// ---------------------------------------------------------------------------
Embedding::Embedding(ParamTable& t, const Config& cfg) : Module("embedding"), cfg_(cfg) {
    wte_ = declare(t, "wte.weight", {cfg.vocab, cfg.hidden});
    wpe_ = declare(t, "wpe.weight", {cfg.max_seq, cfg.hidden});
}

void Embedding::forward(Context& c, std::span<float> out, std::span<const std::int32_t> tokens, std::uint64_t B,
                        std::uint64_t T) {
    forward(c, out, tokens, B, T, 0);
}

namespace {

// `v` past its first `n` elements, in its own element type.
device::ConstView skip(const device::ConstView& v, std::size_t n) {
    if (v.is_bf16()) return v.span<std::uint16_t>().subspan(n);
    return v.span<float>().subspan(n);
}

}  // namespace

void Embedding::forward(Context& c, std::span<float> out, std::span<const std::int32_t> tokens, std::uint64_t B,
                        std::uint64_t T, std::uint64_t first) {
    ForwardScope scope(c.engine, *this);
    c.dev.embedding_forward(c.stream, out, tokens, c.engine.stored(*this, wte_),
                            skip(c.engine.stored(*this, wpe_), first * cfg_.hidden), B, T, cfg_.hidden, cfg_.vocab);
}

void Embedding::backward(Context& c, std::span<const float> dout, std::span<const std::int32_t> tokens,
                         std::uint64_t B, std::uint64_t T) {
    BackwardScope scope(c.engine, *this);
    c.dev.embedding_backward(c.stream, c.engine.grad(*this, wte_), c.engine.grad(*this, wpe_), dout, tokens, B, T,
                             cfg_.hidden, cfg_.vocab);
}

// ---------------------------------------------------------------------------
namespace {

// GPT-2's linear layers: Conv1D's (in, out) weight, a bias.
std::unique_ptr<Linear> conv1d(ParamTable& t, const std::string& name, std::uint64_t in, std::uint64_t out,
                               unsigned tiles) {
    return std::make_unique<Linear>(t, name, in, out, tiles, Linear::Layout::in_out, true);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(ParamTable& t, const std::string& name, const Config& cfg)
    : Module(name), cfg_(cfg) {
    c_attn_ = conv1d(t, name + ".c_attn", cfg.hidden, 3 * cfg.hidden, cfg.tile);
    c_proj_ = conv1d(t, name + ".c_proj", cfg.hidden, cfg.hidden, cfg.tile);
}

void CausalSelfAttention::forward(Context& c, std::span<float> out, const device::ConstView& inp, BlockActivations& a,
                                  BlockScratch& s, std::uint64_t B, std::uint64_t T) {
    ForwardScope scope(c.engine, *this);
    const std::uint64_t N = B * T;
    // Kept bf16, q/k/v are written bf16 by c_attn's GEMM (rounded once)
    // and widened into s.dqkv for the attention (as its backward reads
    // them); the softmax is made in s.datt and rounded.
    const std::span<float> qkv = a.qkv.made(s.dqkv);
    if (a.qkv.is_bf16()) {
        c_attn_->forward(c, a.qkv.bf16.span(), inp, N);  // (N,3C)
        c.dev.cast(c.stream, qkv, std::span<const std::uint16_t>(a.qkv.bf16.span()));
    } else {
        c_attn_->forward(c, qkv, inp, N);  // (N,3C)
    }
    const std::span<float> att = a.att.made(s.datt), atty = a.atty.made(s.dbt4c);
    if (a.flash)  // att: the rows' log-sum-exp, fp32
        c.dev.flash_attention_forward(c.stream, atty, att, qkv, B, T, cfg_.hidden, cfg_.heads);  // (N,C)
    else
        c.dev.attention_forward(c.stream, atty, att, qkv, B, T, cfg_.hidden, cfg_.heads);  // (N,C)
    a.att.keep(c, att);
    a.atty.keep(c, atty);
    c_proj_->forward(c, out, a.atty.read(), N);  // (N,C)
}

void CausalSelfAttention::backward(Context& c, std::span<float> dinp, std::span<const float> dout,
                                   const device::ConstView& inp, BlockActivations& a, BlockScratch& s, std::uint64_t B,
                                   std::uint64_t T) {
    BackwardScope scope(c.engine, *this);
    const std::uint64_t N = B * T;
    // datty lives in s.dbtc until attention's backward has read it; then
    // c_attn's backward writes dinp, which may be the same buffer.
    c_proj_->backward(c, s.dbtc, dout, a.atty.read(), N);
    if (a.flash)  // the output as kept (its rows' dO . O); s.datt their delta
        c.dev.flash_attention_backward(c.stream, s.dqkv, s.datt, s.dbtc, a.qkv.read(), a.atty.read(), a.att.f32.span(), B,
                                       T, cfg_.hidden, cfg_.heads);
    else if (a.qkv.is_bf16() != a.att.is_bf16())
        throw InternalError("CausalSelfAttention: q/k/v and the softmax kept in two precisions");
    else if (a.qkv.is_bf16())
        c.dev.attention_backward(c.stream, s.dqkv, s.datt, s.dbtc, std::span<const std::uint16_t>(a.qkv.bf16),
                                 std::span<const std::uint16_t>(a.att.bf16), B, T, cfg_.hidden, cfg_.heads);
    else
        c.dev.attention_backward(c.stream, s.dqkv, s.datt, s.dbtc, std::span<const float>(a.qkv.f32),
                                 std::span<const float>(a.att.f32), B, T, cfg_.hidden, cfg_.heads);
    c_attn_->backward(c, dinp, s.dqkv, inp, N);
}

void CausalSelfAttention::decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st,
                                 std::span<float> k, std::span<float> v, std::uint64_t pos) {
    ForwardScope scope(c.engine, *this);
    const std::uint64_t C = cfg_.hidden, NH = cfg_.heads;
    const std::span<float> qkv = st.qkv;
    c_attn_->forward(c, qkv, x, 1);  // (3C)
    c.dev.copy(c.stream, std::as_writable_bytes(k.subspan(pos * C, C)), std::as_bytes(qkv.subspan(C, C)));
    c.dev.copy(c.stream, std::as_writable_bytes(v.subspan(pos * C, C)), std::as_bytes(qkv.subspan(2 * C, C)));
    c.dev.attention_decode(c.stream, st.atty, st.att.span().first(NH * (pos + 1)), qkv.first(C),
                           k.first((pos + 1) * C), v.first((pos + 1) * C), pos + 1, C, NH);
    c_proj_->forward(c, out, st.atty, 1);  // (C)
}

// ---------------------------------------------------------------------------
MLP::MLP(ParamTable& t, const std::string& name, const Config& cfg) : Module(name), cfg_(cfg) {
    c_fc_ = conv1d(t, name + ".c_fc", cfg.hidden, 4 * cfg.hidden, cfg.tile);
    c_proj_ = conv1d(t, name + ".c_proj", 4 * cfg.hidden, cfg.hidden, cfg.tile);
}

// c_fc's GEMM writes the pre-activation and its GELU (gemm_bias_gelu's
// epilogue) as kept, bf16 or fp32; the reference takes GELU of pre as kept
// (rounded), as the backward reads it.
void MLP::forward(Context& c, std::span<float> out, const device::ConstView& inp, BlockActivations& a, BlockScratch&,
                  std::uint64_t N) {
    ForwardScope scope(c.engine, *this);
    if (a.fch.is_bf16() != a.fch_gelu.is_bf16())
        throw InternalError("MLP: its GELU's input and output kept in two precisions");
    if (a.fch.is_bf16())
        c_fc_->forward_gelu(c, a.fch.bf16.span(), a.fch_gelu.bf16.span(), inp, N);  // (N,4C) twice
    else
        c_fc_->forward_gelu(c, a.fch.f32.span(), a.fch_gelu.f32.span(), inp, N);
    c_proj_->forward(c, out, a.fch_gelu.read(), N);  // (N,C)
}

void MLP::backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                   BlockActivations& a, BlockScratch& s, std::uint64_t N) {
    BackwardScope scope(c.engine, *this);
    c_proj_->backward(c, s.dbt4c, dout, a.fch_gelu.read(), N);  // d fch_gelu (N,4C)
    if (a.fch.is_bf16())  // d fch, in place
        c.dev.gelu_backward(c.stream, s.dbt4c, a.fch.bf16.span(), s.dbt4c);
    else
        c.dev.gelu_backward(c.stream, s.dbt4c, a.fch.f32.span(), s.dbt4c);
    c_fc_->backward(c, dinp, s.dbt4c, inp, N);
}

void MLP::decode(Context& c, std::span<float> out, std::span<const float> x, GPTDecodeState& st) {
    ForwardScope scope(c.engine, *this);
    c_fc_->forward_gelu(c, st.fch.span(), st.fch_gelu.span(), x, 1);  // (4C) twice
    c_proj_->forward(c, out, st.fch_gelu, 1);  // (C)
}

}  // namespace zinf::model
