// The file-system calls of libzinf and the programs, each a named I/O site
// (util.hpp): the one place the raw system calls are made, and where a test
// lists the sites a run touches (ZINF_FAULT_TRACE) or fails one of them
// (ZINF_FAULT_SITE). Unwatched, a site costs one load of a static.
#include <zinf/util.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <linux/openat2.h>
#include <set>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace zinf::sys {

namespace {

constexpr const char* kKindNames[] = {"open", "read", "write", "fsync", "rename", "fallocate", "truncate", "mkdir", "close"};

// "<name>.<16 hex digits>" (temp_name's random suffix) -> "<name>.*", at the
// end or before a slash (a file in a temporary folder): the same site in
// every run.
std::string site_path(const std::string& path) {
    constexpr std::size_t kHex = 16;
    std::string out;
    std::size_t i = 0;
    while (i < path.size()) {
        const std::size_t end = std::min(path.find('/', i), path.size());
        bool hex = end - i > kHex && path[end - kHex - 1] == '.';
        for (std::size_t j = end - kHex; hex && j < end; ++j)
            hex = std::isxdigit(static_cast<unsigned char>(path[j])) != 0;
        out.append(path, i, hex ? end - i - kHex : end - i);
        if (hex) out += '*';
        if (end < path.size()) out += '/';
        i = end + 1;
    }
    return out;
}

struct Watch {
    int trace_fd = -1;
    bool inject = false;
    Kind kind = Kind::open;
    int how = 0;
    std::string path;
    bool fired = false;
    std::mutex mu;
    std::set<std::pair<int, std::string>> seen;
};

// Parses ZINF_FAULT_SITE; a bad value is reported once and ignored, since a
// site cannot throw (it sits inside noexcept wrappers).
void parse_site(Watch& w, const char* spec) {
    const std::string s(spec);
    const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    bool ok = b != std::string::npos;
    if (ok) {
        const std::string kind = s.substr(0, a), how = s.substr(a + 1, b - a - 1);
        ok = false;
        for (int k = 0; k < static_cast<int>(std::size(kKindNames)); ++k)
            if (kind == kKindNames[k]) w.kind = static_cast<Kind>(k), ok = true;
        if (how == "EIO") w.how = EIO;
        else if (how == "ENOSPC") w.how = ENOSPC;
        else if (how == "short" && (w.kind == Kind::read || w.kind == Kind::write)) w.how = kShort;
        else ok = false;
        w.path = s.substr(b + 1);
    }
    if (!ok || w.path.empty()) {
        log::warn("ZINF_FAULT_SITE='" + s + "' is not KIND:EIO|ENOSPC|short:PATH (short for read and write only); ignored");
        return;
    }
    w.inject = true;
}

Watch* make_watch() {
    const char* trace = std::getenv("ZINF_FAULT_TRACE");
    const char* spec = std::getenv("ZINF_FAULT_SITE");
    if (!(trace && *trace) && !(spec && *spec)) return nullptr;
    auto* w = new Watch;  // lives as long as the process: sites run until exit
    if (trace && *trace) w->trace_fd = ::open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (spec && *spec) parse_site(*w, spec);
    return w;
}

Watch* watch() noexcept {
    static Watch* const w = make_watch();
    return w;
}

// The site's verdict, keeping errno as the caller left it.
int check(Kind kind, const std::string& path) noexcept {
    if (!watched()) return 0;
    const int saved = errno;
    const int r = site(kind, path);
    errno = saved;
    return r;
}

}  // namespace

const char* kind_name(Kind k) { return kKindNames[static_cast<int>(k)]; }

bool watched() noexcept { return watch() != nullptr; }

int site(Kind kind, const std::string& path) noexcept {
    Watch* w = watch();
    if (!w) return 0;
    try {
        const std::string p = site_path(path);
        std::lock_guard lk(w->mu);
        if (w->trace_fd >= 0 && w->seen.emplace(static_cast<int>(kind), p).second) {
            const std::string line = std::string(kind_name(kind)) + "\t" + p + "\n";
            (void)!::write(w->trace_fd, line.data(), line.size());  // O_APPEND: one line at a time
        }
        if (w->inject && !w->fired && w->kind == kind && w->path == p) {
            w->fired = true;
            return w->how;
        }
    } catch (...) {  // out of memory: the call goes ahead unwatched
    }
    return 0;
}

