#include <zinf/util.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <istream>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <utility>

namespace zinf {

int open_standard_fds(const char* program) noexcept {
    for (int fd = 0; fd <= 2; ++fd) {
        if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        // open(2) takes the lowest free descriptor: this one, as the ones
        // below it are open. Not a fault site: nothing of the run yet.
        const int got = ::open("/dev/null", (fd == 0 ? O_RDONLY : O_WRONLY) | O_NOCTTY);  // fault-site: /dev/null
        if (got == fd) continue;
        const int err = errno;
        if (got >= 0) ::close(got);
        if (::fcntl(2, F_GETFD) != -1) {
            const std::string msg = std::string(program) + ": descriptor " + std::to_string(fd) +
                                    " is closed and /dev/null cannot be opened in its place (" +
                                    std::strerror(got >= 0 ? EBADF : err) + ")\n";
            [[maybe_unused]] const auto n = ::write(2, msg.data(), msg.size());  // fault-site: stderr
        }
        return exit_code::io;
    }
    return 0;
}

void flush_stdout() {
    // std::cout writes through C's stdout (synced with stdio): its flush,
    // tried again here, says why a write failed (errno).
    errno = 0;
    std::cout.flush();
    int err = errno;
    if (std::fflush(stdout) != 0 && !err) err = errno;
    if (!std::cout || std::ferror(stdout)) throw IoError("writing the output failed", {err ? err : EIO, "stdout", {}, -1});
}

void fsync_dir(const std::string& dir) {
    const std::string d = dir.empty() ? "." : dir;
    Fd fd = Fd::open(d, O_RDONLY | O_DIRECTORY);
    if (sys::fsync(fd.get(), d) != 0) throw_errno("fsync", errno, d);
}

std::string temp_name(const std::string& path, std::string_view tag) {
    std::uint64_t r = 0;
    for (std::size_t got = 0; got < sizeof r;) {
        const ssize_t n = ::getrandom(reinterpret_cast<char*>(&r) + got, sizeof r - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("getrandom", errno, path);
        got += static_cast<std::size_t>(n);
    }
    return path + std::string(tag) + hex64(r);
}

void remove_stale_temps(const std::string& path, std::string_view tag) noexcept {
    const std::filesystem::path p(path);
    const std::string folder = p.has_parent_path() ? p.parent_path().string() : ".";
    const std::string prefix = p.filename().string() + std::string(tag);
    DIR* d = ::opendir(folder.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
        const std::string_view name(e->d_name);
        if (!name.starts_with(prefix) || name.size() != prefix.size() + 16) continue;
        if (name.substr(prefix.size()).find_first_not_of("0123456789abcdef") != std::string_view::npos) continue;
        struct stat st {};
        if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
}

namespace {

// Whether `fd` lies beneath the folder `root_fd`, by their paths in /proc:
// the check a kernel without openat2 leaves to us.
bool fd_beneath(int root_fd, int fd) {
    auto target = [](int f) {
        std::error_code ec;
        return std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(f), ec).string();
    };
    const std::string root = target(root_fd), file = target(fd);
    if (root.empty() || file.empty()) return false;
    return file == root || file.starts_with(root == "/" ? root : root + "/");
}

}  // namespace

int open_beneath_raw(const std::string& root, const std::string& rel, int flags, unsigned mode) noexcept {
    if ((flags & O_CREAT) || (flags & O_ACCMODE) != O_RDONLY) flags |= O_NOFOLLOW;
    int root_fd;
    do {
        root_fd = sys::open(root.empty() ? "." : root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    } while (root_fd < 0 && errno == EINTR);
    if (root_fd < 0) return -errno;
    const Fd root_hold(root_fd);
    const std::string path = (root.empty() ? std::string(".") : root) + "/" + rel;
    long fd = -1;
    // EAGAIN: a rename elsewhere raced the walk; the kernel asks for a retry.
    for (int tries = 0; tries < 64; ++tries) {
        fd = sys::openat2(root_fd, rel, flags | O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, path);
        if (fd >= 0 || (errno != EINTR && errno != EAGAIN)) break;
    }
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != ENOSYS && errno != EPERM) return -errno;
    // No openat2 (an old kernel, or a seccomp filter that refuses it): the
    // folder first, checked before anything is created in it, then the file
    // in it, checked again where a read may have followed a link.
    const auto slash = rel.rfind('/');
    int dir_fd = root_fd;
    Fd dir_hold;
    if (slash != std::string::npos) {
        int d;
        do {
            d = sys::openat(root_fd, rel.substr(0, slash), O_PATH | O_DIRECTORY | O_CLOEXEC, 0, path);
        } while (d < 0 && errno == EINTR);
        if (d < 0) return -errno;
        dir_hold = Fd(d);
        if (!fd_beneath(root_fd, d)) return -EXDEV;
        dir_fd = d;
    }
    const std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
    do {
        fd = sys::openat(dir_fd, name, flags | O_CLOEXEC, mode, path);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    Fd hold(static_cast<int>(fd));
    if (!fd_beneath(root_fd, hold.get())) return -EXDEV;
    return hold.release();
}

void throw_open_beneath(int err, const std::string& root, const std::string& rel, int flags) {
    const std::string path = (root.empty() ? std::string(".") : root) + "/" + rel;
    if (err == EXDEV)
        throw DataError(rel + " leads outside the data directory " + root +
                            " (through a symbolic link or '..'); refused",
                        {0, path, {}, -1});
    if (err == ELOOP) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
            throw DataError("is a symbolic link, and zinf writes no file through a link; refused", {0, path, {}, -1});
    }
    throw_errno("open", err, path, {}, (flags & O_CREAT) != 0);
}

Fd open_beneath(const std::string& root, const std::string& rel, int flags, unsigned mode) {
    const int fd = open_beneath_raw(root, rel, flags, mode);
    if (fd < 0) throw_open_beneath(-fd, root, rel, flags);
    return Fd(fd);
}

namespace {

const char* kind_of(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
           : S_ISSOCK(m) ? "a socket" : S_ISDIR(m) ? "a folder" : "not a regular file";
}

void set_blocking(const Fd& fd, const std::string& path) {
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) throw_errno("fcntl", errno, path);
}

// A std::istream that owns the descriptor it reads, through sys::read (an
// I/O site like any other). A failed read is thrown, never taken for the end
// of the input: a manifest cut short by an I/O error is not a shorter one.
class FdIstream : public std::istream {
public:
    FdIstream(Fd fd, std::string path) : std::istream(nullptr), buf_(std::move(fd), std::move(path)) {
        rdbuf(&buf_);
        exceptions(std::ios::badbit);  // what underflow throws reaches the reader
    }

private:
    class Buf : public std::streambuf {
    public:
        Buf(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

    protected:
        int_type underflow() override {
            if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
            long n;
            do {
                n = sys::read(fd_.get(), data_, sizeof data_, path_);
            } while (n < 0 && errno == EINTR);
            if (n < 0) throw_errno("read", errno, path_, at_);
            if (n == 0) return traits_type::eof();
            at_ += static_cast<std::uint64_t>(n);
            setg(data_, data_, data_ + n);
            return traits_type::to_int_type(*gptr());
        }

    private:
        Fd fd_;
        std::string path_;
        std::uint64_t at_ = 0;
        char data_[64 * 1024];
    };
    Buf buf_;
};

}  // namespace

namespace {
std::atomic<const std::atomic<bool>*> g_stop_flag{nullptr};
}  // namespace

void watch_stop_flag(const std::atomic<bool>* flag) noexcept { g_stop_flag.store(flag); }

Fd open_input(const std::string& path, Input kind) {
    // O_NONBLOCK: open(2) of a FIFO returns at once instead of waiting for a
    // writer, where no signal would end the wait (the handlers restart it).
    Fd fd = Fd::open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", errno, path);
    if (S_ISREG(st.st_mode)) {
        set_blocking(fd, path);
        return fd;
    }
    if (S_ISDIR(st.st_mode)) throw DataError("is a folder, not a regular file", {0, path, {}, -1});
    if (kind == Input::regular || !(S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISSOCK(st.st_mode)))
        throw DataError(std::string("is ") + kind_of(st.st_mode) + ", not a regular file; give a file", {0, path, {}, -1});
    // A stream: wait until its writer has written something or gone.
    // (In turns of 100 ms where a stop flag is watched: a signal that came
    // before poll(2) started is seen at the next turn.)
    struct pollfd p {fd.get(), POLLIN, 0};
    for (;;) {
        const std::atomic<bool>* stop = g_stop_flag.load();
        const bool stopped = stop && stop->load();
        const int n = stopped ? -1 : ::poll(&p, 1, stop ? 100 : -1);
        if (n > 0) break;
        if (n == 0) continue;
        if (stopped || errno == EINTR)
            throw Interrupted("interrupted while waiting for input from " + std::string(kind_of(st.st_mode)),
                              {0, path, {}, -1});
        if (n < 0) throw_errno("poll", errno, path);
    }
    set_blocking(fd, path);
    return fd;
}

std::unique_ptr<std::istream> input_stream(const std::string& path) {
    return std::make_unique<FdIstream>(open_input(path, Input::stream), path);
}

std::string read_regular(const std::string& path, std::uint64_t max, const std::string& what) {
    const Fd fd = open_input(path, Input::regular);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", errno, path);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > max)
        throw DataError(what + " of " + format_size(size) + ", more than the " + format_size(max) + " one can be",
                        {0, path, {}, -1});
    std::string text(size, '\0');
    std::uint64_t at = 0;  // through short reads and EINTR; a file that shrank ends early
    while (at < size) {
        const long n = sys::pread(fd.get(), text.data() + at, size - at, at, path);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("read", errno, path, at);
        if (n == 0) break;
        at += static_cast<std::uint64_t>(n);
    }
    text.resize(at);
    return text;
}

void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces) {
    AtomicFile f = AtomicFile::create(path);
    for (const auto& piece : pieces) f.write(piece);
    f.commit();
}

AtomicFile AtomicFile::create(const std::string& path) {
    AtomicFile f;
    f.path_ = path;
    f.tmp_ = temp_name(path, ".tmp.");
    f.fd_ = Fd::open(f.tmp_, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0666);
    // A commit replaces the file, not its mode: a manifest made 0640 stays 0640.
    struct stat old {};
    if (::lstat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::fchmod(f.fd_.get(), old.st_mode & 07777) != 0) {
        const int err = errno;
        f.abandon();
        throw_errno("fchmod", err, f.tmp_);
    }
    return f;
}

// The sync behind the writer: its thread, and what fdatasync said.
struct AtomicFile::Behind {
    std::thread thread;
    std::atomic<bool> running{false};
    int error = 0;  // read after the join
};

AtomicFile::AtomicFile() = default;

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::exchange(o.tmp_, {})),
      fd_(std::move(o.fd_)),
      size_(o.size_),
      behind_(std::move(o.behind_)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
    if (this != &o) {
        abandon();
        path_ = std::move(o.path_);
        tmp_ = std::exchange(o.tmp_, {});
        fd_ = std::move(o.fd_);
        size_ = o.size_;
        behind_ = std::move(o.behind_);
    }
    return *this;
}

