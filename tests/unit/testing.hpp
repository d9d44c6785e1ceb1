// What the unit tests share: a fresh seed (printed, or ZINF_TEST_SEED), a
// temporary directory that is removed afterwards, and Boost.Test glue.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <iostream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>

// Built with the precompiled header (pch/tests.hpp), Boost.Test's main came before
// this file's BOOST_TEST_MODULE: name the master suite from it here, as
// BOOST_TEST_MAIN would have.
#if defined(ZINF_TEST_PCH) && defined(BOOST_TEST_MODULE)
static const boost::unit_test::framework::impl::master_test_suite_name_setter zinf_master_suite_name(
    BOOST_TEST_STRINGIZE(BOOST_TEST_MODULE).trim("\""));
#endif

namespace std {
// Boost.Test prints values of failed checks; std::byte has no operator<<.
inline std::ostream& boost_test_print_type(std::ostream& os, std::byte b) {
    return os << "0x" << std::hex << static_cast<int>(b) << std::dec;
}
}  // namespace std

namespace zinf::testing {

// A seed drawn fresh for each test run (never zeros), printed on stderr so a
// failure can be replayed with ZINF_TEST_SEED=<seed>.
inline std::uint64_t seed(const char* what) {
    std::uint64_t s;
    if (const char* env = std::getenv("ZINF_TEST_SEED"))
        s = std::strtoull(env, nullptr, 0);
    else
        s = (std::uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    std::cerr << "# " << what << ": seed " << s << " (replay with ZINF_TEST_SEED=" << s << ")\n";
    return s;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs `fn`, expecting exception E; returns its what() ("" and a failure otherwise).
template <class E, class F>
std::string what_of(F fn, const std::string& context) {
    try {
        fn();
    } catch (const E& e) {
        return e.what();
    } catch (const std::exception& e) {
        BOOST_ERROR(context << ": wrong exception type: " << e.what());
        return "";
    }
    BOOST_ERROR(context << ": no exception");
    return "";
}

inline void fill_random(std::span<std::byte> buf, std::mt19937_64& rng) {
    for (auto& b : buf) b = static_cast<std::byte>(rng());
}

// A directory under `parent` (default: $TMPDIR or /tmp, a disk that takes
// O_DIRECT), removed with its contents at the end of the test.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(std::filesystem::path parent = {}) {
        if (parent.empty()) {
            const char* t = std::getenv("TMPDIR");
            parent = t && *t ? t : "/tmp";
        }
        std::string tmpl = (parent / "zinf-test-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp in " + parent.string() + " failed");
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

// Captures what is written to stderr while `fn` runs.
template <class F>
inline std::string capture_stderr(F fn) {
    char path[] = "/tmp/zinf-stderr-XXXXXX";
    int fd = ::mkstemp(path);
    std::fflush(stderr);
    int saved = ::dup(2);
    ::dup2(fd, 2);
    fn();
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::string out;
    char buf[4096];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, n);
    ::close(fd);
    ::unlink(path);
    return out;
}

}  // namespace zinf::testing
