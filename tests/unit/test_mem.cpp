// Unit tests of libzinf mem: PinnedPool (leases, exhaustion and its message,
// RAII on exceptions, mlock refused), Stream (odd ranges larger than the pool
// through both io backends, direct and buffered) and DeviceArena (best fit,
// coalescing, --max-block, out-of-memory message). Also run under
// SANITIZE=thread and SANITIZE=address by `make test`.
#define BOOST_TEST_MODULE mem
#include "io_testing.hpp"

#include <zinf/mem.hpp>

#include <nlohmann/json.hpp>
#include <atomic>
#include <cstring>
#include <linux/capability.h>
#include <set>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

using namespace zinf;
using namespace zinf::mem;
using namespace zinf::testing;
using namespace std::chrono_literals;

namespace {

PoolConfig small_pool(std::size_t buffers, std::uint64_t buffer = 64 * KiB) {
    PoolConfig c;
    c.bytes = buffers * buffer;
    c.buffer = buffer;
    c.allocator = "host";
    c.lease_timeout = 5s;
    return c;
}


}  // namespace

BOOST_AUTO_TEST_SUITE(pool)

BOOST_AUTO_TEST_CASE(buffers_are_distinct_aligned_and_counted) {
    PinnedPool pool(small_pool(8));
    BOOST_TEST(pool.buffers() == 8u);
    std::vector<Lease> leases;
    std::set<std::byte*> seen;
    for (int i = 0; i < 8; ++i) {
        leases.push_back(pool.lease("t"));
        BOOST_TEST(is_aligned(leases.back().data(), kPoolAlignment));
        BOOST_TEST(leases.back().size() == 64 * KiB);
        seen.insert(leases.back().data());
    }
    BOOST_TEST(seen.size() == 8u);
    // Buffers do not overlap: each starts a whole buffer from the others.
    for (auto a : seen)
        for (auto b : seen)
            if (a != b) BOOST_TEST(static_cast<std::uint64_t>(std::abs(a - b)) >= 64 * KiB);
    BOOST_TEST(pool.stats().in_use == 8u);
    BOOST_TEST(!pool.try_lease("t"));
    leases.resize(3);
    PoolStats st = pool.stats();
    BOOST_TEST(st.in_use == 3u);
    BOOST_TEST(st.high_water == 8u);
    BOOST_TEST(st.leases == 8u);
    BOOST_TEST(st.waits == 0u);
    BOOST_TEST(st.allocator == "mmap");
}

BOOST_AUTO_TEST_CASE(lease_moves_and_releases_once) {
    PinnedPool pool(small_pool(2));
    Lease a = pool.lease("a");
    std::byte* p = a.data();
    Lease b = std::move(a);
    BOOST_TEST(!a);
    BOOST_TEST(b.data() == p);
    BOOST_TEST(pool.stats().in_use == 1u);
    Lease c = pool.lease("c");
    c = std::move(b);  // c's own buffer goes back, b's is now c's
    BOOST_TEST(pool.stats().in_use == 1u);
    BOOST_TEST(c.data() == p);
    c.release();
    c.release();
    BOOST_TEST(pool.stats().in_use == 0u);
}

BOOST_AUTO_TEST_CASE(leases_return_when_an_exception_unwinds) {
    PinnedPool pool(small_pool(4));
    try {
        auto many = pool.lease_many(3, "doomed");
        Lease one = pool.lease("doomed too");
        BOOST_TEST(pool.stats().in_use == 4u);
        throw std::runtime_error("boom");
    } catch (const std::runtime_error&) {
    }
    BOOST_TEST(pool.stats().in_use == 0u);
    BOOST_TEST(pool.holders().empty());
}

