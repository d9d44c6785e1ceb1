// Unit tests of libzinf model and train: the GPT against PyTorch
// (tests/data/gpt_tiny.ref, written by scripts/gen_reference.py from weights
// zinf-shard made): logits, loss, every gradient and ten AdamW steps; then
// a tiled Linear against an untiled one, activation checkpointing against keeping every
// activation, the engine hooks' order, and the engine's refusal of a
// parameter a module did not register.
#define BOOST_TEST_MODULE model
#include "optimizer_fixture.hpp"

#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/gpt.hpp>
#include <zinf/model.hpp>
#include <zinf/train.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>

using namespace zinf;
using namespace zinf::testing;

namespace {

// The reference file (see scripts/gen_reference.py): 256 int32 of header,
// then inputs, targets, logits, loss, each gradient, the AdamW losses.
struct Reference {
    std::int32_t h[256];
    std::uint64_t L, C, NH, V, maxT, B, T, tensors, steps, seed;
    float lr, beta1, beta2, eps, wd;
    std::vector<std::int32_t> inputs, targets;
    std::vector<float> logits;
    float loss = 0;
    std::vector<std::vector<float>> grads;
    std::vector<float> losses;
};

std::string data_dir() {
    // The tests run from the repository root (make test); ZINF_TEST_DATA overrides.
    const char* d = std::getenv("ZINF_TEST_DATA");
    return d && *d ? d : "tests/data";
}

Reference read_reference(const std::string& path, const std::vector<std::uint64_t>& numels) {
    std::ifstream in(path, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "cannot open " << path << " (run the tests from the repository root)");
    Reference r{};
    auto get = [&](void* dst, std::size_t bytes) {
        in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
        BOOST_REQUIRE_MESSAGE(in.gcount() == static_cast<std::streamsize>(bytes), path << ": short file");
    };
    get(r.h, sizeof r.h);
    BOOST_REQUIRE_EQUAL(r.h[0], 0x5A494E46);
    BOOST_REQUIRE_EQUAL(r.h[1], 1);
    r.L = r.h[2], r.C = r.h[3], r.NH = r.h[4], r.V = r.h[5], r.maxT = r.h[6], r.B = r.h[7], r.T = r.h[8];
    r.tensors = r.h[9], r.steps = r.h[10];
    r.seed = static_cast<std::uint32_t>(r.h[11]) | (std::uint64_t(static_cast<std::uint32_t>(r.h[12])) << 32);
    r.lr = std::bit_cast<float>(r.h[13]), r.beta1 = std::bit_cast<float>(r.h[14]);
    r.beta2 = std::bit_cast<float>(r.h[15]), r.eps = std::bit_cast<float>(r.h[16]), r.wd = std::bit_cast<float>(r.h[17]);
    BOOST_REQUIRE_EQUAL(r.tensors, numels.size());
    const std::uint64_t N = r.B * r.T;
    r.inputs.resize(N), r.targets.resize(N), r.logits.resize(N * r.V), r.losses.resize(r.steps);
    get(r.inputs.data(), N * 4);
    get(r.targets.data(), N * 4);
    get(r.logits.data(), N * r.V * 4);
    get(&r.loss, 4);
    for (auto n : numels) {
        r.grads.emplace_back(n);
        get(r.grads.back().data(), n * 4);
    }
    get(r.losses.data(), r.steps * 4);
    in.peek();
    BOOST_REQUIRE_MESSAGE(in.eof(), path << ": longer than its header says");
    return r;
}

std::string spec_of(const Reference& r) {
    return "gpt:layers=" + std::to_string(r.L) + ",hidden=" + std::to_string(r.C) + ",heads=" + std::to_string(r.NH) +
           ",vocab=" + std::to_string(r.V) + ",seq=" + std::to_string(r.maxT);
}

// max |a - b| / max |b|: the error relative to the tensor's scale.
double rel_error(std::span<const float> a, std::span<const float> b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::abs(double(b[i])));
    }
    return scale > 0 ? diff / scale : diff;
}

std::unique_ptr<device::Device> cpu(unsigned threads = 2) {
    return device::open({.backend = "cpu", .memory_bytes = 256 * MiB, .threads = threads});
}

