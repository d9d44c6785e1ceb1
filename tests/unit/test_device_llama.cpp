// Unit tests of the Llama family's device kernels on the cpu backend
// (device.hpp: RMSNorm, alone and after the residual add, rotary
// embeddings, SwiGLU, grouped-query attention, the embedding without a
// position table): each against a double-precision
// reference written here, each backward also against central finite
// differences of the double forward; grouped-query attention with as many
// kv heads as query heads bitwise the GPT's attention kernels; the decode
// row bitwise the forward's last; every kernel bitwise the same on 1 and 2
// threads; short spans and bad head counts refused at the call.
#define BOOST_TEST_MODULE device_llama
#include "device_reference.hpp"

#include "../../libzinf/src/util/kernel_math.hpp"  // SwiGLU's scalar form, the cuda kernels' too

#include <zinf/device.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

using namespace zinf;
using namespace zinf::device;
using u64 = std::uint64_t;
using Vf = std::vector<float>;
using Vd = std::vector<double>;
using Vi = std::vector<std::int32_t>;

namespace {

using testing::fresh_seed;
using testing::randn;
using testing::random_tokens;
using testing::halves;
using testing::widened;
using testing::dbl;
using testing::dot;
using testing::max_err;
using testing::numeric_grad;
using testing::plus;
using testing::Rig;
using testing::same_bits;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------
// References, in double.
Vd rms_forward(const Vd& x, const Vd& w, u64 N, u64 C, double eps, Vd* rstd = nullptr) {
    Vd out(N * C);
    if (rstd) rstd->assign(N, 0);
    for (u64 i = 0; i < N; ++i) {
        double ss = 0;
        for (u64 c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
        const double s = 1 / std::sqrt(ss / C + eps);
        for (u64 c = 0; c < C; ++c) out[i * C + c] = x[i * C + c] * s * w[c];
        if (rstd) (*rstd)[i] = s;
    }
    return out;
}

// A rope table (P, hd) as the model makes it: cos, then sin, of p * theta^(-2i/hd).
Vf rope_table(u64 P, u64 hd, double theta) {
    Vf t(P * hd);
    for (u64 p = 0; p < P; ++p)
        for (u64 i = 0; i < hd / 2; ++i) {
            const double a = double(p) * std::pow(theta, -2.0 * double(i) / double(hd));
            t[p * hd + i] = float(std::cos(a));
            t[p * hd + hd / 2 + i] = float(std::sin(a));
        }
    return t;
}

// x (B,T,H,hd) turned at positions pos0 + t, as Hugging Face's apply_rotary_pos_emb:
// x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1).
Vd rope_ref(const Vd& x, const Vf& table, u64 B, u64 T, u64 H, u64 hd, u64 pos0) {
    Vd out(x.size());
    const u64 half = hd / 2;
    for (u64 b = 0; b < B; ++b)
        for (u64 t = 0; t < T; ++t)
            for (u64 h = 0; h < H; ++h)
                for (u64 j = 0; j < hd; ++j) {
                    const u64 base = ((b * T + t) * H + h) * hd;
                    const double c = table[(pos0 + t) * hd + j % half], s = table[(pos0 + t) * hd + half + j % half];
                    const double rot = j < half ? -x[base + j + half] : x[base + j - half];
                    out[base + j] = x[base + j] * c + rot * s;
                }
    return out;
}

double silu(double x) { return x / (1 + std::exp(-x)); }

struct Gqa {
    u64 B, T, NH, KVH, hd;
    u64 QC() const { return NH * hd; }
    u64 KC() const { return KVH * hd; }
    u64 q(u64 b, u64 t, u64 h) const { return (b * T + t) * QC() + h * hd; }
    u64 kv(u64 b, u64 t, u64 h) const { return (b * T + t) * KC() + h / (NH / KVH) * hd; }
    u64 a(u64 b, u64 h, u64 t) const { return ((b * NH + h) * T + t) * T; }
};

void gqa_ref(const Vd& q, const Vd& k, const Vd& v, const Gqa& s, Vd& out, Vd& att) {
    out.assign(s.B * s.T * s.QC(), 0);
    att.assign(s.B * s.NH * s.T * s.T, 0);
    const double scale = 1 / std::sqrt(double(s.hd));
    for (u64 b = 0; b < s.B; ++b)
        for (u64 h = 0; h < s.NH; ++h)
            for (u64 t = 0; t < s.T; ++t) {
                Vd pre(t + 1);
                double mx = -INFINITY, sum = 0;
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    for (u64 i = 0; i < s.hd; ++i) pre[t2] += q[s.q(b, t, h) + i] * k[s.kv(b, t2, h) + i];
                    pre[t2] *= scale;
                    mx = std::max(mx, pre[t2]);
                }
                for (u64 t2 = 0; t2 <= t; ++t2) sum += std::exp(pre[t2] - mx);
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const double p = std::exp(pre[t2] - mx) / sum;
                    att[s.a(b, h, t) + t2] = p;
                    for (u64 i = 0; i < s.hd; ++i) out[s.q(b, t, h) + i] += p * v[s.kv(b, t2, h) + i];
                }
            }
}

void gqa_back_ref(const Vd& dout, const Vd& q, const Vd& k, const Vd& v, const Gqa& s, Vd& dq, Vd& dk, Vd& dv) {
    Vd out, att;
    gqa_ref(q, k, v, s, out, att);
    dq.assign(q.size(), 0);
    dk.assign(k.size(), 0);
    dv.assign(v.size(), 0);
    const double scale = 1 / std::sqrt(double(s.hd));
    for (u64 b = 0; b < s.B; ++b)
        for (u64 h = 0; h < s.NH; ++h)
            for (u64 t = 0; t < s.T; ++t) {
                const double* p = &att[s.a(b, h, t)];
                Vd datt(t + 1);
                double pd = 0;
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    for (u64 i = 0; i < s.hd; ++i) {
                        datt[t2] += dout[s.q(b, t, h) + i] * v[s.kv(b, t2, h) + i];
                        dv[s.kv(b, t2, h) + i] += p[t2] * dout[s.q(b, t, h) + i];
                    }
                    pd += p[t2] * datt[t2];
                }
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const double dpre = p[t2] * (datt[t2] - pd) * scale;
                    for (u64 i = 0; i < s.hd; ++i) {
                        dq[s.q(b, t, h) + i] += dpre * k[s.kv(b, t2, h) + i];
                        dk[s.kv(b, t2, h) + i] += dpre * q[s.q(b, t, h) + i];
                    }
                }
            }
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_CASE(rmsnorm_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("rmsnorm"));
    const double eps = 1e-5;
    {  // the analytic gradient below against finite differences of the reference
        const u64 N = 3, C = 7;
        const Vd x = dbl(randn(N * C, rng)), w = dbl(randn(C, rng)), dout = dbl(randn(N * C, rng));
        Vd rstd;
        rms_forward(x, w, N, C, eps, &rstd);
        const Vd fdx = numeric_grad([&](const Vd& xx) { return dot(rms_forward(xx, w, N, C, eps), dout); }, x);
        const Vd fdw = numeric_grad([&](const Vd& ww) { return dot(rms_forward(x, ww, N, C, eps), dout); }, w);
        Rig r;
        auto out = r->alloc<float>(N * C, "out");
        auto rs = r->alloc<float>(N, "rstd");
        auto dinp = r->alloc<float>(N * C, "dinp");
        auto dw = r->alloc<float>(C, "dw");
        const Vf xf(x.begin(), x.end()), wf(w.begin(), w.end()), df(dout.begin(), dout.end());
        const auto X = r.in(xf), W = r.in(wf);
        r->rmsnorm_forward(r.s(), out, rs, X, W, N, C, float(eps));
        r->rmsnorm_backward(r.s(), dinp, dw, r.in(df), X, W, rs, N, C);
        BOOST_TEST(max_err(r.down(dinp), fdx) < 1e-5);
        BOOST_TEST(max_err(r.down(dw), fdw) < 1e-5);
    }
    Rig r;
    for (const u64 C : {u64{64}, u64{77}, u64{576}}) {
        const u64 N = 33;
        const Vf x = randn(N * C, rng, 2), w = randn(C, rng), dout = randn(N * C, rng);
        const Vf dinp0 = randn(N * C, rng), dw0 = randn(C, rng);
        auto out = r.up(Vf(N * C, kNaN));
        auto rs = r.up(Vf(N, kNaN));
        auto dinp = r.up(dinp0), dw = r.up(dw0);
        const auto X = r.in(x), W = r.in(w);
        r->rmsnorm_forward(r.s(), out, rs, X, W, N, C, 1e-5f);
        r->rmsnorm_backward(r.s(), dinp, dw, r.in(dout), X, W, rs, N, C);
        Vd rstd;
        BOOST_TEST(max_err(r.down(out), rms_forward(dbl(x), dbl(w), N, C, eps, &rstd)) < 1e-6);
        BOOST_TEST(max_err(r.down(rs), rstd) < 1e-6);
        // The backward: the same formula in double, added to what was there.
        Vd gx(N * C), gw(C);
        for (u64 i = 0; i < N; ++i) {
            double m = 0;
            for (u64 c = 0; c < C; ++c) m += w[c] * double(dout[i * C + c]) * x[i * C + c] * rstd[i] / double(C);
            for (u64 c = 0; c < C; ++c) {
                const double norm = x[i * C + c] * rstd[i], dn = w[c] * double(dout[i * C + c]);
                gx[i * C + c] = (dn - norm * m) * rstd[i];
                gw[c] += norm * dout[i * C + c];
            }
        }
        BOOST_TEST(max_err(r.down(dinp), plus(dinp0, gx)) < 1e-5);
        BOOST_TEST(max_err(r.down(dw), plus(dw0, gw)) < 1e-5);
    }
}

