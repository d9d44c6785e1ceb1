// The linear layer both families use (model.hpp): its weight whole, or in
// tiles along its outputs, each tile a module of its own (memory-centric
// tiling), in Conv1D's (in, out) layout or nn.Linear's (out, in).
#include <zinf/model.hpp>

namespace zinf::model {

using device::Gemm;
using u64 = std::uint64_t;

// One tile: a module of its own, so the engine's hooks see it alone. Its
// weight holds outputs [f0, f1): columns of a Conv1D weight, rows of an
// nn.Linear one.
struct Linear::Tile : Module {
    Tile(ParamTable& t, const std::string& name, unsigned k, const std::vector<u64>& shape, u64 f0_, u64 f1_)
        : Module(shard::tile_name(name, k)), f0(f0_), f1(f1_) {
        w = declare(t, shard::tile_name(name + ".weight", k), shape);
    }
    u64 f0, f1;
    std::size_t w;
};

Linear::Linear(ParamTable& t, const std::string& name, u64 in_, u64 out_, unsigned tiles, Layout layout, bool bias)
    : Module(name), layout_(layout) {
    in = in_;
    out = out_;
    const bool rows = layout == Layout::out_in;
    if (tiles <= 1) {
        // Untiled: the one weight is this module's (see forward).
        w_whole_ = declare(t, name + ".weight", rows ? std::vector<u64>{out, in} : std::vector<u64>{in, out});
    } else {
        // The split zinf-shard lays out: tile k holds outputs [tile_first(out,k), tile_first(out,k+1)).
        for (unsigned k = 0; k < tiles; ++k) {
            const u64 f0 = shard::tile_first(out, k, tiles), f1 = shard::tile_first(out, k + 1, tiles);
            tiles_.push_back(std::make_unique<Tile>(t, name, k, rows ? std::vector<u64>{f1 - f0, in}
                                                                     : std::vector<u64>{in, f1 - f0},
                                                    f0, f1));
        }
    }
    if (bias) b_ = declare(t, name + ".bias", {out});
}

Linear::~Linear() = default;

std::size_t Linear::weight_param() const {
    if (tiled()) throw InternalError("Linear " + name() + ": a tiled weight is no one parameter");
    return w_whole_;
}

namespace {

// `v` past its first `n` elements, in its own element type.
device::View skip(const device::View& v, std::size_t n) {
    if (v.is_bf16()) return v.span<std::uint16_t>().subspan(n);
    return v.span<float>().subspan(n);
}

}  // namespace

void Linear::forward(Context& c, const device::View& y, const device::ConstView& x, u64 N) {
    ForwardScope scope(c.engine, *this);
    // y (N,out) = x (N,in) @ W (in,out) (+ b), or x @ W^T for W (out,in)
    const bool rows = layout_ == Layout::out_in;
    const std::span<const float> bias = b_ ? c.engine.weight(*this, *b_) : std::span<const float>{};
    if (tiles_.empty()) {
        const Gemm g{.tb = rows, .m = N, .n = out, .k = in};
        if (b_)
            c.gemm_bias(g, x, c.engine.stored(*this, w_whole_), bias, y);
        else
            c.gemm(g, x, c.engine.stored(*this, w_whole_), y);
        return;
    }
    for (auto& tp : tiles_) {
        Tile& t = *tp;
        ForwardScope tile_scope(c.engine, t);
        // y[:, f0:f1] (N, f1-f0) = x @ W_k (or W_k^T) (+ b[f0:f1]), rows of y `out` apart
        const Gemm g{.tb = rows, .m = N, .n = t.f1 - t.f0, .k = in, .ldc = out};
        if (b_)
            c.gemm_bias(g, x, c.engine.stored(t, t.w), bias.subspan(t.f0, t.f1 - t.f0), skip(y, t.f0));
        else
            c.gemm(g, x, c.engine.stored(t, t.w), skip(y, t.f0));
    }
}

void Linear::forward_gelu(Context& c, const device::View& pre, const device::View& act, const device::ConstView& x,
                          u64 N) {
    if (!b_) throw InternalError("Linear " + name() + ": forward_gelu needs a bias");
    ForwardScope scope(c.engine, *this);
    const bool rows = layout_ == Layout::out_in;
    const std::span<const float> bias = c.engine.weight(*this, *b_);
    if (tiles_.empty()) {
        c.gemm_bias_gelu(Gemm{.tb = rows, .m = N, .n = out, .k = in}, x, c.engine.stored(*this, w_whole_), bias, pre,
                         act);
        return;
    }
    for (auto& tp : tiles_) {
        Tile& t = *tp;
        ForwardScope tile_scope(c.engine, t);
        c.gemm_bias_gelu(Gemm{.tb = rows, .m = N, .n = t.f1 - t.f0, .k = in, .ldc = out}, x, c.engine.stored(t, t.w),
                         bias.subspan(t.f0, t.f1 - t.f0), skip(pre, t.f0), skip(act, t.f0));
    }
}

void Linear::backward(Context& c, std::span<float> dx, std::span<const float> dy, const device::ConstView& x, u64 N,
                      bool accumulate) {
    BackwardScope scope(c.engine, *this);
    const bool rows = layout_ == Layout::out_in;
    const std::span<float> db = b_ ? c.engine.grad(*this, *b_) : std::span<float>{};
    // dW += ..., and with a bias db += the sum over rows of dy (in the GEMM's
    // epilogue: gemm_dbias, dy being nn.Linear's A or Conv1D's B).
    auto weight_grad = [&](const Gemm& g, const device::ConstView& a, const device::ConstView& b, std::span<float> dw,
                           std::span<float> dbias) {
        if (b_)
            c.gemm_dbias(g, a, b, dw, dbias, rows);
        else
            c.gemm(g, a, b, dw);
    };
    if (tiles_.empty()) {
        const float beta = accumulate ? 1.0f : 0.0f;
        if (rows) {  // dx (N,in) (+)= dy (N,out) @ W (out,in); dW (out,in) += dy^T @ x
            c.gemm(Gemm{.m = N, .n = in, .k = out, .beta = beta}, dy, c.engine.stored(*this, w_whole_), dx);
            weight_grad(Gemm{.ta = true, .m = out, .n = in, .k = N, .beta = 1}, dy, x, c.engine.grad(*this, w_whole_),
                        db);
        } else {  // dx (N,in) (+)= dy (N,out) @ W^T; dW (in,out) += x^T @ dy
            c.gemm(Gemm{.tb = true, .m = N, .n = in, .k = out, .beta = beta}, dy, c.engine.stored(*this, w_whole_), dx);
            weight_grad(Gemm{.ta = true, .m = in, .n = out, .k = N, .beta = 1}, x, device::ConstView(dy),
                        c.engine.grad(*this, w_whole_), db);
        }
        return;
    }
    for (std::size_t k = 0; k < tiles_.size(); ++k) {
        Tile& t = *tiles_[k];
        BackwardScope tile_scope(c.engine, t);
        const u64 w = t.f1 - t.f0;
        const float beta = (k || accumulate) ? 1.0f : 0.0f;
        const std::span<const float> dyk = dy.subspan(t.f0);  // (N, w), rows `out` apart
        const std::span<float> dbk = b_ ? db.subspan(t.f0, w) : std::span<float>{};
        if (rows) {  // dx (+)= dy_k @ W_k (w,in); dW_k (w,in) += dy_k^T @ x
            c.gemm(Gemm{.m = N, .n = in, .k = w, .lda = out, .beta = beta}, dyk, c.engine.stored(t, t.w), dx);
            weight_grad(Gemm{.ta = true, .m = w, .n = in, .k = N, .lda = out, .beta = 1}, dyk, x, c.engine.grad(t, t.w),
                        dbk);
        } else {  // dx (+)= dy_k @ W_k^T, W_k (in,w); dW_k (in,w) += x^T @ dy_k
            c.gemm(Gemm{.tb = true, .m = N, .n = in, .k = w, .lda = out, .beta = beta}, dyk, c.engine.stored(t, t.w),
                   dx);
            weight_grad(Gemm{.ta = true, .m = in, .n = w, .k = N, .ldb = out, .beta = 1}, x, device::ConstView(dyk),
                        c.engine.grad(t, t.w), dbk);
        }
    }
}

}  // namespace zinf::model
