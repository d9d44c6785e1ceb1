// MPI tests of libzinf train, run under mpirun (-np 2 and 4): plain data
// parallel is the same training as one rank on the same global batch.
//
// Every process is one rank of a dp=N state; each trains it with batch B on
// its share of one token array (data::Loader, rank r of N, in order), so the
// ranks read together exactly what one rank of batch N*B reads. Rank 0 also
// trains a dp=1 state of the same model and seed (the values do not depend on
// dp) with a one-rank communicator and batch N*B on the same tokens. Then:
//   - every rank reports the same loss and gradient norm, to the bit, and
//     holds the same resident parameters;
//   - the losses of every step match the one rank's within 1e-5 relative
//     (the gradient norms too at step 1, 2e-4 later), with gradient
//     clipping active and without it;
//   - the resident parameters after the last step, and the committed master
//     weights, match the one rank's within 2e-3 of each tensor's largest
//     magnitude (bf16 parameters: or one bf16 step); why not closer is said
//     where they are compared.
// fp32 and bf16 parameters, with every state in memory (cpu tiers) or
// streamed from NVMe (nvme tiers, the default layout).
//
// Rank 0 lays out and initialises both states in a folder of its own under
// /var/tmp (its name broadcast). Tokens and initial values come from rank 0's
// seed (printed; ZINF_TEST_SEED replays it). Every rank runs every case in
// the same order, so the collectives match; no BOOST_REQUIRE sits where one
// rank could leave a case early.
#define BOOST_TEST_MODULE mpi_train
#include "optimizer_fixture.hpp"
#include "mpi_testing.hpp"
#include "testing.hpp"

#include "../../libzinf/src/comm/internal.hpp"  // a backend of the test's own (Recording)

#include <zinf/comm.hpp>
#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/gpt.hpp>
#include <zinf/model.hpp>
#include <zinf/shard.hpp>
#include <zinf/train.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace zinf;
using namespace zinf::testing;
using namespace std::chrono_literals;

