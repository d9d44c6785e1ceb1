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

cudaDataType_t type_of(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
u64 bytes_of(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "DEFAULT";
    }
}

}  // namespace

// A GEMM with nothing to multiply: C empty, or k 0 (op(A) op(B) is all
// zeros: C = beta C, enqueued; a bf16 C, beta 0, zeroed). Otherwise binds
// the device for the product.
bool CudaDevice::no_product(CudaStream& cs, const Gemm& r, View c) {
    if (!r.batch || !r.m || !r.n) return true;
    bind();
    if (r.k) return false;
    if (c.is_bf16()) {
        check(cudaMemset2DAsync(c.data<void>(), r.ldc * 2, 0, r.n * 2, r.m, cs.native()), "cudaMemset2DAsync");
        return true;
    }
    cuda::scale_matrix(cs.native(), c.data<float>(), r.m, r.n, r.ldc, r.batch, r.stride_c, r.beta);
    launched("scale_matrix");
    return true;
}

void CudaDevice::multiply(CudaStream& cs, const Gemm& r, ConstView a, ConstView b, View c) {
    if (no_product(cs, r, c)) return;
    const cudaDataType_t ct = type_of(c.dtype());
    if (a.is_bf16() && !b.is_bf16()) return multiply_bf16a(cs, r, a.span<std::uint16_t>(), b, c.data<void>(), ct);
    if (b.is_bf16() && !a.is_bf16())
        return multiply_bf16b(cs, r, a.span<float>(), b.span<std::uint16_t>(), c.data<void>(), ct);
    if (c.is_bf16() && !a.is_bf16())
        return multiply_to_bf16(cs, r, a.data<void>(), b.data<void>(), CUDA_R_32F, c.data<std::uint16_t>());
    matmul(cs, r, a.data<void>(), b.data<void>(), c.data<void>(), type_of(a.dtype()), ct);
}

// An A and B of one type into a bf16 C, taken in fp32 a block of C's rows
// at a time in the compute stream's staging, `bias` (where given) added in
// fp32, then rounded into C: the cpu's bits, the product rounded once. For
// an fp32 A and B (the head's logits under bf16 activations over fp32
// parameters) cuBLASLt has no such GEMM (its table pairs an fp32 A and B
// with an fp32 D only); for bf16 ones, the bias's stand-in where cuBLASLt
// refuses its epilogue (a bf16 C rounded, then the bias added and rounded
// again, would be off the cpu's by a bf16 step). (A bf16 C takes beta 0
// and one product: checks.cpp.)
void CudaDevice::multiply_to_bf16(CudaStream& cs, const Gemm& r, const void* a, const void* b, cudaDataType_t type,
                                  std::uint16_t* c, const float* bias) {
    const u64 rows = staged_vectors(cs, 4 * r.n, "A and B into a bf16 C through fp32", "C");  // fp32 rows of C
    auto* staging = reinterpret_cast<float*>(bf16_staging_.data());
    for (u64 i0 = 0; i0 < r.m; i0 += rows) {
        Gemm g = r;
        g.m = std::min(rows, r.m - i0);
        g.ldc = r.n;
        g.beta = 0;
        // op(A)'s rows i0 .. i0+g.m: A's columns when ta (A is (k,m)), else its rows.
        const void* ai = static_cast<const char*>(a) + (r.ta ? i0 : i0 * r.lda) * bytes_of(type);
        matmul(cs, g, ai, b, staging, type, CUDA_R_32F);
        if (bias) {
            cuda::bias_rows(cs.native(), staging, false, r.n, bias, g.m, r.n);
            launched("bias_rows");
        }
        cuda::to_bf16_rows(cs.native(), c + i0 * r.ldc, staging, g.m, r.n, r.n, r.ldc);
        launched("to_bf16_rows");
    }
}

