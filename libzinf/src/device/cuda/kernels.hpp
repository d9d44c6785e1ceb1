// The cuda backend's kernels: the bodies kernels.def declares (cuda::<name>),
// each in the .cu file of its kind of op beside this header (linear.cu,
// embedding.cu, norms.cu, elementwise.cu, attention.cu, loss.cu,
// optimizer.cu; gemm's in gemm.cpp and attention's forward and backward in
// attention_gemm.cpp, cuBLASLt being host code), called by
// CudaDevice (backend.hpp) once checks.cpp has checked every span against the
// shape and every element type. A body launches its kernels on l.stream;
// CudaDevice checks the launch after it. This header includes only the
// runtime API's types and the light kernels.hpp, so that nvcc reads no other
// zinf header (optimizer.cu alone reads optim.hpp).
//
// Bits: the .cu files a test pins to the cpu's bits are built with
// -fmad=false (no fused multiply-add), as the cpu kernels are built with
// -ffp-contract=off (the Makefile's NVCC_FMAD_FILES are the others:
// attention.cu, flash.cu); the element formulas are util/kernel_math.hpp's
// on both backends, and the reductions a test pins walk the cpu kernel's
// order (kernels.hpp there: dot and sum in eight lanes, sums over rows in
// row order), so bias, embedding, the norms' weight gradients, GELU,
// SwiGLU, RoPE, residual, casts and AdamW give the cpu backend's bits on the
// same inputs. The norms' rows (a warp's shuffle tree), expf (the attention
// softmax, cross-entropy), the cross-entropy's double sum (a tree over the
// block, not four lanes), attention (cuBLASLt's GEMMs sum in their own
// order) and flash attention differ by rounding. No kernel uses atomics on
// data: every sum has one order.
#pragma once

#include <zinf/kernels.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zinf::device::cuda_backend {
class CudaStream;
class CudaDevice;
}  // namespace zinf::device::cuda_backend

namespace zinf::device::cuda {

// What a body runs with: the stream its kernels go on, and the backend's
// state for the bodies that need it (incomplete here: the .cu files see none
// of it). CudaDevice has bound its GPU to the calling thread.
struct Launch {
    cudaStream_t stream;
    cuda_backend::CudaStream* owner;   // check_ids's ticket, scratch and record
    cuda_backend::CudaDevice* device;  // gemm's cuBLASLt plans, workspace and staging
    float* sums;                       // the stream's column-sum partials (common.cuh's column_sums)
    u64 sums_floats;                   // how many floats `sums` holds
};

// Every kernel's body, as kernels.def lists them.
#define ZINF_KERNEL(name, ...) void name(const Launch& l, ZINF_KERNEL_PARAMS(__VA_ARGS__));
#include <zinf/kernels.def>

// ids (n), in rows of T, checked against [0, V) before a kernel reads them:
// the first bad one is reported, with the cpu backend's DataError, by the
// stream's next synchronize (stream.cpp). kind: 0 tokens (embedding), 1
// targets (cross-entropy, T 1). The kernels skip a bad id's row.
inline constexpr int kTokens = 0, kTargets = 1;
void check_ids(const Launch& l, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind);

// ---- the streams' plumbing (signals.cu) ----------------------------------------
// A bad token or target id found by a kernel: the first (lowest index) of the
// first launch that found one, kept in mapped host memory for the host to
// read after a synchronize. `scratch` is device memory the check reduces in
// (atomicMin over the bad indices: the result is the same whatever order).
struct IdRecord {
    volatile int set;        // 0 until a bad id is found
    volatile int kind;       // kTokens or kTargets
    volatile long long value;
    volatile unsigned long long index;   // into the (B,T) or (N) ids
    volatile unsigned long long ticket;  // the stream's op count at the launch
    volatile unsigned long long T, V;    // the ids' row length (1 for targets), the vocabulary
};
struct IdScratch {
    unsigned long long first_bad;  // ~0 = none
};
// check_ids's kernels: the first bad one lands in `rec` unless `rec` already
// holds one. scratch must hold ~0 (it is left so).
void find_bad_ids(cudaStream_t s, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind, u64 ticket,
                  IdScratch* scratch, IdRecord* rec);
void reset_scratch(cudaStream_t s, IdScratch* scratch);

// The stream stands until *flag - value >= 0 (as int32: wraps), polled by one
// thread (mapped host memory the host() worker writes).
void wait_flag(cudaStream_t s, const unsigned* flag, unsigned value);

// ---- GEMM's helpers (linear.cu, elementwise.cu), for gemm.cpp ----------------------
// C = beta * C for `batch` (m,n) matrices of row stride ldc (beta 0 writes 0).
void scale_matrix(cudaStream_t s, float* c, u64 m, u64 n, u64 ldc, u64 batch, u64 stride_c, float beta);
// dst (rows, cols; row stride ld_dst, 0: packed) = src's rows (row stride
// ld_src) rounded to bf16.
void to_bf16_rows(cudaStream_t s, std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src,
                  u64 ld_dst = 0);
void to_bf16(cudaStream_t s, std::uint16_t* dst, const float* src, u64 n);
// The epilogues' stand-ins where cuBLASLt has none for a GEMM: c (m rows of
// n at row stride ld, fp32 or bf16) += bias (n) on every row; dbias (cols)
// += the column sums of x (rows, cols) at row stride ld (bias_backward's
// order: the cpu's bits).
void bias_rows(cudaStream_t s, void* c, bool bf16, u64 ld, const float* bias, u64 m, u64 n);
void bias_grad_rows(const Launch& l, float* dbias, const float* x, u64 ld, u64 rows, u64 cols);

// ---- attention's helpers (attention.cu), for attention_gemm.cpp ---------------------
// In place over the scores att (rows, T), row r's query position r % T: a =
// softmax(scale * a) over positions 0..r % T, zero above (the causal mask).
void softmax_causal(cudaStream_t s, float* att, u64 rows, u64 T, float scale);
// In place over datt (rows, T), dP on entry: dS = a * (dP - sum a dP) over
// positions 0..r % T, zero above; att fp32 or bf16.
void softmax_causal_backward(cudaStream_t s, float* datt, ConstView att, u64 rows, u64 T);
// dst (rows, T) = att (fp32 or bf16) on and below each row's diagonal, zero above.
void causal_copy(cudaStream_t s, float* dst, ConstView att, u64 rows, u64 T);
// dst (rows, cols) of row stride ld_dst = bf16 src of row stride ld_src, widened.
void widen_rows(cudaStream_t s, float* dst, u64 ld_dst, const std::uint16_t* src, u64 ld_src, u64 rows, u64 cols);

// Loads every kernel of each file now (cudaFuncGetAttributes), not at its
// first launch: with CUDA's lazy loading a first launch may wait for the
// device to be idle, which a stream held by a host job (wait_flag or the
// driver's wait) would deny. The first error, or cudaSuccess.
cudaError_t preload_signals();
cudaError_t preload_linear();
cudaError_t preload_embedding();
cudaError_t preload_norms();
cudaError_t preload_elementwise();
cudaError_t preload_attention();
cudaError_t preload_flash();
cudaError_t preload_loss();
cudaError_t preload_optimizer();

}  // namespace zinf::device::cuda
