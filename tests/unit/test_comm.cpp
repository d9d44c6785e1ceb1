// comm and zero in one process: names, the launcher's environment, the
// timeout setting, the partition rule, the self backend, buffer checks,
// the flat bucket NCCL moves in one call (planned and simulated on the host).
// The collectives across ranks are tested under mpirun in mpi_comm.cpp.
#define BOOST_TEST_MODULE comm
#include "comm_testing.hpp"
#include "testing.hpp"

#include "../../libzinf/src/comm/internal.hpp"  // the flat bucket's plan (flat.cpp)

#include <zinf/comm.hpp>
#include <zinf/shard.hpp>
#include <zinf/zero.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

using namespace zinf;
using comm::DType;
using comm::Kind;
using comm::Reduce;

namespace {

// Sets environment variables for one scope and restores what was there.
class Env {
public:
    Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
        for (auto [k, v] : vars) {
            const char* old = std::getenv(k);
            saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
            if (v)
                ::setenv(k, v, 1);
            else
                ::unsetenv(k);
        }
    }
    ~Env() {
        for (auto& [k, v] : saved_)
            if (v)
                ::setenv(k.c_str(), v->c_str(), 1);
            else
                ::unsetenv(k.c_str());
    }

private:
    std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// No launcher variables at all: what a plain shell gives.
Env no_launcher() {
    return Env{{"OMPI_COMM_WORLD_RANK", nullptr}, {"OMPI_COMM_WORLD_SIZE", nullptr}, {"SLURM_PROCID", nullptr},
               {"SLURM_STEP_NUM_TASKS", nullptr},         {"PMI_RANK", nullptr},             {"PMI_SIZE", nullptr}};
}

template <class T>
std::span<const std::byte> in(const std::vector<T>& v) {
    return std::as_bytes(std::span(v));
}
template <class T>
std::span<std::byte> out(std::vector<T>& v) {
    return std::as_writable_bytes(std::span(v));
}

}  // namespace

BOOST_AUTO_TEST_CASE(names_and_parsing) {
    BOOST_TEST(comm::dtype_bytes(DType::bf16) == 2u);
    BOOST_TEST(comm::dtype_bytes(DType::f64) == 8u);
    BOOST_TEST(comm::dtype_bytes(DType::u8) == 1u);
    BOOST_TEST(comm::name(Kind::reduce_scatter) == "reduce-scatter");
    BOOST_TEST(comm::name(Reduce::avg) == "avg");
    BOOST_TEST((comm::parse_dtype("float") == DType::f32));
    BOOST_TEST((comm::parse_dtype("bf16") == DType::bf16));
    BOOST_TEST((comm::parse_dtype("double") == DType::f64));
    BOOST_CHECK_THROW(comm::parse_dtype("f16"), UsageError);
    BOOST_TEST((comm::parse_backend("auto") == comm::Backend::automatic));
    BOOST_TEST((comm::parse_backend("nccl") == comm::Backend::nccl));
    BOOST_CHECK_THROW(comm::parse_backend("gloo"), UsageError);
    BOOST_TEST(comm::compiled(comm::Backend::self));
}