namespace {

constexpr const char* kGPT = "gpt:layers=2,hidden=32,heads=2,vocab=61,seq=16";
constexpr std::uint64_t kB = 2, kT = 16, kSteps = 5;  // B rows of T tokens per rank

// A one-rank communicator inside the mpirun job, for the dp=1 reference.
// comm refuses backend self when the launcher's environment says it started
// more than one process, so the launchers' size variables are hidden while
// it starts and put back at once (the self backend uses no library).
class HiddenLaunch {
public:
    HiddenLaunch() {
        for (const char* key : {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_SIZE"})
            if (const char* v = std::getenv(key)) {
                saved_.emplace_back(key, v);
                ::unsetenv(key);
            }
    }
    ~HiddenLaunch() {
        for (const auto& [key, value] : saved_) ::setenv(key.c_str(), value.c_str(), 1);
    }
    HiddenLaunch(const HiddenLaunch&) = delete;
    HiddenLaunch& operator=(const HiddenLaunch&) = delete;

private:
    std::vector<std::pair<std::string, std::string>> saved_;
};

comm::Communicator one_rank() {
    HiddenLaunch hidden;
    return comm::Communicator(comm::Options{.backend = comm::Backend::self});
}

// ---------------------------------------------------------------------------
struct Layout {
    DType param_dtype;
    Tier tier;  // of the parameters and the optimizer state
};

shard::LayoutOptions lay_out(unsigned ranks, const Layout& l, std::uint64_t s) {
    shard::LayoutOptions lo;
    lo.dp = ranks;
    lo.param_dtype = l.param_dtype;
    lo.param_tier = l.tier;
    lo.optim_tier = l.tier;
    lo.seed = s;
    return lo;
}

// Lays out and initialises a state in `dir` and saves its manifest.
shard::Manifest make_state(const std::string& dir, const shard::LayoutOptions& lo, Rig& rig) {
    shard::Manifest m = shard::layout(shard::ModelSpec::parse(kGPT), lo);
    shard::init(m, dir, rig.engine, rig.pool, {}).commit();
    shard::save_manifest(m, m.dir + "/manifest.jsonl");
    return m;
}


std::unique_ptr<device::Device> one_thread_device() {
    return device::open({.backend = "cpu", .memory_bytes = 256 * MiB, .threads = 1});
}

train::Options train_options(std::uint64_t batch, double clip, const std::string& manifest_path,
                             bool resident = true) {
    train::Options o;
    o.resident = resident;
    o.batch = batch;
    o.seq = kT;
    o.schedule = {.lr = 3e-3, .min_ratio = 0.1, .warmup = 2, .total = kSteps, .cosine = true};
    o.adamw = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    o.grad_clip = clip;
    o.manifest_path = manifest_path;
    o.kernel.threads = 1;
    return o;
}

// What a run gives: each step's log, the resident parameters after the last
// step (each tensor whole), and the manifest it committed at the end.
struct Outcome {
    std::vector<train::StepLog> logs;
    std::vector<std::vector<float>> values;
    shard::Manifest committed;
    bool under_backward = false;  // the engine's update_under_backward()
};

// At dp > 1 the engine starts one allgather per module fetch (a bucket of
// its parameters) and one reduce-scatter per module's gradients, never one
// per parameter: at most fetches + backward hooks, where a block of the
// tiny GPT has two parameters per module (weight, bias) and one collective
// per parameter would start twice as many.
void expect_bucketed(zero::Engine& e, const train::StepLog& log) {
    const zero::InfinityStats st = e.stats();
    std::uint64_t backward = 0;
    for (const std::string& hook : e.trace(true)) backward += hook.ends_with(" backward");
    BOOST_TEST(log.collectives == st.collectives);
    BOOST_TEST(st.collectives > 0u, where() << " step " << log.step << ": no collective at dp " << dp());
    BOOST_TEST(st.collectives <= st.fetches + backward,
               where() << " step " << log.step << ": " << st.collectives << " collectives for " << st.fetches
                       << " fetches and " << backward << " backward hooks");
}

// `setup` may change the options once the device is open (the engine's
// device communicator).
Outcome train_run(shard::Manifest& m, comm::Communicator& c, Rig& rig, std::span<const std::uint16_t> tokens,
                  unsigned rank, unsigned ranks, std::uint64_t batch, double clip, bool resident,
                  const std::function<void(device::Device&, train::Options&)>& setup = {}) {
    Outcome out;
    auto dev = one_thread_device();
    const std::string mpath = m.dir + "/manifest.jsonl";
    data::Loader loader(tokens, "tokens", {.batch = batch, .seq = kT, .rank = rank, .ranks = ranks});
    train::Options to = train_options(batch, clip, mpath, resident);
    if (setup) setup(*dev, to);
    train::Trainer t(m, c, rig.engine, rig.pool, *dev, to);
    out.under_backward = t.engine().update_under_backward();
    for (std::uint64_t s = t.step_count(); s < kSteps; ++s) {
        out.logs.push_back(t.step(loader));
        if (!resident && ranks > 1) expect_bucketed(t.engine(), out.logs.back());
    }
    // The resident copy, read back through a copy (the engine keeps none:
    // its runs are compared by what they committed).
    // A parameter the engine keeps bf16 (--precision bf16 over bf16
    // parameters) is read back bf16 and widened: the values its fp32 copy held.
    for (std::size_t i = 0; resident && i < m.tensors.size(); ++i) {
        auto& e = dynamic_cast<zero::ResidentEngine&>(t.engine().hooks());
        std::vector<float> host(m.tensors[i].numel);
        if (const auto kept = e.values_bf16(i); !kept.empty()) {
            std::vector<std::uint16_t> h(kept.size());
            dev->copy(dev->compute(), std::as_writable_bytes(std::span(h)), std::as_bytes(kept));
            dev->synchronize(dev->compute());
            from_bf16(std::span<const std::uint16_t>(h), std::span(host));
        } else {
            const auto v = e.values(i);
            dev->copy(dev->compute(), std::as_writable_bytes(std::span(host)), std::as_bytes(v));
            dev->synchronize(dev->compute());
        }
        out.values.push_back(std::move(host));
    }
    t.save();
    out.committed = shard::read_manifest_file(mpath);
    return out;
}

// Steps of bf16 between two values (magnitudes in bit order).
int bf16_steps(float a, float b) {
    const int p = to_bf16(a) & 0x7fff, q = to_bf16(b) & 0x7fff;
    return ((to_bf16(a) ^ to_bf16(b)) & 0x8000) ? p + q : std::abs(p - q);
}

// Element by element at most `tol` apart (absolute); bf16 values may also
// be one bf16 step apart (a master weight near a rounding tie goes either
// way). Also the root mean square of the differences, at most `rms_tol`.
void compare_tensor(std::span<const float> x, std::span<const float> y, bool bf16, double tol, double rms_tol,
                    const std::string& what) {
    BOOST_TEST(x.size() == y.size(), what);
    if (x.size() != y.size() || x.empty()) return;
    double worst = 0, sq = 0;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double d = std::abs(double(x[i]) - double(y[i]));
        worst = std::max(worst, d);
        const bool step = bf16 && bf16_steps(x[i], y[i]) <= 1;
        if (!step) sq += d * d;
        if (d > tol && !step && !bad++) first = i;
    }
    const double rms = std::sqrt(sq / static_cast<double>(x.size()));
    BOOST_TEST_MESSAGE(what << ": at most " << worst << " apart, rms " << rms);
    BOOST_TEST(bad == 0u, what << ": " << bad << " of " << x.size() << " elements more than " << tol
                               << " apart (the first at " << first << ": " << x[first] << " vs " << y[first]
                               << "; the worst " << worst << ")");
    BOOST_TEST(rms <= rms_tol, what << ": the differences' root mean square " << rms << " is over " << rms_tol);
}

// Rank 0 runs `make` (making the states in the shared folder), then every
// rank runs `run`; each returns true when every rank's part worked. On a
// failure every rank has met at a barrier (before rank 0 removes the folder)
// and the case should end.
template <class F>
bool rank0_made(const SharedDir& dir, F make) {
    bool ok = !dir.root.empty();
    if (me() == 0 && ok) try {
            make();
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: zinf-shard init in " << dir.root << ": " << e.what());
            ok = false;
        }
    if (all_ranks(ok)) return true;
    world().barrier();
    return false;
}
template <class F>
bool every_rank_ran(F run, const std::string& what) {
    bool ok = true;
    try {
        run();
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << what << ": " << e.what());
        ok = false;
    }
    if (all_ranks(ok)) return true;
    world().barrier();
    return false;
}

// The case: dp=N with batch B against dp=1 with batch N*B.
void dp_is_one_rank(const Layout& l, double clip, const char* title, bool resident = true) {
    SharedDir dir;
    const std::uint64_t s = shared_seed(title);
    const auto spec = shard::ModelSpec::parse(kGPT);
    // Enough for every step in order without wrapping, plus the last target.
    const auto tokens = make_tokens(s, spec.vocab, (kSteps + 3) * dp() * kB * kT + 1);
    Rig rig;  // optimizer_fixture's small pool: nvme states stream in several chunks

    // Rank 0 lays out both states; every rank reads the dp=N one.
    if (!rank0_made(dir, [&] {
            make_state(dir.root + "/dp", lay_out(dp(), l, s), rig);
            make_state(dir.root + "/one", lay_out(1, l, s), rig);
        }))
        return;

    // Every rank: the data-parallel run.
    Outcome par;
    if (!every_rank_ran(
            [&] {
                shard::Manifest m = shard::read_manifest_file(dir.root + "/dp/manifest.jsonl");
                par = train_run(m, world(), rig, tokens, me(), dp(), kB, clip, resident);
            },
            "the dp " + std::to_string(dp()) + " run"))
        return;
    BOOST_TEST(par.logs.size() == kSteps, where());
    for (std::size_t k = 0; k < par.logs.size(); ++k) {
        const train::StepLog& g = par.logs[k];
        BOOST_TEST(g.step == k + 1, where());
        BOOST_TEST(!g.overflow, where());
        BOOST_TEST(g.tokens == dp() * kB * kT, where());
        BOOST_TEST(std::isfinite(g.loss), where());
        // One loss and one norm on every rank, to the bit.
        const auto losses = gather_all(g.loss), norms = gather_all(g.grad_norm);
        for (unsigned q = 0; q < dp(); ++q) {
            BOOST_TEST(std::bit_cast<std::uint64_t>(losses[q]) == std::bit_cast<std::uint64_t>(g.loss),
                       where() << " step " << k + 1 << ": rank " << q << "'s loss " << losses[q] << " vs " << g.loss);
            BOOST_TEST(std::bit_cast<std::uint64_t>(norms[q]) == std::bit_cast<std::uint64_t>(g.grad_norm),
                       where() << " step " << k + 1 << ": rank " << q << "'s norm " << norms[q] << " vs "
                               << g.grad_norm);
        }
    }
    // Every rank holds the same resident parameters, to the bit: compare
    // each rank's checksum of them with rank 0's.
    {
        std::uint64_t h = 0xcbf29ce484222325ull;
        for (const auto& v : par.values)
            for (float x : v) h = mix(h ^ std::bit_cast<std::uint32_t>(x));
        std::vector<std::uint64_t> hs(dp());
        world().allgather(std::as_bytes(std::span(&h, 1)), std::as_writable_bytes(std::span(hs)), comm::DType::i64);
        for (unsigned q = 0; q < dp(); ++q)
            BOOST_TEST(hs[q] == hs[0], where() << ": rank " << q << "'s parameters differ from rank 0's");
    }

    // Rank 0: one rank with the whole global batch, then the comparisons.
    if (me() == 0) try {
            auto self = one_rank();
            shard::Manifest one = shard::read_manifest_file(dir.root + "/one/manifest.jsonl");
            const shard::Manifest one_initial = one;  // the run's commits update `one`
            // The reference is always the resident engine on one rank.
            const Outcome ref = train_run(one, self, rig, tokens, 0, 1, dp() * kB, clip, true);
            BOOST_TEST(ref.logs.size() == par.logs.size());
            const std::string vs = "dp " + std::to_string(dp()) + " vs dp 1";
            for (std::size_t k = 0; k < std::min(ref.logs.size(), par.logs.size()); ++k) {
                const train::StepLog &a = par.logs[k], &b = ref.logs[k];
                BOOST_TEST_MESSAGE(vs << " step " << k + 1 << ": loss " << a.loss << " vs " << b.loss << ", norm "
                                      << a.grad_norm << " vs " << b.grad_norm << " (relative differences "
                                      << std::abs(a.loss - b.loss) / b.loss << ", "
                                      << std::abs(a.grad_norm - b.grad_norm) / b.grad_norm << ")");
                BOOST_TEST(close(a.loss, b.loss, 1e-5), vs << " step " << k + 1 << ": loss " << a.loss << " vs " << b.loss);
                // The norm of step 1 comes from the same weights (its runs
                // agree to ~1e-7); later ones from weights as far apart as
                // the comparison below allows, which the norm, a sum over
                // every element, shows more than the loss (seen: 4e-5).
                const double norm_rel = k == 0 ? 1e-5 : 2e-4;
                BOOST_TEST(close(a.grad_norm, b.grad_norm, norm_rel),
                           vs << " step " << k + 1 << ": norm " << a.grad_norm << " vs " << b.grad_norm);
                BOOST_TEST(a.lr == b.lr, vs << " step " << k + 1);
                BOOST_TEST(a.tokens == b.tokens, vs << " step " << k + 1);
            }
            // Clipping did something: the first norm is above the limit.
            if (clip > 0 && !ref.logs.empty())
                BOOST_TEST(ref.logs[0].grad_norm > clip, "the clip is active: norm " << ref.logs[0].grad_norm);
            // The runs trained: wte moved from its initial values.
            const std::string master_state = l.param_dtype == DType::bf16 ? "master" : "param";
            const auto wte0 = as_f32(cat_bytes(one_initial, 0, master_state, rig));
            const auto wte1 = as_f32(cat_bytes(par.committed, 0, master_state, rig));
            std::size_t moved = 0;
            for (std::size_t i = 0; i < wte0.size() && i < wte1.size(); ++i) moved += std::abs(wte1[i] - wte0[i]) > 1e-4f;
            BOOST_TEST(moved > wte0.size() / 2, moved << " of " << wte0.size() << " elements of wte moved");

            // The parameters: fp32 ones are the master weights; bf16 ones
            // have their own, compared too. In units of lr, not relative as
            // the losses: AdamW divides each element's gradient by its own
            // running magnitude, so where a gradient element is near zero
            // the rounding of a different summation order (N partial means
            // averaged vs one mean) moves that element's update by a
            // fraction of lr. Two correct runs put single elements up to
            // 0.1 lr apart (of 5 steps of up to about lr each), the root mean
            // square of the differences under 0.002 lr; a wrong
            // partition, gradient or gather moves elements by whole steps,
            // or by their initial values (about 7 lr).
            const bool bf16 = l.param_dtype == DType::bf16;
            const std::string master = bf16 ? "master" : "param";
            const double lr = train_options(kB, clip, "").adamw.lr;
            for (std::size_t t = 0; t < one.tensors.size(); ++t) {
                const std::string& name = one.tensors[t].name;
                if (resident)
                    compare_tensor(par.values[t], ref.values[t], bf16, 0.5 * lr, 0.01 * lr,
                                   vs + ": resident " + name + " after step " + std::to_string(kSteps));
                compare_tensor(as_f32(cat_bytes(par.committed, t, master, rig)),
                               as_f32(cat_bytes(ref.committed, t, master, rig)), false, 0.5 * lr, 0.01 * lr,
                               vs + ": committed " + master + " of " + name);
            }
            for (const shard::Manifest* c : {&std::as_const(par).committed, &ref.committed}) {
                std::size_t off = 0;
                for (const auto& p : c->parts) off += p.step != kSteps;
                BOOST_TEST(off == 0u, vs << ": " << off << " records not at step " << kSteps);
                shard::verify(*c, rig.engine, rig.pool, {});
            }
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0, the dp 1 run: " << e.what());
        }
    world().barrier();  // before rank 0 removes the folder
}

// At dp N, every tier of the engine against the resident engine on the same
// ranks: the same losses and norms to the bit, and the same committed state
// byte for byte. (The gradients are reduce-scattered per module instead of in
// one bucket; zinf's reduce-scatter sums each element in rank order whatever
// the bucket, so the bits cannot tell.)
void tiers_equal_resident_at_dp(DType dt, device::Precision precision = device::Precision::fp32) {
    const auto arithmetic = [&](device::Device&, train::Options& o) { o.precision = precision; };
    SharedDir dir;
    const std::uint64_t s = shared_seed("engine tiers at dp N");
    const auto spec = shard::ModelSpec::parse(kGPT);
    const auto tokens = make_tokens(s, spec.vocab, (kSteps + 3) * dp() * kB * kT + 1);
    Rig rig;
    const Tier tiers[] = {Tier::nvme, Tier::cpu, Tier::gpu};
    if (!rank0_made(dir, [&] {
            make_state(dir.root + "/resident", lay_out(dp(), {dt, Tier::cpu}, s), rig);
            for (Tier t : tiers) make_state(dir.root + "/" + shard::tier_name(t), lay_out(dp(), {dt, t}, s), rig);
        }))
        return;
    Outcome ref;
    std::vector<Outcome> got;
    if (!every_rank_ran(
            [&] {
                shard::Manifest m = shard::read_manifest_file(dir.root + "/resident/manifest.jsonl");
                ref = train_run(m, world(), rig, tokens, me(), dp(), kB, 0.5, true, arithmetic);
                for (Tier t : tiers) {
                    shard::Manifest mt =
                        shard::read_manifest_file(dir.root + "/" + shard::tier_name(t) + "/manifest.jsonl");
                    got.push_back(train_run(mt, world(), rig, tokens, me(), dp(), kB, 0.5, false, arithmetic));
                }
            },
            "the runs"))
        return;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const std::string what = where() + " " + shard::dtype_name(dt) + " " + device::precision_name(precision) +
                                 " arithmetic, engine on " + shard::tier_name(tiers[i]);
        BOOST_TEST(got[i].logs.size() == ref.logs.size(), what);
        for (std::size_t k = 0; k < std::min(got[i].logs.size(), ref.logs.size()); ++k) {
            BOOST_TEST(std::bit_cast<std::uint64_t>(got[i].logs[k].loss) == std::bit_cast<std::uint64_t>(ref.logs[k].loss),
                       what << " step " << k + 1 << ": loss " << got[i].logs[k].loss << " vs " << ref.logs[k].loss);
            BOOST_TEST(std::bit_cast<std::uint64_t>(got[i].logs[k].grad_norm) ==
                           std::bit_cast<std::uint64_t>(ref.logs[k].grad_norm),
                       what << " step " << k + 1 << ": norm");
        }
        if (me() == 0) try {
                same_state(got[i].committed, ref.committed, rig, what);
            } catch (const std::exception& e) {
                BOOST_ERROR(what << ": " << e.what());
            }
    }
    world().barrier();  // before rank 0 removes the folder
}

