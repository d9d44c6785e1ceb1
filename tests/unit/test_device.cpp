// Unit tests of libzinf device (the cpu backend): every kernel against a
// naive double-precision reference written here, every backward also against
// central finite differences of the double forward (which proves the
// references' formulas), GEMM in all transpose, padding, batch, alpha and beta
// cases, every kernel but GEMM bitwise the same on 1 and 2 threads, streams
// (order, events across the two streams, a job's error at synchronize and the
// stream afterwards), and the errors: a token or target past the vocabulary,
// a span too short for its shape, an unknown backend, an arena too small.
#define BOOST_TEST_MODULE device
#include "device_reference.hpp"

#include "../../libzinf/src/util/kernel_math.hpp"  // GELU's constants, both backends'

#include <zinf/device.hpp>
#include <zinf/mem.hpp>
#include <zinf/optim.hpp>
#include <zinf/util.hpp>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <stdexcept>
#include <thread>
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
using testing::halves;
using testing::widened;
using testing::random_tokens;
using testing::dbl;
using testing::dot;
using testing::max_err;
using testing::numeric_grad;
using testing::plus;
using testing::Rig;
using testing::same_bits;

// ---------------------------------------------------------------------------
// The references, in double.

// op(A) (m,k) op(B) (k,n), row-major with leading dimensions and strides.
struct GemmShape {
    bool ta, tb;
    u64 m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
};

GemmShape shape_of(const Gemm& g) {
    GemmShape s{g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c};
    if (!s.lda) s.lda = g.ta ? g.m : g.k;
    if (!s.ldb) s.ldb = g.tb ? g.k : g.n;
    if (!s.ldc) s.ldc = g.n;
    if (!s.sa) s.sa = (g.ta ? g.k : g.m) * s.lda;
    if (!s.sb) s.sb = (g.tb ? g.n : g.k) * s.ldb;
    if (!s.sc) s.sc = g.m * s.ldc;
    return s;
}

Vd gemm_ref(const Gemm& g, const Vf& a, const Vf& b, const Vf& c) {
    const GemmShape s = shape_of(g);
    Vd out = dbl(c);
    for (u64 e = 0; e < s.batch; ++e)
        for (u64 i = 0; i < s.m; ++i)
            for (u64 j = 0; j < s.n; ++j) {
                double acc = 0;
                for (u64 p = 0; p < s.k; ++p) {
                    const double x = s.ta ? a[e * s.sa + p * s.lda + i] : a[e * s.sa + i * s.lda + p];
                    const double y = s.tb ? b[e * s.sb + j * s.ldb + p] : b[e * s.sb + p * s.ldb + j];
                    acc += x * y;
                }
                double& o = out[e * s.sc + i * s.ldc + j];
                o = g.alpha * acc + (g.beta == 0 ? 0.0 : g.beta * o);
            }
    return out;
}

struct LayerNorm {
    Vd out, mean, rstd;
};

