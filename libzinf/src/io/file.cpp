#include "internal.hpp"

#include <cerrno>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace zinf::io {
namespace {

std::atomic<std::uint64_t> g_next_file_id{1};

// The logical block size of the device holding `dev`, from sysfs; 0 when unknown.
std::size_t sysfs_logical_block_size(dev_t dev) {
    const std::string base = "/sys/dev/block/" + std::to_string(major(dev)) + ":" +
                             std::to_string(minor(dev));
    // A partition's queue/ lives in its parent device's folder.
    for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
        std::ifstream in(base + rel);  // fault-site: none (sysfs, a hint)
        std::size_t v = 0;
        if (in >> v && v > 0 && is_pow2(v)) return v;
    }
    return 0;
}

struct Alignment {
    std::size_t offset = 0;
    std::size_t memory = 0;
};

// Direct-I/O alignment: statx's DIO fields where the kernel reports them (6.1+),
// else the device's logical block size, else the page size.
Alignment probe_alignment(int fd) {
    Alignment a;
#ifdef STATX_DIOALIGN
    struct statx stx {};
    if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
        stx.stx_dio_offset_align > 0) {
        a.offset = stx.stx_dio_offset_align;
        a.memory = stx.stx_dio_mem_align;
    }
#endif
    if (a.offset == 0) {
        struct stat st {};
        if (::fstat(fd, &st) == 0) a.offset = sysfs_logical_block_size(st.st_dev);
    }
    if (a.offset == 0) a.offset = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (a.memory == 0) a.memory = a.offset;
    return a;
}

int open_flags(const OpenOptions& o) {
    int f = o.access == Access::read ? O_RDONLY : o.access == Access::write ? O_WRONLY : O_RDWR;
    if (o.create) f |= O_CREAT;
    if (o.create && o.exclusive) f |= O_EXCL;
    if (o.truncate) f |= O_TRUNC;
    return f;
}

}  // namespace

File::Impl::FaultAction File::Impl::take_fault(Op op, int& err) {
    std::lock_guard lk(fault_mu);
    std::uint64_t n = op == Op::read ? ++nth_read : ++nth_write;
    for (auto it = faults.begin(); it != faults.end(); ++it) {
        if (it->op != op || it->nth != n) continue;
        const Fault f = *it;
        faults.erase(it);
        if (faults.empty()) has_faults = false;
        err = f.err;
        if (f.err > 0) return FaultAction::fail;
        if (f.delay_ms > 0) {
            err = static_cast<int>(f.delay_ms);
            return FaultAction::delay;
        }
        return f.corrupt ? FaultAction::corrupt : FaultAction::shorten;
    }
    return FaultAction::none;
}