AtomicFile::~AtomicFile() { abandon(); }

bool AtomicFile::sync_behind() {
    if (tmp_.empty()) throw InternalError("sync of " + path_ + " after its commit");
    if (!behind_) behind_ = std::make_unique<Behind>();
    Behind& b = *behind_;
    if (b.running.load(std::memory_order_acquire)) return false;
    if (b.thread.joinable()) b.thread.join();
    if (b.error != 0) return false;  // commit() reports it
    b.running.store(true, std::memory_order_relaxed);
    // The descriptor outlives the thread: abandon() and commit() join first.
    b.thread = std::thread([&b, fd = fd_.get(), path = tmp_] {
        if (sys::fdatasync(fd, path) != 0) b.error = errno;
        b.running.store(false, std::memory_order_release);
    });
    return true;
}

int AtomicFile::join_behind() noexcept {
    if (!behind_) return 0;
    if (behind_->thread.joinable()) behind_->thread.join();
    return behind_->error;
}

void AtomicFile::abandon() noexcept {
    (void)join_behind();
    if (tmp_.empty()) return;
    fd_ = Fd();
    ::unlink(tmp_.c_str());
    tmp_.clear();
}

void AtomicFile::write(std::span<const std::byte> bytes) {
    pwrite(bytes, size_);
}

