// Unit tests of libzinf io: File (O_DIRECT and its fallback) and Engine on both
// backends: round trips at awkward sizes, many concurrent mixed tickets,
// injected errors and short transfers, misalignment, registration.
#define BOOST_TEST_MODULE io
#include "io_testing.hpp"

#include <zinf/io.hpp>

#include <nlohmann/json.hpp>
#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <sys/mount.h>
#include <unistd.h>

using namespace zinf;
using namespace zinf::io;
using namespace zinf::testing;
namespace utf = boost::unit_test;

namespace {

// Writes `data` at `offset` and reads it back through `eng`; both directions
// go through the engine, so a wrong piece boundary or a lost tail shows here.
void round_trip(Engine& eng, File& f, std::uint64_t offset, std::span<const std::byte> data,
                std::size_t buf_align) {
    AlignedBuffer src = AlignedBuffer::allocate(data.size(), 4096);
    AlignedBuffer dst = AlignedBuffer::allocate(data.size() + buf_align, 4096);
    std::copy(data.begin(), data.end(), src.data());
    eng.wait(eng.write(f, offset, src.bytes()));
    auto out = dst.bytes().first(data.size());
    eng.wait(eng.read(f, offset, out));
    BOOST_TEST(std::equal(data.begin(), data.end(), out.begin()), "round trip of " << data.size()
                                                                    << " bytes at " << offset);
}

void unaligned_sizes(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("unaligned_sizes " + engine).c_str()));
    File f = open_rw(dir.file("a.bin"), Direct::buffered);
    // Block size 4KiB, 3 queues: sizes that divide by nothing.
    Engine eng(config(engine, 4096, 3, 3));
    BOOST_TEST(eng.config().engine == engine);
    std::uint64_t offset = 0;
    for (std::size_t n : {1ul, 17ul, 4095ul, 4097ul, 12289ul, (1ul << 20) + 17, 3ul * 4096 * 7 + 5}) {
        auto data = random_bytes(n, rng);
        round_trip(eng, f, offset, data, 1);
        offset += n + rng() % 1000;
    }
    BOOST_TEST(f.size() > 0u);
}

void direct_round_trip(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("direct_round_trip " + engine).c_str()));
    File f = open_rw(dir.file("d.bin"));
    if (!f.direct()) {
        BOOST_TEST_MESSAGE("the temporary directory refuses O_DIRECT; testing buffered");
    }
    const std::size_t a = f.alignment();
    BOOST_TEST(is_pow2(a));
    Engine eng(config(engine, 64 * KiB, 4, 2));
    // Lengths that are aligned but not multiples of the block size: the last
    // piece is shorter, and nothing is lost at the tail.
    for (std::size_t n : {a, 3 * a, 64 * KiB + a, MiB + 5 * a}) {
        auto data = random_bytes(n, rng);
        round_trip(eng, f, a * (rng() % 64), data, 0);
    }
}

void concurrent_mixed(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("concurrent_mixed " + engine).c_str()));
    File f = open_rw(dir.file("c.bin"));
    const std::size_t a = std::max<std::size_t>(f.alignment(), 512);
    constexpr int kRegions = 96;
    const std::size_t region = 40 * a + a;  // odd number of alignment units
    // Half the regions written first; then reads of those mixed with writes of
    // the others, all tickets outstanding at once, waited in random order.
    AlignedBuffer expect = AlignedBuffer::allocate(kRegions * region, 4096);
    testing::fill_random(expect.bytes(), rng);
    Engine eng(config(engine, 8 * a, 5, 3));
    std::vector<Ticket> first;
    for (int i = 0; i < kRegions; i += 2)
        first.push_back(eng.write(f, i * region, expect.bytes().subspan(i * region, region)));
    for (auto t : first) eng.wait(t);

    AlignedBuffer got = AlignedBuffer::allocate(kRegions * region, 4096);
    std::vector<Ticket> tickets;
    for (int i = 0; i < kRegions; ++i) {
        if (i % 2 == 0)
            tickets.push_back(eng.read(f, i * region, got.bytes().subspan(i * region, region)));
        else
            tickets.push_back(eng.write(f, i * region, expect.bytes().subspan(i * region, region)));
    }
    std::shuffle(tickets.begin(), tickets.end(), rng);
    for (auto t : tickets) eng.wait(t);
    for (int i = 0; i < kRegions; i += 2)
        BOOST_TEST(std::memcmp(got.data() + i * region, expect.data() + i * region, region) == 0,
                   "region " << i);
    // And the odd regions landed where they should.
    auto all = AlignedBuffer::allocate(kRegions * region, 4096);
    eng.wait(eng.read(f, 0, all.bytes()));
    BOOST_TEST(std::memcmp(all.data(), expect.data(), all.size()) == 0);
    EngineStats st = eng.stats();
    BOOST_TEST(st.requests == std::uint64_t(kRegions / 2 + kRegions + 1));
    BOOST_TEST(st.bytes_written == std::uint64_t(kRegions) * region);
}

