// The cuda backend: device memory from one cudaMalloc (the arena), a stream
// is a non-blocking cudaStream_t, an event owns a cudaEvent_t, kernels are
// the .cu files' launchers (kernels.hpp) and cuBLASLt (opened with dlopen,
// so every program starts on machines without it). Device's public kernels
// check the spans against their shapes before they reach these (checks.cpp).
//
// Errors found on the device or in host jobs follow the cpu backend's rule:
// thrown by the next synchronize of the stream, or of an event recorded on it
// after the failing work. Every op that can fail takes a ticket from its
// stream's count; an event carries the count at its record, so
// synchronize(event) reports only what came before it.
//
// Host work (host()) runs on a worker thread per stream, not in a
// cudaLaunchHostFunc callback (which must not block, throw or call CUDA):
// the stream records an event, the worker waits for it, runs the job, then
// raises a sequence number in mapped host memory that the stream waits for
// behind the event, so what follows the job on the stream starts after it.
// The stream waits with cuStreamWaitValue32 (the driver's own, reached
// through cudaGetDriverEntryPointByVersion: nothing links libcuda), which
// holds no SM; where the driver lacks it (or ZINF_CUDA_HOST_WAIT=kernel), a
// one-thread kernel polls the flag instead. A polling kernel can deadlock
// with CUDA's lazy module loading (a first launch elsewhere may wait for the
// device to be idle) when a job waits for that launch: another reason the
// driver's wait is the default.
#include "kernels.hpp"
#include "llama.hpp"

#include "../backends.hpp"
#include "../kernels.hpp"
#include "../../mem/gpu.hpp"

#include <zinf/device.hpp>

