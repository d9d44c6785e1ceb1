// MPI tests of libzinf zero's tiered optimizer step, run under mpirun (-np 2
// and 4): every process is one data-parallel rank updating its own
// partitions, streamed from NVMe in chunks through a small pinned pool.
//
//   - clipping by the norm over all ranks: the norm each rank reports is the
//     full gradient's, the coefficient PyTorch's, and the gathered result
//     that of one process doing the whole model (dp 1);
//   - a gradient that is not finite on one rank skips the step on every rank,
//     and the step after it is the step of a run that never overflowed;
//   - a write error on one rank fails the step on every rank (IoError there,
//     comm::Elsewhere elsewhere) and leaves the committed manifest as it was.
//
// Rank 0 lays out and initialises the state in a folder of its own under
// /var/tmp (its name broadcast) and saves the manifest; every rank reads it.
// Every rank runs every case in the same order, so the collectives match; no
// BOOST_REQUIRE sits where one rank could leave a case early. Gradients come
// from rank 0's seed (printed; ZINF_TEST_SEED replays it), the same full
// gradient on every rank, each putting its own slice (shard::owned).
#define BOOST_TEST_MODULE mpi_optim
#include "optimizer_fixture.hpp"
#include "mpi_testing.hpp"
#include "testing.hpp"

#include <zinf/comm.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>
#include <zinf/optim.hpp>
#include <zinf/shard.hpp>
#include <zinf/util.hpp>
#include <zinf/zero.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace zinf;
using namespace zinf::testing;
using namespace std::chrono_literals;