// An injected EIO reaches wait() with the path, the offset of the failed piece
// and errno; the other pieces of the request are not reported as success.
void injected_eio(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("injected_eio " + engine).c_str()));
    File f = open_rw(dir.file("e.bin"));
    const std::size_t bs = 64 * KiB;
    Engine eng(config(engine, bs, 2, 2));
    AlignedBuffer buf = AlignedBuffer::allocate(16 * bs, 4096);
    testing::fill_random(buf.bytes(), rng);
    eng.wait(eng.write(f, 0, buf.bytes()));

    // The 3rd read piece of a one-queue engine is the piece at 2*bs.
    Engine one(config(engine, bs, 1, 1));
    f.inject_fault({Op::read, 3, EIO});
    AlignedBuffer out = AlignedBuffer::allocate(16 * bs, 4096);
    Ticket t = one.read(f, 0, out.bytes());
    try {
        one.wait(t);
        BOOST_FAIL("an injected EIO was not reported");
    } catch (const IoError& e) {
        BOOST_TEST(e.err() == EIO);
        BOOST_TEST(e.path() == f.path());
        BOOST_REQUIRE(e.offset().has_value());
        BOOST_TEST(*e.offset() == 2 * bs);
        BOOST_TEST(std::string(e.what()).find(f.path()) != std::string::npos);
    }
    // The engine is still usable, and a write fault reports too.
    eng.wait(eng.read(f, 0, out.bytes()));
    BOOST_TEST(std::memcmp(out.data(), buf.data(), out.size()) == 0);
    f.inject_fault({Op::write, 1, ENOSPC});
    BOOST_CHECK_EXCEPTION(eng.wait(eng.write(f, 0, buf.bytes())), IoError,
                          [](const IoError& e) { return e.err() == ENOSPC && e.exit_code() == 73; });
}

// A short transfer is finished by the engine: the data is whole and the
// retry is counted.
void injected_short(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("injected_short " + engine).c_str()));
    File f = open_rw(dir.file("s.bin"));
    const std::size_t bs = 256 * KiB;
    Engine eng(config(engine, bs, 4, 2));
    auto data = random_bytes(4 * bs + 2 * std::max<std::size_t>(f.alignment(), 512), rng);
    f.inject_fault({Op::write, 2, 0});
    f.inject_fault({Op::read, 1, 0});
    f.inject_fault({Op::read, 4, 0});
    round_trip(eng, f, 0, data, 0);
    BOOST_TEST(eng.stats().short_retries >= 3u);
}

void injected_corruption(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("injected_corruption " + engine).c_str()));
    File f = open_rw(dir.file("x.bin"));
    Engine eng(config(engine, 64 * KiB, 2, 1));
    AlignedBuffer a = AlignedBuffer::allocate(MiB, 4096), b = AlignedBuffer::allocate(MiB, 4096);
    testing::fill_random(a.bytes(), rng);
    eng.wait(eng.write(f, 0, a.bytes()));
    f.inject_fault({Op::read, 2, 0, true});
    eng.wait(eng.read(f, 0, b.bytes()));  // silent, as real corruption is
    BOOST_TEST(xxh3(a.bytes()) != xxh3(b.bytes()));
    int diffs = 0;
    for (std::size_t i = 0; i < MiB; ++i) diffs += a.data()[i] != b.data()[i];
    BOOST_TEST(diffs == 1);
}

