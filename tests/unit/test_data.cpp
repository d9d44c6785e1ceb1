// Unit tests of libzinf data: token files written and read back, every header
// error naming the file, text files as byte tokens, the vocabulary check, the
// loader's batches against a hand computation, its wrap-around, N ranks of
// batch B against one rank of batch N*B, shuffled offsets (determinism and
// range), the split and the unigram entropy.
#define BOOST_TEST_MODULE data
#include "testing.hpp"

#include <zinf/data.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sys/stat.h>
#include <thread>
#include <vector>

using namespace zinf;
using namespace zinf::data;
using u16 = std::uint16_t;
using i32 = std::int32_t;

namespace {

std::uint64_t fresh_seed(const char* what) {
    const std::uint64_t s = testing::seed(what);
    BOOST_TEST_MESSAGE(what << ": seed " << s << " (replay with ZINF_TEST_SEED=" << s << ")");
    return s;
}

std::vector<u16> random_tokens(std::size_t n, std::mt19937_64& rng, unsigned vocab = 65536) {
    std::vector<u16> t(n);
    for (auto& v : t) v = static_cast<u16>(rng() % vocab);
    return t;
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    BOOST_REQUIRE(f.good());
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A token file's bytes with the given header words and `ntok_body` tokens.
std::string token_file_bytes(std::int32_t magic, std::int32_t version, std::int32_t ntok, std::size_t ntok_body) {
    std::vector<std::int32_t> h(kHeaderInts, 0);
    h[0] = magic, h[1] = version, h[2] = ntok;
    std::string s(reinterpret_cast<const char*>(h.data()), kHeaderBytes);
    for (std::size_t i = 0; i < ntok_body; ++i) {
        const u16 v = static_cast<u16>(i * 7 + 3);
        s.append(reinterpret_cast<const char*>(&v), 2);
    }
    return s;
}

// A sequence whose every token tells its position (mod 65536): a batch's
// values show exactly where it was read.
std::vector<u16> iota_tokens(std::size_t n) {
    std::vector<u16> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<u16>(i);
    return t;
}

struct Batch {
    std::vector<i32> x, y;
};
Batch batch_of(const Loader& l, std::uint64_t index) {
    Batch b{std::vector<i32>(l.batch_tokens()), std::vector<i32>(l.batch_tokens())};
    l.batch(index, b.x, b.y);
    return b;
}

}  // namespace

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(token_file_round_trip) {
    std::mt19937_64 rng(fresh_seed("token file round trip"));
    testing::TempDir dir;
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{1000}, std::size_t{300001}}) {
        BOOST_TEST_CONTEXT("n " << n) {
            const auto toks = random_tokens(n, rng);
            const std::string path = dir.file("t" + std::to_string(n) + ".bin");
            write_token_file(path, toks);
            // The bytes on disk are llm.c's layout, not only what our reader takes.
            const std::string raw = read_bytes(path);
            BOOST_TEST(raw.size() == 1024 + 2 * n);
            std::int32_t h[256];
            std::memcpy(h, raw.data(), sizeof h);
            BOOST_TEST(h[0] == 20240520);
            BOOST_TEST(h[1] == 1);
            BOOST_TEST(h[2] == static_cast<std::int32_t>(n));
            BOOST_TEST(std::all_of(h + 3, h + 256, [](std::int32_t v) { return v == 0; }));

            Tokens t = Tokens::open(path);
            BOOST_TEST(t.path() == path);
            BOOST_TEST(std::vector<u16>(t.tokens().begin(), t.tokens().end()) == toks, boost::test_tools::per_element());
            BOOST_TEST(t.max_token() == *std::max_element(toks.begin(), toks.end()));
            // A move keeps the open file, and a view taken before it reads on.
            const TokenSpan view = t.tokens();
            Tokens moved = std::move(t);
            BOOST_TEST(std::vector<u16>(view.begin(), view.end()) == toks, boost::test_tools::per_element());
            BOOST_TEST(moved.tokens().size() == n);
        }
    }
    // No temporary left beside the file.
    std::size_t files = 0;
    for (auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
    BOOST_TEST(files == 4u);
}