namespace {

shard::LayoutOptions lay(unsigned ranks, DType param_dtype, std::uint64_t s) {
    shard::LayoutOptions lo;
    lo.dp = ranks;
    lo.param_dtype = param_dtype;
    lo.param_tier = Tier::nvme;
    lo.optim_tier = Tier::nvme;
    lo.seed = s;
    return lo;
}

// Rank 0 lays out and initialises the state in `dir` and saves its manifest;
// every rank then reads it into `m`. A collective: true on every rank, or
// false on every rank.
bool make_state(const std::string& dir, const shard::LayoutOptions& lo, Rig& rig, shard::Manifest& m) {
    bool ok = !dir.empty() && dir.front() == '/';
    if (me() == 0 && ok) {
        try {
            shard::Manifest made = shard::layout(shard::ModelSpec::parse(kModel), lo);
            shard::init(made, dir, rig.engine, rig.pool, {}).commit();
            shard::save_manifest(made, made.dir + "/manifest.jsonl");
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: zinf-shard init in " << dir << ": " << e.what());
            ok = false;
        }
    }
    world().barrier();
    if (ok) {
        try {
            m = shard::read_manifest_file(dir + "/manifest.jsonl");
        } catch (const std::exception& e) {
            BOOST_ERROR(where() << ": reading the manifest in " << dir << ": " << e.what());
            ok = false;
        }
    }
    return all_ranks(ok);
}

void compare(const Bytes& x, const Bytes& y, bool f32, double rel, const std::string& at) {
    if (x.size() != y.size()) {
        BOOST_ERROR(at << ": " << x.size() << " bytes vs " << y.size());
        return;
    }
    if (rel == 0) {
        const auto mm = std::mismatch(x.begin(), x.end(), y.begin());
        BOOST_TEST((mm.first == x.end()), at << ": differs from byte " << (mm.first - x.begin()));
        return;
    }
    std::size_t bad = 0;
    double worst = 0, scale = 0;
    if (f32) {
        std::vector<float> u(x.size() / 4), v(y.size() / 4);
        std::memcpy(u.data(), x.data(), x.size());
        std::memcpy(v.data(), y.data(), y.size());
        for (std::size_t i = 0; i < u.size(); ++i)
            scale = std::max({scale, std::abs(double(u[i])), std::abs(double(v[i]))});
        for (std::size_t i = 0; i < u.size(); ++i) {
            const double d = std::abs(double(u[i]) - double(v[i]));
            worst = std::max(worst, d);
            bad += d > rel * scale;
        }
    } else {
        std::vector<std::uint16_t> u(x.size() / 2), v(y.size() / 2);
        std::memcpy(u.data(), x.data(), x.size());
        std::memcpy(v.data(), y.data(), y.size());
        for (std::size_t i = 0; i < u.size(); ++i) {
            // Steps of bf16 between them (magnitudes in bit order).
            const int p = u[i] & 0x7fff, q = v[i] & 0x7fff;
            const int d = ((u[i] ^ v[i]) & 0x8000) ? p + q : std::abs(p - q);
            worst = std::max(worst, double(d));
            bad += d > 1;
        }
    }
    BOOST_TEST(bad == 0u, at << ": " << bad << " elements apart (worst " << worst << ", scale " << scale << ")");
}

// Every state of every tensor gathered from both manifests' committed files.
void compare_states(const shard::Manifest& a, const shard::Manifest& b, Rig& rig, double rel, const std::string& what) {
    BOOST_TEST((a.states == b.states), what);
    for (const std::string& state : a.states)
        for (std::size_t t = 0; t < a.tensors.size() && t < b.tensors.size(); ++t)
            compare(cat_bytes(a, t, state, rig), cat_bytes(b, t, state, rig),
                    shard::state_dtype(a.opts, state) == DType::fp32, rel, what + ": " + state + " of " + a.tensors[t].name);
}

template <class T>
Bytes bytes_of(const std::vector<T>& v) {
    const auto b = std::as_bytes(std::span(v));
    return Bytes(b.begin(), b.end());
}

// Counts of 4KiB pieces: a rank's bf16 gradient scratch (G) and one of its
// fp32 state files (S), each partition at an aligned offset.
void pieces(const shard::Manifest& m, std::uint64_t& G, std::uint64_t& S) {
    G = S = 0;
    for (const auto& t : m.tensors) {
        const std::uint64_t per = shard::owned(t.numel, m.opts.dp, 0).per;
        G += align_up(per * 2, m.opts.alignment) / 4096;
        S += align_up(per * 4, m.opts.alignment) / 4096;
    }
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_SUITE(optimizer)

// Clipping by the norm of the whole gradient, summed over every rank's part.
BOOST_AUTO_TEST_CASE(clipping_by_the_norm_over_all_ranks) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("clipping over ranks");
    Rig rig;
    zero::OptimizerOptions oo = options();
    oo.grad_clip = 0.05;
    shard::Manifest m;
    if (!make_state(dir.root + "/dp", lay(dp(), DType::bf16, s), rig, m)) {
        world().barrier();
        return;
    }
    std::vector<zero::StepReport> reps;
    bool ok = true;
    try {
        zero::Optimizer opt(m, world(), rig.engine, rig.pool, oo);
        BOOST_TEST(opt.rank() == me());
        for (unsigned k = 1; k <= 2; ++k) {
            put_all(opt, m, s, k);
            reps.push_back(opt.step());
        }
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << e.what());
        ok = false;
    }
    if (!all_ranks(ok)) {
        world().barrier();
        return;
    }
    for (unsigned k = 1; k <= 2; ++k) {
        const zero::StepReport& r = reps[k - 1];
        const double norm = full_norm(m, s, k);
        BOOST_TEST(r.step == k, where());
        BOOST_TEST(!r.overflow, where());
        BOOST_TEST(close(r.grad_norm, norm, 1e-12), where() << " step " << k << ": norm " << r.grad_norm << " vs " << norm);
        BOOST_TEST(r.clip == oo.grad_clip / (r.grad_norm + 1e-6), where());
        BOOST_TEST(close(r.clip, oo.grad_clip / (norm + 1e-6), 1e-12), where() << ": clip " << r.clip);
        BOOST_TEST(r.clip < 0.5, where() << ": the clip is active (norm " << norm << ")");
        // One norm, to the bit, on every rank: one allreduce.
        const auto norms = gather_all(r.grad_norm);
        for (unsigned q = 0; q < dp(); ++q)
            BOOST_TEST(std::bit_cast<std::uint64_t>(norms[q]) == std::bit_cast<std::uint64_t>(r.grad_norm),
                       where() << ": rank " << q << "'s norm " << norms[q] << " vs " << r.grad_norm);
    }
    // Rank 0 alone: the same model and gradients on one rank (dp 1), then the
    // gathered partitions against it. (The self communicator is refused under
    // mpirun, so the dp 1 step is the kernel on each whole tensor, with the
    // norm summed here: test_optimizer shows a dp 1 Optimizer is that kernel,
    // bitwise.)
    if (me() == 0) {
        try {
            shard::Manifest one = shard::layout(shard::ModelSpec::parse(kModel), lay(1, DType::bf16, s));
            shard::init(one, dir.root + "/one", rig.engine, rig.pool, {}).commit();
            const std::size_t T = one.tensors.size();
            std::vector<std::vector<float>> w(T), mo(T), v(T);
            std::vector<std::vector<std::uint16_t>> p(T);
            for (std::size_t t = 0; t < T; ++t) {
                w[t] = as_f32(cat_bytes(one, t, "master", rig));
                mo[t] = as_f32(cat_bytes(one, t, "exp_avg", rig));
                v[t] = as_f32(cat_bytes(one, t, "exp_avg_sq", rig));
                p[t].resize(w[t].size());
            }
            for (unsigned k = 1; k <= 2; ++k) {
                const double norm = full_norm(one, s, k), clip = optim::clip_coefficient(norm, oo.grad_clip);
                BOOST_TEST(close(clip, reps[k - 1].clip, 1e-12), "clip dp 1 " << clip << " vs dp " << dp() << " " << reps[k - 1].clip);
                for (std::size_t t = 0; t < T; ++t) {
                    const std::vector<float> g = gradient(s, k, t, one.tensors[t].numel);
                    optim::Update u;
                    u.master = w[t];
                    u.exp_avg = mo[t];
                    u.exp_avg_sq = v[t];
                    u.grad_f32 = g;
                    u.param_bf16 = p[t];
                    optim::adamw(u, optim::Scalars::make(oo.adamw, k, clip, one.tensors[t].shape.size() >= 2));
                }
            }
            const std::string what = "dp " + std::to_string(dp()) + " vs dp 1: ";
            for (std::size_t t = 0; t < T; ++t) {
                const std::string& name = m.tensors[t].name;
                compare(cat_bytes(m, t, "master", rig), bytes_of(w[t]), true, 1e-6, what + "master of " + name);
                compare(cat_bytes(m, t, "exp_avg", rig), bytes_of(mo[t]), true, 1e-6, what + "exp_avg of " + name);
                compare(cat_bytes(m, t, "exp_avg_sq", rig), bytes_of(v[t]), true, 1e-6, what + "exp_avg_sq of " + name);
                compare(cat_bytes(m, t, "param", rig), bytes_of(p[t]), false, 1, what + "param of " + name);
            }
            shard::verify(m, rig.engine, rig.pool, {});
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0, the dp 1 run: " << e.what());
        }
    }
    world().barrier();  // before rank 0 removes the folder
}