void read_past_eof(const std::string& engine) {
    testing::TempDir dir;
    File f = open_rw(dir.file("eof.bin"), Direct::buffered);
    Engine eng(config(engine, 4096, 2, 1));
    std::vector<std::byte> small(1000, std::byte{9}), big(5000);
    eng.wait(eng.write(f, 0, small));
    try {
        eng.wait(eng.read(f, 0, big));
        BOOST_FAIL("a read past the end of the file succeeded");
    } catch (const IoError& e) {
        BOOST_TEST(std::string(e.what()).find("end of file") != std::string::npos);
        BOOST_TEST(std::string(e.what()).find("the file has 1000 bytes") != std::string::npos);
        // Either piece may meet the end first: the short one at 1000, or the
        // one that starts past the end at 4096.
        BOOST_TEST((*e.offset() == 1000u || *e.offset() == 4096u));
    }
}

// wait_any returns a finished ticket without consuming it; a slow request
// does not hold back the ones behind it.
void wait_any_reaps_in_completion_order(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("wait_any " + engine).c_str()));
    File f = open_rw(dir.file("a.bin"), Direct::buffered);
    Engine eng(config(engine, 64 * KiB, 4, 2));
    auto data = random_bytes(2 * MiB, rng);
    eng.wait(eng.write(f, 0, data));
    std::vector<std::vector<std::byte>> outs(16, std::vector<std::byte>(128 * KiB));
    std::vector<Ticket> tickets;
    for (int i = 0; i < 16; ++i) tickets.push_back(eng.read(f, i * 128 * KiB, outs[i]));
    std::vector<int> order(16);
    std::iota(order.begin(), order.end(), 0);
    std::vector<bool> seen(16);
    while (!tickets.empty()) {
        std::size_t i = eng.wait_any(tickets);
        BOOST_TEST(eng.ready(tickets[i]));
        eng.wait(tickets[i]);
        int which = order[i];
        BOOST_TEST(!seen[which]);
        seen[which] = true;
        BOOST_TEST(std::memcmp(outs[which].data(), data.data() + which * 128 * KiB, 128 * KiB) == 0);
        tickets.erase(tickets.begin() + i);
        order.erase(order.begin() + i);
    }
    BOOST_TEST(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }));
}

// A chain of callbacks keeps the queues full: each completion issues the next
// block from the engine's own thread; errors reach the callback; wait_all
// waits for the whole chain and rethrows what a callback threw.
void callbacks_chain(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("callbacks " + engine).c_str()));
    File f = open_rw(dir.file("c.bin"), Direct::buffered);
    const std::size_t block = 32 * KiB, blocks = 64;
    auto data = random_bytes(block * blocks, rng);
    std::vector<std::byte> got(data.size());
    Engine eng(config(engine, 16 * KiB, 3, 2));
    eng.wait(eng.write(f, 0, data));
    // Callbacks run on engine threads and Boost.Test is not thread-safe:
    // they record, and this thread checks.
    std::atomic<std::size_t> next{0}, done_blocks{0}, failures{0};
    std::function<void()> issue = [&] {
        std::size_t b = next.fetch_add(1);
        if (b >= blocks) return;
        eng.read_then(f, b * block, std::span(got).subspan(b * block, block), [&](const IoError* e) {
            if (e) failures.fetch_add(1);
            done_blocks.fetch_add(1);
            issue();
        });
    };
    for (int i = 0; i < 4; ++i) issue();  // 4 chains
    eng.wait_all();
    BOOST_TEST(failures.load() == 0u);
    BOOST_TEST(done_blocks.load() == blocks);
    BOOST_TEST(std::memcmp(got.data(), data.data(), data.size()) == 0);

    // An injected error reaches the callback, with path and offset.
    f.inject_fault({Op::read, 2, EIO});
    std::mutex mu;
    std::vector<IoError> errors;
    for (int i = 0; i < 3; ++i)
        eng.read_then(f, i * block, std::span(got).subspan(i * block, block), [&](const IoError* e) {
            if (!e) return;
            std::lock_guard lk(mu);
            errors.push_back(*e);
        });
    eng.wait_all();
    BOOST_REQUIRE(errors.size() == 1u);
    BOOST_TEST(errors[0].err() == EIO);
    BOOST_TEST(errors[0].path() == f.path());
    BOOST_TEST(*errors[0].offset() % (16 * KiB) == 0u);

    // What a callback throws is not lost: wait_all rethrows it.
    eng.write_then(f, 0, std::span(data).first(block), [](const IoError*) { throw DataError("from a callback"); });
    BOOST_CHECK_EXCEPTION(eng.wait_all(), DataError,
                          [](const DataError& e) { return e.message() == "from a callback"; });
    eng.wait_all();  // reported once
    // An empty request completes at once.
    bool empty_done = false;
    eng.read_then(f, 0, std::span<std::byte>{}, [&](const IoError* e) { empty_done = !e; });
    BOOST_TEST(empty_done);
}

