// The cached forward (sample.hpp): the GPT's modules found by their
// parameters' names (zinf-shard's, which the model declares), each run
// between the engine's hooks with the kernels the training forward uses, on
// one row: the new position. Attention reads the layer's key-value cache.
#include <zinf/family.hpp>
#include <zinf/gpt.hpp>
#include <zinf/llama.hpp>
#include <zinf/sample.hpp>

#include <algorithm>
#include <map>

namespace zinf::sample {

using device::Gemm;

namespace {

// A module's forward between the engine's hooks (model::ForwardScope for a
// zero::Module, as the decoder finds the modules through the parameters).
class Scope {
public:
    Scope(zero::ParamEngine& e, const zero::Module& m) : e_(e), m_(m) { e_.before_forward(m_); }
    ~Scope() noexcept(false) { if (!std::uncaught_exceptions()) e_.after_forward(m_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
private:
    zero::ParamEngine& e_;
    const zero::Module& m_;
};

// A linear layer: the module holding the bias (a Linear, or the TiledLinear
// around its tiles) and its weight's column tiles (one, the module itself,
// when untiled).
struct Lin {
    const zero::Module* mod = nullptr;
    std::size_t bias = 0;
    struct Tile {
        const zero::Module* mod;
        std::size_t w;
        std::uint64_t c0, c1;
    };
    std::vector<Tile> tiles;
    std::uint64_t in = 0, out = 0;
};

struct Norm {
    const zero::Module* mod = nullptr;
    std::size_t w = 0, b = 0;
};

struct Layer {
    Norm ln_1, ln_2;
    Lin c_attn, attn_proj, c_fc, mlp_proj;
    device::Array<float> k, v;  // (positions, C) each: the cache
};

}  // namespace

struct Decoder::Impl {
    model::Config cfg;
    device::Device& dev;
    std::uint64_t positions = 0, pos = 0;
    std::size_t wte = 0, wpe = 0;
    const zero::Module* embedding = nullptr;
    const zero::Module* head = nullptr;
    Norm ln_f;
    std::vector<Layer> layers;
    std::vector<std::int32_t> tokens;  // host: each position's token, the copy's source
    // One position's activations.
    device::Array<std::int32_t> token;                 // (1)
    device::Array<float> x, out, res2, ln, mean, rstd;  // (C), (C), (C), (C), (1), (1)
    device::Array<float> qkv, atty, att;                // (3C), (C), (NH, positions)
    device::Array<float> fch, fch_gelu, logits;         // (4C), (4C), (V)

    // A Llama runs its own one-position forward with its own cache.
    model::Llama* llama = nullptr;
    std::unique_ptr<model::LlamaDecodeState> state;