#define ZINF_SITE_FAIL(kind, path)                   \
    if (const int f = check(kind, path); f > 0) { \
        errno = f;                                   \
        return -1;                                   \
    }

// An O_PATH open only resolves a name (a folder to open beneath, a check
// that a path stays inside): it moves no data, and is no site.
int open(const std::string& path, int flags, unsigned mode) noexcept {
    if (!(flags & O_PATH)) ZINF_SITE_FAIL(Kind::open, path);
    return ::open(path.c_str(), flags, mode);
}

int openat(int dir_fd, const std::string& rel, int flags, unsigned mode, const std::string& path) noexcept {
    if (!(flags & O_PATH)) ZINF_SITE_FAIL(Kind::open, path);
    return ::openat(dir_fd, rel.c_str(), flags, mode);
}

long openat2(int dir_fd, const std::string& rel, int flags, unsigned mode, std::uint64_t resolve,
             const std::string& path) noexcept {
    if (!(flags & O_PATH)) ZINF_SITE_FAIL(Kind::open, path);
    struct open_how how {};
    how.flags = static_cast<std::uint64_t>(flags);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = resolve;
    return ::syscall(SYS_openat2, dir_fd, rel.c_str(), &how, sizeof how);
}

// A short transfer moves half (at least one byte) of what was asked.
#define ZINF_SITE_IO(kind, path, n)                  \
    if (const int f = check(kind, path); f > 0) {    \
        errno = f;                                   \
        return -1;                                   \
    } else if (f == kShort && n > 1) {               \
        n /= 2;                                      \
    }

long read(int fd, void* buf, std::size_t n, const std::string& path) noexcept {
    ZINF_SITE_IO(Kind::read, path, n);
    return ::read(fd, buf, n);
}

long pread(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& path) noexcept {
    ZINF_SITE_IO(Kind::read, path, n);
    return ::pread(fd, buf, n, static_cast<off_t>(offset));
}

long write(int fd, const void* buf, std::size_t n, const std::string& path) noexcept {
    ZINF_SITE_IO(Kind::write, path, n);
    return ::write(fd, buf, n);
}

long pwrite(int fd, const void* buf, std::size_t n, std::uint64_t offset, const std::string& path) noexcept {
    ZINF_SITE_IO(Kind::write, path, n);
    return ::pwrite(fd, buf, n, static_cast<off_t>(offset));
}

int fsync(int fd, const std::string& path) noexcept {
    ZINF_SITE_FAIL(Kind::fsync, path);
    return ::fsync(fd);
}

int fdatasync(int fd, const std::string& path) noexcept {
    ZINF_SITE_FAIL(Kind::fsync, path);
    return ::fdatasync(fd);
}

int rename(const std::string& from, const std::string& to) noexcept {
    ZINF_SITE_FAIL(Kind::rename, to);
    return ::rename(from.c_str(), to.c_str());
}

int exchange(const std::string& a, const std::string& b) noexcept {
    ZINF_SITE_FAIL(Kind::rename, b);
    return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
}

int fallocate(int fd, std::uint64_t bytes, const std::string& path) noexcept {
    ZINF_SITE_FAIL(Kind::fallocate, path);
    return ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
}

int ftruncate(int fd, std::uint64_t bytes, const std::string& path) noexcept {
    ZINF_SITE_FAIL(Kind::truncate, path);
    return ::ftruncate(fd, static_cast<off_t>(bytes));
}

int mkdir(const std::string& path, unsigned mode) noexcept {
    ZINF_SITE_FAIL(Kind::mkdir, path);
    return ::mkdir(path.c_str(), mode);
}

int close(int fd, const std::string& path) noexcept {
    if (const int f = check(Kind::close, path); f > 0) {
        ::close(fd);  // Linux frees the descriptor even when close fails
        errno = f;
        return -1;
    }
    return ::close(fd);
}

#undef ZINF_SITE_FAIL
#undef ZINF_SITE_IO

}  // namespace zinf::sys
