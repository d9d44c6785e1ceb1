// The cuda backend's host side (docs/cuda-backend.md), shared by its files by concern:
//   device.cpp  the Device: the arena, streams and events, copies, host jobs,
//               open_cuda
//   stream.cpp  CudaStream: a non-blocking cudaStream_t, its tickets and
//               errors, and the worker that runs its host jobs
//   gemm.cpp    GEMM through cuBLASLt (opened with dlopen, so every program
//               starts on machines without it) and its plans
//   *.cu        every kernel's body by kind of op (kernels.hpp), which the
//               Device's do_<name> calls with the stream
// Device's public kernels check the spans against their shapes before they
// reach these (checks.cpp).
//
// Errors found on the device or in host jobs follow the cpu backend's rule:
// thrown by the next synchronize of the stream, or of an event recorded on it
// after the failing work. Every op that can fail takes a ticket from its
// stream's count; an event carries the count at its record, so
// synchronize(event) reports only what came before it.
#pragma once

#include "kernels.hpp"

#include "../backends.hpp"
#include "../kernels.hpp"

#include <zinf/device.hpp>
#include <zinf/mem.hpp>

#include <cublasLt.h>
#include <cuda.h>  // types of the driver entry point only
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace zinf::device::cuda_backend {

inline std::string describe(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

inline void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw InternalError(std::string("cuda: ") + call + " failed (" + describe(e) + ")");
}

// After a launch: a bad configuration shows here, a fault at synchronize.
inline void launched(const char* kernel) { check(cudaGetLastError(), kernel); }

// ---------------------------------------------------------------------------
// cuBLASLt, looked up once (libcublasLt.so.13 is CUDA 13's): gemm.cpp.
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

    static const Lt& get();  // UsageError when it cannot be loaded

    void check(cublasStatus_t st, const char* call) const {
        if (st != CUBLAS_STATUS_SUCCESS)
            throw InternalError(std::string("cuda: ") + call + " failed (" + GetStatusString(st) + ")");
    }

private:
    static Lt open();
};

// ---------------------------------------------------------------------------
// cuStreamWaitValue32 from the driver, or nullptr (then a polling kernel): stream.cpp.
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValue32 driver_wait_value();

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
    // scratch: check_ids's; sums: the column sums' partials (kSumFloats).
    CudaStream(std::string name, int gpu, mem::Block scratch, mem::Block sums, WaitValue32 wait_value);

    // Floats of column-sum partials a stream keeps (1 MiB): a pass sums as
    // many columns as fit at once (common.cuh's column_sums).
    static constexpr u64 kSumFloats = u64{1} << 18;
    float* sums() const { return reinterpret_cast<float*>(sums_block_.data()); }

    // The device drains first (CudaDevice's destructor); this stops the worker.
    ~CudaStream() override;

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

    // ids (n) in rows of `T` (to name a bad one's row and position): cuda::check_ids.
    void check_ids(const std::int32_t* ids, u64 n, u64 T, u64 V, int kind) {
        const u64 t = next_ticket();
        cuda::find_bad_ids(stream_, ids, n, T, V, kind, t, scratch_, &mapped_dev_->rec);
        launched("check_ids");
    }

    // Host jobs: see the file's head.
    void host(std::function<void()> fn);

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
    void account_stalls();

    // After the stream (or an event on it) passed `ticket`: throws the first
    // error up to it, host job or bad id, whichever came first.
    void report(u64 ticket);

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

    void run();

    const std::string name_;
    const int gpu_;
    const WaitValue32 wait_value_;
    cudaStream_t stream_ = nullptr;
    Mapped* mapped_ = nullptr;      // host view
    Mapped* mapped_dev_ = nullptr;  // device view of the same bytes
    mem::Block scratch_block_;
    cuda::IdScratch* scratch_ = nullptr;
    mem::Block sums_block_;

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

inline CudaStream& as_cuda(const Stream& s) {
    auto* c = dynamic_cast<const CudaStream*>(&s);
    if (!c) throw InternalError("device: a stream of another backend given to the cuda backend");
    return const_cast<CudaStream&>(*c);
}

