// What every fuzz target links, in both builds: findings and the memfd.
#include "fuzz.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>

namespace zinf::fuzz {

void finding(const std::string& what) {
    std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

static std::map<std::string, Target>& registry() {
    static std::map<std::string, Target> t;
    return t;
}

bool add(const char* name, Target fn) {
    registry()[name] = fn;
    return true;
}

const std::map<std::string, Target>& targets() { return registry(); }

static std::size_t g_accepted = 0;
void accepted() { ++g_accepted; }
std::size_t accepted_count() { return g_accepted; }

const MemFile& MemFile::with(const std::uint8_t* data, std::size_t size) {
    static MemFile f = [] {
        MemFile m;
        m.fd_ = ::memfd_create("zinf-fuzz", MFD_CLOEXEC);
        if (m.fd_ < 0) finding("memfd_create failed: errno " + std::to_string(errno));
        m.path_ = "/proc/self/fd/" + std::to_string(m.fd_);
        return m;
    }();
    if (::ftruncate(f.fd_, 0) != 0) finding("ftruncate of the memfd failed");
    for (std::size_t done = 0; done < size;) {
        const ssize_t n = ::pwrite(f.fd_, data + done, size - done, static_cast<off_t>(done));
        if (n <= 0) finding("pwrite to the memfd failed");
        done += static_cast<std::size_t>(n);
    }
    return f;
}

}  // namespace zinf::fuzz
