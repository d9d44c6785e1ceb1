#include "sweep.hpp"

#include <cerrno>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace zinf::nvmebench {

std::atomic<bool> g_interrupted{false};

std::vector<io::EngineConfig> SweepSpec::configs() const {
    std::vector<io::EngineConfig> out;
    for (const auto& e : engines)
        for (unsigned q : queues)
            for (unsigned qd : queue_depths)
                for (std::uint64_t bs : block_sizes) {
                    io::EngineConfig c;
                    c.engine = e;
                    c.block_size = bs;
                    c.queue_depth = qd;
                    c.queues = q;
                    out.push_back(c);
                }
    return out;
}

// --- Target --------------------------------------------------------------

namespace {
// Bytes available in `dir`; max when the file system reports no size at all
// (ramfs), where only an actual write can tell.
std::uint64_t free_bytes(const std::string& dir) {
    struct statvfs vs {};
    if (::statvfs(dir.c_str(), &vs) != 0) throw_errno("statvfs", errno, dir);
    if (vs.f_blocks == 0) return UINT64_MAX;
    return static_cast<std::uint64_t>(vs.f_bavail) * vs.f_frsize;
}
}  // namespace

Target::Target(const Options& o) : keep_(o.keep) {
    namespace fs = std::filesystem;
    if (!o.file.empty()) {
        path_ = o.file;
    } else {
        struct stat st {};
        if (::stat(o.dir.c_str(), &st) != 0) throw_errno("stat", errno, o.dir);
        if (!S_ISDIR(st.st_mode)) throw UsageError(o.dir + ": --dir is not a directory");
        path_ = (fs::path(o.dir) / ("zinf-nvmebench." + std::to_string(::getpid()) + ".dat")).string();
    }
    const std::string dir = fs::path(path_).has_parent_path() ? fs::path(path_).parent_path().string() : ".";

    struct stat st {};
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    io::OpenOptions oo;
    oo.direct = o.direct;
    if (exists) {
        if (!S_ISREG(st.st_mode)) throw UsageError(path_ + ": not a regular file");
        const auto have = static_cast<std::uint64_t>(st.st_size);
        if (o.need_write && !o.force)
            throw CreateError("refusing to overwrite a file zinf-nvmebench did not create (this run "
                              "writes it: --rw write or both, or --verify); pass --force to allow "
                              "it, or measure reads only with --rw read",
                              {0, path_, {}, -1});
        if (!o.need_write && have < o.size)
            throw UsageError(path_ + " has " + std::to_string(have) + " bytes, fewer than --size " +
                             std::to_string(o.size) + "; pass a smaller --size");
        if (o.need_write && o.size > have && free_bytes(dir) < o.size - have)
            throw CreateError("not enough free space to grow the file to " + format_size(o.size),
                              {ENOSPC, path_, {}, -1});
        oo.access = o.need_write ? io::Access::read_write : io::Access::read;
        file_ = io::File::open(path_, oo);
        has_data_ = have >= o.size;
        if (o.need_write && have < o.size) file_.preallocate(o.size);
        return;
    }
    const std::uint64_t avail = free_bytes(dir);
    if (avail < o.size)
        throw CreateError("not enough free space for a " + format_size(o.size) + " test file: " +
                              format_size(avail) + " available; pass a smaller --size",
                          {ENOSPC, dir, {}, -1});
    oo.access = io::Access::read_write;
    oo.create = true;
    oo.exclusive = true;
    file_ = io::File::open(path_, oo);
    created_ = true;
    try {
        file_.preallocate(o.size);
    } catch (...) {
        file_.close();
        ::unlink(path_.c_str());
        throw;
    }
}

Target::~Target() {
    try {
        file_.close();
    } catch (const Error& e) {
        log::warn(e.what());
    }
    if (!created_) return;
    if (keep_) {
        log::info("kept " + path_);
    } else if (::unlink(path_.c_str()) != 0) {
        log::warn(path_ + ": could not remove the test file: " + std::strerror(errno));
    }
}

// --- Pattern -------------------------------------------------------------

namespace {
inline std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
}  // namespace

Pattern::Pattern(std::uint64_t size) : hashes_((size + kUnit - 1) / kUnit) {}

void Pattern::fill(std::span<std::byte> block, std::uint64_t offset) {
    const std::uint64_t key = gen_ * 0xd1b54a32d192ed03ull;
    auto* w = reinterpret_cast<std::uint64_t*>(block.data());
    const std::size_t words = block.size() / 8;
    const std::uint64_t first = offset / 8;
    for (std::size_t i = 0; i < words; ++i) w[i] = splitmix64(key ^ (first + i));
    for (std::size_t u = 0; u * kUnit < block.size(); ++u) {
        auto unit = block.subspan(u * kUnit, std::min(kUnit, block.size() - u * kUnit));
        hashes_[offset / kUnit + u] = xxh3(unit);
    }
}