BOOST_AUTO_TEST_CASE(exhaustion_times_out_naming_the_holders) {
    PinnedPool pool(small_pool(3));
    auto held = pool.lease_many(2, "optimizer step");
    Lease other;
    std::thread t([&] { other = pool.lease("prefetcher"); });
    t.join();
    const auto t0 = std::chrono::steady_clock::now();
    try {
        (void)pool.lease("gradient offload", 200ms);
        BOOST_FAIL("lease on an empty pool did not time out");
    } catch (const InternalError& e) {
        const std::string m = e.what();
        BOOST_TEST_MESSAGE(m);
        BOOST_TEST(contains(m, "'gradient offload' waited 0.2s for 1 of 3 buffers (64KiB each)"));
        BOOST_TEST(contains(m, "'optimizer step' (thread "));
        BOOST_TEST(contains(m, "2 buffers, held up to"));
        BOOST_TEST(contains(m, "'prefetcher' (thread "));
        BOOST_TEST(contains(m, "1 buffer, held up to"));
    }
    BOOST_TEST((std::chrono::steady_clock::now() - t0 >= 200ms));
    const PoolStats st = pool.stats();
    BOOST_TEST(st.waits == 1u);
    BOOST_TEST(st.wait_seconds >= 0.19);
    // Holders name the thread that leased, not the one asking.
    auto hs = pool.holders();
    BOOST_TEST(hs.size() == 3u);
    BOOST_TEST(std::count_if(hs.begin(), hs.end(), [&](const Holder& h) {
                   return h.who == "prefetcher" && h.thread != std::this_thread::get_id();
               }) == 1);
}

BOOST_AUTO_TEST_CASE(a_blocked_lease_gets_the_buffer_released_by_another_thread) {
    PinnedPool pool(small_pool(2));
    auto all = pool.lease_many(2, "first");
    std::atomic<bool> got{false};
    std::thread t([&] {
        Lease l = pool.lease("second", 10s);
        got = l.size() == 64 * KiB;
    });
    // Until the thread waits in lease() (a sleep was not enough on a loaded
    // machine: the thread started after the buffer came back, and never waited).
    for (int i = 0; i < 10000 && pool.stats().waits == 0; ++i) std::this_thread::sleep_for(1ms);
    BOOST_TEST(!got.load());
    all.pop_back();
    t.join();
    BOOST_TEST(got.load());
    BOOST_TEST(pool.stats().waits == 1u);
}

// First come, first served: a waiting lease_many(2) is not starved by single
// leases that arrive after it and would take each buffer as it comes back.
BOOST_AUTO_TEST_CASE(a_large_lease_is_not_starved_by_later_small_ones) {
    PinnedPool pool(small_pool(2));
    Lease a = pool.lease("a"), b = pool.lease("b");
    std::atomic<bool> big_done{false};
    std::thread big([&] { big_done = pool.lease_many(2, "big", 5s).size() == 2; });
    while (pool.stats().waits == 0) std::this_thread::sleep_for(1ms);  // big is queued
    a.release();  // one free: not enough for big, and not for anyone behind it
    BOOST_TEST(!pool.try_lease("late"));
    BOOST_CHECK_THROW((void)pool.lease("late", 50ms), InternalError);
    b.release();
    big.join();
    BOOST_TEST(big_done.load());
    BOOST_TEST(static_cast<bool>(pool.try_lease("after")));  // all back, nobody queued
}

BOOST_AUTO_TEST_CASE(lease_many_is_all_or_none) {
    PinnedPool pool(small_pool(4));
    auto three = pool.lease_many(3, "a");
    BOOST_CHECK_THROW((void)pool.lease_many(2, "b", 50ms), InternalError);
    BOOST_TEST(pool.stats().in_use == 3u);  // b took nothing while it waited
    BOOST_CHECK_THROW((void)pool.lease_many(5, "c"), UsageError);
    three.clear();
    BOOST_TEST(pool.lease_many(4, "d").size() == 4u);
}

BOOST_AUTO_TEST_CASE(many_threads_never_share_a_buffer) {
    PinnedPool pool(small_pool(4, 4 * KiB));
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 6; ++t)
        ts.emplace_back([&, t] {
            for (int round = 0; round < 300; ++round) {
                auto ls = pool.lease_many(1 + (round + t) % 2, "worker");
                const auto mark = static_cast<std::byte>(t * 31 + round);
                for (auto& l : ls) std::fill(l.bytes().begin(), l.bytes().end(), mark);
                std::this_thread::yield();
                for (auto& l : ls)
                    if (std::any_of(l.bytes().begin(), l.bytes().end(), [&](std::byte b) { return b != mark; })) ++bad;
            }
        });
    for (auto& t : ts) t.join();
    BOOST_TEST(bad.load() == 0);
    BOOST_TEST(pool.stats().in_use == 0u);
    BOOST_TEST(pool.stats().high_water <= 4u);
}