// The pipeline (issue 45) at dp N: each step's update beside the next
// step's forward and backward (a second gradient scratch), settled on every
// rank after that backward, against the sequential step (--no-overlap),
// clipped and not, on every tier: the same losses, norms and committed
// state, to the bit. With no optimizer budget (`budget` false) the second
// scratch is a file on the nvme tier, and there is none on the others,
// whose updates are settled before the next backward.
void pipelined_equals_sequential_at_dp(DType dt, double clip, bool budget) {
    const auto sequential = [&](device::Device&, train::Options& o) { o.overlap = o.pipeline = false; };
    const auto pipelined = [&](device::Device&, train::Options& o) {
        o.overlap = o.pipeline = true;
        if (!budget) o.optimizer_readahead = 0;
    };
    SharedDir dir;
    const std::uint64_t s = shared_seed("pipeline at dp N");
    const auto spec = shard::ModelSpec::parse(kGPT);
    const auto tokens = make_tokens(s, spec.vocab, (kSteps + 3) * dp() * kB * kT + 1);
    Rig rig;
    // Every tier at dp 2; at dp 4 (make test's second mpirun, on the same
    // two cores) the nvme tier alone, whose commit is the one ranks agree on.
    std::vector<Tier> tiers = {Tier::nvme, Tier::cpu, Tier::gpu};
    if (dp() > 2) tiers.resize(1);
    if (!rank0_made(dir, [&] {
            for (Tier t : tiers)
                for (const char* run : {"seq", "pip"})
                    make_state(dir.root + "/" + run + "-" + shard::tier_name(t), lay_out(dp(), {dt, t}, s), rig);
        }))
        return;
    std::vector<Outcome> ref, got;
    if (!every_rank_ran(
            [&] {
                for (Tier t : tiers) {
                    shard::Manifest a =
                        shard::read_manifest_file(dir.root + "/seq-" + shard::tier_name(t) + "/manifest.jsonl");
                    ref.push_back(train_run(a, world(), rig, tokens, me(), dp(), kB, clip, false, sequential));
                    shard::Manifest b =
                        shard::read_manifest_file(dir.root + "/pip-" + shard::tier_name(t) + "/manifest.jsonl");
                    got.push_back(train_run(b, world(), rig, tokens, me(), dp(), kB, clip, false, pipelined));
                }
            },
            "the runs"))
        return;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const std::string what = where() + " " + shard::dtype_name(dt) + " clip " + std::to_string(clip) +
                                 ", pipelined vs sequential on " + shard::tier_name(tiers[i]);
        BOOST_TEST(got[i].logs.size() == ref[i].logs.size(), what);
        BOOST_TEST(got[i].under_backward == (budget || tiers[i] == Tier::nvme), what);
        BOOST_TEST(!ref[i].under_backward, what);
        std::size_t clipped = 0;
        for (std::size_t k = 0; k < std::min(got[i].logs.size(), ref[i].logs.size()); ++k) {
            const auto& g = got[i].logs[k];
            const auto& r = ref[i].logs[k];
            BOOST_TEST(std::bit_cast<std::uint64_t>(g.loss) == std::bit_cast<std::uint64_t>(r.loss),
                       what << " step " << k + 1 << ": loss " << g.loss << " vs " << r.loss);
            BOOST_TEST(std::bit_cast<std::uint64_t>(g.grad_norm) == std::bit_cast<std::uint64_t>(r.grad_norm),
                       what << " step " << k + 1 << ": norm");
            BOOST_TEST(g.update_pending, what << " step " << k + 1 << ": the update ran beside the next step");
            BOOST_TEST(!r.update_pending, what << " step " << k + 1);
            clipped += clip > 0 && r.grad_norm > clip;
        }
        if (clip > 0) BOOST_TEST(clipped > 0u, what << ": some step was clipped");
        if (me() == 0) try {
                same_state(got[i].committed, ref[i].committed, rig, what);
            } catch (const std::exception& e) {
                BOOST_ERROR(what << ": " << e.what());
            }
    }
    world().barrier();  // before rank 0 removes the folder
}

