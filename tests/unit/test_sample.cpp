// Unit tests of libzinf sample: the cached forward's logits against a full
// forward's at every position (untiled and tiled, random weights), the same
// decoder through the ZeRO-Infinity engine over a committed manifest (nvme
// and cpu tiers, every pass fetching or all kept) against the resident
// engine, to the bit, reading nothing it should not and writing nothing;
// the run's engine opened for sampling, resident or not, alike; a
// corrupted partition refused; the Chooser's draws (greedy, ties, top-k, the
// vocabulary limit, seeds, frequencies). (Tokenizers: test_text.)
#define BOOST_TEST_MODULE sample
#include "optimizer_fixture.hpp"

#include <zinf/device.hpp>
#include <zinf/gpt.hpp>
#include <zinf/model.hpp>

#include <unistd.h>
#include <zinf/sample.hpp>

#include <cmath>
#include <fstream>

using namespace zinf;
using namespace zinf::testing;

namespace {

constexpr const char* kSpec = "gpt:layers=2,hidden=32,heads=4,vocab=67,seq=16";

std::unique_ptr<device::Device> device_of() {
    return device::open({.backend = "cpu", .memory_bytes = 64 * MiB, .threads = 2});
}

// Weights large enough that attention and the logits are far from uniform:
// uniform in [-0.4, 0.4], LayerNorm weights around 1.
void fill_weights(device::Device& dev, model::ResidentEngine& eng, const model::ParamTable& table, std::uint64_t s) {
    std::mt19937_64 rng(s);
    std::uniform_real_distribution<float> u(-0.4f, 0.4f);
    auto& st = dev.h2d();
    std::vector<std::vector<float>> host(table.size());
    for (std::size_t t = 0; t < table.size(); ++t) {
        host[t].resize(table[t].numel);
        const bool gain = table[t].name.find("ln_") != std::string::npos && table[t].name.ends_with(".weight");
        for (float& v : host[t]) v = (gain ? 1.0f : 0.0f) + u(rng);
        dev.copy(st, std::as_writable_bytes(eng.values(t)), std::as_bytes(std::span(host[t])));
    }
    dev.synchronize(st);
}

// The full forward's logits (T,V) for one row of tokens.
std::vector<float> full_logits(device::Device& dev, model::GPT& gpt, zero::ParamEngine& eng,
                               const std::vector<std::int32_t>& tokens) {
    const std::uint64_t T = tokens.size(), V = gpt.config().vocab;
    auto acts = gpt.plan(dev, {.batch = 1, .seq = T, .checkpoint = false});
    auto& s = dev.compute();
    dev.copy(s, std::as_writable_bytes(acts.inputs.span()), std::as_bytes(std::span(tokens)));
    dev.copy(s, std::as_writable_bytes(acts.targets.span()), std::as_bytes(std::span(tokens)));
    model::Context ctx{dev, s, eng};
    gpt.forward(ctx, acts, false);
    // Rows padded_vocab(V) apart (model.hpp): their first V columns.
    const std::uint64_t ld = model::padded_vocab(V);
    std::vector<float> padded(T * ld), logits;
    dev.copy(s, std::as_writable_bytes(std::span(padded)), std::as_bytes(acts.logits.span()));
    dev.synchronize(s);
    for (std::uint64_t t = 0; t < T; ++t)
        logits.insert(logits.end(), padded.begin() + static_cast<std::ptrdiff_t>(t * ld),
                      padded.begin() + static_cast<std::ptrdiff_t>(t * ld + V));
    return logits;
}

// Every position's logits from the decoder, one step each.
std::vector<float> cached_logits(device::Device& dev, sample::Decoder& dec, const sample::Passes& p,
                                 const std::vector<std::int32_t>& tokens) {
    const std::uint64_t V = dec.vocab();
    std::vector<float> logits(tokens.size() * V);
    auto& s = dev.compute();
    for (std::size_t t = 0; t < tokens.size(); ++t) {
        if (p.begin) p.begin();
        dec.step(s, p.engine, tokens[t], std::span(logits).subspan(t * V, V));
        if (p.end) p.end();
        dev.synchronize(s);
    }
    return logits;
}

std::vector<std::int32_t> random_tokens(std::uint64_t s, std::uint64_t V, std::size_t n) {
    std::mt19937_64 rng(s);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(rng() % V);
    return t;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(decoder)

BOOST_AUTO_TEST_CASE(cached_forward_equals_full_forward_at_every_position) {
    const std::uint64_t s = fresh_seed("cached forward");
    for (unsigned tile : {1u, 3u}) {
        BOOST_TEST_CONTEXT("tile " << tile) {
            auto dev = device_of();
            model::GPT gpt(model::Config::from(shard::ModelSpec::parse(kSpec), tile));
            model::ResidentEngine eng(*dev, model::numels(gpt.params_table()));
            fill_weights(*dev, eng, gpt.params_table(), s);
            const std::uint64_t T = gpt.config().max_seq, V = gpt.config().vocab;
            const auto tokens = random_tokens(s + 1, V, T);
            const auto full = full_logits(*dev, gpt, eng, tokens);
            const std::uint64_t arena_before = dev->arena().stats().used;
            sample::Decoder dec(gpt, *dev, T);
            // Its buffers are the arena bytes it says it takes.
            BOOST_TEST(dev->arena().stats().used - arena_before == sample::Decoder::device_bytes(gpt, T));
            const auto cached = cached_logits(*dev, dec, {eng, {}, {}, {}}, tokens);
            BOOST_REQUIRE_EQUAL(dec.position(), T);
            double worst = 0, spread = 0;
            for (std::uint64_t t = 0; t < T; ++t)
                for (std::uint64_t v = 0; v < V; ++v) {
                    const double a = full[t * V + v], b = cached[t * V + v];
                    worst = std::max(worst, std::abs(a - b));
                    spread = std::max(spread, std::abs(a - full[t * V]));
                    if (std::abs(a - b) > 1e-5)
                        BOOST_ERROR("position " << t << " token " << v << ": full " << a << ", cached " << b);
                }
            BOOST_TEST_MESSAGE("tile " << tile << ": largest difference " << worst);
            BOOST_TEST(spread > 1.0);  // the logits say something: the comparison is not of constants
            // A full cache refuses another position.
            std::vector<float> l(V);
            BOOST_CHECK_THROW(dec.step(dev->compute(), eng, 0, l), UsageError);
            dec.reset();
            BOOST_TEST(dec.position() == 0u);
        }
    }
}

// The decoder through the ZeRO-Infinity engine reading the committed state
// (CommittedParams) gives the resident engine's logits to the bit, whether
// every pass fetches from the tier or everything stays on the device.
BOOST_AUTO_TEST_CASE(through_the_engine_equals_resident) {
    const std::uint64_t s = fresh_seed("engine decode");
    for (shard::Tier tier : {shard::Tier::nvme, shard::Tier::cpu}) {
        for (std::uint64_t persist : {std::uint64_t{0}, ~std::uint64_t{0}}) {
            BOOST_TEST_CONTEXT("param tier " << shard::tier_name(tier) << ", persist below " << persist) {
                Rig rig;
                shard::LayoutOptions lo;
                lo.param_dtype = shard::DType::fp32;
                lo.param_tier = tier;
                lo.train = false;
                lo.seed = s;
                Run run(rig, lo, kSpec);
                auto listing = [&] {
                    std::vector<std::pair<std::string, std::uint64_t>> l;
                    for (const auto& e : fs::recursive_directory_iterator(run.m.dir))
                        l.emplace_back(e.path().string(), e.is_regular_file() ? fs::file_size(e.path()) : 0);
                    std::sort(l.begin(), l.end());
                    return l;
                };
                const auto before = listing();

                auto dev = device_of();
                model::GPT gpt(model::Config::from(run.m.spec));
                const auto tokens = random_tokens(s + 2, run.m.spec.vocab, 12);
                // The reference: every tensor read whole into the resident engine.
                model::ResidentEngine res(*dev, model::numels(gpt.params_table()));
                for (std::size_t t = 0; t < run.m.tensors.size(); ++t) {
                    std::vector<std::byte> full;
                    shard::cat(run.m, t, "param", rig.engine, rig.pool,
                               [&](std::span<const std::byte> b) { full.insert(full.end(), b.begin(), b.end()); });
                    BOOST_REQUIRE_EQUAL(full.size(), res.values(t).size_bytes());
                    dev->copy(dev->h2d(), std::as_writable_bytes(res.values(t)), full);
                    dev->synchronize(dev->h2d());
                }
                sample::Decoder ref_dec(gpt, *dev, tokens.size());
                const auto want = cached_logits(*dev, ref_dec, {res, {}, {}, {}}, tokens);

                auto self = self_comm();
                sample::Decoder dec(gpt, *dev, tokens.size());
                zero::CommittedParams params(run.m, 0, rig.engine, rig.pool);
                zero::InfinityOptions io;
                io.persist_below = persist;
                zero::InfinityEngine inf(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, params, io);
                const auto got = cached_logits(*dev, dec,
                                               {inf, [&] { inf.begin(false); }, [&] { inf.end(); }, {}}, tokens);
                BOOST_REQUIRE_EQUAL(got.size(), want.size());
                BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
                const zero::InfinityStats st = inf.stats();  // of the last pass
                const std::uint64_t from_tier = st.fetched_bytes[tier == shard::Tier::nvme ? 2 : 1];
                if (persist) BOOST_TEST(from_tier == 0u);  // kept since the first pass
                else BOOST_TEST(from_tier > 0u);
                BOOST_TEST((listing() == before));  // nothing written, nothing left
            }
        }
    }
}

// zinf-sample's path: the run's engine (zero::Engine) opened for forward
// passes only, resident or ZeRO-Infinity, keeping every parameter when they
// fit or fetching them every pass: the same logits to the bit as the
// ZeRO-Infinity engine over the committed parameters, the same greedy text
// through generate(), and no training step or save taken.
BOOST_AUTO_TEST_CASE(the_run_engine_samples_alike_in_every_placement) {
    const std::uint64_t s = fresh_seed("run engine decode");
    Rig rig;
    shard::LayoutOptions lo;
    lo.param_tier = shard::Tier::nvme;
    lo.train = false;
    lo.seed = s;
    Run run(rig, lo, kSpec);
    auto self = self_comm();
    const auto tokens = random_tokens(s + 3, run.m.spec.vocab, 10);
    model::GPT gpt(model::Config::from(run.m.spec));
    const sample::GenerateOptions go{.tokens = 5, .choice = {.temperature = 0}, .seed = s};
    std::vector<float> want;
    std::vector<std::int32_t> want_text;
    {
        auto dev = device_of();
        sample::Decoder dec(gpt, *dev, tokens.size());
        zero::CommittedParams params(run.m, 0, rig.engine, rig.pool);
        zero::InfinityEngine inf(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, params, {});
        const sample::Passes passes{inf, [&] { inf.begin(false); }, [&] { inf.end(); }, [&] { inf.reset(); }};
        want = cached_logits(*dev, dec, passes, tokens);
        dec.reset();
        sample::generate(dec, *dev, passes, self, std::span(tokens).first(4), go,
                         [&](std::int32_t t) { want_text.push_back(t); });
    }
    BOOST_TEST_REQUIRE(want_text.size() == go.tokens);
    for (const bool resident : {false, true}) {
        for (const bool fits : {false, true}) {
            BOOST_TEST_CONTEXT((resident ? "resident" : "ZeRO-Infinity") << (fits ? ", kept when they fit" : "")) {
                auto dev = device_of();
                sample::Decoder dec(gpt, *dev, tokens.size());
                zero::EngineOptions eo;
                eo.resident = resident;
                eo.persist_if_fits = fits;
                const auto e = zero::Engine::open(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, eo);
                if (!resident) BOOST_TEST((e->options().infinity.persist_below > 0) == fits);
                const sample::Passes passes{e->hooks(), [&] { e->begin_forward(); }, [&] { e->end(); },
                                            [&] { e->reset(); }};
                const auto got = cached_logits(*dev, dec, passes, tokens);
                BOOST_REQUIRE_EQUAL(got.size(), want.size());
                BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
                dec.reset();
                std::vector<std::int32_t> text;
                sample::generate(dec, *dev, *e, self, std::span(tokens).first(4), go,
                                 [&](std::int32_t t) { text.push_back(t); });
                BOOST_TEST(text == want_text, boost::test_tools::per_element());
                BOOST_CHECK_THROW(e->begin_step(1e-3), InternalError);
                BOOST_CHECK_THROW(e->save(), InternalError);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(a_corrupted_partition_is_refused) {
    const std::uint64_t s = fresh_seed("corrupt");
    for (shard::Tier tier : {shard::Tier::nvme, shard::Tier::cpu}) {
        BOOST_TEST_CONTEXT("param tier " << shard::tier_name(tier)) {
            Rig rig;
            shard::LayoutOptions lo;
            lo.param_tier = tier;
            lo.train = false;
            lo.seed = s;
            Run run(rig, lo, kSpec);
            // One byte of the last tensor's partition flipped (ln_f.bias).
            const shard::Partition* p = nullptr;
            for (const auto& part : run.m.parts)
                if (part.state == "param" && part.tensor == run.m.tensors.size() - 1) p = &part;
            BOOST_REQUIRE(p);
            {
                std::fstream f(run.m.path_of(*p), std::ios::in | std::ios::out | std::ios::binary);
                f.seekg(static_cast<std::streamoff>(p->offset + 1));
                char c = 0;
                f.read(&c, 1);
                c = static_cast<char>(c ^ 0x20);
                f.seekp(static_cast<std::streamoff>(p->offset + 1));
                f.write(&c, 1);
            }
            auto dev = device_of();
            model::GPT gpt(model::Config::from(run.m.spec));
            auto self = self_comm();
            sample::Decoder dec(gpt, *dev, 4);
            std::string msg;
            if (tier == shard::Tier::cpu) {
                msg = what_of<DataError>([&] { zero::CommittedParams bad(run.m, 0, rig.engine, rig.pool); }, "cpu tier");
            } else {
                zero::CommittedParams params(run.m, 0, rig.engine, rig.pool);
                zero::InfinityEngine inf(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, params, {});
                std::vector<float> l(dec.vocab());
                msg = what_of<DataError>(
                    [&] {
                        inf.begin(false);
                        try {
                            dec.step(dev->compute(), inf, 1, l);
                            inf.end();
                        } catch (...) {
                            inf.reset();
                            throw;
                        }
                    },
                    "nvme tier");
            }
            BOOST_TEST_MESSAGE(msg);
            BOOST_TEST(contains(msg, "ln_f.bias rank 0 param"));
            BOOST_TEST(contains(msg, "xxh3"));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(chooser)

BOOST_AUTO_TEST_CASE(greedy_takes_the_largest_and_the_lowest_id_on_a_tie) {
    sample::Chooser pick(1);
    const std::vector<float> l{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    BOOST_TEST(pick(l, {.temperature = 0}) == 1);
    BOOST_TEST(pick(l, {.temperature = 0, .limit = 1}) == 0);  // only id 0 is allowed
    const std::vector<float> nan{std::nanf(""), -3.0f, std::nanf("")};
    BOOST_TEST(pick(nan, {.temperature = 0}) == 1);
    const std::vector<float> all_nan{std::nanf(""), std::nanf("")};
    BOOST_CHECK_THROW(pick(all_nan, {.temperature = 0}), DataError);
    BOOST_CHECK_THROW(pick(l, {.temperature = -1}), UsageError);
    BOOST_CHECK_THROW(pick(l, {.temperature = std::numeric_limits<double>::infinity()}), UsageError);
}

BOOST_AUTO_TEST_CASE(top_k_and_the_limit_restrict_the_draws) {
    sample::Chooser pick(fresh_seed("top-k"));
    const std::vector<float> l{3.0f, 0.0f, 2.9f, 2.8f, -5.0f, 2.95f};
    for (int i = 0; i < 500; ++i) {
        BOOST_TEST(pick(l, {.temperature = 5, .top_k = 1}) == 0);
        const auto t = pick(l, {.temperature = 5, .top_k = 3});
        BOOST_TEST((t == 0 || t == 2 || t == 5));
        const auto u = pick(l, {.temperature = 5, .limit = 2});
        BOOST_TEST((u == 0 || u == 1));
    }
}

BOOST_AUTO_TEST_CASE(a_seed_repeats_its_draws_and_they_follow_the_softmax) {
    const std::uint64_t s = fresh_seed("draws");
    // p = softmax(l / 1): 1/6, 2/6, 3/6.
    const std::vector<float> l{0.0f, static_cast<float>(std::log(2.0)), static_cast<float>(std::log(3.0))};
    sample::Chooser a(s), b(s), c(s + 1);
    std::vector<int> from_a, from_b, from_c;
    int counts[3] = {};
    const int n = 30000;
    for (int i = 0; i < n; ++i) {
        from_a.push_back(a(l, {}));
        from_b.push_back(b(l, {}));
        from_c.push_back(c(l, {}));
        ++counts[from_a.back()];
    }
    BOOST_TEST((from_a == from_b));
    BOOST_TEST((from_a != from_c));
    // Within 5 standard deviations of the expected counts.
    for (int k = 0; k < 3; ++k) {
        const double p = (k + 1) / 6.0, sd = std::sqrt(n * p * (1 - p));
        BOOST_TEST(std::abs(counts[k] - n * p) < 5 * sd, "token " << k << ": " << counts[k] << " of " << n);
    }
    // A lower temperature sharpens: the most likely token is drawn more often.
    sample::Chooser d(s);
    int top = 0;
    for (int i = 0; i < n; ++i) top += d(l, {.temperature = 0.25}) == 2;
    BOOST_TEST(top > n * 0.8);  // 3^4 / (1 + 2^4 + 3^4) = 0.83
}

BOOST_AUTO_TEST_SUITE_END()