BOOST_AUTO_TEST_CASE(a_lease_outliving_the_pool_keeps_its_memory_and_is_reported) {
    Lease survivor;
    std::string err = capture_stderr([&] {
        PinnedPool pool(small_pool(2));
        survivor = pool.lease("survivor");
    });
    BOOST_TEST(contains(err, "1 buffer(s) still leased"));
    BOOST_TEST(contains(err, "'survivor'"));
    // Still valid memory (AddressSanitizer would catch a use after unmap).
    std::fill(survivor.bytes().begin(), survivor.bytes().end(), std::byte{7});
    BOOST_TEST(static_cast<int>(survivor.bytes()[100]) == 7);
}

BOOST_AUTO_TEST_CASE(config_validation_and_json) {
    PoolConfig c;
    c.buffer = 5000;
    BOOST_CHECK_THROW(c.validate(), UsageError);
    c.buffer = 64 * MiB;
    c.bytes = 32 * MiB;
    BOOST_CHECK_THROW(c.validate(), UsageError);
    auto j = json::Json{{"pinned", "2GiB"}, {"pinned_buffer", 67108864}, {"lease_timeout", "90s"}};
    PoolConfig d = PoolConfig::from_json(j, "cfg.json");
    BOOST_TEST(d.bytes == 2 * GiB);
    BOOST_TEST(d.buffer == 64 * MiB);
    BOOST_TEST(d.buffers() == 32u);
    BOOST_TEST(d.lease_timeout.count() == 90000);
    PoolConfig e = PoolConfig::from_json(d.to_json(), "round trip");
    BOOST_TEST(e.bytes == d.bytes);
    BOOST_TEST(e.buffer == d.buffer);
    // Found with the config fuzz target (tests/fuzz/corpus/config/crash-*): a
    // size that is not a whole number of its unit was written rounded
    // ("4.0GiB" for 4GiB + 1) and read back as another size.
    d.bytes = 4 * GiB + 1;
    d.buffer = 16 * MiB;
    BOOST_TEST(d.to_json()["pinned"] == json::Json(4 * GiB + 1));
    BOOST_TEST(d.to_json()["pinned_buffer"] == json::Json("16MiB"));
    BOOST_TEST(PoolConfig::from_json(d.to_json(), "round trip").bytes == 4 * GiB + 1);
    try {
        (void)PoolConfig::from_json(json::Json{{"pinned_buffers", "64MiB"}}, "cfg.json");
        BOOST_FAIL("a misspelt key was accepted");
    } catch (const DataError& ex) {
        BOOST_TEST(contains(ex.what(), "cfg.json: unknown key \"pinned_buffers\""));
    }
    BOOST_CHECK_THROW((void)PoolConfig::from_json(json::Json{{"pinned", "lots"}}, "x"), DataError);
}

// Root has CAP_IPC_LOCK, which ignores RLIMIT_MEMLOCK: drop it from this
// thread's effective set for the test and raise it again afterwards.
struct MemlockLimited {
    rlimit saved{};
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    bool had_cap = false;
    explicit MemlockLimited(rlim_t limit) {
        ::getrlimit(RLIMIT_MEMLOCK, &saved);
        ::syscall(SYS_capget, &hdr, caps);
        had_cap = caps[0].effective & (1u << CAP_IPC_LOCK);
        if (had_cap) {
            __user_cap_data_struct dropped[2] = {caps[0], caps[1]};
            dropped[0].effective &= ~(1u << CAP_IPC_LOCK);
            ::syscall(SYS_capset, &hdr, dropped);
        }
        rlimit low{limit, saved.rlim_max};
        ::setrlimit(RLIMIT_MEMLOCK, &low);
    }
    ~MemlockLimited() {
        ::setrlimit(RLIMIT_MEMLOCK, &saved);
        if (had_cap) ::syscall(SYS_capset, &hdr, caps);
    }
};

