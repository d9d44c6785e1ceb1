// MPI tests of libzinf comm and zero, run under mpirun (-np 2, 3, 4; every
// rank runs every case in the same order, so the collectives match):
// every operation against a computed expectation, blocking and not, for
// element counts 1, dp-1, dp, odd and large; in-place forms; uneven blocks
// (counts, some zero); buckets equal to their buffers done one by one; the
// ZeRO partitioned gather and reduce-scatter (padding never read nor
// written); partitions written by zinf-shard init gathered back equal to
// zinf-shard cat; non-blocking operations overlapping computation and
// completing in order; bad buffers refused alike on every rank.
//
// Values are small integers from one seed every rank agrees on (rank 0's,
// broadcast), so every sum is exact and every average is the correctly
// rounded quotient of an exact sum. No BOOST_REQUIRE sits where a rank could
// leave a case early: a rank that skipped a collective would hang the others
// until the communicator's timeout.
#define BOOST_TEST_MODULE mpi_comm
#include "comm_testing.hpp"
#include "testing.hpp"

#include <zinf/comm.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>
#include <zinf/shard.hpp>
#include <zinf/util.hpp>
#include <zinf/zero.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace zinf::testing;
using namespace std::chrono_literals;
namespace comm = zinf::comm;
namespace zero = zinf::zero;
namespace shard = zinf::shard;
namespace utf = boost::unit_test;
using comm::DType;
using comm::Kind;
using comm::Reduce;
using Bytes = std::vector<std::byte>;

namespace {

// ---------------------------------------------------------------------------
// One communicator for the whole binary: MPI starts once per process. Its
// timeout is ZINF_COMM_TIMEOUT when set, else 60 s, so a bug fails a case
// instead of hanging the job. (One buffer of equal blocks goes through MPI's
// blocking call under a watchdog that ends the process at the deadline;
// buckets and uneven blocks throw comm::Timeout.)
std::chrono::milliseconds world_timeout() {
    const char* env = std::getenv("ZINF_COMM_TIMEOUT");
    return env && *env ? comm::default_timeout() : std::chrono::milliseconds(60s);
}

comm::Options world_options() {
    comm::Options o;
    o.backend = comm::Backend::mpi;
    o.memory = comm::Memory::host;
    o.timeout = world_timeout();
    return o;
}

comm::Communicator& world() {
    static comm::Communicator c(world_options());
    return c;
}

int dp() { return world().size(); }
int me() { return world().rank(); }

std::string where() { return "rank " + std::to_string(me()) + " of " + std::to_string(dp()); }


// Rank 0's fresh seed (printed there), the same on every rank.
std::uint64_t shared_seed(const char* what) {
    std::uint64_t s = me() == 0 ? seed(what) : 0;
    world().broadcast(std::as_writable_bytes(std::span(&s, 1)), DType::i64, 0);
    return s;
}

std::string broadcast_string(std::string s, int root) {
    std::int64_t n = static_cast<std::int64_t>(s.size());
    world().broadcast(std::as_writable_bytes(std::span(&n, 1)), DType::i64, root);
    s.resize(static_cast<std::size_t>(n));
    world().broadcast(std::as_writable_bytes(std::span(s.data(), s.size())), DType::u8, root);
    return s;
}

// Whether `ok` holds on every rank (a collective: every rank must call it).
bool all_ranks(bool ok) {
    std::int32_t v = ok ? 1 : 0, all = 0;
    world().allreduce(std::as_bytes(std::span(&v, 1)), std::as_writable_bytes(std::span(&all, 1)), DType::i32,
                      Reduce::sum);
    return all == dp();
}

// ---------------------------------------------------------------------------
// Elements: small integers keyed by (seed, rank, index), chosen per dtype so
// that dp of them sum exactly (bf16 holds integers to 256, f32 to 2^24).
constexpr DType kAllTypes[] = {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8};
constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f64};

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct Gen {
    DType t;
    std::uint64_t seed;
    std::int64_t operator()(int rank, std::uint64_t i) const {
        const std::uint64_t h = mix(seed ^ mix((static_cast<std::uint64_t>(rank) + 1) * 0x632be59bd9b4e019ull + i));
        switch (t) {
        case DType::u8: return static_cast<std::int64_t>(h % 61);                 // 4 of them < 256
        case DType::bf16: return static_cast<std::int64_t>(h % 33) - 16;          // |sum| <= 64
        case DType::f32: return static_cast<std::int64_t>(h % 2001) - 1000;
        case DType::i32: return static_cast<std::int64_t>(h % (1u << 21)) - (1 << 20);
        case DType::f64:
        case DType::i64: return static_cast<std::int64_t>(h % (1ull << 40)) - (1ll << 39);  // sums < 2^53
        }
        return 0;
    }
};

// The average of dp values whose exact (integer) sum is `sum`: the correctly
// rounded quotient in the dtype (bf16: rounded from f32, where it is summed).
void put_avg(DType t, std::byte* p, std::int64_t sum, int n) {
    switch (t) {
    case DType::f32: {
        const float x = static_cast<float>(sum) / static_cast<float>(n);
        std::memcpy(p, &x, 4);
        return;
    }
    case DType::f64: {
        const double x = static_cast<double>(sum) / static_cast<double>(n);
        std::memcpy(p, &x, 8);
        return;
    }
    case DType::bf16: {
        const std::uint16_t x = zinf::to_bf16(static_cast<float>(sum) / static_cast<float>(n));
        std::memcpy(p, &x, 2);
        return;
    }
    default: BOOST_ERROR("avg of " << comm::name(t) << " has no expectation");
    }
}

std::size_t es(DType t) { return comm::dtype_bytes(t); }

// Elements [first, first + n) of `rank`'s data.
Bytes data(const Gen& g, int rank, std::uint64_t first, std::size_t n) {
    Bytes out(n * es(g.t));
    for (std::size_t j = 0; j < n; ++j) put_int(g.t, out.data() + j * es(g.t), g(rank, first + j));
    return out;
}

// Elements [first, first + n) of the reduction of every rank's data.
Bytes reduced(const Gen& g, Reduce red, std::uint64_t first, std::size_t n) {
    Bytes out(n * es(g.t));
    const int size = dp();
    for (std::size_t j = 0; j < n; ++j) {
        std::int64_t sum = 0, mx = std::numeric_limits<std::int64_t>::min();
        for (int r = 0; r < size; ++r) {
            const std::int64_t v = g(r, first + j);
            sum += v;
            mx = std::max(mx, v);
        }
        std::byte* p = out.data() + j * es(g.t);
        if (red == Reduce::sum) put_int(g.t, p, sum);
        else if (red == Reduce::max) put_int(g.t, p, mx);
        else put_avg(g.t, p, sum, size);
    }
    return out;
}

// A byte pattern no computed value has: NaN payloads for floats.
Bytes sentinel(DType t, std::size_t n) {
    Bytes out(n * es(t));
    for (std::size_t j = 0; j < n; ++j) {
        std::byte* p = out.data() + j * es(t);
        switch (t) {
        case DType::f32: {
            const std::uint32_t x = 0x7fc0dead;
            std::memcpy(p, &x, 4);
            break;
        }
        case DType::f64: {
            const std::uint64_t x = 0x7ff8deadbeef0badull;
            std::memcpy(p, &x, 8);
            break;
        }
        case DType::bf16: {
            const std::uint16_t x = 0x7fc5;
            std::memcpy(p, &x, 2);
            break;
        }
        case DType::i32: {
            const std::uint32_t x = 0x5eadbeef;
            std::memcpy(p, &x, 4);
            break;
        }
        case DType::i64: {
            const std::uint64_t x = 0x5eadbeefcafef00dull;
            std::memcpy(p, &x, 8);
            break;
        }
        case DType::u8: *p = std::byte{0xee}; break;
        }
    }
    return out;
}

std::string element_hex(std::span<const std::byte> b) {
    std::ostringstream os;
    os << "0x";
    for (std::size_t k = b.size(); k-- > 0;) {
        char h[3];
        std::snprintf(h, sizeof h, "%02x", static_cast<unsigned>(b[k]));
        os << h;
    }
    return os.str();
}

// One check for a whole buffer: equal bytes, else how many elements differ
// and the first few.
bool same(std::span<const std::byte> got, std::span<const std::byte> want, DType t, const std::string& what) {
    if (got.size() != want.size()) {
        BOOST_ERROR(where() << ": " << what << ": " << got.size() << " bytes, want " << want.size());
        return false;
    }
    const std::size_t e = es(t), n = got.size() / e;
    std::size_t bad = 0;
    std::ostringstream first;
    if (!got.empty() && std::memcmp(got.data(), want.data(), got.size()) != 0) {
        for (std::size_t i = 0; i < n; ++i) {
            if (std::memcmp(got.data() + i * e, want.data() + i * e, e) == 0) continue;
            if (bad++ < 3)
                first << " [" << i << "] got " << element_hex(got.subspan(i * e, e)) << " want "
                      << element_hex(want.subspan(i * e, e)) << ";";
        }
    }
    BOOST_TEST(bad == 0u, where() << ": " << what << " (" << comm::name(t) << ", " << n << " elements): " << bad
                                  << " elements differ:" << first.str());
    return bad == 0;
}

