// The cpu backend's linear kernels (kernels.def): GEMM through OpenBLAS's
// cblas_sgemm, one call per batch entry (Debian 12's OpenBLAS has no strided
// batch), or without OpenBLAS a plain OpenMP loop over C's rows, so that the
// build works everywhere; and the bias. bf16 inputs (kernels.hpp's Precision)
// are rounded into scratch first, then multiplied the same way: the
// reference the cuda backend's bf16 GEMMs are held to.
#include "kernels.hpp"

#include <zinf/util.hpp>

#if ZINF_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include <omp.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace zinf::device::cpu {

namespace {
// op(A) is (m,k): stored (m,k), or (k,m) when ta.
u64 rows_a(const Gemm& g) { return g.ta ? g.k : g.m; }
u64 cols_a(const Gemm& g) { return g.ta ? g.m : g.k; }
u64 rows_b(const Gemm& g) { return g.tb ? g.n : g.k; }
u64 cols_b(const Gemm& g) { return g.tb ? g.k : g.n; }

u64 extent(u64 batch, u64 stride, u64 rows, u64 ld, u64 cols) {
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

void check_ld(const char* name, u64 ld, u64 cols) {
    if (ld < cols)
        throw InternalError(std::string("device: gemm: ") + name + " " + std::to_string(ld) +
                            " is less than the stored row length " + std::to_string(cols));
}

// C = beta * C, with beta 0 writing zeros (BLAS: C is not read then).
void scale_c(const Gemm& g, float* c) {
    for (u64 e = 0; e < g.batch; ++e)
        for (u64 i = 0; i < g.m; ++i) {
            float* row = c + e * g.stride_c + i * g.ldc;
            for (u64 j = 0; j < g.n; ++j) row[j] = g.beta == 0 ? 0.0f : g.beta * row[j];
        }
}

#if !ZINF_HAVE_OPENBLAS
// One product: C's rows shared over the threads; each row accumulates
// alpha-free sums over p in order, B's rows contiguous (op(B) packed first
// when it is stored transposed).
void gemm_portable(const Gemm& g, const float* a, const float* b, float* c) {
    std::vector<float> packed;
    const float* bk = b;  // op(B) as (k,n) rows of length ldbk
    u64 ldbk = g.ldb;
    if (g.tb) {
        packed.resize(g.k * g.n);
        for (u64 j = 0; j < g.n; ++j)
            for (u64 p = 0; p < g.k; ++p) packed[p * g.n + j] = b[j * g.ldb + p];
        bk = packed.data();
        ldbk = g.n;
    }
#pragma omp parallel if (g.m * g.n * g.k >= kParallelMin)
    {
        std::vector<float> acc(g.n);
#pragma omp for schedule(static)
        for (u64 i = 0; i < g.m; ++i) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (u64 p = 0; p < g.k; ++p) {
                const float aip = g.ta ? a[p * g.lda + i] : a[i * g.lda + p];
                const float* brow = bk + p * ldbk;
                for (u64 j = 0; j < g.n; ++j) acc[j] += aip * brow[j];
            }
            float* crow = c + i * g.ldc;
            if (g.beta == 0)
                for (u64 j = 0; j < g.n; ++j) crow[j] = g.alpha * acc[j];
            else
                for (u64 j = 0; j < g.n; ++j) crow[j] = g.alpha * acc[j] + g.beta * crow[j];
        }
    }
}
#endif
}  // namespace

Gemm resolve(const Gemm& g) {
    Gemm r = g;
    if (r.lda == 0) r.lda = cols_a(r);
    if (r.ldb == 0) r.ldb = cols_b(r);
    if (r.ldc == 0) r.ldc = r.n;
    check_ld("lda", r.lda, cols_a(r));
    check_ld("ldb", r.ldb, cols_b(r));
    check_ld("ldc", r.ldc, r.n);
    if (r.stride_a == 0) r.stride_a = rows_a(r) * r.lda;
    if (r.stride_b == 0) r.stride_b = rows_b(r) * r.ldb;
    if (r.stride_c == 0) r.stride_c = r.m * r.ldc;
    // BLAS takes its sizes as int.
    for (u64 v : {r.m, r.n, r.k, r.lda, r.ldb, r.ldc})
        if (v > static_cast<u64>(std::numeric_limits<int>::max()))
            throw InternalError("device: gemm: a size or leading dimension (" + std::to_string(v) +
                                ") is past what BLAS takes (2^31 - 1)");
    return r;
}

