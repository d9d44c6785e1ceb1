// Unit tests of libzinf shard's initial values: the Philox reference,
// statistics, tiles, bf16 rounding, and values pinned bit for bit.
#define BOOST_TEST_MODULE shard_values
#include "shard_testing.hpp"

using namespace zinf;
using namespace zinf::shard;
using namespace zinf::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ===========================================================================
BOOST_AUTO_TEST_SUITE(initial_values)

BOOST_AUTO_TEST_CASE(philox_matches_random123_known_answers) {
    // Random123's kat_vectors for philox4x32-10: counter words, key words, output.
    BOOST_TEST((philox(0, 0, 0) == std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    BOOST_TEST((philox(~0ull, ~0ull, ~0ull) ==
                std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    BOOST_TEST((philox(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull) ==
                std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Value v of a normal tensor, from the Random123 reference and Box-Muller in
// double precision: what the vectorised generator must approximate.
double reference(const Tensor& t, const ModelSpec& spec, std::uint64_t seed, std::uint64_t e) {
    const std::uint64_t v = t.cols == t.key_cols ? e : e / t.cols * t.key_cols + t.col0 + e % t.cols;
    const std::uint64_t stream = xxh3(std::as_bytes(std::span(t.key.data(), t.key.size())));
    const auto o = philox(seed, v / 4, stream);
    const unsigned j = v % 4;
    const double s = 1.0 / 16777216.0;
    const double ur = (static_cast<double>(o[j < 2 ? 0 : 2] >> 8) + 0.5) * s;
    const double ua = static_cast<double>(o[j < 2 ? 1 : 3] >> 8) * s;
    const double r = std::sqrt(-2.0 * std::log(ur)), a = 2.0 * std::numbers::pi * ua;
    const double z = j % 2 == 0 ? r * std::cos(a) : r * std::sin(a);
    const double sd = t.init == InitKind::normal ? 0.02 : 0.02 / std::sqrt(2.0 * static_cast<double>(spec.layers));
    return sd * z;
}

// Every value of four tensors of a small model, and 2000 past 2^32 blocks,
// against the float64 reference: at most 2e-6 apart.
void matches_the_reference(std::uint64_t s) {
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,hidden=70,heads=2,vocab=97,seq=16");
    const auto whole = tensors(spec), tiled = tensors(spec, 3);
    double worst = 0;
    std::size_t checked = 0, bad = 0;
    for (const Tensor* t : {&named(whole, "wte.weight"), &named(whole, "h.1.attn.c_proj.weight"),
                            &named(tiled, "h.0.mlp.c_fc.weight.tile2"), &named(tiled, "h.1.mlp.c_proj.weight.tile1")}) {
        const auto got = values(*t, spec, s, 0, t->numel);
        for (std::uint64_t e = 0; e < t->numel; ++e) {
            const double err = std::abs(got[e] - reference(*t, spec, s, e));
            worst = std::max(worst, err);
            if (err >= 2e-6 && bad++ < 5)
                BOOST_ERROR(t->name << " element " << e << ": " << got[e] << " vs reference " << reference(*t, spec, s, e));
            ++checked;
        }
    }
    // Counters past 2^32 blocks: the high counter word.
    Tensor big;
    big.name = big.key = "big";
    big.numel = big.cols = big.key_cols = (1ull << 36) + 1000;
    big.shape = {big.numel};
    big.init = InitKind::normal;
    const std::uint64_t first = (1ull << 34) + 3;
    const auto got = values(big, spec, s, first, 2000);
    for (std::size_t j = 0; j < got.size(); ++j) {
        const double err = std::abs(got[j] - reference(big, spec, s, first + j));
        worst = std::max(worst, err);
        BOOST_TEST(err < 2e-6, "big element " << first + j);
        ++checked;
    }
    BOOST_TEST(bad == 0u);
    BOOST_TEST_MESSAGE("generator vs reference: " << checked << " values, worst absolute error " << worst);
}

BOOST_AUTO_TEST_CASE(generator_matches_the_reference) { matches_the_reference(seed("generator vs reference")); }

// The seed that failed the case above now and then (issue 47): its
// h.1.mlp.c_proj.weight.tile1 element 832 draws u = 1 - 2^-25, which fp32
// rounds to 1.0: the value was -0 against the reference's 2.35e-6.
BOOST_AUTO_TEST_CASE(generator_matches_the_reference_where_u_rounds_to_one) {
    matches_the_reference(12123437294440939224ull);
}

// Draws at both ends of the radius's uniform, u = (k + 0.5) 2^-24: k = 0 (the
// largest radius, 5.9 sd) and k = 2^24 - 1 (u = 1 - 2^-25, the smallest,
// 2^-12 sd), in both radius words of a Philox block (outputs 0 and 2), each
// value of the pair (cos and sin) checked against the float64 reference.
// The cases were found by searching the counters of tensor "big" under the
// seed above; the test first checks that each still reaches its end.
BOOST_AUTO_TEST_CASE(generator_keeps_the_extreme_draws) {
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,hidden=70,heads=2,vocab=97,seq=16");
    Tensor big;
    big.name = big.key = "big";
    big.numel = big.cols = big.key_cols = 1ull << 36;
    big.shape = {big.numel};
    big.init = InitKind::normal;
    const std::uint64_t s = 12123437294440939224ull;
    const std::uint64_t stream = xxh3(std::as_bytes(std::span(big.key.data(), big.key.size())));
    struct Case {
        std::uint64_t element;  // the first value of the pair that shares the radius
        std::uint32_t k;        // its radius draw's top 24 bits
    };
    for (const Case c : {Case{12649020, 0}, Case{59284978, 0}, Case{21978768, 0xFFFFFF}, Case{121861802, 0xFFFFFF}}) {
        const auto o = philox(s, c.element / 4, stream);
        BOOST_TEST_REQUIRE((o[c.element % 4] >> 8) == c.k, "element " << c.element << " draws k = " << c.k);
        const auto got = values(big, spec, s, c.element, 2);
        for (std::uint64_t j = 0; j < 2; ++j) {
            const double want = reference(big, spec, s, c.element + j);
            BOOST_TEST(std::abs(got[j] - want) < 2e-6,
                       "element " << c.element + j << ": " << got[j] << " vs reference " << want);
            // The smallest radius is 2^-12 sd: a value of zero lost it.
            if (c.k == 0xFFFFFF) BOOST_TEST(std::abs(got[j]) > 0.0, "element " << c.element + j << " is 0");
        }
    }
}

BOOST_AUTO_TEST_CASE(values_depend_on_seed_tensor_and_element_only) {
    const std::uint64_t s = seed("fill determinism");
    std::mt19937_64 rng(s);
    const ModelSpec spec = ModelSpec::parse(kSmall);
    const auto ts = tensors(spec);
    const Tensor& wte = named(ts, "wte.weight");  // 6208 elements: several generator batches
    const auto all = values(wte, spec, s, 0, wte.numel);
    for (std::uint64_t start : {1ull, 2ull, 3ull, 37ull, 1023ull, 1024ull, 1025ull, 4097ull, 6207ull}) {
        const auto part = values(wte, spec, s, start, wte.numel - start);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < part.size(); ++i) differ += !same_bits(part[i], all[start + i]);
        BOOST_TEST(differ == 0u, "fill from " << start);
    }
    for (int k = 0; k < 200; ++k) {  // single elements at random places
        const std::uint64_t e = rng() % wte.numel;
        BOOST_TEST(same_bits(values(wte, spec, s, e, 1)[0], all[e]), "element " << e);
    }
    // Another seed, another tensor: other values.
    const auto other_seed = values(wte, spec, s + 1, 0, wte.numel);
    std::size_t equal = 0;
    for (std::size_t i = 0; i < all.size(); ++i) equal += same_bits(all[i], other_seed[i]);
    BOOST_TEST(equal < 5u);
    const Tensor& wpe = named(ts, "wpe.weight");
    const auto w = values(wpe, spec, s, 0, wpe.numel);
    equal = 0;
    for (std::size_t i = 0; i < w.size(); ++i) equal += same_bits(all[i], w[i]);
    BOOST_TEST(equal < 5u);
    // Distinct values: not a counter stuck on one block.
    std::set<float> distinct(all.begin(), all.end());
    BOOST_TEST(distinct.size() > all.size() * 99 / 100);
}

struct Moments {
    double mean = 0, sd = 0, within_1sd = 0, max_abs = 0;
};
Moments moments(const std::vector<float>& v, double sd_expected) {
    double sum = 0, sum2 = 0, within = 0, mx = 0;
    for (float x : v) {
        sum += x;
        sum2 += double(x) * x;
        within += std::abs(x) < sd_expected;
        mx = std::max(mx, std::abs(double(x)));
    }
    const double n = static_cast<double>(v.size()), mean = sum / n;
    return {mean, std::sqrt(sum2 / n - mean * mean), within / n, mx};
}

BOOST_AUTO_TEST_CASE(normal_and_residual_statistics) {
    const std::uint64_t s = seed("statistics");
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,hidden=1024,heads=16,vocab=977,seq=16");
    const auto ts = tensors(spec);
    struct Case {
        const char* name;
        double sd;
    };
    for (const Case c : {Case{"wte.weight", 0.02}, Case{"h.0.attn.c_proj.weight", 0.02 / std::sqrt(4.0)}}) {
        const Tensor& t = named(ts, c.name);
        BOOST_REQUIRE(t.numel >= 1'000'000u);
        const Moments mo = moments(values(t, spec, s, 0, t.numel), c.sd);
        BOOST_TEST_MESSAGE(c.name << ": n " << t.numel << " mean " << mo.mean << " sd " << mo.sd << " (expected "
                                  << c.sd << ") within 1 sd " << mo.within_1sd << " max |x| " << mo.max_abs);
        BOOST_TEST(std::abs(mo.mean) < 5 * c.sd / 1000, c.name);  // 5 standard errors
        BOOST_TEST(std::abs(mo.sd / c.sd - 1) < 0.02, c.name);
        BOOST_TEST(std::abs(mo.within_1sd - 0.6827) < 0.005, c.name);
        BOOST_TEST(mo.max_abs < 6 * c.sd, c.name);  // Box-Muller on 24-bit uniforms stops below 5.8 sd
        BOOST_TEST(mo.max_abs > 4 * c.sd, c.name);
    }
}

BOOST_AUTO_TEST_CASE(constants_and_padding) {
    const std::uint64_t s = seed("constants");
    const ModelSpec spec = ModelSpec::parse(kSmall);
    const auto ts = tensors(spec);
    for (const Tensor& t : ts) {
        if (t.init != InitKind::zeros && t.init != InitKind::ones) continue;
        const float want = t.init == InitKind::ones ? 1.0f : 0.0f;
        BOOST_TEST((t.name.ends_with(".bias") == (want == 0.0f)), t.name);
        const auto v = values(t, spec, s, 0, t.numel);
        BOOST_TEST(std::all_of(v.begin(), v.end(), [&](float x) { return same_bits(x, want); }), t.name);
    }
    // Past numel every value is +0, whatever the kind.
    for (const char* name : {"wte.weight", "h.1.ln_2.weight", "h.0.mlp.c_fc.bias", "h.1.mlp.c_proj.weight"}) {
        const Tensor& t = named(ts, name);
        const auto full = values(t, spec, s, 0, t.numel);
        const auto tail = values(t, spec, s, t.numel - 8, 20);
        for (std::size_t i = 0; i < 8; ++i) BOOST_TEST(same_bits(tail[i], full[t.numel - 8 + i]), name);
        for (std::size_t i = 8; i < 20; ++i) BOOST_TEST(same_bits(tail[i], 0.0f), name << " padding " << i);
        const auto beyond = values(t, spec, s, t.numel + 5, 10);
        BOOST_TEST(std::all_of(beyond.begin(), beyond.end(), [](float x) { return same_bits(x, 0.0f); }), name);
    }
}

BOOST_AUTO_TEST_CASE(a_tile_holds_the_columns_of_the_untiled_weight) {
    const std::uint64_t s = seed("tiles");
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,hidden=70,heads=2,vocab=97,seq=16");
    const auto whole = tensors(spec);
    for (unsigned tile : {3u, 7u, 70u}) {
        std::size_t tiles = 0;
        for (const Tensor& t : tensors(spec, tile)) {
            if (t.cols == t.key_cols) continue;
            ++tiles;
            const Tensor& w = named(whole, t.key);
            const auto wv = values(w, spec, s, 0, w.numel), tv = values(t, spec, s, 0, t.numel);
            const std::uint64_t rows = t.numel / t.cols;
            std::size_t differ = 0;
            for (std::uint64_t i = 0; i < rows; ++i)
                for (std::uint64_t j = 0; j < t.cols; ++j)
                    differ += !same_bits(tv[i * t.cols + j], wv[i * t.key_cols + t.col0 + j]);
            BOOST_TEST(differ == 0u, t.name << " tile " << tile);
            // A fill that starts mid-row gives the same values.
            const std::uint64_t start = std::min<std::uint64_t>(37, t.numel - 1);
            const auto part = values(t, spec, s, start, t.numel - start + 5);
            differ = 0;
            for (std::uint64_t e = start; e < t.numel; ++e) differ += !same_bits(part[e - start], tv[e]);
            for (std::size_t k = 0; k < 5; ++k) differ += !same_bits(part[t.numel - start + k], 0.0f);
            BOOST_TEST(differ == 0u, t.name << " from " << start);
        }
        BOOST_TEST(tiles == 2u * 4 * tile);
    }
}

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
    auto bits = [](std::uint32_t u) { return std::bit_cast<float>(u); };
    BOOST_TEST(to_bf16(1.0f) == 0x3f80u);
    BOOST_TEST(to_bf16(-2.0f) == 0xc000u);
    BOOST_TEST(to_bf16(0.0f) == 0x0000u);
    BOOST_TEST(to_bf16(-0.0f) == 0x8000u);
    BOOST_TEST(to_bf16(bits(0x3f808000)) == 0x3f80u);  // halfway, down to even
    BOOST_TEST(to_bf16(bits(0x3f818000)) == 0x3f82u);  // halfway, up to even
    BOOST_TEST(to_bf16(bits(0xbf818000)) == 0xbf82u);
    BOOST_TEST(to_bf16(bits(0x3f808001)) == 0x3f81u);  // just above halfway
    BOOST_TEST(to_bf16(bits(0x3f807fff)) == 0x3f80u);  // just below
    BOOST_TEST(to_bf16(bits(0x3f80ffff)) == 0x3f81u);
    BOOST_TEST(to_bf16(bits(0x7f7fffff)) == 0x7f80u);  // FLT_MAX rounds to infinity
    BOOST_TEST(to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80u);
    BOOST_TEST(to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80u);
    BOOST_TEST(to_bf16(bits(0x00018000)) == 0x0002u);  // subnormal halfway, up to even
    for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffffffffu, 0xff800001u, 0x7f80ffffu}) {
        const std::uint16_t b = to_bf16(bits(nan));
        BOOST_TEST(std::isnan(from_bf16(b)), std::hex << nan << " -> " << b);
        BOOST_TEST((b >> 15) == (nan >> 31), "sign kept for " << std::hex << nan);
    }
    BOOST_TEST(from_bf16(0x3f80) == 1.0f);
    BOOST_TEST(from_bf16(0x4049) == 3.140625f);
    BOOST_TEST(from_bf16(0xc000) == -2.0f);
    // Random finite values: the nearer neighbour, ties to even, and within
    // 2^-8 relative on the way back.
    std::mt19937_64 rng(seed("bf16"));
    std::size_t wrong = 0, far = 0;
    for (int i = 0; i < 200000; ++i) {
        std::uint32_t u = static_cast<std::uint32_t>(rng());
        const std::uint32_t e8 = (u >> 23) & 0xff;
        if (e8 >= 0xfe) u = (u & ~(0xffu << 23)) | ((e8 - 2) << 23);  // keep clear of infinity
        if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;                 // exactly halfway
        const float x = bits(u);
        const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16), hi = static_cast<std::uint16_t>(lo + 1);
        const double dlo = std::abs(double(x) - double(from_bf16(lo))), dhi = std::abs(double(x) - double(from_bf16(hi)));
        const std::uint16_t want = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
        const std::uint16_t got = to_bf16(x);
        if (got != want && wrong++ < 5) BOOST_ERROR(std::hex << "to_bf16(0x" << u << ") = 0x" << got << ", want 0x" << want);
        const double back = from_bf16(got);
        if (e8 != 0 && std::abs(back - x) > std::abs(double(x)) * std::ldexp(1.0, -8) && far++ < 5)
            BOOST_ERROR(std::hex << "0x" << u << " comes back as " << back);
    }
    BOOST_TEST(wrong == 0u);
    BOOST_TEST(far == 0u);
}

BOOST_AUTO_TEST_SUITE_END()


// The values are part of the on-disk format: a manifest made on one machine
// must verify, and a rank's partition must match its neighbours', on any
// other. The generator is vectorised per instruction set (SSE, AVX2,
// AVX-512, chosen at run time); this pins its bits, so a build or a CPU that
// gives other values fails here instead of producing a state that differs.
BOOST_AUTO_TEST_CASE(values_are_pinned_bit_for_bit) {
    const auto spec = zinf::shard::ModelSpec::parse("gpt:layers=2,hidden=64,heads=2,vocab=97,seq=16");
    const auto ts = zinf::shard::tensors(spec);
    std::vector<float> v(4099);
    zinf::shard::fill_fp32(ts[0], spec, 0x5eed, 3, v);  // wte.weight, normal, from an odd element
    std::vector<float> r(4096);
    zinf::shard::fill_fp32(ts[6], spec, 0x5eed, 0, r);  // h.0.attn.c_proj.weight, residual
    const auto h1 = zinf::xxh3(std::as_bytes(std::span(v)));
    const auto h2 = zinf::xxh3(std::as_bytes(std::span(r)));
    BOOST_TEST_MESSAGE("pinned values: " << zinf::hex64(h1) << " " << zinf::hex64(h2));
    BOOST_TEST(zinf::hex64(h1) == "8ed680fab34cf917");
    BOOST_TEST(zinf::hex64(h2) == "c45274d68b27c352");
}