std::span<const std::byte> cb(const Bytes& b) { return {b.data(), b.size()}; }
std::span<std::byte> wb(Bytes& b) { return {b.data(), b.size()}; }

// How a case waits: blocking calls, or started and waited for (polling
// test() first, so both ends of the handle are used).
enum class Mode { blocking, nonblocking };
const char* mode_name(Mode m) { return m == Mode::blocking ? "blocking" : "non-blocking"; }

void finish(comm::Handle h) {
    BOOST_TEST(static_cast<bool>(h));
    while (!h.test()) std::this_thread::yield();
    h.wait();  // complete already: returns at once
}

void run_op(Mode m, Kind k, std::span<const comm::Buffer> bufs, DType t, Reduce red = Reduce::sum, int root = 0) {
    if (m == Mode::blocking)
        world().run(k, bufs, t, red, root);
    else
        finish(world().start(k, bufs, t, red, root));
}

// Element counts of the basic cases: 1, dp-1, dp, odd, large (~1M in all).
constexpr std::size_t kLarge = (1u << 20) + 1;
std::vector<std::size_t> sizes() {
    std::vector<std::size_t> v{1};
    if (dp() > 2) v.push_back(static_cast<std::size_t>(dp() - 1));
    if (dp() > 1) v.push_back(static_cast<std::size_t>(dp()));
    v.push_back(1001);
    v.push_back(kLarge);
    return v;
}
// sizes() for type t: the large size (the chunked paths, kChunkBytes / the
// element's size per message) only for f32, bf16 and i64, element sizes 4,
// 2 and 8; the small sizes check every type's arithmetic. (Each type at the
// large size was a third of mpi_comm's time at np 4.)
std::vector<std::size_t> sizes(DType t) {
    std::vector<std::size_t> v = sizes();
    if (t != DType::f32 && t != DType::bf16 && t != DType::i64) v.pop_back();
    return v;
}
// A rank's block when `n` is the whole: n itself when small, ~n/dp when large.
std::size_t block_of(std::size_t n) { return n < 100000 ? n : n / static_cast<std::size_t>(dp()) | 1u; }

// Per-rank counts for uneven blocks, some zero (rank 0's and the last
// rank's among them when dp > 2), the rest random in [1, max].
std::vector<std::uint64_t> uneven(std::mt19937_64& rng, std::uint64_t max) {
    std::vector<std::uint64_t> c(static_cast<std::size_t>(dp()));
    for (auto& x : c) x = 1 + rng() % max;
    if (dp() > 1) c[static_cast<std::size_t>(rng() % c.size())] = 0;
    if (dp() > 2) c.front() = 0, c.back() = 0;
    if (dp() > 2 && std::all_of(c.begin(), c.end(), [](auto x) { return x == 0; })) c[1] = 3;
    return c;
}

std::uint64_t first_of(const std::vector<std::uint64_t>& counts, int rank) {
    std::uint64_t f = 0;
    for (int r = 0; r < rank; ++r) f += counts[static_cast<std::size_t>(r)];
    return f;
}
std::uint64_t total_of(const std::vector<std::uint64_t>& counts) { return first_of(counts, dp()); }

// What an allgather of every rank's data (rank r sends g(r, 0..c_r)) gives.
Bytes gathered(const Gen& g, const std::vector<std::uint64_t>& counts) {
    Bytes out;
    for (int r = 0; r < dp(); ++r) {
        const Bytes b = data(g, r, 0, counts[static_cast<std::size_t>(r)]);
        out.insert(out.end(), b.begin(), b.end());
    }
    return out;
}

std::vector<std::uint64_t> equal_counts(std::uint64_t n) { return std::vector<std::uint64_t>(dp(), n); }

// Runs `fn`, expecting InternalError; returns its what() ("" and a failure otherwise).
template <class F>
std::string internal_error(F fn, const std::string& context) {
    try {
        fn();
    } catch (const zinf::InternalError& e) {
        return e.what();
    } catch (const std::exception& e) {
        BOOST_ERROR(where() << ": " << context << ": wrong exception type: " << e.what());
        return "";
    }
    BOOST_ERROR(where() << ": " << context << ": no exception");
    return "";
}

}  // namespace

// ===========================================================================
BOOST_AUTO_TEST_SUITE(basics)

BOOST_AUTO_TEST_CASE(rank_size_and_describe) {
    comm::Communicator& w = world();
    const auto env = [](const char* k, int dflt) {
        const char* v = std::getenv(k);
        return v && *v ? std::atoi(v) : dflt;
    };
    BOOST_TEST(w.size() == env("OMPI_COMM_WORLD_SIZE", 1));
    BOOST_TEST(w.rank() == env("OMPI_COMM_WORLD_RANK", 0));
    BOOST_TEST(w.local_rank() == env("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    BOOST_TEST(w.local_size() == env("OMPI_COMM_WORLD_LOCAL_SIZE", 1));
    BOOST_TEST(w.rank() >= 0);
    BOOST_TEST(w.rank() < w.size());
    BOOST_TEST(w.local_rank() < w.local_size());
    BOOST_TEST((w.backend() == comm::Backend::mpi));
    BOOST_TEST((w.memory() == comm::Memory::host));
    BOOST_TEST(w.timeout().count() == world_timeout().count());
    const std::string d = w.describe();
    BOOST_TEST_MESSAGE(d);
    BOOST_TEST(d.starts_with("mpi"), d);
    BOOST_TEST(contains(d, "rank " + std::to_string(w.rank()) + " of " + std::to_string(w.size())), d);
    BOOST_TEST(contains(d, "MPI_THREAD_"), d);
    // Every rank is a different one: the gathered ranks are 0 .. size-1.
    std::int32_t mine = w.rank();
    std::vector<std::int32_t> all(static_cast<std::size_t>(w.size()), -1);
    w.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)), DType::i32);
    for (int r = 0; r < w.size(); ++r) BOOST_TEST(all[static_cast<std::size_t>(r)] == r);
    BOOST_TEST(comm::compiled(comm::Backend::mpi));
}

BOOST_AUTO_TEST_CASE(barrier_blocking_and_not) {
    // A barrier orders: what rank 0 writes before it, every rank reads after.
    std::optional<TempDir> tmp;  // rank 0's, removed after the last barrier
    if (me() == 0) {
        try {
            tmp.emplace();
        } catch (const std::exception& e) {
            BOOST_ERROR("temporary directory: " << e.what());  // the others still get the (empty) path
        }
    }
    const std::string path = broadcast_string(tmp ? tmp->file("flag") : "", 0);
    for (Mode m : {Mode::blocking, Mode::nonblocking}) {
        if (me() == 0) {
            std::FILE* f = std::fopen(path.c_str(), "w");
            BOOST_TEST(f != nullptr);
            if (f) std::fputs(mode_name(m), f), std::fclose(f);
        }
        if (m == Mode::blocking) world().barrier();
        else finish(world().ibarrier());
        std::string got;
        if (std::FILE* f = std::fopen(path.c_str(), "r")) {
            char buf[64] = {};
            got = std::fgets(buf, sizeof buf, f) ? buf : "";
            std::fclose(f);
        }
        BOOST_TEST(got == mode_name(m), where());
        world().barrier();  // every rank has read before rank 0 writes again
    }
    world().barrier();  // before rank 0 removes the folder
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 1. Every operation against its expectation, every dtype it takes.
BOOST_AUTO_TEST_SUITE(operations)

BOOST_AUTO_TEST_CASE(allgather_equal_blocks) {
    const std::uint64_t s = shared_seed("allgather");
    for (DType t : kAllTypes)
        for (std::size_t n : sizes(t))
            for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                const std::size_t b = block_of(n);
                const Gen g{t, s + n};
                const Bytes send = data(g, me(), 0, b);
                Bytes recv = sentinel(t, b * dp());
                if (m == Mode::blocking) world().allgather(cb(send), wb(recv), t);
                else finish(world().iallgather(cb(send), wb(recv), t));
                same(recv, gathered(g, equal_counts(b)), t,
                     "allgather of " + std::to_string(b) + " per rank, " + mode_name(m));
            }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_sum_avg_max) {
    const std::uint64_t s = shared_seed("reduce-scatter");
    for (DType t : kAllTypes)
        for (std::size_t n : sizes(t)) {
            const std::size_t b = block_of(n);
            const Gen g{t, s + n};
            const Bytes send = data(g, me(), 0, b * dp());
            for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
                if (red == Reduce::avg && !is_float(t)) continue;
                const Bytes want = reduced(g, red, b * me(), b);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    Bytes recv = sentinel(t, b);
                    if (m == Mode::blocking) world().reduce_scatter(cb(send), wb(recv), t, red);
                    else finish(world().ireduce_scatter(cb(send), wb(recv), t, red));
                    same(recv, want, t,
                         "reduce-scatter " + std::string(comm::name(red)) + " of " + std::to_string(b) +
                             " per rank, " + mode_name(m));
                }
            }
        }
}

