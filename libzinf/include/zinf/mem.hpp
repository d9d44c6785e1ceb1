// zinf mem: a fixed budget of page-locked host memory and of device memory,
// both taken once at start-up and never grown (paper §6.4).
//
//   zinf::mem::PinnedPool pool({.bytes = 256 * MiB, .buffer = 16 * MiB}, &engine);
//   {
//       auto lease = pool.lease("optimizer step");   // blocks while the pool is empty
//       engine.wait(engine.read(file, 0, lease.bytes()));
//   }                                                 // returned here, even on a throw
//
//   zinf::mem::Stream(engine, pool).read(file, 0, bytes, [&](std::uint64_t at, auto piece) {
//       ...;  // any size crosses the pool, one buffer-sized piece at a time
//   });
//
// PinnedPool: cudaHostAlloc with a CUDA device, else mmap (huge pages where the
// kernel gives them, populated) plus mlock; when mlock is refused it runs
// unlocked, warns once and says so in stats(). Buffers are aligned for O_DIRECT
// and registered with the io engine as fixed buffers.
//
// DeviceArena: all device memory the engine may use (cudaMalloc with a GPU, a
// host allocation of the same budget otherwise), carved best-fit with
// coalescing frees at 256-byte alignment.
#pragma once

#include <zinf/io.hpp>
#include <zinf/util.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace zinf::mem {

// ---------------------------------------------------------------------------
// GPU presence, as the memory layer sees it. A build without CUDA, a machine
// without a driver or without a device all give count 0 and a reason.
struct GpuInfo {
    int count = 0;        // CUDA devices visible to this process
    std::string name;     // the first device's name, when count > 0
    std::uint64_t bytes = 0;  // the first device's global memory, when count > 0
    std::string why_not;  // why count is 0 ("built without CUDA", "no CUDA driver", ...)
};
GpuInfo gpu_info();

// ---------------------------------------------------------------------------
// The pool's budget. Command line: --pinned 2GiB --pinned-buffer 64MiB;
// JSON: {"pinned": "2GiB", "pinned_buffer": "64MiB"} (sizes as strings or bytes).
struct PoolConfig {
    std::uint64_t bytes = 256 * MiB;   // total page-locked memory
    std::uint64_t buffer = 16 * MiB;   // bytes per buffer (a multiple of 4KiB)
    // How long lease() waits for a free buffer before it throws, naming the holders.
    std::chrono::milliseconds lease_timeout{std::chrono::seconds(60)};
    // "auto": cudaHostAlloc when a CUDA device is present, else mmap + mlock;
    // "host": always mmap + mlock.
    std::string allocator = "auto";

    // buffers = bytes / buffer (the remainder is not allocated).
    std::size_t buffers() const { return buffer ? static_cast<std::size_t>(bytes / buffer) : 0; }
    // UsageError naming the key (--pinned, --pinned-buffer) on a bad value.
    void validate() const;
    // Reads "pinned", "pinned_buffer", "lease_timeout" ("60s") and "pinned_allocator";
    // an unknown key is an error naming `where`.
    static PoolConfig from_json(const json::Json& obj, const std::string& where);
    json::Json to_json() const;
    std::string describe() const;  // "256MiB = 16 x 16MiB"
};

inline constexpr std::size_t kPoolAlignment = 4096;  // every buffer's address and size

struct PoolStats {
    std::size_t buffers = 0;         // in the pool
    std::uint64_t buffer_bytes = 0;  // bytes per buffer
    std::size_t in_use = 0;          // leased now
    std::size_t high_water = 0;      // most leased at once
    std::uint64_t leases = 0;        // leases granted
    std::uint64_t waits = 0;         // leases that had to wait for a buffer
    double wait_seconds = 0;         // total time spent in those waits
    std::uint64_t bytes_moved = 0;   // through Stream (reads plus writes)
    bool locked = false;             // the memory is page-locked (mlock or cudaHostAlloc)
    bool registered = false;         // registered with the io engine as fixed buffers
    std::string allocator;           // "cudaHostAlloc" or "mmap"
    // Regions pin() gave that are alive now, and their bytes (beside the
    // buffers: the budget above is the buffers' only).
    std::size_t pinned = 0;
    std::uint64_t pinned_bytes = 0;
    json::Json to_json() const;
};

// Who holds a buffer: what lease() was told, the thread, for how long.
struct Holder {
    std::size_t buffer = 0;
    std::string who;
    std::thread::id thread;
    int tid = 0;  // the Linux thread id, as top and gdb show it
    double held_seconds = 0;
};

class PinnedPool;