// The residual add folded into the norm after it: the bits of accumulate and
// then rmsnorm_forward, on one thread and on two, at a size the team splits
// (N * C past 2^14) and at small and odd ones; and the norm of the sum.
BOOST_AUTO_TEST_CASE(residual_rmsnorm_is_accumulate_then_rmsnorm_to_the_bit) {
    std::mt19937_64 rng(fresh_seed("residual rmsnorm"));
    for (const unsigned threads : {1u, 2u})
        for (const auto& shape : {std::pair<u64, u64>{1, 576}, {33, 77}, {256, 576}}) {
            const u64 N = shape.first, C = shape.second;
            BOOST_TEST_CONTEXT(threads << " threads, N " << N << " C " << C) {
                Rig r(threads);
                const Vf x = randn(N * C, rng, 2), a = randn(N * C, rng), w = randn(C, rng);
                auto res1 = r.up(x), res2 = r.up(x);
                auto out1 = r.up(Vf(N * C, kNaN)), out2 = r.up(Vf(N * C, kNaN));
                auto rs1 = r.up(Vf(N, kNaN)), rs2 = r.up(Vf(N, kNaN));
                const auto A = r.in(a), W = r.in(w);
                r->accumulate(r.s(), res1, A);
                r->rmsnorm_forward(r.s(), out1, rs1, res1, W, N, C, 1e-5f);
                r->residual_rmsnorm_forward(r.s(), out2, rs2, res2, A, W, N, C, 1e-5f);
                BOOST_TEST(same_bits(r.down(res2), r.down(res1)));
                BOOST_TEST(same_bits(r.down(out2), r.down(out1)));
                BOOST_TEST(same_bits(r.down(rs2), r.down(rs1)));
                Vd sum(N * C), rstd;
                for (u64 i = 0; i < N * C; ++i) sum[i] = double(x[i]) + double(a[i]);
                BOOST_TEST(max_err(r.down(out2), rms_forward(sum, dbl(w), N, C, 1e-5, &rstd)) < 1e-5);
                BOOST_TEST(max_err(r.down(rs2), rstd) < 1e-5);
            }
        }
    Rig r;
    auto res = r.up(Vf(8 * 9)), out = r.up(Vf(8 * 9)), rs = r.up(Vf(8));
    const auto add = r.in(Vf(8 * 9 - 1)), w = r.in(Vf(9));
    const std::string what = testing::what_of<InternalError>(
        [&] { r->residual_rmsnorm_forward(r.s(), out, rs, res, add, w, 8, 9, 1e-5f); }, "a short add");
    BOOST_TEST(testing::contains(what, "residual_rmsnorm_forward (N=8, C=9)"), what);
    BOOST_TEST(testing::contains(what, "add has 71 elements"), what);
}

// A Llama block's inner residual kept bf16 (Shape::activations): the
// RMSNorm backward from it is the fp32 kernel's on its widened copy, to the
// bit (dinp and dw added to), on 1 and 2 threads; a short input is refused.
BOOST_AUTO_TEST_CASE(rmsnorm_backward_of_bf16_is_the_fp32_kernel_on_the_widened_input) {
    std::mt19937_64 rng(fresh_seed("rmsnorm bf16"));
    const u64 N = 70, C = 576;  // past the team's threshold, C a multiple of no column block
    const auto x16 = halves(randn(N * C, rng, 2));
    const Vf w = randn(C, rng), dout = randn(N * C, rng), dinp0 = randn(N * C, rng), dw0 = randn(C, rng);
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto out = r.up(Vf(N * C, kNaN)), rstd = r.up(Vf(N, kNaN));
        const auto xw = r.in(widened(x16));
        const auto x = r.in(x16);
        r->rmsnorm_forward(r.s(), out, rstd, xw, r.in(w), N, C, 1e-5f);
        auto di32 = r.up(dinp0), dw32 = r.up(dw0), di16 = r.up(dinp0), dw16 = r.up(dw0);
        r->rmsnorm_backward(r.s(), di32, dw32, r.in(dout), xw, r.in(w), rstd, N, C);
        r->rmsnorm_backward(r.s(), di16, dw16, r.in(dout), x, r.in(w), rstd, N, C);
        BOOST_TEST(same_bits(r.down(di16), r.down(di32)), threads << " threads: dinp");
        BOOST_TEST(same_bits(r.down(dw16), r.down(dw32)), threads << " threads: dw");
        BOOST_TEST(!same_bits(r.down(dw16), dw0));
        testing::what_of<InternalError>(
            [&] { r->rmsnorm_backward(r.s(), di16, dw16, r.in(dout), x.first(N * C - 1), r.in(w), rstd, N, C); },
            "a short bf16 input");
    }
}