void AtomicFile::pwrite(std::span<const std::byte> bytes, std::uint64_t offset) {
    if (tmp_.empty()) throw InternalError("write to " + path_ + " after its commit");
    for (std::size_t done = 0; done < bytes.size();) {  // through short writes and EINTR
        const std::uint64_t at = offset + done;
        const long n = sys::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done, at, tmp_);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("write", errno, tmp_, at);
        if (n == 0) throw IoError("write made no progress (0 bytes written)", {EIO, tmp_, at, -1});
        done += static_cast<std::size_t>(n);
    }
    size_ = std::max(size_, offset + bytes.size());
}

void AtomicFile::pread(std::span<std::byte> bytes, std::uint64_t offset) const {
    for (std::size_t done = 0; done < bytes.size();) {
        const std::uint64_t at = offset + done;
        const long n = sys::pread(fd_.get(), bytes.data() + done, bytes.size() - done, at, tmp_);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("read", errno, tmp_, at);
        if (n == 0) throw IoError("read past the end of what was written", {EIO, tmp_, at, -1});
        done += static_cast<std::size_t>(n);
    }
}

void AtomicFile::truncate(std::uint64_t bytes) {
    if (sys::ftruncate(fd_.get(), bytes, tmp_) != 0) throw_errno("ftruncate", errno, tmp_, bytes);
    size_ = bytes;
}

void AtomicFile::commit() {
    if (tmp_.empty()) throw InternalError("commit of " + path_ + " twice");
    try {
        // A sync behind that failed: the data it covered may be lost, and
        // the fsync after it need not say so again.
        if (const int err = join_behind(); err != 0) throw_errno("fdatasync", err, tmp_);
        if (sys::fsync(fd_.get(), tmp_) != 0) throw_errno("fsync", errno, tmp_);
        fd_.close(tmp_);
        if (sys::rename(tmp_, path_) != 0) throw_errno("rename", errno, path_);
    } catch (...) {
        abandon();
        throw;
    }
    tmp_.clear();
    remove_stale_temps(path_, ".tmp.");  // a killed commit's, before the folder's sync
    fsync_dir(std::filesystem::path(path_).parent_path().string());
}

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.release();
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0) ::close(fd_);
}

