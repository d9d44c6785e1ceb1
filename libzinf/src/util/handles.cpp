#include <zinf/util.hpp>

#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace zinf {

void fsync_dir(const std::string& dir) {
    const std::string d = dir.empty() ? "." : dir;
    Fd fd = Fd::open(d, O_RDONLY | O_DIRECTORY);
    if (::fsync(fd.get()) != 0) throw_errno("fsync", errno, d);
}

void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    Fd fd = Fd::open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    try {
        std::uint64_t at = 0;  // through short writes and EINTR
        for (const auto& piece : pieces)
            for (std::size_t done = 0; done < piece.size();) {
                const ssize_t n = ::write(fd.get(), piece.data() + done, piece.size() - done);
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) throw_errno("write", errno, tmp, at);
                done += static_cast<std::size_t>(n);
                at += static_cast<std::uint64_t>(n);
            }
        if (::fsync(fd.get()) != 0) throw_errno("fsync", errno, tmp);
        fd.close(tmp);
        if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno("rename", errno, path);
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    fsync_dir(std::filesystem::path(path).parent_path().string());
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
        fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) throw_errno("open", errno, path, {}, (flags & O_CREAT) != 0);
    return Fd(fd);
}

void Fd::close(const std::string& path_for_errors) {
    if (fd_ < 0) return;
    int fd = release();
    // Linux releases the descriptor even when close fails; never retry it.
    if (::close(fd) != 0 && errno != EINTR) throw_errno("close", errno, path_for_errors);
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
