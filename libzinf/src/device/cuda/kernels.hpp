// The cuda backend's kernels, as plain launch functions over raw device
// pointers: built by nvcc in the .cu files beside this header, called from
// launch.cpp, gemm.cpp and stream.cpp (g++) once checks.cpp has checked every
// pointer's span against the shape; they check cudaGetLastError after each
// launch. This header includes only
// the runtime API's types, so the .cu files pull in no zinf header at all.
//
// Bits: the .cu files are built with -fmad=false (no fused multiply-add), as
// the cpu kernels are built with -ffp-contract=off, and every reduction walks
// the cpu kernel's order (kernels.hpp there: dot and sum in eight lanes, sums
// over rows in row order), so bias, embedding, layernorm, GELU, residual,
// casts, AdamW and attention's backward give the cpu backend's bits on the
// same inputs. Only exp (attention's softmax, cross-entropy) and the
// cross-entropy's double sum (a tree over the block, not four lanes) differ
// by rounding. No kernel uses atomics on data: every sum has one order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zinf::device::cuda {

using u64 = std::uint64_t;

// A bad token or target id found by a kernel: the first (lowest index) of the
// first launch that found one, kept in mapped host memory for the host to
// read after a synchronize. `scratch` is device memory the check reduces in
// (atomicMin over the bad indices: the result is the same whatever order).
struct IdRecord {
    volatile int set;        // 0 until a bad id is found
    volatile int kind;       // 0 token (embedding), 1 target (cross-entropy)
    volatile long long value;
    volatile unsigned long long index;   // into the (B,T) or (N) ids
    volatile unsigned long long ticket;  // the stream's op count at the launch
    volatile unsigned long long T, V;    // the ids' row length (1 for targets), the vocabulary
};
struct IdScratch {
    unsigned long long first_bad;  // ~0 = none
};
// Checks ids (n) against [0, V); the first bad one lands in `rec` unless
// `rec` already holds one. scratch must hold ~0 (it is left so).
void check_ids(cudaStream_t s, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind, u64 ticket,
               IdScratch* scratch, IdRecord* rec);
void reset_scratch(cudaStream_t s, IdScratch* scratch);

// Loads every kernel of each file now (cudaFuncGetAttributes), not at its
// first launch: with CUDA's lazy loading a first launch may wait for the
// device to be idle, which a stream held by a host job (wait_flag or the
// driver's wait) would deny. The first error, or cudaSuccess.
cudaError_t preload_elementwise();
cudaError_t preload_rows();
cudaError_t preload_softmax();

// The stream stands until *flag - value >= 0 (as int32: wraps), polled by one
// thread (mapped host memory the host() worker writes).
void wait_flag(cudaStream_t s, const unsigned* flag, unsigned value);

// ---- kernels: the cpu backend's semantics (device.hpp) ----------------------
// C = beta * C for `batch` (m,n) matrices of row stride ldc (beta 0 writes 0).
void scale_matrix(cudaStream_t s, float* c, u64 m, u64 n, u64 ldc, u64 batch, u64 stride_c, float beta);

void bias_add(cudaStream_t s, float* out, const float* bias, u64 N, u64 OC);
void bias_backward(cudaStream_t s, float* dbias, const float* dout, u64 N, u64 OC);

// wpe (dwpe) nullptr: no position table.
void embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       u64 B, u64 T, u64 C, u64 V);
void embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens, const std::uint16_t* wte,
                       const std::uint16_t* wpe, u64 B, u64 T, u64 C, u64 V);  // tables stored bf16
void embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        u64 B, u64 T, u64 C, u64 V);

void layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, u64 N, u64 C, float eps);
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, u64 N, u64 C);
// From inp stored bf16, widened as read.
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout,
                        const std::uint16_t* inp, const float* w, const float* mean, const float* rstd, u64 N, u64 C);

void gelu_forward(cudaStream_t s, float* out, const float* inp, u64 n);
void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, u64 n);
// From a bf16 inp (widened as read), the forward's out rounded to bf16.
void gelu_forward(cudaStream_t s, std::uint16_t* out, const std::uint16_t* inp, u64 n);
void gelu_backward(cudaStream_t s, float* dinp, const std::uint16_t* inp, const float* dout, u64 n);

void attention_forward(cudaStream_t s, float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH);
// From qkv and att stored bf16, widened as read.
void attention_backward(cudaStream_t s, float* dqkv, float* datt, const float* dout, const std::uint16_t* qkv,
                        const std::uint16_t* att, u64 B, u64 T, u64 C, u64 NH);
void attention_backward(cudaStream_t s, float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, u64 B, u64 T, u64 C, u64 NH);
void attention_decode(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 T,
                      u64 C, u64 NH);

// Rows whose target is out of range are left untouched (check_ids reports them).
void crossentropy_forward_backward(cudaStream_t s, float* losses, float* logits, const std::int32_t* targets,
                                   float dloss, u64 N, u64 V);
void crossentropy_forward(cudaStream_t s, float* losses, const float* logits, const std::int32_t* targets, u64 N,
                          u64 V);

void residual_forward(cudaStream_t s, float* out, const float* a, const float* b, u64 n);
void accumulate(cudaStream_t s, float* acc, const float* x, u64 n);
void to_bf16(cudaStream_t s, std::uint16_t* dst, const float* src, u64 n);
// dst (rows, cols) packed = src's rows (row stride ld_src) rounded to bf16.
void to_bf16_rows(cudaStream_t s, std::uint16_t* dst, const float* src, u64 rows, u64 cols, u64 ld_src);
void from_bf16(cudaStream_t s, float* dst, const std::uint16_t* src, u64 n);

// optim.hpp's Scalars and Update, field for field, without its header.
struct AdamScalars {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, decay, step_size;
};
struct AdamPtrs {
    float* w;
    float* m;
    float* v;
    const float* g32;  // one of g32, g16
    const std::uint16_t* g16;
    float* p32;  // at most one of p32, p16
    std::uint16_t* p16;
};
void adamw(cudaStream_t s, const AdamPtrs& p, u64 n, const AdamScalars& k);

}  // namespace zinf::device::cuda