// Registering while a callback chain submits must not deadlock (the ring
// thread submits from a callback while registration talks to that thread),
// and sync() covers write_then requests.
void register_during_chain_and_sync(const std::string& engine) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed(("register_during_chain " + engine).c_str()));
    File f = open_rw(dir.file("r.bin"), Direct::buffered);
    Engine eng(config(engine, 4 * KiB, 2, 1));
    auto data = random_bytes(4 * MiB, rng);
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    std::vector<std::byte> got(4 * KiB);
    eng.wait(eng.write(f, 0, data));
    std::function<void()> issue = [&] {
        if (stop) return;
        std::size_t b = next.fetch_add(1) % 1024;
        eng.read_then(f, b * 4 * KiB, got, [&](const IoError*) { issue(); });
    };
    // Until the chain runs (a few reads done), and after registering until
    // it runs on: not a fixed sleep, which a loaded machine under the thread
    // sanitizer outlasted before the first callback.
    auto advanced_past = [&](std::size_t n) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (next.load() <= n && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return next.load() > n;
    };
    issue();
    BOOST_TEST(advanced_past(2));
    AlignedBuffer extra = AlignedBuffer::allocate(MiB);
    {
        Registration r = eng.register_buffer(extra.bytes());  // returns: no deadlock
        Registration rf = eng.register_file(f);
    }  // and releasing them too
    BOOST_TEST(advanced_past(next.load()));  // the chain goes on
    stop = true;
    eng.wait_all();

    // sync() after write_then: the callback has run, the data is in the file.
    std::atomic<bool> wrote{false};
    std::vector<std::byte> more(8 * MiB, std::byte{0x5c});
    eng.write_then(f, 0, more, [&](const IoError* e) { wrote = !e; });
    eng.sync(f);
    BOOST_TEST(wrote.load());
    BOOST_TEST(f.size() >= 8 * MiB);
}

}  // namespace


BOOST_AUTO_TEST_SUITE(engine)
BOTH_BACKENDS(unaligned_sizes)
BOTH_BACKENDS(direct_round_trip)
BOTH_BACKENDS(concurrent_mixed)
BOTH_BACKENDS(injected_eio)
BOTH_BACKENDS(injected_short)
BOTH_BACKENDS(injected_corruption)
BOTH_BACKENDS(read_past_eof)
BOTH_BACKENDS(wait_any_reaps_in_completion_order)
BOTH_BACKENDS(callbacks_chain)
BOTH_BACKENDS(register_during_chain_and_sync)

BOOST_AUTO_TEST_CASE(auto_picks_a_backend) {
    Engine eng(EngineConfig{});
    BOOST_TEST((eng.config().engine == (have_uring() ? "uring" : "threads")));
}

BOOST_AUTO_TEST_CASE(misaligned_direct_io_is_refused) {
    testing::TempDir dir;
    File f = open_rw(dir.file("m.bin"));
    if (!f.direct()) return;  // nothing to refuse on a buffered file
    Engine eng(config("auto", 64 * KiB, 2, 1));
    AlignedBuffer buf = AlignedBuffer::allocate(64 * KiB, 4096);
    const std::size_t a = f.alignment();
    auto refused = [&](auto&& submit, const char* what) {
        try {
            submit();
            BOOST_ERROR("misaligned " << what << " was accepted");
        } catch (const IoError& e) {
            BOOST_TEST(e.err() == EINVAL);
            BOOST_TEST(std::string(e.what()).find("misaligned") != std::string::npos);
        }
    };
    refused([&] { eng.write(f, 1, buf.bytes().first(a)); }, "offset");
    refused([&] { eng.write(f, 0, buf.bytes().first(a + 1)); }, "length");
    if (f.memory_alignment() > 1)
        refused([&] { eng.read(f, 0, buf.bytes().subspan(1, a)); }, "buffer");
    eng.wait(eng.write(f, 0, buf.bytes().first(a)));  // aligned is fine
}