BOOST_AUTO_TEST_CASE(mlock_refused_runs_unlocked_and_says_so) {
    PoolStats st;
    std::string err;
    {
        MemlockLimited lim(64 * KiB);
        err = capture_stderr([&] {
            PinnedPool pool(small_pool(8, 1 * MiB));
            st = pool.stats();
            Lease l = pool.lease("still works");
            std::fill(l.bytes().begin(), l.bytes().end(), std::byte{1});
        });
    }
    BOOST_TEST(!st.locked);
    BOOST_TEST(st.allocator == "mmap");
    BOOST_TEST(contains(err, "cannot page-lock the 8MiB pinned pool"));
    BOOST_TEST(contains(err, "RLIMIT_MEMLOCK is 64KiB"));
    BOOST_TEST(contains(err, "ulimit -l"));
    // With the limit back, the next pool is locked.
    PinnedPool pool(small_pool(8, 1 * MiB));
    BOOST_TEST(pool.stats().locked);
}

BOOST_AUTO_TEST_CASE(buffers_are_registered_with_the_engine, *utf::precondition(UringPresent())) {
    TempDir dir;
    Engine eng(config("uring", 64 * KiB, 8, 1));
    PinnedPool pool(small_pool(4), &eng);
    BOOST_TEST(pool.stats().registered);
    File f = open_rw(dir.file("r.bin"));
    std::mt19937_64 rng(seed("registered"));
    auto data = random_bytes(64 * KiB, rng);
    Lease l = pool.lease("io");
    std::copy(data.begin(), data.end(), l.data());
    eng.wait(eng.write(f, 0, l.bytes()));
    std::fill(l.bytes().begin(), l.bytes().end(), std::byte{0});
    eng.wait(eng.read(f, 0, l.bytes()));
    BOOST_TEST(std::equal(data.begin(), data.end(), l.data()));
    BOOST_TEST(eng.stats().fixed_pieces == 2u);
}

