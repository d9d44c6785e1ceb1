// Tests of the ZeRO-Infinity engine (zero::InfinityEngine) under the
// trainer, one rank: placement never changes the math (every parameter tier
// x optimizer tier against the resident reference, to the bit), tiling, the
// trace and its prefetcher (divergence fetches on demand with the same
// losses), and the device budget (the need it reports runs, a byte less is
// refused before the first step, naming the module and a tile factor; NCCL's
// flat bucket area counted in it).
// Placement is checked in fp32 and under bf16 GEMM inputs (--precision).
// Data parallel runs are in mpi_train.cpp; faults and resume in e2e/train.sh.
#define BOOST_TEST_MODULE engine
#include "optimizer_fixture.hpp"

#include "comm_testing.hpp"  // FlatComm; the flat bucket's plan (comm/flat.cpp)

#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/gpt.hpp>
#include <zinf/model.hpp>
#include <zinf/train.hpp>

#include <bit>
#include <future>
#include <random>

using namespace zinf;
using namespace zinf::testing;

namespace {

// Two blocks; mlp.c_fc.weight is 72 x 288 = 20,736 elements (81KiB of fp32),
// more than one of the small pool's 64KiB buffers: its fetch spans leases.
constexpr const char* kGPT = "gpt:layers=2,hidden=72,heads=2,vocab=97,seq=16";
constexpr std::uint64_t kB = 2, kT = 16, kSteps = 10;


train::Options train_options(const std::string& manifest_path) {
    train::Options o;
    o.batch = kB;
    o.seq = kT;
    o.schedule = {.lr = 3e-3, .min_ratio = 0.1, .warmup = 2, .total = kSteps, .cosine = true};
    o.adamw = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    o.grad_clip = 1.0;
    o.manifest_path = manifest_path;
    o.kernel.threads = 1;
    return o;
}

std::unique_ptr<device::Device> device_of(std::uint64_t bytes = 256 * MiB) {
    return device::open({.backend = "cpu", .memory_bytes = bytes, .threads = 1});
}

struct Outcome {
    std::vector<train::StepLog> logs;
    std::vector<double> val;  // the validation loss after every other step
};

// `steps` steps (with an evaluation every other one), then a save.
Outcome train_run(Run& run, Rig& rig, std::span<const std::uint16_t> tokens, train::Options o,
                  std::uint64_t steps = kSteps) {
    Outcome out;
    auto self = self_comm();
    auto dev = device_of();
    data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
    train::Trainer t(run.m, self, rig.engine, rig.pool, *dev, o);
    for (std::uint64_t s = t.step_count(); s < steps; ++s) {
        out.logs.push_back(t.step(loader));
        if (s % 2) out.val.push_back(t.evaluate(loader, 2));
    }
    t.save();
    return out;
}

std::uint64_t bits(double v) { return std::bit_cast<std::uint64_t>(v); }
bool near(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)); }

void same_losses(const Outcome& a, const Outcome& b, const std::string& what) {
    BOOST_TEST_REQUIRE(a.logs.size() == b.logs.size(), what);
    for (std::size_t k = 0; k < a.logs.size(); ++k) {
        BOOST_TEST(bits(a.logs[k].loss) == bits(b.logs[k].loss),
                   what << " step " << k + 1 << ": loss " << a.logs[k].loss << " vs " << b.logs[k].loss);
        BOOST_TEST(bits(a.logs[k].grad_norm) == bits(b.logs[k].grad_norm), what << " step " << k + 1 << ": norm");
    }
    BOOST_TEST_REQUIRE(a.val.size() == b.val.size(), what);
    for (std::size_t k = 0; k < a.val.size(); ++k)
        BOOST_TEST(bits(a.val[k]) == bits(b.val[k]), what << " validation " << k << ": " << a.val[k] << " vs " << b.val[k]);
}

const Tier kTiers[] = {Tier::gpu, Tier::cpu, Tier::nvme};

// A trainer over a fresh bf16 all-NVMe run of kGPT with a prefetch budget,
// stepped by the caller.
struct BudgetRun {
    Run run;
    comm::Communicator self = self_comm();
    std::unique_ptr<device::Device> dev = device_of();
    data::Loader loader;
    train::Trainer t;
    BudgetRun(Rig& rig, std::uint64_t seed, std::span<const std::uint16_t> tokens, std::uint64_t budget)
        : run(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, seed), kGPT),
          loader(tokens, "tokens", {.batch = kB, .seq = kT}),
          t(run.m, self, rig.engine, rig.pool, *dev, options(run, budget)) {}
    static train::Options options(const Run& run, std::uint64_t budget) {
        train::Options o = train_options(run.manifest_path());
        o.infinity.prefetch_bytes = budget;
        return o;
    }
};

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_SUITE(placement)

// Every parameter tier x optimizer tier, fp32 and bf16 parameters: the same
// losses, validation losses, gradient norms and committed state (every
// state, byte for byte) as the resident engine.
BOOST_AUTO_TEST_CASE(nine_tiers_equal_the_resident_engine) {
    const std::uint64_t s = fresh_seed("nine tiers");
    const auto tokens = make_tokens(s, 97, (kSteps + 2) * kB * kT + 1);
    for (DType dt : {DType::fp32, DType::bf16}) {
        Rig rig;
        Run ref_run(rig, lay(dt, Tier::cpu, Tier::cpu, s), kGPT);
        train::Options ro = train_options(ref_run.manifest_path());
        ro.resident = true;
        const Outcome ref = train_run(ref_run, rig, tokens, ro);
        for (Tier pt : kTiers)
            for (Tier ot : kTiers) {
                const std::string what = std::string(shard::dtype_name(dt)) + " param " + shard::tier_name(pt) +
                                         ", optimizer " + shard::tier_name(ot);
                Run run(rig, lay(dt, pt, ot, s), kGPT);
                const Outcome got = train_run(run, rig, tokens, train_options(run.manifest_path()));
                same_losses(got, ref, what);
                same_state(shard::read_manifest_file(run.manifest_path()),
                           shard::read_manifest_file(ref_run.manifest_path()), rig, what);
                // Bytes came from the partition's own tier, and only from there.
                const auto& last = got.logs.back();
                for (Tier t : kTiers)
                    BOOST_TEST((last.fetched_bytes[static_cast<int>(t)] > 0) == (t == pt),
                               what << ": fetched " << last.fetched_bytes[static_cast<int>(t)] << " bytes from "
                                    << shard::tier_name(t));
            }
    }
}