// An fp32 A by a bf16 B: cuBLASLt multiplies a bf16 B by a bf16 A only:
// op(A)'s rows (A's rows, or its columns when ta) are rounded to bf16 into
// the compute stream's staging, as many at a time as it holds, and each
// block of them is one bf16 x bf16 -> fp32 (or bf16) GEMM (CUBLAS_COMPUTE_32F)
// into its rows of C. The blocks depend on the shape alone: the same bits
// every run.
void CudaDevice::multiply_bf16b(CudaStream& cs, const Gemm& r, std::span<const float> a,
                                std::span<const std::uint16_t> b, void* c, cudaDataType_t c_type) {
    const u64 rows = staged_vectors(cs, 2 * r.k, "a bf16 B", "A");  // bf16 rows of op(A)
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
        matmul(cs, g, staging, b.data(), static_cast<char*>(c) + i0 * r.ldc * bytes_of(c_type), CUDA_R_16BF,
               c_type);
    }
}

// The vectors of k elements (rows of A, columns of B) the compute stream's
// staging holds at once, for a GEMM of `what` rounding `operand` into it.
u64 CudaDevice::staged_vectors(CudaStream& cs, u64 vector_bytes, const char* what, const char* operand) {
    if (&cs != streams_[0].get())
        throw InternalError(std::string("cuda: a GEMM of ") + what + " on the " + cs.name() + " stream (its " +
                            operand + " staging is compute's)");
    const u64 n = bf16_staging_.size() / vector_bytes;
    if (!n)
        throw InternalError(std::string("cuda: a GEMM of ") + what + " needs " + format_size(vector_bytes) + " of " +
                            operand + " staging a vector; the device kept " + format_size(bf16_staging_.size()));
    return n;
}

// A bf16 A (an activation a block keeps bf16). With a bf16 B, one bf16 x
// bf16 -> fp32 GEMM (CUBLAS_COMPUTE_32F). An fp32 B (a gradient, in a
// weight's gradient x^T dy) is rounded to bf16 into the compute stream's
// staging a block of C's columns at a time (B's columns, or its rows when
// tb), each block one such GEMM into its columns of C; the blocks depend on
// the shape alone.
void CudaDevice::multiply_bf16a(CudaStream& cs, const Gemm& r, std::span<const std::uint16_t> a, ConstView b, void* c,
                                cudaDataType_t c_type) {
    if (b.is_bf16()) {
        matmul(cs, r, a.data(), b.data<std::uint16_t>(), c, CUDA_R_16BF, c_type);
        return;
    }
    const u64 cols = staged_vectors(cs, 2 * r.k, "a bf16 A and an fp32 B", "B");  // bf16 columns of op(B)
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
        matmul(cs, g, a.data(), staging, static_cast<char*>(c) + j0 * bytes_of(c_type), CUDA_R_16BF, c_type);
    }
}

// ---- the epilogues ------------------------------------------------------------------
// Said once per shape and epilogue: cuBLASLt has no algorithm for it, so
// the GEMM and the separate kernel run instead.
namespace {
void stand_in(const Gemm& g, cublasLtEpilogue_t e, const std::string& why) {
    const std::string shape = std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
    log::warn_once(std::string("cuda epilogue ") + epilogue_name(e) + " " + shape,
                   std::string("cuda: cuBLASLt's ") + epilogue_name(e) + " epilogue for a GEMM of " + shape + ": " +
                       why + "; the GEMM and a separate kernel instead");
}
}  // namespace

void CudaDevice::multiply_bias(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, const float* bias,
                               View c) {
    CudaStream& cs = *l.owner;
    if (!r.m || !r.n) return;
    if (r.k && a.dtype() == b.dtype()) {
        const Epilogue ep{.kind = CUBLASLT_EPILOGUE_BIAS, .bias = bias};
        if (matmul(cs, r, a.data<void>(), b.data<void>(), c.data<void>(), type_of(a.dtype()), type_of(c.dtype()), ep))
            return;
    }
    if (c.is_bf16() && a.dtype() == b.dtype() && r.k)
        return multiply_to_bf16(cs, r, a.data<void>(), b.data<void>(), type_of(a.dtype()), c.data<std::uint16_t>(),
                                bias);
    // (A bf16 C of mixed operands is rounded twice: their staging holds
    // the rounded operand, with no room for an fp32 block of C.)
    multiply(cs, r, a, b, c);
    cuda::bias_rows(cs.native(), c.data<void>(), c.is_bf16(), r.ldc, bias, r.m, r.n);
    launched("bias_rows");
}