BOOST_AUTO_TEST_CASE(wait_all_reports_the_first_error_after_everything_finished) {
    testing::TempDir dir;
    File f = open_rw(dir.file("w.bin"), Direct::buffered);
    Engine eng(config("auto", 4096, 2, 2));
    std::vector<std::byte> data(64 * KiB, std::byte{3});
    eng.wait(eng.write(f, 0, data));
    std::vector<std::vector<std::byte>> outs(8, std::vector<std::byte>(8 * KiB));
    f.inject_fault({Op::read, 5, EIO});
    for (int i = 0; i < 8; ++i) eng.read(f, i * 8 * KiB, outs[i]);
    BOOST_CHECK_THROW(eng.wait_all(), IoError);
    // Everything else completed: the buffers hold the data.
    int whole = 0;
    for (auto& o : outs) whole += std::all_of(o.begin(), o.end(), [](std::byte b) { return b == std::byte{3}; });
    BOOST_TEST(whole >= 7);
    eng.wait_all();  // nothing left: returns at once
}

BOOST_AUTO_TEST_CASE(a_ticket_is_waited_once) {
    testing::TempDir dir;
    File f = open_rw(dir.file("t.bin"), Direct::buffered);
    Engine eng(config("auto", 4096, 2, 1));
    std::vector<std::byte> data(100, std::byte{1});
    Ticket t = eng.write(f, 0, data);
    eng.wait(t);
    BOOST_CHECK_THROW(eng.wait(t), InternalError);
    BOOST_CHECK_THROW(eng.ready(Ticket{12345}), InternalError);
    Ticket e = eng.read(f, 0, std::span<std::byte>{});  // empty request: complete at once
    BOOST_TEST(eng.ready(e));
    eng.wait(e);
}