// The gpu tier's refresh after the optimizer (on_param) is a copy on the
// h2d stream, in the engine's order whatever the streams' timing: with that
// stream held back until everything is asked for, a fetch issued before
// on_param still reads the old values and the next pass's fetch reads the
// new ones, bit for bit; and on_param returns with the caller's memory its
// own again (overwritten at once here). fp32 and bf16 parameters; the
// tensor is the largest a module declares (mlp.c_fc.weight: in fp32 more
// than one of the small pool's buffers, so its refresh goes in two pieces).
BOOST_AUTO_TEST_CASE(the_gpu_tier_refresh_is_a_copy_in_stream_order) {
    const std::uint64_t s = fresh_seed("gpu-tier refresh");
    std::mt19937_64 rng(s);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (DType dt : {DType::fp32, DType::bf16}) {
        BOOST_TEST_CONTEXT(shard::dtype_name(dt)) {
            Rig rig;
            Run run(rig, lay(dt, Tier::gpu, Tier::cpu, s), kGPT);
            auto self = self_comm();
            auto dev = device_of();
            model::GPT gpt(model::Config::from(run.m.spec));
            zero::CommittedParams store(run.m, 0, rig.engine, rig.pool);
            zero::InfinityEngine inf(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, store, {});

            const zero::Module* mod = nullptr;
            std::size_t t = 0;
            for (const zero::Module* x : gpt.modules())
                for (std::size_t pi : x->params())
                    if (!mod || run.m.tensors[pi].numel > run.m.tensors[t].numel) {
                        mod = x;
                        t = pi;
                    }
            BOOST_REQUIRE(mod);
            BOOST_TEST_REQUIRE(run.m.tensors[t].name == "h.0.mlp.c_fc.weight");
            const std::uint64_t n = run.m.tensors[t].numel;
            const std::size_t es = shard::dtype_bytes(dt);
            auto widen = [&](const Bytes& b) {
                std::vector<float> v(n);
                for (std::uint64_t i = 0; i < n; ++i) {
                    if (dt == DType::fp32) {
                        std::memcpy(&v[i], b.data() + 4 * i, 4);
                    } else {
                        std::uint16_t h;
                        std::memcpy(&h, b.data() + 2 * i, 2);
                        v[i] = from_bf16(h);
                    }
                }
                return v;
            };
            const std::vector<float> old_values = widen(cat_bytes(run.m, t, "param", rig));
            Bytes fresh(n * es);
            for (std::uint64_t i = 0; i < n; ++i) {
                const float f = value(rng);
                if (dt == DType::fp32) {
                    std::memcpy(fresh.data() + 4 * i, &f, 4);
                } else {
                    const std::uint16_t h = to_bf16(f);
                    std::memcpy(fresh.data() + 2 * i, &h, 2);
                }
            }
            const std::vector<float> new_values = widen(fresh);
            BOOST_TEST_REQUIRE(std::memcmp(old_values.data(), new_values.data(), n * 4) != 0);

            // The module's weight as its fetch gathers it, copied out on compute.
            auto fetch = [&](std::vector<float>& out) {
                inf.before_forward(*mod);
                dev->copy(dev->compute(), std::as_writable_bytes(std::span(out)), std::as_bytes(inf.weight(*mod, t)));
                inf.after_forward(*mod);
            };
            std::vector<float> before(n, -7.0f), after(n, -7.0f);
            std::promise<void> gate;
            dev->host(dev->h2d(), [f = gate.get_future().share()] { f.wait(); });
            inf.begin(false);
            fetch(before);
            inf.on_param(t, 0, fresh);
            std::fill(fresh.begin(), fresh.end(), std::byte{0x7f});
            gate.set_value();
            dev->synchronize(dev->compute());
            inf.end();
            inf.begin(false);
            fetch(after);
            dev->synchronize(dev->compute());
            inf.end();
            BOOST_TEST(std::memcmp(before.data(), old_values.data(), n * 4) == 0,
                       "a fetch issued before the refresh read its values");
            BOOST_TEST(std::memcmp(after.data(), new_values.data(), n * 4) == 0,
                       "the fetch after the refresh read other values than the ones handed over");
        }
    }
}

// Precision::bf16 (every GEMM's inputs rounded to bf16; the loss, gradients,
// master weights and optimizer state fp32), the GPT and the tiny Llama: the
// placements, whose engine keeps the matrices and embedding tables bf16 on
// the device and hands them to the GEMMs and the embedding as bf16, still
// equal the resident engine (fp32 copies of the same bf16 values, rounded
// at each GEMM) to the bit, losses and committed state (all nine for the
// GPT; for the Llama, whose GEMMs are the same calls, nvme x nvme, the
// farthest, to keep the suite short); a second resident run gives the same
// bits; the losses track the fp32 run's within 1e-2 relative, and differ
// from them (the rounding happened).
BOOST_AUTO_TEST_CASE(bf16_gemm_inputs_nine_tiers_equal_the_resident_engine) {
    constexpr std::uint64_t steps = 4;
    const std::uint64_t s = fresh_seed("bf16 precision");
    const auto tokens = make_tokens(s, 97, (steps + 2) * kB * kT + 1);
    for (const char* spec : {kGPT, "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=97,seq=16"}) {
        const bool gpt = spec == kGPT;
        Rig rig;
        auto run_of = [&](Run& run, bool resident, device::Precision p) {
            train::Options o = train_options(run.manifest_path());
            o.resident = resident;
            o.precision = p;
            return train_run(run, rig, tokens, o, steps);
        };
        Run ref_run(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s), spec);
        const Outcome ref = run_of(ref_run, true, device::Precision::bf16);
        {
            Run again(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s), spec);
            same_losses(run_of(again, true, device::Precision::bf16), ref, std::string(spec) + ": bf16, twice");
        }
        {
            Run f(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s), spec);
            const Outcome fp32 = run_of(f, true, device::Precision::fp32);
            bool differs = false;
            for (std::size_t k = 0; k < steps; ++k) {
                BOOST_TEST(near(ref.logs[k].loss, fp32.logs[k].loss, 1e-2),
                           spec << " step " << k + 1 << ": bf16 " << ref.logs[k].loss << ", fp32 "
                                << fp32.logs[k].loss);
                differs = differs || bits(ref.logs[k].loss) != bits(fp32.logs[k].loss);
            }
            BOOST_TEST(differs, spec << ": bf16 GEMM inputs changed no loss");
        }
        for (Tier pt : kTiers)
            for (Tier ot : kTiers) {
                if (!gpt && (pt != Tier::nvme || ot != Tier::nvme)) continue;
                const std::string what = std::string(spec) + ": bf16 GEMM inputs, param " + shard::tier_name(pt) +
                                         ", optimizer " + shard::tier_name(ot);
                Run run(rig, lay(DType::bf16, pt, ot, s), spec);
                same_losses(run_of(run, false, device::Precision::bf16), ref, what);
                same_state(shard::read_manifest_file(run.manifest_path()),
                           shard::read_manifest_file(ref_run.manifest_path()), rig, what);
            }
    }
}

