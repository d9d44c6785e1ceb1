// Unit tests of libzinf zero's tiered optimizer step (zero::Optimizer), in one
// process with the self communicator, when things go wrong: a write fault in
// the middle of a step leaving the committed state whole and resumable; a
// corrupted state refused; overflow skips, loss scaling, global-norm
// clipping; what the overlapped mode refuses; the errors. The equivalences
// are in test_optimizer.cpp; the helpers both share in optimizer_fixture.hpp.
//
// Models are small and oddly shaped (hidden 72, vocab 97, seq 13), so no
// partition is a multiple of anything; state lives in fresh folders on the
// real disk (/var/tmp, which takes O_DIRECT), removed afterwards. Gradients
// come from one printed seed (ZINF_TEST_SEED replays it).
#define BOOST_TEST_MODULE optimizer_faults
#include "optimizer_fixture.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

using namespace zinf;
using namespace zinf::testing;

// ===========================================================================
BOOST_AUTO_TEST_SUITE(faults)

// 3. A write error in the middle of a step: the manifest still names the
// state before it, whole, and a fresh optimizer resumes from it exactly.
//
// ZINF_FAULTS applies to every file opened while it is set, so it is set
// only while the failing optimizer opens its files. Each file counts its own
// pieces: with 4KiB engine blocks and bf16 gradients, the step's gradient
// scratch takes G pieces (written by put_gradient) and each fp32 state twin S
// > G pieces (written by step), so "write:N" with G < N <= S fails inside
// the step's stream, in the middle of every state's twin.
BOOST_AUTO_TEST_CASE(write_error_mid_step_leaves_the_commit_whole) {
    const std::uint64_t s = fresh_seed("write fault");
    io::EngineConfig ec;
    ec.block_size = 4096;
    Rig rig(ec);
    const shard::LayoutOptions lo = lay(DType::fp32, Tier::nvme, Tier::nvme, s);
    Run ref(rig, lo), run(rig, lo);
    auto c = self_comm();
    zero::OptimizerOptions oo = options();
    oo.grad_dtype = DType::bf16;
    {
        zero::Optimizer r(ref.m, c, rig.engine, rig.pool, oo);
        for (unsigned k = 1; k <= 3; ++k) {
            put_all(r, ref.m, s, k);
            r.step();
        }
    }
    {
        zero::Optimizer a(run.m, c, rig.engine, rig.pool, oo);
        put_all(a, run.m, s, 1);
        BOOST_TEST(a.step().step == 1u);
    }
    std::uint64_t G = 0, S = 0;
    for (const auto& t : run.m.tensors) {
        const std::uint64_t per = shard::owned(t.numel, 1, 0).per;
        G += align_up(per * 2, run.m.opts.alignment) / 4096;
        S += align_up(per * 4, run.m.opts.alignment) / 4096;
    }
    BOOST_TEST_REQUIRE(G + 2 <= S, "the gradient file takes " << G << " pieces, a state " << S);
    const std::uint64_t N = (G + S) / 2;
    const std::string spec = "write:" + std::to_string(N) + ":EIO";
    BOOST_TEST_MESSAGE("fault " << spec << " (gradient " << G << " pieces, each state " << S << ")");

    const Bytes before = slurp(run.manifest_path());
    const auto files_before = snapshot(run.m.dir);
    shard::Manifest mb = shard::read_manifest_file(run.manifest_path());
    std::optional<zero::Optimizer> b;
    ::setenv("ZINF_FAULTS", spec.c_str(), 1);
    try {
        b.emplace(mb, c, rig.engine, rig.pool, oo);
    } catch (...) {
        ::unsetenv("ZINF_FAULTS");
        throw;
    }
    ::unsetenv("ZINF_FAULTS");
    BOOST_REQUIRE_NO_THROW(put_all(*b, mb, s, 2));
    const std::string msg = what_of<IoError>([&] { b->step(); }, "step with a write fault");
    BOOST_TEST_MESSAGE("the failed step: " << msg);
    BOOST_TEST(b->step_count() == 1u);
    // The committed manifest and the files it names are as before.
    same_bytes(slurp(run.manifest_path()), before, "the manifest after the failed step");
    const auto files_after = snapshot(run.m.dir);
    for (const auto& p : mb.parts) {
        const auto x = files_before.find(p.file), y = files_after.find(p.file);
        BOOST_TEST_REQUIRE((x != files_before.end() && y != files_after.end()), p.file);
        same_bytes(Bytes(y->second.begin() + static_cast<std::ptrdiff_t>(p.offset),
                         y->second.begin() + static_cast<std::ptrdiff_t>(p.offset + p.bytes)),
                   Bytes(x->second.begin() + static_cast<std::ptrdiff_t>(p.offset),
                         x->second.begin() + static_cast<std::ptrdiff_t>(p.offset + p.bytes)),
                   "committed " + p.file + " of " + mb.tensors[p.tensor].name);
    }
    verify_from_disk(run.manifest_path(), rig, 1, "after the failed step");
    // The failed optimizer refuses to go on.
    const std::vector<float> g0(mb.tensors[0].numel, 0.0f);
    BOOST_CHECK_THROW(b->put_gradient(0, g0), InternalError);
    BOOST_CHECK_THROW(b->step(), InternalError);
    BOOST_CHECK_THROW(b->save(), InternalError);
    b.reset();

    shard::Manifest mc = shard::read_manifest_file(run.manifest_path());
    zero::Optimizer fresh(mc, c, rig.engine, rig.pool, oo);
    BOOST_TEST(fresh.step_count() == 1u);
    for (unsigned k = 2; k <= 3; ++k) {
        put_all(fresh, mc, s, k);
        BOOST_TEST(fresh.step().step == k);
    }
    same_state(mc, ref.m, rig, "resumed after the fault vs uninterrupted");
    verify_from_disk(run.manifest_path(), rig, 3, "resumed");
}