BOOST_AUTO_TEST_CASE(an_unwaited_failure_does_not_hang_the_destructor) {
    testing::TempDir dir;
    File f = open_rw(dir.file("u.bin"), Direct::buffered);
    std::vector<std::byte> data(64 * KiB, std::byte{1});
    std::string log = testing::capture_stderr([&] {
        Engine eng(config("auto", 4096, 2, 2));
        f.inject_fault({Op::write, 3, EIO});
        eng.write(f, 0, data);
    });  // returns (a hang fails under the runner's timeout) and logs the error
    BOOST_TEST(log.find("never waited for") != std::string::npos);
    BOOST_TEST(log.find(f.path()) != std::string::npos);
    BOOST_TEST(log.find("errno 5") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(sync_waits_for_the_files_writes, *utf::precondition(UringPresent())) {
    testing::TempDir dir;
    File f = open_rw(dir.file("y.bin"));
    Engine eng(config("uring", 64 * KiB, 8, 2));
    AlignedBuffer buf = AlignedBuffer::allocate(4 * MiB, 4096);
    std::mt19937_64 rng(testing::seed("sync"));
    testing::fill_random(buf.bytes(), rng);
    Ticket t = eng.write(f, 0, buf.bytes());
    eng.sync(f);
    BOOST_TEST(eng.ready(t));
    eng.wait(t);
    BOOST_TEST(f.size() == 4 * MiB);
}

BOOST_AUTO_TEST_CASE(registered_buffers_and_files, *utf::precondition(UringPresent())) {
    testing::TempDir dir;
    std::mt19937_64 rng(testing::seed("registered"));
    File f = open_rw(dir.file("r.bin"));
    Engine eng(config("uring", 128 * KiB, 4, 2));
    AlignedBuffer src = AlignedBuffer::allocate(2 * MiB, 4096), dst = AlignedBuffer::allocate(2 * MiB, 4096);
    testing::fill_random(src.bytes(), rng);
    Registration rs = eng.register_buffer(src.bytes());
    Registration rd = eng.register_buffer(dst.bytes());
    Registration rf = eng.register_file(f);
    eng.wait(eng.write(f, 0, src.bytes()));
    eng.wait(eng.read(f, 0, dst.bytes()));
    BOOST_TEST(std::memcmp(src.data(), dst.data(), src.size()) == 0);
    if (rs.active() && rd.active()) BOOST_TEST(eng.stats().fixed_pieces == 32u);
    // Released registrations leave plain I/O working.
    rs.release();
    rf.release();
    std::memset(dst.data(), 0, dst.size());
    eng.wait(eng.read(f, 0, dst.bytes()));
    BOOST_TEST(std::memcmp(src.data(), dst.data(), src.size()) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(file)

BOOST_AUTO_TEST_CASE(open_errors_have_the_right_kind) {
    testing::TempDir dir;
    BOOST_CHECK_THROW(File::open(dir.file("missing")), MissingInputError);
    File f = open_rw(dir.file("x"));
    OpenOptions excl;
    excl.access = Access::read_write;
    excl.create = excl.exclusive = true;
    BOOST_CHECK_THROW(File::open(dir.file("x"), excl), CreateError);
}

BOOST_AUTO_TEST_CASE(direct_reported_truthfully) {
    testing::TempDir dir;
    File f = open_rw(dir.file("x"));
    const int fl = ::fcntl(f.fd(), F_GETFL);
    BOOST_TEST(f.direct() == ((fl & O_DIRECT) != 0));
    if (f.direct()) {
        BOOST_TEST(is_pow2(f.alignment()));
        BOOST_TEST(f.alignment() <= 4096u);
    } else {
        BOOST_TEST(f.alignment() == 1u);
    }
    BOOST_TEST(is_pow2(f.dio_alignment()));
    File b = open_rw(dir.file("y"), Direct::buffered);
    BOOST_TEST(!b.direct());
    BOOST_TEST((::fcntl(b.fd(), F_GETFL) & O_DIRECT) == 0);
}

BOOST_AUTO_TEST_CASE(preallocate_and_close) {
    testing::TempDir dir;
    File f = open_rw(dir.file("p"));
    f.preallocate(3 * MiB);
    BOOST_TEST(f.size() == 3 * MiB);
    f.close();
    BOOST_CHECK_THROW(f.fd(), InternalError);
}

// tmpfs: older kernels refuse O_DIRECT there and newer ones take it; either
// way the file reports which it got and a round trip works.
BOOST_AUTO_TEST_CASE(tmpfs_file_works_either_way) {
    if (!std::filesystem::is_directory("/dev/shm")) return;
    testing::TempDir dir("/dev/shm");
    File f = open_rw(dir.file("t"));
    BOOST_TEST(f.direct() == ((::fcntl(f.fd(), F_GETFL) & O_DIRECT) != 0));
    Engine eng(config("auto", 64 * KiB, 2, 2));
    std::mt19937_64 rng(testing::seed("tmpfs"));
    auto data = random_bytes(256 * KiB, rng);
    round_trip(eng, f, 0, data, 0);
}

// ramfs refuses O_DIRECT on every kernel: the fallback to buffered I/O, and
// Direct::require failing, are checked there.
BOOST_AUTO_TEST_CASE(o_direct_fallback_on_ramfs, *utf::precondition(CanMount{"ramfs"})) {
    Mount m("ramfs");
    BOOST_REQUIRE(m.ok);
    const std::string path = m.dir.file("r.bin");
    File f = open_rw(path);
    BOOST_TEST(!f.direct());
    BOOST_TEST(f.alignment() == 1u);
    std::mt19937_64 rng(testing::seed("ramfs"));
    auto data = random_bytes(100 * KiB + 3, rng);
    for (const char* e : {"auto", "threads"}) {
        if (std::string(e) == "auto" && !have_uring()) continue;
        Engine eng(config(e, 16 * KiB, 3, 2));
        round_trip(eng, f, 7, data, 1);
    }
    OpenOptions req;
    req.access = Access::read_write;
    req.direct = Direct::require;
    BOOST_CHECK_EXCEPTION(File::open(path, req), IoError, [](const IoError& e) { return e.err() == EINVAL; });
    // A new exclusive file on a refusing file system is created once, buffered.
    OpenOptions ex = req;
    ex.direct = Direct::prefer;
    ex.create = ex.exclusive = true;
    File g = File::open(m.dir.file("new.bin"), ex);
    BOOST_TEST(!g.direct());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(config_and_faults)

BOOST_AUTO_TEST_CASE(engine_config_json_round_trip) {
    EngineConfig c = config("threads", 8 * MiB, 64, 4);
    EngineConfig d = EngineConfig::from_json(c.to_json(), "t");
    BOOST_TEST(d.engine == "threads");
    BOOST_TEST(d.block_size == 8 * MiB);
    BOOST_TEST(d.queue_depth == 64u);
    BOOST_TEST(d.queues == 4u);
    BOOST_TEST(c.to_json()["schema"] == kEngineSchema);
    auto s = EngineConfig::from_json(json::Json{{"block_size", "4MiB"}}, "t");
    BOOST_TEST(s.block_size == 4 * MiB);
    // Measured bandwidths travel with the configuration (zinf-nvmebench
    // --best), and only when measured.
    BOOST_TEST(!c.to_json().contains("read_gibps"));
    c.read_gibps = 2.5;
    c.write_gibps = 1.25;
    d = EngineConfig::from_json(c.to_json(), "t");
    BOOST_TEST(d.read_gibps == 2.5);
    BOOST_TEST(d.write_gibps == 1.25);
}

BOOST_AUTO_TEST_CASE(engine_config_refuses_unknown_keys_and_bad_values) {
    // DeepSpeed's sweep printed a key its runtime no longer read; ours refuses.
    try {
        EngineConfig::from_json(json::Json{{"engine", "uring"}, {"thread_count", 8}}, "engine.json");
        BOOST_FAIL("an unknown key was accepted");
    } catch (const DataError& e) {
        BOOST_TEST(std::string(e.what()).find("thread_count") != std::string::npos);
        BOOST_TEST(std::string(e.what()).find("engine.json") != std::string::npos);
    }
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"queue_depth", 0}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"queues", -1}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"engine", "libaio"}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"schema", "other/1"}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"read_gibps", 0}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"write_gibps", "fast"}}, "t"), DataError);
    // Not truncated to 32 bits before the range check.
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"queue_depth", 4294967297ull}}, "t"), DataError);
    BOOST_CHECK_THROW(EngineConfig::from_json(json::Json{{"queues", 4294967297ull}}, "t"), DataError);
    // A bad size string is bad data in that file, not a bad command line.
    BOOST_CHECK_EXCEPTION(EngineConfig::from_json(json::Json{{"block_size", "1X"}}, "engine.json"),
                          DataError, [](const DataError& e) {
                              return std::string(e.what()).find("engine.json") != std::string::npos;
                          });
    BOOST_CHECK_THROW(config("uring", 1000, 1, 1).validate(), UsageError);
    BOOST_CHECK_THROW(config("uring", 2 * GiB, 1, 1).validate(), UsageError);
}