    Impl(const model::GPT& gpt, device::Device& d, std::uint64_t n);
    Impl(model::Llama& m, device::Device& d, std::uint64_t n);
    void linear(device::Stream& s, zero::ParamEngine& e, const Lin& l, std::span<float> y, std::span<const float> xin);
    void norm(device::Stream& s, zero::ParamEngine& e, const Norm& n, std::span<float> y, std::span<const float> xin);
};

namespace {

// Every allocation the decoder makes, in one place: with a device they are
// made, without one only their arena bytes are added up.
template <class F>
void plan(const model::Config& c, std::uint64_t n, F&& take) {
    const std::uint64_t C = c.hidden;
    for (std::uint64_t l = 0; l < c.layers; ++l) {
        take(n * C, "key cache");
        take(n * C, "value cache");
    }
    take(1, "token");
    for (const char* what : {"x", "block output", "residual 2", "layernorm"}) take(C, what);
    take(1, "mean");
    take(1, "rstd");
    take(3 * C, "qkv");
    take(C, "attention output");
    take(c.heads * n, "attention");
    take(4 * C, "fc");
    take(4 * C, "gelu");
    take(c.vocab, "logits");
}

}  // namespace

std::uint64_t Decoder::device_bytes(const model::Config& c, std::uint64_t positions) {
    if (shard::family(c.arch).modules == shard::Modules::llama)  // the state, the token and the logits
        return model::Llama::decode_bytes(c, positions) + align_up(4, mem::kArenaAlignment) +
               align_up(c.vocab * 4, mem::kArenaAlignment);
    std::uint64_t bytes = 0;
    plan(c, positions, [&](std::uint64_t count, const char*) {
        bytes += align_up(std::max<std::uint64_t>(count * 4, 1), mem::kArenaAlignment);
    });
    return bytes;
}

Decoder::Impl::Impl(const model::GPT& gpt, device::Device& d, std::uint64_t n)
    : cfg(gpt.config()), dev(d), positions(n) {
    if (n == 0 || n > cfg.max_seq)
        throw UsageError("the decoder's positions must be 1 to the model's " + std::to_string(cfg.max_seq) + ", not " +
                         std::to_string(n));
    const auto& table = gpt.params_table();
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i = 0; i < table.size(); ++i) by_name[table[i].name] = i;
    auto param = [&](const std::string& name) {
        const auto it = by_name.find(name);
        if (it == by_name.end()) throw InternalError("decoder: the model has no parameter " + name);
        return it->second;
    };
    auto owner = [&](std::size_t i) -> const zero::Module* { return table[i].owner; };
    auto linear = [&](const std::string& name, std::uint64_t in, std::uint64_t cols) {
        Lin l;
        l.in = in;
        l.out = cols;
        l.bias = param(name + ".bias");
        l.mod = owner(l.bias);
        if (const auto it = by_name.find(name + ".weight"); it != by_name.end()) {
            l.tiles.push_back({owner(it->second), it->second, 0, cols});
            return l;
        }
        std::uint64_t c0 = 0;
        for (unsigned k = 0;; ++k) {  // "<name>.weight.tile<k>" (in, c1-c0), in column order
            const auto it = by_name.find(shard::tile_name(name + ".weight", k));
            if (it == by_name.end()) break;
            const std::uint64_t w = table[it->second].shape.at(1);
            l.tiles.push_back({owner(it->second), it->second, c0, c0 + w});
            c0 += w;
        }
        if (l.tiles.empty() || c0 != cols) throw InternalError("decoder: the weight tiles of " + name + " do not cover it");
        return l;
    };
    auto norm = [&](const std::string& name) {
        Norm m;
        m.w = param(name + ".weight");
        m.b = param(name + ".bias");
        m.mod = owner(m.w);
        return m;
    };
    wte = param("wte.weight");
    wpe = param("wpe.weight");
    embedding = owner(wte);
    for (const zero::Module* m : gpt.modules())
        if (m->uses(wte) && m != embedding) head = m;
    if (!head) throw InternalError("decoder: no module uses wte.weight as the output head");
    ln_f = norm("ln_f");

