// What the io and mem unit tests share: backend preconditions, engine
// configurations, files that take O_DIRECT or refuse it, random data.
#pragma once

#include "testing.hpp"

#include <zinf/io.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sys/mount.h>
#include <unistd.h>
#include <vector>

namespace zinf::testing {

namespace utf = boost::unit_test;
using namespace zinf::io;

inline bool have_uring() {
    static const bool ok = uring_available();
    return ok;
}

struct UringPresent {
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        std::string why;
        boost::test_tools::assertion_result r(uring_available(&why));
        if (!r) r.message() << "io_uring is not available here: " << why;
        return r;
    }
};

inline EngineConfig config(const std::string& engine, std::uint64_t bs, unsigned qd, unsigned queues) {
    EngineConfig c;
    c.engine = engine;
    c.block_size = bs;
    c.queue_depth = qd;
    c.queues = queues;
    return c;
}

inline File open_rw(const std::string& path, Direct d = Direct::prefer) {
    OpenOptions o;
    o.access = Access::read_write;
    o.create = true;
    o.direct = d;
    return File::open(path, o);
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
    std::vector<std::byte> v(n);
    fill_random(v, rng);
    return v;
}

// A file system of `type` mounted on a fresh temporary folder: ramfs refuses
// O_DIRECT; tmpfs with "size=1m" is a disk that is nearly full. Needs root,
// or a user's password-less sudo (then the mount is made writable for the
// user: ramfs by its mode, tmpfs by its owner), as on a new user's machine.
struct Mount {
    TempDir dir;
    bool ok = false;
    bool sudo = false;
    explicit Mount(const char* type, const char* options = nullptr) {
        ok = ::mount(type, dir.path.c_str(), type, 0, options) == 0;
        if (ok || errno != EPERM || std::system("sudo -n true >/dev/null 2>&1") != 0) return;
        const int e = errno;
        std::string opts = std::string(type) == "tmpfs"
                               ? "uid=" + std::to_string(::getuid()) + ",gid=" + std::to_string(::getgid())
                               : std::string("mode=0777");
        if (options) opts += std::string(",") + options;
        ok = sudo = std::system(("sudo -n mount -t " + std::string(type) + " -o " + opts + " " + type + " '" +
                                 dir.path.string() + "' 2>/dev/null").c_str()) == 0;
        errno = e;
    }
    ~Mount() {
        if (ok && sudo) (void)std::system(("sudo -n umount '" + dir.path.string() + "'").c_str());
        else if (ok) ::umount(dir.path.c_str());
    }
};

struct CanMount {
    const char* type;
    const char* options = nullptr;
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        Mount m(type, options);
        boost::test_tools::assertion_result r(m.ok);
        if (!r)
            r.message() << "cannot mount " << type << " here (needs root or password-less sudo): "
                        << std::strerror(errno);
        return r;
    }
};

}  // namespace zinf::testing

// One test body run on each io backend; uring only where io_uring is allowed.
#define BOTH_BACKENDS(name)                                                            \
    BOOST_AUTO_TEST_CASE(name##_uring, *utf::precondition(zinf::testing::UringPresent())) { name("uring"); } \
    BOOST_AUTO_TEST_CASE(name##_threads) { name("threads"); }