// RMSNorm's dw is a column sum (test_device's column_sums case): chunks of
// kSumRows rows in row order, the chunks in order, then added; the same
// bits on 1 and 2 threads.
BOOST_AUTO_TEST_CASE(rmsnorm_dw_adds_chunks_of_rows_in_a_fixed_order) {
    std::mt19937_64 rng(fresh_seed("rmsnorm column sums"));
    const u64 R = kernel_math::kSumRows, N = 3 * R + 5, C = 70;
    const Vf x = randn(N * C, rng), w = randn(C, rng), dout = randn(N * C, rng), dw0 = randn(C, rng);
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto y = r->alloc<float>(N * C, "y"), rstd = r->alloc<float>(N, "rstd");
        r->rmsnorm_forward(r.s(), y, rstd, r.in(x), r.in(w), N, C, 1e-5f);
        auto dinp = r.up(Vf(N * C, 0.0f)), dw = r.up(dw0);
        r->rmsnorm_backward(r.s(), dinp, dw, r.in(dout), r.in(x), r.in(w), rstd, N, C);
        const Vf s = r.down(rstd), got = r.down(dw);
        const Vf want = testing::column_sum_order(
            dw0, N, C, R, [&](u64 row, u64 c) { return x[row * C + c] * s[row] * dout[row * C + c]; });
        BOOST_TEST(same_bits(got, want), threads << " threads");
    }
}

BOOST_AUTO_TEST_CASE(rope_is_hugging_face_s_rotate_half_and_its_transpose) {
    std::mt19937_64 rng(fresh_seed("rope"));
    Rig r;
    const u64 B = 2, T = 9, H = 5, hd = 16, pos0 = 4;
    const Vf table = rope_table(pos0 + T, hd, 10000);
    const Vf x = randn(B * T * H * hd, rng), y = randn(x.size(), rng);
    auto dx = r.up(x), dy = r.up(y);
    const auto tab = r.in(table);
    r->rope_forward(r.s(), dx, tab, B, T, H, hd, pos0);
    r->rope_backward(r.s(), dy, tab, B, T, H, hd, pos0);
    const Vf rx = r.down(dx), ry = r.down(dy);
    BOOST_TEST(max_err(rx, rope_ref(dbl(x), table, B, T, H, hd, pos0)) < 1e-6);
    // The backward is the transpose: <R x, y> = <x, R^T y>.
    BOOST_TEST(std::abs(dot(dbl(rx), dbl(y)) - dot(dbl(x), dbl(ry))) < 1e-4 * std::sqrt(double(x.size())));
    // A turn keeps each pair's length, and the inverse undoes it.
    r->rope_backward(r.s(), dx, tab, B, T, H, hd, pos0);
    BOOST_TEST(max_err(r.down(dx), dbl(x)) < 1e-6);
    // Position 0 is no turn at all (cos 1, sin 0): bitwise.
    auto z = r.up(x);
    r->rope_forward(r.s(), z, tab, B * T, 1, H, hd, 0);
    BOOST_TEST(same_bits(r.down(z), x));
    testing::what_of<InternalError>([&] { r->rope_forward(r.s(), dx, tab, B, T, H, hd, pos0 + 1); }, "table short");
    testing::what_of<InternalError>([&] { r->rope_forward(r.s(), dx, tab, B, T, H * 2, 8 + 1, 0); }, "odd hd");
}

BOOST_AUTO_TEST_CASE(swiglu_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("swiglu"));
    Rig r;
    const u64 n = 50'001;
    Vf g = randn(n, rng, 4), u = randn(n, rng), d = randn(n, rng);
    g[0] = 100, g[1] = -100, g[2] = 0, g[3] = 87.5f, g[4] = -90;  // past exp's clamp, and zero
    auto out = r.up(Vf(n, kNaN)), dg = r.up(Vf(n, kNaN)), du = r.up(Vf(n, kNaN));
    const auto G = r.in(g), U = r.in(u);
    r->swiglu_forward(r.s(), out, G, U);
    r->swiglu_backward(r.s(), dg, du, r.in(d), G, U);
    Vd want(n), want_dg(n), want_du(n);
    for (u64 i = 0; i < n; ++i) {
        const double x = g[i], s = 1 / (1 + std::exp(-x));
        want[i] = silu(x) * u[i];
        want_dg[i] = d[i] * u[i] * s * (1 + x * (1 - s));
        want_du[i] = d[i] * silu(x);
        // Finite differences of the double forward prove the formula.
        if (i < 200) {
            const double h = 1e-6, fd = (silu(x + h) - silu(x - h)) / (2 * h) * u[i] * d[i];
            BOOST_TEST_REQUIRE(std::abs(fd - want_dg[i]) < 1e-6 * (1 + std::abs(fd)));
        }
    }
    // Element by element, relative to each and to the terms it came from
    // (exp is a few ulp; silu' cancels to zero near g = -1.28).
    auto check = [&](const Vf& got, const Vd& ref, const char* what) {
        std::size_t bad = 0;
        for (std::size_t i = 0; i < ref.size(); ++i)
            bad += !(std::abs(got[i] - ref[i]) <= 1e-6 * (std::abs(ref[i]) + std::abs(double(d[i]) * u[i])) + 1e-30);
        BOOST_TEST(bad == 0u, what << ": " << bad << " elements off");
    };
    check(r.down(out), want, "out");
    check(r.down(dg), want_dg, "dgate");
    check(r.down(du), want_du, "dup");
    // In place over dout, as the MLP's backward runs it.
    auto inplace = r.up(d), other = r.up(Vf(n, kNaN));
    r->swiglu_backward(r.s(), inplace, other, inplace, G, U);
    BOOST_TEST(same_bits(r.down(inplace), r.down(dg)));
    BOOST_TEST(same_bits(r.down(other), r.down(du)));
}

// The cpu kernels run SwiGLU's loop built for the machine's widest vectors
// (AVX-512, AVX2 or SSE) in blocks over the team; each must give, element by
// element, the bits of kernel_math's scalar form, which the cuda kernels run
// too: the vector bodies, the blocks' edges and the last short block (n is
// no multiple of any vector width or block), on 1 and 2 threads, in place.
BOOST_AUTO_TEST_CASE(swiglu_is_the_scalar_form_to_the_bit) {
    std::mt19937_64 rng(fresh_seed("swiglu bits"));
    const u64 n = 5 * 4096 + 4093;  // past kParallelMin: the team takes the blocks
    Vf g = randn(n, rng, 4), u = randn(n, rng), d = randn(n, rng);
    g[5] = 100, g[6] = -100, g[7] = 0, g[4095] = 87.5f, g[4096] = -90, g[n - 1] = -1.2785f;
    Vf want(n), want_dg(n), want_du(n);
    for (u64 i = 0; i < n; ++i) {
        want[i] = kernel_math::swiglu(g[i], u[i]);
        kernel_math::swiglu_grad(g[i], u[i], d[i], &want_dg[i], &want_du[i]);
    }
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto out = r.up(Vf(n, kNaN)), dg = r.up(d), du = r.up(Vf(n, kNaN));
        const auto G = r.in(g), U = r.in(u);
        r->swiglu_forward(r.s(), out, G, U);
        r->swiglu_backward(r.s(), dg, du, dg, G, U);
        BOOST_TEST(same_bits(r.down(out), want), threads << " threads: forward");
        BOOST_TEST(same_bits(r.down(dg), want_dg), threads << " threads: d gate");
        BOOST_TEST(same_bits(r.down(du), want_du), threads << " threads: d up");
    }
}

