// Private to libzinf's comm module: what the communicator core shares with
// its backends (self.cpp, mpi.cpp, nccl.cpp).
#pragma once

#include <zinf/comm.hpp>
#include <zinf/util.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zinf::comm::detail {

// memcpy / memmove of n bytes, where a rank's block may be empty: an empty
// span's data() may be null, and passing null is undefined even for 0 bytes.
inline void copy_bytes(void* to, const void* from, std::size_t n) {
    if (n) std::memcpy(to, from, n);
}
inline void move_bytes(void* to, const void* from, std::size_t n) {
    if (n) std::memmove(to, from, n);
}

using Clock = std::chrono::steady_clock;

// When an operation must be complete; never, for a zero timeout.
struct Deadline {
    Clock::time_point at = Clock::time_point::max();
    std::chrono::milliseconds timeout{0};
    static Deadline after(std::chrono::milliseconds t) {
        Deadline d;
        d.timeout = t;
        if (t.count() > 0) d.at = Clock::now() + t;
        return d;
    }
    bool passed() const { return timeout.count() > 0 && Clock::now() >= at; }
};
// "allgather of 1 buffer (4MiB, f32) did not complete within 2 s: ..."
std::string timeout_message(const std::string& what, const Deadline& d);

// One started operation: what to do, and how it ended.
struct Op {
    Kind kind = Kind::barrier;
    DType dtype = DType::u8;
    Reduce reduce = Reduce::sum;
    int root = 0;
    std::vector<Buffer> bufs;

    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;

    void finish(std::exception_ptr e);
    // "allgather of 2 buffers (3MiB, f32)"
    std::string what() const;
};

// Elements in rank r's block of buffer b (equal blocks, or b.counts[r]).
std::uint64_t block_count(const Op& op, const Buffer& b, int rank, int size);
// The element offset of rank r's block: blocks lie back to back in rank order.
std::uint64_t block_first(const Op& op, const Buffer& b, int rank, int size);
// The elements every rank's blocks add up to, for buffer b.
std::uint64_t total_count(const Op& op, const Buffer& b, int size);

// A bucket laid flat, for a library with equal-block collectives only
// (NCCL): every rank's block of the flat area holds that rank's block of
// each buffer, in bucket order, each at an offset aligned to
// kFlatAlignBytes and padded to the buffer's widest block, so all ranks'
// flat blocks are `block` elements and one allgather or reduce-scatter of
// equal blocks moves the bucket. The flat area is size * block elements,
// rank r's block at r * block.
//   allgather:      this rank's send of each buffer -> flat[me*block + at[b]] (pack),
//                   one allgather of `block` elements into the flat area,
//                   then every run's rows into the buffers' recv (unpack);
//   reduce_scatter: every run's rows of each buffer's send -> the flat area (pack),
//                   one reduce-scatter of `block` elements into this rank's
//                   flat block, then flat[at[b]] -> each buffer's recv.
// Padding travels and is reduced too; nothing reads it back.
inline constexpr std::uint64_t kFlatAlignBytes = 256;
// Consecutive ranks whose blocks of one buffer have the same count: a 2-D
// copy of `ranks` rows of `count` elements, `block` apart in the flat area
// (from `flat`) and `count` apart in the buffer's full side (from `first`).
struct FlatRun {
    std::size_t buffer = 0;
    int rank = 0, ranks = 0;
    std::uint64_t count = 0, flat = 0, first = 0;  // elements
};
struct FlatPlan {
    std::uint64_t es = 0;            // bytes per element
    std::uint64_t block = 0;         // elements in each rank's flat block
    std::vector<std::uint64_t> at;   // per buffer: its offset in a rank's flat block (elements)
    std::vector<FlatRun> rows;       // the full sides' blocks, empty ones left out
    std::uint64_t area() const { return block * es; }  // bytes of one rank's flat block
    // Bytes of the whole flat area: every rank's block, then this rank's own.
    std::uint64_t bytes(int size) const { return area() * (static_cast<std::uint64_t>(size) + 1); }
};
// Whether per-rank counts are uneven (empty: equal blocks by the spans).
bool uneven(const std::vector<std::uint64_t>& counts);
// Whether `op` needs the flat form: an allgather or reduce-scatter of
// several buffers, or of one with uneven blocks.
bool needs_flat(const Op& op);
FlatPlan plan_flat(const Op& op, int size);
// `rows` rows of `width` bytes, `dpitch` bytes apart at dst and `spitch` at
// src (cudaMemcpy2DAsync's arguments); called only with width and rows > 0.
using Copy2d = std::function<void(std::byte* dst, std::uint64_t dpitch, const std::byte* src, std::uint64_t spitch,
                                  std::uint64_t width, std::uint64_t rows)>;