BOOST_AUTO_TEST_CASE(launch_from_each_launcher) {
    {
        auto e = no_launcher();
        const auto l = comm::Launch::from_env();
        BOOST_TEST(l.rank == 0);
        BOOST_TEST(l.size == 1);
        BOOST_TEST(l.launcher.empty());
    }
    {
        auto e = no_launcher();
        Env mpirun{{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
        const auto l = comm::Launch::from_env();
        BOOST_TEST(l.launcher == "mpirun");
        BOOST_TEST(l.rank == 3);
        BOOST_TEST(l.size == 8);
        BOOST_TEST(l.local_rank == 1);
        BOOST_TEST(l.local_size == 2);
    }
    {
        auto e = no_launcher();
        Env srun{{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "6"}, {"SLURM_LOCALID", "2"}};
        const auto l = comm::Launch::from_env();
        BOOST_TEST(l.launcher == "srun");
        BOOST_TEST(l.rank == 5);
        BOOST_TEST(l.local_rank == 2);
        BOOST_TEST(l.local_size >= 3);  // at least enough for its own local rank
    }
    {
        // A batch script (no srun step) is not a launch of several processes.
        auto e = no_launcher();
        Env batch{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}};
        BOOST_TEST(comm::Launch::from_env().size == 1);
    }
    {
        // A rank outside its size, or garbage, is not a launch.
        auto e = no_launcher();
        Env bad{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMI_RANK", "x"}, {"PMI_SIZE", "2"}};
        BOOST_TEST(comm::Launch::from_env().launcher.empty());
    }
}

BOOST_AUTO_TEST_CASE(timeout_from_the_environment) {
    {
        Env e{{"ZINF_COMM_TIMEOUT", nullptr}};
        BOOST_TEST(comm::default_timeout().count() == 300000);
    }
    {
        Env e{{"ZINF_COMM_TIMEOUT", "2s"}};
        BOOST_TEST(comm::default_timeout().count() == 2000);
    }
    {
        Env e{{"ZINF_COMM_TIMEOUT", "250ms"}};
        BOOST_TEST(comm::default_timeout().count() == 250);
    }
    {
        Env e{{"ZINF_COMM_TIMEOUT", "500us"}};  // rounded up, never to "no limit"
        BOOST_TEST(comm::default_timeout().count() == 1);
    }
    {
        // A flag's timeout wins over a bad environment, which is read only when needed.
        Env e{{"ZINF_COMM_TIMEOUT", "soon"}};
        auto n = no_launcher();
        comm::Communicator c({.backend = comm::Backend::self, .timeout = std::chrono::milliseconds(5)});
        BOOST_TEST(c.timeout().count() == 5);
        BOOST_CHECK_THROW(comm::Communicator({.backend = comm::Backend::self}), UsageError);
    }
    {
        Env e{{"ZINF_COMM_TIMEOUT", "soon"}};
        try {
            comm::default_timeout();
            BOOST_ERROR("no error");
        } catch (const UsageError& err) {
            BOOST_TEST(std::string(err.what()).find("ZINF_COMM_TIMEOUT") != std::string::npos);
        }
    }
}

// The rule zinf-shard lays partitions out with, and zero gathers with.
BOOST_AUTO_TEST_CASE(partition_rule) {
    for (std::uint64_t numel : {0ull, 1ull, 2ull, 3ull, 7ull, 8ull, 1000ull, 1001ull, 123457ull})
        for (unsigned dp : {1u, 2u, 3u, 4u, 7u, 8u, 16u}) {
            std::uint64_t next = 0;
            for (unsigned r = 0; r < dp; ++r) {
                const auto o = shard::owned(numel, dp, r);
                BOOST_TEST(o.per == (numel + dp - 1) / dp);
                BOOST_TEST(o.first == next, "numel " << numel << " dp " << dp << " rank " << r);
                BOOST_TEST(o.count <= o.per);
                next = o.last();
            }
            BOOST_TEST(next == numel, "numel " << numel << " dp " << dp);
        }
    // Ranks past the end hold padding only.
    const auto o = shard::owned(3, 8, 5);
    BOOST_TEST(o.count == 0u);
    BOOST_TEST(o.first == 3u);
    BOOST_TEST(o.per == 1u);
    // No overflow near the top of the range.
    const auto big = shard::owned(~0ull, 3, 2);
    BOOST_TEST(big.last() == ~0ull);
    BOOST_CHECK_THROW(shard::owned(10, 0, 0), InternalError);
    // The manifest's layout agrees with the rule.
    auto m = shard::layout(shard::ModelSpec::parse("gpt:layers=1,hidden=8,heads=2,vocab=11,seq=5"), {.dp = 3});
    for (const auto& p : m.parts) {
        const auto rule = shard::owned(m.tensor_of(p).numel, 3, p.rank);
        BOOST_TEST(p.first == rule.first);
        BOOST_TEST(p.last == rule.last());
    }
}

BOOST_AUTO_TEST_CASE(automatic_is_self_without_a_launcher) {
    auto e = no_launcher();
    comm::Communicator c;
    BOOST_TEST((c.backend() == comm::Backend::self));
    BOOST_TEST(c.rank() == 0);
    BOOST_TEST(c.size() == 1);
    BOOST_TEST(c.describe().find("self") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(self_refuses_a_launched_job_and_device_memory) {
    auto e = no_launcher();
    {
        Env launched{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
        BOOST_CHECK_THROW(comm::Communicator({.backend = comm::Backend::self}), UsageError);
    }
    BOOST_CHECK_THROW(comm::Communicator({.backend = comm::Backend::self, .memory = comm::Memory::device}), UsageError);
    BOOST_CHECK_THROW(comm::Communicator({.backend = comm::Backend::nccl, .memory = comm::Memory::host}), UsageError);
}

// Over one rank every collective is a copy; the values must arrive intact.
BOOST_AUTO_TEST_CASE(self_collectives_copy) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::mt19937_64 rng(testing::seed("self_collectives_copy"));
    std::vector<float> a(1001), b(1001, -1);
    for (auto& x : a) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    c.allgather(in(a), out(b), DType::f32);
    BOOST_TEST(b == a);
    std::fill(b.begin(), b.end(), -1.0f);
    c.reduce_scatter(in(a), out(b), DType::f32, Reduce::avg);
    BOOST_TEST(b == a);
    std::fill(b.begin(), b.end(), -1.0f);
    c.iallreduce(in(a), out(b), DType::f32).wait();
    BOOST_TEST(b == a);
    auto keep = a;
    c.broadcast(out(a), DType::f32, 0);
    BOOST_TEST(a == keep);
    c.barrier();
    c.ibarrier().wait();
    // In place.
    c.allreduce(in(a), out(a), DType::f32);
    BOOST_TEST(a == keep);
}

// A stream-ordered collective is the nccl backend's; self (and mpi) refuse
// it as the caller's mistake (64), before anything is queued, and the
// communicator goes on working.
BOOST_AUTO_TEST_CASE(stream_ordered_collectives_need_nccl) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::mt19937_64 rng(testing::seed("stream_ordered_collectives_need_nccl"));
    std::vector<float> a(257), b(257, -1);
    for (auto& x : a) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    const comm::Buffer buf{in(a), out(b), {}};
    int stream = 0;  // never touched: refused before
    std::string what;
    try {
        c.enqueue(comm::Kind::allgather, std::span(&buf, 1), DType::f32, &stream);
        BOOST_ERROR("enqueue on self: no exception");
    } catch (const UsageError& err) {
        what = err.what();
        BOOST_TEST(err.exit_code() == 64);
    }
    BOOST_TEST(testing::contains(what, "needs the nccl backend"), what);
    BOOST_TEST(testing::contains(what, "backend self"), what);
    BOOST_TEST(!c.stream_ordered());
    BOOST_TEST(b == std::vector<float>(257, -1.0f));
    c.allgather(in(a), out(b), DType::f32);
    BOOST_TEST(b == a);
}

// Data parallelism over device memory needs NCCL beside the host's
// communicator: where NCCL cannot run (no GPU here, or a build without it)
// asking for it is a usage error (64) that says which, before any rank
// starts a collective.
BOOST_AUTO_TEST_CASE(device_communicator_refused_without_nccl) {
    if (comm::usable(comm::Backend::nccl)) {
        BOOST_TEST_MESSAGE("skipped: NCCL can run here (the GPU check runs dp 2 on it: tests/e2e/cuda.sh)");
        return;
    }
    auto e = no_launcher();
    comm::Communicator host({.backend = comm::Backend::self});
    std::string what;
    try {
        comm::device_communicator(host);
        BOOST_ERROR("device_communicator without NCCL: no exception");
    } catch (const UsageError& err) {
        what = err.what();
        BOOST_TEST(err.exit_code() == 64);
    }
    BOOST_TEST(testing::contains(what, "needs NCCL"), what);
    BOOST_TEST(testing::contains(what, comm::compiled(comm::Backend::nccl) ? "cannot run here" : "built without it"),
               what);
}

BOOST_AUTO_TEST_CASE(non_blocking_run_in_order) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::vector<std::vector<std::int64_t>> src, dst;
    std::vector<comm::Handle> hs;
    for (int i = 0; i < 50; ++i) {
        src.push_back(std::vector<std::int64_t>(100 + i, i));
        dst.push_back(std::vector<std::int64_t>(100 + i, -1));
    }
    for (int i = 0; i < 50; ++i) hs.push_back(c.iallgather(in(src[i]), out(dst[i]), DType::i64));
    // A blocking call after pending ones runs after them.
    std::vector<std::int64_t> last(10, 7), got(10);
    c.allreduce(in(last), out(got), DType::i64);
    for (int i = 49; i >= 0; --i) BOOST_TEST(hs[i].test());  // all done before the blocking call returned
    for (int i = 0; i < 50; ++i) {
        hs[i].wait();
        BOOST_TEST(dst[i] == src[i]);
    }
    BOOST_TEST(got == last);
    comm::Handle empty;
    BOOST_TEST(!empty);
    BOOST_CHECK_THROW(empty.wait(), InternalError);
}

BOOST_AUTO_TEST_CASE(buckets_and_counts_over_one_rank) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::vector<double> a(5, 1.5), b(7, 2.5), ra(5), rb(7);
    const comm::Buffer bufs[] = {{in(a), out(ra), {}}, {in(b), out(rb), {7}}};
    c.run(Kind::allgather, bufs, DType::f64);
    BOOST_TEST(ra == a);
    BOOST_TEST(rb == b);
}

BOOST_AUTO_TEST_CASE(bad_buffers_are_named) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::vector<float> a(8), b(9);
    const auto says = [](const InternalError& err, const char* what) {
        return std::string(err.what()).find(what) != std::string::npos;
    };
    BOOST_CHECK_EXCEPTION(c.allgather(in(a), out(b), DType::f32), InternalError,
                          [&](const InternalError& err) { return says(err, "recv has 9 elements, want 8"); });
    BOOST_CHECK_EXCEPTION(c.allreduce(in(a), out(b), DType::f32), InternalError,
                          [&](const InternalError& err) { return says(err, "send"); });
    std::vector<std::int32_t> i(8);
    BOOST_CHECK_EXCEPTION(c.allreduce(in(i), out(i), DType::i32, Reduce::avg), InternalError,
                          [&](const InternalError& err) { return says(err, "avg of integers"); });
    BOOST_CHECK_EXCEPTION(c.broadcast(out(a), DType::f32, 1), InternalError,
                          [&](const InternalError& err) { return says(err, "root 1"); });
    const comm::Buffer counted{in(a), out(a), {4, 4}};
    BOOST_CHECK_EXCEPTION(c.run(Kind::allgather, std::span(&counted, 1), DType::f32), InternalError,
                          [&](const InternalError& err) { return says(err, "2 counts for 1 ranks"); });
    std::vector<std::byte> odd(7);
    BOOST_CHECK_EXCEPTION(c.allgather(odd, odd, DType::f32), InternalError,
                          [&](const InternalError& err) { return says(err, "whole f32 elements"); });
    // Overlap but in the in-place forms: reduce-scatter into its own input.
    BOOST_CHECK_EXCEPTION(c.reduce_scatter(in(a), out(a), DType::f32), InternalError,
                          [&](const InternalError& err) { return says(err, "send and recv overlap"); });
    std::vector<float> wide(16);
    BOOST_CHECK_EXCEPTION(c.allreduce(std::as_bytes(std::span(wide).first(8)), std::as_writable_bytes(std::span(wide).subspan(4, 8)),
                                      DType::f32),
                          InternalError, [&](const InternalError& err) { return says(err, "overlap"); });
    // Refusals do not break the communicator.
    std::vector<float> x(3, 1), y(3);
    c.allreduce(in(x), out(y), DType::f32);
    BOOST_TEST(y == x);
}