inline cudaEvent_t event_of(const Event& e) { return static_cast<cudaEvent_t>(e.handle.get()); }

// What cuBLASLt does after a GEMM's product (DEFAULT: nothing): gemm.cpp.
struct Epilogue {
    cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;  // fp32: the bias read (BIAS), or its gradient written (BGRADA/B)
    void* aux = nullptr;         // GELU_AUX: the pre-activation written, of C's type, rows aux_ld apart
    u64 aux_ld = 0;
};

// ---------------------------------------------------------------------------
class CudaDevice final : public Device {
public:
    CudaDevice(const Options& opts, int gpu);

    ~CudaDevice() override;

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

    Event record(Stream& s) override;

    void wait(Stream& s, const Event& e) override;

    // The stall: timing events recorded on `s` just before and just after
    // the wait; nothing else runs on `s` between them, so their distance is
    // how long `s` stood waiting for `e` (0 when `e` was done when `s` got
    // there). It is added to `waited_ns` once both are done: at the next
    // synchronize of `s` (or of an event on it), or at a later wait on it.
    void wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) override;

    void synchronize(Stream& s) override;

    void synchronize(const Event& e) override;

    bool query(const Event& e) override;

    void do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) override;
    void do_copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                      std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols) override;

    // Host memory CUDA does not know (neither pinned nor registered nor the arena's).
    static bool pageable(const void* p);

    // Synchronous: on a private stream, waited for. Host memory (not the
    // arena's) is cleared on the host.
    void fill_zero(std::span<std::byte> dst) override;

    void zero(Stream& s, std::span<float> dst) override;

    // ---- kernels: each calls its body (kernels.hpp's cuda::<name>) with the
    // stream, then checks the launch ----------------------------------------
#define ZINF_KERNEL(name, ...)                                                    \
    void do_##name(Stream& s, ZINF_KERNEL_PARAMS(__VA_ARGS__)) override {         \
        cuda::name(launch(s), ZINF_KERNEL_ARGS(__VA_ARGS__));                     \
        launched(#name);                                                          \
    }
#include <zinf/kernels.def>

    // gemm's body (cuda::gemm, gemm.cpp). Row-major C (m,n) = op(A) op(B) is
    // column-major C^T (n,m) = op(B)^T op(A)^T: cuBLASLt is handed B as its A
    // and A as its B, each stored as it is (a row-major (r,c) matrix of row
    // stride ld is a column-major (c,r) one of leading dimension ld),
    // transposed as asked. fp32 in, out and compute (CUBLAS_COMPUTE_32F: no
    // TF32); with bf16 inputs, CUBLAS_COMPUTE_32F_FAST_16BF (see
    // compute_type()); an operand stored bf16 with the other rounded to bf16
    // (CUBLAS_COMPUTE_32F).
    void multiply(CudaStream& cs, const Gemm& r, ConstView a, ConstView b, View c);
    // The epilogues' bodies (gemm_bias, gemm_bias_gelu, gemm_dbias): one
    // cuBLASLt call with CUBLASLT_EPILOGUE_BIAS, GELU_AUX_BIAS (the
    // pre-activation as its aux output), or BGRADA / BGRADB (the bias's
    // gradient into the stream's column-sum partials, then added to
    // dbias), where A and B are stored alike (no staging) and cuBLASLt has
    // an algorithm for it; otherwise, said once, multiply() and the
    // separate kernels (bias_rows, gelu_forward, bias_grad_rows).
    void multiply_bias(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, const float* bias, View c);
    void multiply_bias_gelu(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, const float* bias,
                            View pre, View out);
    void multiply_dbias(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, View c, float* dbias,
                        bool of_a);

    void host(Stream& s, std::function<void()> fn) override;

    // A timing event recorded on the stream; read with cudaEventElapsedTime,
    // which answers not-ready (NaN here) until both are done: never a wait.
    Stamp stamp(Stream& s) override;
    double seconds_between(const Stamp& a, const Stamp& b) override;

    // ---- for measure_gemm_flops ---------------------------------------------
    // `reps` GEMMs of n x n on compute, timed with events after a warm-up:
    // FLOP/s. bf16: A, B and C in bf16, fp32 accumulation.
    double gemm_rate(u64 n, unsigned reps, bool bf16);

