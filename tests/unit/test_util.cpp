// Unit tests of libzinf util: errors, sizes, durations, handles, JSON, xxh3, logging.
#define BOOST_TEST_MODULE util
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <boost/test/unit_test.hpp>

#include "testing.hpp"

#include <zinf/cli.hpp>
#include <zinf/util.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace zinf;

namespace {
bool fs_exists(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0;
}
}  // namespace

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
    // Found with the size fuzz target (tests/fuzz/corpus/size/crash-*): 2^50
    // printed as "1PiB", a unit parse_size does not read. TiB is the top.
    BOOST_TEST(format_size(1ull << 50) == "1024TiB");
    BOOST_TEST(format_size(3ull << 52) == "12288TiB");
    BOOST_TEST(format_size((1ull << 50) + (1ull << 49)) == "1536TiB");
    BOOST_TEST(format_size(UINT64_MAX) == "16777216.0TiB");
    for (std::uint64_t v : {1ull << 50, 1ull << 60, 5ull << 61})
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

// zinf(7)'s one rule: no space, no quota and a read-only file system are
// 73 whatever call met them; every other failed read or write is 74.
BOOST_AUTO_TEST_CASE(no_space_is_73_whatever_the_call) {
    for (int err : {ENOSPC, EDQUOT, EROFS}) {
        BOOST_TEST(IoError("write failed", {err, "/x", 4096, -1}).exit_code() == 73, err);
        BOOST_CHECK_EXCEPTION(throw_errno("pwrite", err, "/x", 0), Error,
                              [](const Error& e) { return e.exit_code() == 73; });
        BOOST_CHECK_EXCEPTION(throw_errno("open", err, "/x", {}, true), Error,
                              [](const Error& e) { return e.exit_code() == 73; });
    }
    BOOST_TEST(IoError("write failed", {EIO, "/x", 0, -1}).exit_code() == 74);
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

// Every program's unsigned options refuse a negative value (strtoull would
// wrap "-1" to 2^64-1) and its floating-point ones NaN and infinity, in
// subcommands too; a std::bad_alloc is out of memory (64), not a bug (70).
BOOST_AUTO_TEST_CASE(cli_refuses_negative_counts_and_non_finite_numbers) {
    auto run_with = [](std::vector<std::string> args, std::uint64_t* got = nullptr) {
        CLI::App app{"test"};
        cli::Common common;
        cli::add_common(app, common);
        std::uint64_t steps = 7;
        unsigned jobs = 1;
        double gibps = 0;
        app.add_option("--steps", steps);
        auto* sub = app.add_subcommand("sub");
        sub->add_option("--jobs", jobs);
        sub->add_option("--min-gibps", gibps);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        int rc = 0;
        (void)testing::capture_stderr([&] {
            rc = cli::run(app, static_cast<int>(argv.size()), argv.data(), "zinf-test", common, [&] { return 0; });
        });
        if (got) *got = steps;
        return rc;
    };
    std::uint64_t steps = 0;
    BOOST_TEST(run_with({"p", "--steps", "5"}, &steps) == 0);
    BOOST_TEST(steps == 5u);
    BOOST_TEST(run_with({"p", "--steps", "-1"}) == 64);
    BOOST_TEST(run_with({"p", "--steps=-1"}) == 64);
    BOOST_TEST(run_with({"p", "--steps", " -5"}) == 64);
    BOOST_TEST(run_with({"p", "sub", "--jobs", "-1"}) == 64);
    BOOST_TEST(run_with({"p", "sub", "--min-gibps", "nan"}) == 64);
    BOOST_TEST(run_with({"p", "sub", "--min-gibps", "inf"}) == 64);
    BOOST_TEST(run_with({"p", "sub", "--min-gibps", "-1.5"}) == 0);  // a negative float is the check's business
    CLI::App app{"test"};
    cli::Common common;
    char prog[] = "p";
    char* argv[] = {prog};
    int rc = 0;
    const std::string err = testing::capture_stderr([&] {
        rc = cli::run(app, 1, argv, "zinf-test", common, []() -> int { throw std::bad_alloc(); });
    });
    BOOST_TEST(rc == 64);
    BOOST_TEST(err.find("out of memory") != std::string::npos, err);
    BOOST_TEST(err.find("internal error") == std::string::npos, err);
}

BOOST_AUTO_TEST_CASE(temp_names_are_unpredictable) {
    const std::string a = temp_name("/d/manifest.jsonl", ".tmp."), b = temp_name("/d/manifest.jsonl", ".tmp.");
    BOOST_TEST(a.starts_with("/d/manifest.jsonl.tmp."));
    BOOST_TEST(a.size() == std::string("/d/manifest.jsonl.tmp.").size() + 16);
    BOOST_TEST(a != b);
    BOOST_TEST(a.find(std::to_string(::getpid())) == std::string::npos);
}

// Nothing is written through a link planted in the data directory, and a
// link that leads outside it is refused (65) whether read or written.
BOOST_AUTO_TEST_CASE(open_beneath_refuses_links_leading_outside) {
    testing::TempDir root, outside;
    const std::string d = root.path.string();
    ::mkdir((d + "/rank0").c_str(), 0755);
    {
        Fd f = Fd::open(outside.file("victim"), O_WRONLY | O_CREAT, 0644);
        BOOST_REQUIRE(::write(f.get(), "keep", 4) == 4);
    }
    BOOST_REQUIRE(::symlink(outside.file("victim").c_str(), (d + "/rank0/link.bin").c_str()) == 0);
    BOOST_REQUIRE(::symlink(outside.path.c_str(), (d + "/rank1").c_str()) == 0);
    BOOST_REQUIRE(::symlink("real.bin", (d + "/rank0/inside.bin").c_str()) == 0);
    { Fd f = Fd::open(d + "/rank0/real.bin", O_WRONLY | O_CREAT, 0644); }

    auto code = [&](const std::string& rel, int flags) {
        try {
            Fd f = open_beneath(d, rel, flags);
            return 0;
        } catch (const Error& e) {
            BOOST_TEST(std::string(e.what()).find(rel) != std::string::npos, e.what());
            return e.exit_code();
        }
    };
    BOOST_TEST(code("rank0/link.bin", O_RDONLY) == 65);                 // a read leading outside
    BOOST_TEST(code("rank0/link.bin", O_WRONLY | O_CREAT | O_TRUNC) == 65);  // a write through a link
    BOOST_TEST(code("rank1/new.bin", O_WRONLY | O_CREAT | O_EXCL) == 65);    // a rank folder leading outside
    BOOST_TEST(code("rank0/../../x", O_RDONLY) == 65);
    BOOST_TEST(code("rank0/inside.bin", O_RDONLY) == 0);                // a link inside is followed for reading
    BOOST_TEST(code("rank0/inside.bin", O_WRONLY) == 65);               // but never written through
    BOOST_TEST(code("rank0/real.bin", O_RDWR) == 0);
    BOOST_TEST(code("rank0/missing.bin", O_RDONLY) == 66);
    BOOST_TEST(!fs_exists(outside.file("new.bin")));
    Fd v = Fd::open(outside.file("victim"), O_RDONLY);
    char buf[8] = {};
    BOOST_TEST(::read(v.get(), buf, sizeof buf) == 4);
    BOOST_TEST(std::string(buf) == "keep");
}

// A commit replaces the file, not its mode, and plants nothing predictable.
BOOST_AUTO_TEST_CASE(write_file_atomic_keeps_the_mode_and_no_link_is_followed) {
    testing::TempDir dir, outside;
    const std::string path = dir.file("manifest.jsonl");
    const std::string text = "one";
    const std::span<const std::byte> piece = std::as_bytes(std::span(text));
    write_file_atomic(path, {&piece, 1});
    BOOST_REQUIRE(::chmod(path.c_str(), 0640) == 0);
    // The name the old code used: "<path>.tmp.<pid>".
    const std::string planted = path + ".tmp." + std::to_string(::getpid());
    BOOST_REQUIRE(::symlink(outside.file("victim").c_str(), planted.c_str()) == 0);
    write_file_atomic(path, {&piece, 1});
    struct stat st {};
    BOOST_REQUIRE(::lstat(path.c_str(), &st) == 0);
    BOOST_TEST(S_ISREG(st.st_mode));
    BOOST_TEST((st.st_mode & 07777) == 0640u);
    BOOST_TEST(!fs_exists(outside.file("victim")));
}

// A sync behind the writer changes nothing the file holds: writes and
// rewrites go on while it runs, commit() waits for it, and an uncommitted
// file (moved, destroyed) leaves nothing, its sync joined first.
BOOST_AUTO_TEST_CASE(atomic_file_sync_behind_the_writer) {
    testing::TempDir dir;
    const std::string path = dir.file("tokens.bin");
    std::string expect;
    {
        AtomicFile f = AtomicFile::create(path);
        BOOST_TEST(f.sync_behind());  // nothing written yet: a sync of nothing
        for (int i = 0; i < 16; ++i) {  // each write beside the sync before, or a new one
            const std::string piece(16 * 1024, static_cast<char>('a' + i % 26));
            f.write(std::as_bytes(std::span(piece)));
            expect += piece;
            (void)f.sync_behind();  // (false while the last still runs: timing)
        }
        // A header rewritten after syncs that covered it.
        const std::string head = "HEAD";
        f.pwrite(std::as_bytes(std::span(head)), 0);
        expect.replace(0, 4, head);
        AtomicFile moved = std::move(f);  // the running sync goes with it
        moved.commit();
        BOOST_TEST_REQUIRE(fs_exists(path));
        BOOST_CHECK_THROW(moved.sync_behind(), InternalError);
    }
    std::ifstream in(path, std::ios::binary);
    const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_TEST(got.size() == expect.size());
    BOOST_TEST((got == expect));
    {
        AtomicFile g = AtomicFile::create(dir.file("dropped.bin"));
        const std::string piece(64 * 1024, 'z');
        g.write(std::as_bytes(std::span(piece)));
        BOOST_TEST(g.sync_behind());
    }  // destroyed while its sync may still run
    for (const auto& e : std::filesystem::directory_iterator(dir.path))
        BOOST_TEST(e.path().filename() == "tokens.bin", e.path());
}

// A writer SIGKILLed between creating its temporary and the rename leaves
// "<path>.tmp.<16 hex>" behind (the crash trials, tests/crash/, found them
// piling up beside manifest.jsonl): the next commit of the same path removes
// such regular files, and nothing else.
BOOST_AUTO_TEST_CASE(write_file_atomic_removes_what_killed_writers_left) {
    testing::TempDir dir, outside;
    const std::string path = dir.file("manifest.jsonl");
    auto make = [](const std::string& f) { Fd x = Fd::open(f, O_WRONLY | O_CREAT | O_EXCL, 0644); };
    const std::string stale1 = temp_name(path, ".tmp."), stale2 = path + ".tmp.0123456789abcdef";
    make(stale1);
    make(stale2);
    const std::vector<std::string> kept = {path + ".tmp.12345", path + ".tmp.0123456789abcdeg",
                                           path + ".tmp.0123456789abcdef0", dir.file("other.tmp.0123456789abcdef"),
                                           path + ".zinf-tmp.0123456789abcdef"};
    for (const auto& f : kept) make(f);
    make(outside.file("victim"));
    const std::string link = path + ".tmp.fedcba9876543210";
    BOOST_REQUIRE(::symlink(outside.file("victim").c_str(), link.c_str()) == 0);
    const std::string text = "two";
    const std::span<const std::byte> piece = std::as_bytes(std::span(text));
    write_file_atomic(path, {&piece, 1});
    BOOST_TEST(!fs_exists(stale1));
    BOOST_TEST(!fs_exists(stale2));
    for (const auto& f : kept) BOOST_TEST(fs_exists(f), f);
    struct stat st {};
    BOOST_TEST(::lstat(link.c_str(), &st) == 0);  // a link is not a temporary zinf wrote
    BOOST_TEST(fs_exists(outside.file("victim")));
    BOOST_TEST(fs_exists(path));
}

// A FIFO never blocks open: refused where a file is needed; as a stream,
// waited on until a signal ends the wait (130).
BOOST_AUTO_TEST_CASE(open_input_and_fifos) {
    testing::TempDir dir;
    const std::string fifo = dir.file("fifo");
    BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    BOOST_CHECK_EXCEPTION(open_input(fifo, Input::regular), DataError, [](const DataError& e) {
        return std::string(e.what()).find("FIFO") != std::string::npos;
    });
    BOOST_CHECK_EXCEPTION(open_input(dir.path.string(), Input::stream), DataError, [](const DataError& e) {
        return std::string(e.what()).find("folder") != std::string::npos;
    });
    struct sigaction sa {}, old {};
    sa.sa_handler = [](int) {};
    sa.sa_flags = SA_RESTART;  // as std::signal installs it: open(2) would restart
    ::sigaction(SIGALRM, &sa, &old);
    ::alarm(1);
    BOOST_CHECK_EXCEPTION(open_input(fifo, Input::stream), Interrupted,
                          [](const Interrupted& e) { return e.exit_code() == 130; });
    ::alarm(0);
    ::sigaction(SIGALRM, &old, nullptr);
    // With a writer that has written, the stream reads what it wrote.
    std::thread writer([&] {
        Fd w = Fd::open(fifo, O_WRONLY);
        BOOST_REQUIRE(::write(w.get(), "line\n", 5) == 5);
    });
    auto in = input_stream(fifo);
    std::string line;
    std::getline(*in, line);
    writer.join();
    BOOST_TEST(line == "line");
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
    // Found by the config fuzzer (tests/fuzz/corpus/config/crash-*): a number
    // past a double is nlohmann's out_of_range, not a parse_error, and escaped
    // as an internal error (70) from every JSON Lines reader.
    for (const char* big : {R"({"pinned":429491e30867297})", R"({"a":1e999})", R"({"a":-1e400})"}) {
        const std::string w = testing::what_of<DataError>([&] { (void)json::parse_line(big, "big.json", 3); }, big);
        BOOST_TEST(w.find("big.json") != std::string::npos, w);
        BOOST_TEST(w.find("line 3: invalid JSON") != std::string::npos, w);
    }
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