// zero over one rank: the partition is the tensor; padding is neither read nor written.
BOOST_AUTO_TEST_CASE(zero_over_one_rank) {
    auto e = no_launcher();
    comm::Communicator c({.backend = comm::Backend::self});
    std::vector<float> own(13), full(13, -1);
    std::iota(own.begin(), own.end(), 1.0f);
    zero::gather(c, {in(own), out(full), 13}, DType::f32);
    BOOST_TEST(full == own);
    std::vector<float> grad(13, 0.5f), mine(13, 9);
    zero::reduce_scatter(c, {in(grad), out(mine), 13}, DType::f32);
    BOOST_TEST(mine == grad);
    std::vector<float> wrong(12);
    BOOST_CHECK_THROW(zero::gather(c, {in(wrong), out(full), 13}, DType::f32), InternalError);
}

// The bf16 rounding every module shares: to nearest even, NaN kept.
BOOST_AUTO_TEST_CASE(bf16_rounding_is_shared) {
    std::vector<float> v = {1.0f, 1.00390625f, 1.01171875f, -3.5f, std::nanf(""), INFINITY, 65504.0f};
    std::vector<std::uint16_t> vec(v.size());
    to_bf16(v, vec);
    for (std::size_t i = 0; i < v.size(); ++i) {
        BOOST_TEST(vec[i] == to_bf16(v[i]));
        BOOST_TEST(vec[i] == shard::to_bf16(v[i]));
    }
    BOOST_TEST(to_bf16(1.00390625f) == 0x3f80u);  // a tie rounds to even (down)
    BOOST_TEST(to_bf16(1.01171875f) == 0x3f82u);  // a tie rounds to even (up)
    BOOST_TEST(std::isnan(from_bf16(vec[4])));
}

