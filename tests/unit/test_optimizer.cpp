// Unit tests of libzinf zero's tiered optimizer step (zero::Optimizer), in one
// process with the self communicator, the equivalences: the NVMe step
// (streamed in chunks that cut inside partitions, through a pool of 64KiB
// buffers) equal to the CPU step and to the AdamW kernel applied directly,
// bitwise; the overlapped mode equal to the full step; mixed tiers and the
// step every record carries; the pool bound. Faults, overflow, loss scaling,
// clipping and the errors are in test_optimizer_faults.cpp; the helpers both
// share in optimizer_fixture.hpp.
//
// Models are small and oddly shaped (hidden 72, vocab 97, seq 13), so no
// partition is a multiple of anything; state lives in fresh folders on the
// real disk (/var/tmp, which takes O_DIRECT), removed afterwards. Gradients
// come from one printed seed (ZINF_TEST_SEED replays it).
#define BOOST_TEST_MODULE optimizer
#include "optimizer_fixture.hpp"

#include <bit>
#include <optional>
#include <set>

using namespace zinf;
using namespace zinf::testing;

namespace {

bool decays(const shard::Tensor& t) { return t.shape.size() >= 2; }

std::uint64_t largest_partition_bytes(const shard::Manifest& m) {
    std::uint64_t most = 0;
    for (const auto& p : m.parts) most = std::max(most, p.bytes);
    return most;
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_SUITE(equivalence)

// 1. The same step wherever the state lives: NVMe (streamed in chunks) and
// CPU memory give the same bytes, fp32 and bf16 parameters, over 3 steps.
BOOST_AUTO_TEST_CASE(nvme_step_equals_cpu_step) {
    const std::uint64_t s = fresh_seed("nvme vs cpu");
    for (DType pd : {DType::fp32, DType::bf16}) {
        const std::string what = std::string("param ") + shard::dtype_name(pd);
        Rig rig;
        Run nv(rig, lay(pd, Tier::nvme, Tier::nvme, s)), cp(rig, lay(pd, Tier::cpu, Tier::cpu, s));
        auto c = self_comm();
        zero::Optimizer a(nv.m, c, rig.engine, rig.pool, options());
        zero::Optimizer b(cp.m, c, rig.engine, rig.pool, options());
        BOOST_TEST(a.chunk_bytes() < largest_partition_bytes(nv.m), what << ": the chunks cut partitions");
        for (unsigned k = 1; k <= 3; ++k) {
            put_all(a, nv.m, s, k);
            put_all(b, cp.m, s, k);
            const zero::StepReport ra = a.step(), rb = b.step();
            BOOST_TEST(ra.step == k, what);
            BOOST_TEST(rb.step == k, what);
            BOOST_TEST(a.step_count() == k, what);
            BOOST_TEST(!ra.overflow);
            BOOST_TEST(ra.clip == 1.0);
            BOOST_TEST(std::bit_cast<std::uint64_t>(ra.grad_norm) == std::bit_cast<std::uint64_t>(rb.grad_norm),
                       what << ": norm " << ra.grad_norm << " vs " << rb.grad_norm);
            BOOST_TEST(ra.chunks > nv.m.tensors.size() / 2, what);
            BOOST_TEST(rb.chunks == 0u, what << ": " << rb.chunks << " chunk(s) reported with every state in memory");
            // The cpu tier's working parameters, in memory, equal the nvme file's.
            for (std::size_t t = 0; t < cp.m.tensors.size(); ++t) {
                const auto p = b.param_source(t).memory;
                same_bytes(Bytes(p.begin(), p.end()), cat_bytes(nv.m, t, "param", rig),
                           what + " step " + std::to_string(k) + ": param_source() of " + cp.m.tensors[t].name);
            }
        }
        BOOST_TEST((a.param_source(0).file != nullptr && a.param_source(0).memory.empty()));  // on nvme, not in memory
        b.save();
        same_state(nv.m, cp.m, rig, what);
        verify_from_disk(nv.manifest_path(), rig, 3, what + " nvme");
        verify_from_disk(cp.manifest_path(), rig, 3, what + " cpu");
        // The in-memory manifest the optimizer keeps is the one on disk.
        const shard::Manifest back = shard::read_manifest_file(nv.manifest_path());
        for (std::size_t i = 0; i < back.parts.size(); ++i) {
            BOOST_TEST(back.parts[i].file == nv.m.parts[i].file);
            BOOST_TEST((back.parts[i].xxh3 == nv.m.parts[i].xxh3));
        }
        // Three steps: the twin named after the first and third.
        BOOST_TEST(contains(back.parts.front().file, ".alt.bin"), back.parts.front().file);
    }
}

// 2. The NVMe step is the kernel on the whole partition: chunking changes nothing.
// The state the optimizer holds in memory (cpu tiers: master or fp32
// parameters, both moments, bf16 working parameters, the gradients) is
// pinned from the pool, one region each, for the optimizer's life; the
// streamed state (nvme) holds none. The pool's leasable buffers stay free.
BOOST_AUTO_TEST_CASE(memory_state_is_pinned_from_the_pool) {
    const std::uint64_t s = fresh_seed("pinned state");
    for (DType pd : {DType::fp32, DType::bf16}) {
        const std::string what = std::string("param ") + shard::dtype_name(pd);
        Rig rig;
        Run cp(rig, lay(pd, Tier::cpu, Tier::cpu, s)), nv(rig, lay(pd, Tier::nvme, Tier::nvme, s));
        auto c = self_comm();
        BOOST_TEST(rig.pool.stats().pinned == 0u, what);
        {
            zero::Optimizer opt(cp.m, c, rig.engine, rig.pool, options());
            const mem::PoolStats st = rig.pool.stats();
            // fp32: param (the master), exp_avg, exp_avg_sq, gradients; bf16 adds the working parameters.
            BOOST_TEST(st.pinned == (pd == DType::fp32 ? 4u : 5u), what);
            std::uint64_t states = 0;
            for (const auto& part : cp.m.parts) states += part.bytes;
            BOOST_TEST(st.pinned_bytes >= states, what << ": " << st.pinned_bytes << " pinned for " << states
                                                     << " bytes of state");
            BOOST_TEST(st.in_use == 0u, what);
            put_all(opt, cp.m, s, 1);
            BOOST_TEST(opt.step().step == 1u, what);
        }
        BOOST_TEST(rig.pool.stats().pinned == 0u, what << ": released with the optimizer");
        zero::Optimizer streamed(nv.m, c, rig.engine, rig.pool, options());
        BOOST_TEST(rig.pool.stats().pinned == 0u, what << ": nvme state streams through the buffers, nothing pinned");
    }
}

BOOST_AUTO_TEST_CASE(nvme_step_equals_the_kernel) {
    const std::uint64_t s = fresh_seed("kernel");
    for (DType pd : {DType::fp32, DType::bf16}) {
        const std::string what = std::string("param ") + shard::dtype_name(pd);
        Rig rig;
        Run nv(rig, lay(pd, Tier::nvme, Tier::nvme, s));
        auto c = self_comm();
        zero::OptimizerOptions oo = options();
        oo.grad_dtype = pd;  // bf16 gradients with bf16 parameters
        zero::Optimizer opt(nv.m, c, rig.engine, rig.pool, oo);
        const bool master = pd != DType::fp32;
        const std::string wstate = master ? "master" : "param";
        for (unsigned k = 1; k <= 2; ++k) {
            const std::size_t T = nv.m.tensors.size();
            std::vector<std::vector<float>> w(T), mo(T), v(T);
            for (std::size_t t = 0; t < T; ++t) {
                w[t] = as_f32(cat_bytes(nv.m, t, wstate, rig));
                mo[t] = as_f32(cat_bytes(nv.m, t, "exp_avg", rig));
                v[t] = as_f32(cat_bytes(nv.m, t, "exp_avg_sq", rig));
            }
            // The second step at another learning rate (a schedule's set_lr).
            optim::AdamW h = oo.adamw;
            if (k == 2) {
                h.lr = 3e-3;
                opt.set_lr(h.lr);
            }
            put_all(opt, nv.m, s, k);
            const zero::StepReport rep = opt.step();
            BOOST_TEST(rep.step == k);
            BOOST_TEST(rep.chunk_bytes == opt.chunk_bytes());
            for (std::size_t t = 0; t < T; ++t) {
                const auto& tensor = nv.m.tensors[t];
                std::vector<float> g = gradient(s, k, t, tensor.numel);
                std::vector<std::uint16_t> gb(g.size()), p(g.size());
                optim::Update u;
                u.master = w[t];
                u.exp_avg = mo[t];
                u.exp_avg_sq = v[t];
                if (pd == DType::fp32) {
                    u.grad_f32 = g;
                } else {
                    to_bf16(g, gb);
                    u.grad_bf16 = gb;
                    u.param_bf16 = p;
                }
                optim::adamw(u, optim::Scalars::make(h, k, 1.0, decays(tensor)));
                auto bytes = [](const auto& vec) {
                    const auto b = std::as_bytes(std::span(vec));
                    return Bytes(b.begin(), b.end());
                };
                const std::string at = what + " step " + std::to_string(k) + ": " + tensor.name + " ";
                same_bytes(cat_bytes(nv.m, t, wstate, rig), bytes(w[t]), at + wstate);
                same_bytes(cat_bytes(nv.m, t, "exp_avg", rig), bytes(mo[t]), at + "exp_avg");
                same_bytes(cat_bytes(nv.m, t, "exp_avg_sq", rig), bytes(v[t]), at + "exp_avg_sq");
                if (master) same_bytes(cat_bytes(nv.m, t, "param", rig), bytes(p), at + "param (bf16)");
            }
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(modes)

// 6. The overlapped step (each tensor updated as its gradient arrives, in
// reverse order as backward hands them over) is the full step, bitwise.
BOOST_AUTO_TEST_CASE(overlap_equals_full_step) {
    const std::uint64_t s = fresh_seed("overlap");
    for (Tier tier : {Tier::nvme, Tier::cpu})
        for (DType pd : {DType::fp32, DType::bf16}) {
            const std::string what = std::string("tier ") + shard::tier_name(tier) + ", param " + shard::dtype_name(pd);
            Rig rig;
            const shard::LayoutOptions lo = lay(pd, tier, tier, s);
            Run full(rig, lo), ov(rig, lo);
            auto c = self_comm();
            zero::OptimizerOptions oo = options();
            oo.overlap = true;
            zero::Optimizer of(full.m, c, rig.engine, rig.pool, options());
            zero::Optimizer oov(ov.m, c, rig.engine, rig.pool, oo);
            for (unsigned k = 1; k <= 3; ++k) {
                put_all(of, full.m, s, k);
                put_all(oov, ov.m, s, k, true);
                const zero::StepReport rf = of.step(), ro = oov.step();
                BOOST_TEST(ro.step == k, what);
                BOOST_TEST(!ro.overflow, what);
                BOOST_TEST(rf.grad_norm == ro.grad_norm, what);
            }
            BOOST_TEST(rig.pool.stats().high_water <= rig.pool.buffers(), what);
            if (tier == Tier::cpu) {
                of.save();
                oov.save();
            }
            same_state(full.m, ov.m, rig, what + ": overlapped vs full");
            verify_from_disk(ov.manifest_path(), rig, 3, what);
        }
}

// 6a. The pipeline (issue 45): step() returns once the norm is known, the
// update running on; param_source of each tensor, asked at once in the
// order a forward asks (first tensor first), waits for its new values and
// names them. Through every kPhases step (clipped while speculating,
// unclipped after a clipped one, speculated, clipped, skipped for overflow)
// the bytes it names, the norms and the committed state are those of the
// step without overlap, to the bit. Write pieces of every state file are
// held 150 ms each (ZINF_FAULTS delay), so that some tensor's fetch comes
// before its write: it waits (update_waited_seconds) instead of reading
// what the file held before. The parameters on nvme and in memory (cpu),
// the optimizer state on nvme (each step committed at settle()) and in
// memory (committed by save()).
// Under the next backward (a second gradient scratch, update_under_
// backward): each step's gradients are handed over as soon as the step
// before returns, while its update runs (its writes held), and that
// update is settled only then. The step after a pipelined one reads ahead
// (16 MiB budget) what the update writes: a read of a chunk not yet
// written would read the generation's old bytes and fail its xxh3 check
// (65); the state and norms are still the sequential step's, and the
// read-ahead's bytes were taken by the update.
namespace {

// Every tensor's current working parameters as param_source names them, in
// tensor order, checked against the xxh3 it gives.
std::vector<Bytes> sources_now(zero::Optimizer& opt, const shard::Manifest& m, const std::string& what) {
    std::vector<Bytes> out;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const zero::ParamSource src = opt.param_source(t);
        Bytes b(src.bytes);
        if (src.file) {
            std::ifstream in(src.file->path(), std::ios::binary);
            in.seekg(static_cast<std::streamoff>(src.offset));
            in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
            BOOST_TEST_REQUIRE(static_cast<bool>(in), what << ": " << src.where << " read");
            if (src.xxh3) BOOST_TEST(xxh3(b) == *src.xxh3, what << ": " << src.where << " against its xxh3");
        } else {
            std::memcpy(b.data(), src.memory.data(), b.size());
        }
        out.push_back(std::move(b));
    }
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pipelined_update_is_read_after_its_writes) {
    const std::uint64_t s = fresh_seed("pipeline");
    const std::pair<Tier, Tier> tiers[] = {{Tier::nvme, Tier::nvme}, {Tier::cpu, Tier::nvme}, {Tier::cpu, Tier::cpu}};
    for (bool early : {false, true})
        for (DType pd : {DType::fp32, DType::bf16})
            for (const auto& [pt, ot] : tiers) {
                // (under the backward: both dtypes with every state on nvme, one each elsewhere)
                if (early && pt != ot && pd == DType::fp32) continue;
                if (early && ot == Tier::cpu && pd == DType::bf16) continue;
                const std::string what = std::string("param ") + shard::dtype_name(pd) + " " + shard::tier_name(pt) +
                                         ", optimizer " + shard::tier_name(ot) +
                                         (early ? ", under the next backward" : "");
                Rig rig({.engine = "threads"});
                const shard::LayoutOptions lo = lay(pd, pt, ot, s);
                Run pip(rig, lo), ref(rig, lo);
                auto c = self_comm();
                zero::OptimizerOptions oo = options();
                oo.grad_clip = 1;
                zero::OptimizerOptions po = oo;
                po.overlap = po.pipeline = true;
                if (early) po.readahead = 16 * MiB;
                std::vector<zero::StepReport> a, b;
                std::vector<std::vector<Bytes>> got, want;
                double waited = 0;
                std::uint64_t pending = 0, readahead = 0, readahead_used = 0;
                {
                    ::setenv("ZINF_FAULTS", "write:1:delay150,write:2:delay150,write:3:delay150,write:4:delay150", 1);
                    zero::Optimizer opt(pip.m, c, rig.engine, rig.pool, po);
                    // (two gradient files with the state on nvme; in memory, from the budget)
                    const bool two = early || ot == Tier::nvme;
                    BOOST_TEST(opt.update_under_backward() == two, what);
                    auto settled = [&](zero::StepReport& r) {
                        const std::optional<zero::StepReport> done = opt.settle();
                        BOOST_TEST(done.has_value() == r.pending, what);
                        BOOST_TEST(!opt.pending(), what);
                        if (!done) return;
                        BOOST_TEST(done->grad_norm == r.grad_norm);
                        BOOST_TEST(done->update_under_backward == (two && r.clip < 1), what);
                        r = *done;
                        waited += r.update_waited_seconds;
                        readahead += r.readahead_bytes;
                        readahead_used += r.readahead_used_bytes;
                        // (the waits are within the update's time, less a wake-up's latency)
                        BOOST_TEST(r.update_waited_seconds + r.settle_waited_seconds <= r.update_pipelined_seconds + 0.1,
                                   what << ": waited " << r.update_waited_seconds << " + " << r.settle_waited_seconds
                                        << " s of " << r.update_pipelined_seconds);
                    };
                    std::optional<zero::StepReport> last;  // early: the step whose update runs
                    for (const Phase& ph : kPhases) {
                        const unsigned k = static_cast<unsigned>(opt.step_count()) + 1 + (opt.pending() ? 1 : 0);
                        const double f = ph.norm / full_norm(pip.m, s, k);
                        // Early: handed over while the update before runs.
                        put_all(opt, pip.m, s, k, true, [&](std::size_t t, std::vector<float>& g) {
                            for (float& x : g) x = static_cast<float>(x * f);
                            if (ph.overflow && t + 1 == pip.m.tensors.size())
                                g[0] = std::numeric_limits<float>::infinity();
                        });
                        // (the update before's parameters as the next forward
                        // fetches them, after the read-ahead started)
                        if (last) {
                            got.push_back(sources_now(opt, pip.m, what));
                            settled(*last);
                            a.push_back(*last);
                            last.reset();
                        }
                        zero::StepReport r = opt.step();
                        BOOST_TEST(r.pending == !ph.overflow, what << ", step " << k);
                        BOOST_TEST(opt.pending() == r.pending, what);
                        pending += r.pending;
                        if (early && r.pending) {
                            last = r;
                            continue;
                        }
                        got.push_back(sources_now(opt, pip.m, what));
                        settled(r);
                        a.push_back(r);
                    }
                    if (last) {
                        got.push_back(sources_now(opt, pip.m, what));
                        settled(*last);
                        a.push_back(*last);
                    }
                    ::unsetenv("ZINF_FAULTS");
                    if (pt == Tier::cpu || ot == Tier::cpu) opt.save();  // state held in memory: committed by a save
                }
                {
                    zero::Optimizer opt(ref.m, c, rig.engine, rig.pool, oo);
                    for (const Phase& ph : kPhases) {
                        const unsigned k = static_cast<unsigned>(opt.step_count()) + 1;
                        const double f = ph.norm / full_norm(ref.m, s, k);
                        put_all(opt, ref.m, s, k, true, [&](std::size_t t, std::vector<float>& g) {
                            for (float& x : g) x = static_cast<float>(x * f);
                            if (ph.overflow && t + 1 == ref.m.tensors.size())
                                g[0] = std::numeric_limits<float>::infinity();
                        });
                        b.push_back(opt.step());
                        BOOST_TEST(!b.back().pending);
                        want.push_back(sources_now(opt, ref.m, what + " (reference)"));
                    }
                    if (pt == Tier::cpu || ot == Tier::cpu) opt.save();
                }
                BOOST_TEST(pending == 7u, what << ": every step but the skipped one pipelined");
                BOOST_TEST_REQUIRE(a.size() == b.size());
                for (std::size_t i = 0; i < a.size(); ++i) {
                    const std::string at = what + ", step " + std::to_string(i + 1);
                    BOOST_TEST(std::bit_cast<std::uint64_t>(a[i].grad_norm) ==
                                   std::bit_cast<std::uint64_t>(b[i].grad_norm),
                               at << ": norm " << a[i].grad_norm << " vs " << b[i].grad_norm);
                    BOOST_TEST(a[i].clip == b[i].clip, at);
                    BOOST_TEST(a[i].overflow == b[i].overflow, at);
                    BOOST_TEST(a[i].step == b[i].step, at);
                    for (std::size_t t = 0; t < got[i].size(); ++t)
                        if (!same_bytes(got[i][t], want[i][t], at + ": " + pip.m.tensors[t].name + " as fetched"))
                            break;
                }
                // (early, the hand-over before the fetches may outlast the held writes)
                if (ot == Tier::nvme && !early)
                    BOOST_TEST(waited > 0.1, what << ": a fetch waited for a held write (" << waited << " s)");
                // Every step after a pipelined one read ahead, from what its update wrote.
                if (early && ot == Tier::nvme)
                    BOOST_TEST((readahead > 0 && readahead_used > 0),
                               what << ": read ahead " << readahead << " bytes, used " << readahead_used);
                same_state(pip.m, ref.m, rig, what + ": pipelined vs no overlap");
                verify_from_disk(pip.manifest_path(), rig, 7, what);
                BOOST_TEST(rig.pool.stats().in_use == 0u, what);
            }
}

// 6a. The gpu tier updated on the device (OptimizerOptions::device; the
// cpu backend here, whose device memory is host memory and whose adamw is
// the CPU kernel's element formula): the master weights, moments and
// working parameters live in the device's arena, not the pool; every path
// of kPhases (clipped, unclipped, skipped for overflow), with and without
// the pipeline, gives the cpu tier's norms, clip coefficients, working
// parameters as fetched after each step, and saved state files, to the
// byte.
std::vector<Bytes> device_sources(zero::Optimizer& opt, const shard::Manifest& m, device::Device& dev,
                                  const std::string& what) {
    std::vector<Bytes> out;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const zero::ParamSource src = opt.param_source(t);
        BOOST_TEST_REQUIRE((src.memory.empty() && !src.file), what << ": " << src.where << " is not on the device");
        BOOST_TEST_REQUIRE(src.device.size() == src.bytes, what << ": " << src.where);
        Bytes b(src.bytes);
        auto& s = dev.stream(device::StreamKind::d2h);
        dev.copy(s, b, src.device);
        dev.synchronize(s);
        out.push_back(std::move(b));
    }
    return out;
}

std::map<std::string, Bytes> state_files(const std::string& dir) {
    std::map<std::string, Bytes> out;
    for (auto& [name, bytes] : snapshot(dir))
        if (name.ends_with(".bin")) out[name] = std::move(bytes);
    return out;
}

BOOST_AUTO_TEST_CASE(device_update_equals_cpu_tier) {
    const std::uint64_t s = fresh_seed("device update");
    for (DType pd : {DType::fp32, DType::bf16})
        for (bool pipelined : {false, true}) {
            const std::string what = std::string("param ") + shard::dtype_name(pd) + (pipelined ? ", pipelined" : "");
            Rig rig;
            Run gp(rig, lay(pd, Tier::gpu, Tier::gpu, s)), cp(rig, lay(pd, Tier::cpu, Tier::cpu, s));
            auto c = self_comm();
            auto dev = device::open({.backend = "cpu", .memory_bytes = 16 * MiB});
            zero::OptimizerOptions oo = options();
            oo.grad_clip = 1;
            zero::OptimizerOptions go = oo;
            go.device = dev.get();
            go.overlap = go.pipeline = pipelined;
            zero::Optimizer b(cp.m, c, rig.engine, rig.pool, oo);
            const std::size_t pinned_cpu = rig.pool.stats().pinned;
            zero::Optimizer a(gp.m, c, rig.engine, rig.pool, go);
            BOOST_TEST(a.updates_on_device(), what);
            BOOST_TEST(!b.updates_on_device(), what);
            // Of the pool, only the gradients' host copy (handed over there).
            BOOST_TEST(rig.pool.stats().pinned == pinned_cpu + 1, what);
            std::uint64_t states = 0;
            for (const auto& part : gp.m.parts) states += part.bytes;
            const std::uint64_t used = dev->arena().stats().used;
            BOOST_TEST(used >= states, what << ": " << used << " bytes of the arena for " << states << " of state");
            BOOST_TEST(used <= zero::Optimizer::device_bytes(gp.m, 0, go), what);
            BOOST_TEST(zero::Optimizer::device_bytes(gp.m, 0, oo) == 0u, what << ": no device, no device memory");
            BOOST_TEST_REQUIRE(!kPhases[0].overflow);
            for (const Phase& ph : kPhases) {
                const unsigned k = static_cast<unsigned>(b.step_count()) + 1;
                const std::string at = what + ", step " + std::to_string(k);
                const double f = ph.norm / full_norm(cp.m, s, k);
                auto edit = [&](std::size_t t, std::vector<float>& g) {
                    for (float& x : g) x = static_cast<float>(x * f);
                    if (ph.overflow && t + 1 == cp.m.tensors.size()) g[0] = std::numeric_limits<float>::infinity();
                };
                put_all(a, gp.m, s, k, true, edit);
                put_all(b, cp.m, s, k, true, edit);
                zero::StepReport ra = a.step();
                const zero::StepReport rb = b.step();
                BOOST_TEST(ra.pending == (pipelined && !ph.overflow), at);
                // While a pipelined update runs, what it wrote is what the cpu tier made.
                const std::vector<Bytes> got = device_sources(a, gp.m, *dev, at);
                if (const auto done = a.settle()) ra = *done;
                BOOST_TEST(std::bit_cast<std::uint64_t>(ra.grad_norm) == std::bit_cast<std::uint64_t>(rb.grad_norm),
                           at << ": norm " << ra.grad_norm << " vs " << rb.grad_norm);
                BOOST_TEST(ra.clip == rb.clip, at);
                BOOST_TEST((ra.clip < 1) == (ph.norm > 1 && !ph.overflow), at << ": clip " << ra.clip);
                BOOST_TEST(ra.overflow == ph.overflow, at);
                BOOST_TEST(rb.overflow == ph.overflow, at);
                BOOST_TEST(ra.step == rb.step, at);
                BOOST_TEST(ra.chunks == 0u, at);
                BOOST_TEST((ra.update_seconds > 0) == !ph.overflow, at << ": update " << ra.update_seconds << " s");
                for (std::size_t t = 0; t < got.size(); ++t) {
                    const auto want = b.param_source(t).memory;
                    if (!same_bytes(got[t], Bytes(want.begin(), want.end()), at + ": " + gp.m.tensors[t].name))
                        break;
                }
            }
            a.save();
            b.save();
            same_state(gp.m, cp.m, rig, what);
            const auto fa = state_files(gp.m.dir), fb = state_files(cp.m.dir);
            BOOST_TEST(fa.size() == fb.size(), what);
            BOOST_TEST(fa.size() >= 3u, what);
            for (const auto& [name, bytes] : fb) {
                const auto it = fa.find(name);
                BOOST_TEST_REQUIRE((it != fa.end()), what << ": no " << name << " beside the cpu tier's");
                same_bytes(it->second, bytes, what + ": " + name);
            }
            verify_from_disk(gp.manifest_path(), rig, 7, what);
            // Reopened from the save, on the device again: one more step as the cpu tier's.
            shard::Manifest back = shard::read_manifest_file(gp.manifest_path());
            zero::Optimizer again(back, c, rig.engine, rig.pool, go);
            put_all(again, back, s, 8);
            put_all(b, cp.m, s, 8);
            again.step();
            again.settle();
            b.step();
            const std::vector<Bytes> got = device_sources(again, back, *dev, what + ", resumed");
            for (std::size_t t = 0; t < got.size(); ++t) {
                const auto want = b.param_source(t).memory;
                if (!same_bytes(got[t], Bytes(want.begin(), want.end()), what + ", resumed: " + back.tensors[t].name))
                    break;
            }
        }
}

// 6b. Read-ahead: a step that does not speculate (after a clipped or
// skipped one, or clipped for certain half-way) reads the master weights and
// moments during backward and updates from them: every path of kPhases
// (clipped, unclipped, skipped for overflow) gives the norms and the state
// of the step without overlap, to the bit; with a budget that holds the
// gradients' scratch (6d) and a few chunks (the update reads the rest from
// the files, a partition cut between the two; fp32 parameters) and with
// one that holds them all (bf16 parameters, written beside the master
// weights); the reference's scratch is a file (no budget).
BOOST_AUTO_TEST_CASE(readahead_equals_no_overlap_step) {
    const std::uint64_t s = fresh_seed("read-ahead");
    const std::pair<DType, std::uint64_t> cases[] = {{DType::fp32, 700 * KiB}, {DType::bf16, 64 * MiB}};
    for (const auto& [pd, budget] : cases) {
        const std::string what = std::string("param ") + shard::dtype_name(pd) + ", budget " + format_size(budget);
        Rig rig;
        const shard::LayoutOptions lo = lay(pd, Tier::nvme, Tier::nvme, s);
        Run ra(rig, lo), ref(rig, lo);
        auto c = self_comm();
        readahead_equals_no_overlap(c, rig, ra.m, ref.m, s, budget, what);
        same_state(ra.m, ref.m, rig, what + ": read ahead vs no overlap");
        verify_from_disk(ra.manifest_path(), rig, 7, what);
        BOOST_TEST(rig.pool.stats().in_use == 0u, what);
    }
}

// 6b'. Reads beside writes: with the disk's bandwidths known, the update
// keeps more chunks in flight in the same leased buffers, the slower
// direction deeper; the bits stay those of the step without overlap, with
// writes the slower (3 chunks behind, 1 ahead) and reads the slower (1
// behind, 3 ahead), a budget that holds part of the state.
BOOST_AUTO_TEST_CASE(depths_from_bandwidths_change_no_bit) {
    const std::uint64_t s = fresh_seed("depths");
    io::EngineConfig ec;
    ec.block_size = 4 * KiB;  // the small pool's pieces are a few KiB
    struct Case {
        io::Bandwidth disk;
        std::size_t ahead, behind;
    };
    // bf16 parameters: a chunk reads master and moments (12 bytes an
    // element) and writes those and the parameters (14).
    const Case cases[] = {{{4e9, 1e9}, 1, 3}, {{1e9, 8e9}, 3, 1}};
    for (const Case& k : cases) {
        const std::string what = "read " + std::to_string(k.disk.read_bps / 1e9) + " GB/s, write " +
                                 std::to_string(k.disk.write_bps / 1e9) + " GB/s";
        Rig rig(ec);
        const shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
        Run ra(rig, lo), ref(rig, lo);
        auto c = self_comm();
        {
            zero::OptimizerOptions oo = options();
            oo.overlap = true;
            const std::size_t leased = [&] {
                zero::Optimizer plain(ra.m, c, rig.engine, rig.pool, oo);
                BOOST_TEST(plain.read_depth() == 1u, what);
                BOOST_TEST(plain.write_depth() == 1u, what);
                put_all(plain, ra.m, s, 1, true);
                (void)plain.step();
                return rig.pool.stats().high_water;
            }();
            oo.disk = k.disk;
            zero::Optimizer deep(ref.m, c, rig.engine, rig.pool, oo);
            BOOST_TEST(deep.read_depth() == k.ahead, what);
            BOOST_TEST(deep.write_depth() == k.behind, what);
            put_all(deep, ref.m, s, 1, true);
            (void)deep.step();
            BOOST_TEST(rig.pool.stats().high_water <= leased, what << ": no more pinned buffers than the default");
        }
        same_state(ra.m, ref.m, rig, what + ": a speculated step, deep vs default");
        readahead_equals_no_overlap(c, rig, ra.m, ref.m, s, 200 * KiB, what, k.disk);
        same_state(ra.m, ref.m, rig, what + ": read ahead and deep vs no overlap");
        BOOST_TEST(rig.pool.stats().in_use == 0u, what);
    }
}

// 6c. The read-ahead's memory is the budget's, in whole chunks, and taken
// only where it can serve: not without overlap, not with the moments in
// memory, none at 0; and only by the first step that reads ahead.
BOOST_AUTO_TEST_CASE(readahead_memory_is_the_budget) {
    const std::uint64_t s = fresh_seed("read-ahead memory");
    Rig rig;
    Run nv(rig, lay(DType::bf16, Tier::nvme, Tier::nvme, s)), mixed(rig, lay(DType::bf16, Tier::nvme, Tier::cpu, s));
    auto c = self_comm();
    zero::OptimizerOptions oo = options();
    oo.overlap = true;
    oo.grad_clip = 1;
    std::uint64_t state = 0;
    for (std::uint64_t budget : {std::uint64_t{0}, 4 * KiB, 200 * KiB, 64 * MiB}) {
        oo.readahead = budget;
        const std::uint64_t before = rig.pool.stats().pinned_bytes;
        zero::Optimizer o(nv.m, c, rig.engine, rig.pool, oo);
        state = o.update_read_bytes();
        // The gradients' scratch takes the budget first (6d), pinned at open.
        const std::uint64_t scratch = o.gradient_scratch_in_memory() ? align_up(o.gradient_scratch_bytes(), 4096) : 0;
        BOOST_TEST(o.gradient_scratch_in_memory() == (budget == 64 * MiB), "budget " << budget);
        BOOST_TEST(o.readahead_bytes() <= std::min(budget - scratch, state), "budget " << budget);
        const std::uint64_t pinned = rig.pool.stats().pinned_bytes;
        BOOST_TEST(pinned == before + scratch, "budget " << budget << ": no read-ahead memory pinned at open");
        // Unclipped: the step speculates and reads nothing ahead.
        {
            const unsigned k = static_cast<unsigned>(o.step_count()) + 1;
            const double f = 0.5 / full_norm(nv.m, s, k);
            put_all(o, nv.m, s, k, true, [&](std::size_t, std::vector<float>& g) {
                for (float& x : g) x = static_cast<float>(x * f);
            });
            BOOST_TEST(o.step().clip == 1.0, "budget " << budget);
        }
        BOOST_TEST(rig.pool.stats().pinned_bytes == pinned, "budget " << budget << ": a speculated step pins nothing");
        // Clipped for certain from its first gradients: it reads ahead.
        {
            const unsigned k = static_cast<unsigned>(o.step_count()) + 1;
            const double f = 1e6 / full_norm(nv.m, s, k);
            put_all(o, nv.m, s, k, true, [&](std::size_t, std::vector<float>& g) {
                for (float& x : g) x = static_cast<float>(x * f);
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(150));
            BOOST_TEST(o.step().clip < 1.0, "budget " << budget);
        }
        const std::uint64_t took = rig.pool.stats().pinned_bytes - pinned;
        BOOST_TEST((took >= o.readahead_bytes() && took <= align_up(o.readahead_bytes(), 4096)),
                   "budget " << budget << ": " << took << " bytes pinned from the pool");
        if (budget == 0 || budget == 4 * KiB) BOOST_TEST(o.readahead_bytes() == 0u, "budget " << budget);
        if (budget == 200 * KiB) BOOST_TEST((o.readahead_bytes() > 100 * KiB && o.readahead_bytes() < state));
        if (budget == 64 * MiB) BOOST_TEST(o.readahead_bytes() == state);
    }
    // master (bf16 parameters), exp_avg, exp_avg_sq: 3 fp32 files of this rank's partitions.
    BOOST_TEST(state >= 3 * 4 * 70000u);
    oo.readahead = 64 * MiB;
    oo.overlap = false;
    BOOST_TEST(zero::Optimizer(nv.m, c, rig.engine, rig.pool, oo).readahead_bytes() == 0u, "no overlap");
    oo.overlap = true;
    BOOST_TEST(zero::Optimizer(mixed.m, c, rig.engine, rig.pool, oo).readahead_bytes() == 0u, "moments in memory");
    oo.readahead = zero::OptimizerOptions::kReadaheadAuto;
    oo.readahead_reserve = 0;
    zero::Optimizer aut(nv.m, c, rig.engine, rig.pool, oo);
    BOOST_TEST(aut.readahead_bytes() <= zero::readahead_spare(1));
    BOOST_TEST(zero::readahead_spare(2) <= zero::readahead_spare(1) / 2 + MiB);
}

// 6d. The gradients' scratch (the optimizer state on NVMe) is held in
// page-locked memory when the optimizer's budget holds the whole of it,
// else a file: one byte short of it, a file. In memory it touches no file
// and its bytes are counted apart; the norms and the committed state are
// the file's to the bit, with and without overlap (kPhases' clipped,
// skipped and speculated steps in 6b run with it in memory too).
BOOST_AUTO_TEST_CASE(gradient_scratch_in_memory_when_the_budget_holds_it) {
    const std::uint64_t s = fresh_seed("gradient scratch");
    Rig rig;
    const shard::LayoutOptions lo = lay(DType::bf16, Tier::nvme, Tier::nvme, s);
    Run file(rig, lo), memo(rig, lo), memo_ov(rig, lo);
    auto c = self_comm();
    zero::OptimizerOptions oo = options();
    oo.grad_clip = 1;
    zero::Optimizer of(file.m, c, rig.engine, rig.pool, oo);  // readahead 0: the file
    const std::uint64_t scratch = of.gradient_scratch_bytes();
    BOOST_TEST(!of.gradient_scratch_in_memory());
    BOOST_TEST(fs::exists(file.m.dir + "/rank0/grad.bin"));
    BOOST_TEST(scratch >= 4 * 70000u);  // fp32 gradients of every partition
    oo.readahead = scratch - 1;
    BOOST_TEST(!zero::Optimizer(memo.m, c, rig.engine, rig.pool, oo).gradient_scratch_in_memory(), "a byte short");
    oo.readahead = scratch;
    const std::uint64_t before = rig.pool.stats().pinned_bytes;
    zero::Optimizer om(memo.m, c, rig.engine, rig.pool, oo);
    oo.overlap = true;
    oo.readahead = 64 * MiB;
    zero::Optimizer ov(memo_ov.m, c, rig.engine, rig.pool, oo);
    BOOST_TEST(om.gradient_scratch_in_memory());
    BOOST_TEST(ov.gradient_scratch_in_memory());
    BOOST_TEST(om.gradient_scratch_bytes() == scratch);
    BOOST_TEST(om.readahead_bytes() == 0u);  // nothing left of the budget (and no overlap)
    BOOST_TEST(ov.readahead_bytes() > 0u);   // the read-ahead has the rest
    BOOST_TEST(rig.pool.stats().pinned_bytes >= before + 2 * scratch);
    BOOST_TEST(!fs::exists(memo.m.dir + "/rank0/grad.bin"));
    BOOST_TEST(!fs::exists(memo_ov.m.dir + "/rank0/grad.bin"));
    for (unsigned k = 1; k <= 3; ++k) {
        // Step 1 unclipped (the overlapped one speculates), 2 and 3 clipped.
        const double f = (k == 1 ? 0.5 : 3.0) / full_norm(file.m, s, k);
        auto scale = [&](std::size_t, std::vector<float>& g) {
            for (float& x : g) x = static_cast<float>(x * f);
        };
        put_all(of, file.m, s, k, true, scale);
        put_all(om, memo.m, s, k, true, scale);
        put_all(ov, memo_ov.m, s, k, true, scale);
        const zero::StepReport rf = of.step(), rm = om.step(), ro = ov.step();
        const std::string at = "step " + std::to_string(k);
        BOOST_TEST(rf.grad_bytes_written > 0u, at);
        BOOST_TEST(rf.grad_memory_bytes == 0u, at);
        for (const zero::StepReport* r : {&rm, &ro}) {
            BOOST_TEST(std::bit_cast<std::uint64_t>(r->grad_norm) == std::bit_cast<std::uint64_t>(rf.grad_norm), at);
            BOOST_TEST(r->clip == rf.clip, at);
            BOOST_TEST(r->grad_bytes_written == 0u, at);
            BOOST_TEST(r->grad_bytes_read == 0u, at);
            BOOST_TEST(r->grad_memory_bytes == rf.grad_bytes_written, at << ": the same bytes, in memory");
        }
        // The file's reads less the gradients' (a redo reads them twice).
        BOOST_TEST(rm.bytes_read == rf.bytes_read - rf.grad_bytes_read, at);
        BOOST_TEST(rm.bytes_written == rf.bytes_written, at);
    }
    same_state(memo.m, file.m, rig, "scratch in memory vs file");
    same_state(memo_ov.m, file.m, rig, "scratch in memory, overlapped, vs file");
    verify_from_disk(memo.manifest_path(), rig, 3, "scratch in memory");
}

// 7. Mixed tiers: the state in memory reaches the manifest by save(); until
// then the records disagree on the step and the manifest is refused.
BOOST_AUTO_TEST_CASE(mixed_tiers_equal_cpu_and_need_save) {
    const std::uint64_t s = fresh_seed("mixed tiers");
    struct Mix {
        Tier param, optim;
    };
    for (const Mix mix : {Mix{Tier::cpu, Tier::nvme}, Mix{Tier::nvme, Tier::cpu}}) {
        const std::string what = std::string("param ") + shard::tier_name(mix.param) + ", optim " +
                                 shard::tier_name(mix.optim);
        Rig rig;
        Run ref(rig, lay(DType::bf16, Tier::cpu, Tier::cpu, s)), mixed(rig, lay(DType::bf16, mix.param, mix.optim, s));
        auto c = self_comm();
        zero::Optimizer oref(ref.m, c, rig.engine, rig.pool, options());
        const Bytes initial = slurp(mixed.manifest_path());
        std::optional<zero::Optimizer> om;
        om.emplace(mixed.m, c, rig.engine, rig.pool, options());
        for (unsigned k = 1; k <= 2; ++k) {
            put_all(oref, ref.m, s, k);
            put_all(*om, mixed.m, s, k);
            oref.step();
            BOOST_TEST(om->step().step == k, what);
        }
        {
            // Steps commit nothing while state is held in memory: the
            // manifest is still the initial one, whole, and opens at step 0.
            BOOST_TEST((slurp(mixed.manifest_path()) == initial), what << ": the manifest is untouched before save");
            verify_from_disk(mixed.manifest_path(), rig, 0, what + " unsaved");
            shard::Manifest back = shard::read_manifest_file(mixed.manifest_path());
            zero::Optimizer o(back, c, rig.engine, rig.pool, options());
            BOOST_TEST(o.step_count() == 0u, what);
        }
        om->save();
        oref.save();
        same_state(mixed.m, ref.m, rig, what + " vs cpu");
        verify_from_disk(mixed.manifest_path(), rig, 2, what + " saved");
        om.reset();
        // Saved: it opens, at step 2, and steps on like the reference.
        shard::Manifest back = shard::read_manifest_file(mixed.manifest_path());
        zero::Optimizer again(back, c, rig.engine, rig.pool, options());
        BOOST_TEST(again.step_count() == 2u, what);
        for (unsigned k = 3; k <= 4; ++k) {
            put_all(again, back, s, k);
            put_all(oref, ref.m, s, k);
            BOOST_TEST(again.step().step == k);
            oref.step();
            // Steps past a save rotate the streamed files around the saved
            // ones: the save is whole on disk whenever a crash comes.
            verify_from_disk(mixed.manifest_path(), rig, 2, what + " step " + std::to_string(k) + " past the save");
        }
        again.save();
        oref.save();
        same_state(back, ref.m, rig, what + " resumed vs cpu");
    }
}

// 9. The step's memory is the pool: never more buffers than it has; the
// report counts what the stream moved.
BOOST_AUTO_TEST_CASE(memory_stays_within_the_pool) {
    const std::uint64_t s = fresh_seed("pool");
    Rig rig;
    Run nv(rig, lay(DType::fp32, Tier::nvme, Tier::nvme, s));
    auto c = self_comm();
    zero::Optimizer opt(nv.m, c, rig.engine, rig.pool, options());
    put_all(opt, nv.m, s, 1);
    const zero::StepReport rep = opt.step();
    const mem::PoolStats st = rig.pool.stats();
    BOOST_TEST(st.high_water <= rig.pool.buffers());
    BOOST_TEST(st.high_water >= 2u);
    BOOST_TEST(st.in_use == 0u);
    const std::uint64_t file = nv.m.file_bytes("rank0/param.alt.bin");
    BOOST_TEST(file == nv.m.file_bytes("rank0/exp_avg.alt.bin"));
    BOOST_TEST(rep.bytes_written == 3 * file);  // param (the master), exp_avg, exp_avg_sq
    BOOST_TEST(rep.bytes_read == 4 * file);     // and the fp32 gradient
    BOOST_TEST(rep.grad_bytes_written == file);  // written by put_gradient, read back by the step
    BOOST_TEST(rep.grad_bytes_read == file);     // of bytes_read: what a disk floor leaves out
    BOOST_TEST(rep.chunk_bytes == opt.chunk_bytes());
    BOOST_TEST(rep.chunk_bytes <= rig.pool.buffer_bytes());
    BOOST_TEST(rep.chunks * rep.chunk_bytes >= file);
    BOOST_TEST(rep.seconds >= rep.commit_seconds);
}

BOOST_AUTO_TEST_SUITE_END()