// ---------------------------------------------------------------------------
// One collective as a backend received it.
struct Recorded {
    comm::Kind kind = comm::Kind::barrier;
    comm::DType dtype = comm::DType::u8;
    comm::Reduce reduce = comm::Reduce::sum;
    std::vector<std::pair<std::size_t, std::size_t>> bytes;  // (send, recv) of each buffer
    std::vector<std::vector<std::uint64_t>> counts;          // of each buffer (empty: equal blocks)
    bool same_call(const Recorded& o) const {
        return kind == o.kind && dtype == o.dtype && reduce == o.reduce && bytes == o.bytes && counts == o.counts;
    }
};

// A backend that records every collective and has `target` (MPI) do it.
// Stream-ordered (`ordered`), it is what the engine sees of NCCL: the
// engine enqueues its collectives (Communicator::enqueue) with the stream's
// native handle, which on the cpu backend is the Stream, and the fake runs
// each from a host job on that stream, in the stream's order, as NCCL runs
// them on the GPU; and, as NCCL, it lays buckets flat in an area the
// engine gives (set_flat_area), recording the area and the largest flat
// area a collective it was given needed. Otherwise it is a host backend:
// the engine runs its collectives from host jobs itself, and each comes to
// execute().
class Recording final : public comm::detail::Engine {
public:
    Recording(comm::Communicator& target, bool ordered) : target_(target), ordered_(ordered) {}
    int rank() const override { return target_.rank(); }
    int size() const override { return target_.size(); }
    int local_rank() const override { return target_.local_rank(); }
    int local_size() const override { return target_.local_size(); }
    comm::Backend kind() const override { return target_.backend(); }
    std::string describe() const override { return "recording over " + target_.describe(); }
    bool stream_ordered() const override { return ordered_; }
    bool lays_flat() const override { return ordered_; }
    void set_flat_area(std::span<std::byte> area) override {
        if (!ordered_) comm::detail::Engine::set_flat_area(area);
        areas.push_back(area.size());
    }
    void execute(comm::detail::Op& op, const comm::detail::Deadline&) override {
        note(op, nullptr);
        target_.run(op.kind, op.bufs, op.dtype, op.reduce, op.root);
    }
    void bare(comm::detail::Op&) override { throw InternalError("the recording backend has no bare calls"); }
    void enqueue(comm::detail::Op& op, void* stream, void* after, const comm::detail::Deadline&) override {
        note(op, stream);
        if (!dev) throw InternalError("the recording backend has no device");
        if (after) throw InternalError("the engine enqueued after an event; the recording backend orders by stream");
        dev->host(*static_cast<device::Stream*>(stream),
                  [t = &target_, k = op.kind, bufs = op.bufs, dt = op.dtype, r = op.reduce, root = op.root] {
                      t->run(k, bufs, dt, r, root);
                  });
    }