// ---------------------------------------------------------------------------
// Where the flat area lives is the caller's: a communicator that lays
// buckets flat takes the area given (and none, to let it go); one whose
// collectives are host calls (self, mpi) needs none and refuses one.
BOOST_AUTO_TEST_CASE(the_flat_area_is_the_callers) {
    testing::FlatComm fake(2);
    comm::Communicator& c = fake.c;
    const auto& areas = fake.areas;
    std::vector<std::byte> mem(4096);
    c.set_flat_area(mem);
    c.set_flat_area({});
    BOOST_TEST_REQUIRE(areas->size() == 2u);
    BOOST_TEST(((*areas)[0].data() == mem.data() && (*areas)[0].size() == mem.size()));
    BOOST_TEST((*areas)[1].empty());
    // Two buffers, or one of uneven blocks, go flat; one of equal blocks not.
    const std::vector<std::vector<std::uint64_t>> two{{3, 3}, {5, 4}}, uneven{{5, 4}}, equal{{6, 6}};
    BOOST_TEST(c.flat_bytes(Kind::allgather, two, DType::f32) == 3u * (256 + 256));
    BOOST_TEST(c.flat_bytes(Kind::reduce_scatter, uneven, DType::f32) == 3u * 256);
    BOOST_TEST(c.flat_bytes(Kind::allgather, equal, DType::f32) == 0u);
    BOOST_TEST(c.flat_bytes(Kind::allreduce, two, DType::f32) == 0u);
    const std::vector<std::vector<std::uint64_t>> three{{1, 2, 3}}, two_buffers{{7}, {9}};
    testing::what_of<InternalError>([&] { (void)c.flat_bytes(Kind::allgather, three, DType::f32); },
                                    "three counts for two ranks");

    comm::Communicator self({.backend = comm::Backend::self});
    BOOST_TEST(self.flat_bytes(Kind::allgather, two_buffers, DType::f32) == 0u);
    self.set_flat_area({});
    const std::string what = testing::what_of<InternalError>([&] { self.set_flat_area(mem); }, "an area for self");
    BOOST_TEST(testing::contains(what, "lays no bucket flat"), what);
}