LayerNorm ln_forward(const Vd& x, const Vd& w, const Vd& b, u64 N, u64 C) {
    LayerNorm r{Vd(N * C), Vd(N), Vd(N)};
    for (u64 i = 0; i < N; ++i) {
        double m = 0, v = 0;
        for (u64 c = 0; c < C; ++c) m += x[i * C + c];
        m /= C;
        for (u64 c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
        v /= C;
        const double s = 1 / std::sqrt(v + 1e-5);
        for (u64 c = 0; c < C; ++c) r.out[i * C + c] = (x[i * C + c] - m) * s * w[c] + b[c];
        r.mean[i] = m;
        r.rstd[i] = s;
    }
    return r;
}

// The analytic gradients of sum(out * dout).
void ln_backward(const Vd& dout, const Vd& x, const Vd& w, u64 N, u64 C, Vd& dinp, Vd& dw, Vd& db) {
    const LayerNorm f = ln_forward(x, w, Vd(C, 0.0), N, C);
    dinp.assign(N * C, 0);
    dw.assign(C, 0);
    db.assign(C, 0);
    for (u64 i = 0; i < N; ++i) {
        double mean_dn = 0, mean_dn_norm = 0;
        for (u64 c = 0; c < C; ++c) {
            const double norm = (x[i * C + c] - f.mean[i]) * f.rstd[i], dn = w[c] * dout[i * C + c];
            mean_dn += dn / C;
            mean_dn_norm += dn * norm / C;
            dw[c] += norm * dout[i * C + c];
            db[c] += dout[i * C + c];
        }
        for (u64 c = 0; c < C; ++c) {
            const double norm = (x[i * C + c] - f.mean[i]) * f.rstd[i], dn = w[c] * dout[i * C + c];
            dinp[i * C + c] = f.rstd[i] * (dn - mean_dn - norm * mean_dn_norm);
        }
    }
}

const double kGeluS = std::sqrt(2 / std::numbers::pi);
double gelu(double x) { return 0.5 * x * (1 + std::tanh(kGeluS * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
    const double t = std::tanh(kGeluS * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluS * (1 + 3 * 0.044715 * x * x);
}

struct AttnShape {
    u64 B, T, C, NH;
    u64 hs() const { return C / NH; }
    u64 q(u64 b, u64 t, u64 h) const { return (b * T + t) * 3 * C + h * hs(); }
    u64 k(u64 b, u64 t, u64 h) const { return q(b, t, h) + C; }
    u64 v(u64 b, u64 t, u64 h) const { return q(b, t, h) + 2 * C; }
    u64 o(u64 b, u64 t, u64 h) const { return (b * T + t) * C + h * hs(); }
    u64 a(u64 b, u64 h, u64 t) const { return ((b * NH + h) * T + t) * T; }
};

void attn_forward(const Vd& qkv, const AttnShape& s, Vd& out, Vd& att) {
    out.assign(s.B * s.T * s.C, 0);
    att.assign(s.B * s.NH * s.T * s.T, 0);
    const double scale = 1 / std::sqrt(double(s.hs()));
    for (u64 b = 0; b < s.B; ++b)
        for (u64 h = 0; h < s.NH; ++h)
            for (u64 t = 0; t < s.T; ++t) {
                Vd pre(t + 1);
                double mx = -INFINITY, sum = 0;
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    for (u64 i = 0; i < s.hs(); ++i) pre[t2] += qkv[s.q(b, t, h) + i] * qkv[s.k(b, t2, h) + i];
                    pre[t2] *= scale;
                    mx = std::max(mx, pre[t2]);
                }
                for (u64 t2 = 0; t2 <= t; ++t2) sum += std::exp(pre[t2] - mx);
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const double p = std::exp(pre[t2] - mx) / sum;
                    att[s.a(b, h, t) + t2] = p;
                    for (u64 i = 0; i < s.hs(); ++i) out[s.o(b, t, h) + i] += p * qkv[s.v(b, t2, h) + i];
                }
            }
}

Vd attn_backward(const Vd& dout, const Vd& qkv, const AttnShape& s) {
    Vd out, att, d(qkv.size(), 0);
    attn_forward(qkv, s, out, att);
    const double scale = 1 / std::sqrt(double(s.hs()));
    for (u64 b = 0; b < s.B; ++b)
        for (u64 h = 0; h < s.NH; ++h)
            for (u64 t = 0; t < s.T; ++t) {
                const double* p = &att[s.a(b, h, t)];
                Vd datt(t + 1);
                double pd = 0;
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    for (u64 i = 0; i < s.hs(); ++i) {
                        datt[t2] += dout[s.o(b, t, h) + i] * qkv[s.v(b, t2, h) + i];
                        d[s.v(b, t2, h) + i] += p[t2] * dout[s.o(b, t, h) + i];
                    }
                    pd += p[t2] * datt[t2];
                }
                for (u64 t2 = 0; t2 <= t; ++t2) {
                    const double dpre = p[t2] * (datt[t2] - pd) * scale;
                    for (u64 i = 0; i < s.hs(); ++i) {
                        d[s.q(b, t, h) + i] += dpre * qkv[s.k(b, t2, h) + i];
                        d[s.k(b, t2, h) + i] += dpre * qkv[s.q(b, t, h) + i];
                    }
                }
            }
    return d;
}

Vd ce_losses(const Vd& x, const Vi& tgt, u64 N, u64 V) {
    Vd l(N);
    for (u64 i = 0; i < N; ++i) {
        double mx = -INFINITY, sum = 0;
        for (u64 j = 0; j < V; ++j) mx = std::max(mx, x[i * V + j]);
        for (u64 j = 0; j < V; ++j) sum += std::exp(x[i * V + j] - mx);
        l[i] = std::log(sum) + mx - x[i * V + tgt[i]];
    }
    return l;
}

Vd ce_grad(const Vd& x, const Vi& tgt, double dloss, u64 N, u64 V) {
    Vd g(N * V);
    for (u64 i = 0; i < N; ++i) {
        double mx = -INFINITY, sum = 0;
        for (u64 j = 0; j < V; ++j) mx = std::max(mx, x[i * V + j]);
        for (u64 j = 0; j < V; ++j) sum += std::exp(x[i * V + j] - mx);
        for (u64 j = 0; j < V; ++j)
            g[i * V + j] = dloss * (std::exp(x[i * V + j] - mx) / sum - (j == u64(tgt[i]) ? 1 : 0));
    }
    return g;
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_CASE(open_backends_and_threads) {
    Rig r;
    BOOST_TEST(r->backend() == "cpu");
    cpu_set_t set;
    CPU_ZERO(&set);
    BOOST_REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
    BOOST_TEST(r->threads() == unsigned(CPU_COUNT(&set)));
    BOOST_TEST(Rig(3)->threads() == 3u);
    BOOST_TEST(r->arena().stats().bytes == 256 * MiB);
    BOOST_TEST(r->arena().backend() == "host");

    // Where cuda cannot run, asking for it says why (test_cuda covers the rest).
    if (const std::string why = cuda_unavailable(); !why.empty()) {
        const std::string cuda = testing::what_of<UsageError>([] { open({.backend = "cuda"}); }, "cuda");
        BOOST_TEST(testing::contains(cuda, why), cuda);
        BOOST_TEST(open({.backend = "auto", .memory_bytes = 64 * MiB})->backend() == "cpu");
    }
    const std::string nope = testing::what_of<UsageError>([] { open({.backend = "nope"}); }, "nope");
    BOOST_TEST(testing::contains(nope, "'nope'"), nope);
    BOOST_TEST(testing::contains(nope, "cpu"), nope);
}

BOOST_AUTO_TEST_CASE(memory_alloc_copy_and_out_of_memory) {
    std::mt19937_64 rng(fresh_seed("device memory"));
    Rig r(0, 1 * MiB);
    auto a = r->alloc<float>(1000, "a");
    BOOST_TEST(a.size() == 1000u);
    const Vf zeros(1000, 0.0f);
    BOOST_TEST(same_bits(r.down(a), zeros));  // alloc zero-fills
    const Vf x = randn(1000, rng);
    auto b = r.up(x);
    r->copy(r.s(), std::as_writable_bytes(a.span()), std::as_bytes(b.span()));  // device to device
    BOOST_TEST(same_bits(r.down(a), x));
    r->zero(r.s(), a.span().subspan(10, 20));
    const Vf z = r.down(a);
    for (std::size_t i = 0; i < z.size(); ++i) BOOST_TEST_REQUIRE(z[i] == (i >= 10 && i < 30 ? 0.0f : x[i]));

    const std::string oom =
        testing::what_of<mem::OutOfMemory>([&] { r->alloc<float>(512 * 1024, "the big one"); }, "arena too small");
    BOOST_TEST(testing::contains(oom, "the big one"), oom);
    testing::what_of<mem::OutOfMemory>([&] { measure_gemm_flops(*r.dev, 1024, 1); }, "gemm benchmark too big");

    auto capped = open({.memory_bytes = 1 * MiB, .max_block = 4 * KiB});
    testing::what_of<mem::OutOfMemory>([&] { capped->alloc<float>(2 * KiB, "past max_block"); }, "max_block");
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(gemm_transposes_padding_batch_alpha_beta) {
    std::mt19937_64 rng(fresh_seed("gemm"));
    Rig r;
    auto run = [&](const Gemm& g, const char* what) {
        const GemmShape s = shape_of(g);
        const u64 na = (s.batch - 1) * s.sa + ((g.ta ? g.k : g.m) - 1) * s.lda + (g.ta ? g.m : g.k);
        const u64 nb = (s.batch - 1) * s.sb + ((g.tb ? g.n : g.k) - 1) * s.ldb + (g.tb ? g.k : g.n);
        const u64 nc = (s.batch - 1) * s.sc + (g.m - 1) * s.ldc + g.n;
        const Vf a = randn(na, rng), b = randn(nb, rng);
        Vf c = randn(nc, rng);
        if (g.beta == 0) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
        auto da = r.up(a), db = r.up(b), dc = r.up(c);
        r->gemm(r.s(), g, da, db, dc);
        const Vf got = r.down(dc);
        const Vd want = gemm_ref(g, a, b, c);
        BOOST_TEST_CONTEXT(what << ": ta " << g.ta << " tb " << g.tb << " m " << g.m << " n " << g.n << " k " << g.k
                                << " batch " << g.batch << " alpha " << g.alpha << " beta " << g.beta) {
            // Elements outside every C are left as they were, bit for bit.
            std::size_t touched_outside = 0;
            Vf got_in, c_in;
            Vd want_in;
            for (u64 i = 0; i < nc; ++i) {
                const u64 e = i / s.sc, row = i % s.sc / s.ldc, col = i % s.sc % s.ldc;
                if (e < s.batch && row < g.m && col < g.n) {
                    got_in.push_back(got[i]);
                    want_in.push_back(want[i]);
                } else if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(c[i])) {
                    ++touched_outside;
                }
            }
            BOOST_TEST(touched_outside == 0u);
            BOOST_TEST(max_err(got_in, want_in) < 1e-5);
        }
    };
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            run({.ta = ta, .tb = tb, .m = 7, .n = 9, .k = 5}, "packed, beta 0 over NaN");
            run({.ta = ta, .tb = tb, .m = 7, .n = 9, .k = 5, .lda = (ta ? 7u : 5u) + 3, .ldb = (tb ? 5u : 9u) + 2,
                 .ldc = 9 + 4, .alpha = 0.5f, .beta = -1.5f},
                "padded");
            run({.ta = ta, .tb = tb, .m = 6, .n = 4, .k = 11, .alpha = 2, .beta = 0.25f, .batch = 3}, "batch packed");
            run({.ta = ta, .tb = tb, .m = 5, .n = 3, .k = 4, .lda = 13, .ldb = 7, .ldc = 6, .alpha = -1, .beta = 1,
                 .batch = 4, .stride_a = 70, .stride_b = 40, .stride_c = 35},
                "batch padded with gaps");
            run({.ta = ta, .tb = tb, .m = 65, .n = 70, .k = 129, .alpha = 1, .beta = 1}, "larger");
        }
    run({.m = 4, .n = 5, .k = 0, .beta = 0.5f}, "k 0 scales C");
    run({.m = 4, .n = 5, .k = 0, .beta = 0}, "k 0, beta 0 zeroes C");
}

// ---------------------------------------------------------------------------
// A GEMM large enough to be split over the device's threads, into pieces of
// whole units (16 columns or 4 rows) that do not divide C evenly: every row
// and column must still be computed (the last one was once left out).
BOOST_AUTO_TEST_CASE(gemm_split_over_threads_covers_all_of_c) {
    std::mt19937_64 rng(fresh_seed("gemm split"));
    for (unsigned threads : {2u, 3u, 4u}) {
        Rig r(threads);
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (auto [m, n] : {std::pair<u64, u64>{17, 16}, {8, 33}, {37, 5}, {3, 101}}) {
                    const u64 k = (u64{1} << 18) / (m * n) + 1;  // past the size that is split
                    const Gemm g{.ta = ta, .tb = tb, .m = m, .n = n, .k = k};
                    const Vf a = randn(m * k, rng), b = randn(k * n, rng);
                    const Vf c(m * n, std::numeric_limits<float>::quiet_NaN());
                    auto da = r.up(a), db = r.up(b), dc = r.up(c);
                    r->gemm(r.s(), g, da, db, dc);
                    const Vf got = r.down(dc);
                    BOOST_TEST_CONTEXT("threads " << threads << " ta " << ta << " tb " << tb << " m " << m << " n "
                                                  << n << " k " << k) {
                        BOOST_TEST(max_err(got, gemm_ref(g, a, b, c)) < 1e-5);
                    }
                }
    }
}

// ---------------------------------------------------------------------------
// Precision::bf16: A and B rounded to bf16 (nearest even), accumulated in
// fp32 into an fp32 C. Against a double reference over the rounded inputs
// the cpu backend is fp32-exact; against the unrounded inputs it is off by
// bf16's rounding, which fp32 would not be; the inputs are left as they were.
BOOST_AUTO_TEST_CASE(gemm_bf16_inputs_round_a_and_b_then_accumulate_in_fp32) {
    std::mt19937_64 rng(fresh_seed("gemm bf16"));
    Rig r;
    auto rounded = [](Vf v) {
        for (float& x : v) x = from_bf16(to_bf16(x));
        return v;
    };
    for (Gemm g : {Gemm{.m = 33, .n = 40, .k = 300}, Gemm{.ta = true, .m = 17, .n = 9, .k = 257, .beta = 1},
                   Gemm{.tb = true, .m = 8, .n = 12, .k = 200, .alpha = 0.5f, .beta = -1},
                   Gemm{.ta = true, .tb = true, .m = 5, .n = 7, .k = 150, .lda = 9, .ldb = 160, .ldc = 11,
                        .batch = 3, .stride_a = 1400, .stride_b = 1200, .stride_c = 60}}) {
        const GemmShape sh = shape_of(g);
        const u64 na = (sh.batch - 1) * sh.sa + ((g.ta ? g.k : g.m) - 1) * sh.lda + (g.ta ? g.m : g.k);
        const u64 nb = (sh.batch - 1) * sh.sb + ((g.tb ? g.n : g.k) - 1) * sh.ldb + (g.tb ? g.k : g.n);
        const u64 nc = (sh.batch - 1) * sh.sc + (g.m - 1) * sh.ldc + g.n;
        const Vf a = randn(na, rng), b = randn(nb, rng), c = randn(nc, rng);
        auto da = r.up(a), db = r.up(b), dc = r.up(c), dc32 = r.up(c);
        g.inputs = Precision::bf16;
        r->gemm(r.s(), g, da, db, dc);
        Gemm g32 = g;
        g32.inputs = Precision::fp32;
        r->gemm(r.s(), g32, da, db, dc32);
        const Vf got = r.down(dc), got32 = r.down(dc32);
        BOOST_TEST_CONTEXT("ta " << g.ta << " tb " << g.tb << " m " << g.m << " n " << g.n << " k " << g.k
                                 << " batch " << g.batch) {
            BOOST_TEST(max_err(got, gemm_ref(g, rounded(a), rounded(b), c)) < 1e-5);
            const double off = max_err(got, gemm_ref(g, a, b, c));
            BOOST_TEST(off > 1e-4, "bf16 rounding shows: " << off);
            BOOST_TEST(off < 1e-2, "within bf16's tolerance: " << off);
            BOOST_TEST(max_err(got32, gemm_ref(g, a, b, c)) < 1e-5);
            BOOST_TEST(same_bits(r.down(da), a));  // rounded into scratch, not in place
            BOOST_TEST(same_bits(r.down(db), b));
            auto again = r.up(c);
            r->gemm(r.s(), g, da, db, again);
            BOOST_TEST(same_bits(r.down(again), got));  // deterministic
        }
    }
}

// Weights stored bf16 (the engine's under Precision::bf16): a GEMM of a
// bf16 B gives the bits of the bf16-input GEMM on B's fp32 copy (packed,
// transposed, padded rows, beta), and so does a ConstView of it; the
// embedding from bf16 tables the bits of the fp32 embedding from their
// widened copies, with and without a position table. A bf16 B refuses fp32
// inputs and a batch; tables of two dtypes are refused.
BOOST_AUTO_TEST_CASE(bf16_weights_read_as_their_fp32_copies) {
    std::mt19937_64 rng(fresh_seed("bf16 weights"));
    Rig r;
    // A transposed: a Llama weight's gradient dy^T x of a bf16 x.
    for (Gemm g : {Gemm{.m = 33, .n = 40, .k = 300}, Gemm{.tb = true, .m = 8, .n = 12, .k = 200, .beta = 1},
                   Gemm{.m = 5, .n = 7, .k = 150, .lda = 160, .ldb = 9, .ldc = 11, .alpha = 0.5f, .beta = -1},
                   Gemm{.ta = true, .m = 24, .n = 30, .k = 70, .beta = 1},
                   Gemm{.ta = true, .m = 6, .n = 9, .k = 50, .lda = 8, .ldb = 12, .ldc = 10, .alpha = 0.5f}}) {
        g.inputs = Precision::bf16;
        const GemmShape sh = shape_of(g);
        const u64 na = ((g.ta ? g.k : g.m) - 1) * sh.lda + (g.ta ? g.m : g.k),
                  nb = ((g.tb ? g.n : g.k) - 1) * sh.ldb + (g.tb ? g.k : g.n);
        const Vf a = randn(na, rng), c = randn((g.m - 1) * sh.ldc + g.n, rng);
        const auto b16 = halves(randn(nb, rng));
        auto da = r.up(a), db = r.up(widened(b16)), dc = r.up(c), d16 = r.up(c), dw = r.up(c);
        auto db16 = r.up(b16);
        r->gemm(r.s(), g, da, db, dc);
        r->gemm(r.s(), g, da, std::span<const std::uint16_t>(db16), d16);
        r->gemm(r.s(), g, da, ConstView(db16), dw);
        BOOST_TEST_CONTEXT("ta " << g.ta << " tb " << g.tb << " m " << g.m << " n " << g.n << " k " << g.k) {
            const Vf want = r.down(dc);
            BOOST_TEST(same_bits(r.down(d16), want));
            BOOST_TEST(same_bits(r.down(dw), want));
            BOOST_TEST(!same_bits(want, c));  // it was written
        }
    }
    {
        auto a = r.up(randn(64, rng)), c = r.up(randn(64, rng));
        auto b = r.up(std::vector<std::uint16_t>(64, to_bf16(1.0f)));
        const std::span<const std::uint16_t> b16(b);
        for (const Gemm& bad : {Gemm{.m = 8, .n = 8, .k = 8},
                                Gemm{.m = 2, .n = 4, .k = 4, .batch = 2, .inputs = Precision::bf16}})
            testing::what_of<InternalError>([&] { r->gemm(r.s(), bad, a, b16, c); }, "a bf16 B refused");
    }
    const u64 B = 2, T = 9, C = 24, V = 37;
    const Vi tok = random_tokens(B * T, V, rng);
    const auto te16 = halves(randn(V * C, rng)), pe16 = halves(randn(T * C, rng));
    auto dt = r.up(tok);
    auto te = r.up(widened(te16)), pe = r.up(widened(pe16));
    auto dte16 = r.up(te16), dpe16 = r.up(pe16);
    for (const bool positions : {true, false}) {
        auto want = r.up(Vf(B * T * C, -3.0f)), got = r.up(Vf(B * T * C, -3.0f)), via = r.up(Vf(B * T * C, -3.0f));
        const std::span<const float> pe32 = positions ? std::span<const float>(pe) : std::span<const float>();
        const std::span<const std::uint16_t> pe_16 =
            positions ? std::span<const std::uint16_t>(dpe16) : std::span<const std::uint16_t>();
        r->embedding_forward(r.s(), want, dt, te, pe32, B, T, C, V);
        r->embedding_forward(r.s(), got, dt, std::span<const std::uint16_t>(dte16), pe_16, B, T, C, V);
        r->embedding_forward(r.s(), via, dt, ConstView(dte16), ConstView(pe_16), B, T, C, V);
        BOOST_TEST_CONTEXT("position table " << positions) {
            const Vf w = r.down(want);
            BOOST_TEST(same_bits(r.down(got), w));
            BOOST_TEST(same_bits(r.down(via), w));
        }
    }
    testing::what_of<InternalError>(
        [&] {
            auto out = r.up(Vf(B * T * C));
            r->embedding_forward(r.s(), out, dt, ConstView(dte16), ConstView(pe), B, T, C, V);
        },
        "tables of two dtypes");
}

// Activations a block keeps bf16 (model.hpp's Kept): a GEMM of a bf16 A
// (transposed or not, padded rows, alpha and beta; B fp32 or bf16) gives the
// bits of the bf16-input GEMM on A's fp32 copy, and ConstViews of an fp32
// A and B the bits of the plain GEMM; GELU from a bf16 input gives the
// fp32 kernels' bits on its fp32 copy, the forward's output rounded to bf16
// as the cast rounds. A bf16 A refuses fp32 inputs and a batch.
BOOST_AUTO_TEST_CASE(bf16_activations_read_as_their_fp32_copies) {
    std::mt19937_64 rng(fresh_seed("bf16 activations"));
    Rig r;
    for (Gemm g : {Gemm{.m = 33, .n = 40, .k = 300}, Gemm{.ta = true, .m = 24, .n = 30, .k = 70, .beta = 1},
                   Gemm{.ta = true, .m = 6, .n = 9, .k = 50, .lda = 8, .ldb = 12, .ldc = 10, .alpha = 0.5f,
                        .beta = -1},
                   Gemm{.tb = true, .m = 5, .n = 7, .k = 150, .lda = 160, .ldb = 151, .ldc = 11}}) {
        g.inputs = Precision::bf16;
        const GemmShape sh = shape_of(g);
        const u64 na = ((g.ta ? g.k : g.m) - 1) * sh.lda + (g.ta ? g.m : g.k),
                  nb = ((g.tb ? g.n : g.k) - 1) * sh.ldb + (g.tb ? g.k : g.n);
        const auto a16 = halves(randn(na, rng));
        const Vf b = randn(nb, rng), c = randn((g.m - 1) * sh.ldc + g.n, rng);
        const auto b16 = halves(b);
        auto da = r.up(widened(a16)), db = r.up(b), dbw = r.up(widened(b16));
        auto da16 = r.up(a16), db16 = r.up(b16);
        auto want = r.up(c), want16 = r.up(c), got = r.up(c), got16 = r.up(c), plain = r.up(c), via = r.up(c);
        r->gemm(r.s(), g, da, db, want);
        r->gemm(r.s(), g, da, dbw, want16);
        r->gemm(r.s(), g, ConstView(da16), ConstView(db), got);
        r->gemm(r.s(), g, ConstView(da16), ConstView(db16), got16);
        Gemm f = g;
        f.inputs = Precision::fp32;
        r->gemm(r.s(), f, da, db, plain);
        r->gemm(r.s(), f, ConstView(da), ConstView(db), via);
        BOOST_TEST_CONTEXT("ta " << g.ta << " tb " << g.tb << " m " << g.m << " n " << g.n << " k " << g.k) {
            const Vf w = r.down(want);
            BOOST_TEST(same_bits(r.down(got), w));
            BOOST_TEST(same_bits(r.down(got16), r.down(want16)));
            BOOST_TEST(!same_bits(w, c));  // it was written
            BOOST_TEST(same_bits(r.down(via), r.down(plain)));
            BOOST_TEST(!same_bits(r.down(plain), w));  // B's rounding shows
            BOOST_TEST(same_bits(r.down(db), b));  // rounded into scratch, not in place
        }
    }
    {
        auto a = r.up(std::vector<std::uint16_t>(64, to_bf16(1.0f)));
        auto b = r.up(randn(64, rng)), c = r.up(randn(64, rng));
        for (const Gemm& bad : {Gemm{.m = 8, .n = 8, .k = 8},
                                Gemm{.m = 2, .n = 4, .k = 4, .batch = 2, .inputs = Precision::bf16}})
            testing::what_of<InternalError>([&] { r->gemm(r.s(), bad, ConstView(a), ConstView(b), c); },
                                            "a bf16 A refused");
    }
    const u64 n = 5000;  // past kParallelMin: the threaded loop
    const auto x16 = halves(randn(n, rng, 3.0f));
    const Vf dout = randn(n, rng);
    auto dx = r.up(widened(x16)), dd = r.up(dout), y = r.up(Vf(n, -3.0f));
    auto dx16 = r.up(x16), y16 = r.up(std::vector<std::uint16_t>(n, 0x7fc0)), cast16 = r.up(std::vector<std::uint16_t>(n));
    r->gelu_forward(r.s(), y, dx);
    r->cast(r.s(), cast16, std::span<const float>(y));
    r->gelu_forward(r.s(), y16.span(), std::span<const std::uint16_t>(dx16));
    BOOST_TEST(same_bits(r.down(y16), r.down(cast16)));
    BOOST_TEST(!same_bits(r.down(y16), x16));
    auto g32 = r.up(Vf(n, -3.0f)), g16 = r.up(Vf(n, -3.0f));
    r->gelu_backward(r.s(), g32, dx, dd);
    r->gelu_backward(r.s(), g16, std::span<const std::uint16_t>(dx16), dd);
    BOOST_TEST(same_bits(r.down(g16), r.down(g32)));
    BOOST_TEST(!same_bits(r.down(g16), dout));
    testing::what_of<InternalError>(
        [&] { r->gelu_backward(r.s(), g16, std::span<const std::uint16_t>(dx16).first(n - 1), dd); },
        "a short bf16 input");
}

// A GEMM writing bf16 (what the next op reads bf16: kept activations, the
// logits): the fp32 GEMM's result rounded once, bit for bit, and within
// bf16's rounding of the double reference; padding between rows untouched;
// k 0 writes zeros.
BOOST_AUTO_TEST_CASE(gemm_writes_bf16_c_as_its_fp32_result_rounded) {
    std::mt19937_64 rng(fresh_seed("gemm bf16 C"));
    Rig r;
    for (const Gemm& g0 : {Gemm{.m = 37, .n = 53, .k = 29}, Gemm{.ta = true, .tb = true, .m = 20, .n = 30, .k = 40},
                           Gemm{.m = 24, .n = 40, .k = 72, .ldc = 48, .alpha = 0.5f}}) {
        for (const Precision p : {Precision::fp32, Precision::bf16}) {
            Gemm g = g0;
            g.inputs = p;
            const GemmShape s = shape_of(g);
            const Vf a = randn(((g.ta ? g.k : g.m) - 1) * s.lda + (g.ta ? g.m : g.k), rng);
            const Vf b = randn(((g.tb ? g.n : g.k) - 1) * s.ldb + (g.tb ? g.k : g.n), rng);
            const u64 nc = (g.m - 1) * s.ldc + g.n;
            auto da = r.up(a), db = r.up(b);
            auto c32 = r.up(Vf(nc, 0.0f));
            auto c16 = r.up(std::vector<std::uint16_t>(nc, 0x7fc0));  // NaN: the padding must stay so
            r->gemm(r.s(), g, da, db, c32);
            r->gemm(r.s(), g, da, db, c16);
            const Vf f = r.down(c32);
            const auto h = r.down(c16);
            const Vd want = gemm_ref(g, p == Precision::bf16 ? widened(halves(a)) : a,
                                     p == Precision::bf16 ? widened(halves(b)) : b, Vf(nc, 0.0f));
            std::size_t wrong = 0, pad = 0;
            double worst = 0;
            for (u64 i = 0; i < nc; ++i) {
                if (i % s.ldc >= g.n) {
                    pad += h[i] != 0x7fc0;
                    continue;
                }
                wrong += h[i] != to_bf16(f[i]);
                worst = std::max(worst, std::abs(from_bf16(h[i]) - want[i]) / (std::abs(want[i]) + 1));
            }
            BOOST_TEST_CONTEXT("ta " << g.ta << " tb " << g.tb << " ldc " << s.ldc << " " << precision_name(p)) {
                BOOST_TEST(wrong == 0u);
                BOOST_TEST(pad == 0u);
                BOOST_TEST(worst < 1.0 / 256);  // bf16 keeps 8 bits
            }
        }
    }
    auto zero = r.up(std::vector<std::uint16_t>(12, 0x7fc0));
    r->gemm(r.s(), Gemm{.m = 3, .n = 4, .k = 0}, r.in(Vf(1)), r.in(Vf(1)), zero);
    BOOST_TEST(r.down(zero) == std::vector<std::uint16_t>(12, 0));
}

// The epilogues' GEMMs (gemm_bias, gemm_bias_gelu, gemm_dbias): against
// double references, and bit for bit what the GEMM and the separate kernel
// give one after the other (gemm then bias_add; then gelu_forward of pre as
// stored; bias_backward then gemm): the cpu backend's bits are the same as
// before the fusion. A tile's columns (ldc past n, a bias of the tile's
// columns), fp32 and bf16 outputs, the bias's gradient from B (Conv1D's x^T
// dy) and from A (nn.Linear's dy^T x) at a row stride past its columns.
BOOST_AUTO_TEST_CASE(gemm_epilogues_match_reference_and_the_separate_kernels) {
    std::mt19937_64 rng(fresh_seed("gemm epilogues"));
    Rig r;
    const Vf nan_c(1, std::numeric_limits<float>::quiet_NaN());
    for (const bool bf16 : {false, true})
        for (const Gemm& g0 : {Gemm{.m = 67, .n = 96, .k = 48}, Gemm{.tb = true, .m = 33, .n = 40, .k = 72, .ldc = 56},
                               Gemm{.m = 300, .n = 130, .k = 129}}) {
            Gemm g = g0;
            if (bf16) g.inputs = Precision::bf16;
            const GemmShape s = shape_of(g);
            const Vf a = randn((g.m - 1) * s.lda + g.k, rng);
            const Vf b = randn(((g.tb ? g.n : g.k) - 1) * s.ldb + (g.tb ? g.k : g.n), rng), bias = randn(g.n, rng);
            const u64 nc = (g.m - 1) * s.ldc + g.n;
            auto da = r.up(a), db = r.up(b);
            const auto dbias = r.in(bias);
            // The outputs of both ways, fp32 and bf16 (one of each pair used).
            auto ref_c32 = r->alloc<float>(nc, "ref C");
            auto ref_c16 = r->alloc<std::uint16_t>(nc, "ref C");
            auto ref_out32 = r->alloc<float>(nc, "ref out");
            auto ref_out16 = r->alloc<std::uint16_t>(nc, "ref out");
            auto fc32 = r->alloc<float>(nc, "c"), fpre32 = r->alloc<float>(nc, "pre"), fout32 = r->alloc<float>(nc, "out");
            auto fc16 = r->alloc<std::uint16_t>(nc, "c"), fpre16 = r->alloc<std::uint16_t>(nc, "pre"),
                 fout16 = r->alloc<std::uint16_t>(nc, "out");
            const View rc = bf16 ? View(ref_c16) : View(ref_c32),
                       rout = bf16 ? View(ref_out16) : View(ref_out32), fc = bf16 ? View(fc16) : View(fc32),
                       fpre = bf16 ? View(fpre16) : View(fpre32), fout = bf16 ? View(fout16) : View(fout32);
            // The separate kernels: the GEMM in fp32, the bias, rounded (bf16) once.
            auto sep = r->alloc<float>(nc, "separate");
            r->gemm(r.s(), g, da, db, sep);
            // bias_add takes packed rows: add row by row.
            for (u64 i = 0; i < g.m; ++i)
                r->bias_add(r.s(), sep.span().subspan(i * s.ldc, g.n), dbias, 1, g.n);
            for (u64 i = 0; i < g.m; ++i) {
                if (bf16) {
                    r->cast(r.s(), ref_c16.span().subspan(i * s.ldc, g.n),
                            std::span<const float>(sep.span().subspan(i * s.ldc, g.n)));
                    r->gelu_forward(r.s(), ref_out16.span().subspan(i * s.ldc, g.n),
                                    std::span<const std::uint16_t>(ref_c16.span().subspan(i * s.ldc, g.n)));
                } else {
                    r->copy(r.s(), std::as_writable_bytes(ref_c32.span().subspan(i * s.ldc, g.n)),
                            std::as_bytes(sep.span().subspan(i * s.ldc, g.n)));
                    r->gelu_forward(r.s(), ref_out32.span().subspan(i * s.ldc, g.n),
                                    std::span<const float>(sep.span().subspan(i * s.ldc, g.n)));
                }
            }
            r->gemm_bias(r.s(), g, da, db, dbias, fc);
            r->gemm_bias_gelu(r.s(), g, da, db, dbias, fpre, fout);
            r->synchronize(r.s());
            auto bits = [&](const View& v) {
                std::vector<std::uint16_t> h;
                std::vector<std::uint32_t> w;
                if (v.is_bf16()) {
                    h.resize(nc);
                    r->copy(r.s(), std::as_writable_bytes(std::span(h)), v.bytes());
                } else {
                    w.resize(nc);
                    r->copy(r.s(), std::as_writable_bytes(std::span(w)), v.bytes());
                }
                r->synchronize(r.s());
                std::vector<double> out(nc);
                for (u64 i = 0; i < nc; ++i)
                    out[i] = v.is_bf16() ? double(h[i]) : double(w[i]);  // the bits, exactly
                return out;
            };
            auto values = [&](const View& v) {
                const std::vector<double> b = bits(v);
                Vd x(nc);
                for (u64 i = 0; i < nc; ++i)
                    x[i] = v.is_bf16() ? from_bf16(static_cast<std::uint16_t>(b[i]))
                                       : std::bit_cast<float>(static_cast<std::uint32_t>(b[i]));
                return x;
            };
            auto in_c = [&](const Vd& x) {
                Vd o;
                for (u64 i = 0; i < nc; ++i)
                    if (i % s.ldc < g.n) o.push_back(x[i]);
                return o;
            };
            BOOST_TEST_CONTEXT((bf16 ? "bf16" : "fp32") << " m " << g.m << " n " << g.n << " k " << g.k << " ldc "
                                                        << s.ldc) {
                BOOST_TEST((in_c(bits(fc)) == in_c(bits(rc))), "gemm_bias: the GEMM and bias_add's bits");
                BOOST_TEST((in_c(bits(fpre)) == in_c(bits(rc))), "gemm_bias_gelu's pre: gemm_bias's bits");
                BOOST_TEST((in_c(bits(fout)) == in_c(bits(rout))), "gemm_bias_gelu's out: gelu_forward's bits");
                // Against double: the product (of the bf16 values under
                // bf16), + bias, GELU.
                const Vd prod = gemm_ref(g, bf16 ? widened(halves(a)) : a, bf16 ? widened(halves(b)) : b, Vf(nc, 0));
                Vd want(nc), want_g(nc);
                for (u64 i = 0; i < nc; ++i) {
                    want[i] = prod[i] + (i % s.ldc < g.n ? bias[i % s.ldc] : 0.0);
                    want_g[i] = gelu(want[i]);
                }
                const double tol = bf16 ? 1.0 / 128 : 1e-5;
                BOOST_TEST(max_err(in_c(values(fc)), in_c(want)) < tol);
                BOOST_TEST(max_err(in_c(values(fout)), in_c(want_g)) < tol);
            }
        }
    // gemm_dbias: Conv1D's dW (in,out) += x^T dy, db += colsum dy (B); nn.Linear's
    // dW (out,in) += dy^T x, db += colsum dy (A); dy at a row stride past its columns.
    for (const bool of_a : {false, true}) {
        const u64 N = 300, in = 72, out = 40, ld = 56;
        const Vf x = randn(N * in, rng), dy = randn(N * ld, rng), w0 = randn(in * out, rng), db0 = randn(out, rng);
        const Gemm g = of_a ? Gemm{.ta = true, .m = out, .n = in, .k = N, .lda = ld, .beta = 1}
                            : Gemm{.ta = true, .m = in, .n = out, .k = N, .ldb = ld, .beta = 1};
        const auto dx = r.in(x), ddy = r.in(dy);
        auto dw = r.up(w0), ddb = r.up(db0), sw = r.up(w0), sdb = r.up(db0);
        const ConstView a = of_a ? ConstView(ddy) : ConstView(dx), b = of_a ? ConstView(dx) : ConstView(ddy);
        r->gemm_dbias(r.s(), g, a, b, dw, ddb, of_a);
        // The separate kernels: bias_backward over dy's packed copy, then the GEMM.
        Vf packed(N * out);
        for (u64 i = 0; i < N; ++i)
            for (u64 o = 0; o < out; ++o) packed[i * out + o] = dy[i * ld + o];
        r->bias_backward(r.s(), sdb, r.in(packed), N, out);
        r->gemm(r.s(), g, a, b, sw);
        Vd want_db = dbl(db0);
        for (u64 i = 0; i < N; ++i)
            for (u64 o = 0; o < out; ++o) want_db[o] += dy[i * ld + o];
        const Vd want_w = of_a ? gemm_ref(g, dy, x, w0) : gemm_ref(g, x, dy, w0);
        BOOST_TEST_CONTEXT("gemm_dbias, the bias from " << (of_a ? "A" : "B")) {
            BOOST_TEST(same_bits(r.down(ddb), r.down(sdb)));
            BOOST_TEST(same_bits(r.down(dw), r.down(sw)));
            BOOST_TEST(max_err(r.down(ddb), want_db) < 1e-5);
            BOOST_TEST(max_err(r.down(dw), want_w) < 1e-5);
        }
    }
}

BOOST_AUTO_TEST_CASE(precision_names_parse_and_a_bad_one_says_the_choices) {
    for (Precision p : {Precision::fp32, Precision::bf16})
        BOOST_TEST((parse_precision(precision_name(p)) == p), precision_name(p));
    BOOST_TEST(std::string(precision_name(Precision::bf16)) == "bf16");
    const std::string why = testing::what_of<UsageError>([] { parse_precision("fp16"); }, "fp16");
    BOOST_TEST(testing::contains(why, "'fp16'"), why);
    BOOST_TEST(testing::contains(why, "expected fp32 or bf16"), why);
}

BOOST_AUTO_TEST_CASE(bias_embedding_residual_match_reference) {
    std::mt19937_64 rng(fresh_seed("bias, embedding, residual"));
    Rig r;
    const u64 N = 133, OC = 150;
    const Vf out0 = randn(N * OC, rng), bias = randn(OC, rng), dout = randn(N * OC, rng), db0 = randn(OC, rng);
    auto out = r.up(out0), dbias = r.up(db0);
    r->bias_add(r.s(), out, r.in(bias), N, OC);
    r->bias_backward(r.s(), dbias, r.in(dout), N, OC);
    Vd want_out(N * OC), want_db(OC, 0);
    for (u64 i = 0; i < N; ++i)
        for (u64 o = 0; o < OC; ++o) {
            want_out[i * OC + o] = double(out0[i * OC + o]) + bias[o];
            want_db[o] += dout[i * OC + o];
        }
    BOOST_TEST(max_err(r.down(out), want_out) < 1e-6);
    BOOST_TEST(max_err(r.down(dbias), plus(db0, want_db)) < 1e-5);

    const u64 B = 3, T = 37, C = 150, V = 41, maxT = 40;
    const Vi tok = random_tokens(B * T, V, rng);
    const Vf wte = randn(V * C, rng), wpe = randn(maxT * C, rng), d = randn(B * T * C, rng);
    const Vf dwte0 = randn(V * C, rng), dwpe0 = randn(maxT * C, rng);
    auto emb = r->alloc<float>(B * T * C, "emb");
    auto dwte = r.up(dwte0), dwpe = r.up(dwpe0);
    auto dtok = r.up(tok);
    r->embedding_forward(r.s(), emb, dtok, r.in(wte), r.in(wpe), B, T, C, V);
    r->embedding_backward(r.s(), dwte, dwpe, r.in(d), dtok, B, T, C, V);
    Vd want_emb(B * T * C), want_dwte(V * C, 0), want_dwpe(maxT * C, 0);
    for (u64 bt = 0; bt < B * T; ++bt)
        for (u64 c = 0; c < C; ++c) {
            want_emb[bt * C + c] = double(wte[tok[bt] * C + c]) + wpe[bt % T * C + c];
            want_dwte[tok[bt] * C + c] += d[bt * C + c];
            want_dwpe[bt % T * C + c] += d[bt * C + c];
        }
    BOOST_TEST(max_err(r.down(emb), want_emb) < 1e-6);
    BOOST_TEST(max_err(r.down(dwte), plus(dwte0, want_dwte)) < 1e-5);
    BOOST_TEST(max_err(r.down(dwpe), plus(dwpe0, want_dwpe)) < 1e-5);

    const u64 n = 20011;
    const Vf a = randn(n, rng), b = randn(n, rng), acc0 = randn(n, rng);
    auto res = r->alloc<float>(n, "res");
    auto acc = r.up(acc0);
    r->residual_forward(r.s(), res, r.in(a), r.in(b));
    r->accumulate(r.s(), acc, r.in(b));
    const Vf got_res = r.down(res), got_acc = r.down(acc);
    std::size_t wrong = 0;
    for (u64 i = 0; i < n; ++i) wrong += got_res[i] != a[i] + b[i] || got_acc[i] != acc0[i] + b[i];
    BOOST_TEST(wrong == 0u);  // one fp32 add each: exact
}

// Column sums (bias_backward, layernorm_backward's dw and db; the cuda
// backend sums in the same order): the rows in chunks of kSumRows, each in
// row order from zero, the chunks' sums in order from zero, the total added
// to the output. The bits of that order written out here, on 1 and 2
// threads and twice on each; within 1e-5 of the double sums.
BOOST_AUTO_TEST_CASE(column_sums_add_chunks_of_rows_in_a_fixed_order) {
    std::mt19937_64 rng(fresh_seed("column sums"));
    const u64 R = kernel_math::kSumRows, N = 2 * R + 44, C = 150;  // three chunks, the last short; a column tail
    const Vf dout = randn(N * C, rng), x = randn(N * C, rng, 2), w = randn(C, rng), b = randn(C, rng);
    const Vf db0 = randn(C, rng), dw0 = randn(C, rng), dinp0 = randn(N * C, rng);
    std::vector<Vf> first;
    for (unsigned threads : {1u, 2u})
        for (int run = 0; run < 2; ++run) {
            Rig r(threads);
            auto db = r.up(db0);
            r->bias_backward(r.s(), db, r.in(dout), N, C);
            auto y = r->alloc<float>(N * C, "y"), mean = r->alloc<float>(N, "mean"), rstd = r->alloc<float>(N, "rstd");
            r->layernorm_forward(r.s(), y, mean, rstd, r.in(x), r.in(w), r.in(b), N, C);
            auto dinp = r.up(dinp0), dw = r.up(dw0), dlb = r.up(db0);
            r->layernorm_backward(r.s(), dinp, dw, dlb, r.in(dout), r.in(x), r.in(w), mean, rstd, N, C);
            const Vf m = r.down(mean), s = r.down(rstd);
            const Vf got_db = r.down(db), got_dw = r.down(dw), got_dlb = r.down(dlb);
            // The order, element by element, from the forward's mean and rstd.
            const Vf want_db =
                testing::column_sum_order(db0, N, C, R, [&](u64 row, u64 c) { return dout[row * C + c]; });
            const Vf want_dw = testing::column_sum_order(
                dw0, N, C, R, [&](u64 row, u64 c) { return (x[row * C + c] - m[row]) * s[row] * dout[row * C + c]; });
            BOOST_TEST(same_bits(got_db, want_db), threads << " threads, run " << run << ": bias");
            BOOST_TEST(same_bits(got_dlb, want_db), threads << " threads, run " << run << ": layernorm db");
            BOOST_TEST(same_bits(got_dw, want_dw), threads << " threads, run " << run << ": layernorm dw");
            Vd exact(C, 0);
            for (u64 row = 0; row < N; ++row)
                for (u64 c = 0; c < C; ++c) exact[c] += dout[row * C + c];
            BOOST_TEST(max_err(got_db, plus(db0, exact)) < 1e-5);
            if (first.empty()) first = {got_db, got_dw};
            BOOST_TEST(same_bits(got_db, first[0]));
            BOOST_TEST(same_bits(got_dw, first[1]));
        }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(layernorm_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("layernorm"));
    {
        // The analytic gradient of the double reference against central differences.
        const u64 N = 3, C = 7;
        const Vd x = dbl(randn(N * C, rng)), w = dbl(randn(C, rng)), b = dbl(randn(C, rng)),
                 dout = dbl(randn(N * C, rng));
        Vd dinp, dw, db;
        ln_backward(dout, x, w, N, C, dinp, dw, db);
        BOOST_TEST(max_err(dinp, numeric_grad([&](const Vd& v) { return dot(ln_forward(v, w, b, N, C).out, dout); }, x)) < 1e-7);
        BOOST_TEST(max_err(dw, numeric_grad([&](const Vd& v) { return dot(ln_forward(x, v, b, N, C).out, dout); }, w)) < 1e-7);
        BOOST_TEST(max_err(db, numeric_grad([&](const Vd& v) { return dot(ln_forward(x, w, v, N, C).out, dout); }, b)) < 1e-7);
    }
    Rig r;
    const u64 N = 130, C = 150;
    const Vf x = randn(N * C, rng, 2), w = randn(C, rng), b = randn(C, rng), dout = randn(N * C, rng);
    const Vf dinp0 = randn(N * C, rng), dw0 = randn(C, rng), db0 = randn(C, rng);
    auto out = r->alloc<float>(N * C, "out");
    auto mean = r->alloc<float>(N, "mean");
    auto rstd = r->alloc<float>(N, "rstd");
    auto dx = r.up(x), dwt = r.up(w);
    auto dinp = r.up(dinp0), dw = r.up(dw0), db = r.up(db0);
    r->layernorm_forward(r.s(), out, mean, rstd, dx, dwt, r.in(b), N, C);
    r->layernorm_backward(r.s(), dinp, dw, db, r.in(dout), dx, dwt, mean, rstd, N, C);
    const LayerNorm want = ln_forward(dbl(x), dbl(w), dbl(b), N, C);
    BOOST_TEST(max_err(r.down(out), want.out) < 1e-5);
    BOOST_TEST(max_err(r.down(mean), want.mean) < 1e-5);
    BOOST_TEST(max_err(r.down(rstd), want.rstd) < 1e-5);
    Vd want_dinp, want_dw, want_db;
    ln_backward(dbl(dout), dbl(x), dbl(w), N, C, want_dinp, want_dw, want_db);
    BOOST_TEST(max_err(r.down(dinp), plus(dinp0, want_dinp)) < 1e-5);
    BOOST_TEST(max_err(r.down(dw), plus(dw0, want_dw)) < 1e-5);
    BOOST_TEST(max_err(r.down(db), plus(db0, want_db)) < 1e-5);
}

// ---------------------------------------------------------------------------
// The residual add fused into the LayerNorm after it (GPT's second norm):
// res += add, kept (bf16: rounded into it, res widened back), then the norm
// of res; against the double reference of the norm of (res + add) (and of
// its bf16 rounding), and bit for bit accumulate, the two casts and
// layernorm_forward in turn, on 1 and 2 threads.
BOOST_AUTO_TEST_CASE(residual_layernorm_is_accumulate_then_layernorm) {
    std::mt19937_64 rng(fresh_seed("residual layernorm"));
    const u64 N = 130, C = 150;
    const Vf res0 = randn(N * C, rng, 2), add = randn(N * C, rng), w = randn(C, rng), b = randn(C, rng);
    for (const bool kept : {false, true})
        for (const unsigned threads : {1u, 2u}) {
            Rig r(threads);
            auto out = r->alloc<float>(N * C, "out"), mean = r->alloc<float>(N, "mean"),
                 rstd = r->alloc<float>(N, "rstd");
            auto res = r.up(res0);
            auto k16 = r.up(std::vector<std::uint16_t>(N * C, 0x7fc0));
            const auto da = r.in(add), dw = r.in(w), db = r.in(b);
            r->residual_layernorm_forward(r.s(), out, mean, rstd, res, da, kept ? View(k16) : View(), dw, db, N, C);
            // The kernels in turn.
            auto out2 = r->alloc<float>(N * C, "out"), mean2 = r->alloc<float>(N, "mean"),
                 rstd2 = r->alloc<float>(N, "rstd");
            auto res2 = r.up(res0);
            auto k2 = r.up(std::vector<std::uint16_t>(N * C, 0x7fc0));
            r->accumulate(r.s(), res2, da);
            if (kept) {
                r->cast(r.s(), k2.span(), std::span<const float>(res2.span()));
                r->cast(r.s(), res2.span(), std::span<const std::uint16_t>(k2.span()));
            }
            r->layernorm_forward(r.s(), out2, mean2, rstd2, res2, dw, db, N, C);
            BOOST_TEST_CONTEXT("kept " << kept << ", threads " << threads) {
                BOOST_TEST(same_bits(r.down(res), r.down(res2)));
                BOOST_TEST(same_bits(r.down(out), r.down(out2)));
                BOOST_TEST(same_bits(r.down(mean), r.down(mean2)));
                BOOST_TEST(same_bits(r.down(rstd), r.down(rstd2)));
                if (kept) BOOST_TEST(r.down(k16) == r.down(k2));
                Vd sum(N * C);
                for (u64 i = 0; i < N * C; ++i) {
                    const float f = res0[i] + add[i];
                    sum[i] = kept ? from_bf16(to_bf16(f)) : double(res0[i]) + add[i];
                }
                const LayerNorm want = ln_forward(sum, dbl(w), dbl(b), N, C);
                BOOST_TEST(max_err(r.down(res), sum) < 1e-6);
                BOOST_TEST(max_err(r.down(out), want.out) < 1e-5);
                BOOST_TEST(max_err(r.down(mean), want.mean) < 1e-5);
                BOOST_TEST(max_err(r.down(rstd), want.rstd) < 1e-5);
            }
        }
}

BOOST_AUTO_TEST_CASE(gelu_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("gelu"));
    {
        Vd x = dbl(randn(64, rng, 3)), fd(64), an(64);
        for (std::size_t i = 0; i < x.size(); ++i) {
            fd[i] = (gelu(x[i] + 1e-6) - gelu(x[i] - 1e-6)) / 2e-6;
            an[i] = gelu_grad(x[i]);
        }
        BOOST_TEST(max_err(an, fd) < 1e-8);
    }
    Rig r;
    const u64 n = 20011;
    Vf x = randn(n, rng, 3);
    x[0] = 20;  // tanh saturated: the gradient is 1, not NaN
    x[1] = -20;
    const Vf dout = randn(n, rng);
    auto out = r->alloc<float>(n, "out");
    auto dinp = r.up(Vf(n, std::numeric_limits<float>::quiet_NaN()));  // written, not +=
    auto dx = r.up(x);
    r->gelu_forward(r.s(), out, dx);
    r->gelu_backward(r.s(), dinp, dx, r.in(dout));
    Vd want(n), want_d(n);
    for (u64 i = 0; i < n; ++i) {
        want[i] = gelu(x[i]);
        want_d[i] = gelu_grad(x[i]) * dout[i];
    }
    const Vf got = r.down(out), got_d = r.down(dinp);
    BOOST_TEST(max_err(got, want) < 1e-6);
    BOOST_TEST(max_err(got_d, want_d) < 1e-5);
    BOOST_TEST(got[0] == 20.0f);
    BOOST_TEST(got_d[0] == dout[0]);
}

