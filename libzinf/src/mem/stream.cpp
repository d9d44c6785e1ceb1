// Stream: a byte range of any size crosses the pinned pool in buffer-sized
// windows, with the file transfers of the next windows in flight while the
// current one is copied.
#include <zinf/mem.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <unistd.h>

namespace zinf::mem {

namespace {

// The aligned windows a range is cut into: [A, B) is the range widened to the
// file's alignment, each window one pool buffer long (the last one shorter).
struct Windows {
    std::uint64_t begin = 0, end = 0;  // the range asked for
    std::uint64_t A = 0, B = 0;        // widened to the alignment
    std::uint64_t buf = 0;
    std::size_t count() const { return static_cast<std::size_t>((B - A + buf - 1) / buf); }
    std::uint64_t start(std::size_t i) const { return A + i * buf; }
    std::uint64_t stop(std::size_t i) const { return std::min(B, start(i) + buf); }
};

void check_buffer(const io::File& file, std::uint64_t buf) {
    if (buf % file.alignment() != 0)
        throw UsageError("pinned buffers of " + format_size(buf) + " do not suit the direct-I/O alignment (" +
                         format_size(file.alignment()) + ") of " + file.path());
}

Windows cut(const io::File& file, std::uint64_t offset, std::uint64_t bytes, std::uint64_t buf) {
    check_buffer(file, buf);
    const std::uint64_t a = file.alignment();
    return {offset, offset + bytes, align_down(offset, a), align_up(offset + bytes, a), buf};
}

// A second, buffered descriptor of the same file (the same inode even if it
// was renamed since), write-only.
Fd open_buffered_twin(const io::File& file) {
    // The site is the file's own name, not its /proc link's.
    const int fd = sys::openat(AT_FDCWD, "/proc/self/fd/" + std::to_string(file.fd()), O_WRONLY | O_CLOEXEC, 0,
                               file.path());
    if (fd >= 0) return Fd(fd);
    if (errno != ENOENT) throw_errno("open", errno, file.path());
    return Fd::open(file.path(), O_WRONLY);  // no /proc: the path will do
}

void pwrite_all(int fd, std::span<const std::byte> src, std::uint64_t offset, const std::string& path) {
    for (std::size_t done = 0; done < src.size();) {
        const long n = sys::pwrite(fd, src.data() + done, src.size() - done, offset + done, path);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("pwrite", errno, path, offset + done);
        // No progress would loop for ever: an error, as the engine makes it.
        if (n == 0) throw IoError("write made no progress (0 bytes written)", {EIO, path, offset + done, -1});
        done += static_cast<std::size_t>(n);
    }
}

// A synchronous pread that accepts the end of the file: under O_DIRECT the
// kernel takes a whole aligned block and returns what exists. Returns the
// bytes read.
std::uint64_t pread_to_eof(io::File& file, std::uint64_t offset, std::span<std::byte> dst) {
    std::uint64_t done = 0;
    while (done < dst.size()) {
        const long n = sys::pread(file.fd(), dst.data() + done, dst.size() - done, offset + done, file.path());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("pread", errno, file.path(), offset + done);
        if (n == 0) break;
        done += static_cast<std::uint64_t>(n);
        // Under O_DIRECT a short read ends at the end of the file; asking for
        // the rest would be an unaligned request.
        if (file.alignment() > 1 && !is_aligned(done, file.alignment())) break;
    }
    return done;
}

// Tickets still in flight when something throws: waited (their buffers are
// about to go back to the pool), their own errors dropped for the first one.
struct InFlight {
    io::Engine& engine;
    std::vector<std::optional<io::Ticket>> tickets;
    InFlight(io::Engine& e, std::size_t n) : engine(e), tickets(n) {}
    void wait(std::size_t slot) {
        if (!tickets[slot]) return;
        io::Ticket t = *tickets[slot];
        tickets[slot].reset();
        engine.wait(t);
    }
    ~InFlight() {
        for (auto& t : tickets) {
            if (!t) continue;
            try {
                engine.wait(*t);
            } catch (...) {
            }
        }
    }
};

}  // namespace

Stream::Stream(io::Engine& engine, PinnedPool& pool, StreamOptions opts)
    : engine_(engine), pool_(pool), opts_(std::move(opts)) {
    // Half the pool by default: with 4 x 16MiB in flight a 3.6 GiB/s drive
    // read at 0.90 of its best, with 8 at 0.95 (BENCHMARKS.md).
    if (opts_.buffers == 0) opts_.buffers = std::max<std::size_t>(2, pool.buffers() / 2);
    opts_.buffers = std::min(opts_.buffers, pool.buffers());
}

void Stream::read(io::File& file, std::uint64_t offset, std::uint64_t bytes, const Sink& sink) {
    if (bytes == 0) return;
    const std::uint64_t size = file.size();
    if (offset + bytes > size || offset + bytes < offset)
        throw DataError("reading bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                            ") of a file of " + std::to_string(size) + " bytes: the range runs past its end",
                        {0, file.path(), size, -1});
    const Windows w = cut(file, offset, bytes, pool_.buffer_bytes());
    const std::size_t n = w.count();
    const std::size_t k = std::min<std::size_t>(opts_.buffers, n);
    auto leases = pool_.lease_many(k, opts_.who);
    InFlight flight(engine_, k);