BOOST_AUTO_TEST_CASE(engine_config_load_from_file) {
    testing::TempDir dir;
    const std::string good = dir.file("engine.json"), two = dir.file("two.json");
    std::ofstream(good) << config("threads", 4 * MiB, 16, 2).to_json().dump() << "\n";
    EngineConfig c = EngineConfig::load(good);
    BOOST_TEST((c.engine == "threads" && c.block_size == 4 * MiB && c.queue_depth == 16u && c.queues == 2u));
    std::ofstream(two) << "{}\n{}\n";
    BOOST_CHECK_EXCEPTION(EngineConfig::load(two), DataError, [&](const DataError& e) {
        return std::string(e.what()).find("two.json") != std::string::npos;
    });
    BOOST_CHECK_THROW(EngineConfig::load(dir.file("missing.json")), MissingInputError);
}

BOOST_AUTO_TEST_CASE(fault_spec_parsing) {
    auto f = parse_faults("read:3:EIO,write:2:short,read:5:corrupt");
    BOOST_REQUIRE(f.size() == 3u);
    BOOST_TEST((f[0].op == Op::read && f[0].nth == 3u && f[0].err == EIO));
    BOOST_TEST((f[1].op == Op::write && f[1].err == 0 && !f[1].corrupt));
    BOOST_TEST(f[2].corrupt);
    const auto d = parse_faults("write:4:delay250");
    BOOST_REQUIRE(d.size() == 1u);
    BOOST_TEST((d[0].op == Op::write && d[0].nth == 4u && d[0].delay_ms == 250u && d[0].err == 0 && !d[0].corrupt));
    for (const char* bad : {"read", "read:0:EIO", "read:x:EIO", "seek:1:EIO", "read:1:EWHAT",
                            "write:1:corrupt", "write:1:delay", "write:1:delay0", "write:1:delay-5",
                            "write:1:delay1000000", "write:1:delayed"})
        BOOST_CHECK_THROW(parse_faults(bad), UsageError);
}

BOOST_AUTO_TEST_SUITE_END()
