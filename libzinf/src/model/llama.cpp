// The Llama family (zinf/llama.hpp): its modules, the model that strings
// them together with activation checkpointing and offload as the GPT does
// (gpt.cpp), and the one-position forward the sampler runs with a cache.
#include <zinf/family.hpp>
#include <zinf/llama.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <numbers>
#include <optional>

#include "checkpoints.hpp"

namespace zinf::model {

using device::Gemm;
using u64 = std::uint64_t;

std::vector<double> rope_frequencies(const Config& cfg) {
    const u64 hd = cfg.head_dim(), half = hd / 2;
    std::vector<double> f(half);
    const auto& rs = cfg.rope_scaling;
    for (u64 i = 0; i < half; ++i) {
        double inv = 1.0 / std::pow(cfg.rope_theta, static_cast<double>(2 * i) / static_cast<double>(hd));
        if (rs.factor > 0) {
            const double orig = static_cast<double>(rs.original_max_positions);
            const double low_wavelen = orig / rs.low_freq_factor, high_wavelen = orig / rs.high_freq_factor;
            const double wavelen = 2 * std::numbers::pi / inv;
            if (wavelen > low_wavelen) {
                inv /= rs.factor;  // long wavelengths: interpolated
            } else if (!(wavelen < high_wavelen)) {  // between: a smooth mix of the two
                const double smooth =
                    (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
                inv = (1 - smooth) * inv / rs.factor + smooth * inv;
            }
        }
        f[i] = inv;
    }
    return f;
}

std::vector<float> rope_table(const Config& cfg, u64 positions) {
    const u64 hd = cfg.head_dim(), half = hd / 2;
    const std::vector<double> f = rope_frequencies(cfg);
    std::vector<float> t(positions * hd);
    for (u64 p = 0; p < positions; ++p)
        for (u64 i = 0; i < half; ++i) {
            const double a = static_cast<double>(p) * f[i];
            t[p * hd + i] = static_cast<float>(std::cos(a));
            t[p * hd + half + i] = static_cast<float>(std::sin(a));
        }
    return t;
}

// ---------------------------------------------------------------------------
// Projections of one input (q, k and v; gate and up) as one GEMM each of
// three ways: their product x @ [W_1; W_2; ...]^T, the input's gradient
// [dy_1 dy_2 ...] @ [W_1; W_2; ...] and their weights' gradients [dy_1
// dy_2 ...]^T @ x, one OpenMP region where the parts took one each (a
// Llama block's regions, not its FLOPs, set its step on a loaded machine:
// BENCHMARKS.md). A GEMM's bits depend on its shape (OpenBLAS blocks it by
// size), so whether a group is joined is the config's (joined_projections),
// and every engine runs the same joined GEMMs on the same values: the
// resident engine, which keeps the parts' weights and gradients one after
// another in its arrays (the layout's order, 64-byte aligned starts), hands
// them over as one matrix; any other (the ZeRO-Infinity engine gathers each
// parameter into its own buffer) has the weights copied side by side into
// scratch, each within its own hooks, and the joined gradient added to each
// part's, within its hooks. The joined input gradient sums over all the
// parts' outputs in one GEMM, so its bits are not those of a GEMM per part
// (nor need be: every engine runs the joined one).
namespace {

constexpr u64 kJoinedMaxBytes = u64{32} << 20;

// The parts' weights and gradients as one (sum of outs, in) matrix each,
// where the resident engine holds them so (the weights all fp32 or all kept
// bf16, one after another); none otherwise.
struct Joined {
    device::ConstView w;
    std::span<float> g;
};

std::optional<Joined> adjacent(Context& c, std::initializer_list<Linear*> parts) {
    auto* resident = dynamic_cast<zero::ResidentEngine*>(&c.engine);
    if (!resident) return std::nullopt;
    const bool bf16 = resident->kept_bf16((*parts.begin())->weight_param());
    const void* w_end = nullptr;
    float* g_end = nullptr;
    const void* w_first = nullptr;
    float* g_first = nullptr;
    std::size_t count = 0;
    for (const Linear* p : parts) {
        const std::size_t param = p->weight_param();
        if (resident->kept_bf16(param) != bf16) return std::nullopt;
        const auto g = resident->gradient(param);
        const void* w = nullptr;
        const void* end = nullptr;
        if (bf16) {
            const auto v = resident->values_bf16(param);
            w = v.data();
            end = v.data() + v.size();
        } else {
            const auto v = resident->values(param);
            w = v.data();
            end = v.data() + v.size();
        }
        if (!w_end) {
            w_first = w;
            g_first = g.data();
        } else if (w != w_end || g.data() != g_end) {
            return std::nullopt;
        }
        w_end = end;
        g_end = g.data() + g.size();
        count += g.size();
    }
    const device::ConstView w = bf16 ? device::ConstView(static_cast<const std::uint16_t*>(w_first), count)
                                     : device::ConstView(static_cast<const float*>(w_first), count);
    return Joined{w, {g_first, g_end}};
}

u64 outs(std::initializer_list<Linear*> parts) {
    u64 n = 0;
    for (const Linear* p : parts) n += p->out;
    return n;
}

// Half h (0: gate, 1: up) of gate_up, as it is kept.
template <class E>
std::span<E> half(std::span<E> both, int h) {
    const std::size_t n = both.size() / 2;
    return both.subspan(h * n, n);
}

// Where a block makes in fp32 what it keeps bf16 (Kept::made): the forward's
// use of LlamaScratch::dgate_up. None without scratch (the decoder's, fp32).
std::span<float> staging(LlamaScratch* s) { return s ? s->dgate_up.span() : std::span<float>{}; }

// q, k and v one after another in their array (kept, made, or their
// gradients): (N,H*hd), (N,KV*hd), (N,KV*hd).
template <class E>
std::array<std::span<E>, 3> qkv_parts(const Config& cfg, std::span<E> qkv) {
    const u64 hd = cfg.head_dim(), QC = cfg.heads * hd, KC = cfg.kv_heads * hd, N = qkv.size() / (QC + 2 * KC);
    return {qkv.first(N * QC), qkv.subspan(N * QC, N * KC), qkv.subspan(N * (QC + KC), N * KC)};
}

// The parts' hooks, entered in order and left in reverse, around work on
// their weights as one matrix.
template <class Scope>
class Nested {
public:
    Nested(ParamEngine& e, std::initializer_list<Linear*> parts) {
        for (Linear* p : parts) held_.push_back(std::make_unique<Scope>(e, *p));
    }
    ~Nested() noexcept(false) {
        while (!held_.empty()) held_.pop_back();
    }

private:
    std::vector<std::unique_ptr<Scope>> held_;
};

// Whether the group runs as one GEMM: the config's rule, for parts without
// biases (a Qwen2's q, k and v run a GEMM and a bias each).
bool joined(const Config& cfg, std::initializer_list<Linear*> parts) {
    return joined_projections(cfg, outs(parts)) &&
           std::none_of(parts.begin(), parts.end(), [](const Linear* p) { return p->has_bias(); });
}

// ys[i] (N, out_i) = x (N,in) @ W_i^T. Joined (`s` given and the group
// `joined`): one GEMM into `rows` (N, sum of outs), each y's columns copied
// out; otherwise each part's forward.
void project(Context& c, const Config& cfg, std::initializer_list<Linear*> parts,
             std::initializer_list<std::span<float>> ys, const device::ConstView& x, u64 N, LlamaScratch* s,
             std::span<float> rows) {
    const u64 J = outs(parts), in = (*parts.begin())->in;
    const auto* y = ys.begin();
    if (!s || !joined(cfg, parts)) {
        for (Linear* p : parts) p->forward(c, *y++, x, N);
        return;
    }
    const Gemm g{.tb = true, .m = N, .n = J, .k = in};
    if (const auto j = adjacent(c, parts)) {
        const Nested<ForwardScope> scopes(c.engine, parts);
        c.gemm(g, x, j->w, rows);
    } else {
        u64 at = 0;
        for (Linear* p : parts) {
            ForwardScope scope(c.engine, *p);
            const auto w = c.engine.stored(*p, p->weight_param());
            c.to_f32(s->joined.span().subspan(at * in, w.size()), w);
            at += p->out;
        }
        c.gemm(g, x, device::ConstView(s->joined.span().first(J * in)), rows);
    }
    u64 at = 0;
    for (const Linear* p : parts) {
        c.dev.copy_rows(c.stream, *y++, p->out, rows.subspan(at), J, N, p->out);
        at += p->out;
    }
}

// dx (N,in) = [dys...] @ [W_1; W_2; ...] and dW_i += dys[i]^T @ x. Joined:
// the dys copied side by side into `rows` (N, sum of outs), then one GEMM
// each way: with the resident engine's joined weights and straight into its
// gradients (zeroed for the step, so that 0 + the product is the product);
// under any other engine the gradient into scratch, added to each part's and
// its weight copied beside the others', each within its own hooks, then dx
// from the copies. Otherwise each part's backward, dx summed over them;
// always so without `rows` (a group kept bf16, whose forward ran a GEMM
// each: LlamaBlockActivations).
void project_backward(Context& c, const Config& cfg, std::initializer_list<Linear*> parts,
                      std::initializer_list<std::span<const float>> dys, std::span<float> dx,
                      const device::ConstView& x, u64 N, LlamaScratch& s, std::span<float> rows) {
    const u64 J = outs(parts), in = (*parts.begin())->in;
    const auto* dy = dys.begin();
    if (rows.empty() || !joined(cfg, parts)) {
        bool accumulate = false;
        for (Linear* p : parts) {
            p->backward(c, dx, *dy++, x, N, accumulate);
            accumulate = true;
        }
        return;
    }
    u64 at = 0;
    for (const Linear* p : parts) {
        c.dev.copy_rows(c.stream, rows.subspan(at), J, *dy++, p->out, N, p->out);
        at += p->out;
    }
    const Gemm dgrad{.m = N, .n = in, .k = J}, dw{.ta = true, .m = J, .n = in, .k = N, .beta = 1};
    if (const auto j = adjacent(c, parts)) {
        const Nested<BackwardScope> scopes(c.engine, parts);
        c.gemm(dgrad, rows, j->w, dx);
        c.gemm(dw, rows, x, j->g);
        return;
    }
    const auto w = s.joined.span().first(J * in), g = s.joined.span().subspan(J * in, J * in);
    c.dev.zero(c.stream, g);
    c.gemm(dw, rows, x, g);
    at = 0;
    for (Linear* p : parts) {
        BackwardScope scope(c.engine, *p);
        c.to_f32(w.subspan(at * in, p->out * in), c.engine.stored(*p, p->weight_param()));
        c.dev.accumulate(c.stream, c.engine.grad(*p, p->weight_param()), g.subspan(at * in, p->out * in));
        at += p->out;
    }
    c.gemm(dgrad, rows, w, dx);
}

}  // namespace

bool joined_projections(const Config& cfg, u64 outs) {
    return cfg.tile <= 1 && outs * cfg.hidden * sizeof(float) <= kJoinedMaxBytes;
}

// ---------------------------------------------------------------------------
RMSNorm::RMSNorm(ParamTable& t, const std::string& name, u64 C, float eps) : Module(name), C_(C), eps_(eps) {
    w_ = declare(t, name + ".weight", {C});
}

void RMSNorm::forward(Context& c, std::span<float> out, std::span<float> rstd, std::span<const float> inp, u64 N) {
    ForwardScope scope(c.engine, *this);
    c.dev.rmsnorm_forward(c.stream, out, rstd, inp, c.engine.weight(*this, w_), N, C_, eps_);
}

void RMSNorm::forward_residual(Context& c, std::span<float> out, std::span<float> rstd, std::span<float> res,
                               std::span<const float> add, u64 N) {
    ForwardScope scope(c.engine, *this);
    c.dev.residual_rmsnorm_forward(c.stream, out, rstd, res, add, c.engine.weight(*this, w_), N, C_, eps_);
}

void RMSNorm::backward(Context& c, std::span<float> dinp, std::span<const float> dout, const device::ConstView& inp,
                       std::span<const float> rstd, u64 N) {
    BackwardScope scope(c.engine, *this);
    const auto dw = c.engine.grad(*this, w_);
    const auto w = c.engine.weight(*this, w_);
    c.dev.rmsnorm_backward(c.stream, dinp, dw, dout, inp, w, rstd, N, C_);
}

// ---------------------------------------------------------------------------
namespace {

// The Llama's linear layers: torch's (out, in) weight, a bias where asked (a Qwen2's q, k and v).
std::unique_ptr<Linear> torch_linear(ParamTable& t, const std::string& name, u64 in, u64 out, unsigned tiles,
                                     bool bias = false) {
    return std::make_unique<Linear>(t, name, in, out, tiles, Linear::Layout::out_in, bias);
}

}  // namespace

LlamaAttention::LlamaAttention(ParamTable& t, const std::string& name, const Config& cfg) : Module(name), cfg_(cfg) {
    const u64 C = cfg.hidden, hd = cfg.head_dim();
    q_ = torch_linear(t, name + ".q_proj", C, cfg.heads * hd, cfg.tile, cfg.qkv_bias());
    k_ = torch_linear(t, name + ".k_proj", C, cfg.kv_heads * hd, cfg.tile, cfg.qkv_bias());
    v_ = torch_linear(t, name + ".v_proj", C, cfg.kv_heads * hd, cfg.tile, cfg.qkv_bias());
    o_ = torch_linear(t, name + ".o_proj", cfg.heads * hd, C, cfg.tile);
}

void LlamaAttention::forward(Context& c, std::span<float> out, const device::ConstView& x, LlamaBlockActivations& a,
                             std::span<const float> rope, u64 B, u64 T, LlamaScratch* s) {
    ForwardScope scope(c.engine, *this);
    const u64 N = B * T, H = cfg_.heads, KV = cfg_.kv_heads, hd = cfg_.head_dim();
    // Kept bf16, q, k and v are made in s->dqkv (joined, their product made
    // in the staging first), turned, rounded, and read back widened there by
    // the attention, as its backward reads them; the softmax is made in
    // s->datt and rounded. Kept fp32, their product is made in s->dqkv.
    const std::span<float> qkv = a.qkv.made(s ? s->dqkv.span() : std::span<float>{});
    const auto [q, k, v] = qkv_parts(cfg_, qkv);
    project(c, cfg_, {q_.get(), k_.get(), v_.get()}, {q, k, v}, x, N, s,
            !s ? std::span<float>{} : a.qkv.is_bf16() ? staging(s) : s->dqkv.span());
    c.dev.rope_forward(c.stream, q, rope, B, T, H, hd, 0);
    c.dev.rope_forward(c.stream, k, rope, B, T, KV, hd, 0);
    a.qkv.keep_widened(c, qkv);
    const std::span<float> att = a.att.made(s ? s->datt.span() : std::span<float>{}), atty = a.atty.made(staging(s));
    if (a.flash)  // att: the rows' log-sum-exp, fp32
        c.dev.flash_gqa_forward(c.stream, atty, att, q, k, v, B, T, H, KV, hd);
    else
        c.dev.gqa_forward(c.stream, atty, att, q, k, v, B, T, H, KV, hd);
    a.att.keep(c, att);
    a.atty.keep(c, atty);
    o_->forward(c, out, a.atty.read(), N);
}

void LlamaAttention::backward(Context& c, std::span<float> dx, std::span<const float> dout, const device::ConstView& x,
                              LlamaBlockActivations& a, LlamaScratch& s, std::span<const float> rope, u64 B, u64 T) {
    BackwardScope scope(c.engine, *this);
    const u64 N = B * T, H = cfg_.heads, KV = cfg_.kv_heads, hd = cfg_.head_dim();
    // d atty lives in s.dbtc until attention's backward has read it; then
    // q_proj's backward writes dx, which may be the same buffer.
    o_->backward(c, s.dbtc, dout, a.atty.read(), N);
    // Flash: `att` is the log-sum-exp (fp32) and the output as kept is read
    // for its rows' dO . O (s.datt their delta).
    const Kept& second = a.flash ? a.atty : a.att;
    if (a.qkv.is_bf16() != second.is_bf16())
        throw InternalError("LlamaAttention: q/k/v and the softmax (or output) kept in two precisions");
    auto attention = [&]<class E>(std::span<const E> qkv, std::span<const E> att) {
        const auto [q, k, v] = qkv_parts(cfg_, qkv);
        if (a.flash)
            c.dev.flash_gqa_backward(c.stream, s.dq, s.dk, s.dv, s.datt, s.dbtc, q, k, v, att, a.att.f32.span(), B,
                                     T, H, KV, hd);
        else
            c.dev.gqa_backward(c.stream, s.dq, s.dk, s.dv, s.datt, s.dbtc, q, k, v, att, B, T, H, KV, hd);
    };
    if (a.qkv.is_bf16())
        attention(std::span<const std::uint16_t>(a.qkv.bf16), std::span<const std::uint16_t>(second.bf16));
    else
        attention(std::span<const float>(a.qkv.f32), std::span<const float>(second.f32));
    c.dev.rope_backward(c.stream, s.dq, rope, B, T, H, hd, 0);
    c.dev.rope_backward(c.stream, s.dk, rope, B, T, KV, hd, 0);
    // q, k and v are spent: kept fp32, their array takes dq, dk and dv side
    // by side; kept bf16, the staging does.
    project_backward(c, cfg_, {q_.get(), k_.get(), v_.get()}, {s.dq, s.dk, s.dv}, dx, x, N, s,
                     a.qkv.is_bf16() ? staging(&s) : a.qkv.f32.span());
}

void LlamaAttention::decode(Context& c, std::span<float> out, std::span<const float> x, std::span<float> q,
                            std::span<float> att, std::span<float> atty, std::span<float> k, std::span<float> v,
                            std::span<const float> rope, u64 pos) {
    ForwardScope scope(c.engine, *this);
    const u64 H = cfg_.heads, KV = cfg_.kv_heads, hd = cfg_.head_dim(), KC = KV * hd;
    const auto krow = k.subspan(pos * KC, KC);
    const device::ConstView in = x;
    q_->forward(c, q, in, 1);
    k_->forward(c, krow, in, 1);
    v_->forward(c, v.subspan(pos * KC, KC), in, 1);
    c.dev.rope_forward(c.stream, q, rope, 1, 1, H, hd, pos);
    c.dev.rope_forward(c.stream, krow, rope, 1, 1, KV, hd, pos);
    c.dev.gqa_decode(c.stream, atty, att.first(H * (pos + 1)), q, k.first((pos + 1) * KC), v.first((pos + 1) * KC),
                     pos + 1, H, KV, hd);
    o_->forward(c, out, device::ConstView(atty), 1);
}

// ---------------------------------------------------------------------------
LlamaMLP::LlamaMLP(ParamTable& t, const std::string& name, const Config& cfg) : Module(name), cfg_(cfg) {
    gate_ = torch_linear(t, name + ".gate_proj", cfg.hidden, cfg.ffn, cfg.tile);
    up_ = torch_linear(t, name + ".up_proj", cfg.hidden, cfg.ffn, cfg.tile);
    down_ = torch_linear(t, name + ".down_proj", cfg.ffn, cfg.hidden, cfg.tile);
}

// Kept bf16, gate and up are made a GEMM each in the staging and rounded
// into their halves, and SwiGLU reads them as kept (rounded) in both passes.
void LlamaMLP::forward(Context& c, std::span<float> out, const device::ConstView& x, LlamaBlockActivations& a, u64 N,
                       LlamaScratch* s) {
    ForwardScope scope(c.engine, *this);
    if (a.gate_up.is_bf16() != a.act.is_bf16())
        throw InternalError("LlamaMLP: its SwiGLU's inputs and output kept in two precisions");
    if (!a.gate_up.is_bf16()) {
        const auto gate = half(a.gate_up.f32.span(), 0), up = half(a.gate_up.f32.span(), 1);
        project(c, cfg_, {gate_.get(), up_.get()}, {gate, up}, x, N, s, s ? s->dgate_up.span() : std::span<float>{});
        c.dev.swiglu_forward(c.stream, a.act.f32.span(), gate, up);
    } else {
        const auto gate = half(a.gate_up.bf16.span(), 0), up = half(a.gate_up.bf16.span(), 1);
        const std::span<float> made = staging(s).first(gate.size());
        gate_->forward(c, made, x, N);
        c.dev.cast(c.stream, gate, made);
        up_->forward(c, made, x, N);
        c.dev.cast(c.stream, up, made);
        c.dev.swiglu_forward(c.stream, a.act.bf16.span(), gate, up);
    }
    if (out.empty()) return;  // a recompute: the backward reads the product, not out
    down_->forward(c, out, a.act.read(), N);
}

void LlamaMLP::backward(Context& c, std::span<float> dx, std::span<const float> dout, const device::ConstView& x,
                        LlamaBlockActivations& a, LlamaScratch& s, u64 N) {
    BackwardScope scope(c.engine, *this);
    down_->backward(c, s.dgate, dout, a.act.read(), N);  // d act; then d gate in place, d up
    if (a.gate_up.is_bf16())
        c.dev.swiglu_backward(c.stream, s.dgate, s.dup, s.dgate, half(a.gate_up.bf16.span(), 0),
                              half(a.gate_up.bf16.span(), 1));
    else
        c.dev.swiglu_backward(c.stream, s.dgate, s.dup, s.dgate, half(a.gate_up.f32.span(), 0),
                              half(a.gate_up.f32.span(), 1));
    // gate and up are spent: their array (fp32) takes d gate and d up side by side.
    project_backward(c, cfg_, {gate_.get(), up_.get()}, {s.dgate, s.dup}, dx, x, N, s, a.gate_up.f32);
}

// ---------------------------------------------------------------------------
LlamaBlock::LlamaBlock(ParamTable& t, u64 layer, const Config& cfg)
    : Module("model.layers." + std::to_string(layer)), cfg_(cfg) {
    const std::string p = name() + ".";
    const auto eps = static_cast<float>(cfg.norm_eps);
    ln_1_ = std::make_unique<RMSNorm>(t, p + "input_layernorm", cfg.hidden, eps);
    attn_ = std::make_unique<LlamaAttention>(t, p + "self_attn", cfg);
    ln_2_ = std::make_unique<RMSNorm>(t, p + "post_attention_layernorm", cfg.hidden, eps);
    mlp_ = std::make_unique<LlamaMLP>(t, p + "mlp", cfg);
}

void LlamaBlock::forward(Context& c, std::span<float> out, std::span<const float> x, LlamaBlockActivations& a,
                         std::span<const float> rope, u64 B, u64 T, LlamaScratch* s) {
    ForwardScope scope(c.engine, *this);
    const u64 N = B * T;
    const std::span<float> norm1 = a.norm1.made(staging(s));
    ln_1_->forward(c, norm1, a.rstd1, x, N);
    a.norm1.keep(c, norm1);
    // Kept bf16, res2 is made in s->dqkv (the attention is done with the
    // q, k, v product it joined there when o_proj writes it) and rounded
    // before its norm reads it back widened there, as its backward reads it;
    // fp32, the add and the norm in one pass (the same bits as the two).
    const std::span<float> res2 = a.res2.made(s ? s->dqkv.span() : std::span<float>{});
    attn_->forward(c, res2, a.norm1.read(), a, rope, B, T, s);
    const std::span<float> norm2 = a.norm2.made(staging(s));
    if (!a.res2.is_bf16()) {
        ln_2_->forward_residual(c, norm2, a.rstd2, res2, x, N);  // res2 = x + attn(norm1(x)), then its norm
    } else {
        c.dev.accumulate(c.stream, res2, x);
        a.res2.keep_widened(c, res2);
        ln_2_->forward(c, norm2, a.rstd2, res2, N);
    }
    a.norm2.keep(c, norm2);
    mlp_->forward(c, out, a.norm2.read(), a, N, s);
    if (out.empty()) return;
    c.dev.accumulate(c.stream, out, res2);  // out = res2 + mlp(norm2(res2))
}

void LlamaBlock::backward(Context& c, std::span<float> dres, std::span<const float> x, LlamaBlockActivations& a,
                          LlamaScratch& s, std::span<const float> rope, u64 B, u64 T,
                          std::span<float> recompute_out) {
    BackwardScope scope(c.engine, *this);
    // The recompute stops at the MLP's activation: the block's output (the
    // next checkpoint, already kept) is no input of its backward, so down_proj
    // and the residual add are not run again.
    if (!recompute_out.empty()) forward(c, {}, x, a, rope, B, T, &s);
    const u64 N = B * T;
    mlp_->backward(c, s.dbtc, dres, a.norm2.read(), a, s, N);
    ln_2_->backward(c, dres, s.dbtc, a.res2.read(), a.rstd2, N);
    attn_->backward(c, s.dbtc, dres, a.norm1.read(), a, s, rope, B, T);
    ln_1_->backward(c, dres, s.dbtc, device::ConstView(x), a.rstd1, N);
}

void LlamaBlock::decode(Context& c, std::span<float> out, std::span<const float> x, LlamaBlockActivations& a,
                        std::span<float> k, std::span<float> v, std::span<const float> rope, u64 pos) {
    ForwardScope scope(c.engine, *this);
    ln_1_->forward(c, a.norm1.f32, a.rstd1, x, 1);  // a decoder's buffers are fp32 (decode_state)
    attn_->decode(c, a.res2.f32, a.norm1.f32, qkv_parts(cfg_, a.qkv.f32.span())[0], a.att.f32, a.atty.f32, k, v,
                  rope, pos);
    ln_2_->forward_residual(c, a.norm2.f32, a.rstd2, a.res2.f32, x, 1);
    mlp_->forward(c, out, a.norm2.read(), a, 1);
    c.dev.accumulate(c.stream, out, a.res2.f32);
}

// ---------------------------------------------------------------------------
// The token embedding (no position table: the rotation carries positions).
class Llama::Embed : public Module {
public:
    Embed(ParamTable& t, const Config& cfg) : Module("model.embed_tokens"), cfg_(cfg) {
        w_ = declare(t, "model.embed_tokens.weight", {cfg.vocab, cfg.hidden});
    }
    void forward(Context& c, std::span<float> out, std::span<const std::int32_t> tokens, u64 B, u64 T) {
        ForwardScope scope(c.engine, *this);
        c.dev.embedding_forward(c.stream, out, tokens, c.engine.stored(*this, w_), {}, B, T, cfg_.hidden, cfg_.vocab);
    }
    void backward(Context& c, std::span<const float> dout, std::span<const std::int32_t> tokens, u64 B, u64 T) {
        BackwardScope scope(c.engine, *this);
        c.dev.embedding_backward(c.stream, c.engine.grad(*this, w_), {}, dout, tokens, B, T, cfg_.hidden, cfg_.vocab);
    }
    std::size_t weight() const { return w_; }

private:
    Config cfg_;
    std::size_t w_ = 0;
};

// logits (N,V) = x (N,C) @ W^T, W (V,C): lm_head.weight, or the embedding's when tied.
class Llama::Head : public Module {
public:
    Head(ParamTable& t, const Config& cfg, std::size_t embed) : Module("lm_head"), cfg_(cfg) {
        if (cfg.tied) {
            w_ = embed;
            use_external(embed);
            t.add_user(this);
        } else {
            w_ = declare(t, "lm_head.weight", {cfg.vocab, cfg.hidden});
        }
    }
    // Rows of the logits (and of their gradient) `ld` apart: padded_vocab(V)
    // in training, V for the decoder's one row.
    // logits fp32, or bf16 (Activations::logits_bf16).
    void forward(Context& c, const device::View& logits, std::span<const float> x, u64 N, u64 ld) {
        ForwardScope scope(c.engine, *this);
        c.gemm(Gemm{.tb = true, .m = N, .n = cfg_.vocab, .k = cfg_.hidden, .ldc = ld}, x, c.engine.stored(*this, w_),
               logits);
    }
    void backward(Context& c, std::span<float> dx, const device::ConstView& dlogits, std::span<const float> x, u64 N,
                  u64 ld) {
        BackwardScope scope(c.engine, *this);
        c.gemm(Gemm{.m = N, .n = cfg_.hidden, .k = cfg_.vocab, .lda = ld}, dlogits, c.engine.stored(*this, w_), dx);
        c.gemm(Gemm{.ta = true, .m = cfg_.vocab, .n = cfg_.hidden, .k = N, .lda = ld, .beta = 1}, dlogits, x,
               c.engine.grad(*this, w_));
    }

private:
    Config cfg_;
    std::size_t w_ = 0;
};

Llama::Llama(const Config& cfg) : LanguageModel("llama"), cfg_(cfg), table_(cfg) {
    if (shard::family(cfg.arch).modules != shard::Modules::llama)
        throw InternalError("Llama: the config is not a Llama-shaped family's");
    if (!cfg.layers || !cfg.hidden || !cfg.heads || !cfg.kv_heads || !cfg.ffn || !cfg.vocab || !cfg.max_seq ||
        cfg.hidden % cfg.heads || cfg.heads % cfg.kv_heads || cfg.head_dim() % 2)
        throw UsageError("Llama: layers, hidden, heads, kv_heads, ffn, vocab and seq must be positive, hidden a "
                         "multiple of heads with an even head size, heads a multiple of kv_heads");
    embed_ = std::make_unique<Embed>(table_, cfg);
    for (u64 l = 0; l < cfg.layers; ++l) blocks_.push_back(std::make_unique<LlamaBlock>(table_, l, cfg));
    norm_ = std::make_unique<RMSNorm>(table_, "model.norm", cfg.hidden, static_cast<float>(cfg.norm_eps));
    head_ = std::make_unique<Head>(table_, cfg, embed_->weight());
    for (const auto& p : table_.all())
        if (!p.owner) throw InternalError("parameter " + p.name + " has no module");
}

Llama::~Llama() = default;

Activations Llama::plan(device::Device& dev, const Shape& shape) const { return plan_on(&dev, shape, nullptr); }

std::uint64_t Llama::plan_bytes(const Shape& shape) const {
    std::uint64_t arena = 0;
    plan_on(nullptr, shape, &arena);
    return arena;
}

namespace {

// One block's buffers for N rows of B x T, taken by `f` (fp32) and `kept`
// (what the block keeps as Shape::activations says: Kept).
template <class F, class K>
LlamaBlockActivations block_buffers(const Config& cfg, u64 B, u64 T, F&& f, K&& kept, bool flash = false) {
    const u64 N = B * T, C = cfg.hidden, hd = cfg.head_dim(), QC = cfg.heads * hd, KC = cfg.kv_heads * hd;
    LlamaBlockActivations b;
    b.norm1 = kept(N * C, "input_layernorm");
    b.rstd1 = f(N, "input_layernorm rstd");
    b.qkv = kept(N * (QC + 2 * KC), "q, k, v");
    b.flash = flash;
    b.att = flash ? Kept{.f32 = f(B * cfg.heads * T, "attention log-sum-exp")} : kept(B * cfg.heads * T * T, "attention");
    b.atty = kept(N * QC, "attention output");
    b.res2 = kept(N * C, "residual 2");
    b.norm2 = kept(N * C, "post_attention_layernorm");
    b.rstd2 = f(N, "post_attention_layernorm rstd");
    b.gate_up = kept(2 * N * cfg.ffn, "gate, up");
    b.act = kept(N * cfg.ffn, "swiglu");
    return b;
}

// The same, every buffer fp32 (the decoder's).
template <class F>
LlamaBlockActivations block_buffers(const Config& cfg, u64 B, u64 T, F&& f) {
    return block_buffers(cfg, B, T, f, [&](u64 n, const char* what) { return Kept{.f32 = f(n, what)}; });
}

}  // namespace

Activations Llama::plan_on(device::Device* dev, const Shape& shape, std::uint64_t* arena) const {
    const u64 B = shape.batch, T = shape.seq, C = cfg_.hidden, V = cfg_.vocab, hd = cfg_.head_dim();
    if (!B || !T) throw UsageError("batch and sequence length must be positive");
    if (T > cfg_.max_seq)
        throw UsageError("sequence length " + std::to_string(T) + " is longer than the model's " +
                         std::to_string(cfg_.max_seq) + " positions");
    const u64 N = B * T;
    Activations a;
    a.shape = shape;
    auto own = std::make_unique<LlamaBuffers>();
    auto take = [&]<class E>(u64 n, const char* what) {
        a.bytes += n * sizeof(E);
        if (arena) *arena += align_up(std::max<u64>(n * sizeof(E), 1), mem::kArenaAlignment);
        return dev ? dev->alloc<E>(n, what) : device::Array<E>{};
    };
    auto f = [&](u64 n, const char* what) { return take.template operator()<float>(n, what); };
    a.inputs = take.template operator()<std::int32_t>(N, "inputs");
    a.targets = take.template operator()<std::int32_t>(N, "targets");
    checkpoints::plan(a, shape, cfg_.layers, N * C, take);
    const u64 sets = shape.checkpoint ? 1 : cfg_.layers;
    const bool bf16 = shape.activations == device::Precision::bf16;
    auto kept = [&](u64 n, const char* what) { return checkpoints::kept(take, bf16, n, what); };
    const bool flash = shape.attention == Attention::flash;
    for (u64 l = 0; l < sets; ++l) own->blocks.push_back(block_buffers(cfg_, B, T, f, kept, flash));
    const u64 QC = cfg_.heads * hd, KC = cfg_.kv_heads * hd;
    own->scratch.dbtc = f(N * C, "d (N,C)");
    own->scratch.dqkv = f(N * (QC + 2 * KC), "d q, k, v");
    const auto [dq, dk, dv] = qkv_parts(cfg_, own->scratch.dqkv.span());
    own->scratch.dq = dq;
    own->scratch.dk = dk;
    own->scratch.dv = dv;
    own->scratch.datt = f(B * cfg_.heads * T * (flash ? 1 : T), "d attention");
    // Gate and up kept bf16 are not joined, nor a Qwen2's q, k and v (biased: `joined`).
    const bool qkv_joined = !cfg_.qkv_bias() && joined_projections(cfg_, QC + 2 * KC);
    u64 joined = 0;
    for (const u64 outs : {qkv_joined ? QC + 2 * KC : u64{0}, bf16 ? u64{0} : 2 * cfg_.ffn})
        if (outs && joined_projections(cfg_, outs)) joined = std::max(joined, outs * C);
    if (joined) own->scratch.joined = f(2 * joined, "joined projections' weights, gradients");
    // bf16: also the staging of the (N,C) and (N,F) values kept bf16, and of
    // q, k and v's joined product and gradients (their array is bf16).
    const u64 qkv_rows = bf16 && qkv_joined ? QC + 2 * KC : 0;
    own->scratch.dgate_up = f(N * std::max({2 * cfg_.ffn, bf16 ? C : 0, qkv_rows}), "d gate, up");
    own->scratch.dgate = own->scratch.dgate_up.span().first(N * cfg_.ffn);
    own->scratch.dup = own->scratch.dgate_up.span().subspan(N * cfg_.ffn);
    own->rope = f(T * hd, "rope table");
    own->norm = f(N * C, "model.norm");
    own->norm_rstd = f(N, "model.norm rstd");
    if (bf16)
        a.logits_bf16 = take.template operator()<std::uint16_t>(N * padded_vocab(V), "logits");
    else
        a.logits = f(N * padded_vocab(V), "logits");
    a.losses = f(N, "losses");
    a.dres = f(N * C, "d residual");
    if (dev) {
        const std::vector<float> table = rope_table(cfg_, T);
        dev->copy(dev->compute(), std::as_writable_bytes(own->rope.span()), std::as_bytes(std::span(table)));
        dev->synchronize(dev->compute());
    }
    a.own = std::move(own);
    return a;
}

void Llama::forward(Context& c, Activations& a, bool for_backward) {
    ForwardScope scope(c.engine, *this);
    LlamaBuffers& own = buffers(a);
    const u64 B = a.shape.batch, T = a.shape.seq, N = B * T;
    const std::span<const float> x = checkpoints::forward(
        c, a, cfg_, for_backward, "Llama", [&](std::span<float> out) { embed_->forward(c, out, a.inputs, B, T); },
        [&](u64 l, std::span<float> out, std::span<const float> in) {
            blocks_[l]->forward(c, out, in, own.blocks[a.shape.checkpoint ? 0 : l], own.rope, B, T, &own.scratch);
        });
    norm_->forward(c, own.norm, own.norm_rstd, x, N);
    const device::View logits = a.logits_view();
    head_->forward(c, logits, own.norm, N, padded_vocab(cfg_.vocab));
    if (for_backward)
        c.dev.crossentropy_forward_backward(c.stream, a.losses, logits, a.targets, 1.0f / static_cast<float>(N), N,
                                            cfg_.vocab, padded_vocab(cfg_.vocab));
    else
        c.dev.crossentropy_forward(c.stream, a.losses, logits, a.targets, N, cfg_.vocab, padded_vocab(cfg_.vocab));
}

void Llama::backward(Context& c, Activations& a) {
    BackwardScope scope(c.engine, *this);
    LlamaBuffers& own = buffers(a);
    const u64 B = a.shape.batch, T = a.shape.seq, N = B * T;
    head_->backward(c, own.scratch.dbtc, a.logits_view(), own.norm, N, padded_vocab(cfg_.vocab));
    c.dev.zero(c.stream, a.dres);
    norm_->backward(c, a.dres, own.scratch.dbtc, device::ConstView(checkpoints::last(c, a, cfg_)), own.norm_rstd,
                    N);
    checkpoints::backward(c, a, cfg_, own.scratch.dbtc, [&](u64 l, std::span<const float> x, std::span<float> rec) {
        blocks_[l]->backward(c, a.dres, x, own.blocks[a.shape.checkpoint ? 0 : l], own.scratch, own.rope, B, T, rec);
    });
    embed_->backward(c, a.dres, a.inputs, B, T);
}

double Llama::flops_per_step(u64 B, u64 T) const {
    // The input embedding is a lookup; when tied, the same table is the head's weight.
    const double N = static_cast<double>(B * T);
    const double weights = static_cast<double>(table_.numel() - (cfg_.tied ? 0 : cfg_.vocab * cfg_.hidden));
    return 6.0 * weights * N + 6.0 * static_cast<double>(cfg_.layers * B * cfg_.heads * cfg_.head_dim()) *
                                   static_cast<double>(T) * static_cast<double>(T + 1);
}

// ---------------------------------------------------------------------------
namespace {

// Every buffer of a decoder of n positions, in the order decode_state takes
// them (one position's att (H) made and replaced by the (H, n) row).
template <class F>
void decode_plan(const Config& cfg, u64 n, F&& f) {
    const u64 KC = cfg.kv_heads * cfg.head_dim();
    for (u64 l = 0; l < cfg.layers; ++l) {
        f(n * KC, "key cache");
        f(n * KC, "value cache");
    }
    block_buffers(cfg, 1, 1, f);
    f(cfg.heads * n, "attention");
    for (u64 c : {cfg.hidden, cfg.hidden, cfg.hidden, u64{1}, n * cfg.head_dim()}) f(c, "decoder");
}

}  // namespace

std::uint64_t Llama::decode_bytes(u64 positions) const {
    u64 bytes = 0;
    decode_plan(cfg_, positions, [&](u64 count, const char*) {
        bytes += align_up(std::max<u64>(count * 4, 1), mem::kArenaAlignment);
        return device::Array<float>{};
    });
    return bytes;
}

std::unique_ptr<LanguageModel::DecodeState> Llama::decode_state(device::Device& dev, u64 positions) const {
    if (positions == 0 || positions > cfg_.max_seq)
        throw UsageError("the decoder's positions must be 1 to the model's " + std::to_string(cfg_.max_seq) +
                         ", not " + std::to_string(positions));
    auto st = std::make_unique<LlamaDecodeState>();
    auto f = [&](u64 count, const char* what) { return dev.alloc<float>(count, what); };
    st->cache.positions = positions;
    for (u64 l = 0; l < cfg_.layers; ++l) {
        const u64 KC = cfg_.kv_heads * cfg_.head_dim();
        st->cache.k.push_back(f(positions * KC, "key cache"));
        st->cache.v.push_back(f(positions * KC, "value cache"));
    }
    st->one = block_buffers(cfg_, 1, 1, f);
    st->one.att.f32 = f(cfg_.heads * positions, "attention");
    st->x = f(cfg_.hidden, "x");
    st->out = f(cfg_.hidden, "block output");
    st->norm = f(cfg_.hidden, "model.norm");
    st->rstd = f(1, "rstd");
    st->rope = f(positions * cfg_.head_dim(), "rope table");
    const std::vector<float> table = rope_table(cfg_, positions);
    dev.copy(dev.compute(), std::as_writable_bytes(st->rope.span()), std::as_bytes(std::span(table)));
    dev.synchronize(dev.compute());
    return st;
}

void Llama::decode(Context& c, DecodeState& state, std::span<const std::int32_t> token, u64 pos,
                   std::span<float> logits) {
    LlamaDecodeState& st = decode_buffers(state);
    if (pos >= st.cache.positions)
        throw UsageError("the decoder's " + std::to_string(st.cache.positions) + " positions are all used");
    ForwardScope scope(c.engine, *this);
    embed_->forward(c, st.x, token, 1, 1);
    for (u64 l = 0; l < cfg_.layers; ++l) {
        blocks_[l]->decode(c, st.out, st.x, st.one, st.cache.k[l], st.cache.v[l], st.rope, pos);
        std::swap(st.x, st.out);
    }
    norm_->forward(c, st.norm, st.rstd, st.x, 1);
    head_->forward(c, logits, st.norm, 1, cfg_.vocab);  // one row: no pad
}

}  // namespace zinf::model