BOOST_AUTO_TEST_CASE(allreduce_sum_avg_max) {
    const std::uint64_t s = shared_seed("allreduce");
    for (DType t : kAllTypes)
        for (std::size_t n : sizes(t)) {
            const Gen g{t, s + n};
            const Bytes send = data(g, me(), 0, n);
            for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
                if (red == Reduce::avg && !is_float(t)) continue;
                const Bytes want = reduced(g, red, 0, n);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    Bytes recv = sentinel(t, n);
                    if (m == Mode::blocking) world().allreduce(cb(send), wb(recv), t, red);
                    else finish(world().iallreduce(cb(send), wb(recv), t, red));
                    same(recv, want, t,
                         "allreduce " + std::string(comm::name(red)) + " of " + std::to_string(n) + ", " +
                             mode_name(m));
                }
            }
        }
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root) {
    const std::uint64_t s = shared_seed("broadcast");
    for (DType t : kAllTypes)
        for (std::size_t n : sizes(t))
            for (int root = 0; root < dp(); ++root) {
                const Gen g{t, s + n};
                const Bytes want = data(g, root, 0, n);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    // The root holds its data; the others something else.
                    Bytes buf = me() == root ? want : data(g, me() + dp(), 0, n);
                    if (m == Mode::blocking) world().broadcast(wb(buf), t, root);
                    else finish(world().ibroadcast(wb(buf), t, root));
                    same(buf, want, t,
                         "broadcast of " + std::to_string(n) + " from " + std::to_string(root) + ", " + mode_name(m));
                }
            }
}

// bare() is the library's own call with nothing in between: the same results.
BOOST_AUTO_TEST_CASE(bare_calls_agree) {
    const std::uint64_t s = shared_seed("bare");
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
        const std::size_t b = 777;
        const Gen g{t, s};
        const Bytes mine = data(g, me(), 0, b), whole = data(g, me(), 0, b * dp());
        Bytes recv = sentinel(t, b * dp());
        world().bare(Kind::allgather, {cb(mine), wb(recv), {}}, t);
        same(recv, gathered(g, equal_counts(b)), t, "bare allgather");
        for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
            if (red == Reduce::avg && !is_float(t)) continue;
            Bytes part = sentinel(t, b);
            world().bare(Kind::reduce_scatter, {cb(whole), wb(part), {}}, t, red);
            same(part, reduced(g, red, b * me(), b), t, "bare reduce-scatter " + std::string(comm::name(red)));
            Bytes all = sentinel(t, b * dp());
            world().bare(Kind::allreduce, {cb(whole), wb(all), {}}, t, red);
            same(all, reduced(g, red, 0, b * dp()), t, "bare allreduce " + std::string(comm::name(red)));
        }
        const int root = dp() - 1;
        Bytes buf = me() == root ? mine : sentinel(t, b);
        world().bare(Kind::broadcast, {{}, wb(buf), {}}, t, Reduce::sum, root);
        same(buf, data(g, root, 0, b), t, "bare broadcast");
        world().bare(Kind::barrier, {}, DType::u8);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 2. In place: allgather with this rank's block inside recv, allreduce with
// send == recv (one buffer, and a bucket).
BOOST_AUTO_TEST_SUITE(in_place)

BOOST_AUTO_TEST_CASE(allgather_from_own_block_of_recv) {
    const std::uint64_t s = shared_seed("allgather in place");
    std::mt19937_64 rng(s);
    for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::u8})
        for (std::size_t n : sizes(t))
            for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                const std::size_t b = block_of(n);
                const Gen g{t, s + n};
                const Bytes mine = data(g, me(), 0, b);
                Bytes recv = sentinel(t, b * dp());
                if (!mine.empty()) std::memcpy(recv.data() + b * me() * es(t), mine.data(), mine.size());
                const std::span<const std::byte> send(recv.data() + b * me() * es(t), b * es(t));
                if (m == Mode::blocking) world().allgather(send, wb(recv), t);
                else finish(world().iallgather(send, wb(recv), t));
                same(recv, gathered(g, equal_counts(b)), t,
                     "in-place allgather of " + std::to_string(b) + ", " + mode_name(m));
            }
    // Uneven blocks in place, and a bucket whose buffers are all in place.
    for (Mode m : {Mode::blocking, Mode::nonblocking}) {
        std::vector<Gen> gens;
        std::vector<std::vector<std::uint64_t>> counts;
        std::vector<Bytes> recvs;
        std::vector<comm::Buffer> bufs;
        const DType t = DType::f32;
        for (int k = 0; k < 4; ++k) {
            gens.push_back({t, s + 100 + k});
            counts.push_back(k % 2 ? uneven(rng, 1000) : equal_counts(2 * k + 1));
        }
        for (int k = 0; k < 4; ++k) {
            recvs.push_back(sentinel(t, total_of(counts[k])));
            const Bytes mine = data(gens[k], me(), 0, counts[k][me()]);
            std::byte* at = recvs[k].data() + first_of(counts[k], me()) * es(t);
            // A rank may own no elements: memcpy from an empty vector's null
            // data() is undefined even for 0 bytes (UBSan).
            if (!mine.empty()) std::memcpy(at, mine.data(), mine.size());
        }
        for (int k = 0; k < 4; ++k) {
            std::byte* at = recvs[k].data() + first_of(counts[k], me()) * es(t);
            bufs.push_back({std::span<const std::byte>(at, counts[k][me()] * es(t)), wb(recvs[k]),
                            k % 2 ? counts[k] : std::vector<std::uint64_t>{}});
        }
        // One by one (single buffers: MPI_IN_PLACE), then the whole bucket.
        for (int k = 0; k < 4; ++k) {
            run_op(m, Kind::allgather, std::span(&bufs[k], 1), t);
            same(recvs[k], gathered(gens[k], counts[k]), t,
                 "in-place allgather, buffer " + std::to_string(k) + ", " + mode_name(m));
        }
        for (int k = 0; k < 4; ++k) {  // own blocks stay; the others' are wiped (same storage)
            const Bytes keep(bufs[k].send.begin(), bufs[k].send.end()), wiped = sentinel(t, total_of(counts[k]));
            std::copy(wiped.begin(), wiped.end(), recvs[k].begin());
            if (!keep.empty())
                std::memcpy(recvs[k].data() + first_of(counts[k], me()) * es(t), keep.data(), keep.size());
        }
        run_op(m, Kind::allgather, bufs, t);
        for (int k = 0; k < 4; ++k)
            same(recvs[k], gathered(gens[k], counts[k]), t,
                 "in-place bucket allgather, buffer " + std::to_string(k) + ", " + mode_name(m));
    }
}

BOOST_AUTO_TEST_CASE(allreduce_with_send_equal_to_recv) {
    const std::uint64_t s = shared_seed("allreduce in place");
    for (DType t : kAllTypes)
        for (std::size_t n : sizes())
            for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
                if (red == Reduce::avg && !is_float(t)) continue;
                if (n == kLarge && t != DType::f32 && t != DType::bf16) continue;
                const Gen g{t, s + n};
                const Bytes want = reduced(g, red, 0, n);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    Bytes buf = data(g, me(), 0, n);
                    if (m == Mode::blocking) world().allreduce(cb(buf), wb(buf), t, red);
                    else finish(world().iallreduce(cb(buf), wb(buf), t, red));
                    same(buf, want, t,
                         "in-place allreduce " + std::string(comm::name(red)) + " of " + std::to_string(n) + ", " +
                             mode_name(m));
                }
            }
    // A bucket, every buffer in place.
    for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max})
        for (Mode m : {Mode::blocking, Mode::nonblocking}) {
            const DType t = DType::bf16;
            const std::size_t ns[] = {1, 33, 1001, 4097};
            std::vector<Bytes> bufs;
            std::vector<comm::Buffer> bucket;
            for (std::size_t k = 0; k < std::size(ns); ++k) bufs.push_back(data(Gen{t, s + k}, me(), 0, ns[k]));
            for (auto& b : bufs) bucket.push_back({cb(b), wb(b), {}});
            run_op(m, Kind::allreduce, bucket, t, red);
            for (std::size_t k = 0; k < std::size(ns); ++k)
                same(bufs[k], reduced(Gen{t, s + k}, red, 0, ns[k]), t,
                     "in-place bucket allreduce " + std::string(comm::name(red)) + ", buffer " + std::to_string(k));
        }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 3. Uneven blocks: Buffer::counts, some ranks with none.