// A GPT with its resident engine, weights from a manifest's param state or
// drawn from the seed.
struct Net {
    std::unique_ptr<device::Device> dev;
    model::GPT gpt;
    model::ResidentEngine eng;
    model::Activations acts;
    Net(const model::Config& cfg, model::Shape shape, unsigned threads = 2, const std::vector<bool>& bf16 = {})
        : dev(cpu(threads)), gpt(cfg), eng(*dev, model::numels(gpt.params_table()), bf16),
          acts(gpt.plan(*dev, shape)) {}
    device::Precision precision = device::Precision::fp32;  // the GEMMs' inputs (Context::precision)
    // fill() rounds the matrices and tables (every parameter of two or more
    // dimensions) to bf16 values: what an engine keeping them bf16 holds.
    bool round_matrices = false;
    model::Context ctx() { return {*dev, dev->compute(), eng, precision}; }
    void set_batch(std::span<const std::int32_t> in, std::span<const std::int32_t> tg) {
        auto& s = dev->compute();
        dev->copy(s, std::as_writable_bytes(acts.inputs.span()), std::as_bytes(in));
        dev->copy(s, std::as_writable_bytes(acts.targets.span()), std::as_bytes(tg));
    }
    // Device memory is reached through copies only (a GPU's is not the host's).
    void set_values(std::size_t t, std::span<const float> v) {
        // The host side lives until the copy is done (synchronized here).
        std::vector<std::uint16_t> h;
        std::vector<float> w;
        if (eng.kept_bf16(t)) {
            h.resize(v.size());
            to_bf16(v, std::span(h));
            dev->copy(dev->compute(), std::as_writable_bytes(eng.values_bf16(t)), std::as_bytes(std::span(h)));
        } else if (round_matrices && gpt.params_table()[t].shape.size() >= 2) {
            w.resize(v.size());
            for (std::size_t i = 0; i < v.size(); ++i) w[i] = from_bf16(to_bf16(v[i]));
            dev->copy(dev->compute(), std::as_writable_bytes(eng.values(t)), std::as_bytes(std::span(w)));
        } else {
            dev->copy(dev->compute(), std::as_writable_bytes(eng.values(t)), std::as_bytes(v));
        }
        dev->synchronize(dev->compute());
    }
    std::vector<float> gradient(std::size_t t) {
        std::vector<float> g(eng.gradient(t).size());
        dev->copy(dev->compute(), std::as_writable_bytes(std::span(g)), std::as_bytes(eng.gradient(t)));
        dev->synchronize(dev->compute());
        return g;
    }
    // Every parameter's gradient, in the engine's one array.
    std::vector<float> all_gradients() {
        std::vector<float> g(eng.all_gradients().size());
        dev->copy(dev->compute(), std::as_writable_bytes(std::span(g)), std::as_bytes(eng.all_gradients()));
        dev->synchronize(dev->compute());
        return g;
    }
    void fill(std::uint64_t seed) {
        const auto spec = gpt.config().spec();
        const auto ts = shard::tensors(spec, gpt.config().tile);
        for (std::size_t t = 0; t < ts.size(); ++t) {
            std::vector<float> v(ts[t].numel);
            shard::fill_fp32(ts[t], spec, seed, 0, v);
            set_values(t, v);
        }
    }
    double loss() {
        std::vector<float> l(acts.losses.size());
        dev->copy(dev->compute(), std::as_writable_bytes(std::span(l)), std::as_bytes(acts.losses.span()));
        dev->synchronize(dev->compute());
        double s = 0;
        for (float x : l) s += x;
        return s / static_cast<double>(l.size());
    }
    // Parameters from `seed`, one batch, one step.
    void run(std::uint64_t seed, std::span<const std::int32_t> in, std::span<const std::int32_t> tg) {
        fill(seed);
        set_batch(in, tg);
        step();
    }
    void step() {
        auto c = ctx();
        eng.zero_grad(c.stream);
        gpt.forward(c, acts);
        gpt.backward(c, acts);
        dev->synchronize(c.stream);
    }
};

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::size_t n, std::uint64_t V) {
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = static_cast<std::int32_t>(rng() % V);
    return v;
}