// A token file changed under its reader (issue 47: a data script rewriting
// it in place during training killed zinf-train with SIGBUS through the
// mapping): every read after the change is a DataError naming the file and
// the byte offset it was reading; before the change, reads are exact.
BOOST_AUTO_TEST_CASE(token_file_changed_under_its_reader_is_an_error_naming_the_offset) {
    testing::TempDir dir;
    std::vector<u16> toks(4096);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<u16>(i * 7 % 50000);
    struct Case {
        const char* name;
        std::function<void(const std::string&)> change;
        const char* says;
    };
    const std::vector<Case> cases = {
        {"truncated", [](const std::string& p) { std::filesystem::resize_file(p, 1024 + 2 * 1000); }, "truncated"},
        {"grown", [](const std::string& p) { std::filesystem::resize_file(p, 1024 + 2 * 5000); }, "written to"},
        {"rewritten in place",
         [](const std::string& p) {
             std::string raw = read_bytes(p);
             raw[2000] ^= 1;
             std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a modification time of its own
             std::ofstream(p, std::ios::binary | std::ios::in) << raw;  // same size, new bytes
         },
         "modification time"},
        {"replaced",
         [&](const std::string& p) { write_token_file(p, std::vector<u16>(toks.size(), 3)); },
         "another file"},
        {"removed", [](const std::string& p) { std::filesystem::remove(p); }, "no longer there"},
    };
    for (const auto& c : cases) {
        const std::string path = dir.file(std::string(c.name) + ".bin");
        write_token_file(path, toks);
        const Tokens t = Tokens::open(path);
        Loader l(t.tokens(), path, {.batch = 2, .seq = 512});
        std::vector<i32> x(1024), y(1024);
        l.batch(2, x, y);  // tokens 2048..3072: before the change, exact
        BOOST_TEST(x[0] == static_cast<i32>(toks[2048]), c.name);
        c.change(path);
        const std::string w = testing::what_of<DataError>([&] { l.batch(2, x, y); }, c.name);
        BOOST_TEST(w.starts_with(path + ": the token file changed during the run"), c.name << ": " << w);
        BOOST_TEST(w.find(c.says) != std::string::npos, c.name << ": " << w);
        BOOST_TEST(w.find("at offset " + std::to_string(1024 + 2 * 2048)) != std::string::npos, c.name << ": " << w);
    }
}