// SwiGLU from gate and up kept bf16 (a Llama block's, Shape::activations):
// each block's inputs widened and run through the fp32 loop, so the forward
// is the scalar form on the widened inputs rounded to bf16, the backward the
// scalar form on them, to the bit: on 1 and 2 threads, the blocks' edges and
// the last short block, in place over dout. Short spans are refused.
BOOST_AUTO_TEST_CASE(swiglu_of_bf16_is_the_fp32_kernel_on_the_widened_inputs) {
    std::mt19937_64 rng(fresh_seed("swiglu bf16"));
    const u64 n = 3 * 4096 + 1001;
    Vf g0 = randn(n, rng, 4);
    g0[0] = 100, g0[1] = -100, g0[2] = 0, g0[4095] = 87.5f, g0[4096] = -90;
    const auto g16 = halves(g0), u16 = halves(randn(n, rng));
    const Vf g = widened(g16), u = widened(u16), d = randn(n, rng);
    Vf want_dg(n), want_du(n);
    std::vector<std::uint16_t> want(n);
    for (u64 i = 0; i < n; ++i) {
        want[i] = to_bf16(kernel_math::swiglu(g[i], u[i]));
        kernel_math::swiglu_grad(g[i], u[i], d[i], &want_dg[i], &want_du[i]);
    }
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto out = r.up(std::vector<std::uint16_t>(n, 0x7fc0));
        auto dg = r.up(d), du = r.up(Vf(n, kNaN));
        const auto G = r.in(g16), U = r.in(u16);
        r->swiglu_forward(r.s(), out.span(), G, U);
        r->swiglu_backward(r.s(), dg, du, dg, G, U);
        BOOST_TEST(same_bits(r.down(out), want), threads << " threads: forward");
        BOOST_TEST(same_bits(r.down(dg), want_dg), threads << " threads: d gate");
        BOOST_TEST(same_bits(r.down(du), want_du), threads << " threads: d up");
        BOOST_TEST(!same_bits(want_du, d));
        auto bad = r.up(Vf(n, 0));
        testing::what_of<InternalError>([&] { r->swiglu_backward(r.s(), bad, du, dg, G.first(n - 1), U); },
                                        "a short bf16 gate");
        testing::what_of<InternalError>([&] { r->swiglu_forward(r.s(), out.span(), G, U.first(n - 1)); },
                                        "a short bf16 up");
    }
}

BOOST_AUTO_TEST_CASE(gqa_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("gqa"));
    {
        const Gqa s{2, 4, 4, 2, 3};
        const Vd q = dbl(randn(s.B * s.T * s.QC(), rng)), k = dbl(randn(s.B * s.T * s.KC(), rng)),
                 v = dbl(randn(s.B * s.T * s.KC(), rng)), dout = dbl(randn(s.B * s.T * s.QC(), rng));
        Vd dq, dk, dv;
        gqa_back_ref(dout, q, k, v, s, dq, dk, dv);
        auto loss = [&](const Vd& qq, const Vd& kk, const Vd& vv) {
            Vd out, att;
            gqa_ref(qq, kk, vv, s, out, att);
            return dot(out, dout);
        };
        BOOST_TEST(max_err(dq, numeric_grad([&](const Vd& x) { return loss(x, k, v); }, q)) < 1e-7);
        BOOST_TEST(max_err(dk, numeric_grad([&](const Vd& x) { return loss(q, x, v); }, k)) < 1e-7);
        BOOST_TEST(max_err(dv, numeric_grad([&](const Vd& x) { return loss(q, k, x); }, v)) < 1e-7);
    }
    Rig r;
    for (const Gqa s : {Gqa{2, 19, 6, 2, 8}, Gqa{1, 33, 9, 3, 64}, Gqa{2, 7, 4, 1, 16}, Gqa{1, 5, 3, 3, 4}}) {
        BOOST_TEST_CONTEXT("B " << s.B << " T " << s.T << " NH " << s.NH << " KVH " << s.KVH << " hd " << s.hd) {
            const Vf q = randn(s.B * s.T * s.QC(), rng), k = randn(s.B * s.T * s.KC(), rng),
                     v = randn(s.B * s.T * s.KC(), rng), dout = randn(s.B * s.T * s.QC(), rng);
            auto out = r.up(Vf(q.size(), kNaN)), att = r.up(Vf(s.B * s.NH * s.T * s.T, kNaN));
            auto dq = r.up(Vf(q.size(), kNaN)), dk = r.up(Vf(k.size(), kNaN)), dv = r.up(Vf(v.size(), kNaN));
            auto datt = r.up(Vf(att.size(), kNaN));
            const auto Q = r.in(q), K = r.in(k), Vv = r.in(v);
            r->gqa_forward(r.s(), out, att, Q, K, Vv, s.B, s.T, s.NH, s.KVH, s.hd);
            r->gqa_backward(r.s(), dq, dk, dv, datt, r.in(dout), Q, K, Vv, att, s.B, s.T, s.NH, s.KVH, s.hd);
            Vd want_out, want_att, wq, wk, wv;
            gqa_ref(dbl(q), dbl(k), dbl(v), s, want_out, want_att);
            gqa_back_ref(dbl(dout), dbl(q), dbl(k), dbl(v), s, wq, wk, wv);
            BOOST_TEST(max_err(r.down(out), want_out) < 1e-5);
            BOOST_TEST(max_err(r.down(att), want_att) < 1e-5);
            BOOST_TEST(max_err(r.down(dq), wq) < 1e-5);
            BOOST_TEST(max_err(r.down(dk), wk) < 1e-5);
            BOOST_TEST(max_err(r.down(dv), wv) < 1e-5);
        }
    }
    testing::what_of<InternalError>(
        [&] {
            auto o = r->alloc<float>(100, "o");
            r->gqa_forward(r.s(), o, o, o, o, o, 1, 1, 3, 2, 4);
        },
        "heads not a multiple of kv heads");
}