void CudaDevice::multiply_bias_gelu(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, const float* bias,
                                    View pre, View out) {
    CudaStream& cs = *l.owner;
    if (!r.m || !r.n) return;
    // cuBLASLt wants aux's row stride a multiple of 8.
    if (r.k && a.dtype() == b.dtype() && r.ldc % 8 == 0) {
        const Epilogue ep{.kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, .bias = bias, .aux = pre.data<void>(), .aux_ld = r.ldc};
        if (matmul(cs, r, a.data<void>(), b.data<void>(), out.data<void>(), type_of(a.dtype()), type_of(out.dtype()),
                   ep))
            return;
    }
    multiply_bias(l, r, a, b, bias, pre);
    with_dtype(pre.dtype(), [&](auto e) {
        using E = decltype(e);
        if (r.ldc == r.n) {
            cuda::gelu_forward(l, View(out.data<E>(), r.m * r.n), ConstView(pre.data<E>(), r.m * r.n));
            launched("gelu_forward");
            return;
        }
        for (u64 i = 0; i < r.m; ++i) {
            cuda::gelu_forward(l, View(out.data<E>() + i * r.ldc, r.n), ConstView(pre.data<E>() + i * r.ldc, r.n));
            launched("gelu_forward");
        }
    });
}

void CudaDevice::multiply_dbias(const cuda::Launch& l, const Gemm& r, ConstView a, ConstView b, View c, float* dbias,
                                bool of_a) {
    CudaStream& cs = *l.owner;
    const u64 cols = of_a ? r.m : r.n;
    const float* x = of_a ? a.data<float>() : b.data<float>();
    if (r.k && r.m && r.n && a.dtype() == b.dtype() && cols <= l.sums_floats) {
        // The epilogue writes the gradient (no +=): into the stream's
        // partials, then added (our B is cuBLASLt's A: BGRADA; our A its B).
        const Epilogue ep{.kind = of_a ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA, .bias = l.sums};
        if (matmul(cs, r, a.data<void>(), b.data<void>(), c.data<void>(), type_of(a.dtype()), CUDA_R_32F, ep)) {
            cuda::accumulate(l, std::span<float>(dbias, cols), std::span<const float>(l.sums, cols));
            launched("accumulate");
            return;
        }
    }
    bind();
    cuda::bias_grad_rows(l, dbias, x, of_a ? r.lda : r.ldb, r.k, cols);
    launched("bias_grad_rows");
    multiply(cs, r, a, b, c);
}

bool CudaDevice::matmul(CudaStream& cs, const Gemm& g, const void* a, const void* b, void* c, cudaDataType_t type,
                        cudaDataType_t c_type, const Epilogue& ep) {
    const bool on_compute = &cs == streams_[0].get();
    void* ws = on_compute && workspace_ ? workspace_.data() : nullptr;
    const std::size_t ws_bytes = ws ? workspace_.size() : 0;
    const u64 elem = bytes_of(type), c_elem = bytes_of(c_type), batched = g.batch > 1;
    const std::uint32_t al_a = alignment(a, batched * g.stride_a * elem),
                        al_b = alignment(b, batched * g.stride_b * elem),
                        al_c = alignment(c, batched * g.stride_c * c_elem);
    const bool epilogue = ep.kind != CUBLASLT_EPILOGUE_DEFAULT;
    const std::uint32_t al_bias = epilogue ? alignment(ep.bias) : 0, al_aux = epilogue ? alignment(ep.aux) : 0;
    const PlanKey key{g.ta,  g.tb,    g.m,        g.n,        g.k,        g.lda, g.ldb, g.ldc, g.batch,
                      g.stride_a, g.stride_b, g.stride_c, al_a, al_b, al_c, static_cast<int>(type),
                      static_cast<int>(c_type), static_cast<int>(compute_type(g, type)), ws != nullptr,
                      static_cast<int>(ep.kind), ep.aux_ld, al_bias, al_aux};
    const float alpha = g.alpha, beta = g.beta;
    std::unique_lock lk(plans_mu_);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
        Plan p;
        try {
            p = make_plan(g, al_a, al_b, al_c, type, c_type, ws_bytes, ep);
        } catch (const InternalError& e) {
            if (!epilogue) throw;  // a plain GEMM has no stand-in
            p.ok = false;
            stand_in(g, ep.kind, e.what());
        }
        it = plans_.emplace(key, p).first;
    }
    Plan& plan = it->second;
    if (!plan.ok) return false;
    if (!epilogue) {
        lk.unlock();
        // cuBLASLt's A is our B, its B our A (see multiply()).
        lt_->check(lt_->Matmul(lt_handle_, plan.op, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c, plan.c,
                               &plan.algo, ws, ws_bytes, cs.native()),
                   "cublasLtMatmul");
        return true;
    }
    // The plan's descriptor carries this call's pointers: set and used
    // under the lock, so that no other call's come between.
    lt_->check(lt_->MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof ep.bias),
               "set BIAS_POINTER");
    if (ep.aux)
        lt_->check(lt_->MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                               sizeof ep.aux),
                   "set EPILOGUE_AUX_POINTER");
    const cublasStatus_t st = lt_->Matmul(lt_handle_, plan.op, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c,
                                          plan.c, &plan.algo, ws, ws_bytes, cs.native());
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    // A failure that is not a refusal of the epilogue (a launch that failed,
    // an architecture mismatch) is the GEMM's error, not a reason to stand in.
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) lt_->check(st, "cublasLtMatmul");
    // Refused at the call (nothing enqueued): the stand-ins from now on.
    plan.ok = false;
    stand_in(g, ep.kind, std::string("cublasLtMatmul refused it (") + lt_->GetStatusString(st) + ")");
    return false;
}

