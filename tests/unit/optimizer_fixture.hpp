// What the tests of zero::Optimizer (test_optimizer.cpp, the equivalences;
// test_optimizer_faults.cpp, faults, scaling, clipping and refusals) share:
// the small model, the io engine and pool, a state committed in a fresh
// folder, the optimizer's options, seeded gradients handed over, the state
// read back, and byte-for-byte and relative comparisons of two states.
#pragma once

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
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace zinf::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using shard::DType;
using shard::Tier;
using Bytes = std::vector<std::byte>;

// 16 tensors; the largest (mlp.c_fc.weight, mlp.c_proj.weight) are 20,736
// elements = 82,944 bytes of fp32, more than one pool buffer.
inline constexpr const char* kModel = "gpt:layers=1,hidden=72,heads=2,vocab=97,seq=13";



inline std::uint64_t fresh_seed(const char* what) {
    const std::uint64_t s = seed(what);
    BOOST_TEST_MESSAGE(what << ": seed " << s << " (replay with ZINF_TEST_SEED=" << s << ")");
    return s;
}

// 8 buffers of 64KiB: an fp32 step streams 4 files (master, moments,
// gradient) with 3 chunks in flight, so each piece is 32KiB and the larger
// partitions are cut in the middle.
inline mem::PoolConfig small_pool() {
    mem::PoolConfig c;
    c.bytes = 8 * 64 * KiB;
    c.buffer = 64 * KiB;
    c.allocator = "host";
    c.lease_timeout = 30s;
    return c;
}

// The io engine and the pool (destroyed first, as it must be).
struct Rig {
    io::Engine engine;
    mem::PinnedPool pool;
    explicit Rig(const io::EngineConfig& ec = {}, const mem::PoolConfig& pc = small_pool())
        : engine(ec), pool(pc, &engine) {}
};

// A state laid out, initialised and committed in a fresh folder under /var/tmp.
struct Run {
    TempDir tmp{"/var/tmp"};
    shard::Manifest m;
    Run(Rig& rig, const shard::LayoutOptions& lo, const char* spec = kModel) {
        m = shard::layout(shard::ModelSpec::parse(spec), lo);
        shard::init(m, tmp.file("state"), rig.engine, rig.pool, {}).commit();
        shard::save_manifest(m, manifest_path());
    }
    std::string manifest_path() const { return m.dir + "/manifest.jsonl"; }
};

inline shard::LayoutOptions lay(DType param_dtype, Tier param_tier, Tier optim_tier, std::uint64_t s) {
    shard::LayoutOptions lo;
    lo.param_dtype = param_dtype;
    lo.param_tier = param_tier;
    lo.optim_tier = optim_tier;
    lo.seed = s;
    return lo;
}

inline comm::Communicator self_comm() { return comm::Communicator(comm::Options{.backend = comm::Backend::self}); }

inline zero::OptimizerOptions options() {
    zero::OptimizerOptions o;
    o.adamw.lr = 1e-2;
    o.adamw.weight_decay = 0.1;
    return o;
}

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Tokens to train on, from a seed: some structure to learn (runs that
// repeat) besides noise. The same seed gives the same tokens on every rank.
inline std::vector<std::uint16_t> make_tokens(std::uint64_t s, std::uint64_t vocab, std::size_t n) {
    std::mt19937_64 rng(mix(s));
    std::vector<std::uint16_t> t(n);
    for (std::size_t i = 0; i < n; ++i)
        t[i] = static_cast<std::uint16_t>(rng() % 4 == 0 ? rng() % vocab : (i * 7 + i / 5) % vocab);
    return t;
}

// The full gradient of tensor t at step k: uniform in [-scale, scale), the
// scale a power of two between 2^-8 and 2^-3 that differs by tensor.
inline std::vector<float> gradient(std::uint64_t s, unsigned k, std::size_t t, std::uint64_t numel) {
    std::mt19937_64 rng(mix(s ^ mix(1000003ull * k + t)));
    const float scale = std::ldexp(1.0f, -3 - static_cast<int>(mix(s + t) % 6));
    std::vector<float> g(numel);
    for (auto& x : g) x = scale * (static_cast<float>(rng() >> 40) * 0x1p-23f - 1.0f);
    return g;
}

// Every tensor's gradient of step k (this rank's part of it) handed over, in
// tensor order or in reverse (as backward produces them). `edit` may change a
// tensor's full gradient first.
inline void put_all(zero::Optimizer& opt, const shard::Manifest& m, std::uint64_t s, unsigned k, bool reverse = false,
                    const std::function<void(std::size_t, std::vector<float>&)>& edit = {}) {
    const std::size_t T = m.tensors.size();
    for (std::size_t i = 0; i < T; ++i) {
        const std::size_t t = reverse ? T - 1 - i : i;
        std::vector<float> g = gradient(s, k, t, m.tensors[t].numel);
        if (edit) edit(t, g);
        const shard::Owned o = shard::owned(m.tensors[t].numel, m.opts.dp, opt.rank());
        opt.put_gradient(t, std::span<const float>(g).subspan(o.first, o.count));
    }
}

// The norm of step k's full gradient (every tensor, every rank's part).
inline double full_norm(const shard::Manifest& m, std::uint64_t s, unsigned k) {
    double sq = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t)
        for (float v : gradient(s, k, t, m.tensors[t].numel)) sq += double(v) * double(v);
    return std::sqrt(sq);
}