u64 gemm_extent_a(const Gemm& g) {
    if (!g.batch || !g.m || !g.n || !g.k) return 0;
    return extent(g.batch, g.stride_a, rows_a(g), g.lda, cols_a(g));
}
u64 gemm_extent_b(const Gemm& g) {
    if (!g.batch || !g.m || !g.n || !g.k) return 0;
    return extent(g.batch, g.stride_b, rows_b(g), g.ldb, cols_b(g));
}
u64 gemm_extent_c(const Gemm& g) {
    if (!g.batch || !g.m || !g.n) return 0;
    return extent(g.batch, g.stride_c, g.m, g.ldc, g.n);
}

#if ZINF_HAVE_OPENBLAS
// OpenBLAS's own: the pool's stop, exported for its fork handler, not in
// cblas.h; weak, so a BLAS without it (OpenBLAS's OpenMP build) links too.
extern "C" [[gnu::weak]] int blas_thread_shutdown_(void);

namespace {
// Debian's OpenBLAS (the pthread build) starts a pool as it loads, a thread
// per core less one, and each spins on sched_yield for about 0.1 s before
// it sleeps. Every program links it and most never multiply (zinf-shard,
// zinf-plan), so each start ran a second, spinning thread. The device calls
// OpenBLAS one thread at a time (blas_split below), so OpenBLAS is set to
// one thread and its pool stopped as the program starts (this constructor
// runs after every library's) and again after blas_threaded, which alone
// asks for more (OpenBLAS starts the pool again itself then). Never
// openblas_set_num_threads alone after this: it restarts a stopped pool.
void blas_one_thread() {
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}
[[gnu::constructor]] void blas_one_thread_at_start() { blas_one_thread(); }

void blas(const Gemm& g, u64 m, u64 n, const float* a, const float* b, float* c) {
    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(g.k), g.alpha, a,
                static_cast<blasint>(g.lda), b, static_cast<blasint>(g.ldb), g.beta, c, static_cast<blasint>(g.ldc));
}

// One product over the OpenMP team, OpenBLAS single-threaded inside it: C
// cut into column blocks (or row blocks when it is tall), each computed by
// one call with the whole k. OpenBLAS's own threads would spin against the
// kernels' OpenMP team on the same cores (half the time went to spinning).
void blas_split(const Gemm& g, const float* a, const float* b, float* c) {
    const int team = omp_get_max_threads();
    if (team <= 1 || g.m * g.n * g.k < (u64{1} << 18)) return blas(g, g.m, g.n, a, b, c);
    const bool by_cols = g.n >= g.m;
    const u64 extent = by_cols ? g.n : g.m, unit = by_cols ? 16 : 4;
    const u64 pieces = std::min<u64>(static_cast<u64>(team), (extent + unit - 1) / unit);
    // Every piece a whole number of units, the pieces together covering all of C.
    const u64 per = ((extent + pieces - 1) / pieces + unit - 1) / unit * unit;
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(pieces))
    for (u64 p = 0; p < pieces; ++p) {
        const u64 lo = std::min(extent, p * per), hi = std::min(extent, lo + per);
        if (lo >= hi) continue;
        if (by_cols)  // C[:, lo:hi] = op(A) op(B)[:, lo:hi]
            blas(g, g.m, hi - lo, a, g.tb ? b + lo * g.ldb : b + lo, c + lo);
        else  // C[lo:hi, :] = op(A)[lo:hi, :] op(B)
            blas(g, hi - lo, g.n, g.ta ? a + lo : a + lo * g.lda, b, c + lo * g.ldc);
    }
}
}  // namespace