BOOST_AUTO_TEST_SUITE(uneven_blocks)

BOOST_AUTO_TEST_CASE(allgather_and_reduce_scatter_with_counts) {
    const std::uint64_t s = shared_seed("uneven");
    std::mt19937_64 rng(s);
    std::vector<std::vector<std::uint64_t>> shapes;
    for (int k = 0; k < 3; ++k) shapes.push_back(uneven(rng, 1 + rng() % 2000));
    shapes.push_back(uneven(rng, 300000));                              // large
    shapes.push_back(equal_counts(5));                                  // equal, given as counts
    shapes.push_back(std::vector<std::uint64_t>(dp(), 0));              // nothing at all
    {
        std::vector<std::uint64_t> one(dp(), 0);                        // one rank holds everything
        one[static_cast<std::size_t>(dp() - 1)] = 1001;
        shapes.push_back(one);
    }
    for (std::size_t k = 0; k < shapes.size(); ++k) {
        const auto& counts = shapes[k];
        std::string shape = "counts {";
        for (auto c : counts) shape += " " + std::to_string(c);
        shape += " }";
        for (DType t : kAllTypes) {
            const Gen g{t, s + k};
            for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                const Bytes mine = data(g, me(), 0, counts[me()]);
                Bytes recv = sentinel(t, total_of(counts));
                const comm::Buffer b{cb(mine), wb(recv), counts};
                run_op(m, Kind::allgather, std::span(&b, 1), t);
                same(recv, gathered(g, counts), t, "allgather, " + shape + ", " + mode_name(m));
            }
            const Bytes whole = data(g, me(), 0, total_of(counts));
            for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
                if (red == Reduce::avg && !is_float(t)) continue;
                const Bytes want = reduced(g, red, first_of(counts, me()), counts[me()]);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    Bytes part = sentinel(t, counts[me()]);
                    const comm::Buffer b{cb(whole), wb(part), counts};
                    run_op(m, Kind::reduce_scatter, std::span(&b, 1), t, red);
                    same(part, want, t,
                         "reduce-scatter " + std::string(comm::name(red)) + ", " + shape + ", " + mode_name(m));
                }
            }
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 4. A bucket gives exactly the bytes of its buffers done one by one.
BOOST_AUTO_TEST_SUITE(coalesced)

namespace {

struct Bucket {
    DType t;
    std::vector<Gen> gens;
    std::vector<std::vector<std::uint64_t>> counts;  // per buffer; empty = equal blocks
    std::vector<std::size_t> n;                      // per buffer: block (allgather, rs) or length
    std::vector<Bytes> sends, recvs;