// Steps that take every path of the overlapped optimizer with --grad-clip 1,
// each step's gradient scaled to a global norm: clipped while it speculates
// (redone; the read-ahead starts once a rank's own norm is past the clip),
// unclipped after a clipped one (read ahead from its first gradient),
// unclipped and speculated, clipped, clipped after a clipped one (read ahead),
// skipped for overflow after it (read ahead, then unused), unclipped after
// the skip (read ahead), unclipped and speculated.
struct Phase {
    double norm;
    bool overflow;
    bool reads_ahead;  // the step does not speculate: it reads ahead from its first gradient
};
inline constexpr Phase kPhases[] = {{4, false, false}, {0.5, false, true}, {0.5, false, false}, {3, false, false},
                                    {2, false, true},  {2, true, true},    {0.5, false, true},  {0.25, false, false}};

// `opt` through kPhases on m: each phase's gradient is that of the step it
// commits (k = step_count() + 1), handed over in reverse as backward does,
// scaled; an overflow puts an infinity in rank 0's part of the last tensor.
// `settle` passes between the last hand-over and step(), as a backward's
// last layers would. The reports, one a phase.
inline std::vector<zero::StepReport> run_phases(zero::Optimizer& opt, const shard::Manifest& m, std::uint64_t s,
                                                std::chrono::milliseconds settle) {
    std::vector<zero::StepReport> out;
    for (const Phase& ph : kPhases) {
        const unsigned k = static_cast<unsigned>(opt.step_count()) + 1;
        const double f = ph.norm / full_norm(m, s, k);
        put_all(opt, m, s, k, true, [&](std::size_t t, std::vector<float>& g) {
            for (float& x : g) x = static_cast<float>(x * f);
            if (ph.overflow && t + 1 == m.tensors.size()) g[0] = std::numeric_limits<float>::infinity();
        });
        std::this_thread::sleep_for(settle);
        out.push_back(opt.step());
    }
    return out;
}

// The same phases with read-ahead (budget `readahead`) and without overlap,
// on two states alike: every report's norm, clip, overflow and step equal
// to the bit, and the read-ahead used where it must be. The caller compares
// the committed states.
// `disk`: the read-ahead run's disk bandwidths (its reads and writes
// beside each other at depths chosen from them); the reference keeps the
// default depths.
inline void readahead_equals_no_overlap(comm::Communicator& c, Rig& rig, shard::Manifest& ra, shard::Manifest& ref,
                                        std::uint64_t s, std::uint64_t readahead, const std::string& what,
                                        const io::Bandwidth& disk = {}) {
    zero::OptimizerOptions oo = options();
    oo.grad_clip = 1;
    zero::OptimizerOptions ro = oo;
    ro.overlap = true;
    ro.readahead = readahead;
    ro.disk = disk;
    std::vector<zero::StepReport> a, b;
    std::uint64_t taken = 0, state = 0;
    {
        zero::Optimizer opt(ra, c, rig.engine, rig.pool, ro);
        taken = opt.readahead_bytes();
        state = opt.update_read_bytes();
        a = run_phases(opt, ra, s, std::chrono::milliseconds(150));
    }
    {
        zero::Optimizer opt(ref, c, rig.engine, rig.pool, oo);
        b = run_phases(opt, ref, s, std::chrono::milliseconds(0));
    }
    BOOST_TEST(taken > 0u, what << ": read-ahead memory taken");
    BOOST_TEST(taken <= std::min(readahead, state), what << ": " << taken << " bytes, budget " << readahead);
    BOOST_TEST_REQUIRE(a.size() == b.size());
    std::uint64_t used = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string at = what + ", phase " + std::to_string(i + 1);
        BOOST_TEST(std::bit_cast<std::uint64_t>(a[i].grad_norm) == std::bit_cast<std::uint64_t>(b[i].grad_norm),
                   at << ": norm " << a[i].grad_norm << " vs " << b[i].grad_norm);
        BOOST_TEST(a[i].clip == b[i].clip, at);
        BOOST_TEST(a[i].overflow == kPhases[i].overflow, at);
        BOOST_TEST(b[i].overflow == kPhases[i].overflow, at);
        BOOST_TEST(a[i].step == b[i].step, at);
        BOOST_TEST((a[i].clip < 1) == (kPhases[i].norm > 1 && !kPhases[i].overflow), at << ": clip " << a[i].clip);
        BOOST_TEST(a[i].readahead_bytes <= taken, at);
        BOOST_TEST(a[i].readahead_used_bytes <= a[i].readahead_bytes, at);
        if (!kPhases[i].reads_ahead && kPhases[i].norm <= 1)
            BOOST_TEST(a[i].readahead_bytes == 0u, at << ": a speculated step reads nothing ahead");
        if (kPhases[i].overflow) BOOST_TEST(a[i].readahead_used_bytes == 0u, at << ": a skipped step uses nothing");
        BOOST_TEST(b[i].readahead_bytes == 0u, at << ": without overlap nothing is read ahead");
        BOOST_TEST_MESSAGE(at << ": read ahead " << a[i].readahead_bytes << ", used " << a[i].readahead_used_bytes);
        used += a[i].readahead_used_bytes;
    }
    BOOST_TEST(used > 0u, what << ": the update took something from the read-ahead");
}