Fd Fd::open(const std::string& path, int flags, unsigned mode) {
    int fd;
    do {
        fd = sys::open(path, flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) throw_errno("open", errno, path, {}, (flags & O_CREAT) != 0);
    return Fd(fd);
}

void Fd::close(const std::string& path_for_errors) {
    if (fd_ < 0) return;
    int fd = release();
    // Linux releases the descriptor even when close fails; never retry it.
    if (sys::close(fd, path_for_errors) != 0 && errno != EINTR) throw_errno("close", errno, path_for_errors);
}

Mmap::Mmap(Mmap&& o) noexcept : addr_(o.addr_), len_(o.len_), locked_(o.locked_) {
    o.addr_ = nullptr;
    o.len_ = 0;
    o.locked_ = false;
}

Mmap& Mmap::operator=(Mmap&& o) noexcept {
    if (this != &o) {
        if (addr_) ::munmap(addr_, len_);
        addr_ = o.addr_;
        len_ = o.len_;
        locked_ = o.locked_;
        o.addr_ = nullptr;
        o.len_ = 0;
        o.locked_ = false;
    }
    return *this;
}

Mmap::~Mmap() {
    if (addr_) ::munmap(addr_, len_);
}

Mmap Mmap::anonymous(std::size_t bytes, bool populate, Pages pages) {
    Mmap m;
    if (bytes == 0) return m;
    const bool huge = pages == Pages::huge;
    // Huge pages need a 2MiB-aligned range: map 2MiB more, trim both ends.
    const std::size_t len = huge ? align_up(bytes, kHugePage) : bytes;
    const std::size_t span = huge ? len + kHugePage : len;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate && pages == Pages::any ? MAP_POPULATE : 0);
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        throw IoError("mmap of " + format_size(bytes) + " anonymous memory failed", {errno, {}, {}, -1});
    auto* base = static_cast<char*>(p);
    if (huge) {
        char* aligned = reinterpret_cast<char*>(align_up(reinterpret_cast<std::uintptr_t>(base), kHugePage));
        if (aligned > base) ::munmap(base, static_cast<std::size_t>(aligned - base));
        const std::size_t tail = static_cast<std::size_t>((base + span) - (aligned + len));
        if (tail) ::munmap(aligned + len, tail);
        base = aligned;
    }
    m.addr_ = base;
    m.len_ = len;
    // Advice only: a failure means other pages, never wrong memory.
    if (pages != Pages::any) ::madvise(base, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    if (populate && pages != Pages::any) {
        // After the advice, so that the faults take the pages asked for.
        const std::size_t step = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        for (std::size_t at = 0; at < len; at += step) static_cast<volatile char*>(m.addr_)[at] = 0;
    }
    return m;
}

Mmap Mmap::file_readonly(const Fd& fd, std::size_t bytes, const std::string& path) {
    Mmap m;
    if (bytes == 0) return m;
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw_errno("mmap", errno, path);
    m.addr_ = p;
    m.len_ = bytes;
    return m;
}

int Mmap::lock() noexcept {
    if (!addr_ || locked_) return 0;
    // The system call itself: sanitizer runtimes replace mlock(3) with a no-op
    // that reports success, which would make a sanitized build lie about it.
    if (::syscall(SYS_mlock, addr_, len_) != 0) return errno;
    locked_ = true;
    return 0;
}

AlignedBuffer AlignedBuffer::allocate(std::size_t bytes, std::size_t align) {
    if (!is_pow2(align))
        throw UsageError("buffer alignment " + std::to_string(align) + " is not a power of two");
    long page = ::sysconf(_SC_PAGESIZE);
    if (align > static_cast<std::size_t>(page))
        throw UsageError("buffer alignment " + format_size(align) + " exceeds the page size");
    AlignedBuffer b;
    // Buffers of 2MiB and more take transparent huge pages: a direct read
    // into them is one DMA segment per huge page instead of one per 4KiB
    // (measured: whole-file reads 2.0-2.4 -> 3.3 GiB/s, BENCHMARKS.md).
    // Populated here, so that no page fault lands inside a timed transfer.
    const std::size_t len = align_up(std::max<std::size_t>(bytes, 1), page);
    b.map_ = Mmap::anonymous(len, true, len >= Mmap::kHugePage ? Mmap::Pages::huge : Mmap::Pages::any);
    b.size_ = bytes;
    return b;
}

}  // namespace zinf
