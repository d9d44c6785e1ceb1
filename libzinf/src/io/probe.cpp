// A short measurement of a folder's read and write bandwidth through the
// engine (io.hpp, probe_bandwidth): what a run that has no zinf-nvmebench
// figures holds its disk traffic against.
#include <zinf/io.hpp>

#include <exception>

#include <fcntl.h>
#include <unistd.h>

namespace zinf::io {

void fill_incompressible(std::span<std::byte> mem) {
    auto* w = reinterpret_cast<std::uint64_t*>(mem.data());
    std::uint64_t x = 0x243f6a8885a308d3ull;
    for (std::size_t i = 0; i < mem.size() / 8; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = x;
    }
}

Bandwidth probe_bandwidth(Engine& engine, const std::string& dir, std::uint64_t bytes) {
    const std::uint64_t piece = 16 * MiB;
    bytes = std::max(piece, align_up(bytes, piece));
    // One name a folder: the run's lock keeps a second run out, and a fault
    // walk finds the same file in every run. What a crashed run left is void.
    const std::string path = dir + "/disk-probe.scratch";
    ::unlink(path.c_str());
    struct Unlink {
        const std::string& p;
        ~Unlink() { ::unlink(p.c_str()); }
    } unlink_at_end{path};
    File f = File::open(path, {.access = Access::read_write, .create = true, .exclusive = true, .mode = 0600});
    f.preallocate(bytes);
    // One buffer the whole size would cost that much memory: each request
    // writes (reads) the same 16 MiB, all of them in flight at once.
    AlignedBuffer buf = AlignedBuffer::allocate(piece, 4096);
    fill_incompressible(buf.bytes());
    auto pass = [&](Op op) {
        std::vector<Ticket> ts;
        Timer t;
        for (std::uint64_t at = 0; at < bytes; at += piece)
            ts.push_back(op == Op::read ? engine.read(f, at, buf.bytes()) : engine.write(f, at, buf.bytes()));
        // Every ticket waited, failed or not, before the first error goes
        // up: the buffer and the file must outlive every request.
        std::exception_ptr failed;
        for (Ticket k : ts) try {
                engine.wait(k);
            } catch (...) {
                if (!failed) failed = std::current_exception();
            }
        if (failed) std::rethrow_exception(failed);
        if (op == Op::write) engine.sync(f);
        return static_cast<double>(bytes) / t.seconds();
    };
    Bandwidth b;
    b.write_bps = pass(Op::write);
    // Reads must come from the drive, not from pages the writes left behind.
    if (!f.direct()) ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
    b.read_bps = pass(Op::read);
    f.close();
    return b;
}

}  // namespace zinf::io