// pin(): a region beside the buffers, page-locked, zero-filled, registered
// with the pool's engine (reads and writes into it use the fixed buffer),
// counted in the stats while it lives; the leasable buffers are untouched.
BOOST_AUTO_TEST_CASE(pinned_regions_are_locked_registered_and_counted, *utf::precondition(UringPresent())) {
    TempDir dir;
    Engine eng(config("uring", 64 * KiB, 8, 1));
    PinnedPool pool(small_pool(4), &eng);
    const std::uint64_t bytes = 3 * 64 * KiB + 100;  // not a page multiple: the page rounding is counted
    {
        Pinned r = pool.pin(bytes, "test region");
        BOOST_TEST(r.size() == bytes);
        BOOST_TEST(r.bytes().size() == bytes);
        BOOST_TEST(reinterpret_cast<std::uintptr_t>(r.data()) % kPoolAlignment == 0u);
        BOOST_TEST(r.locked());
        BOOST_TEST(r.registered());
        BOOST_TEST(std::all_of(r.bytes().begin(), r.bytes().end(), [](std::byte b) { return b == std::byte{0}; }));
        const PoolStats st = pool.stats();
        BOOST_TEST(st.pinned == 1u);
        BOOST_TEST(st.pinned_bytes == align_up(bytes, kPoolAlignment));
        BOOST_TEST(st.in_use == 0u);
        BOOST_TEST(st.buffers == 4u);

        File f = open_rw(dir.file("p.bin"));
        std::mt19937_64 rng(seed("pinned region"));
        const auto data = random_bytes(3 * 64 * KiB, rng);
        std::copy(data.begin(), data.end(), r.data());
        const std::uint64_t fixed = eng.stats().fixed_pieces;
        eng.wait(eng.write(f, 0, r.bytes().first(data.size())));
        std::fill(r.bytes().begin(), r.bytes().end(), std::byte{0});
        eng.wait(eng.read(f, 0, r.bytes().first(data.size())));
        BOOST_TEST(std::equal(data.begin(), data.end(), r.data()));
        BOOST_TEST(eng.stats().fixed_pieces == fixed + 6u);  // three 64KiB pieces each way

        Pinned moved = std::move(r);
        BOOST_TEST(!r);
        BOOST_TEST(moved.size() == bytes);
        BOOST_TEST(pool.stats().pinned == 1u);
    }
    BOOST_TEST(pool.stats().pinned == 0u);
    BOOST_TEST(pool.stats().pinned_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(a_pinned_region_without_mlock_stays_pageable_and_says_so) {
    std::string err;
    bool locked = true;
    std::uint64_t sum = 0;
    {
        MemlockLimited lim(64 * KiB);
        PinnedPool pool(small_pool(1, 32 * KiB));  // fits the limit
        err = capture_stderr([&] {
            Pinned r = pool.pin(1 * MiB, "test state");
            locked = r.locked();
            std::fill(r.bytes().begin(), r.bytes().end(), std::byte{2});
            for (std::byte b : r.bytes()) sum += static_cast<std::uint64_t>(b);
        });
    }
    BOOST_TEST(!locked);
    BOOST_TEST(sum == 2u * MiB);
    BOOST_TEST(contains(err, "cannot page-lock the test state (1MiB; mlock: "));
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(stream)

namespace {

// A file of `size` random bytes written through the stream itself, then
// ranges with odd edges read back and rewritten, bytes compared with a model
// of what the file must hold.
void stream_ranges(const std::string& engine, Direct direct) {
    TempDir dir;
    std::mt19937_64 rng(seed(("stream " + engine).c_str()));
    Engine eng(config(engine, 16 * KiB, 4, 2));
    PinnedPool pool(small_pool(4, 64 * KiB), &eng);  // 256KiB of pool
    Stream stream(eng, pool, {.buffers = 3, .who = "test stream"});
    File f = open_rw(dir.file("s.bin"), direct);
    BOOST_TEST_MESSAGE(engine << (f.direct() ? " direct" : " buffered") << ", alignment " << f.alignment());

    const std::size_t size = 1 * MiB + 12345;  // larger than the pool, not aligned
    std::vector<std::byte> model = random_bytes(size, rng);
    stream.write(f, 0, model);
    BOOST_TEST(f.size() == size);

    std::uniform_int_distribution<std::size_t> pick(0, size);
    for (int round = 0; round < 12; ++round) {
        std::size_t a = pick(rng), b = pick(rng);
        if (a > b) std::swap(a, b);
        if (round == 0) a = 0, b = size;          // the whole file
        if (round == 1) a = size - 1, b = size;   // the last byte
        if (round == 2) a = 4095, b = 4097 + 3 * 256 * KiB;  // straddles blocks, > pool
        std::vector<std::byte> got(b - a, std::byte{0xEE});
        stream.read(f, a, got);
        BOOST_TEST(std::equal(got.begin(), got.end(), model.begin() + a), "read [" << a << ", " << b << ")");

        // Rewrite another odd range; bytes around it must survive.
        std::size_t c = pick(rng), d = pick(rng);
        if (c > d) std::swap(c, d);
        auto fresh = random_bytes(d - c, rng);
        stream.write(f, c, fresh);
        std::copy(fresh.begin(), fresh.end(), model.begin() + c);
        BOOST_TEST(f.size() == size);
    }
    std::vector<std::byte> all(size);
    stream.read(f, 0, all);
    BOOST_TEST((all == model));

    // Growing the file: it ends exactly at the range's end, the gap reads zeros.
    auto tail = random_bytes(70001, rng);
    stream.write(f, size + 5, tail);
    BOOST_TEST(f.size() == size + 5 + tail.size());
    std::vector<std::byte> back(tail.size() + 5);
    stream.read(f, size, back);
    BOOST_TEST(std::all_of(back.begin(), back.begin() + 5, [](std::byte x) { return x == std::byte{0}; }));
    BOOST_TEST(std::equal(tail.begin(), tail.end(), back.begin() + 5));

    // Past the end is an error naming the file; nothing was read into dst.
    std::vector<std::byte> over(10);
    try {
        stream.read(f, f.size() - 5, over);
        BOOST_FAIL("a read past the end was accepted");
    } catch (const DataError& e) {
        BOOST_TEST(contains(e.what(), "s.bin"));
        BOOST_TEST(contains(e.what(), "past its end"));
    }
    BOOST_TEST(pool.stats().in_use == 0u);
    BOOST_TEST(pool.stats().high_water <= 3u);  // never more than the stream's buffers
    BOOST_TEST(pool.stats().bytes_moved > 3 * size);
}

// The sink sees the range's pieces in order, each no larger than a buffer.
void stream_pieces_in_order(const std::string& engine) {
    TempDir dir;
    std::mt19937_64 rng(seed("pieces"));
    Engine eng(config(engine, 32 * KiB, 8, 1));
    PinnedPool pool(small_pool(2, 64 * KiB), &eng);
    File f = open_rw(dir.file("p.bin"));
    auto data = random_bytes(500 * KiB + 3, rng);
    Stream(eng, pool).write(f, 0, data);
    std::uint64_t expect = 0;
    bool ordered = true, small = true;
    Xxh3Stream h;
    Stream(eng, pool).read(f, 7, data.size() - 7, [&](std::uint64_t at, std::span<const std::byte> piece) {
        ordered = ordered && at == expect;
        small = small && piece.size() <= 64 * KiB;
        expect += piece.size();
        h.update(piece);
    });
    BOOST_TEST(ordered);
    BOOST_TEST(small);
    BOOST_TEST(expect == data.size() - 7);
    BOOST_TEST(h.digest() == xxh3(std::span<const std::byte>(data).subspan(7)));
}

void stream_errors_release_the_buffers(const std::string& engine) {
    TempDir dir;
    Engine eng(config(engine, 16 * KiB, 4, 1));
    PinnedPool pool(small_pool(4), &eng);
    File f = open_rw(dir.file("e.bin"));
    std::vector<std::byte> data(600 * KiB, std::byte{3});
    Stream(eng, pool).write(f, 0, data);
    // A sink that throws midway: the reads in flight are waited, buffers return.
    int calls = 0;
    BOOST_CHECK_THROW(Stream(eng, pool).read(f, 0, data.size(),
                                             [&](std::uint64_t, std::span<const std::byte>) {
                                                 if (++calls == 3) throw std::runtime_error("sink failed");
                                             }),
                      std::runtime_error);
    BOOST_TEST(pool.stats().in_use == 0u);
    // An injected I/O error reaches the caller as an IoError naming the file.
    f.inject_fault({Op::read, 5, EIO});
    try {
        Stream(eng, pool).read(f, 0, data);
        BOOST_FAIL("an injected EIO was not reported");
    } catch (const IoError& e) {
        BOOST_TEST(contains(e.what(), "e.bin"));
    }
    BOOST_TEST(pool.stats().in_use == 0u);
}

}  // namespace

// Writers of disjoint ranges of one file, at once: neighbours that share a
// direct-I/O block and a page, and a writer that extends the file while
// another one's range ends before. Nobody loses a byte.
void concurrent_writers(const std::string& engine) {
    TempDir dir;
    std::mt19937_64 rng(seed("concurrent writers"));
    Engine eng(config(engine, 16 * KiB, 4, 2));
    PinnedPool pool(small_pool(8), &eng);
    File f = open_rw(dir.file("c.bin"));
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {
        {0, 100}, {100, 200}, {200, 5000}, {5000, 305000}, {305000, 305001}};
    for (int trial = 0; trial < 10; ++trial) {
        f.truncate(0);
        std::vector<std::vector<std::byte>> data;
        for (auto [a, b] : ranges) data.push_back(random_bytes(b - a, rng));
        std::vector<std::thread> ts;
        for (std::size_t r = 0; r < ranges.size(); ++r)
            ts.emplace_back([&, r] {
                Stream(eng, pool, {.buffers = 1}).write(f, ranges[r].first, ranges[r].second - ranges[r].first,
                                                       [&](std::uint64_t at, std::span<std::byte> piece) {
                                                           if (r % 2 == 0) std::this_thread::sleep_for(1ms);
                                                           std::memcpy(piece.data(), data[r].data() + at, piece.size());
                                                       });
            });
        for (auto& t : ts) t.join();
        BOOST_TEST_REQUIRE(f.size() == 305001u);
        std::vector<std::byte> back(305001);
        Stream(eng, pool).read(f, 0, back);
        for (std::size_t r = 0; r < ranges.size(); ++r)
            BOOST_TEST(std::equal(data[r].begin(), data[r].end(), back.begin() + static_cast<long>(ranges[r].first)),
                       "trial " << trial << ": range [" << ranges[r].first << ", " << ranges[r].second << ")");
    }
}

BOTH_BACKENDS(concurrent_writers)
BOTH_BACKENDS(stream_pieces_in_order)
BOTH_BACKENDS(stream_errors_release_the_buffers)

BOOST_AUTO_TEST_CASE(unaligned_writes_to_a_write_only_file) {
    TempDir dir;
    std::mt19937_64 rng(seed("write-only"));
    Engine eng(config("threads", 16 * KiB, 4, 1));
    PinnedPool pool(small_pool(4), &eng);
    const std::string path = dir.file("w.bin");
    auto first = random_bytes(100000, rng), second = random_bytes(777, rng);
    {
        File w = File::open(path, {.access = Access::write, .create = true});
        Stream(eng, pool).write(w, 0, first);
        Stream(eng, pool).write(w, 10, second);  // edges inside a block, no read needed
        w.close();
    }
    std::copy(second.begin(), second.end(), first.begin() + 10);
    File r = File::open(path);
    std::vector<std::byte> back(first.size());
    Stream(eng, pool).read(r, 0, back);
    BOOST_TEST((back == first));
}

BOOST_AUTO_TEST_CASE(odd_ranges_direct_uring, *utf::precondition(UringPresent())) {
    stream_ranges("uring", Direct::prefer);
}
BOOST_AUTO_TEST_CASE(odd_ranges_direct_threads) { stream_ranges("threads", Direct::prefer); }
BOOST_AUTO_TEST_CASE(odd_ranges_buffered_uring, *utf::precondition(UringPresent())) {
    stream_ranges("uring", Direct::buffered);
}
BOOST_AUTO_TEST_CASE(odd_ranges_buffered_threads) { stream_ranges("threads", Direct::buffered); }

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(arena)

BOOST_AUTO_TEST_CASE(allocations_are_aligned_and_accounted) {
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .backend = "host"});
    BOOST_TEST(a.backend() == "host");
    BOOST_TEST(!a.on_gpu());
    Block x = a.allocate(1, "x");
    Block y = a.allocate(300, "y");
    BOOST_TEST(x.size() == 1u);
    BOOST_TEST(y.offset() == 256u);  // x rounded up to 256 bytes
    BOOST_TEST(is_aligned(x.data(), kArenaAlignment));
    BOOST_TEST(is_aligned(y.data(), kArenaAlignment));
    ArenaStats s = a.stats();
    BOOST_TEST(s.used == 256u + 512u);
    BOOST_TEST(s.allocations == 2u);
    BOOST_TEST(s.free == 1 * MiB - 768);
    x.reset();
    y = Block();
    BOOST_TEST(a.stats().used == 0u);
    BOOST_TEST(a.stats().peak == 768u);
    BOOST_TEST(a.stats().largest_free == 1 * MiB);
}

BOOST_AUTO_TEST_CASE(best_fit_takes_the_smallest_hole_that_fits) {
    DeviceArena a(ArenaConfig{.bytes = 64 * KiB, .backend = "host"});
    // Holes of 8KiB, 2KiB and 4KiB, separated by live blocks.
    Block h1 = a.allocate(8 * KiB), s1 = a.allocate(256), h2 = a.allocate(2 * KiB), s2 = a.allocate(256),
          h3 = a.allocate(4 * KiB), s3 = a.allocate(256);
    const auto off2 = h2.offset(), off3 = h3.offset();
    h1.reset(), h2.reset(), h3.reset();
    Block fit3 = a.allocate(3 * KiB);  // fits 8K and 4K holes (and the tail): the 4K one
    BOOST_TEST(fit3.offset() == off3);
    Block fit2 = a.allocate(2 * KiB);  // exactly the 2K hole
    BOOST_TEST(fit2.offset() == off2);
    Block fit1 = a.allocate(1 * KiB);  // the leftover 1K of the 4K hole
    BOOST_TEST(fit1.offset() == off3 + 3 * KiB);
}

BOOST_AUTO_TEST_CASE(frees_coalesce_with_both_neighbours) {
    DeviceArena a(ArenaConfig{.bytes = 16 * KiB, .backend = "host"});
    std::vector<Block> bs;
    for (int i = 0; i < 4; ++i) bs.push_back(a.allocate(4 * KiB));
    BOOST_TEST(a.stats().largest_free == 0u);
    bs[0].reset();
    bs[2].reset();
    ArenaStats s = a.stats();
    BOOST_TEST(s.largest_free == 4 * KiB);
    BOOST_TEST(s.free == 8 * KiB);
    BOOST_TEST(s.fragmentation == 0.5);
    BOOST_CHECK_THROW((void)a.allocate(8 * KiB), OutOfMemory);  // 8KiB free, but not in one piece
    bs[1].reset();  // joins the holes on its left and right
    BOOST_TEST(a.stats().largest_free == 12 * KiB);
    BOOST_TEST(a.stats().fragmentation == 0.0);
    Block big = a.allocate(12 * KiB);
    BOOST_TEST(big.offset() == 0u);
}

BOOST_AUTO_TEST_CASE(out_of_memory_says_what_and_how_much) {
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .backend = "host"});
    Block x = a.allocate(768 * KiB, "layer 3 weights");
    try {
        (void)a.allocate(512 * KiB, "layer 4 weights");
        BOOST_FAIL("an allocation larger than the free memory succeeded");
    } catch (const OutOfMemory& e) {
        const std::string m = e.what();
        BOOST_TEST_MESSAGE(m);
        BOOST_TEST(contains(m, "cannot allocate 512KiB for layer 4 weights"));
        BOOST_TEST(contains(m, "largest free block 256KiB"));
        BOOST_TEST(contains(m, "free 256KiB of 1MiB"));
        BOOST_TEST(e.exit_code() == exit_code::usage);
    }
}