// The scale both backends' GELU multiply by is a literal (nvcc has no
// constexpr sqrt): it must be sqrt(2/pi) rounded once from double, as torch's.
BOOST_AUTO_TEST_CASE(gelu_scale_is_sqrt_2_over_pi_rounded_once) {
    BOOST_TEST(kernel_math::kGeluScale == static_cast<float>(std::sqrt(2.0 / std::numbers::pi)));
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(attention_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("attention"));
    {
        const AttnShape s{2, 4, 6, 2};
        const Vd qkv = dbl(randn(s.B * s.T * 3 * s.C, rng)), dout = dbl(randn(s.B * s.T * s.C, rng));
        const Vd an = attn_backward(dout, qkv, s);
        const Vd fd = numeric_grad(
            [&](const Vd& v) {
                Vd out, att;
                attn_forward(v, s, out, att);
                return dot(out, dout);
            },
            qkv);
        BOOST_TEST(max_err(an, fd) < 1e-7);
    }
    Rig r;
    const AttnShape s{2, 17, 48, 4};
    const Vf qkv = randn(s.B * s.T * 3 * s.C, rng), dout = randn(s.B * s.T * s.C, rng);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto out = r->alloc<float>(s.B * s.T * s.C, "out");
    auto att = r.up(Vf(s.B * s.NH * s.T * s.T, nan));  // every entry written, the zeros too
    auto dqkv = r.up(Vf(qkv.size(), nan));              // written, not +=
    auto datt = r.up(Vf(att.size(), nan));               // scratch
    auto dq = r.up(qkv);
    r->attention_forward(r.s(), out, att, dq, s.B, s.T, s.C, s.NH);
    r->attention_backward(r.s(), dqkv, datt, r.in(dout), dq, att, s.B, s.T, s.C, s.NH);
    Vd want_out, want_att;
    attn_forward(dbl(qkv), s, want_out, want_att);
    const Vf got_att = r.down(att);
    BOOST_TEST(max_err(r.down(out), want_out) < 1e-5);
    BOOST_TEST(max_err(got_att, want_att) < 1e-5);
    std::size_t nonzero_above = 0;
    for (u64 bh = 0; bh < s.B * s.NH; ++bh)
        for (u64 t = 0; t < s.T; ++t)
            for (u64 t2 = t + 1; t2 < s.T; ++t2) nonzero_above += got_att[(bh * s.T + t) * s.T + t2] != 0.0f;
    BOOST_TEST(nonzero_above == 0u);
    BOOST_TEST(max_err(r.down(dqkv), attn_backward(dbl(dout), dbl(qkv), s)) < 1e-5);
}