void Pattern::check(std::span<const std::byte> block, std::uint64_t offset,
                    const std::string& path) const {
    for (std::size_t u = 0; u * kUnit < block.size(); ++u) {
        auto unit = block.subspan(u * kUnit, std::min(kUnit, block.size() - u * kUnit));
        const std::uint64_t at = offset + u * kUnit;
        const std::uint64_t got = xxh3(unit), want = hashes_[at / kUnit];
        if (got != want)
            throw DataError("verify: the data read back differs from what was written (xxh3 " +
                                hex64(got) + ", expected " + hex64(want) + ") in the 4KiB unit",
                            {0, path, at, -1});
    }
}

// --- measure -------------------------------------------------------------

namespace {
// The write buffers are reused every queues x queue_depth blocks; stamping
// each 4KiB unit with its file offset keeps every unit on disk distinct, so a
// deduplicating drive cannot skip writes. 8 bytes per 4KiB: no measurable cost.
void stamp(std::span<std::byte> block, std::uint64_t offset) {
    for (std::size_t u = 0; u + 8 <= block.size(); u += 4096) {
        const std::uint64_t v = splitmix64(offset + u);
        std::memcpy(block.data() + u, &v, 8);
    }
}
}  // namespace

Result measure(Target& t, const io::EngineConfig& cfg, io::Op op, const SweepSpec& spec,
               Pattern* pattern, const OnBytes& on_bytes) {
    io::File& f = t.file();
    const std::uint64_t bs = cfg.block_size;
    const std::uint64_t size = spec.size;
    const std::uint64_t nblocks = (size + bs - 1) / bs;
    const std::uint64_t slots =
        std::min<std::uint64_t>(std::uint64_t(cfg.queues) * cfg.queue_depth, nblocks);

    // Declared before the engine so that it outlives any I/O still in flight
    // when an error unwinds this function.
    AlignedBuffer mem = AlignedBuffer::allocate(slots * bs, 4096);
    io::Engine eng(cfg);
    std::vector<io::Registration> regs;
    const std::uint64_t per_reg = std::max<std::uint64_t>(1, GiB / bs) * bs;
    for (std::uint64_t at = 0; at < mem.size(); at += per_reg)
        regs.push_back(eng.register_buffer(mem.bytes().subspan(at, std::min(per_reg, mem.size() - at))));
    io::Registration file_reg = eng.register_file(f);

    if (op == io::Op::write && !pattern) {
        // Incompressible data, so that drives that compress or deduplicate
        // cannot report a speed they would not reach on real tensors.
        auto* w = reinterpret_cast<std::uint64_t*>(mem.data());
        std::uint64_t x = 0x243f6a8885a308d3ull;
        for (std::size_t i = 0; i < mem.size() / 8; ++i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            w[i] = x;
        }
    }
    if (op == io::Op::write && pattern) pattern->next_generation();
    if (op == io::Op::read && !f.direct()) {
        // Reads must come from the device, not from pages the writes left behind.
        f.sync();
        ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
    }

    Result r{op, eng.config()};
    r.notes = eng.notes();
    // Up to `slots` requests in flight, each on its own buffer; whichever
    // completes first is checked and its buffer refilled with the next block,
    // as fio reaps. tickets[i] and inflight[i] describe the same request.
    struct InFlight {
        std::uint64_t offset, buf;
    };
    std::vector<io::Ticket> tickets;
    std::vector<InFlight> inflight;
    tickets.reserve(slots);
    inflight.reserve(slots);
    Timer timer;
    for (unsigned loop = 0; loop < spec.loops; ++loop) {
        std::uint64_t next = 0;
        auto issue = [&](std::uint64_t buf) -> std::pair<io::Ticket, InFlight> {
            const std::uint64_t off = next++ * bs;
            auto span = mem.bytes().subspan(buf * bs, std::min(bs, size - off));
            if (op == io::Op::write) {
                if (pattern)
                    pattern->fill(span, off);
                else
                    stamp(span, off);
            }
            return {op == io::Op::read ? eng.read(f, off, span) : eng.write(f, off, span), {off, buf}};
        };
        for (std::uint64_t b = 0; b < slots; ++b) {
            auto [tk, x] = issue(b);
            tickets.push_back(tk);
            inflight.push_back(x);
        }
        while (!tickets.empty()) {
            const std::size_t i = eng.wait_any(tickets);
            eng.wait(tickets[i]);
            const InFlight x = inflight[i];
            const std::uint64_t len = std::min(bs, size - x.offset);
            if (op == io::Op::read && pattern)
                pattern->check(mem.bytes().subspan(x.buf * bs, len), x.offset, t.path());
            ++r.blocks;
            if (on_bytes) on_bytes(len);
            if (g_interrupted.load(std::memory_order_relaxed)) {
                tickets.clear();  // the rest are drained by wait_all
                eng.wait_all();
                throw Interrupted("interrupted");
            }
            if (next < nblocks) {
                std::tie(tickets[i], inflight[i]) = issue(x.buf);
            } else {
                tickets[i] = tickets.back();
                inflight[i] = inflight.back();
                tickets.pop_back();
                inflight.pop_back();
            }
        }
    }
    if (op == io::Op::write) eng.sync(f);
    r.seconds = timer.seconds();
    r.bytes = size * spec.loops;
    if (op == io::Op::write) t.mark_written();
    return r;
}

}  // namespace zinf::nvmebench
