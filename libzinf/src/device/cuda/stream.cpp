// The cuda backend's streams (backend.hpp): a non-blocking cudaStream_t
// with a count of tickets, and a worker for its host jobs.
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
#include "backend.hpp"

#include <cstdlib>
#include <string_view>

namespace zinf::device::cuda_backend {

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

CudaStream::CudaStream(std::string name, int gpu, mem::Block scratch, mem::Block sums, WaitValue32 wait_value)
    : name_(std::move(name)),
      gpu_(gpu),
      wait_value_(wait_value),
      scratch_block_(std::move(scratch)),
      sums_block_(std::move(sums)) {
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

CudaStream::~CudaStream() {
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

void CudaStream::host(std::function<void()> fn) {
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

void CudaStream::account_stalls() {
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

void CudaStream::report(u64 ticket) {
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

void CudaStream::run() {
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
}  // namespace zinf::device::cuda_backend

namespace zinf::device::cuda {

void check_ids(const Launch& l, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind) {
    l.owner->check_ids(ids, n, T, V, kind);
}

}  // namespace zinf::device::cuda