// A GPT block's inner residual kept bf16 (Shape::activations): the
// layernorm backward from it is the fp32 kernel's on its widened copy, to
// the bit (dinp, dw and db added to), on 1 and 2 threads; a short input is
// refused.
BOOST_AUTO_TEST_CASE(layernorm_backward_of_bf16_is_the_fp32_kernel_on_the_widened_input) {
    std::mt19937_64 rng(fresh_seed("layernorm bf16"));
    const u64 N = 70, C = 300;  // past kParallelMin, and column blocks with a tail
    const auto x16 = halves(randn(N * C, rng, 2));
    const Vf w = randn(C, rng), b = randn(C, rng), dout = randn(N * C, rng);
    const Vf dinp0 = randn(N * C, rng), dw0 = randn(C, rng), db0 = randn(C, rng);
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        auto out = r->alloc<float>(N * C, "out");
        auto mean = r->alloc<float>(N, "mean"), rstd = r->alloc<float>(N, "rstd");
        const auto xw = r.in(widened(x16));
        r->layernorm_forward(r.s(), out, mean, rstd, xw, r.in(w), r.in(b), N, C);
        auto di32 = r.up(dinp0), dw32 = r.up(dw0), db32 = r.up(db0);
        auto di16 = r.up(dinp0), dw16 = r.up(dw0), db16 = r.up(db0);
        r->layernorm_backward(r.s(), di32, dw32, db32, r.in(dout), xw, r.in(w), mean, rstd, N, C);
        const auto x = r.in(x16);
        r->layernorm_backward(r.s(), di16, dw16, db16, r.in(dout), x, r.in(w), mean, rstd, N, C);
        BOOST_TEST(same_bits(r.down(di16), r.down(di32)), threads << " threads: dinp");
        BOOST_TEST(same_bits(r.down(dw16), r.down(dw32)), threads << " threads: dw");
        BOOST_TEST(same_bits(r.down(db16), r.down(db32)), threads << " threads: db");
        BOOST_TEST(!same_bits(r.down(dw16), dw0));
        testing::what_of<InternalError>(
            [&] {
                r->layernorm_backward(r.s(), di16, dw16, db16, r.in(dout), x.first(N * C - 1), r.in(w), mean, rstd,
                                      N, C);
            },
            "a short bf16 input");
    }
}