// ---------------------------------------------------------------------------
// The flat bucket (comm/flat.cpp) that makes a bucket one NCCL call,
// simulated over dp ranks in one process, host copies standing in for
// cudaMemcpy2DAsync (pitches at least the width, as it requires). Random
// buckets of 1-5 buffers, every element size, dp 1-8, blocks by the
// partition rule (uneven, some ranks empty) or equal: each rank plans the
// same flat block; each buffer sits at a 256-byte-aligned offset with room
// for its widest block and overlaps no other; every rank's block of every
// buffer is covered by exactly one run (at most two per buffer under the
// partition rule, one for equal blocks); and pack -> one equal-block
// allgather or reduce-scatter (summed in rank order) -> unpack gives each
// rank what the per-buffer collectives give, with the padding poisoned.
BOOST_AUTO_TEST_CASE(a_bucket_laid_flat_is_one_equal_block_collective) {
    namespace cd = comm::detail;
    std::mt19937_64 rng(testing::seed("flat bucket"));
    const cd::Copy2d host_copy = [](std::byte* dst, std::uint64_t dpitch, const std::byte* src, std::uint64_t spitch,
                                    std::uint64_t width, std::uint64_t rows) {
        BOOST_TEST_REQUIRE((width > 0 && rows > 0 && width <= dpitch && width <= spitch));
        for (std::uint64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dpitch, src + r * spitch, width);
    };
    const DType dtypes[] = {DType::u8, DType::bf16, DType::f32, DType::f64};
    using Bytes = std::vector<std::byte>;
    for (int trial = 0; trial < 300; ++trial) {
        const int dp = 1 + static_cast<int>(rng() % 8);
        const DType dtype = dtypes[rng() % 4];
        const std::uint64_t es = comm::dtype_bytes(dtype);
        const bool equal = rng() % 3 == 0;
        const std::size_t nb = 1 + rng() % 5;
        std::vector<std::uint64_t> numel(nb);
        std::vector<std::vector<std::uint64_t>> counts(nb);  // [buffer][rank]
        for (std::size_t b = 0; b < nb; ++b) {
            numel[b] = equal ? static_cast<std::uint64_t>(dp) * (1 + rng() % 300) : 1 + rng() % 2000;
            if (!equal && rng() % 4 == 0) numel[b] = 1 + rng() % static_cast<std::uint64_t>(dp);  // ranks left empty
            for (int r = 0; r < dp; ++r)
                counts[b].push_back(shard::owned(numel[b], static_cast<unsigned>(dp), static_cast<unsigned>(r)).count);
        }
        const auto first = [&](std::size_t b, int r) {
            return std::accumulate(counts[b].begin(), counts[b].begin() + r, std::uint64_t{0});
        };
        const auto random_bytes = [&](std::uint64_t elements, int dp_sum) {
            Bytes v(elements * es);
            // Small integers: their sums over ranks are exact in every dtype.
            for (std::uint64_t i = 0; i < elements; ++i)
                testing::put_int(dtype, v.data() + i * es, static_cast<std::int64_t>(1 + rng() % (200 / dp_sum / 2)));
            return v;
        };
        BOOST_TEST_CONTEXT("trial " << trial << ": dp " << dp << ", " << es << "-byte elements, "
                                    << (equal ? "equal" : "uneven") << " blocks of " << nb << " buffers") {
            for (const Kind kind : {Kind::allgather, Kind::reduce_scatter}) {
                // Every rank's operation over its own buffers.
                std::vector<Bytes> full(nb);                  // allgather: the truth every rank's recv ends as
                std::vector<std::vector<Bytes>> sends(dp), recvs(dp);
                for (std::size_t b = 0; b < nb; ++b) full[b] = random_bytes(numel[b], 1);
                std::vector<std::unique_ptr<cd::Op>> ops;
                for (int r = 0; r < dp; ++r) {
                    auto op = std::make_unique<cd::Op>();
                    op->kind = kind;
                    op->dtype = dtype;
                    for (std::size_t b = 0; b < nb; ++b) {
                        const std::uint64_t mine = counts[b][static_cast<std::size_t>(r)];
                        if (kind == Kind::allgather) {
                            const auto from = full[b].begin() + static_cast<std::ptrdiff_t>(first(b, r) * es);
                            sends[r].emplace_back(from, from + static_cast<std::ptrdiff_t>(mine * es));
                            recvs[r].emplace_back(numel[b] * es, std::byte{0xa5});
                        } else {
                            sends[r].push_back(random_bytes(numel[b], dp));
                            recvs[r].emplace_back(mine * es, std::byte{0xa5});
                        }
                    }
                    for (std::size_t b = 0; b < nb; ++b)
                        op->bufs.push_back(
                            {sends[r][b], recvs[r][b], equal ? std::vector<std::uint64_t>{} : counts[b]});
                    ops.push_back(std::move(op));
                }
                const bool uneven = std::any_of(counts.begin(), counts.end(), [](const auto& c) {
                    return std::any_of(c.begin(), c.end(), [&](std::uint64_t x) { return x != c[0]; });
                });
                BOOST_TEST(cd::needs_flat(*ops[0]) == (nb > 1 || uneven));
                // What a communicator that lays buckets flat asks of its
                // caller for this bucket: the area the collective runs in.
                BOOST_TEST(testing::FlatComm(dp).c.flat_bytes(kind, counts, dtype) ==
                           (nb > 1 || uneven ? cd::plan_flat(*ops[0], dp).bytes(dp) : 0u));
                const cd::FlatPlan plan = cd::plan_flat(*ops[0], dp);
                for (int r = 1; r < dp; ++r) {
                    const cd::FlatPlan other = cd::plan_flat(*ops[static_cast<std::size_t>(r)], dp);
                    BOOST_TEST_REQUIRE((other.block == plan.block && other.at == plan.at));
                }
                BOOST_TEST(plan.es == es);
                BOOST_TEST(plan.area() % cd::kFlatAlignBytes == 0u);
                BOOST_TEST_REQUIRE(plan.at.size() == nb);
                for (std::size_t b = 0; b < nb; ++b) {
                    const std::uint64_t widest = *std::max_element(counts[b].begin(), counts[b].end());
                    const std::uint64_t end = b + 1 < nb ? plan.at[b + 1] : plan.block;
                    BOOST_TEST(plan.at[b] * es % cd::kFlatAlignBytes == 0u);
                    BOOST_TEST(plan.at[b] + widest <= end);
                    BOOST_TEST(end - plan.at[b] < widest + cd::kFlatAlignBytes / es);
                    std::size_t runs = 0;
                    for (int r = 0; r < dp; ++r) {
                        const std::uint64_t n = counts[b][static_cast<std::size_t>(r)];
                        int covered = 0;
                        for (const cd::FlatRun& run : plan.rows) {
                            if (run.buffer != b || r < run.rank || r >= run.rank + run.ranks) continue;
                            ++covered;
                            BOOST_TEST(run.count == n);
                            BOOST_TEST(run.flat == static_cast<std::uint64_t>(run.rank) * plan.block + plan.at[b]);
                            BOOST_TEST(run.first == first(b, run.rank));
                        }
                        BOOST_TEST(covered == (n ? 1 : 0), "buffer " << b << " rank " << r);
                    }
                    for (const cd::FlatRun& run : plan.rows) runs += run.buffer == b;
                    BOOST_TEST(runs <= (equal ? 1u : 2u), "buffer " << b);
                }

                // Pack on every rank, one equal-block collective, unpack;
                // each rank's flat area is plan.bytes(dp), laid out as NCCL
                // lays it: every rank's block, then this rank's own.
                const std::uint64_t B = plan.area();
                BOOST_TEST(plan.bytes(dp) == B * static_cast<std::uint64_t>(dp + 1));
                std::vector<Bytes> area(dp);
                std::vector<std::byte*> all(dp), mine(dp);
                for (int r = 0; r < dp; ++r) {
                    area[r].resize(plan.bytes(dp));
                    for (auto& x : area[r]) x = static_cast<std::byte>(rng());  // poisoned padding
                    all[r] = area[r].data();
                    mine[r] = area[r].data() + B * static_cast<std::uint64_t>(dp);
                    cd::flat_pack(*ops[r], plan, all[r], mine[r], host_copy);
                }
                if (kind == Kind::allgather) {
                    for (int q = 0; q < dp; ++q)
                        for (int r = 0; r < dp; ++r)
                            std::memcpy(all[q] + static_cast<std::uint64_t>(r) * B, mine[r], B);
                } else {
                    for (int q = 0; q < dp; ++q)
                        for (std::uint64_t i = 0; i < plan.block; ++i) {
                            std::int64_t sum = 0;
                            for (int r = 0; r < dp; ++r)
                                sum += testing::get_int(dtype, all[r] + std::uint64_t(q) * B + i * es);
                            testing::put_int(dtype, mine[q] + i * es, sum);
                        }
                }
                for (int r = 0; r < dp; ++r) {
                    cd::flat_unpack(*ops[r], plan, all[r], mine[r], host_copy);
                    for (std::size_t b = 0; b < nb; ++b) {
                        if (kind == Kind::allgather) {
                            BOOST_TEST((recvs[r][b] == full[b]), comm::name(kind) << " rank " << r << " buffer " << b);
                            continue;
                        }
                        const std::uint64_t n = counts[b][static_cast<std::size_t>(r)], at = first(b, r);
                        bool same = true;
                        for (std::uint64_t i = 0; i < n && same; ++i) {
                            std::int64_t sum = 0;
                            for (int q = 0; q < dp; ++q)
                                sum += testing::get_int(dtype, sends[q][b].data() + (at + i) * es);
                            same = testing::get_int(dtype, recvs[r][b].data() + i * es) == sum;
                        }
                        BOOST_TEST(same, comm::name(kind) << " rank " << r << " buffer " << b);
                    }
                }
            }
        }
    }
}