void blas_threaded(const Gemm& g, const float* a, const float* b, float* c, int threads) {
    openblas_set_num_threads(threads);
    blas(g, g.m, g.n, a, b, c);
    blas_one_thread();
}
#endif

namespace {
// out[i] = in[i] rounded to bf16 and widened back (exact), over the team.
void round_bf16(const float* in, float* out, u64 n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (u64 i = 0; i < n; ++i) out[i] = zinf::from_bf16(zinf::to_bf16(in[i]));
}

// Every element the shape reaches, as bf16 values (the strides and leading
// dimensions stay those of the spans), into scratch that each stream's
// worker keeps for its next GEMM: host memory beside the arena, as large as
// the largest operands (the head's V x C weight), held for the process's
// life.
std::vector<float>& b_scratch(const Gemm& g) {
    thread_local std::vector<float> rb;
    rb.resize(gemm_extent_b(g));
    return rb;
}

std::vector<float>& a_scratch(const Gemm& g) {
    thread_local std::vector<float> ra;
    ra.resize(gemm_extent_a(g));
    return ra;
}

// An operand's bf16 values in fp32: rounded where it is stored fp32,
// widened (exact) where it is stored bf16.
void bf16_values(const float* in, float* out, u64 n) { round_bf16(in, out, n); }
void bf16_values(const std::uint16_t* in, float* out, u64 n) { from_bf16(out, in, n); }

// Nothing to multiply: C untouched, or only scaled when k is 0 (op(A) op(B)
// is all zeros).
bool no_product(const Gemm& g, float* c) {
    if (!g.batch || !g.m || !g.n) return true;
    if (g.k) return false;
    scale_c(g, c);
    return true;
}

// The fp32 product of A's and B's bf16 values, each stored fp32 or bf16.
template <class A, class B>
void gemm_bf16_values(const Gemm& g, const A* a, const B* b, float* c) {
    if (no_product(g, c)) return;
    std::vector<float>& sb = b_scratch(g);
    bf16_values(b, sb.data(), sb.size());
    std::vector<float>& sa = a_scratch(g);
    bf16_values(a, sa.data(), sa.size());
    Gemm f = g;
    f.inputs = Precision::fp32;
    gemm(f, sa.data(), sb.data(), c);
}
}  // namespace

void gemm(const Gemm& g, const float* a, const float* b, float* c) {
    if (g.inputs == Precision::bf16) return gemm_bf16_values(g, a, b, c);
    if (no_product(g, c)) return;
    for (u64 e = 0; e < g.batch; ++e) {
        const float* ae = a + e * g.stride_a;
        const float* be = b + e * g.stride_b;
        float* ce = c + e * g.stride_c;
#if ZINF_HAVE_OPENBLAS
        blas_split(g, ae, be, ce);
#else
        gemm_portable(g, ae, be, ce);
#endif
    }
}

void gemm_serial(const Gemm& g, const float* a, const float* b, float* c) {
#if ZINF_HAVE_OPENBLAS
    blas(g, g.m, g.n, a, b, c);
#else
    gemm_portable(g, a, b, c);
#endif
}