    device::Device* dev = nullptr;          // whose streams enqueue() is given
    std::vector<Recorded> calls;            // in the order they came
    std::vector<void*> streams;             // each call's stream (null: execute)
    std::vector<std::uint64_t> areas;       // the bytes of each flat area given (0: taken back)
    std::uint64_t widest_flat = 0;          // the most a call laid flat needed

private:
    void note(const comm::detail::Op& op, void* stream) {
        Recorded r{.kind = op.kind, .dtype = op.dtype, .reduce = op.reduce, .bytes = {}, .counts = {}};
        for (const comm::Buffer& b : op.bufs) {
            r.bytes.emplace_back(b.send.size(), b.recv.size());
            r.counts.push_back(b.counts);
        }
        calls.push_back(std::move(r));
        streams.push_back(stream);
        if (comm::detail::needs_flat(op))
            widest_flat = std::max(widest_flat, comm::detail::plan_flat(op, size()).bytes(size()));
    }
    comm::Communicator& target_;
    bool ordered_;
};

// At dp N, the engine with a communicator that orders collectives on the
// device's streams (as NCCL does) against one whose collectives are host
// calls (as MPI): each step enqueues on the collectives stream the
// collectives the host jobs would run, in the same order, over the same
// buffers (one allgather per fetch in the parameters' dtype, one average
// reduce-scatter of fp32 gradients per module), and trains to the same bits.
void stream_ordered_equals_host_jobs(DType dt, Tier tier) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("engine, stream-ordered collectives");
    const auto spec = shard::ModelSpec::parse(kGPT);
    const auto tokens = make_tokens(s, spec.vocab, (kSteps + 3) * dp() * kB * kT + 1);
    Rig rig;
    if (!rank0_made(dir, [&] {
            make_state(dir.root + "/host", lay_out(dp(), {dt, tier}, s), rig);
            make_state(dir.root + "/ordered", lay_out(dp(), {dt, tier}, s), rig);
        }))
        return;
    Outcome out[2];
    std::vector<Recorded> calls[2];
    std::vector<void*> streams[2];
    std::vector<std::uint64_t> areas[2];
    std::uint64_t widest_flat[2] = {}, need_flat[2] = {};
    void* coll_stream[2] = {};
    if (!every_rank_ran(
            [&] {
                for (int ordered = 0; ordered < 2; ++ordered) {
                    auto fake = std::make_unique<Recording>(world(), ordered == 1);
                    Recording& rec = *fake;
                    comm::Communicator device_comm(std::move(fake), comm::Memory::device);
                    BOOST_TEST(device_comm.stream_ordered() == (ordered == 1));
                    shard::Manifest m = shard::read_manifest_file(dir.root + (ordered ? "/ordered" : "/host") +
                                                                  "/manifest.jsonl");
                    out[ordered] = train_run(m, world(), rig, tokens, me(), dp(), kB, 0.5, false,
                                             [&](device::Device& d, train::Options& o) {
                                                 rec.dev = &d;
                                                 coll_stream[ordered] = d.native(d.stream(device::StreamKind::collectives));
                                                 o.infinity.device_comm = &device_comm;
                                                 need_flat[ordered] =
                                                     zero::InfinityEngine::need(m, model::GPT(model::Config::from(m.spec)).modules(), o.infinity).flat;
                                             });
                    calls[ordered] = rec.calls;
                    streams[ordered] = rec.streams;
                    areas[ordered] = rec.areas;
                    widest_flat[ordered] = rec.widest_flat;
                }
            },
            "the runs"))
        return;
    const std::string what = where() + " " + shard::dtype_name(dt) + " on " + shard::tier_name(tier);
    // Every collective of the engine went through the device communicator:
    // as many as the steps counted, enqueued on the collectives stream (or,
    // for the host backend, run from host jobs, never enqueued).
    for (int ordered = 0; ordered < 2; ++ordered) {
        std::uint64_t counted = 0;
        for (const train::StepLog& l : out[ordered].logs) counted += l.collectives;
        BOOST_TEST(calls[ordered].size() == counted, what << (ordered ? ", enqueued" : ", host jobs"));
        BOOST_TEST(counted > 0u, what);
        BOOST_TEST(coll_stream[ordered] != nullptr, what);
        std::size_t elsewhere = 0;
        for (void* st : streams[ordered]) elsewhere += st != (ordered ? coll_stream[ordered] : nullptr);
        BOOST_TEST(elsewhere == 0u, what << (ordered ? ": collectives enqueued off the collectives stream"
                                                     : ": host collectives enqueued"));
    }
    // The backend that lays buckets flat was given the area the engine's
    // need names, once, and took it back at the end; every bucket fitted in
    // it (gradient buckets of several tensors need one at any dp). The host
    // backend was given none.
    BOOST_TEST(areas[0].empty(), what);
    BOOST_TEST(need_flat[1] > 0u, what);
    BOOST_TEST((areas[1] == std::vector<std::uint64_t>{need_flat[1], 0}), what);
    BOOST_TEST(widest_flat[1] > 0u, what);
    BOOST_TEST(widest_flat[1] <= need_flat[1], what);
    // The same collectives in the same order over buffers of the same sizes.
    BOOST_TEST(calls[1].size() == calls[0].size(), what);
    for (std::size_t i = 0; i < std::min(calls[0].size(), calls[1].size()); ++i)
        BOOST_TEST(calls[1][i].same_call(calls[0][i]), what << ": collective " << i << " differs");
    // Each is one bucket in the dtype it should be, its blocks adding up to
    // the full tensors: an allgather sends this rank's real elements and
    // receives every rank's; a reduce-scatter the reverse.
    const comm::DType wire = dt == DType::bf16 ? comm::DType::bf16 : comm::DType::f32;
    std::size_t gathers = 0, scatters = 0, bad = 0;
    for (const Recorded& r : calls[1]) {
        const bool gather = r.kind == comm::Kind::allgather;
        gathers += gather;
        scatters += r.kind == comm::Kind::reduce_scatter;
        if (!gather && !(r.kind == comm::Kind::reduce_scatter && r.reduce == comm::Reduce::avg)) ++bad;
        if (r.dtype != (gather ? wire : comm::DType::f32)) ++bad;
        if (r.bytes.empty()) ++bad;
        const std::size_t es = comm::dtype_bytes(r.dtype);
        for (std::size_t b = 0; b < r.bytes.size(); ++b) {
            const auto [send, recv] = r.bytes[b];
            const std::size_t full = gather ? recv : send, mine = gather ? send : recv;
            const auto& c = r.counts[b];
            if (c.empty() ? full != mine * dp() : full != std::accumulate(c.begin(), c.end(), std::uint64_t{0}) * es ||
                                                       mine != c.at(me()) * es)
                ++bad;
        }
    }
    BOOST_TEST(bad == 0u, what << ": " << bad << " collectives of the wrong kind, dtype or sizes");
    BOOST_TEST(gathers > 0u, what);
    BOOST_TEST(scatters > 0u, what);
    // And the same training, to the bit.
    BOOST_TEST(out[1].logs.size() == out[0].logs.size(), what);
    for (std::size_t k = 0; k < std::min(out[0].logs.size(), out[1].logs.size()); ++k) {
        BOOST_TEST(std::bit_cast<std::uint64_t>(out[1].logs[k].loss) == std::bit_cast<std::uint64_t>(out[0].logs[k].loss),
                   what << " step " << k + 1 << ": loss " << out[1].logs[k].loss << " vs " << out[0].logs[k].loss);
        BOOST_TEST(std::bit_cast<std::uint64_t>(out[1].logs[k].grad_norm) ==
                       std::bit_cast<std::uint64_t>(out[0].logs[k].grad_norm),
                   what << " step " << k + 1 << ": norm");
    }
    if (me() == 0) try {
            same_state(out[1].committed, out[0].committed, rig, what);
        } catch (const std::exception& e) {
            BOOST_ERROR(what << ": " << e.what());
        }
    world().barrier();  // before rank 0 removes the folder
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_SUITE(engine_tiers)

