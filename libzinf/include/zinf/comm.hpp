// zinf comm: collectives over data-parallel ranks (paper §6.1: parameters are
// gathered with allgather, gradients averaged with reduce-scatter).
//
//   zinf::comm::Communicator comm;                       // backend from the launcher
//   comm.allgather(std::as_bytes(mine), std::as_writable_bytes(all), DType::f32);
//   auto h = comm.ireduce_scatter(grads, my_part, DType::bf16, Reduce::avg);
//   ... compute ...
//   h.wait();                                             // throws on failure or timeout
//
// Backends: `mpi` (host buffers; OpenMPI started by mpirun or srun), `nccl`
// (device buffers; NCCL's id shared over MPI; the GPU is picked by the local
// rank), `self` (one rank, no library). Every #if for MPI and NCCL lives in
// this module's sources: callers see only this header.
//
// Operations run in the order they are started, as on a stream. A blocking
// call with nothing queued runs in the caller's thread; non-blocking ones run
// on the communicator's own thread, so they progress while the caller
// computes. Every operation has a deadline (Options::timeout): a rank that
// died or skipped a collective becomes an error on every rank still waiting,
// instead of a hang, in one of two ways:
//   - on MPI, every collective runs as MPI's blocking call, the fastest it
//     has, which cannot be interrupted: a watchdog reports the operation and
//     rank on stderr and ends the process (74);
//   - on NCCL (and while an MPI communicator is created), Timeout is thrown
//     from run() or wait().
// After a failure the communicator refuses further work and the process
// should exit: the program's main reports the error and exits with its code
// (74), and the launcher stops the other ranks.
#pragma once

#include <zinf/util.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::comm {

enum class Backend { automatic, self, mpi, nccl };
enum class Memory { host, device };  // where the buffers of every operation live
enum class DType { u8, i32, i64, f32, f64, bf16 };
enum class Reduce { sum, avg, max };
enum class Kind { allgather, reduce_scatter, allreduce, broadcast, barrier };

std::size_t dtype_bytes(DType t);
std::string_view name(Backend b);
std::string_view name(DType t);
std::string_view name(Reduce r);
std::string_view name(Kind k);
// "auto", "self", "mpi", "nccl"; UsageError listing the choices otherwise.
Backend parse_backend(std::string_view text);
// "f32"/"float", "bf16", "f64"/"double", "i32", "i64", "u8".
DType parse_dtype(std::string_view text);
// Whether this build has the backend's library (MPI, NCCL); self always.
bool compiled(Backend b);
// Whether it can run here: for nccl, a GPU is visible and libnccl.so.2 loads.
bool usable(Backend b);

// A collective failed or its peers went away (exit 74, as for I/O).
class CommError : public IoError {
public:
    using IoError::IoError;
};
// An operation passed its deadline: a peer died, hangs or skipped it.
class Timeout : public CommError {
public:
    using CommError::CommError;
};

// Where this process sits, as the launcher (mpirun, srun, mpiexec) told it
// through the environment; one rank of one when nothing launched it.
struct Launch {
    int rank = 0, size = 1;
    int local_rank = 0, local_size = 1;  // on this node
    std::string launcher;                // "mpirun", "srun", "mpiexec", "" (none)
    static Launch from_env();
};

// ZINF_COMM_TIMEOUT (a duration: "30s", "2m") or 300 s; "0" waits forever.
std::chrono::milliseconds default_timeout();
// A duration as the communicator keeps it: whole milliseconds, rounded up so
// that a short non-zero limit never becomes "no limit".
std::chrono::milliseconds to_timeout(std::chrono::nanoseconds d);

struct Options {
    // automatic: nccl for device memory; mpi for host memory when a launcher
    // started more than this one process (or MPI is already running); else self.
    Backend backend = Backend::automatic;
    Memory memory = Memory::host;
    // Per operation; 0 = none; unset = default_timeout() (read when the
    // communicator starts, so a flag can override a bad environment).
    std::optional<std::chrono::milliseconds> timeout;
    // nccl: the GPU (CUDA device index) the communicator runs on, which must
    // be the one whose streams it enqueues on; -1: the local rank's, as
    // device::select_gpu picks without --gpu.
    int gpu = -1;
};

// One buffer of a collective; a bucket (coalesced operation) is several of
// them, of one dtype, done as one collective.
//   allgather:      send = this rank's block; recv = every rank's blocks in rank order
//   reduce_scatter: send = the whole input;   recv = this rank's block of the result
//   allreduce:      send and recv of one size (the same span: in place)
//   broadcast:      recv only: the root's bytes land in every rank's recv
// Blocks are equal unless `counts` gives each rank's element count (uneven
// blocks, some possibly empty); blocks then lie back to back in rank order.
// Buffers must stay untouched until the operation is complete.
struct Buffer {
    std::span<const std::byte> send;
    std::span<std::byte> recv;
    std::vector<std::uint64_t> counts;  // elements per rank, one per rank; empty = equal
};

namespace detail {
struct Op;
class Core;
class Engine;
}  // namespace detail

// A started operation. wait() returns when it is complete and throws what it
// failed with; test() says whether it is complete (and throws the same).
class Handle {
public:
    Handle() = default;
    void wait();
    bool test();
    explicit operator bool() const noexcept { return op_ != nullptr; }

private:
    friend class Communicator;
    friend class detail::Core;
    explicit Handle(std::shared_ptr<detail::Op> op) : op_(std::move(op)) {}
    static void wait_op(detail::Op& op);
    std::shared_ptr<detail::Op> op_;
};