// The copies before and after the one collective: `all` is the flat area
// (size blocks), `mine` this rank's block of it (allgather's send,
// reduce-scatter's recv), outside `all`.
void flat_pack(const Op& op, const FlatPlan& plan, std::byte* all, std::byte* mine, const Copy2d& copy);
void flat_unpack(const Op& op, const FlatPlan& plan, const std::byte* all, const std::byte* mine,
                 const Copy2d& copy);

// A backend runs one operation to completion, in the calling thread, before
// its deadline, or throws (Timeout, CommError). Calls are never concurrent.
class Engine {
public:
    virtual ~Engine() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual int local_rank() const = 0;
    virtual int local_size() const = 0;
    virtual Backend kind() const = 0;
    virtual std::string describe() const = 0;
    virtual void execute(Op& op, const Deadline& deadline) = 0;
    virtual void bare(Op& op) = 0;
    // Enqueues op on a CUDA stream after an event (Communicator::enqueue):
    // returns once the library has taken it, before it runs. Only where
    // stream_ordered() (nccl).
    virtual bool stream_ordered() const { return false; }
    virtual void enqueue(Op& op, void* stream, void* after, const Deadline& deadline);
    // Whether buckets are laid flat in an area the caller gives
    // (Communicator::set_flat_area), and taking it: only where lays_flat()
    // (nccl); called with no operation running.
    virtual bool lays_flat() const { return false; }
    virtual void set_flat_area(std::span<std::byte> area);
    // After a failure the library may still own the buffers of an operation
    // that never finished: leave it as it is (no finalize) until exit.
    virtual void poison() noexcept {}
};

std::unique_ptr<Engine> make_self();
std::unique_ptr<Engine> make_mpi(std::chrono::milliseconds timeout);  // UsageError when not built in
// gpu: the CUDA device to run on; -1: the local rank's (modulo the GPUs).
std::unique_ptr<Engine> make_nccl(const Launch& launch, std::chrono::milliseconds timeout, int gpu);
bool mpi_built();
bool nccl_built();
bool nccl_usable();  // built, a GPU visible, and libnccl.so.2 loads
bool mpi_running();  // MPI_Init was called (by us or the program) and not finalized

// Host arithmetic shared by the backends: avg = sum, then each element / n.
void divide(std::span<std::byte> buf, DType dtype, int n);
// acc[i] = acc[i] (+ or max) in[i], for bf16 (MPI has no bf16 type).
void bf16_reduce(std::uint16_t* acc, const std::uint16_t* in, std::size_t n, Reduce r);
// out[i] = in[0][i] op in[1][i] op ... op in[n-1][i], folded left to right
// (each input holds out.size() bytes): an element's bits depend on its n
// inputs and their order only, never on where blocks or buckets split them.
// avg folds as sum (divide() follows); bf16 rounds each step as bf16_reduce.
// out overlaps no input.
void reduce_in_order(std::span<std::byte> out, std::span<const std::byte* const> in, DType dtype, Reduce r);

// Grows and keeps one host staging area for coalesced operations.
class Scratch {
public:
    std::span<std::byte> get(std::size_t bytes);

private:
    std::vector<std::byte> buf_;
};

}  // namespace zinf::comm::detail