BOOST_AUTO_TEST_CASE(a_request_beyond_the_arena_fails_without_wrapping) {
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .backend = "host"});
    BOOST_CHECK_THROW((void)a.allocate(SIZE_MAX - 10, "huge"), OutOfMemory);
    BOOST_CHECK_THROW((void)a.allocate(1 * MiB + 1), OutOfMemory);
    BOOST_TEST(a.stats().used == 0u);
    Block all = a.allocate(1 * MiB);
    BOOST_TEST(all.offset() == 0u);
}

BOOST_AUTO_TEST_CASE(max_block_refuses_large_requests_like_the_papers_experiment) {
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .max_block = 64 * KiB, .backend = "host"});
    Block ok = a.allocate(64 * KiB);
    try {
        (void)a.allocate(64 * KiB + 1, "big");
        BOOST_FAIL("--max-block was not enforced");
    } catch (const OutOfMemory& e) {
        BOOST_TEST(contains(e.what(), "larger than --max-block 64KiB"));
    }
    std::vector<Block> many;  // smaller requests still fill the arena
    for (int i = 0; i < 15; ++i) many.push_back(a.allocate(64 * KiB));
    BOOST_TEST(a.stats().free == 0u);
}

BOOST_AUTO_TEST_CASE(copies_in_and_out) {
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .backend = "host"});
    std::mt19937_64 rng(seed("arena copy"));
    auto data = random_bytes(10000, rng);
    Block b = a.allocate(20000);
    a.copy_in(b, 5000, data);
    std::vector<std::byte> back(10000);
    a.copy_out(back, b, 5000);
    BOOST_TEST((back == data));
    BOOST_CHECK_THROW(a.copy_in(b, 15000, data), InternalError);
}