CudaDevice::Plan CudaDevice::make_plan(const Gemm& g, std::uint32_t al_a, std::uint32_t al_b, std::uint32_t al_c,
                                       cudaDataType_t type, cudaDataType_t c_type, std::size_t ws_bytes,
                                       const Epilogue& ep) {
    const Lt& lt = *lt_;
    Plan p;
    try {
        lt.check(lt.MatmulDescCreate(&p.op, compute_type(g, type), CUDA_R_32F), "cublasLtMatmulDescCreate");
        const cublasOperation_t ta = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
        lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
        if (ep.kind != CUBLASLT_EPILOGUE_DEFAULT) {
            // The bias (or its gradient) fp32 whatever C is; aux of C's
            // type. The pointers are set here too: the heuristic reads
            // their alignment.
            const std::uint32_t kind = ep.kind;
            const std::int32_t bias_type = CUDA_R_32F;
            lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof kind),
                     "set EPILOGUE");
            lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof ep.bias),
                     "set BIAS_POINTER");
            lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                               sizeof bias_type),
                     "set BIAS_DATA_TYPE");
            if (ep.aux) {
                const auto aux_ld = static_cast<std::int64_t>(ep.aux_ld);
                const std::int32_t aux_type = c_type;
                lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                                   sizeof ep.aux),
                         "set EPILOGUE_AUX_POINTER");
                lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                         "set EPILOGUE_AUX_LD");
                lt.check(lt.MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                   sizeof aux_type),
                         "set EPILOGUE_AUX_DATA_TYPE");
            }
        }
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

// gemm's body and its epilogues' (kernels.hpp): host code, cuBLASLt's plans being the device's.
void cuda::gemm(const Launch& l, Gemm g, ConstView a, ConstView b, View c) { l.device->multiply(*l.owner, g, a, b, c); }
void cuda::gemm_bias(const Launch& l, Gemm g, ConstView a, ConstView b, std::span<const float> bias, View c) {
    l.device->multiply_bias(l, g, a, b, bias.data(), c);
}
void cuda::gemm_bias_gelu(const Launch& l, Gemm g, ConstView a, ConstView b, std::span<const float> bias, View pre,
                          View out) {
    l.device->multiply_bias_gelu(l, g, a, b, bias.data(), pre, out);
}
void cuda::gemm_dbias(const Launch& l, Gemm g, ConstView a, ConstView b, View c, std::span<float> dbias, bool of_a) {
    l.device->multiply_dbias(l, g, a, b, c, dbias.data(), of_a);
}

double cuda_gemm_flops(Device& dev, std::uint64_t n, unsigned reps, bool bf16) {
    auto* cuda = dynamic_cast<cuda_backend::CudaDevice*>(&dev);
    if (!cuda) throw InternalError("cuda_gemm_flops: not a cuda device");
    return cuda->gemm_rate(n, reps, bf16);
}

}  // namespace zinf::device