// One buffer, leased; move-only, returned to the pool on destruction (also
// during stack unwinding), or earlier with release().
class Lease {
public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    std::span<std::byte> bytes() const noexcept { return bytes_; }
    std::byte* data() const noexcept { return bytes_.data(); }
    std::size_t size() const noexcept { return bytes_.size(); }
    std::size_t index() const noexcept { return index_; }  // which buffer of the pool
    explicit operator bool() const noexcept { return state_ != nullptr; }
    void release() noexcept;

    struct State;

private:
    friend class PinnedPool;
    Lease(std::shared_ptr<State> s, std::size_t index, std::span<std::byte> bytes)
        : state_(std::move(s)), index_(index), bytes_(bytes) {}
    std::shared_ptr<State> state_;
    std::size_t index_ = 0;
    std::span<std::byte> bytes_;
};

// Page-locked host memory held for a run beside the pool's buffers: state
// that lives in host memory and meets the device or the io engine (the
// optimizer's state and gradients, the engine's gradient staging, committed
// parameters). From the pool's allocator (cudaHostAlloc with a CUDA device,
// so the driver copies it at full speed; else mmap, populated, plus mlock,
// unlocked with a warning when mlock is refused), registered with the pool's
// io engine, counted in the pool's stats. Zero-filled. Move-only; it must not
// outlive the io engine (as the pool must not).
class Pinned {
public:
    Pinned() = default;
    Pinned(Pinned&& o) noexcept;
    Pinned& operator=(Pinned&& o) noexcept;
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
    ~Pinned();

    std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
    std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }  // as asked
    bool locked() const noexcept { return locked_; }
    bool registered() const noexcept { return !regs_.empty(); }
    explicit operator bool() const noexcept { return data_ != nullptr; }
    void reset() noexcept;

private:
    friend class PinnedPool;
    std::shared_ptr<Lease::State> pool_;  // its counters
    Mmap map_;                            // the memory, on the mmap path
    void* cuda_ = nullptr;                // the memory, on the cudaHostAlloc path
    std::byte* data_ = nullptr;
    std::size_t size_ = 0, len_ = 0;
    bool locked_ = false;
    std::vector<io::Registration> regs_;
};

class PinnedPool {
public:
    // Allocates everything now; nothing is allocated afterwards. With an
    // engine, every buffer is registered with it (the pool must then be
    // destroyed before the engine).
    explicit PinnedPool(const PoolConfig& cfg, io::Engine* engine = nullptr);
    // Leases still held keep the memory alive; each is reported once.
    ~PinnedPool();
    PinnedPool(const PinnedPool&) = delete;
    PinnedPool& operator=(const PinnedPool&) = delete;

    // One buffer. Blocks while none is free; after the configured timeout
    // throws InternalError naming what was asked, the pool and every holder.
    // Waiting leases are served first come, first served, so a lease of
    // several buffers is never starved by single ones that come after it.
    Lease lease(std::string_view who = {});
    Lease lease(std::string_view who, std::chrono::milliseconds timeout);
    // `n` buffers taken together (all or none, so two callers each holding
    // half can never deadlock); UsageError when n exceeds the pool.
    std::vector<Lease> lease_many(std::size_t n, std::string_view who = {});
    std::vector<Lease> lease_many(std::size_t n, std::string_view who, std::chrono::milliseconds timeout);
    // A buffer if one is free now and no lease is waiting, else an empty lease.
    Lease try_lease(std::string_view who = {});

    const PoolConfig& config() const;
    std::size_t buffers() const;
    std::uint64_t buffer_bytes() const;
    PoolStats stats() const;
    std::vector<Holder> holders() const;
    // Counted in stats().bytes_moved (Stream calls it).
    void count_moved(std::uint64_t bytes);
    // A region of `bytes` (at least one page, page-aligned) for as long as the
    // caller keeps it; `who` names it in the warning when it cannot be
    // page-locked.
    Pinned pin(std::uint64_t bytes, std::string_view who);

private:
    std::shared_ptr<Lease::State> state_;
};

// ---------------------------------------------------------------------------
// Moves a byte range of any size between a file and memory through the pool,
// one buffer-sized piece at a time, with the file transfers of later pieces
// in flight while earlier ones are copied. Offsets and lengths need not be
// aligned. Reads widen the range to aligned blocks; writes send whole pages
// through the engine and write the partial pages at their edges through a
// buffered descriptor, so a write touches no byte outside its range: writers
// of disjoint ranges of one file may run at once.
struct StreamOptions {
    std::size_t buffers = 0;  // buffers to lease at once (0: half the pool, at least 2)
    std::string who = "stream";
};

