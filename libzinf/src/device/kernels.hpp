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

#include "../util/kernel_math.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// One GEMM (batch 1, fp32, every leading dimension given) on the calling
// thread: OpenBLAS's cblas_sgemm (set to one thread), or the portable loop.
// Attention's tasks call it, each from its own thread, so that every product
// is the same call whatever the thread count.
void gemm_serial(const Gemm& g, const float* a, const float* b, float* c);

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

// out_k[c] += the column sum over rows r < N of term(r, c)[k], for k < K
// outputs and c < C, in kernel_math::kSumRows's order (chunks of rows, each
// summed in row order; the chunks' sums in chunk order): the order the cuda
// kernels sum in, for any thread count. Tasks are (chunk, column block);
// below parallel_min elements, on the calling thread. term(r, c, v) writes
// v[0..K).
template <int K, class F>
void column_sums(float* const (&out)[K], u64 N, u64 C, [[maybe_unused]] u64 parallel_min, F term) {
    if (!N || !C) return;
    const u64 R = kernel_math::kSumRows, chunks = (N + R - 1) / R, blocks = column_blocks(C);
    std::vector<float> part(K * chunks * C);  // [k][chunk][c]
#pragma omp parallel for schedule(static) if (N * C >= parallel_min)
    for (u64 task = 0; task < chunks * blocks; ++task) {
        const u64 i = task / blocks, c0 = task % blocks * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
        float acc[K][kColumnBlock] = {};
        float v[K];
        for (u64 r = i * R; r < std::min(N, (i + 1) * R); ++r)
            for (u64 c = c0; c < c1; ++c) {
                term(r, c, v);
                for (int k = 0; k < K; ++k) acc[k][c - c0] += v[k];
            }
        for (int k = 0; k < K; ++k)
            for (u64 c = c0; c < c1; ++c) part[(k * chunks + i) * C + c] = acc[k][c - c0];
    }
#pragma omp parallel for schedule(static) if (N * C >= parallel_min)
    for (u64 blk = 0; blk < blocks; ++blk)
        for (int k = 0; k < K; ++k)
            for (u64 c = blk * kColumnBlock; c < std::min(C, (blk + 1) * kColumnBlock); ++c) {
                float total = 0;
                for (u64 i = 0; i < chunks; ++i) total += part[(k * chunks + i) * C + c];
                out[k][c] += total;
            }
}

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