inline Bytes slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "cannot open " << path);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Bytes out(c.size());
    std::memcpy(out.data(), c.data(), c.size());
    return out;
}

// Every file under the state folder but the gradient scratch, by relative path.
inline std::map<std::string, Bytes> snapshot(const std::string& dir) {
    std::map<std::string, Bytes> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file() && e.path().filename() != "grad.bin")
            out[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
    return out;
}

inline Bytes cat_bytes(const shard::Manifest& m, std::size_t t, const std::string& state, Rig& rig) {
    Bytes out;
    shard::cat(m, t, state, rig.engine, rig.pool, [&](std::span<const std::byte> piece) {
        out.insert(out.end(), piece.begin(), piece.end());
    });
    return out;
}

inline std::vector<float> as_f32(const Bytes& b) {
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

// The first differing byte of two arrays, reported once.
inline bool same_bytes(const Bytes& a, const Bytes& b, const std::string& what) {
    if (a.size() != b.size()) {
        BOOST_ERROR(what << ": " << a.size() << " bytes vs " << b.size());
        return false;
    }
    const auto mm = std::mismatch(a.begin(), a.end(), b.begin());
    if (mm.first == a.end()) return true;
    const std::size_t i = static_cast<std::size_t>(mm.first - a.begin());
    std::size_t n = 0;
    for (std::size_t j = i; j < a.size(); ++j) n += a[j] != b[j];
    BOOST_ERROR(what << ": " << n << " of " << a.size() << " bytes differ, the first at byte " << i << " (0x"
                     << std::hex << static_cast<int>(a[i]) << " vs 0x" << static_cast<int>(b[i]) << std::dec << ")");
    return false;
}

// Every state of every tensor, gathered from the committed files, byte for byte.
inline void same_state(const shard::Manifest& a, const shard::Manifest& b, Rig& rig, const std::string& what) {
    BOOST_TEST_REQUIRE((a.states == b.states), what);
    BOOST_TEST_REQUIRE(a.tensors.size() == b.tensors.size(), what);
    for (const std::string& state : a.states)
        for (std::size_t t = 0; t < a.tensors.size(); ++t)
            same_bytes(cat_bytes(a, t, state, rig), cat_bytes(b, t, state, rig),
                       what + ": " + state + " of " + a.tensors[t].name);
}

// The fp32 states within `rel` of each tensor's largest magnitude, element by
// element. (Not of each element's own magnitude: the moments and weights are
// sums of terms of both signs, and where they nearly cancel a last-bit
// difference in a term is a large fraction of the small result.)
inline void close_state(const shard::Manifest& a, const shard::Manifest& b, Rig& rig, double rel,
                        const std::string& what) {
    for (const std::string& state : a.states) {
        if (shard::state_dtype(a.opts, state) != DType::fp32) continue;
        for (std::size_t t = 0; t < a.tensors.size(); ++t) {
            const auto x = as_f32(cat_bytes(a, t, state, rig)), y = as_f32(cat_bytes(b, t, state, rig));
            BOOST_TEST_REQUIRE(x.size() == y.size());
            double scale = 0;
            for (std::size_t i = 0; i < x.size(); ++i)
                scale = std::max({scale, std::abs(double(x[i])), std::abs(double(y[i]))});
            std::size_t bad = 0, first = 0;
            double worst = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double d = std::abs(double(x[i]) - double(y[i]));
                worst = std::max(worst, d);
                if (d > rel * scale && !bad++) first = i;
            }
            BOOST_TEST(bad == 0u, what << ": " << state << " of " << a.tensors[t].name << ": " << bad
                                        << " elements differ by more than " << rel << " of the largest, " << scale
                                        << " (first at " << first << ", worst " << worst << ")");
        }
    }
}

inline void verify_from_disk(const std::string& manifest_path, Rig& rig, std::uint64_t step, const std::string& what) {
    shard::Manifest back;
    BOOST_REQUIRE_NO_THROW(back = shard::read_manifest_file(manifest_path));
    try {
        const auto r = shard::verify(back, rig.engine, rig.pool, {});
        BOOST_TEST(r.partitions == back.parts.size(), what);
    } catch (const std::exception& e) {
        BOOST_ERROR(what << ": verify: " << e.what());
    }
    std::size_t off = 0;
    for (const auto& p : back.parts) off += p.step != step;
    BOOST_TEST(off == 0u, what << ": " << off << " records not at step " << step);
}

}  // namespace zinf::testing
