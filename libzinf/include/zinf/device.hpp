// zinf device: where the model's arithmetic runs. A Device has streams
// (in-order queues of work), events (a point in a stream others can wait
// for), asynchronous copies, memory carved from a DeviceArena budget, and the
// kernels a GPT and a Llama need forward and backward.
//
//   auto dev = zinf::device::open({.backend = "cpu", .memory_bytes = 2 * GiB});
//   auto& s = dev->compute();
//   auto x = dev->alloc<float>(B * T * C, "x");
//   dev->layernorm_forward(s, ...);       // enqueued; returns at once
//   dev->synchronize(s);                  // everything before it is done
//
// Backends: `cpu`: GEMMs through OpenBLAS, the rest vectorised and
// threaded with OpenMP; a stream is a worker thread running its queue in
// order; an event is a completion count; device memory is host memory from
// the arena. `cuda` (device/cuda/): cuBLASLt and its own kernels on CUDA
// streams, events that own a cudaEvent_t, the arena from one cudaMalloc; the
// interface holds only what both can do: spans given to kernels are device
// memory, to be read on the host only after a copy and a synchronize. (Host
// code hands device memory to host collectives only where
// host_addressable() says it may; see train.hpp.)
//
// Numbers: fp32 everywhere inside the kernels; bf16 at the casts, at a GEMM
// asked for bf16 inputs (Precision::bf16, kernels.hpp), and where a kernel
// reads or writes a View stored bf16 (a working parameter, a kept
// activation: kernels.def says which kernels take one). Every kernel is
// deterministic: the same inputs give the same bits for any thread count
// (reductions over rows are split by columns, never by rows), except GEMM,
// which the device cuts into column or row blocks by its thread count: its
// bits are the same for the same thread count.
//
// The kernels, their arguments and shapes are listed once, in kernels.def.
#pragma once

#include <zinf/kernels.hpp>
#include <zinf/mem.hpp>
#include <zinf/optim.hpp>
#include <zinf/util.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace zinf::device {

struct Options {
    std::string backend = "cpu";    // "cpu", "cuda", or "auto" (cuda when a GPU is present, else cpu)
    std::uint64_t memory_bytes = 0;  // the arena budget; 0 = 1 GiB
    std::uint64_t max_block = 0;     // largest single allocation; 0 = no limit
    unsigned threads = 0;            // kernel threads (cpu); 0 = the CPUs this process may use
    int gpu = -1;                    // the GPU (cuda); -1 = select_gpu's choice by local rank
};

// The GPU a process takes among `count` visible: `requested` when >= 0
// (UsageError when it is not below `count`), else the launcher's local rank
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, the first set)
// modulo `count`, else 0. `env` reads a variable (nullptr: unset); a local
// rank that is not a number is a UsageError naming the variable.
int select_gpu(int requested, int count, const std::function<const char*(const char*)>& env);
int select_gpu(int requested, int count);  // from the process environment

// Why the cuda backend cannot run here ("" when it can): this build has no
// CUDA toolkit, or there is no usable GPU. `auto` picks cuda when "".
std::string cuda_unavailable();

// What a stream is for. The ZeRO engine gives each stage of its fetch
// pipeline its own (paper §6.2): copies host -> device (cg), device -> host
// (gradients out), collectives (gg, reduce-scatter), beside compute.
enum class StreamKind { compute, h2d, d2h, collectives };
const char* stream_kind_name(StreamKind k);

// An in-order queue of work. Made by the Device (stream()); lives as long as it.
class Stream {
public:
    virtual ~Stream() = default;
    virtual const std::string& name() const = 0;
};

// A point in a stream: done once everything enqueued on the stream before
// it is done. Copyable; a default Event is always done. `handle` owns the
// backend's own event object where it has one (a cudaEvent_t on cuda; empty
// on cpu, where the ticket is a count of the stream's jobs), so a copy of an
// Event keeps it alive as long as anyone may wait on it.
struct Event {
    std::uint64_t ticket = 0;
    const Stream* stream = nullptr;
    std::shared_ptr<void> handle;
};