// bf16 working parameters under Precision::bf16 are bf16 on the device,
// for the GPT and the tiny Llama (nvme x nvme, one rank), 10 steps:
//   - the bytes fetched are half those of the same run over fp32 parameters
//     (fp32 arithmetic, the reference), tier by tier, step by step;
//   - the engine's need is smaller by the fp32 copies it no longer makes:
//     the persistent tied table's reserved values by exactly its numel * 4
//     (its bf16 partition is its values at dp 1), and the largest fetch;
//     the device's peak use in every step below the run that widens the
//     same bf16 parameters to fp32 (fp32 arithmetic);
//   - the losses within bf16 tolerance (2e-2 relative) of the fp32 run's,
//     and falling: the last three steps' mean below the first three's.
BOOST_AUTO_TEST_CASE(bf16_weights_halve_the_bytes_fetched_and_held) {
    const std::uint64_t s = fresh_seed("bf16 weights");
    // A sequence with no noise in it (each token the last plus 7): ten steps learn it.
    std::vector<std::uint16_t> tokens((kSteps + 2) * kB * kT + 1);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>((s + i * 7) % 97);
    for (const char* spec : {kGPT, "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=97,seq=16"}) {
        BOOST_TEST_CONTEXT(spec) {
            Rig rig;
            auto run_of = [&](DType dt, device::Precision p) {
                Run run(rig, lay(dt, Tier::nvme, Tier::nvme, s), spec);
                train::Options o = train_options(run.manifest_path());
                o.precision = p;
                o.schedule.lr = o.adamw.lr = 5e-3;  // far enough in 10 steps to see the loss fall
                return std::pair{train_run(run, rig, tokens, o), run.m};
            };
            const auto [fp32, m32] = run_of(DType::fp32, device::Precision::fp32);
            const auto [bf16, m16] = run_of(DType::bf16, device::Precision::bf16);
            const auto [wide, mw] = run_of(DType::bf16, device::Precision::fp32);
            BOOST_TEST_REQUIRE(bf16.logs.size() == kSteps);
            for (std::size_t k = 0; k < kSteps; ++k) {
                const auto &a = fp32.logs[k], &b = bf16.logs[k], &w = wide.logs[k];
                for (int t = 0; t < 3; ++t)
                    BOOST_TEST(2 * b.fetched_bytes[t] == a.fetched_bytes[t], "step " << k + 1 << " tier " << t);
                BOOST_TEST(b.fetched_bytes[2] > 0u);
                BOOST_TEST(b.device_peak_bytes < w.device_peak_bytes,
                           "step " << k + 1 << ": " << b.device_peak_bytes << " vs " << w.device_peak_bytes);
                BOOST_TEST(near(b.loss, a.loss, 2e-2), "step " << k + 1 << ": bf16 " << b.loss << ", fp32 " << a.loss);
            }
            // Each step's batch is another: the mean of the last three below the first three's.
            auto mean3 = [&logs = bf16.logs](std::size_t at) {  // (clang 14: no structured binding in a lambda)
                return (logs[at].loss + logs[at + 1].loss + logs[at + 2].loss) / 3;
            };
            std::string all;
            for (const auto& l : bf16.logs) all += " " + std::to_string(l.loss);
            BOOST_TEST(mean3(kSteps - 3) < mean3(0), "losses" << all);

            // The need, by hand for the tied table.
            const auto model = model::make_model(model::Config::from(m16.spec));
            zero::InfinityOptions keep, widen;
            keep.bf16_weights = true;
            const auto nk = zero::InfinityEngine::need(m16, model->modules(), keep);
            const auto nw = zero::InfinityEngine::need(m16, model->modules(), widen);
            const std::uint64_t table = m16.tensors[0].numel;  // wte / embed_tokens: first, (V, C)
            BOOST_TEST(m16.tensors[0].shape.size() == 2u);
            if (std::string(spec) == kGPT)
                BOOST_TEST(nw.reserved - nk.reserved == align_up(table * 4, mem::kArenaAlignment));
            BOOST_TEST(nk.largest < nw.largest);
            // Over fp32 parameters (their own master) nothing is kept bf16.
            BOOST_TEST(zero::InfinityEngine::need(m32, model->modules(), keep).total() ==
                       zero::InfinityEngine::need(m32, model->modules(), widen).total());
        }
    }
}

// Precision::bf16 keeps the activation checkpoints (the residual stream at
// every block boundary) bf16, on the device and offloaded, for a four-block
// GPT and a three-block Llama (two and one checkpoints offloaded), over
// fp32 parameters (so that nothing else is kept bf16 but the blocks'
// own Kept activations, Shape::activations), ten steps:
//   - offloaded to cpu or nvme, the same bits as kept on the device
//     (losses, validation losses, norms, committed state), and a second
//     run on the device the same bits again;
//   - nvme: the checkpoint bytes written and read back each step are those
//     of B x T x C bf16 values per offloaded checkpoint, half the fp32 run's;
//   - the device's peak below the fp32 run's by exactly what the planned
//     activations save (plan_bytes), offloading or not;
//   - the losses within bf16 tolerance (2e-2 relative) of the fp32 run's,
//     not equal to them, and falling.
BOOST_AUTO_TEST_CASE(bf16_checkpoints_halve_the_bytes_kept_and_offloaded) {
    const std::uint64_t s = fresh_seed("bf16 checkpoints");
    std::vector<std::uint16_t> tokens((kSteps + 2) * kB * kT + 1);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>((s + i * 7) % 97);
    for (const char* spec : {"gpt:layers=4,hidden=32,heads=2,vocab=97,seq=16",
                             "llama:layers=3,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=97,seq=16"}) {
        BOOST_TEST_CONTEXT(spec) {
            Rig rig;
            const auto cfg = model::Config::from(shard::ModelSpec::parse(spec));
            const auto gpt = model::make_model(cfg);
            auto train = [&](Run& run, device::Precision p, model::Offload where) {
                train::Options o = train_options(run.manifest_path());
                o.precision = p;
                o.offload_activations = where;
                o.schedule.lr = o.adamw.lr = 5e-3;  // far enough in 10 steps to see the loss fall
                return train_run(run, rig, tokens, o);
            };
            auto run_of = [&](device::Precision p, model::Offload where) {
                Run run(rig, lay(DType::fp32, Tier::cpu, Tier::cpu, s), spec);
                return train(run, p, where);
            };
            auto peak_of = [&](device::Precision p, model::Offload where) {
                return gpt->plan_bytes({.batch = kB, .seq = kT, .offload = where, .checkpoints = p, .activations = p});
            };
            const auto bf = device::Precision::bf16, f32 = device::Precision::fp32;
            Run ref_run(rig, lay(DType::fp32, Tier::cpu, Tier::cpu, s), spec);
            const Outcome ref = train(ref_run, bf, model::Offload::none);
            same_losses(run_of(bf, model::Offload::none), ref, "bf16 checkpoints, twice");
            for (const model::Offload where : {model::Offload::cpu, model::Offload::nvme}) {
                const std::string what = std::string("bf16 checkpoints offloaded to ") + model::offload_name(where);
                Run run(rig, lay(DType::fp32, Tier::cpu, Tier::cpu, s), spec);
                same_losses(train(run, bf, where), ref, what);
                same_state(shard::read_manifest_file(run.manifest_path()),
                           shard::read_manifest_file(ref_run.manifest_path()), rig, what);
            }
            const Outcome nvme16 = run_of(bf, model::Offload::nvme), nvme32 = run_of(f32, model::Offload::nvme),
                          fp32 = run_of(f32, model::Offload::none);
            const std::uint64_t each = kB * kT * cfg.hidden * 2, offloaded = model::offloaded_checkpoints(cfg);
            BOOST_TEST(offloaded == cfg.layers - 2);
            BOOST_TEST(model::checkpoint_bytes(cfg, kB, kT, bf) == each);
            bool differs = false;
            for (std::size_t k = 0; k < kSteps; ++k) {
                const auto &b = nvme16.logs[k], &a = nvme32.logs[k];
                BOOST_TEST(b.activation_written_bytes == offloaded * each, "step " << k + 1);
                BOOST_TEST(b.activation_read_bytes == offloaded * each, "step " << k + 1);
                BOOST_TEST(2 * b.activation_written_bytes == a.activation_written_bytes, "step " << k + 1);
                BOOST_TEST(2 * b.activation_read_bytes == a.activation_read_bytes, "step " << k + 1);
                BOOST_TEST(fp32.logs[k].device_peak_bytes - ref.logs[k].device_peak_bytes ==
                               peak_of(f32, model::Offload::none) - peak_of(bf, model::Offload::none),
                           "step " << k + 1);
                BOOST_TEST(a.device_peak_bytes - b.device_peak_bytes ==
                               peak_of(f32, model::Offload::nvme) - peak_of(bf, model::Offload::nvme),
                           "step " << k + 1);
                BOOST_TEST(near(ref.logs[k].loss, fp32.logs[k].loss, 2e-2),
                           "step " << k + 1 << ": bf16 " << ref.logs[k].loss << ", fp32 " << fp32.logs[k].loss);
                differs = differs || bits(ref.logs[k].loss) != bits(fp32.logs[k].loss);
            }
            BOOST_TEST(differs, "bf16 checkpoints changed no loss");
            BOOST_TEST(peak_of(bf, model::Offload::none) < peak_of(f32, model::Offload::none));
            BOOST_TEST(peak_of(bf, model::Offload::nvme) < peak_of(f32, model::Offload::nvme));
            auto mean3 = [&](std::size_t at) {
                return (ref.logs[at].loss + ref.logs[at + 1].loss + ref.logs[at + 2].loss) / 3;
            };
            std::string all;
            for (const auto& l : ref.logs) all += " " + std::to_string(l.loss);
            BOOST_TEST(mean3(kSteps - 3) < mean3(0), "losses" << all);
        }
    }
}

