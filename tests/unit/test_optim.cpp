// Unit tests of libzinf optim: the AdamW update against a double-precision
// reference, every instruction-set path and thread count bitwise against the
// portable one, the bf16 rounding of the working parameters, the sum of
// squares (reference, determinism, overflow), the clipping coefficient, the
// loss scaler, and the errors on bad hyper-parameters, spans and Isas.
#define BOOST_TEST_MODULE optim
#include "testing.hpp"

#include <zinf/optim.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace zinf;
using namespace zinf::optim;
using u16 = std::uint16_t;
using u32 = std::uint32_t;

namespace {

constexpr Isa kIsas[] = {Isa::portable, Isa::avx2, Isa::avx512};
constexpr u32 kSpecial[] = {0x7f800000, 0xff800000, 0x7fc12345, 0xffc00007, 0x7f800003, 0x7f7fffff};

// A fresh seed (or ZINF_TEST_SEED), printed on stderr and in the test log.
std::uint64_t fresh_seed(const char* what) {
    const std::uint64_t s = testing::seed(what);
    BOOST_TEST_MESSAGE(what << ": seed " << s << " (replay with ZINF_TEST_SEED=" << s << ")");
    return s;
}

std::vector<Isa> supported_isas() {
    std::vector<Isa> out;
    for (Isa i : kIsas)
        if (isa_supported(i))
            out.push_back(i);
        else
            BOOST_TEST_MESSAGE("instruction set " << isa_name(i) << " not on this CPU: skipped");
    return out;
}

float bits_f(u32 u) { return std::bit_cast<float>(u); }
u32 f_bits(float f) { return std::bit_cast<u32>(f); }

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    // memcmp of an empty vector's null data() is undefined (UBSan): compare only what there is.
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

enum class Out { none, f32, bf16 };

// One range's optimizer state, gradient and outputs, as owned vectors.
struct State {
    std::vector<float> w, m, v, g32, p32;
    std::vector<u16> g16, p16;
    Update update(bool bf16_grad, Out out) {
        Update u{.master = w, .exp_avg = m, .exp_avg_sq = v};
        if (bf16_grad)
            u.grad_bf16 = g16;
        else
            u.grad_f32 = g32;
        if (out == Out::f32) u.param_f32 = p32;
        if (out == Out::bf16) u.param_bf16 = p16;
        return u;
    }
    bool operator==(const State& o) const {
        return same_bits(w, o.w) && same_bits(m, o.m) && same_bits(v, o.v) && same_bits(p32, o.p32) &&
               same_bits(p16, o.p16);
    }
};

// Random state: master normal, exp_avg normal*0.1, exp_avg_sq |normal|*0.01,
// gradient normal*gscale (its bf16 rounding in g16, and in g32 too when
// bf16_grad, so that both name the same values). Outputs hold a marker.
State random_state(std::size_t n, std::mt19937_64& rng, float gscale, bool bf16_grad) {
    std::normal_distribution<float> normal;
    State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
            std::vector<float>(n, -7.0f), std::vector<u16>(n), std::vector<u16>(n, 0xdead)};
    for (std::size_t i = 0; i < n; ++i) {
        s.w[i] = normal(rng);
        s.m[i] = normal(rng) * 0.1f;
        s.v[i] = std::abs(normal(rng)) * 0.01f;
        s.g32[i] = normal(rng) * gscale;
        s.g16[i] = to_bf16(s.g32[i]);
        if (bf16_grad) s.g32[i] = from_bf16(s.g16[i]);
    }
    return s;
}