// A GPT block's q/k/v and softmax kept bf16 (Shape::activations): the
// backward from them is the fp32 kernel's on their widened copies, to the
// bit, on 1 and 2 threads (every (b, h) task's own widened rows); dqkv
// written, not +=. Short spans are refused.
BOOST_AUTO_TEST_CASE(attention_backward_of_bf16_is_the_fp32_kernel_on_the_widened_inputs) {
    std::mt19937_64 rng(fresh_seed("attention bf16"));
    const AttnShape s{2, 33, 48, 4};  // past kParallelMin: the team takes the tasks
    const Vf qkv = randn(s.B * s.T * 3 * s.C, rng), dout = randn(s.B * s.T * s.C, rng);
    Vf want;
    {  // the softmax of the forward, rounded as the block keeps it
        Rig r(1);
        auto out = r->alloc<float>(s.B * s.T * s.C, "out");
        auto att = r->alloc<float>(s.B * s.NH * s.T * s.T, "att");
        r->attention_forward(r.s(), out, att, r.in(widened(halves(qkv))), s.B, s.T, s.C, s.NH);
        want = r.down(att);
    }
    const auto qkv16 = halves(qkv), att16 = halves(want);
    for (unsigned threads : {1u, 2u}) {
        Rig r(threads);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        auto d32 = r.up(Vf(qkv.size(), nan)), d16 = r.up(Vf(qkv.size(), nan));
        auto datt = r.up(Vf(att16.size(), nan));
        r->attention_backward(r.s(), d32, datt, r.in(dout), r.in(widened(qkv16)), r.in(widened(att16)), s.B, s.T,
                              s.C, s.NH);
        r->attention_backward(r.s(), d16, datt, r.in(dout), r.in(qkv16), r.in(att16), s.B, s.T, s.C, s.NH);
        const Vf w = r.down(d32);
        BOOST_TEST(same_bits(r.down(d16), w), threads << " threads");
        BOOST_TEST(std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); }));
        testing::what_of<InternalError>(
            [&] {
                r->attention_backward(r.s(), d16, datt, r.in(dout), r.in(qkv16).first(qkv16.size() - 1),
                                      r.in(att16), s.B, s.T, s.C, s.NH);
            },
            "a short bf16 qkv");
    }
}