BOOST_AUTO_TEST_CASE(token_file_replaces_atomically) {
    testing::TempDir dir;
    const std::string path = dir.file("t.bin");
    const std::vector<u16> a{5, 6, 7}, b{9, 8};
    write_token_file(path, a);
    write_token_file(path, b);
    const Tokens t = Tokens::open(path);
    BOOST_TEST(std::vector<u16>(t.tokens().begin(), t.tokens().end()) == b, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(write_refuses_empty) {
    testing::TempDir dir;
    const std::string path = dir.file("empty.bin");
    const std::string w = testing::what_of<DataError>([&] { write_token_file(path, {}); }, "empty write");
    BOOST_TEST(testing::contains(w, path));
    BOOST_TEST(!std::filesystem::exists(path));
}

BOOST_AUTO_TEST_CASE(header_errors_name_the_file) {
    testing::TempDir dir;
    struct Case {
        const char* name;
        std::string bytes;
        std::vector<std::string> parts;  // what the message must say
    };
    const std::vector<Case> cases = {
        {"empty", "", {"0 bytes", "shorter than the 1024-byte header"}},
        {"short", token_file_bytes(kMagic, kVersion, 10, 0).substr(0, 1000), {"1000 bytes", "shorter than the 1024"}},
        {"magic", token_file_bytes(20240522, kVersion, 4, 4), {"magic 20240522", "20240520", "at offset 0"}},
        {"version 3", token_file_bytes(kMagic, 3, 4, 4), {"version 3 is not supported", "at offset 4"}},
        // Version 2 is 4 bytes a token: 2-byte tokens after its header are too few.
        {"version 2, 2-byte tokens", token_file_bytes(kMagic, 2, 4, 4), {"1032 bytes", "1024 + 4*4 = 1040 bytes"}},
        {"version 0", token_file_bytes(kMagic, 0, 4, 4), {"version 0 is not supported", "at offset 4"}},
        {"zero tokens", token_file_bytes(kMagic, kVersion, 0, 0), {"token count 0", "at offset 8"}},
        {"negative tokens", token_file_bytes(kMagic, kVersion, -3, 0), {"token count -3", "at offset 8"}},
        // The body two tokens short, and one byte and two tokens long: both sizes said.
        {"truncated", token_file_bytes(kMagic, kVersion, 10, 8), {"1040 bytes", "10 tokens", "= 1044 bytes"}},
        {"too long", token_file_bytes(kMagic, kVersion, 10, 12), {"1048 bytes", "10 tokens", "= 1044 bytes"}},
        {"odd length", token_file_bytes(kMagic, kVersion, 10, 10) + "x", {"1045 bytes", "= 1044 bytes"}},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            const std::string path = dir.file(std::string(c.name) + ".bin");
            write_bytes(path, c.bytes);
            const std::string w = testing::what_of<DataError>([&] { Tokens::open(path); }, c.name);
            BOOST_TEST_MESSAGE(w);
            BOOST_TEST(w.rfind(path + ": ", 0) == 0, "message starts with the file: " << w);
            for (const auto& p : c.parts) BOOST_TEST(testing::contains(w, p), "'" << p << "' in: " << w);
        }
    }
    // The exit code a program turns it into.
    const std::string path = dir.file("magic.bin");
    try {
        Tokens::open(path);
        BOOST_ERROR("no exception");
    } catch (const Error& e) {
        BOOST_TEST(e.exit_code() == 65);
        BOOST_TEST(e.path() == path);
        BOOST_TEST(e.offset().value_or(99) == 0u);
    }
}

BOOST_AUTO_TEST_CASE(missing_file) {
    testing::TempDir dir;
    const std::string path = dir.file("absent.bin");
    for (bool text : {false, true}) {
        BOOST_TEST_CONTEXT((text ? "text" : "tokens")) {
            try {
                text ? Tokens::text(path) : Tokens::open(path);
                BOOST_ERROR("no exception");
            } catch (const MissingInputError& e) {
                BOOST_TEST(e.exit_code() == 66);
                BOOST_TEST(testing::contains(e.what(), path));
            }
        }
    }
    // A folder is no token file.
    const std::string w = testing::what_of<DataError>([&] { Tokens::open(dir.path.string()); }, "folder");
    BOOST_TEST(testing::contains(w, "not a regular file"));
    // Nor is a FIFO: refused at once, where opening it would wait for a
    // writer that never comes (and past SIGTERM).
    const std::string fifo = dir.file("fifo");
    BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    for (bool text : {false, true}) {
        const std::string f = testing::what_of<DataError>(
            [&] { text ? Tokens::text(fifo) : Tokens::open(fifo); }, text ? "text fifo" : "tokens fifo");
        BOOST_TEST(testing::contains(f, "FIFO"), f);
    }
}

BOOST_AUTO_TEST_CASE(text_tokens_are_the_bytes) {
    std::mt19937_64 rng(fresh_seed("text tokens"));
    testing::TempDir dir;
    std::string bytes(70000, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    bytes[17] = '\xff';  // the top byte is 255, never a sign-extended 65535
    const std::string path = dir.file("book.txt");
    write_bytes(path, bytes);
    const Tokens t = Tokens::text(path);
    BOOST_TEST(t.path() == path);
    BOOST_REQUIRE(t.tokens().size() == bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i)
        if (t.tokens()[i] != static_cast<unsigned char>(bytes[i])) {
            BOOST_ERROR("token " << i << " is " << t.tokens()[i] << ", byte "
                                 << int(static_cast<unsigned char>(bytes[i])));
            break;
        }
    BOOST_TEST(t.max_token() == 255u);
    BOOST_TEST(t.tokens()[17] == 255u);

    write_bytes(path, "hi\n");
    const Tokens small = Tokens::text(path);
    BOOST_TEST(std::vector<u16>(small.tokens().begin(), small.tokens().end()) == (std::vector<u16>{'h', 'i', '\n'}),
               boost::test_tools::per_element());
    BOOST_TEST(small.max_token() == static_cast<unsigned>('i'));

    write_bytes(path, "");
    const std::string w = testing::what_of<DataError>([&] { Tokens::text(path); }, "empty text");
    BOOST_TEST(testing::contains(w, path + ": "));
    BOOST_TEST(testing::contains(w, "empty"));
}

BOOST_AUTO_TEST_CASE(check_vocab_names_first_offender) {
    testing::TempDir dir;
    const std::string path = dir.file("v.bin");
    std::vector<u16> toks(5000, 100);
    toks[1234] = 50257;  // the first at or above the vocabulary
    toks[4000] = 60000;  // the largest, later
    toks[4500] = 50256;  // below: fine
    write_token_file(path, toks);
    const Tokens t = Tokens::open(path);
    BOOST_TEST(t.max_token() == 60000u);
    BOOST_CHECK_NO_THROW(check_vocab(t, 60001));
    BOOST_CHECK_NO_THROW(check_vocab(t, 65536));
    BOOST_TEST(testing::what_of<DataError>([&] { check_vocab(t, 50257); }, "vocab 50257") ==
               path + ": token 50257 at token offset 1234 (byte 3492) is not below the model's vocabulary 50257");
    BOOST_TEST(testing::what_of<DataError>([&] { check_vocab(t, 60000); }, "vocab 60000") ==
               path + ": token 60000 at token offset 4000 (byte 9024) is not below the model's vocabulary 60000");
    BOOST_TEST(testing::what_of<DataError>([&] { check_vocab(t, 100); }, "vocab 100") ==
               path + ": token 100 at token offset 0 (byte 1024) is not below the model's vocabulary 100");
}

// Version 2 (uint32 tokens, llm.c's for Llama 3): the bytes llm.c writes,
// ids past 65,535 read back and batched, the vocabulary check naming file and
// position, the length rule with 4 bytes a token.
BOOST_AUTO_TEST_CASE(token_file_version_2) {
    std::mt19937_64 rng(fresh_seed("token file version 2"));
    testing::TempDir dir;
    const std::string path = dir.file("llama3.bin");
    std::vector<std::uint32_t> toks(3001);
    for (auto& v : toks) v = static_cast<std::uint32_t>(rng() % 128256);
    toks[7] = 128255;
    toks[2000] = 128000;  // <|begin_of_text|>
    write_wide_token_file(path, toks);
    const std::string raw = read_bytes(path);
    BOOST_TEST(raw.size() == 1024 + 4 * toks.size());
    std::int32_t h[3];
    std::memcpy(h, raw.data(), sizeof h);
    BOOST_TEST(h[0] == 20240520);
    BOOST_TEST(h[1] == 2);
    BOOST_TEST(h[2] == 3001);
    const Tokens t = Tokens::open(path);
    BOOST_TEST(t.version() == 2);
    BOOST_TEST(t.tokens().wide());
    BOOST_TEST(std::vector<std::uint32_t>(t.tokens().begin(), t.tokens().end()) == toks,
               boost::test_tools::per_element());
    BOOST_TEST(t.max_token() == 128255u);
    BOOST_CHECK_NO_THROW(check_vocab(t, 128256));
    BOOST_TEST(testing::what_of<DataError>([&] { check_vocab(t, 128255); }, "vocab 128255") ==
               path + ": token 128255 at token offset 7 (byte 1052) is not below the model's vocabulary 128255");
    // Batches carry the wide ids; the split and the entropy see them too.
    Loader l(t.tokens(), path, {.batch = 2, .seq = 5});
    std::vector<i32> x(10), y(10);
    l.batch(0, x, y);
    for (int i = 0; i < 10; ++i) {
        BOOST_TEST(x[i] == static_cast<i32>(toks[i]));
        BOOST_TEST(y[i] == static_cast<i32>(toks[i + 1]));
    }
    const auto [train, val] = split(t.tokens(), 0.1);
    BOOST_TEST(val.size() == 301u);
    BOOST_TEST(val[0] == toks[2700]);
    BOOST_TEST(val.wide());
    BOOST_TEST(unigram_entropy_nats(std::vector<std::uint32_t>{70000, 70000, 5, 5}) == std::log(2.0),
               boost::test_tools::tolerance(1e-12));
    BOOST_TEST(unigram_entropy_nats(std::vector<std::uint32_t>{4000000000u, 1}) == std::log(2.0),
               boost::test_tools::tolerance(1e-12));
    // A version 2 header over 2-byte tokens: the size says so.
    std::string cut = raw.substr(0, 1024 + 2 * toks.size());
    const std::string bad = dir.file("short.bin");
    std::ofstream(bad, std::ios::binary).write(cut.data(), static_cast<std::streamsize>(cut.size()));
    const std::string what = testing::what_of<DataError>([&] { Tokens::open(bad); }, "short v2");
    BOOST_TEST(testing::contains(what, "1024 + 4*3001"), what);
    // Version 3 does not exist.
    std::string v3 = raw;
    v3[4] = 3;
    const std::string three = dir.file("v3.bin");
    std::ofstream(three, std::ios::binary).write(v3.data(), static_cast<std::streamsize>(v3.size()));
    const std::string w3 = testing::what_of<DataError>([&] { Tokens::open(three); }, "v3");
    BOOST_TEST(testing::contains(w3, "version 3 is not supported"), w3);
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(loader_in_order_by_hand) {
    // 20 tokens 1000, 1001, ...; B=2, T=3: B*T = 6, W = floor(19/6) = 3.
    std::vector<u16> toks(20);
    std::iota(toks.begin(), toks.end(), u16{1000});
    const Loader l(toks, "hand", {.batch = 2, .seq = 3});
    BOOST_TEST(l.windows() == 3u);
    BOOST_TEST(l.batch_tokens() == 6u);
    const Batch b0 = batch_of(l, 0), b1 = batch_of(l, 1), b2 = batch_of(l, 2);
    BOOST_TEST(b0.x == (std::vector<i32>{1000, 1001, 1002, 1003, 1004, 1005}), boost::test_tools::per_element());
    BOOST_TEST(b0.y == (std::vector<i32>{1001, 1002, 1003, 1004, 1005, 1006}), boost::test_tools::per_element());
    BOOST_TEST(b1.x == (std::vector<i32>{1006, 1007, 1008, 1009, 1010, 1011}), boost::test_tools::per_element());
    BOOST_TEST(b1.y == (std::vector<i32>{1007, 1008, 1009, 1010, 1011, 1012}), boost::test_tools::per_element());
    BOOST_TEST(b2.x == (std::vector<i32>{1012, 1013, 1014, 1015, 1016, 1017}), boost::test_tools::per_element());
    BOOST_TEST(b2.y == (std::vector<i32>{1013, 1014, 1015, 1016, 1017, 1018}), boost::test_tools::per_element());
    // Token 1019 is only ever a target's successor: never read.

    // Two ranks, B=1, T=4: B*T = 4, W = floor(19/8) = 2.
    const Loader r0(toks, "hand", {.batch = 1, .seq = 4, .rank = 0, .ranks = 2});
    const Loader r1(toks, "hand", {.batch = 1, .seq = 4, .rank = 1, .ranks = 2});
    BOOST_TEST(r0.windows() == 2u);
    BOOST_TEST(r1.windows() == 2u);
    BOOST_TEST(batch_of(r0, 0).x == (std::vector<i32>{1000, 1001, 1002, 1003}), boost::test_tools::per_element());
    BOOST_TEST(batch_of(r1, 0).x == (std::vector<i32>{1004, 1005, 1006, 1007}), boost::test_tools::per_element());
    BOOST_TEST(batch_of(r0, 1).x == (std::vector<i32>{1008, 1009, 1010, 1011}), boost::test_tools::per_element());
    BOOST_TEST(batch_of(r1, 1).y == (std::vector<i32>{1013, 1014, 1015, 1016}), boost::test_tools::per_element());
    BOOST_TEST(r1.offset(0) == 4u);
    BOOST_TEST(r1.offset(1) == 12u);
}

BOOST_AUTO_TEST_CASE(loader_wraps_after_last_whole_batch) {
    // 19 tokens, B*T = 6: W = floor(18/6) = 3, and batch 3 needs token 18 as
    // its last target (offset 12 + 6 = 18 < 19), so all three fit; with 18
    // tokens only two do.
    std::vector<u16> toks = iota_tokens(19);
    const Loader l(toks, "wrap", {.batch = 2, .seq = 3});
    BOOST_TEST(l.windows() == 3u);
    for (std::uint64_t i = 0; i < 10; ++i) {
        BOOST_TEST_CONTEXT("batch " << i) {
            BOOST_TEST(l.offset(i) == (i % 3) * 6);
            const Batch b = batch_of(l, i);
            BOOST_TEST(b.x.front() == static_cast<i32>((i % 3) * 6));
            BOOST_TEST(b.y.back() == static_cast<i32>((i % 3) * 6 + 6));
        }
    }
    BOOST_TEST(batch_of(l, 2).y.back() == 18);
    BOOST_TEST(batch_of(l, 3).x == batch_of(l, 0).x, boost::test_tools::per_element());
    const std::vector<u16> shorter = iota_tokens(18);
    const Loader s(shorter, "wrap", {.batch = 2, .seq = 3});
    BOOST_TEST(s.windows() == 2u);
    BOOST_TEST(s.offset(2) == 0u);

    // A huge index wraps the same way.
    const std::uint64_t big = (std::uint64_t{1} << 62) + 5;
    BOOST_TEST(l.offset(big) == (big % 3) * 6);
}

BOOST_AUTO_TEST_CASE(ranks_read_what_one_rank_reads) {
    std::mt19937_64 rng(fresh_seed("ranks equivalence"));
    for (unsigned N : {2u, 4u}) {
        for (std::size_t n : {std::size_t{1000}, std::size_t{4097}, std::size_t{12345}}) {
            const auto toks = random_tokens(n, rng);
            const std::uint64_t B = 3, T = 17;
            const Loader one(toks, "one", {.batch = N * B, .seq = T});
            std::vector<Loader> ranks;
            for (unsigned r = 0; r < N; ++r) ranks.emplace_back(toks, "many", LoaderOptions{.batch = B, .seq = T, .rank = r, .ranks = N});
            BOOST_TEST_CONTEXT("N " << N << ", n " << n << ", W " << one.windows()) {
                for (unsigned r = 0; r < N; ++r) BOOST_TEST(ranks[r].windows() == one.windows());
                // Past two wraps, so the wrap-around agrees too.
                for (std::uint64_t i = 0; i < 2 * one.windows() + 3; ++i) {
                    const Batch whole = batch_of(one, i);
                    Batch joined;
                    for (const auto& l : ranks) {
                        const Batch part = batch_of(l, i);
                        joined.x.insert(joined.x.end(), part.x.begin(), part.x.end());
                        joined.y.insert(joined.y.end(), part.y.begin(), part.y.end());
                    }
                    BOOST_TEST_CONTEXT("batch " << i) {
                        BOOST_TEST(joined.x == whole.x, boost::test_tools::per_element());
                        BOOST_TEST(joined.y == whole.y, boost::test_tools::per_element());
                    }
                }
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(shuffle_deterministic_and_in_range) {
    const std::uint64_t seed = fresh_seed("shuffle");
    std::mt19937_64 rng(seed);
    const std::vector<u16> toks = iota_tokens(5000);  // values = positions (all below 65536)
    const std::uint64_t B = 4, T = 25;                // B*T = 100: offsets in [0, 4899]
    const LoaderOptions o{.batch = B, .seq = T, .rank = 1, .ranks = 2, .shuffle = true, .seed = seed};
    const Loader a(toks, "s", o), again(toks, "s", o);
    LoaderOptions o2 = o;
    o2.seed = seed + 1;
    const Loader other_seed(toks, "s", o2);
    LoaderOptions o0 = o;
    o0.rank = 0;
    const Loader other_rank(toks, "s", o0);

    std::set<std::uint64_t> seen;
    std::uint64_t lo = UINT64_MAX, hi = 0, same_seed_diff = 0, same_rank_diff = 0;
    const std::uint64_t draws = 20000;
    for (std::uint64_t k = 0; k < draws; ++k) {
        const std::uint64_t i = k < draws / 2 ? k : rng();  // small and arbitrary indices
        const std::uint64_t off = a.offset(i);
        if (off > 5000 - 100 - 1) {
            BOOST_ERROR("index " << i << ": offset " << off << " past 4899");
            break;
        }
        lo = std::min(lo, off), hi = std::max(hi, off);
        seen.insert(off);
        if (again.offset(i) != off) {
            BOOST_ERROR("index " << i << ": not the same offset twice");
            break;
        }
        same_seed_diff += other_seed.offset(i) != off;
        same_rank_diff += other_rank.offset(i) != off;
    }
    // 20000 uniform draws over 4900 offsets: both ends and nearly all between.
    BOOST_TEST(lo < 10u);
    BOOST_TEST(hi > 4889u);
    BOOST_TEST(seen.size() > 4500u);
    // Another seed or rank agrees only by chance (1 in 4900).
    BOOST_TEST(same_seed_diff > draws * 99 / 100);
    BOOST_TEST(same_rank_diff > draws * 99 / 100);

    // The batch is the window at that offset, consecutive across rows.
    for (std::uint64_t i : {0ull, 1ull, 77ull, 123456789ull}) {
        const Batch b = batch_of(a, i);
        const auto off = static_cast<i32>(a.offset(i));
        for (std::size_t j = 0; j < b.x.size(); ++j) {
            BOOST_TEST(b.x[j] == off + static_cast<i32>(j));
            BOOST_TEST(b.y[j] == off + static_cast<i32>(j) + 1);
        }
    }

    // The fewest tokens two ranks take (N*B*T + 1): all 101 offsets drawn, the last included.
    const std::vector<u16> tiny = iota_tokens(2 * 100 + 1);
    const Loader t(tiny, "tiny", o);
    std::set<std::uint64_t> tiny_seen;
    for (std::uint64_t i = 0; i < 2000; ++i) tiny_seen.insert(t.offset(i));
    BOOST_TEST(*tiny_seen.rbegin() == 100u);  // 201 - 100 - 1
    BOOST_TEST(tiny_seen.size() == 101u);
}

BOOST_AUTO_TEST_CASE(loader_errors) {
    const std::vector<u16> toks = iota_tokens(100);
    // N*B*T + 1 = 2*7*7 + 1 = 99 fits in 100; 2*5*10 + 1 = 101 does not.
    BOOST_CHECK_NO_THROW(Loader(toks, "ok", {.batch = 7, .seq = 7, .rank = 1, .ranks = 2}));
    const std::string w = testing::what_of<DataError>(
        [&] { Loader(toks, "train.bin", {.batch = 5, .seq = 10, .rank = 0, .ranks = 2}); }, "W == 0");
    BOOST_TEST(w == "train.bin: 100 tokens, fewer than one global batch needs (2 ranks * batch 5 * seq 10 + 1 = 101)");
    // Exactly N*B*T tokens: one short of the last target.
    BOOST_TEST(!testing::what_of<DataError>(
                    [&] { Loader(std::span(toks).first(98), "x", {.batch = 7, .seq = 7, .ranks = 2}); }, "98")
                    .empty());
    BOOST_TEST(!testing::what_of<DataError>([&] { Loader({}, "x", {.batch = 1, .seq = 1}); }, "empty").empty());
    BOOST_TEST(!testing::what_of<UsageError>([&] { Loader(toks, "x", {.batch = 0, .seq = 4}); }, "B 0").empty());
    BOOST_TEST(!testing::what_of<UsageError>([&] { Loader(toks, "x", {.batch = 4, .seq = 0}); }, "T 0").empty());
    BOOST_TEST(!testing::what_of<UsageError>(
                    [&] { Loader(toks, "x", {.batch = std::uint64_t{1} << 40, .seq = std::uint64_t{1} << 40}); },
                    "overflow")
                    .empty());
    BOOST_TEST(!testing::what_of<InternalError>([&] { Loader(toks, "x", {.batch = 1, .seq = 1, .rank = 2, .ranks = 2}); },
                                                "rank 2 of 2")
                    .empty());
    BOOST_TEST(!testing::what_of<InternalError>([&] { Loader(toks, "x", {.batch = 1, .seq = 1, .ranks = 0}); }, "0 ranks")
                    .empty());

    const Loader l(toks, "x", {.batch = 2, .seq = 5});
    std::vector<i32> ten(10), nine(9), eleven(11);
    BOOST_CHECK_NO_THROW(l.batch(0, ten, ten));
    BOOST_TEST(testing::contains(testing::what_of<InternalError>([&] { l.batch(0, nine, ten); }, "9 inputs"), "9 inputs"));
    BOOST_TEST(testing::contains(testing::what_of<InternalError>([&] { l.batch(0, ten, eleven); }, "11 targets"),
                                 "11 targets"));
}

// ---------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(split_sizes) {
    const std::vector<u16> toks = iota_tokens(1000);
    struct Case {
        std::size_t n;
        double f;
        std::size_t val;
    };
    for (const Case c : {Case{1000, 0.0, 0}, Case{1000, 0.1, 100}, Case{1000, 0.0005, 1}, Case{1000, 0.5, 500},
                         Case{999, 0.5, 500}, Case{1000, 0.0011, 2}, Case{100, 0.07, 7}, Case{3, 0.01, 1},
                         Case{1, 0.5, 1}, Case{0, 0.3, 0}}) {
        BOOST_TEST_CONTEXT("n " << c.n << ", fraction " << c.f) {
            const auto all = std::span(toks).first(c.n);
            const auto [train, val] = split(all, c.f);
            BOOST_TEST(val.size() == c.val);
            BOOST_TEST(train.size() == c.n - c.val);
            // Train first, val the tail, the same memory.
            BOOST_TEST(train.data() == all.data());
            if (!val.empty()) BOOST_TEST(val.data() == all.data() + train.size());
        }
    }
    for (double f : {-0.01, 0.51, 1.0, std::nan("")})
        BOOST_TEST(testing::contains(
            testing::what_of<UsageError>([&] { split(toks, f); }, "fraction " + std::to_string(f)), "[0, 0.5]"));
}

BOOST_AUTO_TEST_CASE(entropy_of_known_distributions) {
    std::mt19937_64 rng(fresh_seed("entropy"));
    // p = (1/2, 1/4, 1/8, 1/8): H = 1.75 bits = 1.75 ln 2 nats, in any order.
    std::vector<u16> t;
    for (int i = 0; i < 4000; ++i) t.push_back(7);
    for (int i = 0; i < 2000; ++i) t.push_back(65535);
    for (int i = 0; i < 1000; ++i) t.push_back(0);
    for (int i = 0; i < 1000; ++i) t.push_back(300);
    std::shuffle(t.begin(), t.end(), rng);
    BOOST_TEST(unigram_entropy_nats(t) == 1.75 * std::log(2.0), boost::test_tools::tolerance(1e-12));
    // Uniform over 256 values: ln 256.
    std::vector<u16> u;
    for (int rep = 0; rep < 3; ++rep)
        for (int v = 0; v < 256; ++v) u.push_back(static_cast<u16>(v * 251));
    std::shuffle(u.begin(), u.end(), rng);
    BOOST_TEST(unigram_entropy_nats(u) == std::log(256.0), boost::test_tools::tolerance(1e-12));
    // One value: no uncertainty. Nothing: 0 by definition.
    BOOST_TEST(unigram_entropy_nats(std::vector<u16>(50, 9)) == 0.0);
    BOOST_TEST(unigram_entropy_nats({}) == 0.0);
}