// A three-block GPT and one batch of B x T tokens in and their targets,
// drawn from a fresh seed (also the parameters').
struct Tiny {
    std::uint64_t seed;
    std::mt19937_64 rng;
    shard::ModelSpec spec = shard::ModelSpec::parse("gpt:layers=3,hidden=32,heads=2,vocab=41,seq=16");
    model::Config cfg = model::Config::from(spec);
    std::uint64_t B = 2, T = 16;
    std::vector<std::int32_t> in, tg;
    explicit Tiny(const char* name) : seed(fresh_seed(name)), rng(seed) {
        in = random_tokens(rng, B * T, spec.vocab);
        tg = random_tokens(rng, B * T, spec.vocab);
    }
    // The step's shape at this batch: checkpointing or not, and how the
    // checkpoints and a block's activations are kept.
    model::Shape shape(bool checkpoint, device::Precision checkpoints = device::Precision::fp32,
                       device::Precision activations = device::Precision::fp32) const {
        return {.batch = B, .seq = T, .checkpoint = checkpoint, .checkpoints = checkpoints, .activations = activations};
    }
    void run(Net& n) const { n.run(seed, in, tg); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(matches_pytorch) {
    const std::string path = data_dir() + "/gpt_tiny.ref";
    // The layout the reference was made with: fp32 parameters, state in memory.
    std::ifstream probe(path, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(probe, "cannot open " << path);
    std::int32_t h[19];
    probe.read(reinterpret_cast<char*>(h), sizeof h);
    const std::string spec = "gpt:layers=" + std::to_string(h[2]) + ",hidden=" + std::to_string(h[3]) +
                             ",heads=" + std::to_string(h[4]) + ",vocab=" + std::to_string(h[5]) +
                             ",seq=" + std::to_string(h[6]);
    Rig rig;
    shard::LayoutOptions lo = lay(DType::fp32, Tier::cpu, Tier::cpu,
                                  static_cast<std::uint32_t>(h[11]) | (std::uint64_t(std::uint32_t(h[12])) << 32));
    Run run(rig, lo, spec.c_str());
    std::vector<std::uint64_t> numels;
    for (const auto& t : run.m.tensors) numels.push_back(t.numel);
    const Reference r = read_reference(path, numels);
    BOOST_REQUIRE_EQUAL(spec_of(r), spec);

    // Forward and backward on the reference's batch, weights from the manifest.
    Net net(model::Config::from(run.m.spec), {.batch = r.B, .seq = r.T, .checkpoint = true});
    for (std::size_t t = 0; t < numels.size(); ++t) {
        net.set_values(t, as_f32(cat_bytes(run.m, t, "param", rig)));
    }
    net.set_batch(r.inputs, r.targets);
    auto c = net.ctx();
    net.gpt.forward(c, net.acts, false);  // logits kept
    std::vector<float> padded(net.acts.logits.size());
    net.dev->copy(c.stream, std::as_writable_bytes(std::span(padded)), std::as_bytes(net.acts.logits.span()));
    const double loss = net.loss();
    // Rows padded_vocab(V) apart (model.hpp): their first V columns.
    const std::uint64_t V = static_cast<std::uint64_t>(r.V), ld = model::padded_vocab(V);
    BOOST_REQUIRE_EQUAL(padded.size(), r.B * r.T * ld);
    std::vector<float> logits;
    for (std::uint64_t i = 0; i < r.B * r.T; ++i)
        logits.insert(logits.end(), padded.begin() + static_cast<std::ptrdiff_t>(i * ld),
                      padded.begin() + static_cast<std::ptrdiff_t>(i * ld + V));
    const double e_logits = rel_error(logits, r.logits);
    BOOST_TEST_MESSAGE("logits: relative error " << e_logits);
    BOOST_TEST(e_logits < 1e-4);
    BOOST_TEST(std::abs(loss - r.loss) / r.loss < 1e-5, "loss " << loss << " vs PyTorch " << r.loss);

    net.step();
    BOOST_TEST(std::abs(net.loss() - r.loss) / r.loss < 1e-5);
    double worst = 0;
    for (std::size_t t = 0; t < numels.size(); ++t) {
        const double e = rel_error(net.gradient(t), r.grads[t]);
        worst = std::max(worst, e);
        BOOST_TEST(e < 1e-4, "gradient of " << run.m.tensors[t].name << ": relative error " << e);
    }
    BOOST_TEST_MESSAGE("gradients: worst relative error " << worst);

    // Ten AdamW steps through the trainer on the same batch: the tokens are
    // exactly one window, so every batch the loader gives is this one.
    std::vector<std::uint16_t> stream(r.inputs.begin(), r.inputs.end());
    for (std::uint64_t i = 0; i + 1 < r.B * r.T; ++i)  // the targets are the inputs one token on
        BOOST_REQUIRE_EQUAL(r.targets[i], r.inputs[i + 1]);
    stream.push_back(static_cast<std::uint16_t>(r.targets.back()));
    data::Loader loader(stream, "reference", {.batch = r.B, .seq = r.T});
    train::Options to;
    to.batch = r.B;
    to.seq = r.T;
    to.schedule = {.lr = r.lr, .warmup = 0, .total = r.steps, .cosine = false};
    to.adamw = {.lr = r.lr, .beta1 = r.beta1, .beta2 = r.beta2, .eps = r.eps, .weight_decay = r.wd};
    to.grad_clip = 0;
    to.manifest_path = run.manifest_path();
    auto dev = cpu();
    auto comm = self_comm();
    train::Trainer trainer(run.m, comm, rig.engine, rig.pool, *dev, to);
    for (std::uint64_t k = 0; k < r.steps; ++k) {
        const auto log = trainer.step(loader);
        BOOST_TEST(log.step == k + 1);
        const double e = std::abs(log.loss - r.losses[k]) / r.losses[k];
        BOOST_TEST(e < 1e-4, "AdamW step " << k + 1 << ": loss " << log.loss << " vs PyTorch " << r.losses[k]);
    }
}

BOOST_AUTO_TEST_CASE(tiled_linear_is_linear) {
    const auto seed = fresh_seed("tiled_linear_is_linear");
    std::mt19937_64 rng(seed);
    const auto spec = shard::ModelSpec::parse("gpt:layers=2,hidden=40,heads=4,vocab=53,seq=9");
    const std::uint64_t B = 3, T = 7;
    const auto in = random_tokens(rng, B * T, spec.vocab), tg = random_tokens(rng, B * T, spec.vocab);
    // 7 tiles: uneven column splits (40*k/7), as zinf-shard cuts them.
    Net whole(model::Config::from(spec, 1), {.batch = B, .seq = T});
    Net tiled(model::Config::from(spec, 7), {.batch = B, .seq = T});
    whole.fill(seed);
    tiled.fill(seed);  // a tile's values are the same columns of the untiled weight
    whole.set_batch(in, tg);
    tiled.set_batch(in, tg);
    whole.step();
    tiled.step();
    BOOST_TEST(std::abs(whole.loss() - tiled.loss()) / whole.loss() < 1e-6);
    const auto wt = shard::tensors(spec, 1), tt = shard::tensors(spec, 7);
    for (std::size_t j = 0; j < tt.size(); ++j) {
        const auto& t = tt[j];
        std::size_t i = 0;
        while (wt[i].name != t.key) ++i;
        // The tile's gradient is the same columns of the whole weight's.
        std::vector<float> cols(t.numel);
        const auto g = whole.gradient(i);
        for (std::uint64_t row = 0, k = 0; row < t.numel / t.cols; ++row)
            for (std::uint64_t col = 0; col < t.cols; ++col) cols[k++] = g[row * t.key_cols + t.col0 + col];
        const double e = rel_error(tiled.gradient(j), cols);
        BOOST_TEST(e < 1e-6, t.name << ": relative error " << e);
    }
}

BOOST_AUTO_TEST_CASE(checkpointing_changes_no_bit) {
    const Tiny t("checkpointing_changes_no_bit");
    Net keep(t.cfg, t.shape(false)), ckpt(t.cfg, t.shape(true));
    for (Net* n : {&keep, &ckpt}) t.run(*n);
    BOOST_TEST(keep.loss() == ckpt.loss());
    const auto a = keep.all_gradients(), b = ckpt.all_gradients();
    BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    BOOST_TEST(ckpt.acts.bytes < keep.acts.bytes);
    // And the gradient is not trivially zero.
    double sq = 0;
    for (float g : a) sq += double(g) * g;
    BOOST_TEST(sq > 0);
}

// The padded vocabulary (issue 43, model.hpp's padded_vocab): the output
// head's logits rows padded to a multiple of 64, the parameter not. The
// head and the loss at the padded row stride give the packed head's bits:
// every logit, the loss, the gradient of the head's input (which all the
// rest of the backward starts from) and of the tied wte; a vocabulary
// already a multiple of 64 has no pad; V = 1 pads to 64.
BOOST_AUTO_TEST_CASE(padded_logits_change_no_bit) {
    BOOST_TEST(model::padded_vocab(50257) == 50304u);
    BOOST_TEST(model::padded_vocab(64) == 64u);
    BOOST_TEST(model::padded_vocab(1) == 64u);
    BOOST_TEST(model::padded_vocab(128256) == 128256u);
    for (const char* spec : {"gpt:layers=1,hidden=32,heads=2,vocab=41,seq=16",
                             "gpt:layers=1,hidden=32,heads=2,vocab=1,seq=16",
                             "gpt:layers=1,hidden=32,heads=2,vocab=128,seq=16"}) {
        const model::Config cfg = model::Config::from(shard::ModelSpec::parse(spec));
        const std::uint64_t N = 24, C = cfg.hidden, V = cfg.vocab, ld = model::padded_vocab(V);
        std::mt19937_64 rng(fresh_seed(spec));
        auto dev = cpu(2);
        model::ParamTable table(cfg);
        model::Embedding embed(table, cfg);
        model::LMHead head(table, embed.wte(), cfg);
        model::ResidentEngine eng(*dev, model::numels(table));
        auto& s = dev->compute();
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> w(V * C), x(N * C);
        for (auto& v : w) v = nd(rng);
        for (auto& v : x) v = nd(rng);
        const auto tg = random_tokens(rng, N, V);
        dev->copy(s, std::as_writable_bytes(eng.values(embed.wte())), std::as_bytes(std::span(w)));
        auto dx = dev->alloc<float>(x.size(), "x");
        dev->copy(s, std::as_writable_bytes(dx.span()), std::as_bytes(std::span(x)));
        auto dtg = dev->alloc<std::int32_t>(N, "targets");
        dev->copy(s, std::as_writable_bytes(dtg.span()), std::as_bytes(std::span(tg)));
        struct Out {
            std::vector<float> logits, losses, dx, dwte;
        };
        auto run = [&](std::uint64_t stride) {
            model::Context c{*dev, s, eng};
            eng.zero_grad(s);
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::vector<float> poison(N * stride, nan);
            auto logits = dev->alloc<float>(N * stride, "logits");
            dev->copy(s, std::as_writable_bytes(logits.span()), std::as_bytes(std::span(poison)));
            auto losses = dev->alloc<float>(N, "losses"), dxo = dev->alloc<float>(N * C, "dx");
            head.forward(c, logits, dx, N, stride);
            Out o;
            o.logits.resize(N * stride);
            dev->copy(s, std::as_writable_bytes(std::span(o.logits)), std::as_bytes(logits.span()));
            dev->crossentropy_forward_backward(s, losses, logits, dtg, 1.0f / N, N, V, stride);
            head.backward(c, dxo, logits, dx, N, stride);
            o.losses.resize(N), o.dx.resize(N * C), o.dwte.resize(V * C);
            dev->copy(s, std::as_writable_bytes(std::span(o.losses)), std::as_bytes(losses.span()));
            dev->copy(s, std::as_writable_bytes(std::span(o.dx)), std::as_bytes(dxo.span()));
            dev->copy(s, std::as_writable_bytes(std::span(o.dwte)), std::as_bytes(eng.gradient(embed.wte())));
            dev->synchronize(s);
            return o;
        };
        const Out packed = run(V), padded = run(ld);
        auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        std::vector<float> rows;
        for (std::uint64_t i = 0; i < N; ++i)
            rows.insert(rows.end(), padded.logits.begin() + i * ld, padded.logits.begin() + i * ld + V);
        BOOST_TEST(same(rows, packed.logits), spec << ": logits");
        BOOST_TEST(same(padded.losses, packed.losses), spec << ": losses");
        BOOST_TEST(same(padded.dx, packed.dx), spec << ": the head's input gradient");
        BOOST_TEST(same(padded.dwte, packed.dwte), spec << ": wte's gradient");
        double sq = 0;
        for (float g : padded.dx) sq += double(g) * g;
        BOOST_TEST((V == 1 ? sq == 0 : sq > 0), spec << ": gradient " << sq);  // V = 1: no gradient at all
        // The model's own activations: the logits padded, the parameter not.
        Net net(cfg, {.batch = 2, .seq = 12, .checkpoint = true});
        BOOST_TEST(net.acts.logits.size() == 24 * ld);
        BOOST_TEST(net.gpt.params_table()[0].shape == (std::vector<std::uint64_t>{V, C}));
    }
}

// --checkpoint's rule (train.hpp's choose_checkpointing): all and none as
// asked; auto keeps every block's activations exactly when they fit beside
// the engine, recomputes with offloaded checkpoints; none with an offload is
// refused.
BOOST_AUTO_TEST_CASE(checkpoint_auto_decides_from_the_budget) {
    using train::Checkpointing;
    const auto none = model::Offload::none, cpu_off = model::Offload::cpu;
    BOOST_TEST(train::choose_checkpointing(Checkpointing::all, none, 10, 10, 1000).recompute);
    BOOST_TEST(!train::choose_checkpointing(Checkpointing::none, none, 10, 10, 5).recompute);
    const auto fits = train::choose_checkpointing(Checkpointing::automatic, none, 600, 400, 1000);
    BOOST_TEST(!fits.recompute);
    BOOST_TEST(fits.why.find("fit the device's") != std::string::npos, fits.why);
    const auto over = train::choose_checkpointing(Checkpointing::automatic, none, 601, 400, 1000);
    BOOST_TEST(over.recompute);
    BOOST_TEST(over.why.find("would pass the device's") != std::string::npos, over.why);
    BOOST_TEST(train::choose_checkpointing(Checkpointing::automatic, cpu_off, 1, 1, 1000).recompute);
    BOOST_CHECK_THROW(train::choose_checkpointing(Checkpointing::none, cpu_off, 1, 1, 1000), UsageError);
    BOOST_TEST((train::parse_checkpointing("auto") == Checkpointing::automatic));
    BOOST_TEST((train::parse_checkpointing("all") == Checkpointing::all));
    BOOST_TEST((train::parse_checkpointing("none") == Checkpointing::none));
    BOOST_CHECK_THROW(train::parse_checkpointing("some"), UsageError);
    for (auto c : {Checkpointing::automatic, Checkpointing::all, Checkpointing::none})
        BOOST_TEST((train::parse_checkpointing(train::checkpointing_name(c)) == c));
}

// bf16 checkpoints (Shape::checkpoints; fp32 arithmetic, to see them
// alone): with checkpointing (the backward widens the stored bf16 again and
// recomputes from it) and without (each block keeps its activations) the
// same bits, so the recompute reads what the forward read; a loss and
// gradients near the fp32 checkpoints' but not theirs (the rounding
// happened); the arena bytes planned: each (N,C) checkpoint at 2 bytes a
// value, plus the one fp32 (N,C) buffer a block reads its input widened in.
BOOST_AUTO_TEST_CASE(bf16_checkpoints_recompute_what_the_forward_saw) {
    const Tiny t("bf16_checkpoints_recompute_what_the_forward_saw");
    const auto& cfg = t.cfg;
    const std::uint64_t B = t.B, T = t.T;
    const auto bf16 = device::Precision::bf16;
    Net keep(cfg, t.shape(false, bf16)), ckpt(cfg, t.shape(true, bf16)), ref(cfg, t.shape(true));
    for (Net* n : {&keep, &ckpt, &ref}) t.run(*n);
    const auto a = keep.all_gradients(), b = ckpt.all_gradients(), r = ref.all_gradients();
    BOOST_TEST(std::bit_cast<std::uint64_t>(keep.loss()) == std::bit_cast<std::uint64_t>(ckpt.loss()));
    BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    BOOST_TEST(ckpt.loss() != ref.loss());
    BOOST_TEST(std::abs(ckpt.loss() - ref.loss()) < 1e-2 * ref.loss(), ckpt.loss() << " vs " << ref.loss());
    const double e = rel_error(b, r);
    BOOST_TEST((e > 0 && e < 2e-2), "the gradients' relative error " << e);
    // The plan: fp32 and bf16 checkpoints, on the device and offloaded (three buffers).
    const std::uint64_t NC = B * T * cfg.hidden;
    auto unit = [](std::uint64_t bytes) { return align_up(bytes, mem::kArenaAlignment); };
    for (const model::Offload where : {model::Offload::none, model::Offload::cpu}) {
        const std::uint64_t n = where == model::Offload::none ? cfg.layers + 1 : 3;
        const std::uint64_t f = ckpt.gpt.plan_bytes({.batch = B, .seq = T, .offload = where});
        const std::uint64_t h = ckpt.gpt.plan_bytes({.batch = B, .seq = T, .offload = where, .checkpoints = bf16});
        BOOST_TEST(f - h == n * (unit(NC * 4) - unit(NC * 2)) - unit(NC * 4), model::offload_name(where));
    }
    BOOST_TEST(ckpt.acts.bytes + (cfg.layers + 1) * NC * 2 == ref.acts.bytes + NC * 4);
}

// Activations a GPT block keeps bf16 (Shape::activations, under bf16
// arithmetic, as zinf-train --precision bf16 runs): the GEMMs read the bf16
// values they would have rounded to anyway, so only the GELU's input, the
// attention's q/k/v, the softmax its backward reads and the residual
// between attention and MLP are rounded anew.
// With checkpointing and without, the same bits (the recompute keeps what
// the forward kept), and a second run the same bits; a loss and gradients
// near those of fp32 activations under the same arithmetic and near fp32's,
// but not theirs; the arena bytes planned: each block's 15 (N,C) kept values
// a token and its softmax at 2 bytes, not 4, and the logits too.
BOOST_AUTO_TEST_CASE(bf16_activations_halve_what_a_block_keeps) {
    const Tiny t("bf16_activations_halve_what_a_block_keeps");
    const auto& cfg = t.cfg;
    const std::uint64_t B = t.B, T = t.T;
    const auto bf16 = device::Precision::bf16;
    Net keep(cfg, t.shape(false, bf16, bf16)), ckpt(cfg, t.shape(true, bf16, bf16)),
        again(cfg, t.shape(true, bf16, bf16)), kept32(cfg, t.shape(true, bf16)), ref(cfg, t.shape(true));
    for (Net* n : {&keep, &ckpt, &again, &kept32}) n->precision = bf16;
    for (Net* n : {&keep, &ckpt, &again, &kept32, &ref}) t.run(*n);
    auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
    const auto a = keep.all_gradients(), b = ckpt.all_gradients(), b2 = again.all_gradients(),
               k = kept32.all_gradients(), r = ref.all_gradients();
    BOOST_TEST(bits(keep.loss()) == bits(ckpt.loss()));
    BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    BOOST_TEST(bits(again.loss()) == bits(ckpt.loss()));
    BOOST_TEST(std::memcmp(b2.data(), b.data(), b.size() * sizeof(float)) == 0);
    BOOST_TEST(ckpt.loss() != kept32.loss());  // the GELU's and the attention's inputs were rounded
    BOOST_TEST(std::abs(ckpt.loss() - kept32.loss()) < 1e-2 * kept32.loss(), ckpt.loss() << " vs " << kept32.loss());
    BOOST_TEST(std::abs(ckpt.loss() - ref.loss()) < 1e-2 * ref.loss(), ckpt.loss() << " vs " << ref.loss());
    const double ek = rel_error(b, k), er = rel_error(b, r), e32 = rel_error(k, r);
    BOOST_TEST_MESSAGE("gradients' relative error: against fp32 activations " << ek << ", against fp32 " << er
                                                                               << " (fp32 activations: " << e32 << ")");
    BOOST_TEST((ek > 0 && ek < 2e-2), "against fp32 activations " << ek);
    BOOST_TEST((er > 0 && er < 2e-2), "against fp32 " << er);
    // The plan: 4 (N,C) (the inner residual among them), one (N,3C)
    // (q/k/v), 2 (N,4C) and the (B,NH,T,T) softmax kept a block set (one
    // set with checkpointing, one a layer without), each at 2 bytes a value.
    // The logits (N, padded V) are bf16 too (the head's GEMM writes them so), once.
    const std::uint64_t NC = B * T * cfg.hidden, A = B * cfg.heads * T * T,
                        NV = B * T * model::padded_vocab(cfg.vocab);
    auto unit = [](std::uint64_t bytes) { return align_up(bytes, mem::kArenaAlignment); };
    auto halved = [&](std::uint64_t n) { return unit(n * 4) - unit(n * 2); };
    const std::uint64_t saved = 4 * halved(NC) + halved(3 * NC) + 2 * halved(4 * NC) + halved(A);
    for (const bool checkpoint : {true, false}) {
        const model::Shape f{.batch = B, .seq = T, .checkpoint = checkpoint, .checkpoints = bf16};
        model::Shape h = f;
        h.activations = bf16;
        const std::uint64_t sets = checkpoint ? 1 : cfg.layers;
        BOOST_TEST(ckpt.gpt.plan_bytes(f) - ckpt.gpt.plan_bytes(h) == sets * saved + halved(NV),
                   "checkpoint " << checkpoint);
    }
    BOOST_TEST(ckpt.acts.bytes + (15 * NC + A) * 2 + NV * 2 == kept32.acts.bytes);
    BOOST_TEST(keep.acts.bytes + cfg.layers * (15 * NC + A) * 2 + NV * 2 ==
               Net(cfg, t.shape(false, bf16)).acts.bytes);
}

// The resident engine keeping the matrices and embedding tables bf16 (the
// trainer's --precision bf16 over bf16 parameters): the GEMMs and the
// embedding read them bf16, never widened nor staged, and a step gives the
// bits of an engine holding their fp32 copies (a bf16 GEMM rounds its
// inputs to the same values), tiled or not, checkpointing or not; the fp32
// values it holds are the vectors' alone, the matrices' at 2 bytes.
BOOST_AUTO_TEST_CASE(resident_bf16_weights_give_the_bits_of_their_fp32_copies) {
    const Tiny t("resident_bf16_weights_give_the_bits_of_their_fp32_copies");
    const auto bf16 = device::Precision::bf16;
    for (const unsigned tile : {1u, 3u})
        for (const bool checkpoint : {true, false}) {
            const model::Config cfg = model::Config::from(t.spec, tile);
            std::vector<bool> mask;
            std::uint64_t matrices = 0, all = 0;
            for (const auto& p : model::GPT(cfg).params_table().all()) {
                mask.push_back(p.shape.size() >= 2);
                if (p.shape.size() >= 2) matrices += p.numel;
                all += p.numel;
            }
            Net wide(cfg, t.shape(checkpoint, bf16, bf16)), kept(cfg, t.shape(checkpoint, bf16, bf16), 2, mask);
            wide.round_matrices = true;
            for (Net* n : {&wide, &kept}) {
                n->precision = bf16;
                t.run(*n);
            }
            BOOST_TEST_CONTEXT("tile " << tile << ", checkpoint " << checkpoint) {
                BOOST_TEST(std::bit_cast<std::uint64_t>(kept.loss()) == std::bit_cast<std::uint64_t>(wide.loss()));
                const auto a = kept.all_gradients(), b = wide.all_gradients();
                BOOST_TEST_REQUIRE(a.size() == b.size());
                BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
                BOOST_TEST(kept.eng.all_values().size() < all - matrices + 16 * mask.size());
                BOOST_TEST(wide.eng.all_values().size() >= all);
                BOOST_TEST(std::isfinite(kept.loss()));
            }
        }
}

// --attention flash (Shape::attention flash: the flash_* kernels): a GPT
// step against the GEMM path's, the loss and every gradient within 1e-5 in
// fp32, and within bf16's tolerance with bf16 activations kept (the output
// the flash backward reads for its delta is rounded there); with
// checkpointing and without the same bits; the plan keeps a (B,NH,T)
// log-sum-exp, fp32, a block set in place of the (B,NH,T,T) softmax, and
// the backward's scratch shrinks the same way.
BOOST_AUTO_TEST_CASE(flash_attention_step_matches_the_gemm_path) {
    const Tiny t("flash_attention_step_matches_the_gemm_path");
    const auto& cfg = t.cfg;
    const auto bf16 = device::Precision::bf16;
    auto flash = [](model::Shape s) {
        s.attention = model::Attention::flash;
        return s;
    };
    Net gemm(cfg, t.shape(true)), fl(cfg, flash(t.shape(true))), fl_keep(cfg, flash(t.shape(false)));
    Net gemm16(cfg, t.shape(true, bf16, bf16)), fl16(cfg, flash(t.shape(true, bf16, bf16)));
    for (Net* n : {&gemm16, &fl16}) n->precision = bf16;
    for (Net* n : {&gemm, &fl, &fl_keep, &gemm16, &fl16}) t.run(*n);
    BOOST_TEST(std::abs(fl.loss() - gemm.loss()) < 1e-5 * gemm.loss(), fl.loss() << " vs " << gemm.loss());
    const auto g = gemm.all_gradients(), f = fl.all_gradients(), k = fl_keep.all_gradients();
    BOOST_TEST(rel_error(f, g) < 1e-5, "gradients' relative error " << rel_error(f, g));
    BOOST_TEST(std::memcmp(f.data(), k.data(), f.size() * sizeof(float)) == 0);
    BOOST_TEST(std::bit_cast<std::uint64_t>(fl.loss()) == std::bit_cast<std::uint64_t>(fl_keep.loss()));
    BOOST_TEST(std::abs(fl16.loss() - gemm16.loss()) < 1e-2 * gemm16.loss(), fl16.loss() << " vs " << gemm16.loss());
    const double e16 = rel_error(fl16.all_gradients(), gemm16.all_gradients());
    BOOST_TEST(e16 < 2e-2, "bf16 activations: gradients' relative error " << e16);
    const std::uint64_t B = t.B, T = t.T, A = B * cfg.heads * T * T, L = B * cfg.heads * T;
    auto unit = [](std::uint64_t bytes) { return align_up(bytes, mem::kArenaAlignment); };
    for (const bool checkpoint : {true, false}) {
        const std::uint64_t sets = checkpoint ? 1 : cfg.layers;
        BOOST_TEST(gemm.gpt.plan_bytes(t.shape(checkpoint)) - gemm.gpt.plan_bytes(flash(t.shape(checkpoint))) ==
                       (sets + 1) * (unit(A * 4) - unit(L * 4)),
                   "checkpoint " << checkpoint);
        // bf16 activations: the softmax was kept at 2 bytes, the lse stays at 4.
        BOOST_TEST(gemm.gpt.plan_bytes(t.shape(checkpoint, bf16, bf16)) -
                           gemm.gpt.plan_bytes(flash(t.shape(checkpoint, bf16, bf16))) ==
                       sets * (unit(A * 2) - unit(L * 4)) + unit(A * 4) - unit(L * 4),
                   "bf16, checkpoint " << checkpoint);
    }
}

// Offloaded activation checkpoints live in page-locked memory the pinned
// pool hands out (PinnedPool::pin: registered with CUDA and the io engine,
// counted in the pool's stats) while the store lives, and come back from it
// bit for bit: in host memory (cpu), or through two staging buffers and a
// scratch file (nvme).
BOOST_AUTO_TEST_CASE(activation_store_pins_through_the_pool) {
    std::mt19937_64 rng(fresh_seed("activation_store_pins_through_the_pool"));
    const std::uint64_t count = 3, n = 1000, slot = align_up(n * sizeof(float), 4096);
    TempDir tmp{"/var/tmp"};
    for (const model::Offload kind : {model::Offload::cpu, model::Offload::nvme}) {
        const std::string what = model::offload_name(kind);
        Rig rig;
        auto dev = device::open({.backend = "cpu", .memory_bytes = 16 * MiB, .threads = 1});
        auto& s = dev->compute();
        std::vector<std::vector<float>> host(count, std::vector<float>(n));
        std::vector<device::Array<float>> out, back;
        for (std::uint64_t j = 0; j < count; ++j) {
            for (float& x : host[j]) x = std::uniform_real_distribution<float>(-4, 4)(rng);
            out.push_back(dev->alloc<float>(n, "checkpoint"));
            back.push_back(dev->alloc<float>(n, "checkpoint back"));
            dev->copy(s, std::as_writable_bytes(out[j].span()), std::as_bytes(std::span(host[j])));
        }
        {
            const auto owned = zero::ActivationStore::open(kind, count, n * sizeof(float), rig.pool, &rig.engine,
                                                           tmp.file("acts-" + what + ".bin"));
            zero::ActivationStore& store = *owned;
            const mem::PoolStats st = rig.pool.stats();
            BOOST_TEST(st.pinned == (kind == model::Offload::cpu ? 1u : 2u), what);
            BOOST_TEST(st.pinned_bytes == (kind == model::Offload::cpu ? count * slot : 2 * slot), what);
            for (std::uint64_t j = 0; j < count; ++j) store.save(*dev, s, j, std::as_bytes(out[j].span()));
            for (std::uint64_t j = 0; j < count; ++j) {
                store.load(*dev, s, j, std::as_writable_bytes(back[j].span()));
                store.wait_loaded(*dev, s, j);
            }
            for (std::uint64_t j = 0; j < count; ++j) {
                std::vector<float> got(n, -1);
                dev->copy(s, std::as_writable_bytes(std::span(got)), std::as_bytes(back[j].span()));
                dev->synchronize(s);
                BOOST_TEST(std::memcmp(got.data(), host[j].data(), n * sizeof(float)) == 0,
                           what << ": checkpoint " << j << " came back changed");
            }
            BOOST_TEST(store.bytes_out() == count * n * sizeof(float), what);
            BOOST_TEST(store.bytes_in() == count * n * sizeof(float), what);
        }
        BOOST_TEST(rig.pool.stats().pinned == 0u, what << ": the store's pinned memory outlived it");
    }
}

BOOST_AUTO_TEST_CASE(hooks_bracket_every_module) {
    const auto spec = shard::ModelSpec::parse("gpt:layers=2,hidden=16,heads=2,vocab=11,seq=4");
    for (bool checkpoint : {false, true}) {
        Net n(model::Config::from(spec, 2), {.batch = 1, .seq = 4, .checkpoint = checkpoint});
        std::mt19937_64 rng(7);
        n.fill(1);
        const auto in = random_tokens(rng, 4, 11), tg = random_tokens(rng, 4, 11);
        n.set_batch(in, tg);  // copied by the time step() synchronizes
        n.eng.tracing = true;
        n.step();
        using H = model::ResidentEngine::Hook;
        // Properly nested, and every forward hook pair inside the forward or a
        // checkpointed block's backward.
        std::vector<std::string> open;
        std::map<std::string, int> forwards, backwards;
        for (const auto& h : n.eng.trace) {
            if (h.kind == H::before_forward || h.kind == H::before_backward) {
                open.push_back(h.module);
                (h.kind == H::before_forward ? forwards : backwards)[h.module]++;
            } else {
                BOOST_REQUIRE(!open.empty());
                BOOST_TEST(open.back() == h.module);
                open.pop_back();
            }
        }
        BOOST_TEST(open.empty());
        // Every module with parameters ran forward once (twice for a
        // checkpointed block's insides) and backward once.
        for (const auto& p : n.gpt.params_table().all()) {
            const std::string& m = p.owner->name();
            BOOST_TEST(backwards[m] == 1, m);
            const bool in_block = m.starts_with("h.");
            BOOST_TEST(forwards[m] == (checkpoint && in_block ? 2 : 1), m << " forwards " << forwards[m]);
        }
        BOOST_TEST(forwards["h.0.mlp.c_fc.tile1"] == (checkpoint ? 2 : 1));
        // With checkpointing a block's forward runs again inside its own
        // backward scope, before its children's backward; without, never.
        for (const std::string block : {"h.0", "h.1"}) {
            auto at = [&](H::Kind k, const std::string& m) {
                for (std::size_t i = 0; i < n.eng.trace.size(); ++i)
                    if (n.eng.trace[i].kind == k && n.eng.trace[i].module == m) return i;
                BOOST_FAIL("no hook " << int(k) << " for " << m);
                return std::size_t{0};
            };
            const std::size_t b0 = at(H::before_backward, block), b1 = at(H::after_backward, block);
            const std::size_t mlp_back = at(H::before_backward, block + ".mlp");
            int inside = 0;
            for (std::size_t i = b0; i < b1; ++i)
                if (n.eng.trace[i].kind == H::before_forward && n.eng.trace[i].module == block) {
                    ++inside;
                    BOOST_TEST(i < mlp_back, block << ": recomputed after its children's backward began");
                }
            BOOST_TEST(inside == (checkpoint ? 1 : 0), block << ": forwards inside its backward " << inside);
        }
        BOOST_TEST(backwards["lm_head"] == 1);
        // The first hook is the GPT's, the last its backward's end.
        BOOST_TEST(n.eng.trace.front().module == "gpt");
        BOOST_TEST(n.eng.trace.back().module == "gpt");
        BOOST_TEST((n.eng.trace.back().kind == H::after_backward));
    }
}

BOOST_AUTO_TEST_CASE(engine_refuses_unregistered_parameters) {
    const auto spec = shard::ModelSpec::parse("gpt:layers=1,hidden=8,heads=2,vocab=5,seq=4");
    auto dev = cpu(1);
    model::GPT gpt(model::Config::from(spec));
    model::ResidentEngine eng(*dev, model::numels(gpt.params_table()));
    const auto& table = gpt.params_table();
    const model::Module* ln_f = nullptr;
    std::size_t wte = 0;
    for (std::size_t i = 0; i < table.size(); ++i) {
        if (table[i].name == "ln_f.weight") ln_f = table[i].owner;
        if (table[i].name == "wte.weight") wte = i;
    }
    BOOST_REQUIRE(ln_f);
    const std::string what = what_of<InternalError>([&] { eng.weight(*ln_f, wte); }, "ln_f asks for wte");
    BOOST_TEST(contains(what, "ln_f"));
    BOOST_TEST(contains(what, "neither declared nor registered"));
    // The tied head uses wte as an external parameter; the embedding owns it.
    BOOST_TEST(table[wte].owner->name() == "embedding");
}

BOOST_AUTO_TEST_CASE(schedule_warms_up_and_decays) {
    train::Schedule s{.lr = 1.0, .min_ratio = 0.1, .warmup = 4, .total = 104};
    BOOST_TEST(s.at(1) == 0.25);
    BOOST_TEST(s.at(4) == 1.0);
    BOOST_TEST(std::abs(s.at(54) - 0.55) < 1e-12);  // half way: the mean of lr and min
    BOOST_TEST(std::abs(s.at(104) - 0.1) < 1e-12);
    BOOST_TEST(std::abs(s.at(500) - 0.1) < 1e-12);  // past the end it stays at the floor
    s.cosine = false;
    BOOST_TEST(s.at(80) == 1.0);
}