#include <cublasLt.h>
#include <cuda.h>  // types of the driver entry point only
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numbers>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace zinf::device {

namespace {

using cuda::u64;

std::string describe(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw InternalError(std::string("cuda: ") + call + " failed (" + describe(e) + ")");
}

// After a launch: a bad configuration shows here, a fault at synchronize.
void launched(const char* kernel) { check(cudaGetLastError(), kernel); }

// ---------------------------------------------------------------------------
// cuBLASLt, looked up once (libcublasLt.so.13 is CUDA 13's).
struct Lt {
    decltype(&cublasLtCreate) Create = nullptr;
    decltype(&cublasLtDestroy) Destroy = nullptr;
    decltype(&cublasLtGetStatusString) GetStatusString = nullptr;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
    decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
    decltype(&cublasLtMatmul) Matmul = nullptr;

    static const Lt& get() {
        static const Lt lt = open();
        return lt;
    }

    void check(cublasStatus_t st, const char* call) const {
        if (st != CUBLAS_STATUS_SUCCESS)
            throw InternalError(std::string("cuda: ") + call + " failed (" + GetStatusString(st) + ")");
    }

private:
    template <class F>
    static void sym(void* h, const char* name, F& f) {
        f = reinterpret_cast<F>(dlsym(h, name));
        if (!f) throw UsageError(std::string("device backend cuda: cuBLASLt has no ") + name + " (zinf needs CUDA 13's)");
    }
    static Lt open() {
        void* h = nullptr;
        std::string why;
        for (const char* name : {"libcublasLt.so.13", "libcublasLt.so"}) {
            if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
            why += std::string(why.empty() ? "" : "; ") + dlerror();
        }
        if (!h)
            throw UsageError("device backend cuda: cannot load cuBLASLt: " + why +
                             " (put the CUDA toolkit's lib64 on LD_LIBRARY_PATH)");
        Lt l;
        sym(h, "cublasLtCreate", l.Create);
        sym(h, "cublasLtDestroy", l.Destroy);
        sym(h, "cublasLtGetStatusString", l.GetStatusString);
        sym(h, "cublasLtMatmulDescCreate", l.MatmulDescCreate);
        sym(h, "cublasLtMatmulDescDestroy", l.MatmulDescDestroy);
        sym(h, "cublasLtMatmulDescSetAttribute", l.MatmulDescSetAttribute);
        sym(h, "cublasLtMatrixLayoutCreate", l.MatrixLayoutCreate);
        sym(h, "cublasLtMatrixLayoutDestroy", l.MatrixLayoutDestroy);
        sym(h, "cublasLtMatrixLayoutSetAttribute", l.MatrixLayoutSetAttribute);
        sym(h, "cublasLtMatmulPreferenceCreate", l.MatmulPreferenceCreate);
        sym(h, "cublasLtMatmulPreferenceDestroy", l.MatmulPreferenceDestroy);
        sym(h, "cublasLtMatmulPreferenceSetAttribute", l.MatmulPreferenceSetAttribute);
        sym(h, "cublasLtMatmulAlgoGetHeuristic", l.MatmulAlgoGetHeuristic);
        sym(h, "cublasLtMatmul", l.Matmul);
        return l;
    }
};

// ---------------------------------------------------------------------------
// cuStreamWaitValue32 from the driver, or nullptr (then a polling kernel).
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValue32 driver_wait_value() {
    if (const char* env = std::getenv("ZINF_CUDA_HOST_WAIT"); env && std::string_view(env) == "kernel") return nullptr;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        log::warn_once("cuda-wait-value", "device: the driver has no cuStreamWaitValue32; host jobs release their "
                                          "streams through a polling kernel");
        return nullptr;
    }
    return reinterpret_cast<WaitValue32>(fn);
}

// ---------------------------------------------------------------------------
// Page-locked, mapped host memory a stream's kernels write and its host reads
// without a copy: the host-job flag and the bad-id record. A few bytes per
// stream, outside the pinned pool (which holds transfer buffers only).
struct Mapped {
    unsigned flag;  // the last host job done (sequence number)
    cuda::IdRecord rec;
};

class CudaStream final : public Stream {
public:
    CudaStream(std::string name, int gpu, mem::Block scratch, WaitValue32 wait_value)
        : name_(std::move(name)), gpu_(gpu), wait_value_(wait_value), scratch_block_(std::move(scratch)) {
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        void* p = nullptr;
        check(cudaHostAlloc(&p, sizeof(Mapped), cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
        mapped_ = new (p) Mapped{};
        void* d = nullptr;
        check(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer");
        mapped_dev_ = static_cast<Mapped*>(d);
        scratch_ = reinterpret_cast<cuda::IdScratch*>(scratch_block_.data());
        cuda::reset_scratch(stream_, scratch_);
        launched("reset_scratch");
        worker_ = std::thread([this] { run(); });
    }

    // The device drains first (CudaDevice's destructor); this stops the worker.
    ~CudaStream() override {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        work_.notify_all();
        worker_.join();
        (void)cudaStreamSynchronize(stream_);
        for (auto& st : stalls_) {
            (void)cudaEventDestroy(st.a);
            (void)cudaEventDestroy(st.b);
        }
        (void)cudaStreamDestroy(stream_);
        if (error_ || mapped_->rec.set)
            log::warn("device: stream " + name_ + " closed with an error nobody synchronized");
        (void)cudaFreeHost(mapped_);
    }

    const std::string& name() const override { return name_; }
    cudaStream_t native() const { return stream_; }

    // A new ticket for an op that can fail (a host job, an id check).
    u64 next_ticket() {
        std::lock_guard lk(mu_);
        return ++ops_;
    }
    u64 ticket() const {
        std::lock_guard lk(mu_);
        return ops_;
    }

    // ids (n) in rows of `T` (to name a bad one's row and position).
    void check_ids(const std::int32_t* ids, u64 n, u64 T, u64 V, int kind) {
        const u64 t = next_ticket();
        cuda::check_ids(stream_, ids, n, T, V, kind, t, scratch_, &mapped_dev_->rec);
        launched("check_ids");
    }

    // Host jobs: see the file's head.
    void host(std::function<void()> fn) {
        std::lock_guard lk(mu_);
        cudaEvent_t before = nullptr;
        check(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        if (cudaError_t e = cudaEventRecord(before, stream_); e != cudaSuccess) {
            (void)cudaEventDestroy(before);
            check(e, "cudaEventRecord");
        }
        const unsigned seq = ++seq_;
        if (wait_value_) {
            const CUresult r = wait_value_(reinterpret_cast<CUstream>(stream_),
                                           reinterpret_cast<CUdeviceptr>(&mapped_dev_->flag), seq,
                                           CU_STREAM_WAIT_VALUE_GEQ);
            if (r != CUDA_SUCCESS)
                throw InternalError("cuda: cuStreamWaitValue32 failed (CUresult " + std::to_string(int(r)) + ")");
        } else {
            cuda::wait_flag(stream_, &mapped_dev_->flag, seq);
            launched("wait_flag");
        }
        jobs_.push_back({before, std::move(fn), seq, ++ops_});
        work_.notify_one();
    }

    // Whether the stream holds an error not yet reported (host jobs are then
    // dropped, as the cpu backend drops the rest of its queue).
    bool dropped(u64 ticket) const {
        std::lock_guard lk(mu_);
        return ticket <= drop_through_;
    }
    bool failed() const {
        std::lock_guard lk(mu_);
        return error_ != nullptr || mapped_->rec.set;
    }

    // The stall time a wait stood (CudaDevice::wait): the time between two
    // timing events around the wait, read once both are done.
    void add_stall(cudaEvent_t a, cudaEvent_t b, std::atomic<std::uint64_t>* ns) {
        std::lock_guard lk(mu_);
        stalls_.push_back({a, b, ns});
    }
    void account_stalls() {
        std::lock_guard lk(mu_);
        auto done = std::remove_if(stalls_.begin(), stalls_.end(), [](const Stall& st) {
            if (cudaEventQuery(st.b) != cudaSuccess) return false;
            float ms = 0;
            if (cudaEventElapsedTime(&ms, st.a, st.b) == cudaSuccess && ms > 0)
                *st.ns += static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6);
            (void)cudaEventDestroy(st.a);
            (void)cudaEventDestroy(st.b);
            return true;
        });
        stalls_.erase(done, stalls_.end());
        (void)cudaGetLastError();  // a query's NotReady is not an error
    }

    // After the stream (or an event on it) passed `ticket`: throws the first
    // error up to it, host job or bad id, whichever came first.
    void report(u64 ticket) {
        account_stalls();
        std::unique_lock lk(mu_);
        const bool id_error = mapped_->rec.set && mapped_->rec.ticket <= ticket;
        const bool host_error = error_ && error_ticket_ <= ticket;
        if (host_error || id_error) drop_through_ = ops_;  // the queue up to this report is dropped
        if (host_error && (!id_error || error_ticket_ < mapped_->rec.ticket)) {
            lk.unlock();
            std::rethrow_exception(std::exchange(error_, nullptr));
        }
        if (!id_error) return;
        const std::int64_t value = mapped_->rec.value;
        const u64 index = mapped_->rec.index, T = mapped_->rec.T, V = mapped_->rec.V;
        const int kind = mapped_->rec.kind;
        mapped_->rec.set = 0;
        lk.unlock();
        if (kind == 0) throw bad_token(value, index / T, index % T, V);
        throw bad_target(value, index, V);
    }

    // Every host job queued so far done (the device's destructor).
    void drain() {
        std::unique_lock lk(mu_);
        idle_.wait(lk, [&] { return jobs_.empty() && !running_; });
    }

private:
    struct Job {
        cudaEvent_t before;
        std::function<void()> fn;
        unsigned seq;
        u64 ticket;
    };
    struct Stall {
        cudaEvent_t a, b;
        std::atomic<std::uint64_t>* ns;
    };

    void run() {
        (void)cudaSetDevice(gpu_);
        std::unique_lock lk(mu_);
        for (;;) {
            work_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;
            Job job = std::move(jobs_.front());
            jobs_.pop_front();
            running_ = true;
            lk.unlock();
            std::exception_ptr err;
            const cudaError_t waited = cudaEventSynchronize(job.before);
            if (waited != cudaSuccess) {
                err = std::make_exception_ptr(
                    InternalError("cuda: cudaEventSynchronize before a host job failed (" + describe(waited) + ")"));
            } else if (!failed() && !dropped(job.ticket)) {
                try {
                    job.fn();
                } catch (...) {
                    err = std::current_exception();
                }
            }
            job.fn = nullptr;  // what it captured goes before the job counts as done
            (void)cudaEventDestroy(job.before);
            lk.lock();
            if (err && !error_) {
                error_ = err;
                error_ticket_ = job.ticket;
                drop_through_ = ops_;  // what was queued behind it is dropped, even once it is reported
            }
            running_ = false;
            // Released last: the stream goes on once this store is seen.
            __atomic_store_n(&mapped_->flag, job.seq, __ATOMIC_RELEASE);
            idle_.notify_all();
        }
    }

    const std::string name_;
    const int gpu_;
    const WaitValue32 wait_value_;
    cudaStream_t stream_ = nullptr;
    Mapped* mapped_ = nullptr;      // host view
    Mapped* mapped_dev_ = nullptr;  // device view of the same bytes
    mem::Block scratch_block_;
    cuda::IdScratch* scratch_ = nullptr;

    mutable std::mutex mu_;
    std::condition_variable work_, idle_;
    std::deque<Job> jobs_;
    bool stop_ = false, running_ = false;
    unsigned seq_ = 0;
    u64 ops_ = 0;
    std::exception_ptr error_;
    u64 error_ticket_ = 0;
    u64 drop_through_ = 0;  // host jobs up to this ticket were queued behind an error: not run
    std::vector<Stall> stalls_;
    std::thread worker_;
};

CudaStream& as_cuda(const Stream& s) {
    auto* c = dynamic_cast<const CudaStream*>(&s);
    if (!c) throw InternalError("device: a stream of another backend given to the cuda backend");
    return const_cast<CudaStream&>(*c);
}

cudaEvent_t event_of(const Event& e) { return static_cast<cudaEvent_t>(e.handle.get()); }

// The largest power of two (up to 256) that divides a pointer and, in a
// batch, the byte stride between its matrices (every matrix's alignment):
// cuBLASLt's heuristics are told it.
std::uint32_t alignment(const void* p, std::uint64_t stride_bytes = 0) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t al = 256;
    while (al > 1 && (a % al || stride_bytes % al)) al /= 2;
    return al;
}

// ---------------------------------------------------------------------------
class CudaDevice final : public Device {
public:
    CudaDevice(const Options& opts, int gpu) : gpu_(gpu) {
        bind();
        lt_ = &Lt::get();
        cudaDeviceProp prop{};
        check(cudaGetDeviceProperties(&prop, gpu_), "cudaGetDeviceProperties");
        sms_ = static_cast<unsigned>(prop.multiProcessorCount);
        check(cuda::preload_elementwise(), "loading the element-wise kernels");
        check(cuda::preload_rows(), "loading the row kernels");
        check(cuda::preload_softmax(), "loading the softmax kernels");
        check(cuda::preload_llama(), "loading the Llama kernels");
        const WaitValue32 wait_value = driver_wait_value();
        arena_ = std::make_unique<mem::DeviceArena>(mem::ArenaConfig{
            .bytes = opts.memory_bytes ? opts.memory_bytes : 1 * GiB, .max_block = opts.max_block, .backend = "cuda", .gpu = gpu_});
        for (std::size_t k = 0; k < streams_.size(); ++k) {
            const auto kind = static_cast<StreamKind>(k);
            streams_[k] = std::make_unique<CudaStream>(stream_kind_name(kind), gpu_,
                                                       arena_->allocate(sizeof(cuda::IdScratch), "id check scratch"),
                                                       wait_value);
        }
        // cuBLASLt's workspace for GEMMs on compute (the other streams get
        // none: a shared workspace would race): 32 MiB as NVIDIA advises for
        // Hopper, less in a small arena.
        const std::uint64_t ws = std::min<std::uint64_t>(32 * MiB, arena_->stats().bytes / 32 / mem::kArenaAlignment *
                                                                       mem::kArenaAlignment);
        if (ws) workspace_ = arena_->allocate(ws, "cuBLASLt workspace");
        lt_->check(lt_->Create(&lt_handle_), "cublasLtCreate");
        check(cudaStreamCreateWithFlags(&fill_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        synchronize_all();
    }

    ~CudaDevice() override {
        bind();
        for (auto& s : streams_) s->drain();
        (void)cudaDeviceSynchronize();
        for (auto& [key, plan] : plans_) plan.destroy(*lt_);
        if (lt_handle_) (void)lt_->Destroy(lt_handle_);
        if (fill_stream_) (void)cudaStreamDestroy(fill_stream_);
        for (auto& s : streams_) s.reset();
        workspace_.reset();
    }

    const std::string& backend() const override {
        static const std::string name = "cuda";
        return name;
    }
    unsigned threads() const override { return sms_; }

    Stream& stream(StreamKind k) override {
        const auto i = static_cast<std::size_t>(k);
        if (i >= streams_.size()) throw InternalError("device: no stream of kind " + std::to_string(i));
        return *streams_[i];
    }
    bool host_addressable() const override { return false; }
    void* native(Stream& s) override { return as_cuda(s).native(); }

    Event record(Stream& s) override {
        bind();
        CudaStream& cs = as_cuda(s);
        cudaEvent_t ev = nullptr;
        check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        std::shared_ptr<void> handle(ev, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
        const u64 ticket = cs.ticket();
        check(cudaEventRecord(ev, cs.native()), "cudaEventRecord");
        return {.ticket = ticket, .stream = &s, .handle = std::move(handle)};
    }

    void wait(Stream& s, const Event& e) override {
        if (!e.stream || e.stream == &s || !e.handle) return;  // a stream is in order already
        bind();
        check(cudaStreamWaitEvent(as_cuda(s).native(), event_of(e), 0), "cudaStreamWaitEvent");
    }

    // The stall: timing events recorded on `s` just before and just after
    // the wait; nothing else runs on `s` between them, so their distance is
    // how long `s` stood waiting for `e` (0 when `e` was done when `s` got
    // there). It is added to `waited_ns` once both are done: at the next
    // synchronize of `s` (or of an event on it), or at a later wait on it.
    void wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) override {
        if (!e.stream || e.stream == &s || !e.handle) return;
        bind();
        CudaStream& cs = as_cuda(s);
        cs.account_stalls();
        cudaEvent_t a = nullptr, b = nullptr;
        check(cudaEventCreate(&a), "cudaEventCreate");
        if (cudaError_t err = cudaEventCreate(&b); err != cudaSuccess) {
            (void)cudaEventDestroy(a);
            check(err, "cudaEventCreate");
        }
        cs.add_stall(a, b, &waited_ns);  // owned by the stream from here
        check(cudaEventRecord(a, cs.native()), "cudaEventRecord");
        check(cudaStreamWaitEvent(cs.native(), event_of(e), 0), "cudaStreamWaitEvent");
        check(cudaEventRecord(b, cs.native()), "cudaEventRecord");
    }

    void synchronize(Stream& s) override {
        bind();
        CudaStream& cs = as_cuda(s);
        const u64 ticket = cs.ticket();
        check(cudaStreamSynchronize(cs.native()), "cudaStreamSynchronize");
        cs.report(ticket);
    }

    void synchronize(const Event& e) override {
        if (!e.stream || !e.handle) return;
        bind();
        check(cudaEventSynchronize(event_of(e)), "cudaEventSynchronize");
        as_cuda(*e.stream).report(e.ticket);
    }

    bool query(const Event& e) override {
        if (!e.stream || !e.handle) return true;
        bind();
        const cudaError_t r = cudaEventQuery(event_of(e));
        if (r == cudaErrorNotReady) {
            (void)cudaGetLastError();
            return false;
        }
        return true;  // done, or failed: synchronize reports it
    }

    void do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) override {
        if (src.empty()) return;
        bind();
        if (pageable(dst.data()) || pageable(src.data())) {
            // Pageable host memory: cudaMemcpyAsync would stage it when called
            // (host to device: before the stream's earlier work, a host job that
            // fills it among them) or block the caller until the stream gets
            // there (device to host). A host job copies it in stream order
            // instead, synchronously on the worker (cudaMemcpy's legacy stream
            // does not wait for our non-blocking ones).
            host(s, [dst, src] {
                check(cudaMemcpy(dst.data(), src.data(), src.size(), cudaMemcpyDefault), "cudaMemcpy");
            });
            return;
        }
        check(cudaMemcpyAsync(dst.data(), src.data(), src.size(), cudaMemcpyDefault, as_cuda(s).native()),
              "cudaMemcpyAsync");
    }

    // Host memory CUDA does not know (neither pinned nor registered nor the arena's).
    static bool pageable(const void* p) {
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
            (void)cudaGetLastError();
            return true;
        }
        return attr.type == cudaMemoryTypeUnregistered;
    }

    // Both device memory (activations, scratch): one 2-D copy on the stream.
    void do_copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                      std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols) override {
        bind();
        check(cudaMemcpy2DAsync(dst.data(), ld_dst * sizeof(float), src.data(), ld_src * sizeof(float),
                                cols * sizeof(float), rows, cudaMemcpyDeviceToDevice, as_cuda(s).native()),
              "cudaMemcpy2DAsync");
    }

    // Synchronous: on a private stream, waited for. Host memory (not the
    // arena's) is cleared on the host.
    void fill_zero(std::span<std::byte> dst) override {
        if (dst.empty()) return;
        bind();
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, dst.data()) != cudaSuccess || attr.type == cudaMemoryTypeUnregistered ||
            attr.type == cudaMemoryTypeHost) {
            (void)cudaGetLastError();
            std::memset(dst.data(), 0, dst.size());
            return;
        }
        check(cudaMemsetAsync(dst.data(), 0, dst.size(), fill_stream_), "cudaMemsetAsync");
        check(cudaStreamSynchronize(fill_stream_), "cudaStreamSynchronize");
    }

    void zero(Stream& s, std::span<float> dst) override {
        if (dst.empty()) return;
        bind();
        check(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), as_cuda(s).native()), "cudaMemsetAsync");
    }

    // ---- kernels -----------------------------------------------------------
    // Row-major C (m,n) = op(A) op(B) is column-major C^T (n,m) =
    // op(B)^T op(A)^T: cuBLASLt is handed B as its A and A as its B, each
    // stored as it is (a row-major (r,c) matrix of row stride ld is a
    // column-major (c,r) one of leading dimension ld), transposed as asked.
    // fp32 in, out and compute (CUBLAS_COMPUTE_32F: no TF32); with bf16
    // inputs, CUBLAS_COMPUTE_32F_FAST_16BF (see compute_type()).
    void do_gemm(Stream& s, const Gemm& r, std::span<const float> a, std::span<const float> b,
                 std::span<float> c) override {
        if (!r.batch || !r.m || !r.n) return;
        bind();
        CudaStream& cs = as_cuda(s);
        if (!r.k) {  // op(A) op(B) is all zeros: C = beta C
            cuda::scale_matrix(cs.native(), c.data(), r.m, r.n, r.ldc, r.batch, r.stride_c, r.beta);
            return launched("scale_matrix");
        }
        matmul(cs, r, a.data(), b.data(), c.data(), CUDA_R_32F);
    }

    void do_bias_add(Stream& s, std::span<float> out, std::span<const float> bias, u64 N, u64 OC) override {
        bind();
        cuda::bias_add(as_cuda(s).native(), out.data(), bias.data(), N, OC);
        launched("bias_add");
    }

    void do_bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) override {
        bind();
        cuda::bias_backward(as_cuda(s).native(), dbias.data(), dout.data(), N, OC);
        launched("bias_backward");
    }

    void do_embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                              std::span<const float> wte, std::span<const float> wpe, u64 B, u64 T, u64 C,
                              u64 V) override {
        bind();
        CudaStream& cs = as_cuda(s);
        check_tokens(cs, tokens.data(), B, T, V);
        cuda::embedding_forward(cs.native(), out.data(), tokens.data(), wte.data(),
                                wpe.empty() ? nullptr : wpe.data(), B, T, C, V);
        launched("embedding_forward");
    }

    void do_embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                               std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) override {
        bind();
        CudaStream& cs = as_cuda(s);
        check_tokens(cs, tokens.data(), B, T, V);
        cuda::embedding_backward(cs.native(), dwte.data(), dwpe.empty() ? nullptr : dwpe.data(), dout.data(),
                                 tokens.data(), B, T, C, V);
        launched("embedding_backward");
    }

    void do_layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                              std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N,
                              u64 C) override {
        bind();
        cuda::layernorm_forward(as_cuda(s).native(), out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                b.data(), N, C, cpu::kLayerNormEps);
        launched("layernorm_forward");
    }

    void do_layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                               std::span<const float> dout, std::span<const float> inp, std::span<const float> w,
                               std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) override {
        bind();
        cuda::layernorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                 w.data(), mean.data(), rstd.data(), N, C);
        launched("layernorm_backward");
    }

    void do_gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp) override {
        const u64 n = out.size();
        bind();
        cuda::gelu_forward(as_cuda(s).native(), out.data(), inp.data(), n, gelu_scale());
        launched("gelu_forward");
    }

    void do_gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp,
                          std::span<const float> dout) override {
        const u64 n = dinp.size();
        bind();
        cuda::gelu_backward(as_cuda(s).native(), dinp.data(), inp.data(), dout.data(), n, gelu_scale());
        launched("gelu_backward");
    }

    void do_attention_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B,
                              u64 T, u64 C, u64 NH) override {
        bind();
        cuda::attention_forward(as_cuda(s).native(), out.data(), att.data(), qkv.data(), B, T, C, NH);
        launched("attention_forward");
    }

    void do_attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                               std::span<const float> qkv, std::span<const float> att, u64 B, u64 T, u64 C,
                               u64 NH) override {
        bind();
        cuda::attention_backward(as_cuda(s).native(), dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                                 B, T, C, NH);
        launched("attention_backward");
    }

    void do_attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) override {
        bind();
        cuda::attention_decode(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH);
        launched("attention_decode");
    }

    // ---- the Llama family (llama.cu) ----------------------------------------
    void do_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                            std::span<const float> w, u64 N, u64 C, float eps) override {
        bind();
        cuda::rmsnorm_forward(as_cuda(s).native(), out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
        launched("rmsnorm_forward");
    }

    void do_rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                             std::span<const float> inp, std::span<const float> w, std::span<const float> rstd, u64 N,
                             u64 C) override {
        bind();
        cuda::rmsnorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                               rstd.data(), N, C);
        launched("rmsnorm_backward");
    }

    void do_rope(Stream& s, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                 u64 pos0, bool inverse) override {
        bind();
        cuda::rope(as_cuda(s).native(), x.data(), table.data(), B, T, H, hd, pos0, inverse);
        launched(inverse ? "rope_backward" : "rope_forward");
    }

    void do_swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate,
                           std::span<const float> up) override {
        const u64 n = out.size();
        bind();
        cuda::swiglu_forward(as_cuda(s).native(), out.data(), gate.data(), up.data(), n);
        launched("swiglu_forward");
    }

    void do_swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                            std::span<const float> gate, std::span<const float> up) override {
        const u64 n = dgate.size();
        bind();
        cuda::swiglu_backward(as_cuda(s).native(), dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
        launched("swiglu_backward");
    }

    void do_gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH,
                        u64 hd) override {
        bind();
        cuda::gqa_forward(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, KVH, hd);
        launched("gqa_forward");
    }

    void do_gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                         std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, std::span<const float> att, u64 B, u64 T,
                         u64 NH, u64 KVH, u64 hd) override {
        bind();
        cuda::gqa_backward(as_cuda(s).native(), dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), q.data(),
                           k.data(), v.data(), att.data(), B, T, NH, KVH, hd);
        launched("gqa_backward");
    }

    void do_gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) override {
        bind();
        cuda::gqa_decode(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), T, NH, KVH, hd);
        launched("gqa_decode");
    }

    void do_crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                          std::span<const std::int32_t> targets, float dloss, u64 N,
                                          u64 V) override {
        bind();
        CudaStream& cs = as_cuda(s);
        check_targets(cs, targets.data(), N, V);
        cuda::crossentropy_forward_backward(cs.native(), losses.data(), logits.data(), targets.data(), dloss, N, V);
        launched("crossentropy_forward_backward");
    }

    void do_crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                                 std::span<const std::int32_t> targets, u64 N, u64 V) override {
        bind();
        CudaStream& cs = as_cuda(s);
        check_targets(cs, targets.data(), N, V);
        cuda::crossentropy_forward(cs.native(), losses.data(), logits.data(), targets.data(), N, V);
        launched("crossentropy_forward");
    }

    void do_residual_forward(Stream& s, std::span<float> out, std::span<const float> a,
                             std::span<const float> b) override {
        const u64 n = out.size();
        bind();
        cuda::residual_forward(as_cuda(s).native(), out.data(), a.data(), b.data(), n);
        launched("residual_forward");
    }

    void do_accumulate(Stream& s, std::span<float> acc, std::span<const float> x) override {
        const u64 n = acc.size();
        bind();
        cuda::accumulate(as_cuda(s).native(), acc.data(), x.data(), n);
        launched("accumulate");
    }

    void do_cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src) override {
        const u64 n = dst.size();
        bind();
        cuda::to_bf16(as_cuda(s).native(), dst.data(), src.data(), n);
        launched("cast to bf16");
    }

    void do_cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src) override {
        const u64 n = dst.size();
        bind();
        cuda::from_bf16(as_cuda(s).native(), dst.data(), src.data(), n);
        launched("cast from bf16");
    }

    void do_adamw(Stream& s, const optim::Update& u, const optim::Scalars& k) override {
        bind();
        const cuda::AdamPtrs p{u.master.data(),    u.exp_avg.data(),   u.exp_avg_sq.data(), u.grad_f32.data(),
                               u.grad_bf16.data(), u.param_f32.data(), u.param_bf16.data()};
        const cuda::AdamScalars ks{k.grad_scale,      k.beta1, k.one_minus_beta1, k.beta2,    k.one_minus_beta2,
                                   k.inv_sqrt_bc2, k.eps,   k.decay,           k.step_size};
        cuda::adamw(as_cuda(s).native(), p, u.size(), ks);
        launched("adamw");
    }

    void host(Stream& s, std::function<void()> fn) override {
        bind();
        as_cuda(s).host(std::move(fn));
    }

    // ---- for measure_gemm_flops ---------------------------------------------
    // `reps` GEMMs of n x n on compute, timed with events after a warm-up:
    // FLOP/s. bf16: A, B and C in bf16, fp32 accumulation.
    double gemm_rate(u64 n, unsigned reps, bool bf16) {
        bind();
        CudaStream& cs = as_cuda(compute());
        const u64 elem = bf16 ? 2 : 4;
        mem::Block a = arena_->allocate(n * n * elem, "gemm benchmark A");
        mem::Block b = arena_->allocate(n * n * elem, "gemm benchmark B");
        mem::Block c = arena_->allocate(n * n * elem, "gemm benchmark C");
        {  // random inputs (a GEMM's rate may depend on the data), C zero
            std::vector<float> host(n * n);
            std::mt19937 rng(12345);
            std::uniform_real_distribution<float> dist(-1, 1);
            for (auto& v : host) v = dist(rng);
            mem::Block staging = arena_->allocate(n * n * 4, "gemm benchmark staging");
            check(cudaMemcpy(staging.data(), host.data(), n * n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
            for (mem::Block* x : {&a, &b}) {
                if (bf16)
                    cuda::to_bf16(cs.native(), reinterpret_cast<std::uint16_t*>(x->data()),
                                  reinterpret_cast<const float*>(staging.data()), n * n);
                else
                    check(cudaMemcpyAsync(x->data(), staging.data(), n * n * 4, cudaMemcpyDeviceToDevice, cs.native()),
                          "cudaMemcpyAsync");
            }
            check(cudaMemsetAsync(c.data(), 0, n * n * elem, cs.native()), "cudaMemsetAsync");
            check(cudaStreamSynchronize(cs.native()), "cudaStreamSynchronize");
        }
        const Gemm g = cpu::resolve(Gemm{.m = n, .n = n, .k = n});
        const auto type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
        matmul(cs, g, a.data(), b.data(), c.data(), type);  // warm-up (and the heuristic)
        cudaEvent_t t0 = nullptr, t1 = nullptr;
        check(cudaEventCreate(&t0), "cudaEventCreate");
        check(cudaEventCreate(&t1), "cudaEventCreate");
        check(cudaEventRecord(t0, cs.native()), "cudaEventRecord");
        for (unsigned r = 0; r < reps; ++r) matmul(cs, g, a.data(), b.data(), c.data(), type);
        check(cudaEventRecord(t1, cs.native()), "cudaEventRecord");
        float ms = 0;
        const cudaError_t e = cudaEventSynchronize(t1);
        if (e == cudaSuccess) check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
        (void)cudaEventDestroy(t0);
        (void)cudaEventDestroy(t1);
        check(e, "cudaEventSynchronize");
        const double nn = static_cast<double>(n);
        return ms > 0 ? 2.0 * nn * nn * nn * reps / (ms * 1e-3) : 0.0;
    }

private:
    // The current device is per host thread (and others may set it): every
    // entry makes it ours. cudaGetDevice is a read of the runtime's state.
    void bind() const {
        int current = -1;
        if (cudaGetDevice(&current) == cudaSuccess && current == gpu_) return;
        check(cudaSetDevice(gpu_), "cudaSetDevice");
    }

    static float gelu_scale() { return static_cast<float>(std::sqrt(2.0 / std::numbers::pi)); }

    void check_tokens(CudaStream& cs, const std::int32_t* tokens, u64 B, u64 T, u64 V) {
        cs.check_ids(tokens, B * T, T, V, 0);
    }
    void check_targets(CudaStream& cs, const std::int32_t* targets, u64 N, u64 V) {
        cs.check_ids(targets, N, 1, V, 1);
    }

    void synchronize_all() {
        for (auto& s : streams_) synchronize(*s);
    }

    // One cuBLASLt plan (descriptors and the heuristic's algorithm) per shape,
    // operand alignment and stream workspace: the same shape always runs the
    // same algorithm, so the same bits.
    using PlanKey = std::tuple<bool, bool, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, std::uint32_t,
                               std::uint32_t, std::uint32_t, int, int, bool>;
    // fp32 spans: exact fp32 (no TF32), or with bf16 inputs (device.hpp's
    // Precision) on bf16 tensor cores, the inputs rounded inside the kernel
    // and the products accumulated in fp32. (cublas_api.h allows FAST_16BF to
    // down-convert to TF32 instead, which keeps more bits: never fewer than
    // bf16's, so the cpu backend's rounding stays the bound test_cuda holds it
    // to.) bf16 spans (gemm_rate's): fp32 accumulation.
    static cublasComputeType_t compute_type(const Gemm& g, cudaDataType_t type) {
        return type == CUDA_R_32F && g.inputs == Precision::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
    }
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
        void destroy(const Lt& lt) {
            if (op) (void)lt.MatmulDescDestroy(op);
            for (auto* l : {a, b, c})
                if (l) (void)lt.MatrixLayoutDestroy(l);
        }
    };

    void matmul(CudaStream& cs, const Gemm& g, const void* a, const void* b, void* c, cudaDataType_t type) {
        const bool on_compute = &cs == streams_[0].get();
        void* ws = on_compute && workspace_ ? workspace_.data() : nullptr;
        const std::size_t ws_bytes = ws ? workspace_.size() : 0;
        const u64 elem = type == CUDA_R_16BF ? 2 : 4, batched = g.batch > 1;
        const std::uint32_t al_a = alignment(a, batched * g.stride_a * elem),
                            al_b = alignment(b, batched * g.stride_b * elem),
                            al_c = alignment(c, batched * g.stride_c * elem);
        const PlanKey key{g.ta,  g.tb,    g.m,        g.n,        g.k,        g.lda, g.ldb, g.ldc, g.batch,
                          g.stride_a, g.stride_b, g.stride_c, al_a, al_b, al_c, static_cast<int>(type),
                          static_cast<int>(compute_type(g, type)), ws != nullptr};
        const Plan* plan = nullptr;
        {
            std::lock_guard lk(plans_mu_);
            auto it = plans_.find(key);
            if (it == plans_.end()) it = plans_.emplace(key, make_plan(g, al_a, al_b, al_c, type, ws_bytes)).first;
            plan = &it->second;
        }
        const float alpha = g.alpha, beta = g.beta;
        // cuBLASLt's A is our B, its B our A (see gemm()).
        lt_->check(lt_->Matmul(lt_handle_, plan->op, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c, plan->c,
                               &plan->algo, ws, ws_bytes, cs.native()),
                   "cublasLtMatmul");
    }

    Plan make_plan(const Gemm& g, std::uint32_t al_a, std::uint32_t al_b, std::uint32_t al_c, cudaDataType_t type,
                   std::size_t ws_bytes) {
        const Lt& lt = *lt_;
        Plan p;
        try {
            lt.check(lt.MatmulDescCreate(&p.op, compute_type(g, type), CUDA_R_32F), "cublasLtMatmulDescCreate");
            const cublasOperation_t ta = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
            lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
            lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
            // Stored column-major shapes: B row-major (rows_b, cols_b) is (cols_b, rows_b).
            const u64 b_rows = g.tb ? g.k : g.n, b_cols = g.tb ? g.n : g.k;  // cuBLASLt's A
            const u64 a_rows = g.ta ? g.m : g.k, a_cols = g.ta ? g.k : g.m;  // cuBLASLt's B
            auto layout = [&](cublasLtMatrixLayout_t& l, u64 rows, u64 cols, u64 ld, u64 stride) {
                lt.check(lt.MatrixLayoutCreate(&l, type, rows, cols, static_cast<std::int64_t>(ld)),
                         "cublasLtMatrixLayoutCreate");
                if (g.batch > 1) {
                    const auto count = static_cast<std::int32_t>(g.batch);
                    const auto off = static_cast<std::int64_t>(stride);
                    lt.check(lt.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                             "set BATCH_COUNT");
                    lt.check(lt.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off,
                                                         sizeof off),
                             "set STRIDED_BATCH_OFFSET");
                }
            };
            layout(p.a, b_rows, b_cols, g.ldb, g.stride_b);
            layout(p.b, a_rows, a_cols, g.lda, g.stride_a);
            layout(p.c, g.n, g.m, g.ldc, g.stride_c);

            cublasLtMatmulPreference_t pref = nullptr;
            lt.check(lt.MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
            auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
                lt.check(lt.MatmulPreferenceSetAttribute(pref, attr, &value, sizeof value), "set preference");
            };
            set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(ws_bytes));
            set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_b);  // cuBLASLt's A is our B
            set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_a);
            set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c);
            set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c);
            cublasLtMatmulHeuristicResult_t result{};
            int found = 0;
            const cublasStatus_t st =
                lt.MatmulAlgoGetHeuristic(lt_handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
            (void)lt.MatmulPreferenceDestroy(pref);
            lt.check(st, "cublasLtMatmulAlgoGetHeuristic");
            if (found == 0)
                throw InternalError("cuda: cuBLASLt has no algorithm for a GEMM of m=" + std::to_string(g.m) +
                                    ", n=" + std::to_string(g.n) + ", k=" + std::to_string(g.k));
            p.algo = result.algo;
            return p;
        } catch (...) {
            p.destroy(lt);
            throw;
        }
    }

    const int gpu_;
    unsigned sms_ = 0;
    const Lt* lt_ = nullptr;
    cublasLtHandle_t lt_handle_ = nullptr;
    cudaStream_t fill_stream_ = nullptr;
    std::array<std::unique_ptr<CudaStream>, 4> streams_;  // by StreamKind; [0] compute
    mem::Block workspace_;
    std::mutex plans_mu_;
    std::map<PlanKey, Plan> plans_;
};

}  // namespace

// ---------------------------------------------------------------------------
std::string cuda_unavailable() {
    std::string why;
    return mem::gpu::device_count(&why) > 0 ? "" : why;
}

std::unique_ptr<Device> open_cuda(const Options& opts) {
    std::string why;
    const int count = mem::gpu::device_count(&why);
    if (count == 0) throw UsageError("device backend 'cuda' needs a CUDA GPU: " + why);
    return std::make_unique<CudaDevice>(opts, select_gpu(opts.gpu, count));
}

double cuda_gemm_flops(Device& dev, std::uint64_t n, unsigned reps, bool bf16) {
    auto* cuda = dynamic_cast<CudaDevice*>(&dev);
    if (!cuda) throw InternalError("cuda_gemm_flops: not a cuda device");
    return cuda->gemm_rate(n, reps, bf16);
}

}  // namespace zinf::device