// The GEMM decomposition (issue 43) against the scalar kernels it replaced
// (device_reference.hpp's today_attention_*), forward and backward, within
// 1e-5: the GPT's packed qkv and grouped-query heads (as many kv heads as
// query heads, fewer, one), and the causal mask at the edges: T = 1, and T
// on neither side of the triangle's 64-row blocks (7, 33, 65, 130).
BOOST_AUTO_TEST_CASE(gemm_attention_matches_today_s_attention) {
    std::mt19937_64 rng(fresh_seed("gemm attention"));
    Rig r;
    using testing::TodayHeads;
    auto check = [&](const char* what, const Vf& got, const Vf& want) {
        BOOST_TEST(max_err(got, dbl(want)) < 1e-5, what);
    };
    struct Gpt {
        u64 B, T, C, NH;
    };
    for (const Gpt s : {Gpt{1, 1, 16, 2}, Gpt{2, 7, 24, 3}, Gpt{1, 33, 64, 2}, Gpt{2, 65, 48, 4}, Gpt{1, 130, 32, 1}}) {
        BOOST_TEST_CONTEXT("attention B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH) {
            const u64 B = s.B, T = s.T, C = s.C, NH = s.NH, hd = C / NH;
            const Vf qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
            auto out = r.up(Vf(B * T * C, kNaN)), att = r.up(Vf(B * NH * T * T, kNaN));
            auto dqkv = r.up(Vf(qkv.size(), kNaN)), datt = r.up(Vf(att.size(), kNaN));
            const auto X = r.in(qkv);
            r->attention_forward(r.s(), out, att, X, B, T, C, NH);
            r->attention_backward(r.s(), dqkv, datt, r.in(dout), X, att, B, T, C, NH);
            const TodayHeads x{B, T, NH, NH, hd, 3 * C, 3 * C, C};
            Vf want_out(B * T * C), want_att(B * NH * T * T), want_d(qkv.size());
            const float* p = qkv.data();
            testing::today_attention_forward(x, p, p + C, p + 2 * C, want_att.data(), want_out.data());
            const Vf got_att = r.down(att);
            testing::today_attention_backward(x, dout.data(), p, p + C, p + 2 * C, got_att.data(), want_d.data(),
                                              3 * C, want_d.data() + C, want_d.data() + 2 * C, 3 * C);
            check("out", r.down(out), want_out);
            check("att", got_att, want_att);
            check("dqkv", r.down(dqkv), want_d);
            std::size_t above = 0;
            for (u64 row = 0; row < B * NH * T; ++row)
                for (u64 t2 = row % T + 1; t2 < T; ++t2) above += got_att[row * T + t2] != 0.0f;
            BOOST_TEST(above == 0u);
        }
    }
    struct Shape {
        u64 B, T, NH, KVH, hd;
    };
    for (const Shape s : {Shape{1, 1, 4, 2, 8}, Shape{2, 7, 6, 2, 8}, Shape{1, 33, 9, 3, 64}, Shape{2, 65, 4, 4, 16},
                          Shape{1, 130, 8, 1, 32}}) {
        BOOST_TEST_CONTEXT("gqa B " << s.B << " T " << s.T << " NH " << s.NH << " KVH " << s.KVH << " hd " << s.hd) {
            const u64 B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, hd = s.hd, QC = NH * hd, KC = KVH * hd;
            const Vf q = randn(B * T * QC, rng), k = randn(B * T * KC, rng), v = randn(B * T * KC, rng),
                     dout = randn(B * T * QC, rng);
            auto out = r.up(Vf(q.size(), kNaN)), att = r.up(Vf(B * NH * T * T, kNaN));
            auto dq = r.up(Vf(q.size(), kNaN)), dk = r.up(Vf(k.size(), kNaN)), dv = r.up(Vf(v.size(), kNaN));
            auto datt = r.up(Vf(att.size(), kNaN));
            const auto Q = r.in(q), K = r.in(k), Vv = r.in(v);
            r->gqa_forward(r.s(), out, att, Q, K, Vv, B, T, NH, KVH, hd);
            r->gqa_backward(r.s(), dq, dk, dv, datt, r.in(dout), Q, K, Vv, att, B, T, NH, KVH, hd);
            const TodayHeads x{B, T, NH, KVH, hd, QC, KC, QC};
            Vf want_out(q.size()), want_att(B * NH * T * T), wq(q.size()), wk(k.size()), wv(v.size());
            testing::today_attention_forward(x, q.data(), k.data(), v.data(), want_att.data(), want_out.data());
            const Vf got_att = r.down(att);
            testing::today_attention_backward(x, dout.data(), q.data(), k.data(), v.data(), got_att.data(), wq.data(),
                                              QC, wk.data(), wv.data(), KC);
            check("out", r.down(out), want_out);
            check("att", got_att, want_att);
            check("dq", r.down(dq), wq);
            check("dk", r.down(dk), wk);
            check("dv", r.down(dv), wv);
        }
    }
}

// A Llama block's q, k, v and softmax kept bf16 (Shape::activations): the
// GQA backward from them is the fp32 kernel's on their widened copies, to
// the bit, on 1 and 2 threads (each task's own widened rows); dq, dk and dv
// written, not +=. Short spans are refused.
BOOST_AUTO_TEST_CASE(gqa_backward_of_bf16_is_the_fp32_kernel_on_the_widened_inputs) {
    std::mt19937_64 rng(fresh_seed("gqa bf16"));
    const Gqa s{2, 37, 6, 2, 16};  // past the team's threshold, T past a key block, 3 heads a group
    const auto q16 = halves(randn(s.B * s.T * s.QC(), rng)), k16 = halves(randn(s.B * s.T * s.KC(), rng)),
               v16 = halves(randn(s.B * s.T * s.KC(), rng));
    const Vf dout = randn(s.B * s.T * s.QC(), rng);
    Vf att;
    {  // the softmax of the forward on the kept q, k, v, rounded as the block keeps it
        Rig r(1);
        auto out = r.up(Vf(q16.size(), kNaN)), a = r.up(Vf(s.B * s.NH * s.T * s.T, kNaN));
        r->gqa_forward(r.s(), out, a, r.in(widened(q16)), r.in(widened(k16)), r.in(widened(v16)), s.B, s.T, s.NH,
                       s.KVH, s.hd);
        att = r.down(a);
    }
    const auto att16 = halves(att);
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto dq32 = r.up(Vf(q16.size(), kNaN)), dk32 = r.up(Vf(k16.size(), kNaN)), dv32 = r.up(Vf(v16.size(), kNaN));
        auto dq16 = r.up(Vf(q16.size(), kNaN)), dk16 = r.up(Vf(k16.size(), kNaN)), dv16 = r.up(Vf(v16.size(), kNaN));
        auto datt = r.up(Vf(att16.size(), kNaN));
        const auto D = r.in(dout);
        const auto Q = r.in(q16), K = r.in(k16), V = r.in(v16), A = r.in(att16);
        r->gqa_backward(r.s(), dq32, dk32, dv32, datt, D, r.in(widened(q16)), r.in(widened(k16)), r.in(widened(v16)),
                        r.in(widened(att16)), s.B, s.T, s.NH, s.KVH, s.hd);
        r->gqa_backward(r.s(), dq16, dk16, dv16, datt, D, Q, K, V, A, s.B, s.T, s.NH, s.KVH, s.hd);
        const Vf wq = r.down(dq32), wk = r.down(dk32), wv = r.down(dv32);
        BOOST_TEST(same_bits(r.down(dq16), wq), threads << " threads: dq");
        BOOST_TEST(same_bits(r.down(dk16), wk), threads << " threads: dk");
        BOOST_TEST(same_bits(r.down(dv16), wv), threads << " threads: dv");
        for (const Vf* g : {&wq, &wk, &wv})
            BOOST_TEST(std::all_of(g->begin(), g->end(), [](float x) { return std::isfinite(x); }));
        testing::what_of<InternalError>(
            [&] {
                r->gqa_backward(r.s(), dq16, dk16, dv16, datt, D, Q, K.first(k16.size() - 1), V, A, s.B, s.T, s.NH,
                                s.KVH, s.hd);
            },
            "a short bf16 k");
        testing::what_of<InternalError>(
            [&] {
                r->gqa_backward(r.s(), dq16, dk16, dv16, datt, D, Q, K, V, A.first(att16.size() - 1), s.B, s.T, s.NH,
                                s.KVH, s.hd);
            },
            "a short bf16 softmax");
    }
}