// The same with prefetching off, with every parameter persistent, and
// without activation checkpointing (no recomputation in backward).
BOOST_AUTO_TEST_CASE(prefetch_persistence_and_checkpointing_change_nothing) {
    const std::uint64_t s = fresh_seed("engine options");
    const auto tokens = make_tokens(s, 97, (kSteps + 2) * kB * kT + 1);
    Rig rig;
    for (bool checkpoint : {true, false}) {
        Run ref_run(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s), kGPT);
        train::Options ro = train_options(ref_run.manifest_path());
        ro.resident = true;
        ro.checkpoint = checkpoint ? train::Checkpointing::all : train::Checkpointing::none;
        const Outcome ref = train_run(ref_run, rig, tokens, ro);
        struct Case {
            const char* name;
            std::uint64_t prefetch, persist;
            bool persist_shared = true;
        };
        for (const Case c : {Case{"on demand", 0, 0}, Case{"prefetch 64KiB", 64 * KiB, 0},
                             Case{"all persistent", 64 * MiB, 1u << 30}, Case{"small persistent", 64 * MiB, 100},
                             Case{"tied wte fetched at each use", 64 * MiB, 0, false},
                             Case{"tied wte fetched at each use, on demand", 0, 0, false}}) {
            Run run(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s), kGPT);
            train::Options o = train_options(run.manifest_path());
            o.checkpoint = checkpoint ? train::Checkpointing::all : train::Checkpointing::none;
            o.infinity.prefetch_bytes = c.prefetch;
            o.infinity.persist_below = c.persist;
            o.infinity.persist_shared = c.persist_shared;
            const Outcome got = train_run(run, rig, tokens, o);
            const std::string what = std::string(c.name) + (checkpoint ? ", checkpointed" : ", no checkpointing");
            same_losses(got, ref, what);
            same_state(shard::read_manifest_file(run.manifest_path()),
                       shard::read_manifest_file(ref_run.manifest_path()), rig, what);
        }
    }
}