private:
    // The current device is per host thread (and others may set it): every
    // entry makes it ours. cudaGetDevice is a read of the runtime's state.
    void bind() const {
        int current = -1;
        if (cudaGetDevice(&current) == cudaSuccess && current == gpu_) return;
        check(cudaSetDevice(gpu_), "cudaSetDevice");
    }

    // What a kernel's body runs with on `s`, the GPU bound.
    cuda::Launch launch(Stream& s) {
        bind();
        CudaStream& cs = as_cuda(s);
        return {cs.native(), &cs, this, cs.sums(), CudaStream::kSumFloats};
    }

    void synchronize_all() {
        for (auto& s : streams_) synchronize(*s);
    }

    // One cuBLASLt plan (descriptors and the heuristic's algorithm) per shape,
    // operand alignment and stream workspace: the same shape always runs the
    // same algorithm, so the same bits.
    // ... and per epilogue: its kind, aux's row stride, the alignments of
    // the bias (or its gradient) and aux.
    using PlanKey = std::tuple<bool, bool, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, std::uint32_t,
                               std::uint32_t, std::uint32_t, int, int, int, bool, int, u64, std::uint32_t,
                               std::uint32_t>;

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
        bool ok = true;  // false: an epilogue cuBLASLt has no algorithm for (the stand-ins run)
        void destroy(const Lt& lt) {
            if (op) (void)lt.MatmulDescDestroy(op);
            for (auto* l : {a, b, c})
                if (l) (void)lt.MatrixLayoutDestroy(l);
        }
    };

    // True when `r` has nothing to multiply (done: C untouched, or C = beta
    // C, a bf16 C (beta 0) zeroed).
    bool no_product(CudaStream& cs, const Gemm& r, View c);
    // multiply()'s mixes: an fp32 A by a bf16 B; a bf16 A by a B stored
    // either way; C fp32 or bf16 (c_type).
    void multiply_bf16b(CudaStream& cs, const Gemm& r, std::span<const float> a, std::span<const std::uint16_t> b,
                        void* c, cudaDataType_t c_type);
    void multiply_bf16a(CudaStream& cs, const Gemm& r, std::span<const std::uint16_t> a, ConstView b, void* c,
                        cudaDataType_t c_type);
    void multiply_to_bf16(CudaStream& cs, const Gemm& r, const void* a, const void* b, cudaDataType_t type,
                          std::uint16_t* c, const float* bias = nullptr);
    // Vectors of `vector_bytes` the staging holds (compute's alone): the
    // rows of an fp32 A rounded for a bf16 B, the columns of an fp32 B for
    // a bf16 A, or fp32 rows of a bf16 C (multiply_to_bf16).
    u64 staged_vectors(CudaStream& cs, u64 vector_bytes, const char* what, const char* operand);
    // A and B of `type`, C of `c_type`; with an epilogue, false (nothing
    // enqueued) where cuBLASLt has no algorithm for it or refuses the call.
    bool matmul(CudaStream& cs, const Gemm& g, const void* a, const void* b, void* c, cudaDataType_t type,
                cudaDataType_t c_type, const Epilogue& ep = {});

    Plan make_plan(const Gemm& g, std::uint32_t al_a, std::uint32_t al_b, std::uint32_t al_c, cudaDataType_t type,
                   cudaDataType_t c_type, std::size_t ws_bytes, const Epilogue& ep);

    const int gpu_;
    unsigned sms_ = 0;
    const Lt* lt_ = nullptr;
    cublasLtHandle_t lt_handle_ = nullptr;
    cudaStream_t fill_stream_ = nullptr;
    std::array<std::unique_ptr<CudaStream>, 4> streams_;  // by StreamKind; [0] compute
    mem::Block workspace_;
    mem::Block bf16_staging_;  // compute's: the fp32 operand of a bf16 one, rounded to bf16
    std::mutex plans_mu_;
    std::map<PlanKey, Plan> plans_;
};

}  // namespace zinf::device::cuda_backend