// With a kv head per query head it is the GPT's attention, to the bit (the
// same GEMMs at other row strides); the decode row is the forward's last
// within rounding (dot products on one thread against OpenBLAS's GEMMs).
BOOST_AUTO_TEST_CASE(gqa_is_attention_with_every_head_and_decode_is_its_last_row) {
    std::mt19937_64 rng(fresh_seed("gqa as attention"));
    Rig r;
    const u64 B = 2, T = 21, NH = 4, hd = 12, C = NH * hd;
    const Vf qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
    Vf q(B * T * C), k(B * T * C), v(B * T * C);
    for (u64 bt = 0; bt < B * T; ++bt)
        for (u64 c = 0; c < C; ++c) {
            q[bt * C + c] = qkv[bt * 3 * C + c];
            k[bt * C + c] = qkv[bt * 3 * C + C + c];
            v[bt * C + c] = qkv[bt * 3 * C + 2 * C + c];
        }
    auto out1 = r->alloc<float>(B * T * C, "o1"), out2 = r->alloc<float>(B * T * C, "o2");
    auto att1 = r->alloc<float>(B * NH * T * T, "a1"), att2 = r->alloc<float>(B * NH * T * T, "a2");
    auto datt = r->alloc<float>(B * NH * T * T, "datt");
    auto dqkv = r->alloc<float>(qkv.size(), "dqkv");
    auto dq = r->alloc<float>(q.size(), "dq"), dk = r->alloc<float>(q.size(), "dk"), dv = r->alloc<float>(q.size(), "dv");
    const auto QKV = r.in(qkv), Q = r.in(q), K = r.in(k), Vv = r.in(v), D = r.in(dout);
    r->attention_forward(r.s(), out1, att1, QKV, B, T, C, NH);
    r->attention_backward(r.s(), dqkv, datt, D, QKV, att1, B, T, C, NH);
    r->gqa_forward(r.s(), out2, att2, Q, K, Vv, B, T, NH, NH, hd);
    r->gqa_backward(r.s(), dq, dk, dv, datt, D, Q, K, Vv, att2, B, T, NH, NH, hd);
    BOOST_TEST(same_bits(r.down(out1), r.down(out2)));
    BOOST_TEST(same_bits(r.down(att1), r.down(att2)));
    const Vf d3 = r.down(dqkv), gq = r.down(dq), gk = r.down(dk), gv = r.down(dv);
    std::size_t differ = 0;
    for (u64 bt = 0; bt < B * T; ++bt)
        for (u64 c = 0; c < C; ++c)
            differ += std::memcmp(&d3[bt * 3 * C + c], &gq[bt * C + c], 4) != 0 ||
                      std::memcmp(&d3[bt * 3 * C + C + c], &gk[bt * C + c], 4) != 0 ||
                      std::memcmp(&d3[bt * 3 * C + 2 * C + c], &gv[bt * C + c], 4) != 0;
    BOOST_TEST(differ == 0u);

    // Decode: 3 query heads per kv head, the cache (T, KVH*hd).
    const u64 NQ = 6, KVH = 2;
    const Vf q2 = randn(T * NQ * hd, rng), k2 = randn(T * KVH * hd, rng), v2 = randn(T * KVH * hd, rng);
    auto o = r->alloc<float>(q2.size(), "o"), a = r->alloc<float>(NQ * T * T, "a");
    const auto K2 = r.in(k2), V2 = r.in(v2);
    r->gqa_forward(r.s(), o, a, r.in(q2), K2, V2, 1, T, NQ, KVH, hd);
    const Vf last(q2.end() - static_cast<std::ptrdiff_t>(NQ * hd), q2.end());
    auto od = r.up(Vf(NQ * hd, kNaN)), ad = r.up(Vf(NQ * T, kNaN));
    r->gqa_decode(r.s(), od, ad, r.in(last), K2, V2, T, NQ, KVH, hd);
    const Vf full = r.down(o), one = r.down(od), full_att = r.down(a), one_att = r.down(ad);
    auto slice = [](const Vf& x, u64 at, u64 n) {
        return Vf(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    BOOST_TEST(max_err(one, dbl(slice(full, (T - 1) * NQ * hd, NQ * hd))) < 1e-6);
    for (u64 h = 0; h < NQ; ++h)
        BOOST_TEST(max_err(slice(one_att, h * T, T), dbl(slice(full_att, (h * T + T - 1) * T, T))) < 1e-6);
    BOOST_CHECK_THROW(r->gqa_decode(r.s(), od, ad, r.in(last), K2, V2, T + 1, NQ, KVH, hd), InternalError);
}

BOOST_AUTO_TEST_CASE(embedding_without_positions) {
    std::mt19937_64 rng(fresh_seed("embedding without positions"));
    Rig r;
    const u64 B = 3, T = 11, C = 70, V = 29;
    Vi tok = random_tokens(B * T, V, rng);
    tok[3] = tok[8] = tok[20] = 5;
    const Vf wte = randn(V * C, rng), dout = randn(B * T * C, rng), dwte0 = randn(V * C, rng);
    auto out = r.up(Vf(B * T * C, kNaN)), dwte = r.up(dwte0);
    const auto tk = r.in(tok);
    r->embedding_forward(r.s(), out, tk, r.in(wte), {}, B, T, C, V);
    r->embedding_backward(r.s(), dwte, {}, r.in(dout), tk, B, T, C, V);
    const Vf got = r.down(out), gw = r.down(dwte);
    Vf want(B * T * C);
    Vd want_dw = dbl(dwte0);
    for (u64 bt = 0; bt < B * T; ++bt)
        for (u64 c = 0; c < C; ++c) {
            want[bt * C + c] = wte[u64(tok[bt]) * C + c];
            want_dw[u64(tok[bt]) * C + c] += dout[bt * C + c];
        }
    BOOST_TEST(same_bits(got, want));
    BOOST_TEST(max_err(gw, want_dw) < 1e-6);
    tok[7] = std::int32_t(V);
    auto bad = r.up(tok);
    r->embedding_forward(r.s(), out, bad, r.in(wte), {}, B, T, C, V);
    BOOST_CHECK_THROW(r->synchronize(r.s()), DataError);
}

// The 2-D copy the Llama's joined projections split their product with
// (q, k and v out of one (N, q+k+v) GEMM) and join their gradients with.
BOOST_AUTO_TEST_CASE(copy_rows_moves_a_column_block_and_nothing_else) {
    std::mt19937_64 rng(fresh_seed("copy_rows"));
    Rig r;
    const u64 rows = 37, wide = 53, lo = 11, cols = 19, narrow = 23;
    const Vf src = randn(rows * wide, rng), before = randn(rows * narrow, rng);
    // Out of the wide matrix's columns [lo, lo + cols) into a narrower one's first cols.
    auto out = r.up(before);
    const auto in = r.in(src);
    r->copy_rows(r.s(), out, narrow, in.subspan(lo), wide, rows, cols);
    Vf want = before;
    for (u64 i = 0; i < rows; ++i)
        for (u64 j = 0; j < cols; ++j) want[i * narrow + j] = src[i * wide + lo + j];
    BOOST_TEST(same_bits(r.down(out), want));
    // And back into a wide matrix's columns [lo, lo + cols), the others untouched.
    const Vf wide0 = randn(rows * wide, rng);
    auto back = r.up(wide0);
    r->copy_rows(r.s(), std::span<float>(back).subspan(lo), wide, out, narrow, rows, cols);
    Vf want2 = wide0;
    for (u64 i = 0; i < rows; ++i)
        for (u64 j = 0; j < cols; ++j) want2[i * wide + lo + j] = src[i * wide + lo + j];
    BOOST_TEST(same_bits(r.down(back), want2));
    // A stride under the row's length, or a span one element short, is refused at the call.
    const std::string what = testing::what_of<InternalError>(
        [&] { r->copy_rows(r.s(), out, cols - 1, in, wide, rows, cols); }, "copy_rows stride");
    BOOST_TEST(testing::contains(what, "copy_rows (rows=37, cols=19"), what);
    BOOST_CHECK_THROW(r->copy_rows(r.s(), back, wide, in.subspan(lo + 1), wide, rows, wide - lo), InternalError);
    BOOST_CHECK_THROW(r->copy_rows(r.s(), std::span<float>(out).first((rows - 1) * narrow + cols - 1), narrow, in,
                                   wide, rows, cols),
                      InternalError);
    r->synchronize(r.s());
}

BOOST_AUTO_TEST_CASE(kernels_bitwise_same_for_1_and_2_threads) {
    const std::uint64_t seed = fresh_seed("llama determinism");
    auto run_all = [seed](unsigned threads) {
        std::mt19937_64 rng(seed);
        Rig r(threads);
        std::vector<Vf> outs;
        auto keep = [&](const Array<float>& a) { outs.push_back(r.down(a)); };
        const u64 N = 96, C = 200;
        auto x = r.up(randn(N * C, rng)), w = r.up(randn(C, rng)), dout = r.up(randn(N * C, rng));
        auto y = r->alloc<float>(N * C, "y"), rs = r->alloc<float>(N, "rstd");
        auto dinp = r.up(randn(N * C, rng)), dw = r.up(randn(C, rng));
        r->rmsnorm_forward(r.s(), y, rs, x, w, N, C, 1e-5f);
        r->rmsnorm_backward(r.s(), dinp, dw, dout, x, w, rs, N, C);
        keep(y), keep(rs), keep(dinp), keep(dw);
        r->residual_rmsnorm_forward(r.s(), y, rs, dinp, dout, w, N, C, 1e-5f);
        keep(y), keep(rs), keep(dinp);
        auto o = r->alloc<float>(N * C, "o"), dg = r->alloc<float>(N * C, "dg"), du = r->alloc<float>(N * C, "du");
        r->swiglu_forward(r.s(), o, x, dout);
        r->swiglu_backward(r.s(), dg, du, y, x, dout);
        keep(o), keep(dg), keep(du);
        const Gqa s{2, 40, 6, 2, 32};
        auto q = r.up(randn(s.B * s.T * s.QC(), rng)), k = r.up(randn(s.B * s.T * s.KC(), rng)),
             v = r.up(randn(s.B * s.T * s.KC(), rng)), go = r.up(randn(s.B * s.T * s.QC(), rng));
        const auto tab = r.in(rope_table(s.T, s.hd, 500000));
        r->rope_forward(r.s(), q, tab, s.B, s.T, s.NH, s.hd, 0);
        r->rope_forward(r.s(), k, tab, s.B, s.T, s.KVH, s.hd, 0);
        auto ao = r->alloc<float>(q.size(), "ao"), att = r->alloc<float>(s.B * s.NH * s.T * s.T, "att");
        auto datt = r->alloc<float>(att.size(), "datt");
        auto dq = r->alloc<float>(q.size(), "dq"), dk = r->alloc<float>(k.size(), "dk"), dv = r->alloc<float>(v.size(), "dv");
        r->gqa_forward(r.s(), ao, att, q, k, v, s.B, s.T, s.NH, s.KVH, s.hd);
        r->gqa_backward(r.s(), dq, dk, dv, datt, go, q, k, v, att, s.B, s.T, s.NH, s.KVH, s.hd);
        r->rope_backward(r.s(), dq, tab, s.B, s.T, s.NH, s.hd, 0);
        keep(q), keep(k), keep(ao), keep(att), keep(dq), keep(dk), keep(dv);
        return outs;
    };
    const auto one = run_all(1), two = run_all(2);
    BOOST_REQUIRE_EQUAL(one.size(), two.size());
    for (std::size_t i = 0; i < one.size(); ++i) BOOST_TEST(same_bits(one[i], two[i]), "output " << i);
}

BOOST_AUTO_TEST_CASE(short_spans_are_internal_errors_at_the_call) {
    Rig r;
    auto a = r->alloc<float>(64, "a"), b = r->alloc<float>(8, "b");
    const std::string what =
        testing::what_of<InternalError>([&] { r->rmsnorm_forward(r.s(), a, b, a, b, 8, 9, 1e-5f); }, "rmsnorm");
    BOOST_TEST(testing::contains(what, "rmsnorm_forward (N=8, C=9)"), what);
    BOOST_CHECK_THROW(r->swiglu_forward(r.s(), a, b, a), InternalError);
    BOOST_CHECK_THROW(r->gqa_backward(r.s(), a, a, a, a, a, a, a, a, b, 1, 4, 2, 1, 4), InternalError);
}

// ---------------------------------------------------------------------------
// Flash attention (kernels.def's flash_*, --attention flash) against the
// GEMM path, forward and backward, within 1e-5: the GPT's packed qkv and
// grouped-query heads (as many kv heads as query heads, fewer, one), T = 1,
// 7, 33, 65 and 128 (the causal mask at a tile's edges: the cpu's 64-row
// tiles and the cuda kernels' 32); its log-sum-exp against a double
// reference; the same bits on 1 and 2 threads; the backward from q, k, v and
// out stored bf16 the fp32 kernel's on their widened copies, to the bit.
namespace {

// lse (B,NH,T) in double: log sum_{j <= i} exp(scale q_i . k_j).
Vd lse_ref(const Vf& q, const Vf& k, const Gqa& s, u64 qs, u64 ks) {
    Vd lse(s.B * s.NH * s.T);
    const double scale = 1 / std::sqrt(double(s.hd));
    for (u64 b = 0; b < s.B; ++b)
        for (u64 h = 0; h < s.NH; ++h)
            for (u64 i = 0; i < s.T; ++i) {
                Vd x(i + 1);
                double mx = -INFINITY, sum = 0;
                for (u64 j = 0; j <= i; ++j) {
                    double d = 0;
                    for (u64 e = 0; e < s.hd; ++e)
                        d += double(q[(b * s.T + i) * qs + h * s.hd + e]) *
                             k[(b * s.T + j) * ks + h / (s.NH / s.KVH) * s.hd + e];
                    mx = std::max(mx, x[j] = d * scale);
                }
                for (double v : x) sum += std::exp(v - mx);
                lse[(b * s.NH + h) * s.T + i] = mx + std::log(sum);
            }
    return lse;
}

}  // namespace

BOOST_AUTO_TEST_CASE(flash_attention_matches_the_gemm_path) {
    std::mt19937_64 rng(fresh_seed("flash attention"));
    struct Gpt {
        u64 B, T, C, NH;
    };
    for (const Gpt s : {Gpt{1, 1, 16, 2}, Gpt{2, 7, 24, 3}, Gpt{1, 33, 64, 2}, Gpt{2, 65, 48, 4}, Gpt{1, 128, 32, 1}}) {
        BOOST_TEST_CONTEXT("attention B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH) {
            const u64 B = s.B, T = s.T, C = s.C, NH = s.NH;
            const Vf qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
            Vf want_out, want_d;
            {
                Rig r;
                auto out = r.up(Vf(B * T * C, kNaN)), att = r.up(Vf(B * NH * T * T, kNaN));
                auto dqkv = r.up(Vf(qkv.size(), kNaN)), datt = r.up(Vf(att.size(), kNaN));
                r->attention_forward(r.s(), out, att, r.in(qkv), B, T, C, NH);
                r->attention_backward(r.s(), dqkv, datt, r.in(dout), r.in(qkv), att, B, T, C, NH);
                want_out = r.down(out);
                want_d = r.down(dqkv);
            }
            std::vector<Vf> runs;
            for (unsigned threads : {1u, 2u}) {
                Rig r(threads);
                auto out = r.up(Vf(B * T * C, kNaN)), lse = r.up(Vf(B * NH * T, kNaN));
                auto dqkv = r.up(Vf(qkv.size(), kNaN)), delta = r.up(Vf(B * NH * T, kNaN));
                const auto X = r.in(qkv);
                r->flash_attention_forward(r.s(), out, lse, X, B, T, C, NH);
                r->flash_attention_backward(r.s(), dqkv, delta, r.in(dout), X, out, lse, B, T, C, NH);
                const Vf got_out = r.down(out), got_lse = r.down(lse), got_d = r.down(dqkv);
                BOOST_TEST(max_err(got_out, dbl(want_out)) < 1e-5, threads << " threads: out");
                BOOST_TEST(max_err(got_d, dbl(want_d)) < 1e-5, threads << " threads: dqkv");
                const Gqa g{B, T, NH, NH, C / NH};
                BOOST_TEST(max_err(got_lse, lse_ref(Vf(qkv.begin(), qkv.end()), Vf(qkv.begin() + C, qkv.end()), g,
                                                    3 * C, 3 * C)) < 1e-6,
                           threads << " threads: lse");
                runs.push_back(got_out), runs.push_back(got_lse), runs.push_back(got_d);
            }
            for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(same_bits(runs[i], runs[i + 3]), "1 and 2 threads: " << i);
        }
    }
    for (const Gqa s : {Gqa{1, 1, 4, 2, 8}, Gqa{2, 7, 6, 2, 8}, Gqa{1, 33, 9, 3, 64}, Gqa{2, 65, 4, 4, 16},
                        Gqa{1, 128, 8, 1, 32}}) {
        BOOST_TEST_CONTEXT("gqa B " << s.B << " T " << s.T << " NH " << s.NH << " KVH " << s.KVH << " hd " << s.hd) {
            const u64 B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, hd = s.hd;
            const Vf q = randn(B * T * s.QC(), rng), k = randn(B * T * s.KC(), rng), v = randn(B * T * s.KC(), rng),
                     dout = randn(q.size(), rng);
            Vf wo, wq, wk, wv;
            {
                Rig r;
                auto out = r.up(Vf(q.size(), kNaN)), att = r.up(Vf(B * NH * T * T, kNaN));
                auto dq = r.up(Vf(q.size(), kNaN)), dk = r.up(Vf(k.size(), kNaN)), dv = r.up(Vf(v.size(), kNaN));
                auto datt = r.up(Vf(att.size(), kNaN));
                const auto Q = r.in(q), K = r.in(k), Vv = r.in(v);
                r->gqa_forward(r.s(), out, att, Q, K, Vv, B, T, NH, KVH, hd);
                r->gqa_backward(r.s(), dq, dk, dv, datt, r.in(dout), Q, K, Vv, att, B, T, NH, KVH, hd);
                wo = r.down(out), wq = r.down(dq), wk = r.down(dk), wv = r.down(dv);
            }
            std::vector<Vf> runs;
            for (unsigned threads : {1u, 2u}) {
                Rig r(threads);
                auto out = r.up(Vf(q.size(), kNaN)), lse = r.up(Vf(B * NH * T, kNaN));
                auto dq = r.up(Vf(q.size(), kNaN)), dk = r.up(Vf(k.size(), kNaN)), dv = r.up(Vf(v.size(), kNaN));
                auto delta = r.up(Vf(B * NH * T, kNaN));
                const auto Q = r.in(q), K = r.in(k), Vv = r.in(v);
                r->flash_gqa_forward(r.s(), out, lse, Q, K, Vv, B, T, NH, KVH, hd);
                r->flash_gqa_backward(r.s(), dq, dk, dv, delta, r.in(dout), Q, K, Vv, out, lse, B, T, NH, KVH, hd);
                runs.push_back(r.down(out)), runs.push_back(r.down(lse));
                runs.push_back(r.down(dq)), runs.push_back(r.down(dk)), runs.push_back(r.down(dv));
                BOOST_TEST(max_err(runs[runs.size() - 5], dbl(wo)) < 1e-5, threads << " threads: out");
                BOOST_TEST(max_err(runs[runs.size() - 4], lse_ref(q, k, s, s.QC(), s.KC())) < 1e-6,
                           threads << " threads: lse");
                BOOST_TEST(max_err(runs[runs.size() - 3], dbl(wq)) < 1e-5, threads << " threads: dq");
                BOOST_TEST(max_err(runs[runs.size() - 2], dbl(wk)) < 1e-5, threads << " threads: dk");
                BOOST_TEST(max_err(runs[runs.size() - 1], dbl(wv)) < 1e-5, threads << " threads: dv");
            }
            for (std::size_t i = 0; i < 5; ++i) BOOST_TEST(same_bits(runs[i], runs[i + 5]), "1 and 2 threads: " << i);
        }
    }
}

BOOST_AUTO_TEST_CASE(flash_backward_of_bf16_is_the_fp32_kernel_on_the_widened_inputs) {
    std::mt19937_64 rng(fresh_seed("flash bf16"));
    const Gqa s{2, 37, 6, 2, 16};
    const auto q16 = halves(randn(s.B * s.T * s.QC(), rng)), k16 = halves(randn(s.B * s.T * s.KC(), rng)),
               v16 = halves(randn(s.B * s.T * s.KC(), rng));
    const Vf dout = randn(s.B * s.T * s.QC(), rng);
    Rig r;
    auto out = r.up(Vf(q16.size(), kNaN)), lse = r.up(Vf(s.B * s.NH * s.T, kNaN));
    r->flash_gqa_forward(r.s(), out, lse, r.in(widened(q16)), r.in(widened(k16)), r.in(widened(v16)), s.B, s.T, s.NH,
                         s.KVH, s.hd);
    const auto o16 = halves(r.down(out));
    auto dq32 = r.up(Vf(q16.size(), kNaN)), dk32 = r.up(Vf(k16.size(), kNaN)), dv32 = r.up(Vf(v16.size(), kNaN));
    auto dq16 = r.up(Vf(q16.size(), kNaN)), dk16 = r.up(Vf(k16.size(), kNaN)), dv16 = r.up(Vf(v16.size(), kNaN));
    auto delta = r.up(Vf(s.B * s.NH * s.T, kNaN));
    const auto D = r.in(dout);
    const auto Q = r.in(q16), K = r.in(k16), V = r.in(v16), O = r.in(o16);
    r->flash_gqa_backward(r.s(), dq32, dk32, dv32, delta, D, r.in(widened(q16)), r.in(widened(k16)),
                          r.in(widened(v16)), r.in(widened(o16)), lse, s.B, s.T, s.NH, s.KVH, s.hd);
    r->flash_gqa_backward(r.s(), dq16, dk16, dv16, delta, D, Q, K, V, O, lse, s.B, s.T, s.NH, s.KVH, s.hd);
    const Vf wq = r.down(dq32);
    BOOST_TEST(same_bits(r.down(dq16), wq));
    BOOST_TEST(same_bits(r.down(dk16), r.down(dk32)));
    BOOST_TEST(same_bits(r.down(dv16), r.down(dv32)));
    BOOST_TEST(std::all_of(wq.begin(), wq.end(), [](float x) { return std::isfinite(x); }));
    const std::span<const float> L = lse;
    const std::string what = testing::what_of<InternalError>(
        [&] {
            r->flash_gqa_backward(r.s(), dq16, dk16, dv16, delta, D, Q, K, V, O, L.first(L.size() - 1), s.B, s.T,
                                  s.NH, s.KVH, s.hd);
        },
        "a short lse");
    BOOST_TEST(testing::contains(what, "lse"), what);
    BOOST_CHECK_THROW(r->flash_gqa_backward(r.s(), dq16, dk16, dv16, delta, D, Q, K, r.in(widened(v16)), O, L, s.B,
                                            s.T, s.NH, s.KVH, s.hd),
                      InternalError);  // v fp32 beside a bf16 q, k and out
}