class Communicator {
public:
    explicit Communicator(const Options& opts = {});
    // Over a backend of the caller's (comm/internal.hpp): what tests use to
    // record the operations a caller starts.
    Communicator(std::unique_ptr<detail::Engine> engine, Memory memory,
                 std::optional<std::chrono::milliseconds> timeout = {});
    ~Communicator();  // waits for started operations (not after a failure)
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const;
    int size() const;
    int local_rank() const;
    int local_size() const;
    Backend backend() const;
    Memory memory() const;
    std::chrono::milliseconds timeout() const;
    // For operations started from now on: a phase known to wait long (peers
    // writing terabytes) can lift the limit and set it back afterwards.
    void set_timeout(std::chrono::milliseconds t);
    // "mpi, rank 1 of 4 (local 1 of 4), MPI_THREAD_MULTIPLE, Open MPI v4.1.4"
    std::string describe() const;

    // Any operation over a bucket of buffers, as one collective.
    Handle start(Kind kind, std::span<const Buffer> bufs, DType dtype, Reduce reduce = Reduce::sum,
                 int root = 0);
    void run(Kind kind, std::span<const Buffer> bufs, DType dtype, Reduce reduce = Reduce::sum,
             int root = 0);

    // One buffer each; equal blocks.
    void allgather(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype);
    Handle iallgather(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype);
    void reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                        Reduce reduce = Reduce::sum);
    Handle ireduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                           Reduce reduce = Reduce::sum);
    void allreduce(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                   Reduce reduce = Reduce::sum);
    Handle iallreduce(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                      Reduce reduce = Reduce::sum);
    void broadcast(std::span<std::byte> buf, DType dtype, int root);
    Handle ibroadcast(std::span<std::byte> buf, DType dtype, int root);
    void barrier();
    Handle ibarrier();

    // Whether enqueue() works: the backend orders collectives on device
    // streams (nccl); otherwise they are host calls (run(), start()).
    bool stream_ordered() const;

    // Stream-ordered, on nccl only: the collective is enqueued on `stream` (a
    // cudaStream_t, as device::Device::native gives one) after `after` (a
    // cudaEvent_t the producer recorded, as a cuda Event's handle holds; null:
    // the stream's own order), and the call returns without waiting for it:
    // work queued on that stream later sees the result. Operations started
    // before it are finished first, so every rank sees the collectives in the
    // order of its calls. Its failure surfaces at the stream's synchronize
    // and fails the communicator's next operation. UsageError (64) on mpi and
    // self, whose collectives are host calls: host buffers stay with run().
    void enqueue(Kind kind, std::span<const Buffer> bufs, DType dtype, void* stream, void* after = nullptr,
                 Reduce reduce = Reduce::sum, int root = 0);

    // A bucket that a device library moves as one call of equal blocks
    // (nccl: no allgatherv, no reduce-scatter-v) is laid flat in device
    // memory the caller gives, so that it comes from the caller's budget
    // (the engine's arena). flat_bytes: the bytes an allgather or
    // reduce-scatter over buffers of these per-rank element counts (one
    // vector of size() counts per buffer) needs there; 0 where none (mpi,
    // self: host calls; one buffer of equal blocks). set_flat_area: the area
    // every later operation lays its bucket in, until another is set (empty:
    // none; one owner at a time: the engine, for its run); it waits until no
    // operation uses the old one. A bucket that
    // needs more than the area given is an InternalError naming both sizes.
    std::uint64_t flat_bytes(Kind kind, std::span<const std::vector<std::uint64_t>> counts, DType dtype) const;
    void set_flat_area(std::span<std::byte> area);

    // The backend library's own blocking call for one buffer (MPI_Allgather,
    // ncclAllGather + synchronize, ...), with no deadline and no zinf layer in
    // between: what zinf-commbench --raw compares against. Equal blocks only.
    void bare(Kind kind, const Buffer& buf, DType dtype, Reduce reduce = Reduce::sum, int root = 0);

private:
    std::unique_ptr<detail::Core> core_;
};

// What Communicator::flat_bytes says on a backend that lays buckets flat
// (nccl) over `size` ranks, without one: for a planner (zinf-plan) that
// sizes a run's device memory before any communicator exists.
std::uint64_t laid_flat_bytes(Kind kind, std::span<const std::vector<std::uint64_t>> counts, DType dtype, int size);

// The communicator of device buffers beside `host`, for data parallelism on
// a device whose memory the host cannot address (the cuda backend): nccl
// over the same ranks, on GPU `gpu` (-1: the local rank's), with host's
// timeout. UsageError (64) saying why where NCCL is not built in, cannot
// load, or the ranks do not each have a GPU of their own.
std::unique_ptr<Communicator> device_communicator(const Communicator& host, int gpu = -1);

// A failure on another rank, with that rank's exit code.
class Elsewhere : public Error {
public:
    Elsewhere(const std::string& msg, int code) : Error(msg), code_(code) {}
    int exit_code() const noexcept override { return code_; }

private:
    int code_;
};

// Every rank learns whether any failed (one allreduce): with no failure it
// returns; else each failing rank rethrows its own error and the others throw
// Elsewhere naming the highest-numbered failing rank, the highest exit code
// among the failures, and `outcome` ("nothing was committed").
void agree(Communicator& c, const std::exception_ptr& failed, const std::string& outcome);

}  // namespace zinf::comm