class Stream {
public:
    Stream(io::Engine& engine, PinnedPool& pool, StreamOptions opts = {});

    // The piece of the range starting `at` bytes into it; pieces come in order.
    using Sink = std::function<void(std::uint64_t at, std::span<const std::byte> piece)>;
    // Fills the piece that starts `at` bytes into the range.
    using Source = std::function<void(std::uint64_t at, std::span<std::byte> piece)>;

    // file[offset, offset+bytes) -> sink. Reading past the end of the file is
    // a DataError naming the file and the offset.
    void read(io::File& file, std::uint64_t offset, std::uint64_t bytes, const Sink& sink);
    void read(io::File& file, std::uint64_t offset, std::span<std::byte> dst);
    // source -> file[offset, offset+bytes). The file grows to offset+bytes when
    // shorter, and never past it; bytes outside the range are never written.
    void write(io::File& file, std::uint64_t offset, std::uint64_t bytes, const Source& source);
    void write(io::File& file, std::uint64_t offset, std::span<const std::byte> src);

    // Buffers a transfer leases: StreamOptions::buffers resolved (a transfer
    // shorter than that many buffers leases fewer).
    std::size_t buffers() const { return opts_.buffers; }

private:
    io::Engine& engine_;
    PinnedPool& pool_;
    StreamOptions opts_;
};

// ---------------------------------------------------------------------------
struct ArenaConfig {
    std::uint64_t bytes = 1 * GiB;  // the whole budget, taken once
    std::uint64_t max_block = 0;    // largest single allocation; 0 = no limit
    // "auto": cudaMalloc when a CUDA device is present, else host memory;
    // "host": host memory (the CPU backend); "cuda": a CUDA device or an error.
    std::string backend = "auto";
    int gpu = -1;  // the CUDA device to take it on (and this thread's from then); -1: the current one
    void validate() const;
};

inline constexpr std::size_t kArenaAlignment = 256;

struct ArenaStats {
    std::uint64_t bytes = 0;          // the arena's size
    std::uint64_t used = 0;           // allocated now (after rounding to the alignment)
    std::uint64_t peak = 0;           // most allocated at once
    std::uint64_t free = 0;           // bytes - used
    std::uint64_t largest_free = 0;   // the largest block that can be allocated now
    std::uint64_t allocations = 0;    // live allocations
    double fragmentation = 0;         // 1 - largest_free / free (0 when nothing is free)
    json::Json to_json() const;
};

class DeviceArena;

// One allocation from the arena; move-only, freed on destruction.
class Block {
public:
    Block() = default;
    Block(Block&& o) noexcept;
    Block& operator=(Block&& o) noexcept;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block();

    // Device memory on the cuda backend: not to be dereferenced on the host.
    std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }      // as asked
    std::uint64_t offset() const noexcept { return offset_; }  // into the arena
    explicit operator bool() const noexcept { return arena_ != nullptr; }
    void reset() noexcept;

private:
    friend class DeviceArena;
    DeviceArena* arena_ = nullptr;
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    std::uint64_t offset_ = 0;
};

// Whether `p` lies in memory a PinnedPool owns now (its buffers, or a
// region pin() gave): what a host<->device copy should use (the device
// counts the copies that do not: Device::pageable_copies).
bool from_pool(const void* p) noexcept;

class DeviceArena {
public:
    explicit DeviceArena(const ArenaConfig& cfg);
    ~DeviceArena();  // every Block must be gone
    DeviceArena(const DeviceArena&) = delete;
    DeviceArena& operator=(const DeviceArena&) = delete;

    // Best fit. Throws OutOfMemory saying what was asked (and by `what`), the
    // largest free block, the free total and the arena size.
    Block allocate(std::size_t bytes, std::string_view what = {});

    bool on_gpu() const;
    const std::string& backend() const;  // "cuda" or "host"
    bool contains(const void* p) const noexcept;  // p lies in the arena's memory
    ArenaStats stats() const;

    // Synchronous copies between host memory and a block (cudaMemcpy on the
    // cuda backend, memcpy on the host one).
    void copy_in(Block& dst, std::uint64_t at, std::span<const std::byte> src);
    void copy_out(std::span<std::byte> dst, const Block& src, std::uint64_t at);

    struct Impl;

private:
    friend class Block;
    void free(Block& b) noexcept;
    std::unique_ptr<Impl> impl_;
};

// The arena could not serve an allocation: a usage-level error (the budget or
// --max-block is too small for the job), exit 70 is reserved for bugs.
class OutOfMemory : public Error {
public:
    using Error::Error;
    int exit_code() const noexcept override { return exit_code::usage; }
};

}  // namespace zinf::mem
