// The cuda backend's GEMMs (backend.hpp): cuBLASLt, loaded at run time, one
// plan per shape so the same shape always runs the same algorithm; and the
// GEMM rate measure_gemm_flops reports.
#include "backend.hpp"

#include <dlfcn.h>

#include <random>

namespace zinf::device {
namespace cuda_backend {

namespace {

template <class F>
void sym(void* h, const char* name, F& f) {
    f = reinterpret_cast<F>(dlsym(h, name));
    if (!f) throw UsageError(std::string("device backend cuda: cuBLASLt has no ") + name + " (zinf needs CUDA 13's)");
}

}  // namespace

const Lt& Lt::get() {
    static const Lt lt = open();
    return lt;
}

Lt Lt::open() {
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

namespace {

// The largest power of two (up to 256) that divides a pointer and, in a
// batch, the byte stride between its matrices (every matrix's alignment):
// cuBLASLt's heuristics are told it.
std::uint32_t alignment(const void* p, std::uint64_t stride_bytes = 0) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t al = 256;
    while (al > 1 && (a % al || stride_bytes % al)) al /= 2;
    return al;
}

}  // namespace

// A GEMM with nothing to multiply: C empty, or k 0 (op(A) op(B) is all
// zeros: C = beta C, enqueued). Otherwise binds the device for the product.
bool CudaDevice::no_product(CudaStream& cs, const Gemm& r, std::span<float> c) {
    if (!r.batch || !r.m || !r.n) return true;
    bind();
    if (r.k) return false;
    cuda::scale_matrix(cs.native(), c.data(), r.m, r.n, r.ldc, r.batch, r.stride_c, r.beta);
    launched("scale_matrix");
    return true;
}

void CudaDevice::multiply(CudaStream& cs, const Gemm& r, ConstView a, ConstView b, View c) {
    if (no_product(cs, r, c.span<float>())) return;
    if (a.is_bf16()) return multiply_bf16a(cs, r, a.span<std::uint16_t>(), b, c.span<float>());
    if (b.is_bf16()) return multiply_bf16b(cs, r, a.span<float>(), b.span<std::uint16_t>(), c.span<float>());
    matmul(cs, r, a.data<float>(), b.data<float>(), c.data<float>(), CUDA_R_32F, CUDA_R_32F);
}

// An fp32 A by a bf16 B: cuBLASLt multiplies a bf16 B by a bf16 A only:
// op(A)'s rows (A's rows, or its columns when ta) are rounded to bf16 into
// the compute stream's staging, as many at a time as it holds, and each
// block of them is one bf16 x bf16 -> fp32 GEMM (CUBLAS_COMPUTE_32F) into its
// rows of C. The blocks depend on the shape alone: the same bits every run.
void CudaDevice::multiply_bf16b(CudaStream& cs, const Gemm& r, std::span<const float> a,
                                std::span<const std::uint16_t> b, std::span<float> c) {
    const u64 rows = staged_vectors(cs, r.k, "a bf16 B", "A");
    auto* staging = reinterpret_cast<std::uint16_t*>(bf16_staging_.data());
    for (u64 i0 = 0; i0 < r.m; i0 += rows) {
        Gemm g = r;
        g.m = std::min(rows, r.m - i0);
        if (r.ta) {  // A (k,m): its columns i0 .. i0+g.m, packed (k, g.m)
            g.lda = g.m;
            cuda::to_bf16_rows(cs.native(), staging, a.data() + i0, r.k, g.m, r.lda);
        } else {  // A (m,k): its rows i0 .. i0+g.m, packed (g.m, k)
            g.lda = r.k;
            cuda::to_bf16_rows(cs.native(), staging, a.data() + i0 * r.lda, g.m, r.k, r.lda);
        }
        launched("to_bf16_rows");
        matmul(cs, g, staging, b.data(), c.data() + i0 * r.ldc, CUDA_R_16BF, CUDA_R_32F);
    }
}

// The vectors of k elements (rows of A, columns of B) the compute stream's
// staging holds at once, for a GEMM of `what` rounding `operand` into it.
u64 CudaDevice::staged_vectors(CudaStream& cs, u64 k, const char* what, const char* operand) {
    if (&cs != streams_[0].get())
        throw InternalError(std::string("cuda: a GEMM of ") + what + " on the " + cs.name() + " stream (its " +
                            operand + " staging is compute's)");
    const u64 n = bf16_staging_.size() / (2 * k);
    if (!n)
        throw InternalError(std::string("cuda: a GEMM of ") + what + " with k=" + std::to_string(k) + " needs " +
                            format_size(2 * k) + " of " + operand + " staging a vector; the device kept " +
                            format_size(bf16_staging_.size()));
    return n;
}

// A bf16 A (an activation a block keeps bf16). With a bf16 B, one bf16 x
// bf16 -> fp32 GEMM (CUBLAS_COMPUTE_32F). An fp32 B (a gradient, in a
// weight's gradient x^T dy) is rounded to bf16 into the compute stream's
// staging a block of C's columns at a time (B's columns, or its rows when
// tb), each block one such GEMM into its columns of C; the blocks depend on
// the shape alone.
void CudaDevice::multiply_bf16a(CudaStream& cs, const Gemm& r, std::span<const std::uint16_t> a, ConstView b,
                                std::span<float> c) {
    if (b.is_bf16()) return matmul(cs, r, a.data(), b.data<std::uint16_t>(), c.data(), CUDA_R_16BF, CUDA_R_32F);
    const u64 cols = staged_vectors(cs, r.k, "a bf16 A and an fp32 B", "B");
    auto* staging = reinterpret_cast<std::uint16_t*>(bf16_staging_.data());
    for (u64 j0 = 0; j0 < r.n; j0 += cols) {
        Gemm g = r;
        g.n = std::min(cols, r.n - j0);
        if (r.tb) {  // B (n,k): its rows j0 .. j0+g.n, packed (g.n, k)
            g.ldb = r.k;
            cuda::to_bf16_rows(cs.native(), staging, b.data<float>() + j0 * r.ldb, g.n, r.k, r.ldb);
        } else {  // B (k,n): its columns j0 .. j0+g.n, packed (k, g.n)
            g.ldb = g.n;
            cuda::to_bf16_rows(cs.native(), staging, b.data<float>() + j0, r.k, g.n, r.ldb);
        }
        launched("to_bf16_rows");
        matmul(cs, g, a.data(), staging, c.data() + j0, CUDA_R_16BF, CUDA_R_32F);
    }
}

void CudaDevice::matmul(CudaStream& cs, const Gemm& g, const void* a, const void* b, void* c, cudaDataType_t type,
                        cudaDataType_t c_type) {
    const bool on_compute = &cs == streams_[0].get();
    void* ws = on_compute && workspace_ ? workspace_.data() : nullptr;
    const std::size_t ws_bytes = ws ? workspace_.size() : 0;
    const u64 elem = type == CUDA_R_16BF ? 2 : 4, c_elem = c_type == CUDA_R_16BF ? 2 : 4, batched = g.batch > 1;
    const std::uint32_t al_a = alignment(a, batched * g.stride_a * elem),
                        al_b = alignment(b, batched * g.stride_b * elem),
                        al_c = alignment(c, batched * g.stride_c * c_elem);
    const PlanKey key{g.ta,  g.tb,    g.m,        g.n,        g.k,        g.lda, g.ldb, g.ldc, g.batch,
                      g.stride_a, g.stride_b, g.stride_c, al_a, al_b, al_c, static_cast<int>(type),
                      static_cast<int>(c_type), static_cast<int>(compute_type(g, type)), ws != nullptr};
    const Plan* plan = nullptr;
    {
        std::lock_guard lk(plans_mu_);
        auto it = plans_.find(key);
        if (it == plans_.end())
            it = plans_.emplace(key, make_plan(g, al_a, al_b, al_c, type, c_type, ws_bytes)).first;
        plan = &it->second;
    }
    const float alpha = g.alpha, beta = g.beta;
    // cuBLASLt's A is our B, its B our A (see multiply()).
    lt_->check(lt_->Matmul(lt_handle_, plan->op, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c, plan->c,
                           &plan->algo, ws, ws_bytes, cs.native()),
               "cublasLtMatmul");
}

CudaDevice::Plan CudaDevice::make_plan(const Gemm& g, std::uint32_t al_a, std::uint32_t al_b, std::uint32_t al_c,
                                       cudaDataType_t type, cudaDataType_t c_type, std::size_t ws_bytes) {
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
        auto layout = [&](cublasLtMatrixLayout_t& l, u64 rows, u64 cols, u64 ld, u64 stride, cudaDataType_t t) {
            lt.check(lt.MatrixLayoutCreate(&l, t, rows, cols, static_cast<std::int64_t>(ld)),
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
        layout(p.a, b_rows, b_cols, g.ldb, g.stride_b, type);
        layout(p.b, a_rows, a_cols, g.lda, g.stride_a, type);
        layout(p.c, g.n, g.m, g.ldc, g.stride_c, c_type);

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

double CudaDevice::gemm_rate(u64 n, unsigned reps, bool bf16) {
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
    matmul(cs, g, a.data(), b.data(), c.data(), type, type);  // warm-up (and the heuristic)
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    check(cudaEventCreate(&t0), "cudaEventCreate");
    check(cudaEventCreate(&t1), "cudaEventCreate");
    check(cudaEventRecord(t0, cs.native()), "cudaEventRecord");
    for (unsigned r = 0; r < reps; ++r) matmul(cs, g, a.data(), b.data(), c.data(), type, type);
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
}  // namespace cuda_backend

// gemm's body (kernels.hpp): host code, cuBLASLt's plans being the device's.
void cuda::gemm(const Launch& l, Gemm g, ConstView a, ConstView b, View c) { l.device->multiply(*l.owner, g, a, b, c); }

double cuda_gemm_flops(Device& dev, std::uint64_t n, unsigned reps, bool bf16) {
    auto* cuda = dynamic_cast<cuda_backend::CudaDevice*>(&dev);
    if (!cuda) throw InternalError("cuda_gemm_flops: not a cuda device");
    return cuda->gemm_rate(n, reps, bf16);
}

}  // namespace zinf::device