// When a stream reached a point, for the profile (profile.hpp): the steady
// clock read by the stream's worker on cpu, a timing cudaEvent_t on cuda.
// Read with Device::seconds_between once the stream has passed it.
struct Stamp {
    std::shared_ptr<void> handle;
};

class Profile;  // profile.hpp

// Device memory holding `count` elements of T: a mem::Block seen as a span.
template <class T>
class Array {
public:
    Array() = default;
    explicit Array(mem::Block b) : block_(std::move(b)) {}
    std::span<T> span() const noexcept {
        return {reinterpret_cast<T*>(block_.data()), block_.size() / sizeof(T)};
    }
    operator std::span<T>() const noexcept { return span(); }
    operator std::span<const T>() const noexcept { return span(); }
    std::size_t size() const noexcept { return block_.size() / sizeof(T); }
    T* data() const noexcept { return reinterpret_cast<T*>(block_.data()); }
    explicit operator bool() const noexcept { return bool(block_); }

private:
    mem::Block block_;
};

class Device {
public:
    virtual ~Device() = default;

    virtual const std::string& backend() const = 0;
    virtual unsigned threads() const = 0;
    mem::DeviceArena& arena() { return *arena_; }

    // ---- memory -----------------------------------------------------------
    // From the arena (OutOfMemory names `what`); zero-filled.
    template <class T>
    Array<T> alloc(std::size_t count, std::string_view what) {
        Array<T> a(arena_->allocate(count * sizeof(T), what));
        fill_zero(std::as_writable_bytes(a.span()));
        return a;
    }

    // ---- streams and events -------------------------------------------------
    // One stream of each kind, made with the device and living as long as it.
    virtual Stream& stream(StreamKind k) = 0;
    Stream& compute() { return stream(StreamKind::compute); }  // where kernels go by default
    Stream& h2d() { return stream(StreamKind::h2d); }  // host -> device copies
    virtual Event record(Stream& s) = 0;
    // Work enqueued on `s` after this call starts once `e` is done; the host
    // does not wait. This is how one stage orders itself after another: a
    // collective on the collectives stream after the copy that fed it, the
    // compute after the gather of the weights it reads.
    virtual void wait(Stream& s, const Event& e) = 0;
    // The same, adding to `waited_ns` how long `s` stood waiting for `e` (the
    // engine's stall time: compute waiting for its parameters).
    virtual void wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) = 0;
    virtual void synchronize(Stream& s) = 0;
    virtual void synchronize(const Event& e) = 0;
    // Whether `e` is done now, without waiting (and without reporting errors).
    virtual bool query(const Event& e) = 0;
    // Whether device memory can be handed to host code as it is (the cpu
    // backend, whose device memory is host memory): then a host-memory
    // collective (MPI) may run over device buffers from a host() job on the
    // collectives stream. Otherwise the buffers cross through copies, or the
    // collective runs on the device (NCCL on the stream's native handle).
    virtual bool host_addressable() const = 0;
    // The backend's own stream object (a cudaStream_t on cuda; on cpu, which
    // has none, the Stream itself), for libraries that enqueue on it (NCCL).
    virtual void* native(Stream& s) = 0;
    // A kernel's error (a bad shape, a token past the vocabulary) is thrown by
    // the next synchronize of its stream (or of an event after it), and the
    // stream drops the rest of its queue until that synchronize reports it.

    // Asynchronous copies: host <-> device <-> device. `dst` and `src` must
    // stay alive and untouched until the stream passes this point.
    void copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src);
    // Copies so far whose host side (dst or src outside the arena) is not
    // memory from a PinnedPool (mem::from_pool): on cuda each is staged by
    // the driver or run as a host job with a synchronous cudaMemcpy. A step
    // should issue none (test_engine counts them).
    std::uint64_t pageable_copies() const { return pageable_.load(); }
    // Bytes copied so far from the host into the arena, and out of it to
    // the host (copy(); a copy within the arena, or between host buffers,
    // is neither): the step record's h2d_bytes and d2h_bytes.
    std::uint64_t h2d_bytes() const { return h2d_.load(); }
    std::uint64_t d2h_bytes() const { return d2h_.load(); }
    // A device-to-device copy of a (rows, cols) block of floats between
    // row-major matrices of row strides ld_dst and ld_src (>= cols): row r's
    // cols elements from src + r ld_src to dst + r ld_dst, the rest of dst
    // untouched (a column block out of a wider matrix, or into one).
    void copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                   std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols);
    virtual void fill_zero(std::span<std::byte> dst) = 0;  // synchronous
    virtual void zero(Stream& s, std::span<float> dst) = 0;

    // ---- kernels (enqueued on `s`): kernels.def declares each, its arguments
    // and their shapes. Each checks its spans against its shape on the
    // caller's thread (a span too short, or of an element type the kernel
    // does not take, is an InternalError at once, before anything is
    // enqueued), then hands them to the backend's do_ virtual of its name.