// Tiled layouts against the untiled one, within 1e-6 relative, not bitwise:
// a tile is a GEMM of fewer columns, for which OpenBLAS picks other blocking
// and kernels (the first step's loss already differs in the last bits), and
// the backward's dx sums the tiles' products one after another (beta 1)
// instead of inside one GEMM's inner loop.
BOOST_AUTO_TEST_CASE(tiles_match_the_untiled_run) {
    const std::uint64_t s = fresh_seed("tiles");
    const auto tokens = make_tokens(s, 97, (kSteps + 2) * kB * kT + 1);
    Rig rig;
    Run one(rig, lay(DType::fp32, Tier::nvme, Tier::cpu, s), kGPT);
    const Outcome ref = train_run(one, rig, tokens, train_options(one.manifest_path()), 4);
    for (unsigned tile : {2u, 4u}) {
        shard::LayoutOptions lo = lay(DType::fp32, Tier::nvme, Tier::cpu, s);
        lo.tile = tile;
        Run run(rig, lo, kGPT);
        const Outcome got = train_run(run, rig, tokens, train_options(run.manifest_path()), 4);
        BOOST_TEST_REQUIRE(got.logs.size() == ref.logs.size());
        for (std::size_t k = 0; k < got.logs.size(); ++k) {
            BOOST_TEST_MESSAGE("tile " << tile << " step " << k + 1 << ": " << got.logs[k].loss << " vs "
                                       << ref.logs[k].loss);
            BOOST_TEST(near(got.logs[k].loss, ref.logs[k].loss, 1e-6), "tile " << tile << " step " << k + 1);
            BOOST_TEST(near(got.logs[k].grad_norm, ref.logs[k].grad_norm, 1e-5), "tile " << tile << " step " << k + 1);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(trace)

// Steps after the first replay the recorded order: everything fetched ahead
// with a large budget, nothing with none; the trace names every module that
// holds parameters, forward then backward.
BOOST_AUTO_TEST_CASE(later_steps_prefetch_along_the_trace) {
    const std::uint64_t s = fresh_seed("prefetch");
    const auto tokens = make_tokens(s, 97, 8 * kB * kT + 1);
    Rig rig;
    for (std::uint64_t budget : {std::uint64_t{0}, 96 * KiB, 64 * MiB}) {
        BudgetRun r(rig, s, tokens, budget);
        auto& [run, self, dev, loader, t] = r;
        t.step(loader);
        const auto first = t.engine().stats();
        BOOST_TEST(first.prefetched == 0u);
        BOOST_TEST(first.on_demand > 0u);
        t.step(loader);
        const auto second = t.engine().stats();
        if (budget == 64 * MiB) {
            BOOST_TEST(second.prefetched > 0u);
            BOOST_TEST(second.on_demand == 0u, second.on_demand << " fetches on demand with a trace to replay");
        } else if (budget) {
            // A window of a few modules: the nc stage reads partitions
            // further ahead than the fetches in flight reach.
            BOOST_TEST(second.prefetched > 0u);
            BOOST_TEST(second.read_ahead > 0u, "nothing read ahead of the fetches");
        } else {
            BOOST_TEST(second.prefetched == 0u);
            BOOST_TEST(second.read_ahead == 0u);
        }
        BOOST_TEST(!second.diverged);
        const auto tr = t.engine().trace(true);
        BOOST_TEST_REQUIRE(!tr.empty());
        BOOST_TEST(tr.front() == "embedding forward");
        BOOST_TEST(tr.back() == "embedding backward");
        BOOST_TEST(std::count(tr.begin(), tr.end(), "lm_head forward") == 1);
        BOOST_TEST(std::count(tr.begin(), tr.end(), "h.1.mlp.c_fc backward") == 1);
        // Checkpointed blocks run their forward again inside backward.
        BOOST_TEST(std::count(tr.begin(), tr.end(), "h.1.mlp.c_fc forward") == 2);
        BOOST_TEST(first.device_peak <= dev->arena().stats().bytes);
    }
}

// With activation checkpointing every block's forward runs again in
// backward, and its fetches are kept for the modules' own backward: each
// parameter's bytes are read twice a step (forward, then the recomputed
// forward with its backward), the tied wte (persistent) once, whatever the
// prefetch budget, also one smaller than a block (the budget bounds what is
// fetched ahead, not what a recomputed block keeps). Under a 64KiB budget
// the MLP's fetch (c_fc: 20,736 elements, bf16 values widened to fp32 with
// their fp32 gradient, 207KiB) used to be released after the recomputed
// forward and fetched a third time for its backward.
BOOST_AUTO_TEST_CASE(a_checkpointed_step_reads_each_parameter_twice) {
    const std::uint64_t s = fresh_seed("fetched twice");
    const auto tokens = make_tokens(s, 97, 8 * kB * kT + 1);
    Rig rig;
    for (std::uint64_t budget : {64 * KiB, 96 * KiB, 64 * MiB}) {
        BudgetRun r(rig, s, tokens, budget);
        auto& [run, self, dev, loader, t] = r;
        std::uint64_t all = 0;
        for (const auto& tensor : run.m.tensors) all += tensor.numel * 2;  // bf16, dp 1
        const std::uint64_t wte = run.m.tensors[0].numel * 2;
        BOOST_TEST_REQUIRE(run.m.tensors[0].name.find("wte") != std::string::npos);
        for (int k = 0; k < 3; ++k) {
            t.step(loader);
            const auto st = t.engine().stats();
            BOOST_TEST_MESSAGE("budget " << budget << " step " << k + 1 << ": fetched " << st.fetched_bytes[2]
                                         << " of " << all << ", reused " << st.reused);
            if (k == 0) continue;  // the first step records the order
            BOOST_TEST(st.fetched_bytes[2] == 2 * all - wte,
                       "budget " << budget << " step " << k + 1 << ": " << st.fetched_bytes[2] << " bytes fetched, "
                                 << 2 * all - wte << " = every parameter twice and wte once");
            BOOST_TEST(!st.diverged);
        }
    }
}

// A step whose modules run in another order than the trace (activation
// checkpointing switched off after the first step, so backward no longer
// runs the blocks' forward again) is fetched on demand from where the order
// changed, warned about once, and gives the losses of the resident engine;
// the next step records and replays the new order.
BOOST_AUTO_TEST_CASE(divergence_fetches_on_demand_with_the_same_losses) {
    const std::uint64_t s = fresh_seed("divergence");
    const auto tokens = make_tokens(s, 97, 8 * kB * kT + 1);
    Rig rig;
    std::vector<double> losses[2];
    for (bool resident : {true, false}) {
        Run run(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s), kGPT);
        auto self = self_comm();
        auto dev = device_of();
        zero::OptimizerOptions zo;
        zo.adamw = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
        zo.kernel.threads = 1;
        zo.manifest_path = run.manifest_path();
        model::GPT gpt(model::Config::from(run.m.spec));
        model::Activations acts[2] = {gpt.plan(*dev, {.batch = kB, .seq = kT, .checkpoint = true}),
                                      gpt.plan(*dev, {.batch = kB, .seq = kT, .checkpoint = false})};
        zero::Optimizer opt(run.m, self, rig.engine, rig.pool, zo);
        std::unique_ptr<zero::ResidentEngine> res;
        std::unique_ptr<zero::InfinityEngine> inf;
        // The resident copy loaded from the committed bf16 parameters, widened.
        auto load = [&] {
            for (std::size_t t = 0; t < run.m.tensors.size(); ++t) {
                const auto b = cat_bytes(run.m, t, "param", rig);
                std::vector<float> v(b.size() / 2);
                for (std::size_t i = 0; i < v.size(); ++i)
                    v[i] = from_bf16(static_cast<std::uint16_t>(std::to_integer<unsigned>(b[2 * i]) |
                                                                (std::to_integer<unsigned>(b[2 * i + 1]) << 8)));
                dev->copy(dev->compute(), std::as_writable_bytes(res->values(t)), std::as_bytes(std::span(v)));
                dev->synchronize(dev->compute());
            }
        };
        if (resident) {
            res = std::make_unique<zero::ResidentEngine>(*dev, model::numels(gpt.params_table()));
            load();
        } else {
            inf = std::make_unique<zero::InfinityEngine>(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, opt,
                                                         zero::InfinityOptions{});
        }
        zero::ParamEngine& eng = resident ? static_cast<zero::ParamEngine&>(*res) : *inf;
        data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
        std::vector<std::int32_t> in(kB * kT), tg(kB * kT);
        std::vector<float> l(kB * kT);
        // Steps 1 and 2 checkpointed, 3 and 4 not, 5 checkpointed again.
        const bool ckpt[] = {true, true, false, false, true};
        std::string warnings;
        for (std::size_t k = 0; k < std::size(ckpt); ++k) {
            auto& a = acts[ckpt[k] ? 0 : 1];
            auto& st = dev->compute();
            loader.batch(k, in, tg);
            dev->copy(st, std::as_writable_bytes(a.inputs.span()), std::as_bytes(std::span(in)));
            dev->copy(st, std::as_writable_bytes(a.targets.span()), std::as_bytes(std::span(tg)));
            model::Context ctx{*dev, st, eng};
            if (res) res->zero_grad(st);
            if (inf) inf->begin(true);
            warnings += capture_stderr([&] {
                gpt.forward(ctx, a);
                gpt.backward(ctx, a);
            });
            if (inf) inf->end();
            dev->copy(st, std::as_writable_bytes(std::span(l)), std::as_bytes(a.losses.span()));
            dev->synchronize(st);
            if (res) {
                for (std::size_t t = 0; t < run.m.tensors.size(); ++t) {
                    std::vector<float> g(res->gradient(t).size());
                    dev->copy(st, std::as_writable_bytes(std::span(g)), std::as_bytes(res->gradient(t)));
                    dev->synchronize(st);
                    opt.put_gradient(t, std::span<const float>(g));
                }
            }
            double sum = 0;
            for (float x : l) sum += x;
            losses[resident ? 0 : 1].push_back(sum / static_cast<double>(l.size()));
            if (inf) {
                const auto stt = inf->stats();
                BOOST_TEST(stt.diverged == (k == 2 || k == 4), "step " << k + 1);
                if (k == 1 || k == 3) BOOST_TEST(stt.on_demand == 0u, "step " << k + 1 << " replays its trace");
            }
            // Every state streams from NVMe, so each step commits: the new
            // parameters are in the manifest the optimizer keeps up to date.
            opt.step();
            if (inf) inf->after_step();
            if (res) load();
        }
        if (inf) {
            BOOST_TEST(contains(warnings, "out of the recorded order"), warnings);
            // Once per engine: the second change of order is not warned again.
            BOOST_TEST(warnings.find("out of the recorded order") == warnings.rfind("out of the recorded order"));
        }
    }
    BOOST_TEST_REQUIRE(losses[0].size() == losses[1].size());
    for (std::size_t k = 0; k < losses[0].size(); ++k)
        BOOST_TEST(bits(losses[0][k]) == bits(losses[1][k]),
                   "step " << k + 1 << ": resident " << losses[0][k] << ", engine " << losses[1][k]);
}

// The gradients leave through a ring of staging buffers, handed over by
// the engine's own worker: with every hand-over slowed (a store that
// sleeps in put_gradient), the backward's caller waits for a free buffer
// (the ring's stall is reported), and each gradient the store receives is,
// byte for byte and in the same order, what a store that never sleeps
// receives: no buffer is written again before its hand-over is done.
struct RecordingStore final : zero::ParamStore {
    zero::ParamStore& inner;
    std::chrono::milliseconds delay;
    std::vector<std::size_t> order;
    std::vector<Bytes> got;
    RecordingStore(zero::ParamStore& s, std::size_t tensors, std::chrono::milliseconds d)
        : inner(s), delay(d), got(tensors) {}
    zero::ParamSource param_source(std::size_t t) override { return inner.param_source(t); }
    void put_gradient(std::size_t t, std::span<const float> g) override {
        std::this_thread::sleep_for(delay);
        const auto b = std::as_bytes(g);
        got.at(t).assign(b.begin(), b.end());
        order.push_back(t);
    }
};

BOOST_AUTO_TEST_CASE(a_slow_handover_never_sees_its_buffer_overwritten) {
    const std::uint64_t s = fresh_seed("staging ring");
    const auto tokens = make_tokens(s, 97, kB * kT + 1);
    Rig rig;
    Run run(rig, lay(DType::fp32, Tier::cpu, Tier::cpu, s), kGPT);
    std::vector<std::size_t> order[2];
    std::vector<Bytes> got[2];
    double waited[2] = {};
    for (int slow : {0, 1}) {
        auto self = self_comm();
        auto dev = device_of();
        model::GPT gpt(model::Config::from(run.m.spec));
        model::Activations a = gpt.plan(*dev, {.batch = kB, .seq = kT, .checkpoint = false});
        zero::CommittedParams committed(run.m, 0, rig.engine, rig.pool);
        RecordingStore store(committed, run.m.tensors.size(), std::chrono::milliseconds(slow ? 15 : 0));
        zero::InfinityEngine inf(run.m, gpt.modules(), self, rig.engine, rig.pool, *dev, store, {});
        data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
        std::vector<std::int32_t> in(kB * kT), tg(kB * kT);
        loader.batch(0, in, tg);
        auto& st = dev->compute();
        dev->copy(st, std::as_writable_bytes(a.inputs.span()), std::as_bytes(std::span(in)));
        dev->copy(st, std::as_writable_bytes(a.targets.span()), std::as_bytes(std::span(tg)));
        model::Context ctx{*dev, st, inf};
        inf.begin(true);
        gpt.forward(ctx, a);
        gpt.backward(ctx, a);
        inf.end();
        order[slow] = store.order;
        got[slow] = store.got;
        waited[slow] = inf.stats().staging_wait_seconds;
    }
    BOOST_TEST(order[0].size() == run.m.tensors.size());
    BOOST_TEST((order[0] == order[1]), "the hand-overs' order");
    BOOST_TEST(waited[1] > 0.01, "the backward waited " << waited[1] << " s for a free staging buffer");
    for (std::size_t t = 0; t < run.m.tensors.size(); ++t) {
        BOOST_TEST(!got[0][t].empty(), run.m.tensors[t].name);
        same_bytes(got[1][t], got[0][t], "the gradient of " + run.m.tensors[t].name + " handed over slowly");
    }
}

// No copy in a step has a pageable host side (Device::pageable_copies):
// the batch, the losses, the parameters fetched from the cpu tier or read
// from NVMe, the gradients out and the optimizer's state on the device all
// go through the pool's memory or stay in the arena; steps 2 and 3 of every
// placement count none (step 1 records the trace, as the others would).
BOOST_AUTO_TEST_CASE(a_step_copies_no_pageable_memory) {
    const std::uint64_t s = fresh_seed("pageable copies");
    const auto tokens = make_tokens(s, 97, 4 * kB * kT + 1);
    Rig rig;
    for (Tier t : kTiers) {
        Run run(rig, lay(DType::bf16, t, t, s), kGPT);
        auto self = self_comm();
        auto dev = device_of();
        data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
        train::Trainer tr(run.m, self, rig.engine, rig.pool, *dev, train_options(run.manifest_path()));
        tr.step(loader);
        const std::uint64_t before = dev->pageable_copies();
        tr.step(loader);
        tr.step(loader);
        BOOST_TEST(dev->pageable_copies() == before,
                   shard::tier_name(t) << ": " << dev->pageable_copies() - before << " pageable copies in two steps");
    }
    // And the counter counts: a copy from a vector is one.
    auto dev = device_of();
    auto a = dev->alloc<float>(16, "x");
    std::vector<float> v(16, 1.0f);
    const std::uint64_t before = dev->pageable_copies();
    dev->copy(dev->compute(), std::as_writable_bytes(a.span()), std::as_bytes(std::span(v)));
    dev->synchronize(dev->compute());
    BOOST_TEST(dev->pageable_copies() == before + 1);
}

// The step record's traffic: every byte fetched from the cpu tier and
// the batch went host to device, every gradient partition and the losses
// device to host; the gpu tier fetches nothing from the host, and its
// update runs on the device (optimizer_host_s 0), the cpu tier's on the
// host.
BOOST_AUTO_TEST_CASE(the_step_record_counts_host_device_traffic) {
    const std::uint64_t s = fresh_seed("h2d d2h");
    const auto tokens = make_tokens(s, 97, 4 * kB * kT + 1);
    Rig rig;
    for (Tier t : {Tier::gpu, Tier::cpu}) {
        const std::string what = shard::tier_name(t);
        Run run(rig, lay(DType::fp32, t, t, s), kGPT);
        auto self = self_comm();
        auto dev = device_of();
        data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
        train::Trainer tr(run.m, self, rig.engine, rig.pool, *dev, train_options(run.manifest_path()));
        tr.step(loader);
        const train::StepLog log = tr.step(loader);
        std::uint64_t params = 0;
        for (const auto& x : run.m.tensors) params += x.numel;
        const std::uint64_t batch = 2 * kB * kT * 4;  // inputs and targets, int32
        BOOST_TEST(log.fetched_bytes[1] == (t == Tier::cpu ? log.fetched_bytes[1] : 0u), what);
        // Gradients out (fp32, every element), the losses (fp32 a token).
        BOOST_TEST(log.d2h_bytes == params * 4 + kB * kT * 4, what << ": d2h " << log.d2h_bytes);
        if (t == Tier::cpu) {
            BOOST_TEST(log.fetched_bytes[1] > 0u, what);
            BOOST_TEST(log.h2d_bytes == log.fetched_bytes[1] + batch, what << ": h2d " << log.h2d_bytes);
            BOOST_TEST(log.optimizer_host_seconds > 0, what);
        } else {
            // The batch, and the gradients (fp32) put on the host, copied to
            // the device's AdamW in one span (with the layout's alignment gaps).
            const std::uint64_t gaps = run.m.tensors.size() * run.m.opts.alignment;
            BOOST_TEST(log.h2d_bytes >= batch + params * 4, what << ": h2d " << log.h2d_bytes);
            BOOST_TEST(log.h2d_bytes <= batch + params * 4 + gaps, what << ": h2d " << log.h2d_bytes);
            BOOST_TEST(log.optimizer_host_seconds == 0, what);
            BOOST_TEST(log.optimizer_update_seconds > 0, what);
        }
        BOOST_TEST(log.d2h_stall_seconds >= 0, what);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(memory)

// The budget the trainer reports as its need trains; one byte less is
// refused when the trainer opens, before any step, naming the module, the
// bytes and a tile factor that fits.
BOOST_AUTO_TEST_CASE(the_reported_need_runs_and_a_byte_less_is_refused) {
    const std::uint64_t s = fresh_seed("budget");
    const auto tokens = make_tokens(s, 97, 8 * kB * kT + 1);
    Rig rig;
    Run run(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s), kGPT);
    auto self = self_comm();
    data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
    std::uint64_t need = 0;
    {
        auto dev = device_of();
        train::Trainer t(run.m, self, rig.engine, rig.pool, *dev, train_options(run.manifest_path()));
        need = t.device_need();
    }
    BOOST_TEST_MESSAGE("the run needs " << need << " bytes of device memory");
    {
        auto dev = device_of(need);
        train::Trainer t(run.m, self, rig.engine, rig.pool, *dev, train_options(run.manifest_path()));
        for (int k = 0; k < 3; ++k) {
            const auto log = t.step(loader);
            BOOST_TEST(std::isfinite(log.loss));
            BOOST_TEST(log.device_peak_bytes <= need);
        }
        t.save();
    }
    auto dev = device_of(need - 1);
    std::string msg;
    try {
        train::Trainer t(run.m, self, rig.engine, rig.pool, *dev, train_options(run.manifest_path()));
        BOOST_ERROR("a budget one byte under the need was taken");
    } catch (const zero::DoesNotFit& e) {
        msg = e.what();
        BOOST_TEST(e.exit_code() == 64);
    }
    BOOST_TEST(contains(msg, "h.0.mlp.c_fc needs"), msg);
    BOOST_TEST(contains(msg, std::to_string(need)), msg);
    BOOST_TEST(contains(msg, "--tile"), msg);
}

// Tiling shrinks the largest fetch about K-fold (the linear weights are the
// largest tensors of a block; wte, whole in the embedding, is not tiled).
BOOST_AUTO_TEST_CASE(tiling_shrinks_the_largest_block_fetch) {
    const auto spec = shard::ModelSpec::parse("gpt:layers=2,hidden=256,heads=4,vocab=97,seq=16");
    std::uint64_t prev = 0;
    for (unsigned tile : {1u, 2u, 4u}) {
        shard::LayoutOptions lo;
        lo.tile = tile;
        const shard::Manifest m = shard::layout(spec, lo);
        const model::GPT gpt(model::Config::from(spec, tile));
        const auto need = zero::InfinityEngine::need(m, gpt.modules(), {});
        const std::uint64_t largest = need.largest;
        BOOST_TEST(need.module.starts_with("h.0.mlp.c_fc"), need.module);
        BOOST_TEST_MESSAGE("tile " << tile << ": the largest fetch, " << need.module << ", is " << largest << " bytes");
        if (prev) BOOST_TEST(double(largest) < 0.6 * double(prev), "tile " << tile << ": " << largest << " vs " << prev);
        prev = largest;
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// NCCL's flat bucket area (comm/flat.cpp) comes from the engine's arena:
// the engine sizes it before the first step, counts it in the budget and
// hands it to the device communicator. A fake backend stands for NCCL here:
// it lays buckets flat (or not) over dp ranks and records the areas given.
BOOST_AUTO_TEST_SUITE(flat_area)

namespace {

namespace cd = comm::detail;

// What the plan (cd::plan_flat) needs for a bucket of these tensors over dp
// ranks, each tensor's blocks by the partition rule; 0 without a flat form.
std::uint64_t plan_bytes(comm::Kind kind, const std::vector<std::uint64_t>& numels, comm::DType dtype, unsigned dp) {
    cd::Op op;
    op.kind = kind;
    op.dtype = dtype;
    for (const std::uint64_t n : numels) {
        std::vector<std::uint64_t> counts;
        for (unsigned r = 0; r < dp; ++r) counts.push_back(shard::owned(n, dp, r).count);
        op.bufs.push_back({{}, {}, counts});
    }
    return cd::needs_flat(op) ? cd::plan_flat(op, static_cast<int>(dp)).bytes(static_cast<int>(dp)) : 0;
}

}  // namespace

// The area the engine reserves is the largest the plan needs for any bucket
// of the run: a module's gather of every parameter it uses (in the
// parameters' dtype) or its reduce-scatter of the gradients it declares
// (fp32), over GPT and Llama models of fixed and random shapes, tiled or
// not, at dp 1 to 8; none at dp 1, and none for a communicator that lays
// nothing flat (MPI, self).
BOOST_AUTO_TEST_CASE(the_area_is_the_largest_bucket_the_plan_lays_flat) {
    std::mt19937_64 rng(fresh_seed("flat area"));
    std::vector<std::string> specs{kGPT, "gpt:layers=1,hidden=64,heads=4,vocab=257,seq=8",
                                   "llama:layers=2,hidden=64,heads=4,vocab=101,seq=16"};
    for (int k = 0; k < 4; ++k) {
        const unsigned heads = 1 + rng() % 4, hidden = heads * 8 * (1 + rng() % 6);
        specs.push_back("gpt:layers=" + std::to_string(1 + rng() % 3) + ",hidden=" + std::to_string(hidden) +
                        ",heads=" + std::to_string(heads) + ",vocab=" + std::to_string(5 + rng() % 300) + ",seq=8");
    }
    std::size_t flat_seen = 0;
    for (const std::string& spec : specs)
        for (unsigned tile : {1u, 2u})
            for (DType dt : {DType::fp32, DType::bf16})
                for (unsigned dp = 1; dp <= 8; ++dp) {
                    const std::string what = spec + " tile " + std::to_string(tile) + " " + shard::dtype_name(dt) +
                                             " dp " + std::to_string(dp);
                    shard::LayoutOptions lo;
                    lo.dp = dp;
                    lo.tile = tile;
                    lo.param_dtype = dt;
                    const shard::Manifest m = shard::layout(shard::ModelSpec::parse(spec), lo);
                    const auto model = model::make_model(model::Config::from(m.spec, tile));
                    zero::InfinityOptions io;
                    io.persist_below = rng() % 2 ? 0 : 1000;
                    FlatComm nccl(static_cast<int>(dp)), host(static_cast<int>(dp), false);
                    io.device_comm = &nccl.c;
                    const auto n = zero::InfinityEngine::need(m, model->modules(), io);
                    std::uint64_t want = 0;
                    std::string module;
                    if (dp > 1)
                        for (const zero::Module* mod : model->modules()) {
                            std::vector<std::uint64_t> used, declared;
                            std::vector<std::size_t> seen;
                            for (auto list : {mod->params(), mod->external()})
                                for (std::size_t t : list)
                                    if (std::find(seen.begin(), seen.end(), t) == seen.end()) {
                                        seen.push_back(t);
                                        used.push_back(m.tensors[t].numel);
                                    }
                            for (std::size_t t : mod->params()) declared.push_back(m.tensors[t].numel);
                            const auto wire = dt == DType::bf16 ? comm::DType::bf16 : comm::DType::f32;
                            for (const std::uint64_t b : {plan_bytes(comm::Kind::allgather, used, wire, dp),
                                                          plan_bytes(comm::Kind::reduce_scatter, declared,
                                                                     comm::DType::f32, dp)})
                                if (align_up(b, mem::kArenaAlignment) > want) {
                                    want = align_up(b, mem::kArenaAlignment);
                                    module = mod->name();
                                }
                        }
                    BOOST_TEST(n.flat == want, what);
                    BOOST_TEST(n.flat_module == module, what << ": " << n.flat_module << " vs " << module);
                    // (At dp > 1 too a run may need none: a module of one
                    // tensor that dp divides is one call of equal blocks.)
                    if (dp == 1) BOOST_TEST(n.flat == 0u, what);
                    flat_seen += n.flat > 0;
                    // The rest of the need is as without a flat area.
                    io.device_comm = &host.c;
                    const auto plain = zero::InfinityEngine::need(m, model->modules(), io);
                    BOOST_TEST(plain.flat == 0u, what);
                    BOOST_TEST(n.total() == plain.total() + n.flat, what);
                }
    BOOST_TEST(flat_seen > 0u);
}

// At dp 2, the engine takes the area from the arena and gives it to the
// device communicator, whose budget then runs it with not a byte to spare;
// a byte less is refused, the message naming the flat area and its module;
// and the area is taken back when the engine goes. A communicator that lays
// nothing flat is given nothing and needs that much less.
BOOST_AUTO_TEST_CASE(the_area_comes_from_the_device_budget) {
    const std::uint64_t s = fresh_seed("flat area budget");
    for (DType dt : {DType::fp32, DType::bf16}) {
        BOOST_TEST_CONTEXT(shard::dtype_name(dt)) {
            Rig rig;
            shard::LayoutOptions lo = lay(dt, Tier::cpu, Tier::cpu, s);
            lo.dp = 2;
            Run run(rig, lo, kGPT);
            model::GPT gpt(model::Config::from(run.m.spec));
            zero::CommittedParams store(run.m, 0, rig.engine, rig.pool);
            FlatComm host(2, false), nccl(2), mpi(2, false);
            zero::InfinityOptions io;
            io.device_comm = &nccl.c;
            const auto n = zero::InfinityEngine::need(run.m, gpt.modules(), io);
            BOOST_TEST_REQUIRE(n.flat > 0u);
            {
                auto dev = device_of(n.total());
                zero::InfinityEngine inf(run.m, gpt.modules(), host.c, rig.engine, rig.pool, *dev, store, io);
                BOOST_TEST_REQUIRE(nccl.areas->size() == 1u);
                BOOST_TEST(nccl.areas->back().size() == n.flat);
                BOOST_TEST(nccl.areas->back().data() != nullptr);
                BOOST_TEST(dev->arena().stats().used == dev->arena().stats().bytes);
            }
            BOOST_TEST_REQUIRE(nccl.areas->size() == 2u);
            BOOST_TEST(nccl.areas->back().empty());
            BOOST_TEST(host.areas->empty());

            auto dev = device_of(n.total() - 1);
            std::string msg;
            try {
                zero::InfinityEngine inf(run.m, gpt.modules(), host.c, rig.engine, rig.pool, *dev, store, io);
                BOOST_ERROR("a budget one byte under the need was taken");
            } catch (const zero::DoesNotFit& e) {
                msg = e.what();
                BOOST_TEST(e.need == n.total());
            }
            BOOST_TEST(contains(msg, "NCCL lays " + n.flat_module + "'s"), msg);
            BOOST_TEST(contains(msg, format_size(n.flat)), msg);
            BOOST_TEST(nccl.areas->size() == 2u);

            // Without a flat area, the same budget less the area is enough.
            io.device_comm = &mpi.c;
            auto dev2 = device_of(n.total() - n.flat);
            { zero::InfinityEngine inf(run.m, gpt.modules(), host.c, rig.engine, rig.pool, *dev2, store, io); }
            BOOST_TEST(mpi.areas->empty());
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// The pipeline (issue 45): each step's update runs beside the next step's
// forward (train::Options::pipeline), whose fetches wait for each module's
// new parameters; the step is committed before the next backward.
BOOST_AUTO_TEST_SUITE(pipeline)

namespace {

// train_run's steps and evaluations (these read parameters an update is
// still writing), pipelined: the logs as step() returned them, and the
// finished ones (Trainer::finished) as their updates settled.
Outcome pipelined_run(Run& run, Rig& rig, std::span<const std::uint16_t> tokens, train::Options o,
                      std::vector<train::StepLog>& finished) {
    Outcome out;
    auto self = self_comm();
    auto dev = device_of();
    data::Loader loader(tokens, "tokens", {.batch = kB, .seq = kT});
    o.overlap = o.pipeline = true;
    train::Trainer t(run.m, self, rig.engine, rig.pool, *dev, o);
    for (std::uint64_t s = t.step_count(); s < kSteps; ++s) {
        out.logs.push_back(t.step(loader));
        BOOST_TEST(t.step_count() == s + 1, "a step whose update runs is a step taken");
        if (auto f = t.finished()) finished.push_back(*f);
        if (s % 2) out.val.push_back(t.evaluate(loader, 2));
    }
    t.save();
    if (auto f = t.finished()) finished.push_back(*f);
    BOOST_TEST(!t.finished(), "one finished log a step");
    return out;
}

}  // namespace

// Every parameter tier x optimizer tier, fp32 and bf16 parameters, every
// step clipped (--grad-clip 0.05), some (1) and none (0): the same losses,
// norms, validation losses (read while the update runs) and committed state,
// byte for byte, as the sequential step (--no-overlap); each step's log
// finished once, in order, with its floors. make test runs each of the nine
// placements once, the six (dtype, clip) pairs taken in turn over them, and
// all six with every state on NVMe (14 pairs of runs); ZINF_TEST_SWEEP=1
// runs all 54.
BOOST_AUTO_TEST_CASE(nine_tiers_equal_the_sequential_step) {
    const std::uint64_t s = fresh_seed("pipeline nine tiers");
    const auto tokens = make_tokens(s, 97, (kSteps + 2) * kB * kT + 1);
    const bool sweep = std::getenv("ZINF_TEST_SWEEP") != nullptr;
    const DType dtypes[] = {DType::fp32, DType::bf16};
    const double clips[] = {0.05, 1.0, 0.0};
    for (int c = 0; c < 6; ++c)
        for (int pi = 0; pi < 3; ++pi)
            for (int oi = 0; oi < 3; ++oi) {
                const Tier pt = kTiers[pi], ot = kTiers[oi];
                if (!sweep && c != (pi * 3 + oi) % 6 && !(pt == Tier::nvme && ot == Tier::nvme)) continue;
                const DType dt = dtypes[c / 3];
                const double clip = clips[c % 3];
                {
                    const std::string what = std::string(shard::dtype_name(dt)) + " param " + shard::tier_name(pt) +
                                             ", optimizer " + shard::tier_name(ot) + ", clip " + std::to_string(clip);
                    Rig rig;
                    Run seq_run(rig, lay(dt, pt, ot, s), kGPT), pip_run(rig, lay(dt, pt, ot, s), kGPT);
                    train::Options so = train_options(seq_run.manifest_path());
                    so.grad_clip = clip;
                    so.overlap = false;
                    const Outcome ref = train_run(seq_run, rig, tokens, so);
                    train::Options po = train_options(pip_run.manifest_path());
                    po.grad_clip = clip;
                    // Half the runs with no optimizer memory budget: the
                    // gradients' second scratch a file with the state on
                    // nvme, else none (the update settled before the next
                    // backward); the others hold it in memory.
                    const bool no_budget = (c + pi + oi) % 2 == 1;
                    if (no_budget) po.optimizer_readahead = 0;
                    const bool under_backward = !no_budget || ot == Tier::nvme;
                    std::vector<train::StepLog> finished;
                    const Outcome got = pipelined_run(pip_run, rig, tokens, po, finished);
                    same_losses(got, ref, what);
                    same_state(shard::read_manifest_file(pip_run.manifest_path()),
                               shard::read_manifest_file(seq_run.manifest_path()), rig, what);
                    BOOST_TEST_REQUIRE(finished.size() == got.logs.size(), what);
                    std::size_t clipped = 0;
                    for (std::size_t k = 0; k < finished.size(); ++k) {
                        const auto& f = finished[k];
                        BOOST_TEST(got.logs[k].update_pending, what << " step " << k + 1);
                        BOOST_TEST(!ref.logs[k].update_pending, what << " step " << k + 1);
                        BOOST_TEST(f.step == k + 1, what);
                        BOOST_TEST(!f.update_pending, what);
                        BOOST_TEST(bits(f.loss) == bits(got.logs[k].loss), what);
                        // (at this size a step's waits may take all of its
                        // forward and backward: a floor of 0, and no ratio)
                        BOOST_TEST(f.compute_floor_seconds >= 0, what << " step " << k + 1);
                        BOOST_TEST(f.compute_floor_seconds ==
                                       std::max(0.0, f.forward_seconds + f.backward_seconds - f.stall_seconds -
                                                         f.update_waited_seconds),
                                   what << " step " << k + 1);
                        const double floor = std::max(f.compute_floor_seconds, f.disk_floor_seconds);
                        BOOST_TEST((floor > 0 ? near(f.step_floor_ratio * floor, f.seconds, 1e-9)
                                              : f.step_floor_ratio == 0),
                                   what << " step " << k + 1);
                        BOOST_TEST(f.update_overlap_seconds >= 0, what);
                        // (after a clipped step only: an unclipped one's next step speculates)
                        BOOST_TEST(f.update_under_backward == (under_backward && clip > 0 && f.grad_norm > clip),
                                   what << " step " << k + 1 << (no_budget ? ", no budget" : ""));
                        BOOST_TEST(!ref.logs[k].update_under_backward, what);
                        BOOST_TEST(ref.logs[k].update_overlap_seconds == 0, what);
                        clipped += clip > 0 && f.grad_norm > clip;
                    }
                    if (clip == 0.05) BOOST_TEST(clipped == finished.size(), what << ": every step clipped");
                    if (clip == 0.0) BOOST_TEST(clipped == 0u, what);
                }
            }
}

BOOST_AUTO_TEST_SUITE_END()
