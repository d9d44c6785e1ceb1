// The cuda backend's Device (backend.hpp): the arena from one cudaMalloc,
// the streams and events, asynchronous copies, host jobs; and open_cuda.
#include "backend.hpp"

#include "../../mem/gpu.hpp"

#include <cstring>
#include <limits>
#include <utility>

namespace zinf::device {
namespace cuda_backend {

CudaDevice::CudaDevice(const Options& opts, int gpu) : gpu_(gpu) {
    bind();
    lt_ = &Lt::get();
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, gpu_), "cudaGetDeviceProperties");
    sms_ = static_cast<unsigned>(prop.multiProcessorCount);
    const std::pair<cudaError_t (*)(), const char*> files[] = {
        {cuda::preload_signals, "loading the streams' signals"},
        {cuda::preload_linear, "loading the linear kernels"},
        {cuda::preload_embedding, "loading the embedding kernels"},
        {cuda::preload_norms, "loading the norms"},
        {cuda::preload_elementwise, "loading the element-wise kernels"},
        {cuda::preload_attention, "loading the attention kernels"},
        {cuda::preload_flash, "loading the flash attention kernels"},
        {cuda::preload_loss, "loading the loss kernels"},
        {cuda::preload_optimizer, "loading the optimizer kernel"}};
    for (const auto& [preload, what] : files) check(preload(), what);
    const WaitValue32 wait_value = driver_wait_value();
    arena_ = std::make_unique<mem::DeviceArena>(mem::ArenaConfig{
        .bytes = opts.memory_bytes ? opts.memory_bytes : 1 * GiB, .max_block = opts.max_block, .backend = "cuda", .gpu = gpu_});
    for (std::size_t k = 0; k < streams_.size(); ++k) {
        const auto kind = static_cast<StreamKind>(k);
        streams_[k] = std::make_unique<CudaStream>(stream_kind_name(kind), gpu_,
                                                   arena_->allocate(sizeof(cuda::IdScratch), "id check scratch"),
                                                   arena_->allocate(CudaStream::kSumFloats * sizeof(float),
                                                                    "column sums scratch"),
                                                   wait_value);
    }
    // cuBLASLt's workspace for GEMMs on compute (the other streams get
    // none: a shared workspace would race): 32 MiB as NVIDIA advises for
    // Hopper, less in a small arena.
    const std::uint64_t ws = std::min<std::uint64_t>(32 * MiB, arena_->stats().bytes / 32 / mem::kArenaAlignment *
                                                                   mem::kArenaAlignment);
    if (ws) workspace_ = arena_->allocate(ws, "cuBLASLt workspace");
    // A GEMM of a bf16 B (the working parameters under Precision::bf16)
    // rounds A's rows into this, a block of rows at a time: half the
    // workspace's size.
    if (const std::uint64_t st = ws / 2 / mem::kArenaAlignment * mem::kArenaAlignment)
        bf16_staging_ = arena_->allocate(st, "bf16 GEMM staging");
    lt_->check(lt_->Create(&lt_handle_), "cublasLtCreate");
    check(cudaStreamCreateWithFlags(&fill_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    synchronize_all();
}

CudaDevice::~CudaDevice() {
    bind();
    for (auto& s : streams_) s->drain();
    (void)cudaDeviceSynchronize();
    for (auto& [key, plan] : plans_) plan.destroy(*lt_);
    if (lt_handle_) (void)lt_->Destroy(lt_handle_);
    if (fill_stream_) (void)cudaStreamDestroy(fill_stream_);
    for (auto& s : streams_) s.reset();
    workspace_.reset();
    bf16_staging_.reset();
}

Event CudaDevice::record(Stream& s) {
    bind();
    CudaStream& cs = as_cuda(s);
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    std::shared_ptr<void> handle(ev, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    const u64 ticket = cs.ticket();
    check(cudaEventRecord(ev, cs.native()), "cudaEventRecord");
    return {.ticket = ticket, .stream = &s, .handle = std::move(handle)};
}

void CudaDevice::wait(Stream& s, const Event& e) {
    if (!e.stream || e.stream == &s || !e.handle) return;  // a stream is in order already
    bind();
    check(cudaStreamWaitEvent(as_cuda(s).native(), event_of(e), 0), "cudaStreamWaitEvent");
}

void CudaDevice::wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) {
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

void CudaDevice::synchronize(Stream& s) {
    bind();
    CudaStream& cs = as_cuda(s);
    const u64 ticket = cs.ticket();
    check(cudaStreamSynchronize(cs.native()), "cudaStreamSynchronize");
    cs.report(ticket);
}

void CudaDevice::synchronize(const Event& e) {
    if (!e.stream || !e.handle) return;
    bind();
    check(cudaEventSynchronize(event_of(e)), "cudaEventSynchronize");
    as_cuda(*e.stream).report(e.ticket);
}

bool CudaDevice::query(const Event& e) {
    if (!e.stream || !e.handle) return true;
    bind();
    const cudaError_t r = cudaEventQuery(event_of(e));
    if (r == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
    }
    return true;  // done, or failed: synchronize reports it
}

void CudaDevice::do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) {
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

bool CudaDevice::pageable(const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return attr.type == cudaMemoryTypeUnregistered;
}

// Both device memory (activations, scratch): one 2-D copy on the stream.
void CudaDevice::do_copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                              std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols) {
    bind();
    check(cudaMemcpy2DAsync(dst.data(), ld_dst * sizeof(float), src.data(), ld_src * sizeof(float),
                            cols * sizeof(float), rows, cudaMemcpyDeviceToDevice, as_cuda(s).native()),
          "cudaMemcpy2DAsync");
}

void CudaDevice::fill_zero(std::span<std::byte> dst) {
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

void CudaDevice::zero(Stream& s, std::span<float> dst) {
    if (dst.empty()) return;
    bind();
    check(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), as_cuda(s).native()), "cudaMemsetAsync");
}

void CudaDevice::host(Stream& s, std::function<void()> fn) {
    bind();
    as_cuda(s).host(std::move(fn));
}

Stamp CudaDevice::stamp(Stream& s) {
    bind();
    cudaEvent_t ev = nullptr;
    check(cudaEventCreate(&ev), "cudaEventCreate");
    std::shared_ptr<void> handle(ev, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    check(cudaEventRecord(ev, as_cuda(s).native()), "cudaEventRecord");
    return {std::move(handle)};
}

double CudaDevice::seconds_between(const Stamp& a, const Stamp& b) {
    constexpr double not_yet = std::numeric_limits<double>::quiet_NaN();
    if (!a.handle || !b.handle) return not_yet;
    bind();
    auto* ea = static_cast<cudaEvent_t>(a.handle.get());
    auto* eb = static_cast<cudaEvent_t>(b.handle.get());
    float ms = 0;
    // cudaErrorNotReady until both are done; a stream's own error is its
    // synchronize's to report, not the profile's.
    if (cudaEventElapsedTime(&ms, ea, eb) != cudaSuccess) {
        (void)cudaGetLastError();
        return not_yet;
    }
    return static_cast<double>(ms) * 1e-3;
}
}  // namespace cuda_backend

// ---------------------------------------------------------------------------
std::string cuda_unavailable() {
    std::string why;
    return mem::gpu::device_count(&why) > 0 ? "" : why;
}

std::unique_ptr<Device> open_cuda(const Options& opts) {
    std::string why;
    const int count = mem::gpu::device_count(&why);
    if (count == 0) throw UsageError("device backend 'cuda' needs a CUDA GPU: " + why);
    return std::make_unique<cuda_backend::CudaDevice>(opts, select_gpu(opts.gpu, count));
}

}  // namespace zinf::device