    std::vector<comm::Buffer> buffers() {
        std::vector<comm::Buffer> out;
        for (std::size_t k = 0; k < sends.size(); ++k) out.push_back({cb(sends[k]), wb(recvs[k]), counts[k]});
        return out;
    }
};

// Buffers of odd sizes (and, with `with_counts`, some of uneven blocks).
Bucket make_bucket(Kind kind, DType t, std::uint64_t s, bool with_counts, int root) {
    static constexpr std::size_t kOdd[] = {1, 7, 33, 1001, 4099, 65537};
    std::mt19937_64 rng(s);
    Bucket b{t, {}, {}, {}, {}, {}};
    for (std::size_t k = 0; k < std::size(kOdd); ++k) {
        const Gen g{t, s + 7 * k};
        const std::size_t n = kOdd[k];
        std::vector<std::uint64_t> counts;
        if (with_counts && k % 2 == 1) counts = uneven(rng, 2 * n);
        b.gens.push_back(g);
        b.counts.push_back(counts);
        b.n.push_back(n);
        const auto c = counts.empty() ? equal_counts(n) : counts;
        switch (kind) {
        case Kind::allgather:
            b.sends.push_back(data(g, me(), 0, c[me()]));
            b.recvs.push_back(sentinel(t, total_of(c)));
            break;
        case Kind::reduce_scatter:
            b.sends.push_back(data(g, me(), 0, total_of(c)));
            b.recvs.push_back(sentinel(t, c[me()]));
            break;
        case Kind::allreduce:
            b.sends.push_back(data(g, me(), 0, n));
            b.recvs.push_back(sentinel(t, n));
            break;
        case Kind::broadcast:
            b.sends.emplace_back();
            b.recvs.push_back(me() == root ? data(g, root, 0, n) : sentinel(t, n));
            break;
        case Kind::barrier: break;
        }
    }
    return b;
}

void coalesced_case(Kind kind, DType t, Reduce red, bool with_counts, int root, std::uint64_t s) {
    const std::string what = std::string(comm::name(kind)) + (kind == Kind::reduce_scatter || kind == Kind::allreduce
                                                                   ? " " + std::string(comm::name(red))
                                                                   : "") +
                             (with_counts ? " with counts" : "") +
                             (kind == Kind::broadcast ? " from " + std::to_string(root) : "");
    Bucket single = make_bucket(kind, t, s, with_counts, root);
    auto bufs = single.buffers();
    for (std::size_t k = 0; k < bufs.size(); ++k) world().run(kind, std::span(&bufs[k], 1), t, red, root);
    // The one-by-one results are right...
    for (std::size_t k = 0; k < bufs.size(); ++k) {
        const Gen& g = single.gens[k];
        const auto c = single.counts[k].empty() ? equal_counts(single.n[k]) : single.counts[k];
        Bytes want;
        switch (kind) {
        case Kind::allgather: want = gathered(g, c); break;
        case Kind::reduce_scatter: want = reduced(g, red, first_of(c, me()), c[me()]); break;
        case Kind::allreduce: want = reduced(g, red, 0, single.n[k]); break;
        case Kind::broadcast: want = data(g, root, 0, single.n[k]); break;
        case Kind::barrier: break;
        }
        same(single.recvs[k], want, t, what + ", buffer " + std::to_string(k) + " alone");
    }
    // ...and the bucket, through run and through start, gives the same bytes.
    for (Mode m : {Mode::blocking, Mode::nonblocking}) {
        Bucket together = make_bucket(kind, t, s, with_counts, root);
        run_op(m, kind, together.buffers(), t, red, root);
        for (std::size_t k = 0; k < bufs.size(); ++k)
            same(together.recvs[k], single.recvs[k], t,
                 what + ", buffer " + std::to_string(k) + " in a bucket (" + mode_name(m) + ")");
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(bucket_equals_one_by_one) {
    const std::uint64_t s = shared_seed("coalesced");
    for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::u8}) {
        for (bool counts : {false, true}) coalesced_case(Kind::allgather, t, Reduce::sum, counts, 0, s);
        for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
            if (red == Reduce::avg && !is_float(t)) continue;
            for (bool counts : {false, true}) coalesced_case(Kind::reduce_scatter, t, red, counts, 0, s + 1);
            coalesced_case(Kind::allreduce, t, red, false, 0, s + 2);
        }
        for (int root = 0; root < dp(); ++root) coalesced_case(Kind::broadcast, t, Reduce::sum, false, root, s + 3);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 4b. Reduce-scatter sums in rank order. Values here are random floats of
// mixed magnitudes, so sums round and the order of summation shows in the
// bits: the reference folds every rank's value left to right, rank 0 first,
// in the dtype itself (f32: a float sum; f64: a double sum; bf16: each step
// in f32 rounded to bf16, as the MPI backend has always reduced bf16), and
// the result must equal it byte for byte, whatever the blocks and buckets.
BOOST_AUTO_TEST_SUITE(rank_order)

namespace {

// Random values in +-[2^-10, 2^11), keyed by (seed, rank, index).
struct Mixed {
    DType t;
    std::uint64_t seed;
    double operator()(int rank, std::uint64_t i) const {
        const std::uint64_t h = mix(seed ^ mix((static_cast<std::uint64_t>(rank) + 1) * 0x2545f4914f6cdd1dull + i));
        const std::uint64_t h2 = mix(h);
        const double v = std::ldexp(1.0 + static_cast<double>(h >> 12) * 0x1p-52, static_cast<int>(h2 % 21) - 10);
        return (h2 >> 63) ? -v : v;
    }
};

void put_value(DType t, std::byte* p, double v) {
    switch (t) {
    case DType::f32: {
        const auto x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        return;
    }
    case DType::f64: std::memcpy(p, &v, 8); return;
    case DType::bf16: {
        const std::uint16_t x = zinf::to_bf16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        return;
    }
    default: BOOST_ERROR("no mixed values of " << comm::name(t));
    }
}

Bytes mixed_data(const Mixed& g, int rank, std::uint64_t first, std::size_t n) {
    Bytes out(n * es(g.t));
    for (std::size_t j = 0; j < n; ++j) put_value(g.t, out.data() + j * es(g.t), g(rank, first + j));
    return out;
}

// One element of every rank, folded in rank order 0..dp-1 in dtype T (the
// values as stored: f32 and f64 exactly, bf16 after rounding).
template <class T>
T fold_ranks(const Mixed& g, Reduce red, std::uint64_t i) {
    T acc = static_cast<T>(g(0, i));
    for (int r = 1; r < dp(); ++r) {
        const T x = static_cast<T>(g(r, i));
        acc = red == Reduce::max ? std::max(acc, x) : acc + x;
    }
    return red == Reduce::avg ? acc / static_cast<T>(dp()) : acc;
}

std::uint16_t fold_ranks_bf16(const Mixed& g, Reduce red, std::uint64_t i) {
    const auto value = [&](int r) { return zinf::to_bf16(static_cast<float>(g(r, i))); };
    std::uint16_t acc = value(0);
    for (int r = 1; r < dp(); ++r) {
        const float a = zinf::from_bf16(acc), x = zinf::from_bf16(value(r));
        acc = zinf::to_bf16(red == Reduce::max ? std::max(a, x) : a + x);
    }
    return red == Reduce::avg ? zinf::to_bf16(zinf::from_bf16(acc) / static_cast<float>(dp())) : acc;
}

// Elements [first, first + n) of the reference.
Bytes in_rank_order(const Mixed& g, Reduce red, std::uint64_t first, std::size_t n) {
    Bytes out(n * es(g.t));
    for (std::size_t j = 0; j < n; ++j) {
        std::byte* p = out.data() + j * es(g.t);
        switch (g.t) {
        case DType::f32: {
            const float x = fold_ranks<float>(g, red, first + j);
            std::memcpy(p, &x, 4);
            break;
        }
        case DType::f64: {
            const double x = fold_ranks<double>(g, red, first + j);
            std::memcpy(p, &x, 8);
            break;
        }
        case DType::bf16: {
            const std::uint16_t x = fold_ranks_bf16(g, red, first + j);
            std::memcpy(p, &x, 2);
            break;
        }
        default: BOOST_ERROR("no reference for " << comm::name(g.t));
        }
    }
    return out;
}

std::string shape_name(const std::vector<std::uint64_t>& counts) {
    std::string s = "counts {";
    for (auto c : counts) s += " " + std::to_string(c);
    return s + " }";
}

// Equal blocks (1, 1001, large) and uneven ones (some empty; large; none at
// all; one rank holding everything).
std::vector<std::vector<std::uint64_t>> rank_order_shapes(std::mt19937_64& rng) {
    std::vector<std::vector<std::uint64_t>> shapes{equal_counts(1), equal_counts(1001), equal_counts(150001)};
    shapes.push_back(uneven(rng, 2000));
    shapes.push_back(uneven(rng, 300000));
    shapes.push_back(std::vector<std::uint64_t>(dp(), 0));
    std::vector<std::uint64_t> one(dp(), 0);
    one[0] = 4099;
    shapes.push_back(one);
    return shapes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(reduce_scatter_equals_the_rank_order_fold) {
    const std::uint64_t s = shared_seed("reduce-scatter in rank order");
    std::mt19937_64 rng(s);
    const auto shapes = rank_order_shapes(rng);
    for (std::size_t k = 0; k < shapes.size(); ++k) {
        const auto& counts = shapes[k];
        const bool equal = std::all_of(counts.begin(), counts.end(), [&](auto c) { return c == counts[0]; });
        for (DType t : kFloatTypes) {
            const Mixed g{t, s + k};
            const Bytes whole = mixed_data(g, me(), 0, total_of(counts));
            for (Reduce red : {Reduce::sum, Reduce::avg, Reduce::max}) {
                const Bytes want = in_rank_order(g, red, first_of(counts, me()), counts[me()]);
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    Bytes part = sentinel(t, counts[me()]);
                    // Equal blocks as the plain form (no counts), uneven as counts.
                    const comm::Buffer b{cb(whole), wb(part), equal ? std::vector<std::uint64_t>{} : counts};
                    run_op(m, Kind::reduce_scatter, std::span(&b, 1), t, red);
                    same(part, want, t,
                         "reduce-scatter " + std::string(comm::name(red)) + " in rank order, " + shape_name(counts) +
                             ", " + mode_name(m));
                }
            }
        }
    }
}

// The test above can fail: with three ranks or more, folding the same
// values from the last rank down gives other bits for many elements.
BOOST_AUTO_TEST_CASE(the_order_shows_in_the_bits) {
    if (dp() < 3) {
        BOOST_TEST_MESSAGE(where() << ": two ranks: a + b == b + a, nothing to show");
        return;
    }
    const std::uint64_t s = shared_seed("order shows");
    const std::size_t n = 10000;
    for (DType t : kFloatTypes) {
        const Mixed g{t, s};
        const Bytes want = in_rank_order(g, Reduce::sum, 0, n);
        Bytes down(n * es(t));
        for (std::size_t j = 0; j < n; ++j) {
            double d = g(dp() - 1, j);
            float f = static_cast<float>(d);
            std::uint16_t h = zinf::to_bf16(f);
            for (int r = dp() - 2; r >= 0; --r) {
                d += g(r, j);
                f += static_cast<float>(g(r, j));
                h = zinf::to_bf16(zinf::from_bf16(h) + zinf::from_bf16(zinf::to_bf16(static_cast<float>(g(r, j)))));
            }
            std::byte* p = down.data() + j * es(t);
            if (t == DType::f32) std::memcpy(p, &f, 4);
            else if (t == DType::f64) std::memcpy(p, &d, 8);
            else std::memcpy(p, &h, 2);
        }
        std::size_t differ = 0;
        for (std::size_t j = 0; j < n; ++j)
            differ += std::memcmp(want.data() + j * es(t), down.data() + j * es(t), es(t)) != 0;
        BOOST_TEST(differ > n / 100, where() << ": " << comm::name(t) << ": only " << differ << " of " << n
                                              << " sums change with the order");
    }
}

// Element i's bits do not depend on the tensors beside it: the same tensors
// reduce-scattered one per collective, all in one bucket, and in two buckets
// split at a random place give the same bytes, and those of the reference.
BOOST_AUTO_TEST_CASE(bucket_split_invariance) {
    const std::uint64_t s = shared_seed("reduce-scatter bucket splits");
    std::mt19937_64 rng(s);
    static constexpr std::uint64_t kBlocks[] = {1, 7, 1001, 4099, 65537, 3};
    for (DType t : kFloatTypes)
        for (Reduce red : {Reduce::sum, Reduce::avg}) {
            std::vector<Mixed> gens;
            std::vector<std::vector<std::uint64_t>> counts;
            std::vector<Bytes> sends;
            for (std::size_t k = 0; k < std::size(kBlocks); ++k) {
                gens.push_back({t, s + 11 * k});
                // Every other tensor of uneven blocks (some empty).
                counts.push_back(k % 2 ? uneven(rng, 2 * kBlocks[k]) : equal_counts(kBlocks[k]));
                sends.push_back(mixed_data(gens[k], me(), 0, total_of(counts[k])));
            }
            const auto collect = [&](const std::vector<std::size_t>& cuts, Mode m) {
                std::vector<Bytes> recvs;
                std::vector<comm::Buffer> bufs;
                for (std::size_t k = 0; k < sends.size(); ++k) recvs.push_back(sentinel(t, counts[k][me()]));
                for (std::size_t k = 0; k < sends.size(); ++k) {
                    const bool equal = k % 2 == 0;
                    bufs.push_back({cb(sends[k]), wb(recvs[k]), equal ? std::vector<std::uint64_t>{} : counts[k]});
                }
                std::size_t from = 0;
                for (std::size_t cut : cuts) {
                    run_op(m, Kind::reduce_scatter, std::span(bufs).subspan(from, cut - from), t, red);
                    from = cut;
                }
                return recvs;
            };
            std::vector<std::size_t> one_by_one;
            for (std::size_t k = 1; k <= sends.size(); ++k) one_by_one.push_back(k);
            const std::size_t split = 1 + rng() % (sends.size() - 1);
            const auto alone = collect(one_by_one, Mode::blocking);
            const std::string what = "reduce-scatter " + std::string(comm::name(red)) + ", tensor ";
            for (std::size_t k = 0; k < sends.size(); ++k)
                same(alone[k], in_rank_order(gens[k], red, first_of(counts[k], me()), counts[k][me()]), t,
                     what + std::to_string(k) + " alone, " + shape_name(counts[k]));
            for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                const auto together = collect({sends.size()}, m);
                const auto halves = collect({split, sends.size()}, m);
                for (std::size_t k = 0; k < sends.size(); ++k) {
                    same(together[k], alone[k], t, what + std::to_string(k) + " in one bucket, " + mode_name(m));
                    same(halves[k], alone[k], t,
                         what + std::to_string(k) + " in buckets split after " + std::to_string(split) + ", " +
                             mode_name(m));
                }
            }
        }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 5. ZeRO partitions: gather and reduce-scatter by shard::owned.
BOOST_AUTO_TEST_SUITE(zero_partitions)

namespace {

std::vector<std::uint64_t> zero_sizes() {
    const std::uint64_t d = static_cast<std::uint64_t>(dp());
    std::vector<std::uint64_t> v{1};
    if (d > 2) v.push_back(d - 1);
    if (d > 1) v.push_back(d);
    v.push_back(d + 1);
    v.push_back(4097);
    v.push_back(12345);
    v.push_back(kLarge);
    return v;
}

// A tensor's values: element i of the full tensor (the same on every rank).
Bytes full_tensor(const Gen& g, std::uint64_t numel) { return data(g, 0, 0, numel); }

// This rank's partition as stored: its real elements, then padding filled
// with the sentinel (NaN for floats), which must never be read.
Bytes partition(const Gen& g, std::uint64_t numel) {
    const zero::Owned o = zero::owned(numel, static_cast<unsigned>(dp()), static_cast<unsigned>(me()));
    Bytes own = sentinel(g.t, o.per);
    const Bytes real = data(g, 0, o.first, o.count);
    if (!real.empty()) std::memcpy(own.data(), real.data(), real.size());
    return own;
}

}  // namespace

BOOST_AUTO_TEST_CASE(owned_is_the_partition_rule) {
    for (std::uint64_t numel : zero_sizes()) {
        const zero::Owned o = zero::owned(numel, static_cast<unsigned>(dp()), static_cast<unsigned>(me()));
        const std::uint64_t per = (numel + dp() - 1) / dp();
        BOOST_TEST(o.per == per);
        BOOST_TEST(o.first == std::min(numel, per * me()));
        BOOST_TEST(o.count == std::min(per, numel - o.first));
        // The real elements of every rank add up to the tensor.
        std::uint64_t c = o.count, total = 0;
        world().allreduce(std::as_bytes(std::span(&c, 1)), std::as_writable_bytes(std::span(&total, 1)), DType::i64);
        BOOST_TEST(total == numel);
    }
}

BOOST_AUTO_TEST_CASE(gather_is_the_concatenation_of_partitions) {
    const std::uint64_t s = shared_seed("zero gather");
    for (DType t : kAllTypes)
        for (std::uint64_t numel : zero_sizes()) {
            if (numel == kLarge && t != DType::f32 && t != DType::bf16) continue;
            const Gen g{t, s + numel};
            const Bytes own = partition(g, numel);
            for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                Bytes full = sentinel(t, numel);
                const zero::Gather z{cb(own), wb(full), numel};
                if (m == Mode::blocking) zero::gather(world(), z, t);
                else finish(zero::start_gather(world(), std::span(&z, 1), t));
                same(full, full_tensor(g, numel), t,
                     "zero::gather of " + std::to_string(numel) + ", " + mode_name(m));
            }
        }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_averages_into_the_partition) {
    const std::uint64_t s = shared_seed("zero reduce-scatter");
    for (DType t : kFloatTypes)
        for (std::uint64_t numel : zero_sizes())
            for (Reduce red : {Reduce::avg, Reduce::sum, Reduce::max})
                for (Mode m : {Mode::blocking, Mode::nonblocking}) {
                    if (numel == kLarge && (red != Reduce::avg || t == DType::f64)) continue;
                    const Gen g{t, s + numel};
                    const zero::Owned o = zero::owned(numel, static_cast<unsigned>(dp()), static_cast<unsigned>(me()));
                    const Bytes grad = data(g, me(), 0, numel);  // this rank's whole gradient
                    Bytes own = sentinel(t, o.per);
                    const zero::Scatter z{cb(grad), wb(own), numel};
                    if (m == Mode::blocking) {
                        if (red == Reduce::avg) zero::reduce_scatter(world(), z, t);  // the default: avg
                        else zero::reduce_scatter(world(), z, t, red);
                    } else {
                        finish(zero::start_reduce_scatter(world(), std::span(&z, 1), t, red));
                    }
                    Bytes want = reduced(g, red, o.first, o.count);
                    const Bytes pad = sentinel(t, o.per - o.count);
                    want.insert(want.end(), pad.begin(), pad.end());  // padding untouched
                    same(own, want, t,
                         "zero::reduce_scatter " + std::string(comm::name(red)) + " of " + std::to_string(numel) +
                             ", " + mode_name(m));
                }
}

BOOST_AUTO_TEST_CASE(a_bucket_of_tensors) {
    const std::uint64_t s = shared_seed("zero bucket");
    const auto ns = zero_sizes();
    for (DType t : {DType::f32, DType::bf16, DType::f64})
        for (Mode m : {Mode::blocking, Mode::nonblocking}) {
            std::vector<Gen> gens;
            std::vector<Bytes> owns, fulls, grads, parts;
            for (std::size_t k = 0; k < ns.size(); ++k) {
                gens.push_back({t, s + 31 * k});
                owns.push_back(partition(gens[k], ns[k]));
                fulls.push_back(sentinel(t, ns[k]));
                grads.push_back(data(gens[k], me(), 0, ns[k]));
                parts.push_back(sentinel(t, zero::owned(ns[k], dp(), me()).per));
            }
            std::vector<zero::Gather> gs;
            std::vector<zero::Scatter> ss;
            for (std::size_t k = 0; k < ns.size(); ++k) {
                gs.push_back({cb(owns[k]), wb(fulls[k]), ns[k]});
                ss.push_back({cb(grads[k]), wb(parts[k]), ns[k]});
            }
            if (m == Mode::blocking) {
                zero::gather(world(), gs, t);
                zero::reduce_scatter(world(), ss, t);
            } else {
                // Both started before either is waited for: they run in order.
                auto hg = zero::start_gather(world(), gs, t);
                auto hs = zero::start_reduce_scatter(world(), ss, t);
                hs.wait();
                BOOST_TEST(hg.test());
                hg.wait();
            }
            for (std::size_t k = 0; k < ns.size(); ++k) {
                same(fulls[k], full_tensor(gens[k], ns[k]), t,
                     "bucket zero::gather, tensor " + std::to_string(k) + " (" + std::to_string(ns[k]) + "), " +
                         mode_name(m));
                const zero::Owned o = zero::owned(ns[k], dp(), me());
                Bytes want = reduced(gens[k], Reduce::avg, o.first, o.count);
                const Bytes pad = sentinel(t, o.per - o.count);
                want.insert(want.end(), pad.begin(), pad.end());
                same(parts[k], want, t,
                     "bucket zero::reduce_scatter, tensor " + std::to_string(k) + " (" + std::to_string(ns[k]) +
                         "), " + mode_name(m));
            }
        }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 6. Partitions zinf-shard init wrote, gathered, equal zinf-shard cat.
BOOST_AUTO_TEST_SUITE(shard_files)

BOOST_AUTO_TEST_CASE(gathered_partitions_equal_cat) {
    constexpr const char* kSpec = "gpt:layers=2,hidden=64,heads=4,vocab=96,seq=32";
    const unsigned size = static_cast<unsigned>(dp()), rank = static_cast<unsigned>(me());
    std::optional<TempDir> tmp;  // rank 0's, removed after the last barrier
    std::string root;
    if (me() == 0) {
        try {
            tmp.emplace();
            root = tmp->path.string();
        } catch (const std::exception& e) {
            BOOST_ERROR("temporary directory: " << e.what());
        }
    }
    root = broadcast_string(root, 0);
    const std::uint64_t s = shared_seed("shard files");

    zinf::io::Engine engine{zinf::io::EngineConfig{}};
    zinf::mem::PoolConfig pc;
    pc.bytes = 4 * zinf::MiB;
    pc.buffer = 256 * zinf::KiB;
    pc.allocator = "host";
    pc.lease_timeout = 30s;
    zinf::mem::PinnedPool pool(pc, &engine);

    struct Case {
        const char* name;
        shard::LayoutOptions opts;
        std::vector<std::pair<std::string, DType>> states;
    };
    const Case cases[] = {
        {"bf16", {.dp = size, .param_dtype = shard::DType::bf16, .train = true, .seed = s},
         {{"param", DType::bf16}, {"master", DType::f32}}},
        {"fp32", {.dp = size, .param_dtype = shard::DType::fp32, .train = false, .seed = s + 1},
         {{"param", DType::f32}}},
    };
    for (const Case& c : cases) {
        const std::string dir = root + "/" + c.name, mpath = root + "/" + c.name + ".manifest";
        bool ok = !root.empty();
        if (me() == 0 && ok) {
            try {
                shard::Manifest m = shard::layout(shard::ModelSpec::parse(kSpec), c.opts);
                shard::init(m, dir, engine, pool, {}).commit();
                shard::save_manifest(m, mpath);
            } catch (const std::exception& e) {
                BOOST_ERROR("rank 0: zinf-shard init (" << c.name << "): " << e.what());
                ok = false;
            }
        }
        world().barrier();
        shard::Manifest m;
        if (ok) {
            try {
                m = shard::read_manifest_file(mpath);
            } catch (const std::exception& e) {
                BOOST_ERROR(where() << ": reading " << mpath << ": " << e.what());
                ok = false;
            }
        }
        if (!all_ranks(ok)) continue;  // every rank skips alike
        BOOST_TEST(m.opts.dp == size);
        BOOST_TEST(m.initialised());
        for (const auto& [state, t] : c.states) {
            // Every tensor: this rank's partition read from its file.
            std::vector<Bytes> owns(m.tensors.size()), fulls(m.tensors.size()), bucket(m.tensors.size());
            for (std::size_t ti = 0; ti < m.tensors.size(); ++ti) {
                const shard::Tensor& tensor = m.tensors[ti];
                const zero::Owned o = zero::owned(tensor.numel, size, rank);
                owns[ti] = sentinel(t, o.per);  // stays so when the partition is missing
                fulls[ti] = sentinel(t, tensor.numel);
                bucket[ti] = sentinel(t, tensor.numel);
                const shard::Partition* part = nullptr;
                for (const auto& p : m.parts)
                    if (p.tensor == ti && p.rank == rank && p.state == state) part = &p;
                if (!part) {
                    BOOST_ERROR(where() << ": no " << state << " partition of " << tensor.name);
                    continue;
                }
                // The layout's partition is the rule zero gathers by.
                BOOST_TEST(part->first == o.first, tensor.name);
                BOOST_TEST(part->last == o.first + o.count, tensor.name);
                BOOST_TEST(part->bytes == o.per * es(t), tensor.name);
                const std::string path = m.path_of(*part);
                const int fd = ::open(path.c_str(), O_RDONLY);
                const ssize_t got = fd < 0 ? -1 : ::pread(fd, owns[ti].data(), owns[ti].size(), static_cast<off_t>(part->offset));
                if (fd >= 0) ::close(fd);
                BOOST_TEST(got == static_cast<ssize_t>(owns[ti].size()), where() << ": pread " << path);
            }
            // One by one, then all of them as one bucket.
            for (std::size_t ti = 0; ti < m.tensors.size(); ++ti)
                zero::gather(world(), {cb(owns[ti]), wb(fulls[ti]), m.tensors[ti].numel}, t);
            std::vector<zero::Gather> gs;
            for (std::size_t ti = 0; ti < m.tensors.size(); ++ti)
                gs.push_back({cb(owns[ti]), wb(bucket[ti]), m.tensors[ti].numel});
            finish(zero::start_gather(world(), gs, t));
            for (std::size_t ti = 0; ti < m.tensors.size(); ++ti) {
                Bytes cat;
                try {
                    shard::cat(m, ti, state, engine, pool, [&](std::span<const std::byte> piece) {
                        cat.insert(cat.end(), piece.begin(), piece.end());
                    });
                } catch (const std::exception& e) {
                    BOOST_ERROR(where() << ": zinf-shard cat " << m.tensors[ti].name << ": " << e.what());
                }
                const std::string what = std::string(c.name) + " " + state + " " + m.tensors[ti].name;
                same(fulls[ti], cat, t, "gathered " + what + " vs cat");
                same(bucket[ti], cat, t, "bucket-gathered " + what + " vs cat");
            }
        }
    }
    world().barrier();  // every rank is done with the files before rank 0 removes them
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 7. Non-blocking operations: overlap with computation, completion in order.
BOOST_AUTO_TEST_SUITE(nonblocking)

BOOST_AUTO_TEST_CASE(overlap_with_computation) {
    const std::uint64_t s = shared_seed("overlap");
    const std::size_t n = 2u << 20;
    const Gen g{DType::f32, s};
    const Bytes send = data(g, me(), 0, n);
    const Bytes want_sum = reduced(g, Reduce::sum, 0, n);
    // The computation: sum 4M floats (exact integers) five times over.
    std::vector<float> work(4u << 20);
    for (std::size_t i = 0; i < work.size(); ++i) work[i] = static_cast<float>(i % 1000);
    const std::size_t per_pass = 1000 * 999 / 2 * (work.size() / 1000) + [&] {
        std::size_t r = 0;
        for (std::size_t i = 0; i < work.size() % 1000; ++i) r += i;
        return r;
    }();
    const auto compute = [&](comm::Handle& h, std::size_t& polls, std::size_t& done_at) {
        double acc = 0;
        std::size_t chunk = 0;
        for (int pass = 0; pass < 5; ++pass)
            for (std::size_t at = 0; at < work.size(); at += 1u << 16, ++chunk) {
                double part = 0;
                const std::size_t end = std::min(work.size(), at + (1u << 16));
                for (std::size_t i = at; i < end; ++i) part += work[i];
                acc += part;
                if (chunk % 8 == 0 && done_at == 0) {
                    ++polls;
                    if (h.test()) done_at = chunk + 1;
                }
            }
        return acc;
    };
    {  // allreduce
        Bytes recv = sentinel(DType::f32, n);
        auto h = world().iallreduce(cb(send), wb(recv), DType::f32, Reduce::sum);
        std::size_t polls = 0, done_at = 0;
        const double acc = compute(h, polls, done_at);
        h.wait();
        BOOST_TEST_MESSAGE(where() << ": iallreduce done after " << done_at << " chunks (" << polls << " polls)");
        BOOST_TEST(acc == 5.0 * static_cast<double>(per_pass));
        same(recv, want_sum, DType::f32, "iallreduce overlapped with computation");
    }
    {  // allgather
        const std::size_t b = n / dp();
        const Bytes mine = data(g, me(), 0, b);
        Bytes recv = sentinel(DType::f32, b * dp());
        auto h = world().iallgather(cb(mine), wb(recv), DType::f32);
        std::size_t polls = 0, done_at = 0;
        const double acc = compute(h, polls, done_at);
        h.wait();
        BOOST_TEST(acc == 5.0 * static_cast<double>(per_pass));
        same(recv, gathered(g, equal_counts(b)), DType::f32, "iallgather overlapped with computation");
    }
}

BOOST_AUTO_TEST_CASE(back_to_back_complete_in_order) {
    const std::uint64_t s = shared_seed("in order");
    const DType t = DType::f32;
    for (int round = 0; round < 3; ++round) {
        const std::size_t b = round == 0 ? 1 : round == 1 ? 1001 : 100001;
        const Gen g{t, s + round};
        const Bytes mine = data(g, me(), 0, b), whole = data(g, me(), 0, b * dp());
        Bytes gathered_recv = sentinel(t, b * dp()), part = sentinel(t, b), avg = sentinel(t, b * dp());
        const int root = dp() - 1;
        Bytes bcast = me() == root ? mine : sentinel(t, b);
        std::vector<comm::Handle> hs;
        hs.push_back(world().iallgather(cb(mine), wb(gathered_recv), t));
        hs.push_back(world().ireduce_scatter(cb(whole), wb(part), t, Reduce::max));
        hs.push_back(world().iallreduce(cb(whole), wb(avg), t, Reduce::avg));
        hs.push_back(world().ibroadcast(wb(bcast), t, root));
        hs.push_back(world().ibarrier());
        if (round == 2) {
            // A blocking call after pending ones waits its turn and is right.
            Bytes sum = sentinel(t, b * dp());
            world().allreduce(cb(whole), wb(sum), t, Reduce::sum);
            for (std::size_t k = 0; k < hs.size(); ++k)
                BOOST_TEST(hs[k].test(), "operation " << k << " started before a blocking call is complete after it");
            same(sum, reduced(g, Reduce::sum, 0, b * dp()), t, "blocking allreduce after pending ones");
        }
        // The last one complete: all before it are, without waiting.
        hs.back().wait();
        for (std::size_t k = 0; k + 1 < hs.size(); ++k)
            BOOST_TEST(hs[k].test(), "operation " << k << " is complete once a later one is");
        for (auto& h : hs) h.wait();
        same(gathered_recv, gathered(g, equal_counts(b)), t, "back-to-back iallgather");
        same(part, reduced(g, Reduce::max, b * me(), b), t, "back-to-back ireduce_scatter max");
        same(avg, reduced(g, Reduce::avg, 0, b * dp()), t, "back-to-back iallreduce avg");
        same(bcast, data(g, root, 0, b), t, "back-to-back ibroadcast");
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// 8. Bad buffers are refused before any communication: every rank checks alone.
BOOST_AUTO_TEST_SUITE(refusals)

BOOST_AUTO_TEST_CASE(bad_buffers_are_internal_errors) {
    comm::Communicator& w = world();
    const int n = dp();
    Bytes one(4), small(4 * n), big(4 * (n + 1)), odd(6);
    const auto expect = [&](const std::string& says, auto fn, const std::string& context) {
        const std::string msg = internal_error(fn, context);
        BOOST_TEST(contains(msg, says), context << ": " << msg);
    };
    // allgather: recv one element too many.
    expect("comm: allgather, buffer 0: recv has " + std::to_string(n + 1) + " elements, want " + std::to_string(n),
           [&] { w.allgather(cb(one), wb(big), DType::f32); }, "allgather, recv too big");
    expect("recv has " + std::to_string(n + 1) + " elements",
           [&] { (void)w.iallgather(cb(one), wb(big), DType::f32); }, "iallgather, recv too big");
    // reduce-scatter: send not dp blocks.
    expect("comm: reduce-scatter, buffer 0: send has " + std::to_string(n + 1) + " elements, want " + std::to_string(n),
           [&] { w.reduce_scatter(cb(big), wb(one), DType::f32); }, "reduce-scatter, send too big");
    // allreduce: send and recv of different sizes.
    expect("send has " + std::to_string(n) + " elements, want " + std::to_string(n + 1),
           [&] { w.allreduce(cb(small), wb(big), DType::f32); }, "allreduce, sizes differ");
    // bytes that are not whole elements.
    expect("are not whole f32 elements", [&] { w.allreduce(cb(odd), wb(odd), DType::f32); }, "6 bytes of f32");
    // counts of the wrong length.
    for (std::size_t len : {static_cast<std::size_t>(n + 1), static_cast<std::size_t>(n > 1 ? n - 1 : 2)}) {
        const comm::Buffer b{cb(one), wb(small), std::vector<std::uint64_t>(len, 1)};
        expect(std::to_string(len) + " counts for " + std::to_string(n) + " ranks",
               [&] { w.run(Kind::allgather, std::span(&b, 1), DType::f32); }, "allgather counts");
        const comm::Buffer r{cb(small), wb(one), std::vector<std::uint64_t>(len, 1)};
        expect(std::to_string(len) + " counts for " + std::to_string(n) + " ranks",
               [&] { (void)w.start(Kind::reduce_scatter, std::span(&r, 1), DType::f32); }, "reduce-scatter counts");
    }
    {  // counts that do not match the buffers
        std::vector<std::uint64_t> c(n, 1);
        c[me()] = 2;
        const comm::Buffer b{cb(one), wb(big), c};
        expect("send has 1 elements, want 2", [&] { w.run(Kind::allgather, std::span(&b, 1), DType::f32); },
               "allgather, send not its count");
        const comm::Buffer a{cb(small), wb(small), std::vector<std::uint64_t>(n, 1)};
        expect("per-rank counts are for allgather and reduce-scatter",
               [&] { w.run(Kind::allreduce, std::span(&a, 1), DType::f32); }, "allreduce with counts");
    }
    // avg of integers.
    for (DType t : {DType::i32, DType::i64, DType::u8}) {
        Bytes x(es(t) * n);
        expect("comm: avg of integers (" + std::string(comm::name(t)) + ")",
               [&] { w.allreduce(cb(x), wb(x), t, Reduce::avg); }, "allreduce avg of " + std::string(comm::name(t)));
        Bytes y(es(t));
        expect("avg of integers", [&] { (void)w.ireduce_scatter(cb(x), wb(y), t, Reduce::avg); },
               "ireduce_scatter avg of " + std::string(comm::name(t)));
        Bytes own(es(t)), full(es(t) * n);
        expect("avg of integers",
               [&] { zero::reduce_scatter(w, {cb(full), wb(own), static_cast<std::uint64_t>(n)}, t); },
               "zero::reduce_scatter of " + std::string(comm::name(t)));
    }
    // roots out of range.
    for (int root : {-1, n, n + 5}) {
        expect("comm: root " + std::to_string(root) + " is not a rank of " + std::to_string(n),
               [&] { w.broadcast(wb(small), DType::f32, root); }, "broadcast from " + std::to_string(root));
        expect("is not a rank of", [&] { (void)w.ibroadcast(wb(small), DType::f32, root); },
               "ibroadcast from " + std::to_string(root));
    }
    {  // a broadcast sends from recv; a barrier takes nothing; a bucket is not empty
        const comm::Buffer b{cb(small), wb(small), {}};
        expect("send must be empty", [&] { w.run(Kind::broadcast, std::span(&b, 1), DType::f32); }, "broadcast send");
        expect("a barrier takes no buffers", [&] { w.run(Kind::barrier, std::span(&b, 1), DType::u8); },
               "barrier with a buffer");
        expect("comm: allreduce with no buffers", [&] { w.run(Kind::allreduce, {}, DType::f32); }, "empty bucket");
        expect("bare() takes equal blocks only",
               [&] { w.bare(Kind::allgather, {cb(one), wb(small), std::vector<std::uint64_t>(n, 1)}, DType::f32); },
               "bare with counts");
        expect("empty handle", [] { comm::Handle().wait(); }, "empty handle");
    }
    {  // zero: partitions and full tensors of the wrong size
        const std::uint64_t numel = 3 * n + 1;
        const zero::Owned o = zero::owned(numel, n, me());
        Bytes own((o.per + 1) * 4), full(numel * 4), right(o.per * 4), short_full((numel - 1) * 4);
        expect("zero::gather, tensor 0: the partition has " + std::to_string(own.size()) + " bytes, want " +
                   std::to_string(o.per * 4),
               [&] { zero::gather(w, {cb(own), wb(full), numel}, DType::f32); }, "zero::gather, partition");
        expect("the full tensor has", [&] { zero::gather(w, {cb(right), wb(short_full), numel}, DType::f32); },
               "zero::gather, full");
        const zero::Scatter ss[] = {{cb(full), wb(right), numel}, {cb(short_full), wb(right), numel}};
        expect("zero::reduce_scatter, tensor 1: the full tensor has",
               [&] { (void)zero::start_reduce_scatter(w, ss, DType::f32); }, "zero::reduce_scatter, tensor 1");
    }
    // Nothing was started: the communicator still works, on every rank.
    std::int64_t v = me() + 1, total = 0;
    w.allreduce(std::as_bytes(std::span(&v, 1)), std::as_writable_bytes(std::span(&total, 1)), DType::i64);
    BOOST_TEST(total == static_cast<std::int64_t>(n) * (n + 1) / 2);
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
// Run only by name (--run_test=skip_a_collective), with a short
// ZINF_COMM_TIMEOUT: rank 1 skips an uneven allgather the others call. On
// MPI the watchdog of every waiting rank reports it and ends the process (74);
// a backend that throws comm::Timeout instead lets it escape the case, so the
// job exits non-zero either way.
BOOST_AUTO_TEST_CASE(skip_a_collective, *utf::disabled()) {
    comm::Communicator& w = world();
    BOOST_TEST_REQUIRE(w.size() >= 2);  // every rank alike: no collective skipped by this
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(w.size()));
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] = r + 1;
    const std::vector<std::int32_t> mine(counts[static_cast<std::size_t>(w.rank())], w.rank());
    std::vector<std::int32_t> all(static_cast<std::size_t>(total_of(counts)), -1);
    if (w.rank() == 1) {
        BOOST_TEST_MESSAGE(where() << ": skipping the allgather");
        return;
    }
    const comm::Buffer b{std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), counts};
    const auto t0 = std::chrono::steady_clock::now();
    try {
        w.run(Kind::allgather, std::span(&b, 1), DType::i32);
    } catch (const comm::Timeout& e) {
        const auto waited = std::chrono::steady_clock::now() - t0;
        BOOST_TEST_MESSAGE(where() << ": " << e.what());
        BOOST_TEST(contains(e.what(), "allgather"), e.what());
        BOOST_TEST(contains(e.what(), "did not complete within"), e.what());
        BOOST_TEST(waited >= w.timeout() - 100ms);
        throw;  // out of the case: this rank, and so the job, fails
    }
    BOOST_ERROR(where() << ": the allgather completed although rank 1 never called it");
}

// Run only by name (--run_test=skip_a_plain_collective), with a short
// ZINF_COMM_TIMEOUT: rank 1 skips a plain allgather (one buffer, equal
// blocks), which runs as MPI's blocking call; the watchdog of every rank
// left waiting reports it and ends the process with 74, so the job ends.
BOOST_AUTO_TEST_CASE(skip_a_plain_collective, *utf::disabled()) {
    comm::Communicator& w = world();
    BOOST_TEST_REQUIRE(w.size() >= 2);
    const std::vector<float> mine(16, static_cast<float>(w.rank()));
    std::vector<float> all(16 * static_cast<std::size_t>(w.size()));
    if (w.rank() == 1) {
        BOOST_TEST_MESSAGE(where() << ": skipping the allgather");
        return;
    }
    w.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), DType::f32);
    BOOST_ERROR(where() << ": the allgather completed although rank 1 never called it");
}