#define ZINF_KERNEL(name, ...) void name(Stream& s, ZINF_KERNEL_PARAMS(__VA_ARGS__));
#include <zinf/kernels.def>

    // Runs `fn` on the stream in order with the kernels (host work that must
    // wait for them, e.g. a collective over their output on the cpu backend).
    virtual void host(Stream& s, std::function<void()> fn) = 0;

    // ---- profile (profile.hpp) -------------------------------------------------
    // From here every kernel and copy is timed into `p` (nullptr: none, the
    // default; one pointer test a call). Set between steps, with nothing
    // in flight.
    void set_profile(Profile* p) { profile_ = p; }
    // A stamp on `s`: taken when the stream gets there; the host does not wait.
    virtual Stamp stamp(Stream& s) = 0;
    // Seconds from `a` to `b`, two stamps of one stream; NaN while the
    // stream has not passed both (never, once dropped behind an error). Reads,
    // never waits.
    virtual double seconds_between(const Stamp& a, const Stamp& b) = 0;

protected:
    // The backends' copies and kernels, each called by the public call of its
    // name once that has checked the spans (checks.cpp, the one place for
    // every backend).
    virtual void do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) = 0;
    virtual void do_copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                              std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols) = 0;
#define ZINF_KERNEL(name, ...) virtual void do_##name(Stream& s, ZINF_KERNEL_PARAMS(__VA_ARGS__)) = 0;
#include <zinf/kernels.def>

    std::unique_ptr<mem::DeviceArena> arena_;
    Profile* profile_ = nullptr;
    std::atomic<std::uint64_t> pageable_{0};
    std::atomic<std::uint64_t> h2d_{0}, d2h_{0};
};

// UsageError for an unknown backend, or for "cuda" where it cannot run
// (built without the toolkit, or no GPU: the error says which).
std::unique_ptr<Device> open(const Options& opts);

// The peer's sgemm rate on this device: C = A*B on n x n fp32 matrices,
// `reps` times after one warm-up, FLOP/s (2 n^3 per product). On the cpu
// backend that is OpenBLAS's cblas_sgemm on its own threads, as a user would
// call it (the device's own GEMMs split over its OpenMP team instead). For --bench.
// On cuda it is cuBLASLt's fp32 GEMM (TF32 off), timed on the compute stream.
double measure_gemm_flops(Device& dev, std::uint64_t n, unsigned reps);
// cuBLASLt's bf16 GEMM (bf16 inputs and output, fp32 accumulation) on cuda,
// the rate a bf16 step compares against; 0 on a backend without one (cpu).
double measure_gemm_bf16_flops(Device& dev, std::uint64_t n, unsigned reps);

}  // namespace zinf::device