// Read-ahead over ranks: every path of kPhases (clipped while speculating,
// clipped and unclipped after a clipped step, skipped for overflow on rank
// 0 only, speculated) gives the norms and the committed state of the step
// without overlap, to the bit; the budget holds a rank's gradient scratch
// (taken first) and some chunks of its state, so the update takes the rest
// from the files.
BOOST_AUTO_TEST_CASE(readahead_equals_no_overlap_over_ranks) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("read-ahead over ranks");
    Rig rig;
    shard::Manifest m, ref;
    const bool made = make_state(dir.root + "/ra", lay(dp(), DType::bf16, s), rig, m);
    if (!make_state(dir.root + "/ref", lay(dp(), DType::bf16, s), rig, ref) || !made) {
        world().barrier();
        return;
    }
    bool ok = true;
    try {
        readahead_equals_no_overlap(world(), rig, m, ref, s, 480 * KiB, where());
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << e.what());
        ok = false;
    }
    if (all_ranks(ok) && me() == 0) {
        try {
            compare_states(m, ref, rig, 0, "read ahead vs no overlap");
            shard::verify(m, rig.engine, rig.pool, {});
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: " << e.what());
        }
    }
    world().barrier();
}

// A gradient that is not finite on one rank only: every rank skips the step.
BOOST_AUTO_TEST_CASE(overflow_on_one_rank_skips_everywhere) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("overflow on one rank");
    Rig rig;
    shard::Manifest m, ref;
    const bool made = make_state(dir.root + "/ovf", lay(dp(), DType::bf16, s), rig, m);
    if (!make_state(dir.root + "/ref", lay(dp(), DType::bf16, s), rig, ref) || !made) {
        world().barrier();
        return;
    }
    const std::string mpath = m.dir + "/manifest.jsonl";
    bool ok = true;
    try {
        zero::Optimizer opt(m, world(), rig.engine, rig.pool, options());
        put_all(opt, m, s, 1);
        BOOST_TEST(opt.step().step == 1u, where());
        const Bytes before = slurp(mpath);
        struct Bad {
            unsigned rank;
            float value;
            const char* name;
        };
        for (const Bad& bad : {Bad{dp() - 1, std::numeric_limits<float>::infinity(), "inf"},
                               Bad{0, std::numeric_limits<float>::quiet_NaN(), "NaN"}}) {
            const std::string at = where() + ", " + bad.name + " on rank " + std::to_string(bad.rank);
            // In this rank's own slice of the largest tensor, on that rank only.
            const std::size_t t = m.find_tensor("h.0.mlp.c_fc.weight");
            put_all(opt, m, s, 2, false, [&](std::size_t ti, std::vector<float>& g) {
                if (ti != t || me() != bad.rank) return;
                const shard::Owned o = shard::owned(g.size(), dp(), me());
                g[o.first + o.count / 2] = bad.value;
            });
            const zero::StepReport r = opt.step();
            BOOST_TEST(r.overflow, at);
            BOOST_TEST(!std::isfinite(r.grad_norm), at);
            BOOST_TEST(r.step == 1u, at);
            BOOST_TEST(opt.step_count() == 1u, at);
            BOOST_TEST(all_ranks(r.overflow), at << ": every rank skipped");
            world().barrier();
            const Bytes now = slurp(mpath);
            BOOST_TEST((now == before), at << ": the manifest changed");
        }
        put_all(opt, m, s, 2);
        const zero::StepReport r = opt.step();
        BOOST_TEST(!r.overflow, where());
        BOOST_TEST(r.step == 2u, where());
        BOOST_TEST(close(r.grad_norm, full_norm(m, s, 2), 1e-12), where() << ": norm " << r.grad_norm);
        // The run that never overflowed.
        zero::Optimizer oref(ref, world(), rig.engine, rig.pool, options());
        for (unsigned k = 1; k <= 2; ++k) {
            put_all(oref, ref, s, k);
            oref.step();
        }
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << e.what());
        ok = false;
    }
    if (all_ranks(ok) && me() == 0) {
        try {
            compare_states(m, ref, rig, 0, "after the skipped steps vs none");
            shard::verify(m, rig.engine, rig.pool, {});
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: " << e.what());
        }
    }
    world().barrier();
}