BOOST_AUTO_TEST_CASE(cuda_backend_without_a_gpu_is_a_clear_error) {
    if (gpu_info().count > 0) return;  // a GPU machine takes the cuda backend
    try {
        DeviceArena a(ArenaConfig{.bytes = 1 * MiB, .backend = "cuda"});
        BOOST_FAIL("a cuda arena was created without a GPU");
    } catch (const UsageError& e) {
        BOOST_TEST(contains(e.what(), "asked for CUDA memory"));
    }
    DeviceArena a(ArenaConfig{.bytes = 1 * MiB});  // auto: host
    BOOST_TEST(a.backend() == "host");
}

BOOST_AUTO_TEST_CASE(threads_allocate_and_free_concurrently) {
    DeviceArena a(ArenaConfig{.bytes = 4 * MiB, .backend = "host"});
    std::vector<std::thread> ts;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            std::mt19937_64 rng(t);
            std::vector<Block> live;
            for (int i = 0; i < 2000; ++i) {
                if (live.size() > 8 || (rng() % 3 == 0 && !live.empty())) {
                    live.erase(live.begin() + static_cast<long>(rng() % live.size()));
                } else {
                    try {
                        live.push_back(a.allocate(1 + rng() % (64 * KiB)));
                    } catch (const OutOfMemory&) {
                        ++failures;
                    }
                }
            }
        });
    for (auto& t : ts) t.join();
    BOOST_TEST(failures.load() == 0);  // 4 x 9 x 64KiB fits in 4MiB
    ArenaStats s = a.stats();
    BOOST_TEST(s.used == 0u);
    BOOST_TEST(s.largest_free == 4 * MiB);  // everything coalesced back
}

BOOST_AUTO_TEST_SUITE_END()