// |got - ref| / max(|ref|, scale): the error relative to the largest
// magnitude that went into the value. Zero scale: exact or infinite error.
double rel_err(double got, double ref, double scale) {
    const double den = std::max(std::abs(ref), scale);
    return den > 0 ? std::abs(got - ref) / den : (got == ref ? 0 : INFINITY);
}

}  // namespace

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(update_matches_double_reference) {
    std::mt19937_64 rng(fresh_seed("adamw reference"));
    const AdamW h{.lr = 1e-3, .weight_decay = 0.01};
    for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{1000003}})
        for (bool bf16 : {false, true}) {
            const State in = random_state(n, rng, 0.05f, bf16);
            for (std::uint64_t t : {1, 2, 10, 1000})
                for (double gs : {1.0, 0.5}) {
                    BOOST_TEST_CONTEXT("n " << n << (bf16 ? " bf16" : " f32") << " grad, step " << t << ", grad_scale "
                                            << gs) {
                        State s = in;
                        adamw(s.update(bf16, Out::f32), Scalars::make(h, t, gs));
                        // The same formula in double from the same fp32 inputs.
                        const double b1 = h.beta1, b2 = h.beta2, bc1 = 1 - std::pow(b1, double(t)),
                                     bc2 = 1 - std::pow(b2, double(t)), decay = 1 - h.lr * h.weight_decay,
                                     step = h.lr / bc1, ibc2 = 1 / std::sqrt(bc2);
                        double ew = 0, em = 0, ev = 0;
                        for (std::size_t i = 0; i < n; ++i) {
                            const double g = double(in.g32[i]) * gs;
                            const double tm1 = b1 * in.m[i], tm2 = (1 - b1) * g, m = tm1 + tm2;
                            const double tv1 = b2 * in.v[i], tv2 = (1 - b2) * g * g, v = tv1 + tv2;
                            const double d = std::sqrt(v) * ibc2 + h.eps;
                            const double tw1 = in.w[i] * decay, w = tw1 - step * (m / d);
                            const double scale_m = std::max(std::abs(tm1), std::abs(tm2));
                            em = std::max(em, rel_err(s.m[i], m, scale_m));
                            ev = std::max(ev, rel_err(s.v[i], v, std::max(tv1, tv2)));
                            // m may have cancelled: the update term's scale is that of m's addends.
                            ew = std::max(ew, rel_err(s.w[i], w, std::max(std::abs(tw1), step * scale_m / d)));
                        }
                        BOOST_TEST(em < 1e-6);
                        BOOST_TEST(ev < 1e-6);
                        BOOST_TEST(ew < 1e-6);
                        BOOST_TEST(same_bits(s.p32, s.w));  // param_f32 is the master, bit for bit
                    }
                }
        }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(simd_paths_equal_portable_bitwise) {
    std::mt19937_64 rng(fresh_seed("adamw isas"));
    std::uniform_int_distribution<std::uint64_t> step(1, 5000);
    std::uniform_real_distribution<double> gscale(0.01, 2), lr(1e-5, 1e-2);
    const auto isas = supported_isas();
    for (bool bf16 : {false, true})
        for (Out out : {Out::none, Out::f32, Out::bf16})
            for (std::size_t n : {1, 7, 8, 15, 16, 17, 31, 33, 1000, 65537}) {
                const std::uint64_t t = step(rng);
                const double gs = gscale(rng);
                const Scalars sc = Scalars::make({.lr = lr(rng), .weight_decay = 0.05}, t, gs);
                State in = random_state(n, rng, 0.5f, bf16);
                // Some infinities and NaNs (quiet, signalling, payloads) in w, m or g.
                for (std::size_t i = rng() % 61; i < n; i += 61) {
                    const u32 x = kSpecial[rng() % std::size(kSpecial)];
                    const auto which = rng() % 3;
                    (which == 0 ? in.w : which == 1 ? in.m : in.g32)[i] = bits_f(x);
                    if (which == 2) in.g16[i] = u16(x >> 16);
                }
                State want = in;
                adamw_serial(want.update(bf16, out), sc, Isa::portable);
                for (Isa isa : isas) {
                    BOOST_TEST_CONTEXT(isa_name(isa) << ", n " << n << (bf16 ? " bf16" : " f32") << " grad, out "
                                                     << int(out) << ", step " << t << ", grad_scale " << gs) {
                        State got = in;
                        adamw_serial(got.update(bf16, out), sc, isa);
                        BOOST_TEST((got == want), "serial");
                        for (unsigned threads : {1u, 2u, 3u}) {
                            got = in;
                            adamw(got.update(bf16, out), sc, Kernel{isa, threads});
                            BOOST_TEST((got == want), threads << " threads");
                        }
                    }
                }
            }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(param_bf16_rounding) {
    // Master bits -> the bf16 they must give (lr = wd = 0 leaves them as they are).
    const std::vector<std::pair<u32, u16>> cases = {
        {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82},  // ties to even, down and up
        {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80},  // just above / below a tie
        {0x3f818001, 0x3f82}, {0x3f817fff, 0x3f81},
        {0xbf808000, 0xbf80}, {0xbf818000, 0xbf82}, {0xbf808001, 0xbf81},  // negative
        {0x3f800000, 0x3f80}, {0x40490fdb, 0x4049},                        // 1, pi
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80},                        // +/-inf stay inf
        {0x7fc00001, 0x7fc0}, {0xffc00001, 0xffc0}, {0x7fffffff, 0x7fff},  // quiet NaNs
        {0x7f800001, 0x7fc0}, {0xff800001, 0xffc0},                        // signalling: quietened
        {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80},                        // largest finite -> inf
        {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80},
        {0x00000000, 0x0000}, {0x80000000, 0x8000},                        // +0, -0
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, {0x00008001, 0x0001},  // denormals
        {0x00007fff, 0x0000}, {0x807fffff, 0x8080}, {0x80018000, 0x8002}, {0x00000001, 0x0000},
    };
    for (auto [in, want] : cases) {
        BOOST_TEST_CONTEXT(std::hex << "0x" << in) { BOOST_TEST(to_bf16(bits_f(in)) == want); }
    }
    // Every case in every lane position, the vector body and the scalar tail.
    const std::size_t k = cases.size(), n = 16 * k + 7;
    State s0{std::vector<float>(n), std::vector<float>(n, 0.1f), std::vector<float>(n, 0.01f),
             std::vector<float>(n, 0.5f), std::vector<float>(n), std::vector<u16>(n, to_bf16(0.5f)),
             std::vector<u16>(n, 0xdead)};
    for (std::size_t i = 0; i < n; ++i) s0.w[i] = bits_f(cases[i % k].first);
    // Positive m/d: 0 * (m/d) is +0, so -0 - +0 stays -0.
    const Scalars sc = Scalars::make({.lr = 0, .weight_decay = 0}, 3);
    for (Isa isa : supported_isas())
        for (bool bf16 : {false, true}) {
            State s = s0;
            adamw(s.update(bf16, Out::bf16), sc, Kernel{isa, 1});
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const auto [in, want] = cases[i % k];
                // NaNs stay NaNs, quietened by the multiply: the bits of to_bf16(w) either way.
                const u32 w = f_bits(s.w[i]);
                const bool ok = s.p16[i] == want && s.p16[i] == to_bf16(s.w[i]) &&
                                (w == in || (std::isnan(s.w[i]) && (w | 0x400000) == (in | 0x400000)));
                if (!ok && bad++ < 5)
                    BOOST_ERROR(isa_name(isa) << " element " << i << std::hex << ": 0x" << in << " gave 0x" << s.p16[i]
                                              << ", want 0x" << want << " (w 0x" << w << ")");
            }
            BOOST_TEST(bad == 0u);
        }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(sum_squares_reference_determinism_overflow) {
    std::mt19937_64 rng(fresh_seed("sum_squares"));
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> expo(-20, 20);
    const auto isas = supported_isas();
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                          3 * kNormBlock + 5, std::size_t{5000000}}) {
        std::vector<float> f(n);
        std::vector<u16> b(n);
        for (std::size_t i = 0; i < n; ++i) {
            f[i] = normal(rng) * std::exp2(expo(rng));
            b[i] = to_bf16(normal(rng) * std::exp2(expo(rng)));
        }
        long double rf = 0, rb = 0;
        for (std::size_t i = 0; i < n; ++i) {
            rf += static_cast<long double>(f[i]) * f[i];
            rb += static_cast<long double>(from_bf16(b[i])) * from_bf16(b[i]);
        }
        const double ff = sum_squares(std::span<const float>(f), {Isa::portable, 1});
        const double fb = sum_squares(std::span<const u16>(b), {Isa::portable, 1});
        BOOST_TEST_CONTEXT("n " << n) {
            BOOST_TEST(std::abs(ff - rf) <= 1e-12L * rf);
            BOOST_TEST(std::abs(fb - rb) <= 1e-12L * rb);
            if (n == 0) BOOST_TEST((ff == 0 && fb == 0));
            for (Isa isa : isas)
                for (unsigned threads : {1u, 2u, 4u}) {
                    BOOST_TEST_CONTEXT(isa_name(isa) << ", " << threads << " threads") {
                        const double gf = sum_squares(std::span<const float>(f), {isa, threads});
                        const double gb = sum_squares(std::span<const u16>(b), {isa, threads});
                        BOOST_TEST(std::bit_cast<std::uint64_t>(gf) == std::bit_cast<std::uint64_t>(ff));
                        BOOST_TEST(std::bit_cast<std::uint64_t>(gb) == std::bit_cast<std::uint64_t>(fb));
                    }
                }
        }
    }
    // One non-finite element anywhere: a non-finite sum. FLT_MAX squared is finite.
    const std::size_t n = 3 * kNormBlock + 5;
    std::vector<float> f(n);
    std::vector<u16> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = to_bf16(f[i] = normal(rng));
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (Isa isa : isas)
        for (unsigned threads : {1u, 2u, 4u}) {
            const Kernel k{isa, threads};
            for (float bad : {inf, -inf, nan, std::numeric_limits<float>::max()})
                for (std::size_t at : {std::size_t{0}, std::size_t{9}, kNormBlock + 3, 2 * kNormBlock + 4099, n - 1}) {
                    BOOST_TEST_CONTEXT(isa_name(isa) << ", " << threads << " threads, " << bad << " at " << at) {
                        const float fo = f[at];
                        const u16 bo = b[at];
                        f[at] = bad;
                        b[at] = to_bf16(bad);
                        const bool finite = std::isfinite(bad);
                        BOOST_TEST(std::isfinite(sum_squares(std::span<const float>(f), k)) == finite);
                        if (finite) {  // bf16(FLT_MAX) is inf: a finite bf16 instead
                            b[at] = 0x7f7f;
                            BOOST_TEST(std::isfinite(sum_squares(std::span<const u16>(b), k)));
                        } else {
                            BOOST_TEST(!std::isfinite(sum_squares(std::span<const u16>(b), k)));
                        }
                        f[at] = fo;
                        b[at] = bo;
                    }
                }
        }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(clip_coefficient_rule) {
    std::mt19937_64 rng(fresh_seed("clip_coefficient"));
    std::uniform_real_distribution<double> u(0.1, 100);
    for (int i = 0; i < 100; ++i) {
        const double norm = u(rng), max = u(rng);
        BOOST_TEST(clip_coefficient(norm, 0) == 1.0);
        BOOST_TEST(clip_coefficient(norm, -max) == 1.0);
        if (norm + 1e-6 <= max)
            BOOST_TEST(clip_coefficient(norm, max) == 1.0);
        else
            BOOST_TEST(clip_coefficient(norm, max) == max / (norm + 1e-6));
        BOOST_TEST(clip_coefficient(max * 0.5, max) == 1.0);
        BOOST_TEST(clip_coefficient(max * 2, max) == max / (max * 2 + 1e-6));
        BOOST_TEST(clip_coefficient(INFINITY, max) == 1.0);
        BOOST_TEST(clip_coefficient(NAN, max) == 1.0);
    }
    BOOST_TEST(clip_coefficient(0, 1) == 1.0);
    BOOST_TEST(clip_coefficient(1, 1) == 1 / (1 + 1e-6));
    BOOST_TEST(clip_coefficient(INFINITY, 0) == 1.0);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(loss_scaler) {
    // Applies a run of steps, 'x' an overflow and '.' a clean step; the scale after.
    auto steps = [](LossScaler& s, const char* seq) {
        for (; *seq; ++seq) s.update(*seq == 'x');
        return s.scale();
    };
    BOOST_TEST(LossScaler().scale() == 65536.0);
    LossScaler s({.initial = 16, .factor = 2, .min = 3, .growth_interval = 3});
    BOOST_TEST(steps(s, "x") == 8.0);
    BOOST_TEST(steps(s, "xx") == 3.0);  // 8 -> 4 -> max(min, 2)
    BOOST_TEST(steps(s, "x") == 3.0);
    BOOST_TEST(s.overflows() == 4u);
    BOOST_TEST(steps(s, "..") == 3.0);
    BOOST_TEST(steps(s, ".") == 6.0);    // the third clean step in a row
    BOOST_TEST(steps(s, "..x") == 3.0);  // overflow: halved, and the clean count starts again
    BOOST_TEST(steps(s, "..") == 3.0);
    BOOST_TEST(steps(s, ".") == 6.0);
    BOOST_TEST(steps(s, "......") == 24.0);
    BOOST_TEST(s.overflows() == 5u);
    LossScaler f({.initial = 100, .factor = 10, .min = 1, .growth_interval = 1});
    BOOST_TEST(steps(f, ".") == 1000.0);
    BOOST_TEST(steps(f, "xxx") == 1.0);
    BOOST_TEST(f.overflows() == 3u);
    using O = LossScaler::Options;
    BOOST_CHECK_THROW(LossScaler(O{.initial = 1, .min = 2}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.min = 0}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.min = -1}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.factor = 1}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.factor = 0.5}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.growth_interval = 0}), UsageError);
    BOOST_CHECK_THROW(LossScaler(O{.initial = NAN}), UsageError);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(usage_and_internal_errors) {
    BOOST_CHECK_THROW(Scalars::make({}, 0), UsageError);
    BOOST_CHECK_NO_THROW(Scalars::make({}, 1));
    BOOST_CHECK_NO_THROW(AdamW{}.validate());
    BOOST_CHECK_NO_THROW((AdamW{.lr = 0, .beta1 = 0, .beta2 = 0, .weight_decay = 0}.validate()));
    for (const AdamW& bad : {AdamW{.lr = -1e-3}, AdamW{.lr = NAN}, AdamW{.lr = INFINITY}, AdamW{.beta1 = 1},
                             AdamW{.beta1 = 1.5}, AdamW{.beta1 = -0.1}, AdamW{.beta2 = 1}, AdamW{.eps = 0},
                             AdamW{.eps = -1e-8}, AdamW{.weight_decay = -0.01}})
        BOOST_CHECK_THROW(bad.validate(), UsageError);

    const std::size_t n = 8;
    std::vector<float> w(n, 1), m(n, 1), v(n, 1), g(n, 1), p(n), shorter(n - 1);
    std::vector<u16> g16(n, 0x3f80), p16(n), shorter16(n - 1);
    const Update ok{.master = w, .exp_avg = m, .exp_avg_sq = v, .grad_f32 = g};
    BOOST_CHECK_NO_THROW(ok.check());
    auto with = [&](auto edit) {
        Update u = ok;
        edit(u);
        return u;
    };
    const Update bad[] = {
        with([&](Update& u) { u.exp_avg = shorter; }),
        with([&](Update& u) { u.exp_avg_sq = shorter; }),
        with([&](Update& u) { u.grad_f32 = shorter; }),
        with([&](Update& u) { u.grad_f32 = {}; }),  // no gradient
        with([&](Update& u) { u.grad_f32 = {};
            u.grad_bf16 = shorter16; }),
        with([&](Update& u) { u.grad_bf16 = g16; }),  // two gradients
        with([&](Update& u) { u.param_f32 = shorter; }),
        with([&](Update& u) { u.param_bf16 = shorter16; }),
        with([&](Update& u) { u.param_f32 = p;
            u.param_bf16 = p16; }),
    };
    const Scalars sc = Scalars::make({}, 1);
    for (const Update& u : bad) {
        BOOST_CHECK_THROW(u.check(), InternalError);
        BOOST_CHECK_THROW(adamw(u, sc, {Isa::portable, 1}), InternalError);
        BOOST_CHECK_THROW(adamw_serial(u, sc, Isa::portable), InternalError);
    }
    BOOST_TEST(w == std::vector<float>(n, 1));  // nothing written

    for (Isa i : kIsas) BOOST_TEST((parse_isa(isa_name(i)) == i));
    BOOST_CHECK_THROW(parse_isa("sse2"), UsageError);
    BOOST_TEST(isa_supported(Isa::portable));
    BOOST_TEST(isa_supported(best_isa()));
    bool any_missing = false;
    for (Isa i : kIsas)
        if (!isa_supported(i)) {
            any_missing = true;
            BOOST_CHECK_THROW(adamw(ok, sc, {i, 1}), UsageError);
            BOOST_CHECK_THROW(adamw_serial(ok, sc, i), UsageError);
            BOOST_CHECK_THROW(sum_squares(std::span<const float>(g), {i, 1}), UsageError);
        }
    if (!any_missing) BOOST_TEST_MESSAGE("this CPU has every instruction set: no unsupported-Isa error to test");
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(decay_flag) {
    std::mt19937_64 rng(fresh_seed("decay"));
    std::normal_distribution<float> normal;
    const std::size_t n = 37;
    const AdamW h{.lr = 0.01, .weight_decay = 0.1};
    State s0{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
             std::vector<float>(n), std::vector<u16>(n), std::vector<u16>(n)};
    for (float& x : s0.w) x = normal(rng) * 4;
    for (Isa isa : supported_isas())
        for (bool decay : {false, true}) {
            // Zero gradient and moments: the update term is 0 / (0 + eps) = 0.
            State s = s0;
            const Scalars sc = Scalars::make(h, 5, 1, decay);
            BOOST_TEST(sc.decay == (decay ? float(1 - h.lr * h.weight_decay) : 1.0f));
            adamw(s.update(false, Out::f32), sc, Kernel{isa, 1});
            std::vector<float> want = s0.w;
            if (decay)
                for (float& x : want) x *= sc.decay;
            BOOST_TEST_CONTEXT(isa_name(isa) << (decay ? ", decay" : ", no decay")) {
                BOOST_TEST(same_bits(s.w, want));
                BOOST_TEST(same_bits(s.p32, want));
                BOOST_TEST(same_bits(s.m, s0.m));
                BOOST_TEST(same_bits(s.v, s0.v));
                if (decay)
                    for (std::size_t i = 0; i < n; ++i)
                        BOOST_TEST(std::abs(s.w[i] - s0.w[i] * (1 - h.lr * h.weight_decay)) <=
                                   1e-6 * std::abs(s0.w[i]));
            }
        }
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(many_ranges_equal_one_at_a_time) {
    std::mt19937_64 rng(fresh_seed("adamw ranges"));
    const std::size_t sizes[] = {5, 0, 40000, 1, 16384, 17, 70001};
    std::vector<State> in;
    std::vector<Scalars> sc;
    for (std::size_t r = 0; r < std::size(sizes); ++r) {
        in.push_back(random_state(sizes[r], rng, 0.5f, r % 2));
        sc.push_back(Scalars::make({.lr = 1e-3 * (r + 1)}, 1 + rng() % 100, 0.25 * (r + 1), r % 3 != 0));
    }
    auto updates = [&](std::vector<State>& st) {
        std::vector<Update> us;
        for (std::size_t r = 0; r < st.size(); ++r) us.push_back(st[r].update(r % 2, Out(r % 3)));
        return us;
    };
    std::vector<State> want = in;
    const auto wu = updates(want);
    for (std::size_t r = 0; r < wu.size(); ++r) adamw_serial(wu[r], sc[r], Isa::portable);
    for (Isa isa : supported_isas())
        for (unsigned threads : {1u, 2u, 3u}) {
            std::vector<State> got = in;
            adamw(updates(got), sc, Kernel{isa, threads});
            for (std::size_t r = 0; r < got.size(); ++r)
                BOOST_TEST((got[r] == want[r]), isa_name(isa) << ", " << threads << " threads, range " << r);
        }
    std::vector<State> st = in;
    auto us = updates(st);
    BOOST_CHECK_THROW(adamw(us, std::span(sc).first(sc.size() - 1)), InternalError);
    us[3].exp_avg = {};
    BOOST_CHECK_THROW(adamw(us, sc), InternalError);
}