// One query row against keys and values kept (T,C): attention_forward's last
// row and its softmax row, within rounding (the forward's products are
// OpenBLAS's GEMMs, the decode's dot products on one thread).
BOOST_AUTO_TEST_CASE(attention_decode_is_the_forward_s_last_row) {
    std::mt19937_64 rng(fresh_seed("attention decode"));
    Rig r;
    const AttnShape s{1, 23, 48, 4};
    const u64 T = s.T, C = s.C, NH = s.NH;
    const Vf qkv = randn(T * 3 * C, rng);
    auto out = r->alloc<float>(T * C, "out");
    auto att = r->alloc<float>(NH * T * T, "att");
    r->attention_forward(r.s(), out, att, r.in(qkv), 1, T, C, NH);
    // The cache: k and v of every position, (T,C) each; q of the last.
    Vf k(T * C), v(T * C);
    for (u64 t = 0; t < T; ++t)
        for (u64 c = 0; c < C; ++c) k[t * C + c] = qkv[t * 3 * C + C + c], v[t * C + c] = qkv[t * 3 * C + 2 * C + c];
    const Vf q(qkv.begin() + static_cast<std::ptrdiff_t>((T - 1) * 3 * C),
               qkv.begin() + static_cast<std::ptrdiff_t>((T - 1) * 3 * C + C));
    auto dout = r.up(Vf(C, std::numeric_limits<float>::quiet_NaN()));
    auto datt = r.up(Vf(NH * T, std::numeric_limits<float>::quiet_NaN()));
    r->attention_decode(r.s(), dout, datt, r.in(q), r.in(k), r.in(v), T, C, NH);
    const Vf full = r.down(out), one = r.down(dout), full_att = r.down(att), one_att = r.down(datt);
    auto slice = [](const Vf& x, u64 at, u64 n) {
        return Vf(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    BOOST_TEST(max_err(one, dbl(slice(full, (T - 1) * C, C))) < 1e-6);
    for (u64 h = 0; h < NH; ++h)
        BOOST_TEST(max_err(slice(one_att, h * T, T), dbl(slice(full_att, (h * T + T - 1) * T, T))) < 1e-6);
    BOOST_CHECK_THROW(r->attention_decode(r.s(), dout, datt, r.in(q), r.in(k), r.in(v), T + 1, C, NH), InternalError);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(crossentropy_matches_reference_and_finite_differences) {
    std::mt19937_64 rng(fresh_seed("crossentropy"));
    {
        const u64 N = 3, V = 11;
        const Vd x = dbl(randn(N * V, rng, 2));
        const Vi tgt = random_tokens(N, V, rng);
        const double dloss = 0.37;
        const Vd fd = numeric_grad(
            [&](const Vd& v) {
                double s = 0;
                for (double l : ce_losses(v, tgt, N, V)) s += dloss * l;
                return s;
            },
            x);
        BOOST_TEST(max_err(ce_grad(x, tgt, dloss, N, V), fd) < 1e-7);
    }
    Rig r;
    const u64 N = 20, V = 1001;
    const float dloss = 1.0f / N;
    const Vf x = randn(N * V, rng, 3);
    const Vi tgt = random_tokens(N, V, rng);
    auto logits = r.up(x);
    auto dt = r.up(tgt);
    auto losses = r->alloc<float>(N, "losses");
    auto losses_only = r->alloc<float>(N, "losses only");
    r->crossentropy_forward(r.s(), losses_only, logits, dt, N, V, 0);
    const Vf untouched = r.down(logits);
    BOOST_TEST(same_bits(untouched, x));
    r->crossentropy_forward_backward(r.s(), losses, logits, dt, dloss, N, V, 0);
    const Vd want = ce_losses(dbl(x), tgt, N, V);
    const Vf got = r.down(losses);
    BOOST_TEST(max_err(got, want) < 1e-6);
    BOOST_TEST(same_bits(r.down(losses_only), got));  // one loss, with or without the gradient
    BOOST_TEST(max_err(r.down(logits), ce_grad(dbl(x), tgt, dloss, N, V)) < 1e-5);
}

// ---------------------------------------------------------------------------
// The fused classifier over padded rows (issue 43): rows `ld` apart, the pad
// poisoned with NaN before the call. The padded call gives the packed call's
// bits (losses and gradient), never reads the pad and writes it 0; the
// targets at 0 and V-1; bf16 logits give the fp32 kernel's bits on their
// widened copy, the gradient rounded once; V = 1; the refusals.
namespace {

// x (N,V) packed -> (N,ld) with `fill` in the pad, and back.
template <class T>
std::vector<T> pad_rows(const std::vector<T>& x, u64 N, u64 V, u64 ld, T fill) {
    std::vector<T> p(N * ld, fill);
    for (u64 i = 0; i < N; ++i)
        std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(i * V), V, p.begin() + static_cast<std::ptrdiff_t>(i * ld));
    return p;
}
template <class T>
std::vector<T> unpad_rows(const std::vector<T>& p, u64 N, u64 V, u64 ld) {
    std::vector<T> x;
    for (u64 i = 0; i < N; ++i)
        x.insert(x.end(), p.begin() + static_cast<std::ptrdiff_t>(i * ld),
                 p.begin() + static_cast<std::ptrdiff_t>(i * ld + V));
    return x;
}
template <class T>
bool pad_is_zero(const std::vector<T>& p, u64 N, u64 V, u64 ld) {
    for (u64 i = 0; i < N; ++i)
        for (u64 j = V; j < ld; ++j)
            if (std::bit_cast<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>>(p[i * ld + j]) != 0)
                return false;
    return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(classifier_padded_rows_give_the_packed_bits) {
    std::mt19937_64 rng(fresh_seed("classifier padded"));
    Rig r;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const u64 V : {u64{1001}, u64{1024}, u64{1}, u64{70}}) {
        const u64 N = 9, ld = (V + 63) / 64 * 64;
        const float dloss = 1.0f / N;
        const Vf x = randn(N * V, rng, 3);
        Vi tgt = random_tokens(N, V, rng);
        tgt[0] = 0, tgt[1] = static_cast<std::int32_t>(V - 1);
        auto dt = r.up(tgt);
        // Packed (today's layout), then padded with NaN in the pad.
        auto packed = r.up(x);
        auto lp = r->alloc<float>(N, "losses packed"), lp_only = r->alloc<float>(N, "losses packed only");
        r->crossentropy_forward(r.s(), lp_only, packed, dt, N, V, 0);
        r->crossentropy_forward_backward(r.s(), lp, packed, dt, dloss, N, V, 0);
        auto padded = r.up(pad_rows(x, N, V, ld, nan));
        auto lq = r->alloc<float>(N, "losses padded"), lq_only = r->alloc<float>(N, "losses padded only");
        r->crossentropy_forward(r.s(), lq_only, padded, dt, N, V, ld);
        const Vf before = r.down(padded);
        BOOST_TEST(same_bits(before, pad_rows(x, N, V, ld, nan)), "the forward leaves the logits, V " << V);
        r->crossentropy_forward_backward(r.s(), lq, padded, dt, dloss, N, V, ld);
        const Vf got = r.down(padded);
        BOOST_TEST(same_bits(r.down(lq), r.down(lp)), "losses, V " << V);
        BOOST_TEST(same_bits(r.down(lq_only), r.down(lp_only)), "forward losses, V " << V);
        BOOST_TEST(same_bits(unpad_rows(got, N, V, ld), r.down(packed)), "gradient, V " << V);
        BOOST_TEST(pad_is_zero(got, N, V, ld), "pad written 0, V " << V);
        // Against float64.
        BOOST_TEST(max_err(r.down(lq), ce_losses(dbl(x), tgt, N, V)) < 1e-6);
        BOOST_TEST(max_err(unpad_rows(got, N, V, ld), ce_grad(dbl(x), tgt, dloss, N, V)) < 1e-6);
        if (V == 1) {  // one class: no loss, no gradient
            for (float l : r.down(lq)) BOOST_TEST(l == 0.0f);
            for (float g : got) BOOST_TEST(g == 0.0f);
        }
    }
}

BOOST_AUTO_TEST_CASE(classifier_bf16_logits_round_once) {
    std::mt19937_64 rng(fresh_seed("classifier bf16"));
    Rig r;
    const u64 N = 11, V = 777, ld = 832;
    const float dloss = 0.125f;
    const std::vector<std::uint16_t> xb = halves(randn(N * V, rng, 3));
    Vi tgt = random_tokens(N, V, rng);
    tgt[0] = 0, tgt[N - 1] = static_cast<std::int32_t>(V - 1);
    auto dt = r.up(tgt);
    // The fp32 kernel on the widened copy, packed: what bf16 must give, rounded.
    auto wide = r.up(widened(xb));
    auto lw = r->alloc<float>(N, "losses fp32");
    r->crossentropy_forward_backward(r.s(), lw, wide, dt, dloss, N, V, 0);
    const Vf want_grad = r.down(wide);
    auto half = r.up(pad_rows(xb, N, V, ld, std::uint16_t{0x7fc1}));  // the pad a NaN
    auto lb = r->alloc<float>(N, "losses bf16"), lb_only = r->alloc<float>(N, "losses bf16 only");
    r->crossentropy_forward(r.s(), lb_only, View(half), dt, N, V, ld);
    r->crossentropy_forward_backward(r.s(), lb, View(half), dt, dloss, N, V, ld);
    const auto got = r.down(half);
    BOOST_TEST(same_bits(r.down(lb), r.down(lw)));
    BOOST_TEST(same_bits(r.down(lb_only), r.down(lw)));
    BOOST_TEST(same_bits(unpad_rows(got, N, V, ld), halves(want_grad)));
    BOOST_TEST(pad_is_zero(got, N, V, ld));
    // Against float64 on the widened logits, within bf16's rounding of the
    // gradient (half a unit in the last of its 8 bits: 2^-9 of an element,
    // here of the largest).
    const Vd ref = ce_grad(dbl(widened(xb)), tgt, dloss, N, V);
    BOOST_TEST(max_err(widened(unpad_rows(got, N, V, ld)), ref) < 1.0 / 512 + 1e-6);
    BOOST_TEST(max_err(r.down(lb), ce_losses(dbl(widened(xb)), tgt, N, V)) < 1e-6);
}

BOOST_AUTO_TEST_CASE(classifier_refuses_a_short_stride_or_span) {
    Rig r;
    auto logits = r.up(Vf(4 * 64, 0.5f));
    auto losses = r->alloc<float>(4, "losses");
    auto tgt = r.up(Vi{0, 1, 2, 3});
    const std::string short_stride = testing::what_of<InternalError>(
        [&] { r->crossentropy_forward_backward(r.s(), losses, logits, tgt, 1, 4, 50, 40); }, "ldl 40 < V 50");
    BOOST_TEST(short_stride.find("ldl is less than V") != std::string::npos, short_stride);
    const std::string short_span = testing::what_of<InternalError>(
        [&] { r->crossentropy_forward(r.s(), losses, logits, tgt, 4, 50, 128); }, "4 rows of 128");
    BOOST_TEST(short_span.find("logits has 256 elements, the shape needs 512") != std::string::npos, short_span);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(casts_and_adamw_bitwise) {
    std::mt19937_64 rng(fresh_seed("casts, adamw"));
    Rig r;
    const u64 n = 70001;
    Vf x = randn(n, rng, 100);
    const std::uint32_t special[] = {0x3f808000, 0x3f818000, 0x7f800000, 0xff800000, 0x7fc12345, 0x7f7fffff, 0};
    for (std::size_t i = 0; i < std::size(special); ++i) x[i * 997] = std::bit_cast<float>(special[i]);
    auto half = r->alloc<std::uint16_t>(n, "bf16");
    auto back = r->alloc<float>(n, "back");
    r->cast(r.s(), half, r.in(x));
    r->cast(r.s(), back, half);
    const auto got_half = r.down(half);
    const Vf got_back = r.down(back);
    std::size_t wrong = 0;
    for (u64 i = 0; i < n; ++i)
        wrong += got_half[i] != to_bf16(x[i]) ||
                 std::bit_cast<std::uint32_t>(got_back[i]) != std::uint32_t{got_half[i]} << 16;
    BOOST_TEST(wrong == 0u);

    const u64 m = 5003;
    Vf w = randn(m, rng), mo = randn(m, rng, 0.1f), v = randn(m, rng, 0.01f), g = randn(m, rng);
    for (auto& e : v) e = std::abs(e);
    auto dw = r.up(w), dm = r.up(mo), dv = r.up(v), dg = r.up(g);
    auto dp = r->alloc<std::uint16_t>(m, "param bf16");
    const optim::Scalars k = optim::Scalars::make({.lr = 1e-3}, 3, 0.5);
    r->adamw(r.s(), {.master = dw, .exp_avg = dm, .exp_avg_sq = dv, .grad_f32 = dg, .param_bf16 = dp}, k);
    std::vector<std::uint16_t> p(m);
    optim::adamw({.master = w, .exp_avg = mo, .exp_avg_sq = v, .grad_f32 = g, .param_bf16 = p}, k);
    BOOST_TEST(same_bits(r.down(dw), w));
    BOOST_TEST(same_bits(r.down(dm), mo));
    BOOST_TEST(same_bits(r.down(dv), v));
    BOOST_TEST(same_bits(r.down(dp), p));
    testing::what_of<InternalError>(
        [&] {
            r->adamw(r.s(), {.master = dw, .exp_avg = dm.span().first(5), .exp_avg_sq = dv, .grad_f32 = dg}, k);
        },
        "adamw span");
}

// ---------------------------------------------------------------------------
// Every kernel but GEMM on 1 and on 2 threads: the same bits.
BOOST_AUTO_TEST_CASE(kernels_bitwise_same_for_1_and_2_threads) {
    const std::uint64_t seed = fresh_seed("determinism");
    auto run_all = [seed](unsigned threads) {
        std::mt19937_64 rng(seed);
        Rig r(threads);
        std::vector<Vf> outs;
        auto keep = [&](const Array<float>& a) { outs.push_back(r.down(a)); };
        const u64 N = 128, C = 200;
        {
            auto out = r.up(randn(N * C, rng)), db = r.up(randn(C, rng));
            auto dout = r.up(randn(N * C, rng));
            r->bias_add(r.s(), out, r.in(randn(C, rng)), N, C);
            r->bias_backward(r.s(), db, dout, N, C);
            keep(out), keep(db);
            auto y = r->alloc<float>(N * C, "y"), mean = r->alloc<float>(N, "m"), rstd = r->alloc<float>(N, "r");
            auto x = r.up(randn(N * C, rng)), w = r.up(randn(C, rng));
            auto dinp = r.up(randn(N * C, rng)), dw = r.up(randn(C, rng)), dbb = r.up(randn(C, rng));
            r->layernorm_forward(r.s(), y, mean, rstd, x, w, r.in(randn(C, rng)), N, C);
            r->layernorm_backward(r.s(), dinp, dw, dbb, dout, x, w, mean, rstd, N, C);
            keep(y), keep(mean), keep(rstd), keep(dinp), keep(dw), keep(dbb);
            auto g = r->alloc<float>(N * C, "g"), dg = r->alloc<float>(N * C, "dg");
            r->gelu_forward(r.s(), g, x);
            r->gelu_backward(r.s(), dg, x, dout);
            keep(g), keep(dg);
            auto res = r->alloc<float>(N * C, "res");
            r->residual_forward(r.s(), res, x, dout);
            r->accumulate(r.s(), dinp, dout);
            keep(res), keep(dinp);
        }
        {
            const u64 B = 4, T = 32, V = 50;
            auto tok = r.up(random_tokens(B * T, V, rng));
            auto emb = r->alloc<float>(B * T * C, "emb");
            auto dwte = r.up(randn(V * C, rng)), dwpe = r.up(randn(T * C, rng));
            r->embedding_forward(r.s(), emb, tok, r.in(randn(V * C, rng)), r.in(randn(T * C, rng)), B, T, C, V);
            r->embedding_backward(r.s(), dwte, dwpe, r.in(randn(B * T * C, rng)), tok, B, T, C, V);
            keep(emb), keep(dwte), keep(dwpe);
        }
        {
            const AttnShape s{2, 24, 64, 4};
            auto qkv = r.up(randn(s.B * s.T * 3 * s.C, rng));
            auto out = r->alloc<float>(s.B * s.T * s.C, "o"), att = r->alloc<float>(s.B * s.NH * s.T * s.T, "a");
            auto dqkv = r->alloc<float>(s.B * s.T * 3 * s.C, "dqkv"), datt = r->alloc<float>(att.size(), "datt");
            r->attention_forward(r.s(), out, att, qkv, s.B, s.T, s.C, s.NH);
            r->attention_backward(r.s(), dqkv, datt, r.in(randn(s.B * s.T * s.C, rng)), qkv, att, s.B, s.T, s.C,
                                  s.NH);
            keep(out), keep(att), keep(dqkv);
        }
        {
            const u64 n = 32, V = 1000;
            auto logits = r.up(randn(n * V, rng, 3));
            auto tgt = r.up(random_tokens(n, V, rng));
            auto l1 = r->alloc<float>(n, "l1"), l2 = r->alloc<float>(n, "l2");
            r->crossentropy_forward(r.s(), l1, logits, tgt, n, V, 0);
            r->crossentropy_forward_backward(r.s(), l2, logits, tgt, 0.03f, n, V, 0);
            keep(l1), keep(l2), keep(logits);
        }
        return outs;
    };
    const auto one = run_all(1), two = run_all(2);
    BOOST_REQUIRE_EQUAL(one.size(), two.size());
    for (std::size_t i = 0; i < one.size(); ++i) BOOST_TEST(same_bits(one[i], two[i]), "output " << i);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(streams_run_in_order) {
    Rig r;
    std::vector<int> seen;
    for (int i = 0; i < 1000; ++i) r->host(r.s(), [&seen, i] { seen.push_back(i); });
    r->synchronize(r.s());
    std::vector<int> want(1000);
    for (int i = 0; i < 1000; ++i) want[i] = i;
    BOOST_TEST(seen == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(events_order_work_across_streams) {
    Rig r;
    Stream &compute = r->compute(), &copies = r->h2d();
    BOOST_TEST(compute.name() == "compute");
    BOOST_TEST(copies.name() == "h2d");
    for (int dir = 0; dir < 2; ++dir) {
        Stream& from = dir ? compute : copies;
        Stream& to = dir ? copies : compute;
        BOOST_TEST_CONTEXT((dir ? "compute -> copies" : "copies -> compute")) {
            std::promise<void> go;
            std::shared_future<void> released = go.get_future().share();
            std::atomic<int> step{0}, seen{-1};
            const Event before = r->record(from);
            r->host(from, [&] {
                released.wait();
                step = 1;
            });
            const Event after = r->record(from);
            r->wait(to, after);
            r->host(to, [&] { seen = step.load(); });
            r->synchronize(before);  // done already: `from` is blocked only behind it
            r->synchronize(Event{});  // a default event is always done
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            BOOST_TEST(seen.load() == -1);  // `to` waits for `from`
            go.set_value();
            r->synchronize(to);
            BOOST_TEST(seen.load() == 1);
            r->synchronize(after);
            BOOST_TEST(step.load() == 1);
        }
    }
}

BOOST_AUTO_TEST_CASE(job_error_surfaces_at_synchronize_and_stream_recovers) {
    Rig r;
    std::atomic<int> ran{0};
    r->host(r.s(), [&] { ran += 1; });
    r->host(r.s(), [] { throw std::runtime_error("boom"); });
    const Event covering = r->record(r.s());
    r->host(r.s(), [&] { ran += 10; });  // dropped: behind the error
    const std::string what = testing::what_of<std::runtime_error>([&] { r->synchronize(r.s()); }, "job error");
    BOOST_TEST(what == "boom");
    BOOST_TEST(ran.load() == 1);
    r->synchronize(r.s());  // reported once
    r->host(r.s(), [&] { ran += 100; });
    r->synchronize(r.s());
    BOOST_TEST(ran.load() == 101);

    // Reported through an event that covers the failed job, too.
    r->host(r.s(), [] { throw DataError("bad data"); });
    const Event e = r->record(r.s());
    testing::what_of<DataError>([&] { r->synchronize(e); }, "event after error");
    r->synchronize(covering);  // long done, its error reported
    r->synchronize(r.s());
}

BOOST_AUTO_TEST_CASE(tokens_and_targets_past_vocabulary_are_data_errors) {
    std::mt19937_64 rng(fresh_seed("bad tokens"));
    Rig r;
    const u64 B = 2, T = 5, C = 8, V = 50;
    Vi tok = random_tokens(B * T, V, rng);
    tok[1 * T + 2] = 50;
    auto emb = r->alloc<float>(B * T * C, "emb");
    auto wte = r.up(randn(V * C, rng)), wpe = r.up(randn(T * C, rng));
    auto dtok = r.up(tok);
    r->embedding_forward(r.s(), emb, dtok, wte, wpe, B, T, C, V);
    std::string what = testing::what_of<DataError>([&] { r->synchronize(r.s()); }, "token = V");
    BOOST_TEST(testing::contains(what, "token 50 at batch row 1, position 2 is not below the vocabulary size 50"),
               what);
    tok[1 * T + 2] = 3;
    tok[0 * T + 4] = -7;
    dtok = r.up(tok);
    r->embedding_backward(r.s(), wte, wpe, emb, dtok, B, T, C, V);
    what = testing::what_of<DataError>([&] { r->synchronize(r.s()); }, "token < 0");
    BOOST_TEST(testing::contains(what, "token -7 at batch row 0, position 4"), what);

    Vi tgt = random_tokens(B * T, V, rng);
    tgt[7] = 51;
    auto logits = r.up(randn(B * T * V, rng));
    auto losses = r->alloc<float>(B * T, "losses");
    auto dtgt = r.up(tgt);
    r->crossentropy_forward_backward(r.s(), losses, logits, dtgt, 1, B * T, V, 0);
    what = testing::what_of<DataError>([&] { r->synchronize(r.s()); }, "target > V");
    BOOST_TEST(testing::contains(what, "target 51 at row 7 is not below the vocabulary size 50"), what);
    r->crossentropy_forward(r.s(), losses, logits, dtgt, B * T, V, 0);
    testing::what_of<DataError>([&] { r->synchronize(r.s()); }, "target > V, loss only");
}

BOOST_AUTO_TEST_CASE(short_spans_are_internal_errors_at_the_call) {
    Rig r;
    auto a = r->alloc<float>(100, "a"), b = r->alloc<float>(100, "b"), c = r->alloc<float>(10, "c");
    auto check = [&](const char* what, const std::function<void()>& fn, std::initializer_list<const char*> parts) {
        const std::string msg = testing::what_of<InternalError>(fn, what);
        for (const char* p : parts) BOOST_TEST(testing::contains(msg, p), what << ": " << msg);
    };
    check("gemm C", [&] { r->gemm(r.s(), {.m = 4, .n = 4, .k = 4}, a, b, c); }, {"gemm", "C has 10", "needs 16"});
    check("gemm lda", [&] { r->gemm(r.s(), {.m = 4, .n = 4, .k = 4, .lda = 3}, a, b, a); }, {"gemm", "lda"});
    check("layernorm mean",
          [&] { r->layernorm_forward(r.s(), a, c, a, a, b, b, 11, 9); }, {"layernorm_forward", "mean has 10", "N=11"});
    check("attention heads", [&] { r->attention_forward(r.s(), a, a, a, 1, 2, 6, 4); },
          {"attention_forward", "multiple of NH"});
    check("gelu inp", [&] { r->gelu_backward(r.s(), a, b, c); }, {"gelu_backward", "dout has 10"});
    check("copy", [&] { r->copy(r.s(), std::as_writable_bytes(c.span()), std::as_bytes(a.span())); }, {"copy", "dst"});
    r->synchronize(r.s());  // nothing was enqueued
}

// A view of an element type its kernel does not take (kernels.def says which)
// is refused at the call too, naming the kernel and the views.
BOOST_AUTO_TEST_CASE(element_types_a_kernel_does_not_take_are_internal_errors_at_the_call) {
    Rig r;
    auto f = r->alloc<float>(64, "f"), g = r->alloc<float>(64, "g");
    auto h = r->alloc<std::uint16_t>(64, "h");
    auto check = [&](const char* what, const std::function<void()>& fn, std::initializer_list<const char*> parts) {
        const std::string msg = testing::what_of<InternalError>(fn, what);
        for (const char* p : parts) BOOST_TEST(testing::contains(msg, p), what << ": " << msg);
    };
    check("gemm bf16 C", [&] { r->gemm(r.s(), {.m = 4, .n = 4, .k = 4, .beta = 1, .inputs = Precision::bf16}, f, g, h); },
          {"gemm", "bf16 C takes beta 0"});
    check("gemm_bias_gelu pre and out",
          [&] { r->gemm_bias_gelu(r.s(), {.m = 4, .n = 4, .k = 4}, f, g, f.span().first(4), f, h); },
          {"gemm_bias_gelu", "out is bf16 and pre fp32"});
    check("gemm_dbias from B transposed",
          [&] { r->gemm_dbias(r.s(), {.tb = true, .m = 4, .n = 4, .k = 4}, f, g, f, g.span().first(4), false); },
          {"gemm_dbias", "not tb"});
    check("gemm_dbias of a bf16 B",
          [&] { r->gemm_dbias(r.s(), {.m = 4, .n = 4, .k = 4, .inputs = Precision::bf16}, f, h, g, f.span().first(4),
                              false); },
          {"gemm_dbias", "B is bf16"});
    check("gelu out and inp", [&] { r->gelu_forward(r.s(), h, f); }, {"gelu_forward", "inp is fp32 and out bf16"});
    check("cast to its own type", [&] { r->cast(r.s(), f, g); }, {"cast from bf16", "both fp32"});
    check("gqa q and k", [&] { r->gqa_backward(r.s(), f, f, f, f, f, h, f, f, f, 1, 2, 2, 2, 2); },
          {"gqa_backward", "k is fp32 and q bf16"});
    r->synchronize(r.s());  // nothing was enqueued
}

BOOST_AUTO_TEST_CASE(gemm_rate_is_measured) {
    Rig r;
    const double flops = measure_gemm_flops(*r.dev, 256, 4);
    BOOST_TEST(flops > 0);
    BOOST_TEST_MESSAGE("sgemm 256: " << flops / 1e9 << " GFLOP/s on " << r->threads() << " threads");
}
