// Unit tests of libzinf util: errors, sizes, durations, handles, JSON, xxh3, logging.
#define BOOST_TEST_MODULE util
#include <boost/test/unit_test.hpp>

#include "testing.hpp"

#include <zinf/util.hpp>

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <random>
#include <sstream>
#include <unistd.h>

using namespace zinf;

BOOST_AUTO_TEST_SUITE(sizes)

BOOST_AUTO_TEST_CASE(binary_units) {
    BOOST_TEST(parse_size("4096") == 4096u);
    BOOST_TEST(parse_size("512k") == 512u * 1024);
    BOOST_TEST(parse_size("512K") == 512u * 1024);
    BOOST_TEST(parse_size("1M") == 1048576u);
    BOOST_TEST(parse_size("1MiB") == 1048576u);
    BOOST_TEST(parse_size("4GiB") == 4ull << 30);
    BOOST_TEST(parse_size("4G") == 4ull << 30);
    BOOST_TEST(parse_size("2T") == 2ull << 40);
    BOOST_TEST(parse_size("1.5KiB") == 1536u);
    BOOST_TEST(parse_size(" 8M ") == 8u << 20);
    BOOST_TEST(parse_size("100B") == 100u);
}

BOOST_AUTO_TEST_CASE(decimal_units) {
    BOOST_TEST(parse_size("4.096kB") == 4096u);  // exact, not 4095.99...
    BOOST_TEST(parse_size("8.192kB") == 8192u);
    BOOST_TEST(parse_size("1.1GB") == 1'100'000'000u);
    BOOST_TEST(parse_size(".5KiB") == 512u);
    BOOST_CHECK_THROW(parse_size("1.0001kB"), UsageError);
    BOOST_CHECK_THROW(parse_size("99999999999999999.5T"), UsageError);
    BOOST_TEST(parse_size("1kB") == 1000u);
    BOOST_TEST(parse_size("5MB") == 5'000'000u);
    BOOST_TEST(parse_size("2GB") == 2'000'000'000u);
    BOOST_TEST(parse_size("1TB") == 1'000'000'000'000u);
}

BOOST_AUTO_TEST_CASE(rejects_garbage) {
    for (const char* bad : {"", "M", "1X", "-1", "1.2.3M", "abc", "1Mb", "0.3B",
                            "99999999999999999999", "20000000T"}) {
        BOOST_TEST_CONTEXT("input '" << bad << "'") {
            BOOST_CHECK_THROW(parse_size(bad), UsageError);
        }
    }
    try {
        parse_size("12Q");
        BOOST_FAIL("no throw");
    } catch (const UsageError& e) {
        BOOST_TEST(std::string(e.what()).find("12Q") != std::string::npos);
        BOOST_TEST(e.exit_code() == exit_code::usage);
    }
}

BOOST_AUTO_TEST_CASE(format_round_trips) {
    BOOST_TEST(format_size(0) == "0B");
    BOOST_TEST(format_size(1000) == "1000B");
    BOOST_TEST(format_size(1024) == "1KiB");
    BOOST_TEST(format_size(1536) == "1.5KiB");
    BOOST_TEST(format_size(8ull << 20) == "8MiB");
    BOOST_TEST(format_size(3ull << 30) == "3GiB");
    for (std::uint64_t v : {4096ull, 1ull << 20, 512ull << 10, 7ull << 40})
        BOOST_TEST(parse_size(format_size(v)) == v);
}

BOOST_AUTO_TEST_CASE(durations) {
    using namespace std::chrono;
    BOOST_TEST(parse_duration("10s").count() == duration_cast<nanoseconds>(10s).count());
    BOOST_TEST(parse_duration("500ms").count() == duration_cast<nanoseconds>(500ms).count());
    BOOST_TEST(parse_duration("2m").count() == duration_cast<nanoseconds>(2min).count());
    BOOST_TEST(parse_duration("1.5").count() == 1'500'000'000);
    BOOST_TEST(parse_duration("250us").count() == 250'000);
    BOOST_CHECK_THROW(parse_duration("soon"), UsageError);
    BOOST_CHECK_THROW(parse_duration("-1s"), UsageError);
    BOOST_CHECK_THROW(parse_duration("1e300s"), UsageError);  // would overflow int64 ns
}

BOOST_AUTO_TEST_CASE(alignment_helpers) {
    BOOST_TEST(align_up(1, 512) == 512u);
    BOOST_TEST(align_up(512, 512) == 512u);
    BOOST_TEST(align_up(0, 512) == 0u);
    BOOST_TEST(align_down(1023, 512) == 512u);
    BOOST_TEST(is_pow2(4096));
    BOOST_TEST(!is_pow2(0));
    BOOST_TEST(!is_pow2(3 * 512));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors)

BOOST_AUTO_TEST_CASE(message_names_path_offset_errno) {
    IoError e("read failed", {EIO, "/data/x.bin", 4096, -1});
    std::string w = e.what();
    BOOST_TEST(w.find("/data/x.bin") != std::string::npos);
    BOOST_TEST(w.find("4096") != std::string::npos);
    BOOST_TEST(w.find("errno 5") != std::string::npos);
    BOOST_TEST(e.err() == EIO);
    BOOST_TEST(*e.offset() == 4096u);
    BOOST_TEST(e.message() == "read failed");
    BOOST_TEST(e.exit_code() == exit_code::io);
    DataError d("bad", {0, "m.jsonl", {}, 3});
    BOOST_TEST(std::string(d.what()).find("rank 3") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(kinds_map_to_exit_codes) {
    BOOST_TEST(UsageError("x").exit_code() == 64);
    BOOST_TEST(DataError("x").exit_code() == 65);
    BOOST_TEST(MissingInputError("x").exit_code() == 66);
    BOOST_TEST(InternalError("x").exit_code() == 70);
    BOOST_TEST(CreateError("x").exit_code() == 73);
    BOOST_TEST(IoError("x").exit_code() == 74);
    BOOST_TEST(ThresholdError("x").exit_code() == 75);
}

BOOST_AUTO_TEST_CASE(throw_errno_picks_the_kind) {
    BOOST_CHECK_THROW(throw_errno("open", ENOENT, "/nope"), MissingInputError);
    BOOST_CHECK_THROW(throw_errno("open", EEXIST, "/x", {}, true), CreateError);
    BOOST_CHECK_THROW(throw_errno("open", ENOSPC, "/x", {}, true), CreateError);
    BOOST_CHECK_THROW(throw_errno("pread", EIO, "/x", 12), IoError);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(handles)

BOOST_AUTO_TEST_CASE(fd_open_errors) {
    BOOST_CHECK_THROW(Fd::open("/nonexistent/zinf/file", O_RDONLY), MissingInputError);
    char tmpl[] = "/tmp/zinf-test-XXXXXX";
    int raw = ::mkstemp(tmpl);
    BOOST_REQUIRE(raw >= 0);
    Fd guard(raw);
    BOOST_CHECK_THROW(Fd::open(tmpl, O_RDWR | O_CREAT | O_EXCL), CreateError);
    Fd f = Fd::open(tmpl, O_RDWR);
    BOOST_TEST(f.get() >= 0);
    Fd moved = std::move(f);
    BOOST_TEST(f.get() == -1);
    BOOST_TEST(moved.get() >= 0);
    moved.close(tmpl);
    BOOST_TEST(!moved);
    ::unlink(tmpl);
}

BOOST_AUTO_TEST_CASE(aligned_buffer) {
    for (std::size_t a : {512u, 4096u}) {
        AlignedBuffer b = AlignedBuffer::allocate(12345, a);
        BOOST_TEST(b.size() == 12345u);
        BOOST_TEST(is_aligned(b.data(), a));
        BOOST_TEST(std::all_of(b.data(), b.data() + b.size(), [](std::byte x) { return x == std::byte{0}; }));
        b.bytes()[12344] = std::byte{7};  // the whole span is writable
    }
    BOOST_CHECK_THROW(AlignedBuffer::allocate(10, 3000), UsageError);
}

BOOST_AUTO_TEST_CASE(mmap_anonymous_and_lock) {
    Mmap m = Mmap::anonymous(1 << 20, true);
    BOOST_TEST(m.size() == 1u << 20);
    m.data()[0] = std::byte{1};
    int err = m.lock();
    // mlock may be refused by RLIMIT_MEMLOCK; the call reports instead of throwing.
    BOOST_TEST((err == 0 ? m.locked() : !m.locked()));
    Mmap n = std::move(m);
    BOOST_TEST(m.data() == nullptr);
    BOOST_TEST(n.data()[0] == std::byte{1});
}

BOOST_AUTO_TEST_CASE(mmap_huge_pages_are_aligned_and_whole) {
    // Transparent huge pages need a 2MiB-aligned range of whole 2MiB pages.
    Mmap h = Mmap::anonymous(3 * MiB + 5, true, Mmap::Pages::huge);
    BOOST_TEST(is_aligned(h.data(), Mmap::kHugePage));
    BOOST_TEST(h.size() == 4 * MiB);
    h.data()[h.size() - 1] = std::byte{1};  // all of it is mapped
    BOOST_TEST(std::all_of(h.data(), h.data() + 1024, [](std::byte b) { return b == std::byte{0}; }));
    Mmap s = Mmap::anonymous(3 * MiB, true, Mmap::Pages::small);
    BOOST_TEST(s.size() == 3 * MiB);
    s.data()[s.size() - 1] = std::byte{1};
    AlignedBuffer big = AlignedBuffer::allocate(5 * MiB);
    BOOST_TEST(is_aligned(big.data(), Mmap::kHugePage));
    BOOST_TEST(big.size() == 5 * MiB);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(json_helpers)

BOOST_AUTO_TEST_CASE(lines_parse_and_name_the_line) {
    std::istringstream in("{\"a\":1}\n\n  \n{\"b\":\"x\"}\n{broken\n");
    try {
        json::read_lines(in, "in.jsonl");
        BOOST_FAIL("no throw");
    } catch (const DataError& e) {
        std::string w = e.what();
        BOOST_TEST(w.find("in.jsonl") != std::string::npos);
        BOOST_TEST(w.find("line 5") != std::string::npos);
    }
    std::istringstream ok("{\"a\":1}\n\n{\"b\":\"x\"}\n");
    auto recs = json::read_lines(ok, "ok");
    BOOST_TEST(recs.size() == 2u);
    BOOST_TEST(json::get_u64(recs[0], "a", "ok") == 1u);
    BOOST_TEST(json::get_string(recs[1], "b", "ok") == "x");
    BOOST_CHECK_THROW(json::get_u64(recs[1], "b", "ok"), DataError);
    BOOST_CHECK_THROW(json::get_u64(recs[0], "missing", "ok"), DataError);
    BOOST_CHECK_THROW(json::parse_line("[1,2]", "arr", 1), DataError);
    BOOST_TEST(json::line(json::Json{{"k", 2}}) == "{\"k\":2}\n");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hashing)

BOOST_AUTO_TEST_CASE(xxh3_known_value_and_streaming) {
    // The reference value of XXH3_64bits("") from the xxHash sources.
    BOOST_TEST(xxh3({}) == 0x2D06800538D394C2ull);
    std::mt19937_64 rng(testing::seed("xxh3_streaming"));
    std::vector<std::byte> data(1 << 20);
    for (auto& b : data) b = std::byte(rng());
    Xxh3Stream s;
    std::size_t at = 0;
    while (at < data.size()) {
        std::size_t n = std::min<std::size_t>(data.size() - at, rng() % 100000 + 1);
        s.update(std::span(data).subspan(at, n));
        at += n;
    }
    BOOST_TEST(s.digest() == xxh3(data));
    const std::uint64_t before = xxh3(data);
    data[rng() % data.size()] ^= std::byte{1};
    BOOST_TEST(xxh3(data) != before);
    BOOST_TEST(xxh3(data, 1) != xxh3(data, 2));
}

BOOST_AUTO_TEST_CASE(hex_round_trip) {
    BOOST_TEST(hex64(0x2D06800538D394C2ull) == "2d06800538d394c2");
    BOOST_TEST(parse_hex64("2d06800538d394c2") == 0x2D06800538D394C2ull);
    BOOST_TEST(hex64(1) == "0000000000000001");
    BOOST_CHECK_THROW(parse_hex64("xyz"), DataError);
    BOOST_CHECK_THROW(parse_hex64("2d06800538d394c"), DataError);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(logging)

BOOST_AUTO_TEST_CASE(warn_once_and_levels) {
    log::set_program("zinf-test");
    log::set_level(LogLevel::info);
    std::string out = testing::capture_stderr([] {
        log::warn_once("k", "first");
        log::warn_once("k", "second");
        log::info("hello");
        log::debug("hidden");
    });
    BOOST_TEST(out == "zinf-test: warning: first\nzinf-test: hello\n");
    log::set_level(LogLevel::quiet);
    BOOST_TEST(testing::capture_stderr([] { log::warn("x"); log::info("y"); }).empty());
    log::set_level(LogLevel::info);
}

BOOST_AUTO_TEST_CASE(progress_is_silent_off_a_tty) {
    // Tests run with stderr redirected; a bar must then draw nothing at all.
    std::string out = testing::capture_stderr([] {
        Progress p("x", 100);
        p.advance(50);
        p.finish();
    });
    BOOST_TEST(out.empty());
}

BOOST_AUTO_TEST_SUITE_END()
