// The cpu backend's kernels: plain functions over raw pointers, run on a
// stream's worker thread and threaded with OpenMP there (the worker has set
// its OpenMP thread count). The caller (cpu.cpp) has checked every span
// against the shape; what only the data can break (a token past the
// vocabulary) is checked here and thrown as DataError.
//
// Determinism: every reduction runs in one fixed order whatever the thread
// count. Sums over rows are split by columns (each thread owns a column range
// and walks the rows in order), attention's backward by (batch, head).
#pragma once

#include <zinf/device.hpp>

#include <cstddef>
#include <cstdint>

namespace zinf::device {

// The DataError a token (embedding, at batch row b, position t) or a target
// (cross-entropy, at row `row`) outside [0, V) gets, on every backend: one
// wording, so a run says the same whichever device found it.
DataError bad_token(std::int64_t v, std::uint64_t b, std::uint64_t t, std::uint64_t V);
DataError bad_target(std::int64_t v, std::uint64_t row, std::uint64_t V);

}  // namespace zinf::device

namespace zinf::device::cpu {

using u64 = std::uint64_t;

// device.hpp's Gemm with every 0 (packed ld, packed stride) resolved.
Gemm resolve(const Gemm& g);
// Elements A, B and C must hold for the resolved shape (0 when m, n or k is 0
// leaves that operand unread).
u64 gemm_extent_a(const Gemm& g);
u64 gemm_extent_b(const Gemm& g);
u64 gemm_extent_c(const Gemm& g);
// `g` resolved. OpenBLAS when the build has it, else a portable OpenMP loop.
void gemm(const Gemm& g, const float* a, const float* b, float* c);
// B stored bf16 (g.inputs bf16): A rounded and B widened into scratch,
// then gemm(): the bits of gemm() on B's fp32 copy.
void gemm(const Gemm& g, const float* a, const std::uint16_t* b, float* c);
// A stored bf16 (g.inputs bf16): A widened and B rounded (or widened, when
// stored bf16) into scratch, then gemm(): the bits of gemm() on A's fp32 copy.
void gemm(const Gemm& g, const std::uint16_t* a, const float* b, float* c);
void gemm(const Gemm& g, const std::uint16_t* a, const std::uint16_t* b, float* c);
#if ZINF_HAVE_OPENBLAS
// One cblas_sgemm on OpenBLAS's own `threads` threads (the peer --bench
// measures against); OpenBLAS goes back to one thread, its pool stopped.
void blas_threaded(const Gemm& g, const float* a, const float* b, float* c, int threads);
#endif

void bias_add(float* out, const float* bias, u64 N, u64 OC);
void bias_backward(float* dbias, const float* dout, u64 N, u64 OC);

// wpe (dwpe) nullptr: no position table.
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, u64 B, u64 T,
                       u64 C, u64 V);
// The same from tables stored bf16, widened as read.
void embedding_forward(float* out, const std::int32_t* tokens, const std::uint16_t* wte, const std::uint16_t* wpe,
                       u64 B, u64 T, u64 C, u64 V);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, u64 B, u64 T,
                        u64 C, u64 V);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       u64 N, u64 C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, u64 N, u64 C);
// From inp stored bf16, widened as read: the fp32 kernel's bits on its copy.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const std::uint16_t* inp,
                        const float* w, const float* mean, const float* rstd, u64 N, u64 C);

void gelu_forward(float* out, const float* inp, u64 n);
void gelu_backward(float* dinp, const float* inp, const float* dout, u64 n);
// From a bf16 inp, widened as read; the forward's out rounded to bf16.
void gelu_forward(std::uint16_t* out, const std::uint16_t* inp, u64 n);
void gelu_backward(float* dinp, const std::uint16_t* inp, const float* dout, u64 n);

void attention_forward(float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH);
// From qkv and att stored bf16, widened as read: the fp32 kernel's bits on their copies.
void attention_backward(float* dqkv, float* datt, const float* dout, const std::uint16_t* qkv, const std::uint16_t* att,
                        u64 B, u64 T, u64 C, u64 NH);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, u64 B,
                        u64 T, u64 C, u64 NH);
void attention_decode(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 C, u64 NH);

// logits (N,V) is overwritten with dloss * (softmax - onehot) by the first.
void crossentropy_forward_backward(float* losses, float* logits, const std::int32_t* targets, float dloss, u64 N,
                                   u64 V);
void crossentropy_forward(float* losses, const float* logits, const std::int32_t* targets, u64 N, u64 V);

// Row r's cols floats from src + r ld_src to dst + r ld_dst, on the calling
// thread (a memory-bound copy: one core's memcpy).
void copy_rows(float* dst, u64 ld_dst, const float* src, u64 ld_src, u64 rows, u64 cols);
void residual_forward(float* out, const float* a, const float* b, u64 n);
void accumulate(float* acc, const float* x, u64 n);
void to_bf16(std::uint16_t* dst, const float* src, u64 n);
void from_bf16(float* dst, const std::uint16_t* src, u64 n);

// ---------------------------------------------------------------------------
// Shared by the kernel files (compiled with the same flags, so one inline
// copy is the same code everywhere).

// Below this many elements a loop runs on one thread: a parallel region
// costs more than it saves.
inline constexpr u64 kParallelMin = 1 << 14;
// Sums over rows walk column blocks of this many floats, one block per task.
inline constexpr u64 kColumnBlock = 64;

// An element stored fp32 or bf16, read as fp32 (exact): kernels templated on
// the storage of what they read.
inline float widen(float x) { return x; }
inline float widen(std::uint16_t x) { return zinf::from_bf16(x); }
// n values as fp32: the row itself, or (bf16) widened into w.
inline const float* wide(const float* p, u64, float*) { return p; }
inline const float* wide(const std::uint16_t* p, u64 n, float* w) {
    for (u64 i = 0; i < n; ++i) w[i] = zinf::from_bf16(p[i]);
    return w;
}

// sum a[i] * b[i] in eight lanes (lane j takes i = j mod 8), the lanes added
// pairwise, then the tail: one fixed order, and a shape the vectoriser takes.
inline float dot(const float* a, const float* b, u64 n) {
    float acc[8] = {};
    u64 i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += a[i] * b[i];
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

// sum a[i], in the same order as dot.
inline float sum(const float* a, u64 n) {
    float acc[8] = {};
    u64 i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += a[i];
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

}  // namespace zinf::device::cpu