std::vector<Fault> parse_faults(std::string_view spec) {
    static const std::pair<const char*, int> errnos[] = {
        {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EINVAL", EINVAL}, {"EBADF", EBADF},
        {"EFAULT", EFAULT}, {"EAGAIN", EAGAIN}, {"EINTR", EINTR}, {"ENODATA", ENODATA},
        {"EROFS", EROFS}, {"EDQUOT", EDQUOT}};
    std::vector<Fault> out;
    std::size_t start = 0;
    while (start <= spec.size()) {
        std::size_t end = spec.find(',', start);
        if (end == std::string_view::npos) end = spec.size();
        std::string item(spec.substr(start, end - start));
        start = end + 1;
        if (item.empty()) continue;
        auto bad = [&] {
            return UsageError("ZINF_FAULTS: bad item '" + item +
                              "' (want op:nth:kind, op read|write, kind short|corrupt|delay<ms>|EIO|ENOSPC|...)");
        };
        std::size_t a = item.find(':'), b = item.find(':', a == std::string::npos ? a : a + 1);
        if (a == std::string::npos || b == std::string::npos) throw bad();
        std::string op = item.substr(0, a), nth = item.substr(a + 1, b - a - 1), kind = item.substr(b + 1);
        Fault f;
        if (op == "read") f.op = Op::read;
        else if (op == "write") f.op = Op::write;
        else throw bad();
        try {
            std::size_t used = 0;
            if (nth.empty() || nth.front() == '-') throw bad();  // stoull takes "-1"
            f.nth = std::stoull(nth, &used);
            if (used != nth.size() || f.nth == 0) throw bad();
        } catch (const std::logic_error&) {
            throw bad();
        }
        if (kind == "short") {
        } else if (kind.rfind("delay", 0) == 0) {
            const std::string ms = kind.substr(5);
            if (ms.empty() || ms.size() > 6 || ms.find_first_not_of("0123456789") != std::string::npos) throw bad();
            f.delay_ms = static_cast<std::uint32_t>(std::stoul(ms));
            if (f.delay_ms == 0) throw bad();
        } else if (kind == "corrupt") {
            if (f.op != Op::read) throw bad();
            f.corrupt = true;
        } else {
            auto it = std::find_if(std::begin(errnos), std::end(errnos),
                                   [&](auto& e) { return kind == e.first; });
            if (it == std::end(errnos)) throw bad();
            f.err = it->second;
        }
        out.push_back(f);
    }
    return out;
}

namespace {

// open(2), or open_beneath_raw when the file must lie beneath a folder:
// the descriptor or -errno.
struct Opener {
    std::string root, rel;
    int flags;
    unsigned mode;
    int operator()(int extra) const {
        if (!root.empty()) return open_beneath_raw(root, rel, flags | extra, mode);
        int fd;
        do {
            fd = sys::open(rel, flags | extra | O_CLOEXEC, mode);
        } while (fd < 0 && errno == EINTR);
        return fd < 0 ? -errno : fd;
    }
    [[noreturn]] void fail(int err, const std::string& path) const {
        if (!root.empty()) throw_open_beneath(err, root, rel, flags);
        struct stat st {};
        if (err == ELOOP && (flags & O_NOFOLLOW) && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
            throw DataError("is a symbolic link, and zinf writes no file through a link; refused", {0, path, {}, -1});
        throw_errno("open", err, path, {}, (flags & O_CREAT) != 0);
    }
};

bool is_folder(int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

File File::open(const std::string& path, const OpenOptions& opts) {
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    impl->id = g_next_file_id++;
    // Before the open, so that a bad spec never leaves a created file behind.
    if (const char* env = std::getenv("ZINF_FAULTS"); env && *env) {
        impl->faults = parse_faults(env);
        impl->has_faults = !impl->faults.empty();
    }
    // O_NONBLOCK: open(2) of a FIFO (a data file swapped for one, an import
    // --from one) returns at once instead of waiting, deaf to signals, for a
    // writer; it is refused below, and the flag cleared for the rest.
    Opener open{{}, path, open_flags(opts) | O_NONBLOCK, opts.mode};
    // What zinf creates it never creates through a link: one planted at a
    // state file's next generation would send the weights elsewhere. (An
    // existing file a user names, such as zinf-nvmebench --file, may be one.)
    if (opts.create) open.flags |= O_NOFOLLOW;
    if (!opts.beneath.empty()) {
        const std::string prefix = opts.beneath + "/";
        if (path.size() <= prefix.size() || path.compare(0, prefix.size(), prefix) != 0)
            throw InternalError("io::File::open: " + path + " is not spelled beneath " + opts.beneath);
        open.root = opts.beneath;
        open.rel = path.substr(prefix.size());
    }
    // A folder where a file should be: for a data directory's file, bad data.
    auto folder = [&]() -> std::exception_ptr {
        if (opts.beneath.empty()) return std::make_exception_ptr(IoError("is a folder, not a file", {EISDIR, path, {}, -1}));
        return std::make_exception_ptr(DataError("is a folder, not a data file", {0, path, {}, -1}));
    };
    if (opts.direct != Direct::buffered) {
        const int fd = open(O_DIRECT);
        if (fd >= 0) {
            impl->fd = Fd(fd);
            impl->direct = true;
        } else if (fd != -EINVAL) {
            if (fd == -EISDIR) std::rethrow_exception(folder());
            open.fail(-fd, path);
        } else if (opts.direct == Direct::require) {
            // With O_CREAT|O_EXCL the kernel created the file before refusing
            // O_DIRECT; it is ours, and a failed open leaves nothing behind.
            if (opts.create && opts.exclusive) ::unlink(path.c_str());
            struct stat st {};
            if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) std::rethrow_exception(folder());
            throw IoError("the file system refuses O_DIRECT (direct I/O was required)",
                          {EINVAL, path, {}, -1});
        } else if (opts.create && opts.exclusive) {
            // O_EXCL|O_CREAT with O_DIRECT may have created the file before the
            // O_DIRECT refusal on some file systems; it is ours, so reopen without O_EXCL.
            Opener again = open;
            again.flags &= ~O_EXCL;
            const int fd2 = again(0);
            if (fd2 < 0) again.fail(-fd2, path);
            impl->fd = Fd(fd2);
        }
    }
    if (!impl->fd) {
        const int fd = open(0);
        if (fd == -EISDIR) std::rethrow_exception(folder());
        if (fd < 0) open.fail(-fd, path);
        impl->fd = Fd(fd);
    }
    // A folder opens read-only, and with O_DIRECT where the file system
    // refuses it for files: say what it is, not that O_DIRECT failed.
    if (is_folder(impl->fd.get())) std::rethrow_exception(folder());
    {
        struct stat st {};
        if (::fstat(impl->fd.get(), &st) != 0) throw_errno("fstat", errno, path);
        if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
            throw DataError(std::string("is a ") + (S_ISFIFO(st.st_mode) ? "FIFO" : "socket") +
                                ", not a regular file; refused",
                            {0, path, {}, -1});
        const int fl = ::fcntl(impl->fd.get(), F_GETFL);
        if (fl < 0 || ::fcntl(impl->fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) throw_errno("fcntl", errno, path);
    }

    Alignment a = probe_alignment(impl->fd.get());
    impl->dio_align = a.offset;
    if (impl->direct) {
        impl->align = a.offset;
        impl->mem_align = a.memory;
    } else if (opts.direct == Direct::prefer) {
        struct stat st {};
        ::fstat(impl->fd.get(), &st);
        log::warn_once("nodirect:" + std::to_string(st.st_dev),
                       path + ": the file system refuses O_DIRECT; using buffered I/O "
                              "(through the page cache) for files there");
    }
    File f;
    f.impl_ = std::move(impl);
    return f;
}

File File::open_aligned(const std::string& path, OpenOptions opts, std::uint64_t unit, std::string_view unit_of) {
    File f = open(path, opts);
    if (!f.direct() || unit % f.alignment() == 0) return f;
    if (!unit_of.empty())
        log::warn_once("direct-align-" + path, path + ": direct I/O needs " + std::to_string(f.alignment()) +
                                                   "-byte alignment, " + std::string(unit_of) + " aligns to " +
                                                   std::to_string(unit) + "; using buffered I/O");
    opts.direct = Direct::buffered;
    opts.exclusive = false;
    return open(path, opts);
}

File::File() = default;
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

namespace {
File::Impl& need(const std::unique_ptr<File::Impl>& p) {
    if (!p) throw InternalError("operation on a closed zinf::io::File");
    return *p;
}
}  // namespace

const std::string& File::path() const { return need(impl_).path; }
int File::fd() const { return need(impl_).fd.get(); }
bool File::direct() const { return need(impl_).direct; }
std::size_t File::alignment() const { return need(impl_).align; }
std::size_t File::memory_alignment() const { return need(impl_).mem_align; }
std::size_t File::dio_alignment() const { return need(impl_).dio_align; }

std::uint64_t File::size() const {
    struct stat st {};
    if (::fstat(fd(), &st) != 0) throw_errno("fstat", errno, path());
    return static_cast<std::uint64_t>(st.st_size);
}

void File::preallocate(std::uint64_t bytes) {
    if (bytes == 0) return;
    if (sys::fallocate(fd(), bytes, path()) == 0) return;
    int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) throw_errno("fallocate", err, path(), {}, true);
    log::warn_once("nofallocate:" + path(),
                   path() + ": the file system cannot preallocate (fallocate unsupported); "
                            "extending the file instead");
    if (size() < bytes) truncate(bytes);
}

void File::truncate(std::uint64_t bytes) {
    if (sys::ftruncate(fd(), bytes, path()) != 0) throw_errno("ftruncate", errno, path());
}

void File::sync() {
    if (sys::fdatasync(fd(), path()) != 0) throw_errno("fdatasync", errno, path());
}

void File::close() {
    if (!impl_) return;
    std::unique_ptr<Impl> impl = std::move(impl_);
    impl->fd.close(impl->path);
}

void File::inject_fault(const Fault& fault) {
    if (fault.nth == 0) throw UsageError("fault injection: nth is 1-based");
    if (fault.corrupt && fault.op != Op::read) throw UsageError("fault injection: only reads corrupt");
    if (fault.delay_ms && (fault.err || fault.corrupt)) throw UsageError("fault injection: a delay is all it does");
    Impl& i = need(impl_);
    std::lock_guard lk(i.fault_mu);
    i.faults.push_back(fault);
    i.has_faults = true;
}

void File::clear_faults() {
    Impl& i = need(impl_);
    std::lock_guard lk(i.fault_mu);
    i.faults.clear();
    i.has_faults = false;
}

}  // namespace zinf::io