BOOST_AUTO_TEST_CASE(bf16_tiers_equal_resident) { tiers_equal_resident_at_dp(DType::bf16); }

// bf16 arithmetic: the engine gathers the matrices and tables as bf16 into
// bf16 buffers and its GEMMs read them so; the resident reference holds
// their fp32 copies and rounds them at each GEMM. The same bits.
BOOST_AUTO_TEST_CASE(bf16_weights_equal_resident) {
    tiers_equal_resident_at_dp(DType::bf16, device::Precision::bf16);
}

// The engine's collectives enqueued on the device's collectives stream (the
// path NCCL takes on the cuda backend) against host jobs (MPI on cpu).
BOOST_AUTO_TEST_CASE(stream_ordered_collectives_equal_host_jobs) {
    stream_ordered_equals_host_jobs(DType::bf16, Tier::cpu);
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(data_parallel)

BOOST_AUTO_TEST_CASE(fp32_cpu_tiers_clipped) {
    dp_is_one_rank({DType::fp32, Tier::cpu}, 0.5, "dp vs one rank, fp32, cpu tiers, clip 0.5");
}

BOOST_AUTO_TEST_CASE(fp32_cpu_tiers_unclipped) {
    dp_is_one_rank({DType::fp32, Tier::cpu}, 0, "dp vs one rank, fp32, cpu tiers, no clip");
}

BOOST_AUTO_TEST_CASE(bf16_nvme_tiers_clipped) {
    dp_is_one_rank({DType::bf16, Tier::nvme}, 0.5, "dp vs one rank, bf16, nvme tiers, clip 0.5");
}

BOOST_AUTO_TEST_CASE(bf16_cpu_tiers_unclipped) {
    dp_is_one_rank({DType::bf16, Tier::cpu}, 0, "dp vs one rank, bf16, cpu tiers, no clip");
}

BOOST_AUTO_TEST_CASE(fp32_nvme_tiers_clipped) {
    dp_is_one_rank({DType::fp32, Tier::nvme}, 0.5, "dp vs one rank, fp32, nvme tiers, clip 0.5");
}

// The ZeRO-Infinity engine at dp N against the resident engine on one rank:
// each rank holds only its partitions, fetched and gathered per module, and
// reduce-scatters each module's gradients as its backward ends.
BOOST_AUTO_TEST_CASE(engine_bf16_nvme_tiers_clipped) {
    dp_is_one_rank({DType::bf16, Tier::nvme}, 0.5, "engine, dp vs one rank, bf16, nvme tiers, clip 0.5", false);
}

BOOST_AUTO_TEST_CASE(engine_fp32_cpu_tiers_unclipped) {
    dp_is_one_rank({DType::fp32, Tier::cpu}, 0, "engine, dp vs one rank, fp32, cpu tiers, no clip", false);
}

BOOST_AUTO_TEST_CASE(engine_bf16_gpu_tiers_clipped) {
    dp_is_one_rank({DType::bf16, Tier::gpu}, 0.5, "engine, dp vs one rank, bf16, gpu tiers, clip 0.5", false);
}

BOOST_AUTO_TEST_CASE(pipelined_bf16_clipped) { pipelined_equals_sequential_at_dp(DType::bf16, 0.5, true); }
BOOST_AUTO_TEST_CASE(pipelined_fp32_unclipped) { pipelined_equals_sequential_at_dp(DType::fp32, 0, false); }

BOOST_AUTO_TEST_SUITE_END()