    const std::uint64_t C = cfg.hidden;
    std::vector<device::Array<float>> arrays;
    plan(cfg, n, [&](std::uint64_t count, const char* what) {
        if (std::string_view(what) == "token") token = dev.alloc<std::int32_t>(count, what);
        else arrays.push_back(dev.alloc<float>(count, what));
    });
    auto next = arrays.begin();
    for (std::uint64_t l = 0; l < cfg.layers; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        Layer L;
        L.ln_1 = norm(h + "ln_1");
        L.ln_2 = norm(h + "ln_2");
        L.c_attn = linear(h + "attn.c_attn", C, 3 * C);
        L.attn_proj = linear(h + "attn.c_proj", C, C);
        L.c_fc = linear(h + "mlp.c_fc", C, 4 * C);
        L.mlp_proj = linear(h + "mlp.c_proj", 4 * C, C);
        L.k = std::move(*next++);
        L.v = std::move(*next++);
        layers.push_back(std::move(L));
    }
    for (auto* a : {&x, &out, &res2, &ln, &mean, &rstd, &qkv, &atty, &att, &fch, &fch_gelu, &logits})
        *a = std::move(*next++);
    tokens.assign(n, 0);
}

// Linear::forward and TiledLinear::forward on one row.
void Decoder::Impl::linear(device::Stream& s, zero::ParamEngine& e, const Lin& l, std::span<float> y,
                           std::span<const float> xin) {
    Scope scope(e, *l.mod);
    for (const auto& t : l.tiles) {
        if (t.mod == l.mod) {
            dev.gemm(s, Gemm{.m = 1, .n = l.out, .k = l.in}, xin, e.weight(*t.mod, t.w), y);
            continue;
        }
        Scope tile(e, *t.mod);
        dev.gemm(s, Gemm{.m = 1, .n = t.c1 - t.c0, .k = l.in, .ldc = l.out}, xin, e.weight(*t.mod, t.w),
                 y.subspan(t.c0));
    }
    dev.bias_add(s, y, e.weight(*l.mod, l.bias), 1, l.out);
}

void Decoder::Impl::norm(device::Stream& s, zero::ParamEngine& e, const Norm& n, std::span<float> y,
                         std::span<const float> xin) {
    Scope scope(e, *n.mod);
    dev.layernorm_forward(s, y, mean, rstd, xin, e.weight(*n.mod, n.w), e.weight(*n.mod, n.b), 1, cfg.hidden);
}

Decoder::Impl::Impl(model::Llama& m, device::Device& d, std::uint64_t n)
    : cfg(m.config()), dev(d), positions(n), llama(&m) {
    state = m.decode_state(d, n);  // refuses n outside 1..max_seq
    token = dev.alloc<std::int32_t>(1, "token");
    logits = dev.alloc<float>(cfg.vocab, "logits");
    tokens.assign(n, 0);
}

Decoder::Decoder(model::LanguageModel& m, device::Device& dev, std::uint64_t positions) {
    if (auto* l = dynamic_cast<model::Llama*>(&m)) impl_ = std::make_unique<Impl>(*l, dev, positions);
    else if (auto* g = dynamic_cast<model::GPT*>(&m)) impl_ = std::make_unique<Impl>(*g, dev, positions);
    else throw InternalError("decoder: a model neither a GPT nor a Llama");
}

Decoder::~Decoder() = default;

std::uint64_t Decoder::vocab() const { return impl_->cfg.vocab; }
std::uint64_t Decoder::positions() const { return impl_->positions; }
std::uint64_t Decoder::position() const { return impl_->pos; }
void Decoder::reset() { impl_->pos = 0; }

// Block::forward, GPT::forward's ln_f and LMHead::forward for the row at
// position p; the cache holds the keys and values of rows 0..p-1.
void Decoder::step(device::Stream& s, zero::ParamEngine& e, std::int32_t tok, std::span<float> logits_host) {
    Impl& I = *impl_;
    auto& dev = I.dev;
    const std::uint64_t C = I.cfg.hidden, V = I.cfg.vocab, NH = I.cfg.heads, p = I.pos;
    if (p >= I.positions)
        throw UsageError("the decoder's " + std::to_string(I.positions) + " positions are all used");
    if (logits_host.size() < V) throw InternalError("decoder: the logits need " + std::to_string(V) + " floats");
    I.tokens[p] = tok;
    dev.copy(s, std::as_writable_bytes(I.token.span()), std::as_bytes(std::span(I.tokens).subspan(p, 1)));
    if (I.llama) {  // the model's own blocks, through the same hooks
        model::Context ctx{dev, s, e};
        I.llama->decode(ctx, *I.state, I.token, p, I.logits);
        dev.copy(s, std::as_writable_bytes(logits_host.first(V)), std::as_bytes(I.logits.span()));
        ++I.pos;
        return;
    }
    {
        Scope scope(e, *I.embedding);  // x = wte[tok] + wpe[p]
        dev.embedding_forward(s, I.x, I.token, e.weight(*I.embedding, I.wte),
                              e.weight(*I.embedding, I.wpe).subspan(p * C), 1, 1, C, V);
    }
    const std::span<float> qkv = I.qkv;
    for (auto& L : I.layers) {
        I.norm(s, e, L.ln_1, I.ln, I.x);
        I.linear(s, e, L.c_attn, qkv, I.ln);
        dev.copy(s, std::as_writable_bytes(L.k.span().subspan(p * C, C)), std::as_bytes(qkv.subspan(C, C)));
        dev.copy(s, std::as_writable_bytes(L.v.span().subspan(p * C, C)), std::as_bytes(qkv.subspan(2 * C, C)));
        dev.attention_decode(s, I.atty, I.att.span().first(NH * (p + 1)), qkv.first(C), L.k.span().first((p + 1) * C),
                             L.v.span().first((p + 1) * C), p + 1, C, NH);
        I.linear(s, e, L.attn_proj, I.res2, I.atty);
        dev.accumulate(s, I.res2, I.x);  // res2 = x + attn(ln_1(x))
        I.norm(s, e, L.ln_2, I.ln, I.res2);
        I.linear(s, e, L.c_fc, I.fch, I.ln);
        dev.gelu_forward(s, I.fch_gelu, I.fch);
        I.linear(s, e, L.mlp_proj, I.out, I.fch_gelu);
        dev.accumulate(s, I.out, I.res2);  // out = res2 + mlp(ln_2(res2))
        std::swap(I.x, I.out);
    }
    I.norm(s, e, I.ln_f, I.ln, I.x);
    {
        Scope scope(e, *I.head);  // logits (V) = x (C) @ wte^T, wte stored (V,C)
        dev.gemm(s, Gemm{.tb = true, .m = 1, .n = V, .k = C}, I.ln, e.weight(*I.head, I.wte), I.logits);
    }
    dev.copy(s, std::as_writable_bytes(logits_host.first(V)), std::as_bytes(I.logits.span()));
    ++I.pos;
}

}  // namespace zinf::sample