// A read error in the read-ahead (a step after a clipped one reads the
// master weights and moments during backward): the step fails with an
// IoError naming the file, the manifest and the files it names are as
// before, and a fresh optimizer resumes from them with the state of the run
// that had no fault. ZINF_FAULTS fails the first read of each file the
// failing optimizer opens; the first read of the current generation after
// step 1 is the read-ahead's, while the gradients are handed over.
BOOST_AUTO_TEST_CASE(readahead_read_error_fails_the_step) {
    const std::uint64_t s = fresh_seed("read-ahead fault");
    Rig rig;
    const shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
    Run ref(rig, lo), run(rig, lo);
    auto c = self_comm();
    zero::OptimizerOptions oo = options();
    oo.grad_clip = 1;
    zero::OptimizerOptions ro = oo;
    ro.overlap = true;
    ro.readahead = 64 * MiB;
    const double norms[] = {4, 2, 0.5};  // clipped; clipped, read ahead; unclipped, read ahead
    auto put = [&](zero::Optimizer& o, const shard::Manifest& m, unsigned k) {
        const double f = norms[k - 1] / full_norm(m, s, k);
        put_all(o, m, s, k, true, [&](std::size_t, std::vector<float>& g) {
            for (float& x : g) x = static_cast<float>(x * f);
        });
    };
    {
        zero::Optimizer r(ref.m, c, rig.engine, rig.pool, oo);
        for (unsigned k = 1; k <= 3; ++k) {
            put(r, ref.m, k);
            r.step();
        }
    }
    {
        zero::Optimizer a(run.m, c, rig.engine, rig.pool, ro);
        put(a, run.m, 1);
        BOOST_TEST(a.step().clip < 1);
    }
    const Bytes before = slurp(run.manifest_path());
    const auto files_before = snapshot(run.m.dir);
    shard::Manifest mb = shard::read_manifest_file(run.manifest_path());
    std::optional<zero::Optimizer> b;
    ::setenv("ZINF_FAULTS", "read:1:EIO", 1);
    try {
        b.emplace(mb, c, rig.engine, rig.pool, ro);
    } catch (...) {
        ::unsetenv("ZINF_FAULTS");
        throw;
    }
    ::unsetenv("ZINF_FAULTS");
    BOOST_TEST_REQUIRE(b->readahead_bytes() == b->update_read_bytes());
    BOOST_REQUIRE_NO_THROW(put(*b, mb, 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string msg = what_of<IoError>([&] { b->step(); }, "step with a read-ahead fault");
    BOOST_TEST_MESSAGE("the failed step: " << msg);
    // The first read to fail is the read-ahead's first to reach the engine:
    // its reads of the three states go out on the engine's queues at once,
    // so which file's comes first depends on the threads (a loaded machine
    // gave exp_avg's); the message names the file it was.
    BOOST_TEST((msg.find("rank0/master.alt.bin") != std::string::npos ||
                msg.find("rank0/exp_avg.alt.bin") != std::string::npos ||
                msg.find("rank0/exp_avg_sq.alt.bin") != std::string::npos),
               msg);
    BOOST_TEST(b->step_count() == 1u);
    same_bytes(slurp(run.manifest_path()), before, "the manifest after the failed step");
    const auto files_after = snapshot(run.m.dir);
    for (const auto& p : mb.parts) {
        const auto x = files_before.find(p.file), y = files_after.find(p.file);
        BOOST_TEST_REQUIRE((x != files_before.end() && y != files_after.end()), p.file);
        BOOST_TEST((x->second == y->second), "committed " << p.file << " unchanged");
    }
    BOOST_CHECK_THROW(b->step(), InternalError);
    b.reset();
    verify_from_disk(run.manifest_path(), rig, 1, "after the failed step");
    shard::Manifest mc = shard::read_manifest_file(run.manifest_path());
    zero::Optimizer fresh(mc, c, rig.engine, rig.pool, ro);
    for (unsigned k = 2; k <= 3; ++k) {
        put(fresh, mc, k);
        BOOST_TEST(fresh.step().step == k);
    }
    same_state(mc, ref.m, rig, "resumed after the read-ahead fault vs no fault, no overlap");
    verify_from_disk(run.manifest_path(), rig, 3, "resumed");
}

// The same with the moments in memory and the parameters (fp32: the master)
// streamed: the fault hits the only file the step writes; the run saves
// after every step, so the manifest stays openable.
BOOST_AUTO_TEST_CASE(write_error_with_the_moments_in_memory) {
    const std::uint64_t s = fresh_seed("write fault, moments in memory");
    io::EngineConfig ec;
    ec.block_size = 4096;
    Rig rig(ec);
    const shard::LayoutOptions lo = lay(DType::fp32, Tier::nvme, Tier::cpu, s);
    Run ref(rig, lo), run(rig, lo);
    auto c = self_comm();
    {
        zero::Optimizer r(ref.m, c, rig.engine, rig.pool, options());
        for (unsigned k = 1; k <= 3; ++k) {
            put_all(r, ref.m, s, k);
            r.step();
        }
        r.save();
    }
    {
        zero::Optimizer a(run.m, c, rig.engine, rig.pool, options());
        put_all(a, run.m, s, 1);
        a.step();
        a.save();
    }
    const Bytes before = slurp(run.manifest_path());
    shard::Manifest mb = shard::read_manifest_file(run.manifest_path());
    std::optional<zero::Optimizer> b;
    ::setenv("ZINF_FAULTS", "write:3:EIO", 1);
    try {
        b.emplace(mb, c, rig.engine, rig.pool, options());
    } catch (...) {
        ::unsetenv("ZINF_FAULTS");
        throw;
    }
    ::unsetenv("ZINF_FAULTS");
    put_all(*b, mb, s, 2);
    BOOST_CHECK_THROW(b->step(), IoError);
    BOOST_CHECK_THROW(b->save(), InternalError);  // the moments in memory are half a step on
    b.reset();
    same_bytes(slurp(run.manifest_path()), before, "the manifest after the failed step");
    verify_from_disk(run.manifest_path(), rig, 1, "after the failed step");
    shard::Manifest mc = shard::read_manifest_file(run.manifest_path());
    zero::Optimizer fresh(mc, c, rig.engine, rig.pool, options());
    for (unsigned k = 2; k <= 3; ++k) {
        put_all(fresh, mc, s, k);
        fresh.step();
    }
    fresh.save();
    same_state(mc, ref.m, rig, "resumed after the fault vs uninterrupted");
}

// 10. A cpu-tier state whose bytes do not match the manifest is refused when
// the optimizer loads it.
BOOST_AUTO_TEST_CASE(corrupt_cpu_state_is_refused) {
    const std::uint64_t s = fresh_seed("corrupt");
    Rig rig;
    Run cp(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s));
    // A byte in the middle of mlp.c_fc.weight's exp_avg.
    const std::size_t t = cp.m.find_tensor("h.0.mlp.c_fc.weight");
    const shard::Partition* part = nullptr;
    for (const auto& p : cp.m.parts)
        if (p.tensor == t && p.state == "exp_avg") part = &p;
    BOOST_TEST_REQUIRE(part != nullptr);
    const std::string path = cp.m.path_of(*part);
    {
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        BOOST_TEST_REQUIRE(f.good());
        const auto at = static_cast<std::streamoff>(part->offset + part->bytes / 2 + 1);
        f.seekg(at);
        char ch = 0;
        f.read(&ch, 1);
        ch = static_cast<char>(ch ^ 0x10);
        f.seekp(at);
        f.write(&ch, 1);
    }
    auto c = self_comm();
    const std::string msg =
        what_of<DataError>([&] { zero::Optimizer opt(cp.m, c, rig.engine, rig.pool, options()); }, "corrupt exp_avg");
    BOOST_TEST(contains(msg, "exp_avg"), msg);
    BOOST_TEST(contains(msg, "h.0.mlp.c_fc.weight"), msg);
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(scaling)

// 4. A gradient that is not finite skips the step and changes nothing; the
// next clean step is the step a run without the bad one takes.
BOOST_AUTO_TEST_CASE(overflow_skips_the_step) {
    const std::uint64_t s = fresh_seed("overflow");
    for (Tier tier : {Tier::nvme, Tier::cpu}) {
        const std::string what = std::string("tier ") + shard::tier_name(tier);
        Rig rig;
        const shard::LayoutOptions lo = lay(DType::bf16, tier, tier, s);
        Run x(rig, lo), y(rig, lo);
        auto c = self_comm();
        zero::Optimizer ox(x.m, c, rig.engine, rig.pool, options());
        zero::Optimizer oy(y.m, c, rig.engine, rig.pool, options());
        put_all(ox, x.m, s, 1);
        put_all(oy, y.m, s, 1);
        ox.step();
        oy.step();
        const Bytes manifest = slurp(x.manifest_path());
        const auto files = snapshot(x.m.dir);
        std::vector<Bytes> params;
        if (tier == Tier::cpu)
            for (std::size_t t = 0; t < x.m.tensors.size(); ++t) {
                const auto p = ox.param_source(t).memory;
                params.emplace_back(p.begin(), p.end());
            }
        const std::size_t bad_t = x.m.find_tensor("h.0.attn.c_attn.weight");
        struct Bad {
            const char* name;
            float value;
            bool as_bf16;
        };
        for (const Bad& bad : {Bad{"inf", std::numeric_limits<float>::infinity(), false},
                               Bad{"-inf", -std::numeric_limits<float>::infinity(), false},
                               Bad{"NaN", std::numeric_limits<float>::quiet_NaN(), false},
                               Bad{"NaN as bf16", std::numeric_limits<float>::quiet_NaN(), true}}) {
            const std::string at = what + ", " + bad.name;
            for (std::size_t t = 0; t < x.m.tensors.size(); ++t) {
                std::vector<float> g = gradient(s, 2, t, x.m.tensors[t].numel);
                if (t == bad_t) g[g.size() / 3] = bad.value;
                if (bad.as_bf16 && t == bad_t) {
                    std::vector<std::uint16_t> b(g.size());
                    to_bf16(g, b);
                    ox.put_gradient(t, std::span<const std::uint16_t>(b));
                } else {
                    ox.put_gradient(t, std::span<const float>(g));
                }
            }
            const zero::StepReport rep = ox.step();
            BOOST_TEST(rep.overflow, at);
            BOOST_TEST(!std::isfinite(rep.grad_norm), at << ": norm " << rep.grad_norm);
            BOOST_TEST(rep.step == 1u, at);
            BOOST_TEST(ox.step_count() == 1u, at);
            same_bytes(slurp(x.manifest_path()), manifest, at + ": the manifest");
            const auto now = snapshot(x.m.dir);
            BOOST_TEST(now.size() == files.size(), at);
            for (const auto& [name, bytes] : files) {
                const auto it = now.find(name);
                BOOST_TEST_REQUIRE((it != now.end()), at << ": " << name);
                same_bytes(it->second, bytes, at + ": " + name);
            }
            if (tier == Tier::cpu)
                for (std::size_t t = 0; t < x.m.tensors.size(); ++t) {
                    const auto p = ox.param_source(t).memory;
                    same_bytes(Bytes(p.begin(), p.end()), params[t], at + ": param_source() of " + x.m.tensors[t].name);
                }
        }
        for (unsigned k = 2; k <= 3; ++k) {
            put_all(ox, x.m, s, k);
            put_all(oy, y.m, s, k);
            const zero::StepReport rx = ox.step(), ry = oy.step();
            BOOST_TEST(!rx.overflow, what);
            BOOST_TEST(rx.step == k, what);
            BOOST_TEST(rx.grad_norm == ry.grad_norm, what);
        }
        if (tier == Tier::cpu) {
            ox.save();
            oy.save();
        }
        same_state(x.m, y.m, rig, what + ": after skipped steps vs none");
        verify_from_disk(x.manifest_path(), rig, 3, what);
    }
}

// Gradients scaled by a power of two and divided back by step(scale): the
// same bits as unscaled ones (the kernel multiplies by 1/scale exactly).
BOOST_AUTO_TEST_CASE(loss_scale_divides_the_gradients) {
    const std::uint64_t s = fresh_seed("loss scale");
    Rig rig;
    const shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
    Run x(rig, lo), y(rig, lo);
    auto c = self_comm();
    zero::Optimizer ox(x.m, c, rig.engine, rig.pool, options());
    zero::Optimizer oy(y.m, c, rig.engine, rig.pool, options());
    for (unsigned k = 1; k <= 2; ++k) {
        put_all(ox, x.m, s, k, false, [](std::size_t, std::vector<float>& g) {
            for (auto& v : g) v *= 1024.0f;
        });
        put_all(oy, y.m, s, k);
        const zero::StepReport rx = ox.step(1024), ry = oy.step(1);
        BOOST_TEST(!rx.overflow);
        BOOST_TEST(rx.step == k);
        BOOST_TEST(rx.grad_norm == ry.grad_norm, "norm " << rx.grad_norm << " vs " << ry.grad_norm);
        BOOST_TEST(rx.clip == 1.0);
    }
    same_state(x.m, y.m, rig, "scaled by 1024 vs unscaled");
    // A bad scale is refused, and changes nothing.
    put_all(ox, x.m, s, 3);
    for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
        BOOST_CHECK_THROW(ox.step(bad), UsageError);
    BOOST_TEST(ox.step().step == 3u);
}

// 5. Clipping by the global norm: the norm is the double sum of squares, the
// coefficient PyTorch's, and the result that of pre-clipped gradients.
BOOST_AUTO_TEST_CASE(clipping_by_the_global_norm) {
    const std::uint64_t s = fresh_seed("clip");
    Rig rig;
    const shard::LayoutOptions lo = lay(DType::fp32, Tier::nvme, Tier::nvme, s);
    Run x(rig, lo), y(rig, lo);
    auto c = self_comm();
    zero::OptimizerOptions clipped = options();
    clipped.grad_clip = 0.05;
    zero::Optimizer ox(x.m, c, rig.engine, rig.pool, clipped);
    zero::Optimizer oy(y.m, c, rig.engine, rig.pool, options());
    for (unsigned k = 1; k <= 2; ++k) {
        const double norm = full_norm(x.m, s, k);
        put_all(ox, x.m, s, k);
        const zero::StepReport rx = ox.step();
        BOOST_TEST(rx.grad_norm == norm, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(rx.clip == clipped.grad_clip / (rx.grad_norm + 1e-6));
        BOOST_TEST(rx.clip == clipped.grad_clip / (norm + 1e-6), boost::test_tools::tolerance(1e-12));
        BOOST_TEST(rx.clip < 0.5, "the clip is active: norm " << norm);
        BOOST_TEST_MESSAGE("step " << k << ": norm " << rx.grad_norm << ", clip " << rx.clip);
        const double coef = rx.clip;
        put_all(oy, y.m, s, k, false, [&](std::size_t, std::vector<float>& g) {
            for (auto& v : g) v = static_cast<float>(double(v) * coef);
        });
        const zero::StepReport ry = oy.step();
        BOOST_TEST(ry.clip == 1.0);
        BOOST_TEST(ry.grad_norm == norm * coef, boost::test_tools::tolerance(1e-6));
    }
    close_state(x.m, y.m, rig, 1e-6, "clipped vs pre-multiplied");
    // The moments carry the coefficient (Adam's step itself hardly does), so
    // the comparison above is not vacuous: the first moment is far from an
    // unclipped run's.
    Run z(rig, lo);
    {
        zero::Optimizer oz(z.m, c, rig.engine, rig.pool, options());
        for (unsigned k = 1; k <= 2; ++k) {
            put_all(oz, z.m, s, k);
            oz.step();
        }
    }
    const auto clipped_m = as_f32(cat_bytes(x.m, 0, "exp_avg", rig)), plain_m = as_f32(cat_bytes(z.m, 0, "exp_avg", rig));
    double a = 0, b = 0;
    for (std::size_t i = 0; i < clipped_m.size(); ++i) a += std::abs(clipped_m[i]), b += std::abs(plain_m[i]);
    BOOST_TEST(a < 0.5 * b, "clipped exp_avg mass " << a << " vs unclipped " << b);
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// The overlapped mode is exact whatever step() then finds: clipped (the
// speculative update redone), another loss scale (redone), an overflow
// (skipped, the handed-out parameters put back). Its plain equivalence with
// the full step is in test_optimizer.cpp.
BOOST_AUTO_TEST_SUITE(modes)

BOOST_AUTO_TEST_CASE(overlap_is_exact_when_clipped_rescaled_or_skipped) {
    const std::uint64_t s = fresh_seed("overlap redo");
    // Speculation needs the step to write a generation the current values
    // are not in: always with every state streamed; with the parameters in
    // memory, only right after a save (between saves the streamed files are
    // updated in place); never with the master weights in memory.
    enum Spec { always, after_save, never };
    struct Case {
        Tier param, optim;
        DType pd;
        Spec spec;
        bool save_each_step;
    };
    for (const Case cs : {Case{Tier::nvme, Tier::nvme, DType::bf16, always, false},
                          Case{Tier::cpu, Tier::nvme, DType::bf16, after_save, true},
                          Case{Tier::cpu, Tier::nvme, DType::bf16, after_save, false},
                          Case{Tier::nvme, Tier::nvme, DType::fp32, always, false},
                          Case{Tier::cpu, Tier::cpu, DType::bf16, never, false}}) {
        const std::string what = std::string("param ") + shard::tier_name(cs.param) + " " + shard::dtype_name(cs.pd) +
                                 ", optim " + shard::tier_name(cs.optim) + (cs.save_each_step ? ", saved each step" : "");
        Rig rig;
        const shard::LayoutOptions lo = lay(cs.pd, cs.param, cs.optim, s);
        Run full(rig, lo), ov(rig, lo);
        auto c = self_comm();
        // What each optimizer handed out as working parameters, per tensor.
        std::vector<Bytes> seen_full(full.m.tensors.size()), seen_ov(full.m.tensors.size());
        struct Watch : zero::ParamListener {
            std::vector<Bytes>& seen;
            std::size_t dt;
            Watch(std::vector<Bytes>& s, std::size_t d) : seen(s), dt(d) {}
            void updated(std::size_t t, std::uint64_t first, std::span<const std::byte> v) override {
                if (seen[t].size() < (first * dt + v.size())) seen[t].resize(first * dt + v.size());
                std::memcpy(seen[t].data() + first * dt, v.data(), v.size());
            }
        };
        const std::size_t dt = shard::dtype_bytes(full.m.opts.param_dtype);
        Watch watch_full(seen_full, dt), watch_ov(seen_ov, dt);
        zero::OptimizerOptions of_o = options(), ov_o = options();
        of_o.grad_clip = ov_o.grad_clip = 1.0;
        ov_o.overlap = true;
        zero::Optimizer of(full.m, c, rig.engine, rig.pool, of_o), oov(ov.m, c, rig.engine, rig.pool, ov_o);
        of.listen(&watch_full);
        oov.listen(&watch_ov);
        // Per step: the gradients' factor, the loss scale, a non-finite
        // element, and whether the overlapped step must be redone.
        struct Step {
            float factor;
            double loss_scale;
            bool overflow, redo;
        };
        const Step steps[] = {{1e-3f, 1, false, false},  // not clipped: the speculation holds
                              {4e-3f, 4, false, true},   // a new loss scale, not clipped: redone
                              {4e-3f, 4, false, false},  // the same scale again
                              {8, 4, false, true},       // clipped (redone if anything was speculated)
                              {4e-3f, 4, false, false},  // after a clipped step: no speculation
                              {4e-3f, 4, true, false},   // overflow: skipped, parameters put back
                              {4e-3f, 4, false, false},  // after a skipped step: no speculation
                              {1e-3f, 1, false, true}};  // back to 1: a new scale again
        unsigned k = 0, redos = 0;
        std::uint64_t committed = 0;
        for (const Step& st : steps) {
            ++k;
            auto edit = [&](std::size_t t, std::vector<float>& g) {
                for (auto& x : g) x *= st.factor;
                if (st.overflow && t == 3) g[0] = std::numeric_limits<float>::infinity();
            };
            put_all(of, full.m, s, k, false, edit);
            put_all(oov, ov.m, s, k, true, edit);
            const zero::StepReport rf = of.step(st.loss_scale), ro = oov.step(st.loss_scale);
            const std::string at = what + ", step " + std::to_string(k);
            BOOST_TEST(rf.overflow == st.overflow, at);
            BOOST_TEST(ro.overflow == st.overflow, at);
            committed += !st.overflow;
            BOOST_TEST(ro.step == committed, at);
            BOOST_TEST(rf.clip == ro.clip, at);
            if (!st.overflow) BOOST_TEST((ro.clip < 1) == (st.factor >= 1), at << ": clip " << ro.clip);
            BOOST_TEST(!rf.redo, at);
            // ... and only after a step neither clipped nor skipped (a step
            // after one is likely clipped too).
            const bool after_plain = k == 1 || (steps[k - 2].factor < 1 && !steps[k - 2].overflow);
            const bool speculates =
                after_plain && (cs.spec == always || (cs.spec == after_save && (cs.save_each_step || k == 1)));
            if (speculates) {
                // A step whose own gradients already say it will be clipped
                // or skipped stops speculating (how soon depends on when the
                // optimizer's thread looks); one that is not clipped has
                // every tensor updated during "backward".
                if (st.factor < 1 && !st.overflow) BOOST_TEST(ro.speculated == ov.m.tensors.size(), at);
                BOOST_TEST(ro.redo == (st.redo && ro.speculated > 0), at);
            } else {
                BOOST_TEST(!ro.redo, at);
                BOOST_TEST(ro.speculated == 0u, at);
            }
            redos += ro.redo;
            if (cs.save_each_step) {
                of.save();
                oov.save();
            }
            for (std::size_t t = 0; t < seen_full.size(); ++t)
                same_bytes(seen_full[t], seen_ov[t], at + ": working parameters handed out, " + full.m.tensors[t].name);
        }
        if (cs.spec == always || cs.save_each_step) BOOST_TEST(redos >= 2u, what);  // the two new loss scales at least
        BOOST_TEST(rig.pool.stats().high_water <= rig.pool.buffers(), what);
        if (cs.optim != Tier::nvme || cs.param != Tier::nvme) {
            of.save();
            oov.save();
        }
        same_state(full.m, ov.m, rig, what + ": overlapped vs full");
        verify_from_disk(ov.manifest_path(), rig, committed, what);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 8. What is refused, and how.
BOOST_AUTO_TEST_SUITE(errors)

BOOST_AUTO_TEST_CASE(gradients_handed_over_wrongly) {
    const std::uint64_t s = fresh_seed("gradient errors");
    Rig rig;
    Run nv(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s));
    auto c = self_comm();
    zero::Optimizer opt(nv.m, c, rig.engine, rig.pool, options());
    const auto& t0 = nv.m.tensors[0];
    std::vector<float> g = gradient(s, 1, 0, t0.numel + 1);
    std::string msg = what_of<InternalError>(
        [&] { opt.put_gradient(0, std::span<const float>(g)); }, "one element too many");
    BOOST_TEST(contains(msg, t0.name), msg);
    msg = what_of<InternalError>([&] { opt.put_gradient(0, std::span<const float>(g).first(t0.numel - 1)); },
                                 "one element too few");
    const std::vector<std::uint16_t> b(t0.numel + 3);
    what_of<InternalError>([&] { opt.put_gradient(0, std::span<const std::uint16_t>(b)); }, "bf16, too many");
    what_of<InternalError>([&] { opt.put_gradient(nv.m.tensors.size(), std::span<const float>(g).first(1)); },
                           "no such tensor");
    opt.put_gradient(0, std::span<const float>(g).first(t0.numel));
    msg = what_of<InternalError>([&] { opt.put_gradient(0, std::span<const float>(g).first(t0.numel)); },
                                 "handed over twice");
    BOOST_TEST(contains(msg, "twice"), msg);
    // Every tensor but one: step() names the missing one.
    const std::size_t missing = nv.m.find_tensor("h.0.ln_2.bias");
    for (std::size_t t = 1; t < nv.m.tensors.size(); ++t)
        if (t != missing) {
            const auto gt = gradient(s, 1, t, nv.m.tensors[t].numel);
            opt.put_gradient(t, std::span<const float>(gt));
        }
    msg = what_of<InternalError>([&] { opt.step(); }, "a tensor missing");
    BOOST_TEST(contains(msg, "h.0.ln_2.bias"), msg);
    // Handing the missing one over completes the step.
    const auto gm = gradient(s, 1, missing, nv.m.tensors[missing].numel);
    opt.put_gradient(missing, std::span<const float>(gm));
    BOOST_TEST(opt.step().step == 1u);
}

BOOST_AUTO_TEST_CASE(bad_manifests_and_options) {
    const std::uint64_t s = fresh_seed("bad manifests");
    Rig rig;
    auto c = self_comm();
    const zero::OptimizerOptions oo = options();
    // Laid out but never initialised.
    shard::Manifest bare = shard::layout(shard::ModelSpec::parse(kModel), lay(DType::bf16, Tier::nvme, Tier::nvme, s));
    what_of<DataError>([&] { zero::Optimizer o(bare, c, rig.engine, rig.pool, oo); }, "no data directory");
    Run nv(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s));
    {
        shard::Manifest m = nv.m;
        m.parts[3].xxh3.reset();
        const std::string msg =
            what_of<DataError>([&] { zero::Optimizer o(m, c, rig.engine, rig.pool, oo); }, "a record without xxh3");
        BOOST_TEST(contains(msg, "not initialised"), msg);
    }
    // Laid out for inference: no optimizer state.
    {
        shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
        lo.train = false;
        Run inf(rig, lo);
        what_of<DataError>([&] { zero::Optimizer o(inf.m, c, rig.engine, rig.pool, oo); }, "inference manifest");
    }
    // Laid out for dp 2, run by one rank.
    {
        shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
        lo.dp = 2;
        Run two(rig, lo);
        what_of<UsageError>([&] { zero::Optimizer o(two.m, c, rig.engine, rig.pool, oo); }, "dp 2 on one rank");
    }
    // Bad options.
    for (double clip : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
        zero::OptimizerOptions bad = oo;
        bad.grad_clip = clip;
        what_of<UsageError>([&] { zero::Optimizer o(nv.m, c, rig.engine, rig.pool, bad); }, "bad grad_clip");
    }
    {
        zero::OptimizerOptions bad = oo;
        bad.slots = 1;
        what_of<UsageError>([&] { zero::Optimizer o(nv.m, c, rig.engine, rig.pool, bad); }, "one slot");
        bad = oo;
        bad.adamw.lr = -1;
        what_of<UsageError>([&] { zero::Optimizer o(nv.m, c, rig.engine, rig.pool, bad); }, "negative lr");
    }
    // Pools too small for the stream: one buffer, or buffers too small to cut.
    {
        mem::PoolConfig one = small_pool();
        one.bytes = one.buffer;
        mem::PinnedPool p1(one, &rig.engine);
        const std::string msg =
            what_of<UsageError>([&] { zero::Optimizer o(nv.m, c, rig.engine, p1, oo); }, "a one-buffer pool");
        BOOST_TEST(contains(msg, "buffer"), msg);
        mem::PoolConfig tiny = small_pool();
        tiny.buffer = 4 * KiB;
        tiny.bytes = 8 * tiny.buffer;
        mem::PinnedPool p2(tiny, &rig.engine);
        what_of<UsageError>([&] { zero::Optimizer o(nv.m, c, rig.engine, p2, oo); }, "4KiB buffers");
        // With every state in memory the pool is not needed.
        Run cp(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s));
        zero::Optimizer o(cp.m, c, rig.engine, p1, oo);
        put_all(o, cp.m, s, 1);
        BOOST_TEST(o.step().step == 1u);
    }
    // The optimizer still opens the intact manifest.
    zero::Optimizer ok(nv.m, c, rig.engine, rig.pool, oo);
    BOOST_TEST(ok.step_count() == 0u);
    BOOST_TEST(ok.rank() == 0u);
}

BOOST_AUTO_TEST_CASE(twin_files) {
    BOOST_TEST(shard::other_generation("rank0/master.bin") == "rank0/master.alt.bin");
    BOOST_TEST(shard::other_generation("rank0/master.alt.bin") == "rank0/master.bin");
    BOOST_TEST(shard::other_generation("rank12/exp_avg_sq.bin") == "rank12/exp_avg_sq.alt.bin");
    BOOST_TEST(shard::other_generation(shard::other_generation("rank3/param.bin")) == "rank3/param.bin");
    BOOST_TEST(shard::other_generation("x") == "x.alt");
}

BOOST_AUTO_TEST_SUITE_END()