// A write error on the last rank in the middle of its step: the step fails
// on every rank, and the committed manifest still names the state before.
// ZINF_FAULTS is set on that rank only while its optimizer opens its files;
// with 4KiB engine blocks and bf16 gradients, "write:N" with G < N <= S
// fails inside the step's stream (see pieces()), not in put_gradient.
BOOST_AUTO_TEST_CASE(write_error_on_one_rank_fails_every_rank) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("write fault on one rank");
    io::EngineConfig ec;
    ec.block_size = 4096;
    Rig rig(ec);
    zero::OptimizerOptions oo = options();
    oo.grad_dtype = DType::bf16;
    shard::Manifest m, ref;
    const bool made = make_state(dir.root + "/run", lay(dp(), DType::fp32, s), rig, m);
    if (!make_state(dir.root + "/ref", lay(dp(), DType::fp32, s), rig, ref) || !made) {
        world().barrier();
        return;
    }
    const std::string mpath = m.dir + "/manifest.jsonl";
    const unsigned faulty = dp() - 1;
    std::uint64_t G = 0, S = 0;
    pieces(m, G, S);
    const std::uint64_t N = (G + S) / 2;
    BOOST_TEST(G < N, "gradient " << G << " pieces, each state " << S);  // the same on every rank
    const std::string spec = "write:" + std::to_string(N) + ":EIO";
    if (me() == 0) BOOST_TEST_MESSAGE("fault " << spec << " on rank " << faulty);

    bool ok = G < N;
    if (ok) try {
            {
                zero::Optimizer a(m, world(), rig.engine, rig.pool, oo);
                put_all(a, m, s, 1);
                BOOST_TEST(a.step().step == 1u, where());
            }
            zero::Optimizer r(ref, world(), rig.engine, rig.pool, oo);
            for (unsigned k = 1; k <= 3; ++k) {
                put_all(r, ref, s, k);
                r.step();
            }
        } catch (const std::exception& e) {
            BOOST_ERROR(where() << ": " << e.what());
            ok = false;
        }
    if (!all_ranks(ok)) {
        world().barrier();
        return;
    }
    const Bytes before = slurp(mpath);
    std::string kind, msg;
    ok = true;
    try {
        shard::Manifest mb = shard::read_manifest_file(mpath);
        std::optional<zero::Optimizer> b;
        if (me() == faulty) ::setenv("ZINF_FAULTS", spec.c_str(), 1);
        try {
            b.emplace(mb, world(), rig.engine, rig.pool, oo);
        } catch (...) {
            ::unsetenv("ZINF_FAULTS");
            throw;
        }
        ::unsetenv("ZINF_FAULTS");
        put_all(*b, mb, s, 2);
        try {
            b->step();
            kind = "none";
        } catch (const IoError& e) {
            kind = "IoError", msg = e.what();
        } catch (const comm::Elsewhere& e) {
            kind = "Elsewhere", msg = e.what();
        } catch (const std::exception& e) {
            kind = "other", msg = e.what();
        }
        BOOST_TEST_MESSAGE(where() << ": " << kind << ": " << msg);
        BOOST_TEST(kind == (me() == faulty ? "IoError" : "Elsewhere"), where() << ": " << msg);
        if (me() != faulty)
            BOOST_TEST(contains(msg, "rank " + std::to_string(faulty)), where() << ": " << msg);
        BOOST_TEST(b->step_count() == 1u, where());
        BOOST_CHECK_THROW(b->step(), InternalError);  // no collective: refused before any
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << e.what());
        ok = false;
    }
    world().barrier();
    BOOST_TEST((slurp(mpath) == before), where() << ": the manifest changed");
    if (!all_ranks(ok)) {
        world().barrier();
        return;
    }
    if (me() == 0) try {
            const shard::Manifest back = shard::read_manifest_file(mpath);
            shard::verify(back, rig.engine, rig.pool, {});
            for (const auto& p : back.parts) BOOST_TEST(p.step == 1u);
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: verify after the failed step: " << e.what());
        }
    // A fresh optimizer on every rank resumes from the manifest as if nothing failed.
    shard::Manifest mc;
    ok = true;
    try {
        mc = shard::read_manifest_file(mpath);
        zero::Optimizer c(mc, world(), rig.engine, rig.pool, oo);
        BOOST_TEST(c.step_count() == 1u, where());
        for (unsigned k = 2; k <= 3; ++k) {
            put_all(c, mc, s, k);
            BOOST_TEST(c.step().step == k, where());
        }
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": resuming: " << e.what());
        ok = false;
    }
    if (all_ranks(ok) && me() == 0) {
        try {
            compare_states(mc, ref, rig, 0, "resumed after the fault vs uninterrupted");
            shard::verify(mc, rig.engine, rig.pool, {});
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: " << e.what());
        }
    }
    world().barrier();
}

