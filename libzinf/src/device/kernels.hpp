// The cpu backend's kernels: the bodies kernels.def declares (cpu::<name>,
// one file per kind of op: gemm.cpp, embedding.cpp, norms.cpp,
// elementwise.cpp, attention.cpp, loss.cpp), run on a stream's worker thread
// and threaded with OpenMP there (the worker has set its OpenMP thread
// count). checks.cpp has checked every span against the shape and every
// element type; what only the data can break (a token past the vocabulary)
// is checked here and thrown as DataError.
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

// Every kernel's body, as kernels.def lists them.
#define ZINF_KERNEL(name, ...) void name(ZINF_KERNEL_PARAMS(__VA_ARGS__));
#include <zinf/kernels.def>

// ---------------------------------------------------------------------------
// GEMM's pieces (gemm.cpp), for checks.cpp, the cuda backend and --bench.
// device.hpp's Gemm with every 0 (packed ld, packed stride) resolved.
Gemm resolve(const Gemm& g);
// Elements A, B and C must hold for the resolved shape (0 when m, n or k is 0
// leaves that operand unread).
u64 gemm_extent_a(const Gemm& g);
u64 gemm_extent_b(const Gemm& g);
u64 gemm_extent_c(const Gemm& g);
// `g` resolved, A and B fp32. OpenBLAS when the build has it, else a
// portable OpenMP loop.
void gemm(const Gemm& g, const float* a, const float* b, float* c);
#if ZINF_HAVE_OPENBLAS
// One cblas_sgemm on OpenBLAS's own `threads` threads (the peer --bench
// measures against); OpenBLAS goes back to one thread, its pool stopped.
void blas_threaded(const Gemm& g, const float* a, const float* b, float* c, int threads);
#endif

// Row r's cols floats from src + r ld_src to dst + r ld_dst, on the calling
// thread (a memory-bound copy: one core's memcpy).
void copy_rows(float* dst, u64 ld_dst, const float* src, u64 ld_src, u64 rows, u64 cols);
// util's vectorised conversions over the team (elementwise.cpp).
void to_bf16(std::uint16_t* dst, const float* src, u64 n);
void from_bf16(float* dst, const std::uint16_t* src, u64 n);

// ---------------------------------------------------------------------------
// Shared by the kernel files (compiled with the same flags, so one inline
// copy is the same code everywhere).

// Below this many elements a loop runs on one thread: a parallel region
// costs more than it saves.
inline constexpr u64 kParallelMin = 1 << 14;
// RMSNorm and RoPE do a few flops an element: below this many elements a
// pass takes less than a parallel region's fork and end barrier, which on a
// loaded machine is a wait for a descheduled thread (BENCHMARKS.md, the Llama
// section: a smollm-135m step spent 63% of its samples in libgomp's wait), so
// they run on the calling thread. Each element and each column sum is
// computed the same way on one thread or many: the bits do not change.
inline constexpr u64 kLightParallelMin = u64{1} << 20;
// Sums over rows walk column blocks of this many floats, one block per task.
inline constexpr u64 kColumnBlock = 64;
inline u64 column_blocks(u64 C) { return (C + kColumnBlock - 1) / kColumnBlock; }

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
