#include "sweep.hpp"

#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
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
    // The file is created in `dir`: a missing one is output we cannot create.
    if (::statvfs(dir.c_str(), &vs) != 0) throw_errno("statvfs", errno, dir, {}, true);
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

// Passes over the file with up to `slots` requests in flight, each on its
// own buffer. When one finishes, its callback (on the engine's ring thread)
// checks it and refills the same buffer with the next block: the queue
// never waits for this thread, as fio's single loop never waits for another.
class Pass {
public:
    Pass(io::Engine& eng, Target& t, io::Op op, AlignedBuffer& mem, std::uint64_t bs, std::uint64_t size,
         Pattern* pattern, const OnBytes& on_bytes)
        : eng_(eng), t_(t), op_(op), mem_(mem), bs_(bs), size_(size), nblocks_((size + bs - 1) / bs),
          pattern_(pattern), on_bytes_(on_bytes) {}

    // One pass over the file, `slots` requests first; returns when every
    // request it issued is done.
    void run(std::uint64_t slots) {
        next_ = 0;
        active_.fetch_add(1);  // held by this thread while it issues
        try {
            for (std::uint64_t b = 0; b < slots && !stop_; ++b) issue(b);
        } catch (...) {
            fail(std::current_exception());
        }
        leave();
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return active_.load() == 0; });
        if (g_interrupted.load()) stop_ = true;
    }
    bool stopped() const { return stop_; }
    // The first failure; read once no request is in flight.
    std::exception_ptr error() const { return error_; }
    std::uint64_t blocks() const { return blocks_.load(); }

private:
    void issue(std::uint64_t buf) {
        const std::uint64_t block = next_.fetch_add(1);
        if (block >= nblocks_) return;
        const std::uint64_t off = block * bs_, len = std::min(bs_, size_ - off);
        auto span = mem_.bytes().subspan(buf * bs_, len);
        if (op_ == io::Op::write) {
            if (pattern_)
                pattern_->fill(span, off);
            else
                stamp(span, off);
        }
        active_.fetch_add(1);
        auto done = [this, buf, off, span](const IoError* e) {
            try {
                if (e) throw *e;
                if (op_ == io::Op::read && pattern_) pattern_->check(span, off, t_.path());
                blocks_.fetch_add(1, std::memory_order_relaxed);
                if (on_bytes_) on_bytes_(span.size());
                if (!stop_ && !g_interrupted.load(std::memory_order_relaxed)) issue(buf);
            } catch (...) {
                fail(std::current_exception());
            }
            leave();
        };
        try {
            if (op_ == io::Op::read)
                eng_.read_then(t_.file(), off, span, done);
            else
                eng_.write_then(t_.file(), off, span, done);
        } catch (...) {  // never submitted: no callback will count it down
            leave();
            throw;
        }
    }
    // A request (or the issuing thread) is done: the last one wakes run().
    void leave() {
        if (active_.fetch_sub(1) == 1) {
            std::lock_guard lk(mu_);
            cv_.notify_all();
        }
    }
    void fail(std::exception_ptr e) {
        std::lock_guard lk(mu_);
        if (!error_) error_ = e;
        stop_ = true;
    }

    io::Engine& eng_;
    Target& t_;
    const io::Op op_;
    AlignedBuffer& mem_;
    const std::uint64_t bs_, size_, nblocks_;
    Pattern* pattern_;
    const OnBytes& on_bytes_;
    std::atomic<std::uint64_t> next_{0};    // next block to issue
    std::atomic<std::uint64_t> active_{0};  // requests in flight
    std::atomic<std::uint64_t> blocks_{0};  // requests completed
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    std::exception_ptr error_;  // the first failure, under mu_
};
}  // namespace

Result measure(Target& t, const io::EngineConfig& cfg, io::Op op, const SweepSpec& spec,
               Pattern* pattern, const OnBytes& on_bytes) {
    io::File& f = t.file();
    const std::uint64_t bs = cfg.block_size;
    const std::uint64_t nblocks = (spec.size + bs - 1) / bs;
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

    // Incompressible data, so that drives that compress or deduplicate
    // cannot report a speed they would not reach on real tensors.
    if (op == io::Op::write && !pattern) io::fill_incompressible(mem.bytes());
    if (op == io::Op::write && pattern) pattern->next_generation();
    if (op == io::Op::read && !f.direct()) {
        // Reads must come from the device, not from pages the writes left behind.
        f.sync();
        ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
    }

    Result r{op, eng.config()};
    r.notes = eng.notes();
    Pass pass(eng, t, op, mem, bs, spec.size, pattern, on_bytes);
    Timer timer;
    for (unsigned loop = 0; loop < spec.loops && !pass.stopped(); ++loop) pass.run(slots);
    eng.wait_all();  // every callback has returned
    if (pass.error()) std::rethrow_exception(pass.error());
    if (g_interrupted.load()) throw Interrupted("interrupted");
    r.blocks = pass.blocks();
    if (op == io::Op::write) eng.sync(f);
    r.seconds = timer.seconds();
    r.bytes = spec.size * spec.loops;
    if (op == io::Op::write) t.mark_written();
    return r;
}

}  // namespace zinf::nvmebench