namespace {
// An operand stored bf16 is multiplied as its bf16 values (its fp32 copy):
// the bits of the bf16-input GEMM of two fp32 operands holding them. C fp32.
void gemm_into(const Gemm& g, ConstView a, ConstView b, float* c) {
    if (!a.is_bf16() && !b.is_bf16()) return gemm(g, a.data<float>(), b.data<float>(), c);
    with_dtype(a.dtype(), [&](auto ea) {
        with_dtype(b.dtype(), [&](auto eb) {
            gemm_bf16_values(g, a.data<decltype(ea)>(), b.data<decltype(eb)>(), c);
        });
    });
}

// Where a GEMM's fp32 result lies: C itself, or for a bf16 C (beta 0, one
// product: checks.cpp) the stream worker's scratch, (m,n) packed.
struct Result {
    float* p;
    u64 ld;
};

Result product(const Gemm& g, ConstView a, ConstView b, View c) {
    if (!c.is_bf16()) {
        gemm_into(g, a, b, c.data<float>());
        return {c.data<float>(), g.ldc};
    }
    thread_local std::vector<float> scratch;
    scratch.resize(g.m * g.n);
    Gemm f = g;
    f.ldc = g.n;
    f.stride_c = g.m * g.n;
    gemm_into(f, a, b, scratch.data());
    return {scratch.data(), g.n};
}

// A bf16 C: the result's rows rounded into it (nearest even); an fp32 C holds it already.
void store(const Result& r, const Gemm& g, View c) {
    if (!c.is_bf16()) return;
    std::uint16_t* out = c.data<std::uint16_t>();
#pragma omp parallel for schedule(static) if (g.m * g.n >= kParallelMin)
    for (u64 i = 0; i < g.m; ++i)
        for (u64 j = 0; j < g.n; ++j) out[i * g.ldc + j] = zinf::to_bf16(r.p[i * r.ld + j]);
}

// ---------------------------------------------------------------------------
// A Linear's bias: added over the rows, and its gradient a column sum
// (kernels.hpp's column_sums: chunks of rows, then the chunks, in one order
// whatever the thread count).
void bias_rows(float* out, u64 ld, const float* bias, u64 N, u64 OC) {
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin)
    for (u64 r = 0; r < N; ++r) {
        float* row = out + r * ld;
        for (u64 o = 0; o < OC; ++o) row[o] += bias[o];
    }
}

// dbias[o] += the column sum of x (N, OC) of row stride ld (kernels.hpp's
// column_sums order: a column's sum is the same whatever the other columns).
void bias_grad(float* dbias, const float* x, u64 ld, u64 N, u64 OC) {
    float* const out[1] = {dbias};
    column_sums(out, N, OC, kParallelMin, [&](u64 r, u64 o, float* v) { v[0] = x[r * ld + o]; });
}

}  // namespace

void gemm(Gemm g, ConstView a, ConstView b, View c) { store(product(g, a, b, c), g, c); }

// The epilogues' references: the GEMM, then bias_add's loop; GELU as
// gelu_forward computes it from pre as stored; the bias's column sums as
// bias_backward's, then the GEMM (independent outputs: the order is not in
// the bits).
void gemm_bias(Gemm g, ConstView a, ConstView b, std::span<const float> bias, View c) {
    const Result r = product(g, a, b, c);
    bias_rows(r.p, r.ld, bias.data(), g.m, g.n);
    store(r, g, c);
}

void gemm_bias_gelu(Gemm g, ConstView a, ConstView b, std::span<const float> bias, View pre, View out) {
    gemm_bias(g, a, b, bias, pre);
    with_dtype(pre.dtype(), [&](auto e) {
        using E = decltype(e);
        if (g.ldc == g.n) return gelu_forward(View(out.data<E>(), g.m * g.n), ConstView(pre.data<E>(), g.m * g.n));
        for (u64 i = 0; i < g.m; ++i)
            gelu_forward(View(out.data<E>() + i * g.ldc, g.n), ConstView(pre.data<E>() + i * g.ldc, g.n));
    });
}

void gemm_dbias(Gemm g, ConstView a, ConstView b, View c, std::span<float> dbias, bool of_a) {
    if (of_a)
        bias_grad(dbias.data(), a.data<float>(), g.lda, g.k, g.m);
    else
        bias_grad(dbias.data(), b.data<float>(), g.ldb, g.k, g.n);
    gemm(g, a, b, c);
}

void bias_add(std::span<float> out, std::span<const float> bias, u64 N, u64 OC) {
    bias_rows(out.data(), OC, bias.data(), N, OC);
}

void bias_backward(std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) {
    bias_grad(dbias.data(), dout.data(), OC, N, OC);
}

}  // namespace zinf::device::cpu

namespace zinf::device {

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(std::string_view text) {
    for (Precision p : {Precision::fp32, Precision::bf16})
        if (text == precision_name(p)) return p;
    throw UsageError("precision '" + std::string(text) + "': expected fp32 or bf16");
}

}  // namespace zinf::device