    // A window that reaches past the end of the file (an unaligned file under
    // O_DIRECT) is read with pread, which stops at the end.
    auto start = [&](std::size_t i) {
        const std::uint64_t s = w.start(i), e = w.stop(i);
        if (e > size) return;
        flight.tickets[i % k] = engine_.read(file, s, leases[i % k].bytes().first(e - s));
    };
    for (std::size_t i = 0; i < k; ++i) start(i);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t slot = i % k;
        const std::uint64_t s = w.start(i), e = w.stop(i);
        auto buf = leases[slot].bytes();
        if (e > size) {
            if (pread_to_eof(file, s, buf.first(e - s)) < std::min(e, size) - s)
                throw IoError("the file shrank while it was read", {0, file.path(), s, -1});
        } else {
            flight.wait(slot);
        }
        const std::uint64_t from = std::max(s, w.begin), to = std::min(e, w.end);
        sink(from - w.begin, buf.subspan(from - s, to - from));
        pool_.count_moved(to - from);
        if (i + k < n) start(i + k);
    }
}

void Stream::read(io::File& file, std::uint64_t offset, std::span<std::byte> dst) {
    read(file, offset, dst.size(), [dst](std::uint64_t at, std::span<const std::byte> piece) {
        std::memcpy(dst.data() + at, piece.data(), piece.size());
    });
}

void Stream::write(io::File& file, std::uint64_t offset, std::uint64_t bytes, const Source& source) {
    if (bytes == 0) return;
    const std::uint64_t end = offset + bytes;
    if (end < offset)
        throw UsageError("writing " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                         " of " + file.path() + " runs past 2^64");
    const std::uint64_t buf = pool_.buffer_bytes();
    check_buffer(file, buf);
    // Under O_DIRECT only whole pages go through the engine; the partial pages
    // at the edges are written as they are, through a buffered descriptor.
    // So no byte outside the range is ever rewritten (no read-modify-write a
    // neighbouring writer could race with), the file never grows past the
    // range, and no page is written both ways at once.
    const std::uint64_t unit =
        file.alignment() > 1 ? std::max<std::uint64_t>(file.alignment(), static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE))) : 1;
    std::uint64_t lo = align_up(offset, unit), hi = align_down(end, unit);
    if (lo >= hi) lo = hi = end;  // no whole page: all of it is an edge
    const Windows w{offset, end, lo, hi, buf};
    const std::size_t n = hi > lo ? w.count() : 0;
    const std::size_t k = std::max<std::size_t>(1, std::min<std::size_t>(opts_.buffers, n));
    auto leases = pool_.lease_many(k, opts_.who);

    if (lo > offset || end > hi) {
        Fd edge_fd = open_buffered_twin(file);
        auto scratch = leases[0].bytes();
        auto edge = [&](std::uint64_t from, std::uint64_t to) {
            for (std::uint64_t at = from; at < to;) {
                auto piece = scratch.first(std::min<std::uint64_t>(to - at, scratch.size()));
                source(at - offset, piece);
                pwrite_all(edge_fd.get(), piece, at, file.path());
                pool_.count_moved(piece.size());
                at += piece.size();
            }
        };
        edge(offset, lo);
        edge(hi, end);
        edge_fd.close(file.path());
    }

    InFlight flight(engine_, k);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t slot = i % k;
        flight.wait(slot);  // the buffer's previous write is done
        const std::uint64_t s = w.start(i), e = w.stop(i);
        auto piece = leases[slot].bytes().first(e - s);
        source(s - offset, piece);
        flight.tickets[slot] = engine_.write(file, s, piece);
        pool_.count_moved(piece.size());
    }
    for (std::size_t slot = 0; slot < k; ++slot) flight.wait(slot);
}

void Stream::write(io::File& file, std::uint64_t offset, std::span<const std::byte> src) {
    write(file, offset, src.size(), [src](std::uint64_t at, std::span<std::byte> piece) {
        std::memcpy(piece.data(), src.data() + at, piece.size());
    });
}

}  // namespace zinf::mem