// The gpu tier updated on the device (OptimizerOptions::device, the cpu
// backend here) over every rank: through kPhases (clipped, unclipped,
// skipped for overflow, the norm summed over the ranks), pipelined, each
// step's norm, clip and overflow and the saved state equal the cpu tier's
// without the pipeline, to the byte. Each step's gradients are handed over
// while the update before still runs (a second gradient scratch, from a
// 16 MiB budget), which is settled only then, as the trainer does after
// the next backward.
BOOST_AUTO_TEST_CASE(device_update_equals_cpu_tier_over_ranks) {
    SharedDir dir;
    const std::uint64_t s = shared_seed("device update over ranks");
    Rig rig;
    shard::LayoutOptions lg = lay(dp(), DType::bf16, s), lc = lg;
    lg.param_tier = lg.optim_tier = Tier::gpu;
    lc.param_tier = lc.optim_tier = Tier::cpu;
    shard::Manifest g, c;
    const bool made = make_state(dir.root + "/gpu", lg, rig, g);
    if (!make_state(dir.root + "/cpu", lc, rig, c) || !made) {
        world().barrier();
        return;
    }
    bool ok = true;
    try {
        auto dev = device::open({.backend = "cpu", .memory_bytes = 16 * MiB, .threads = 1});
        zero::OptimizerOptions oo = options();
        oo.grad_clip = 1;
        zero::OptimizerOptions go = oo;
        go.device = dev.get();
        go.overlap = go.pipeline = true;
        go.readahead = 16 * MiB;
        zero::Optimizer a(g, world(), rig.engine, rig.pool, go);
        zero::Optimizer b(c, world(), rig.engine, rig.pool, oo);
        BOOST_TEST(a.updates_on_device(), where());
        BOOST_TEST(a.update_under_backward(), where());
        auto same = [&](const zero::StepReport& ra, const zero::StepReport& rb, bool overflow, const std::string& at) {
            BOOST_TEST(std::bit_cast<std::uint64_t>(ra.grad_norm) == std::bit_cast<std::uint64_t>(rb.grad_norm),
                       at << ": norm " << ra.grad_norm << " vs " << rb.grad_norm);
            BOOST_TEST(ra.clip == rb.clip, at);
            BOOST_TEST(ra.overflow == overflow, at);
            BOOST_TEST(rb.overflow == overflow, at);
            BOOST_TEST(ra.step == rb.step, at);
            BOOST_TEST(ra.update_under_backward == (!overflow && ra.clip < 1), at);
        };
        std::optional<zero::StepReport> last;  // a's update under way, and b's step beside it
        zero::StepReport last_b;
        std::string last_at;
        for (const Phase& ph : kPhases) {
            const unsigned k = static_cast<unsigned>(b.step_count()) + 1;
            const std::string at = where() + ", step " + std::to_string(k);
            const double f = ph.norm / full_norm(c, s, k);
            auto edit = [&](std::size_t t, std::vector<float>& gr) {
                for (float& x : gr) x = static_cast<float>(x * f);
                // In the last rank's slice only.
                if (ph.overflow && t + 1 == c.tensors.size()) {
                    const shard::Owned o = shard::owned(gr.size(), dp(), dp() - 1);
                    gr[o.first] = std::numeric_limits<float>::infinity();
                }
            };
            put_all(a, g, s, k, true, edit);  // beside the update before
            put_all(b, c, s, k, true, edit);
            if (last) {
                const auto done = a.settle();
                BOOST_TEST_REQUIRE(done.has_value(), last_at);
                same(*done, last_b, false, last_at);
                last.reset();
            }
            const zero::StepReport ra = a.step();
            const zero::StepReport rb = b.step();
            BOOST_TEST(ra.pending == !ph.overflow, at);
            if (ra.pending) {
                last = ra;
                last_b = rb;
                last_at = at;
                continue;
            }
            same(ra, rb, ph.overflow, at);
        }
        if (last) {
            const auto done = a.settle();
            BOOST_TEST_REQUIRE(done.has_value(), last_at);
            same(*done, last_b, false, last_at);
        }
        a.save();
        b.save();
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << e.what());
        ok = false;
    }
    if (all_ranks(ok) && me() == 0) {
        try {
            compare_states(g, c, rig, 0, "device update vs the cpu tier over ranks");
            shard::verify(g, rig.engine, rig.pool, {});
        } catch (const std::exception& e) {
            BOOST_ERROR("rank 0: " << e.what());
        }
    }
    world().barrier();
}

BOOST_AUTO_TEST_SUITE_END()
