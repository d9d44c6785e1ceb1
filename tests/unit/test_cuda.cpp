// Unit tests of the cuda device backend against the cpu backend, the
// reference: every kernel on the same random inputs (outputs poisoned with
// NaN first; "+=" outputs start from the same random values), GEMM in every
// transpose, padding, batch, alpha and beta case (fp32, and bf16 inputs
// within 1e-2); two cuda runs bitwise the
// same (backward kernels above all: no atomics); a bad token or target
// reported at synchronize with the cpu backend's message; host() jobs in
// order with kernels and copies, their errors at synchronize; copies both
// ways; the stall a wait measures. Each GPU case is skipped, with the
// reason, where there is no usable GPU (or no CUDA in the build).
//
// Without a GPU: the GPU's selection by --gpu and local rank, and what
// open() says when cuda cannot run.
//
// Tolerance (fp32, TF32 off): |cuda - cpu| <= 1e-5 * (|cpu| + mean |cpu|)
// per element: relative to the element, with the array's mean magnitude as
// the floor, so that an element near zero (a sum that cancels) is held to
// the precision of the terms it came from rather than to its own size. Most
// kernels are expected bitwise equal (cuda/kernels.hpp says which) and are
// checked so.
#define BOOST_TEST_MODULE cuda
#include "device_testing.hpp"

#include "../../libzinf/src/util/kernel_math.hpp"  // the column sums' chunk of rows

#include <zinf/comm.hpp>
#include <zinf/device.hpp>
#include <zinf/mem.hpp>
#include <zinf/model.hpp>
#include <zinf/optim.hpp>
#include <zinf/shard.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace zinf;
using namespace zinf::device;
using u64 = std::uint64_t;
using Vf = std::vector<float>;
using Vi = std::vector<std::int32_t>;
using V16 = std::vector<std::uint16_t>;
namespace utf = boost::unit_test;

namespace {

// NCCL, for the stream-ordered collectives: a GPU, libnccl.so.2, and MPI
// in the build (NCCL's id travels over it, even for one rank).
struct NcclPresent {
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        std::string why = cuda_unavailable();
        if (why.empty() && !comm::compiled(comm::Backend::mpi)) why = "built without MPI";
        if (why.empty() && !comm::usable(comm::Backend::nccl)) why = "libnccl.so.2 does not load";
        boost::test_tools::assertion_result r(why.empty());
        if (!r) r.message() << "NCCL cannot run here: " << why;
        return r;
    }
};

struct GpuPresent {
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        const std::string why = cuda_unavailable();
        boost::test_tools::assertion_result r(why.empty());
        if (!r) r.message() << "the cuda backend cannot run here: " << why;
        return r;
    }
};

using testing::fresh_seed;
using testing::randn;
using testing::random_tokens;
using testing::halves;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Host <-> device through the device's own copies, synchronized.
template <class T>
Array<T> up(Device& d, const std::vector<T>& h) {
    auto a = d.alloc<T>(h.size(), "test input");
    d.copy(d.compute(), std::as_writable_bytes(a.span()), std::as_bytes(std::span<const T>(h)));
    d.synchronize(d.compute());
    return a;
}
template <class T>
std::vector<T> down(Device& d, const Array<T>& a) {
    std::vector<T> h(a.size());
    d.synchronize(d.compute());
    d.copy(d.compute(), std::as_writable_bytes(std::span<T>(h)), std::as_bytes(a.span()));
    d.synchronize(d.compute());
    return h;
}
Array<float> poisoned(Device& d, std::size_t n) { return up(d, Vf(n, kNaN)); }

// The two backends side by side: run(fn) calls fn on each and gives back its
// named outputs.
using Outputs = std::map<std::string, Vf>;
struct Pair {
    std::unique_ptr<Device> cpu = open({.backend = "cpu", .memory_bytes = 512 * MiB});
    std::unique_ptr<Device> gpu = open({.backend = "cuda", .memory_bytes = 512 * MiB});

    std::pair<Outputs, Outputs> run(const std::function<Outputs(Device&)>& fn) { return {fn(*cpu), fn(*gpu)}; }
};

// The tolerance of the file's head (`tol` in place of its 1e-5: bf16's
// 1e-2 for GEMMs of bf16 inputs); bitwise when `exact`.
void expect_close(const Vf& got, const Vf& ref, const std::string& what, bool exact = false, double tol = 1e-5) {
    BOOST_REQUIRE_EQUAL(got.size(), ref.size());
    double mean = 0;
    for (float r : ref) mean += std::abs(double(r));
    mean /= std::max<std::size_t>(1, ref.size());
    std::size_t bad = 0, first = 0;
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double g = got[i], r = ref[i];
        bool ok;
        if (exact)
            ok = std::memcmp(&got[i], &ref[i], 4) == 0;
        else
            ok = std::isfinite(g) && std::abs(g - r) <= tol * (std::abs(r) + mean);
        if (!std::isfinite(r)) ok = std::memcmp(&got[i], &ref[i], 4) == 0 || (std::isnan(g) && std::isnan(r));
        if (!ok && bad++ == 0) first = i;
        if (std::isfinite(g) && std::isfinite(r)) worst = std::max(worst, std::abs(g - r) / (std::abs(r) + mean));
    }
    BOOST_TEST(bad == 0u, what << ": " << bad << " of " << ref.size() << " elements differ"
                               << (exact ? " (bitwise)" : "") << "; first at " << first << ": cuda " << got[first]
                               << ", cpu " << ref[first] << "; worst relative " << worst);
}

void expect_all(const std::pair<Outputs, Outputs>& r, const std::string& what, bool exact = false,
                double tol = 1e-5) {
    for (const auto& [name, ref] : r.first) expect_close(r.second.at(name), ref, what + " " + name, exact, tol);
}

// The outputs named in `bitwise` to the bit, the rest within the file's
// tolerance: the norms' rows (a warp's shuffle tree, not the cpu's eight
// lanes) and their column sums (the cpu's order).
void expect_split(const std::pair<Outputs, Outputs>& r, const std::string& what,
                  std::initializer_list<std::string> bitwise) {
    for (const auto& [name, ref] : r.first)
        expect_close(r.second.at(name), ref, what + " " + name,
                     std::find(bitwise.begin(), bitwise.end(), name) != bitwise.end());
}

// Two cuda runs of the same thing, bitwise.
void expect_same_bits(Device& d, const std::function<Outputs(Device&)>& fn, const std::string& what) {
    const Outputs a = fn(d), b = fn(d);
    for (const auto& [name, v] : a)
        BOOST_TEST(std::memcmp(v.data(), b.at(name).data(), v.size() * 4) == 0, what << " " << name
                                                                                   << ": two runs differ");
}

}  // namespace

// ---------------------------------------------------------------------------
// Without a GPU.

BOOST_AUTO_TEST_CASE(select_gpu_by_option_then_local_rank) {
    std::map<std::string, std::string> env;
    auto get = [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    };
    BOOST_TEST(select_gpu(-1, 4, get) == 0);  // no launcher
    BOOST_TEST(select_gpu(2, 4, get) == 2);
    env["MPI_LOCALRANKID"] = "3";
    BOOST_TEST(select_gpu(-1, 4, get) == 3);
    env["SLURM_LOCALID"] = "5";
    BOOST_TEST(select_gpu(-1, 4, get) == 1);  // Slurm's before MPICH's, modulo the count
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = "6";
    BOOST_TEST(select_gpu(-1, 4, get) == 2);  // Open MPI's first
    BOOST_TEST(select_gpu(1, 4, get) == 1);   // --gpu wins
    BOOST_TEST(select_gpu(-1, 1, get) == 0);

    std::string what = testing::what_of<UsageError>([&] { select_gpu(4, 4, get); }, "--gpu past the count");
    BOOST_TEST(testing::contains(what, "--gpu 4: there are 4 GPUs (0 to 3)"), what);
    what = testing::what_of<UsageError>([&] { select_gpu(1, 1, get); }, "--gpu 1 of 1");
    BOOST_TEST(testing::contains(what, "there is 1 GPU"), what);
    testing::what_of<UsageError>([&] { select_gpu(-1, 0, get); }, "no GPU");
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = "two";
    what = testing::what_of<UsageError>([&] { select_gpu(-1, 4, get); }, "a local rank that is no number");
    BOOST_TEST(testing::contains(what, "OMPI_COMM_WORLD_LOCAL_RANK='two'"), what);
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = "";  // set but empty: as unset
    BOOST_TEST(select_gpu(-1, 4, get) == 1);
}

// What open() gives for cuda and auto, GPU or not: each branch asserts.
BOOST_AUTO_TEST_CASE(open_cuda_says_why_it_cannot_run) {
    const std::string why = cuda_unavailable();
    const std::string said = why.empty() ? "a GPU is usable here: --device auto picks cuda" : "cuda_unavailable(): " + why;
    BOOST_TEST_MESSAGE(said);
    if (!why.empty()) {
        const std::string what =
            testing::what_of<UsageError>([] { open({.backend = "cuda"}); }, "cuda without a GPU");
        BOOST_TEST(testing::contains(what, "device backend 'cuda'"), what);
        BOOST_TEST(testing::contains(what, why), what);
        BOOST_TEST(open({.backend = "auto", .memory_bytes = 64 * MiB})->backend() == "cpu");
        try {
            open({.backend = "cuda"});
        } catch (const Error& e) {
            BOOST_TEST(e.exit_code() == exit_code::usage);
        }
    } else {
        auto d = open({.backend = "auto", .memory_bytes = 64 * MiB});
        BOOST_TEST(d->backend() == "cuda");
        BOOST_TEST(!d->host_addressable());
        BOOST_TEST(d->native(d->compute()) != nullptr);
        BOOST_TEST(d->arena().on_gpu());
    }
}

// ---------------------------------------------------------------------------
// On a GPU.

BOOST_AUTO_TEST_CASE(copies_both_ways_and_on_the_device, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("copies"));
    auto d = open({.backend = "cuda", .memory_bytes = 64 * MiB});
    const Vf h = randn(100'003, rng);
    auto a = up(*d, h), b = d->alloc<float>(h.size(), "b");
    BOOST_TEST(down(*d, b) == Vf(h.size(), 0.0f));  // alloc zero-fills
    d->copy(d->h2d(), std::as_writable_bytes(b.span()), std::as_bytes(a.span()));  // device to device
    d->synchronize(d->h2d());
    BOOST_TEST(down(*d, b) == h);
    d->zero(d->compute(), b.span().subspan(10, 20));
    const Vf z = down(*d, b);
    BOOST_TEST(z[9] == h[9]);
    BOOST_TEST(z[10] == 0.0f);
    BOOST_TEST(z[29] == 0.0f);
    BOOST_TEST(z[30] == h[30]);
    const std::string what = testing::what_of<InternalError>(
        [&] { d->copy(d->compute(), std::as_writable_bytes(b.span().first(5)), std::as_bytes(a.span())); },
        "short copy");
    BOOST_TEST(testing::contains(what, "copy"), what);
}

// A column block out of a wider matrix (cudaMemcpy2DAsync), the rest of dst untouched.
BOOST_AUTO_TEST_CASE(copy_rows_moves_a_column_block, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("copy_rows"));
    auto d = open({.backend = "cuda", .memory_bytes = 64 * MiB});
    const std::uint64_t rows = 37, wide = 53, lo = 11, cols = 19, narrow = 23;
    const Vf src = randn(rows * wide, rng), before = randn(rows * narrow, rng);
    auto a = up(*d, src), b = up(*d, before);
    d->copy_rows(d->compute(), b.span(), narrow, a.span().subspan(lo), wide, rows, cols);
    Vf want = before;
    for (std::uint64_t i = 0; i < rows; ++i)
        for (std::uint64_t j = 0; j < cols; ++j) want[i * narrow + j] = src[i * wide + lo + j];
    BOOST_TEST(down(*d, b) == want);
}

BOOST_AUTO_TEST_CASE(gemm_transposes_padding_batch_alpha_beta, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("gemm"));
    Pair p;
    struct Case {
        Gemm g;
        std::string what;
    };
    std::vector<Case> cases;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) cases.push_back({{.ta = ta, .tb = tb, .m = 37, .n = 53, .k = 29}, "plain"});
    cases.push_back({{.m = 64, .n = 96, .k = 128, .alpha = 0.5f, .beta = 0.75f}, "alpha beta"});
    cases.push_back({{.ta = true, .m = 20, .n = 30, .k = 40, .lda = 24, .ldb = 33, .ldc = 31}, "padded"});
    cases.push_back({{.tb = true, .m = 16, .n = 24, .k = 8, .batch = 5, .stride_a = 16 * 8 + 3,
                      .stride_b = 24 * 8 + 5, .stride_c = 16 * 24 + 7},
                     "batched"});
    cases.push_back({{.ta = true, .tb = true, .m = 33, .n = 17, .k = 65, .beta = 1, .batch = 3}, "batched, beta 1"});
    cases.push_back({{.m = 7, .n = 9, .k = 0, .beta = 0.5f}, "k = 0"});
    cases.push_back({{.m = 7, .n = 9, .k = 0}, "k = 0, beta 0"});
    cases.push_back({{.m = 256, .n = 768, .k = 192}, "large"});
    // Each again with bf16 inputs (cuBLASLt's bf16 tensor cores, fp32
    // accumulation) against the cpu backend's rounded inputs: bf16's tolerance.
    for (std::size_t i = 0, n = cases.size(); i < n; ++i) {
        Case c = cases[i];
        c.g.inputs = Precision::bf16;
        c.what = "bf16 inputs, " + c.what;
        cases.push_back(c);
    }
    for (const Case& c : cases) {
        const u64 ra = c.g.ta ? c.g.k : c.g.m, ca = c.g.ta ? c.g.m : c.g.k;
        const u64 rb = c.g.tb ? c.g.n : c.g.k, cb = c.g.tb ? c.g.k : c.g.n;
        const u64 lda = c.g.lda ? c.g.lda : ca, ldb = c.g.ldb ? c.g.ldb : cb, ldc = c.g.ldc ? c.g.ldc : c.g.n;
        const u64 sa = c.g.stride_a ? c.g.stride_a : ra * lda, sb = c.g.stride_b ? c.g.stride_b : rb * ldb;
        const u64 sc = c.g.stride_c ? c.g.stride_c : c.g.m * ldc;
        const Vf a = randn(std::max<u64>(1, (c.g.batch - 1) * sa + ra * lda), rng);
        const Vf b = randn(std::max<u64>(1, (c.g.batch - 1) * sb + rb * ldb), rng);
        const Vf c0 = randn((c.g.batch - 1) * sc + c.g.m * ldc, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto da = up(d, a), db = up(d, b);
            auto dc = up(d, c.g.beta == 0 ? Vf(c0.size(), kNaN) : c0);  // beta 0: C is not read
            d.gemm(d.compute(), c.g, da, db, dc);
            Vf out = down(d, dc);
            // Padding between rows and matrices is not written: compare only C's elements.
            Vf packed;
            for (u64 e = 0; e < c.g.batch; ++e)
                for (u64 i = 0; i < c.g.m; ++i)
                    for (u64 j = 0; j < c.g.n; ++j) packed.push_back(out[e * sc + i * ldc + j]);
            return {{"C", packed}};
        };
        const bool bf16 = c.g.inputs == Precision::bf16;
        expect_all(p.run(fn), std::string("gemm ") + c.what, false, bf16 ? 1e-2 : 1e-5);
        expect_same_bits(*p.gpu, fn, std::string("gemm ") + c.what);
    }
}

BOOST_AUTO_TEST_CASE(bias_embedding_residual_accumulate, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("bias embedding"));
    Pair p;
    const u64 B = 3, T = 17, C = 72, V = 101, N = B * T, OC = 200;
    Vi tok = random_tokens(B * T, V, rng);
    tok[5] = tok[9] = tok[40] = 7;  // repeated tokens sum in order
    const Vf wte = randn(V * C, rng), wpe = randn(T * C, rng), dout = randn(B * T * C, rng);
    const Vf dwte0 = randn(V * C, rng), dwpe0 = randn(T * C, rng);
    const Vf out0 = randn(N * OC, rng), bias = randn(OC, rng), dbias0 = randn(OC, rng), dout2 = randn(N * OC, rng);
    const Vf xa = randn(N * C, rng), xb = randn(N * C, rng);
    auto embedding = [&](Device& d) -> Outputs {
        auto out = poisoned(d, B * T * C);
        auto dt = up(d, tok);
        auto te = up(d, wte), pe = up(d, wpe), go = up(d, dout);
        auto dte = up(d, dwte0), dpe = up(d, dwpe0);
        d.embedding_forward(d.compute(), out, dt, te, pe, B, T, C, V);
        d.embedding_backward(d.compute(), dte, dpe, go, dt, B, T, C, V);
        return {{"out", down(d, out)}, {"dwte", down(d, dte)}, {"dwpe", down(d, dpe)}};
    };
    auto bias_fn = [&](Device& d) -> Outputs {
        auto o = up(d, out0), bi = up(d, bias), db = up(d, dbias0), go = up(d, dout2);
        d.bias_add(d.compute(), o, bi, N, OC);
        d.bias_backward(d.compute(), db, go, N, OC);
        return {{"out", down(d, o)}, {"dbias", down(d, db)}};
    };
    auto residual = [&](Device& d) -> Outputs {
        auto o = poisoned(d, N * C), a = up(d, xa), b = up(d, xb);
        d.residual_forward(d.compute(), o, a, b);
        d.accumulate(d.compute(), a, b);
        return {{"residual", down(d, o)}, {"accumulate", down(d, a)}};
    };
    // The same order of additions as the cpu kernels (cuda/kernels.hpp): bitwise.
    expect_all(p.run(embedding), "embedding", true);
    expect_all(p.run(bias_fn), "bias", true);
    {
        // More chunks of rows than one pass of the stream's partials holds
        // (CudaStream::kSumFloats): the columns in two slabs, the bits still
        // the cpu's, and the same on two runs.
        const u64 rows = 600 * kernel_math::kSumRows, cols = 520;
        const Vf g = randn(rows * cols, rng), d0 = randn(cols, rng);
        auto big = [&](Device& d) -> Outputs {
            auto db = up(d, d0), go = up(d, g);
            d.bias_backward(d.compute(), db, go, rows, cols);
            return {{"dbias", down(d, db)}};
        };
        expect_all(p.run(big), "bias over 600 chunks of rows", true);
        expect_same_bits(*p.gpu, big, "bias over 600 chunks of rows");
    }
    expect_all(p.run(residual), "residual", true);
    expect_same_bits(*p.gpu, embedding, "embedding");
    expect_same_bits(*p.gpu, bias_fn, "bias");
}

// Weights stored bf16 (the engine's under Precision::bf16): a GEMM of a
// bf16 B (op(A)'s rows rounded into the device's staging, bf16 x bf16 ->
// fp32), A transposed or not (a Llama weight's gradient dy^T x of a kept
// bf16 x), against the cpu backend's within bf16's tolerance, and against
// cuda's own GEMM of B's fp32 copy within it too; ones whose A does not fit
// the staging at once (row blocks, column blocks when transposed); two runs
// the same bits. The embedding from bf16 tables: the
// cpu backend's bits.
BOOST_AUTO_TEST_CASE(bf16_weights_in_gemm_and_embedding, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("bf16 weights"));
    Pair p;
    for (const Gemm& g0 : {Gemm{.m = 37, .n = 53, .k = 29}, Gemm{.tb = true, .m = 64, .n = 96, .k = 128, .beta = 1},
                           Gemm{.m = 20, .n = 30, .k = 40, .lda = 44, .ldc = 31, .alpha = 0.5f},
                           Gemm{.tb = true, .m = 2048, .n = 64, .k = 4096},  // A is 16 MiB in bf16
                           Gemm{.ta = true, .m = 64, .n = 96, .k = 128, .beta = 1},
                           Gemm{.ta = true, .m = 20, .n = 30, .k = 40, .lda = 24, .ldc = 31, .alpha = 0.5f},
                           Gemm{.ta = true, .m = 2048, .n = 64, .k = 4096}}) {
        Gemm g = g0;
        g.inputs = Precision::bf16;
        const u64 ra = g.ta ? g.k : g.m, ca = g.ta ? g.m : g.k;
        const u64 lda = g.lda ? g.lda : ca, ldc = g.ldc ? g.ldc : g.n;
        const Vf a = randn((ra - 1) * lda + ca, rng), c0 = randn((g.m - 1) * ldc + g.n, rng);
        const V16 b = halves(randn(g.n * g.k, rng));
        auto fn = [&](Device& d) -> Outputs {
            auto da = up(d, a), dc = up(d, c0);
            auto db = up(d, b);
            d.gemm(d.compute(), g, da, std::span<const std::uint16_t>(db), dc);
            return {{"C", down(d, dc)}};
        };
        const std::string what = "gemm of a bf16 B, ta " + std::to_string(g.ta) + " m " + std::to_string(g.m) +
                                 " k " + std::to_string(g.k);
        expect_all(p.run(fn), what, false, 1e-2);
        expect_same_bits(*p.gpu, fn, what);
        Vf wide(b.size());
        for (std::size_t i = 0; i < b.size(); ++i) wide[i] = from_bf16(b[i]);
        auto da = up(*p.gpu, a), db = up(*p.gpu, wide), dc = up(*p.gpu, c0);
        p.gpu->gemm(p.gpu->compute(), g, da, db, dc);
        expect_close(fn(*p.gpu).at("C"), down(*p.gpu, dc), what + " against B's fp32 copy", false, 1e-2);
    }
    const u64 B = 3, T = 17, C = 72, V = 101;
    const Vi tok = random_tokens(B * T, V, rng);
    const V16 wte = halves(randn(V * C, rng)), wpe = halves(randn(T * C, rng));
    auto embedding = [&](Device& d) -> Outputs {
        auto out = poisoned(d, B * T * C), bare = poisoned(d, B * T * C);
        auto dt = up(d, tok);
        auto te = up(d, wte), pe = up(d, wpe);
        d.embedding_forward(d.compute(), out, dt, std::span<const std::uint16_t>(te), std::span<const std::uint16_t>(pe),
                            B, T, C, V);
        d.embedding_forward(d.compute(), bare, dt, std::span<const std::uint16_t>(te), {}, B, T, C, V);
        return {{"out", down(d, out)}, {"without positions", down(d, bare)}};
    };
    expect_all(p.run(embedding), "embedding of bf16 tables", true);
}

// Activations a block keeps bf16 (model.hpp's Kept): a GEMM of a bf16 A,
// transposed or not, by a bf16 B (one bf16 x bf16 -> fp32 GEMM) or an fp32
// B (rounded into the staging a block of C's columns at a time, one whose B
// takes three blocks) against the cpu backend's within bf16's tolerance, and
// two runs the same bits; GELU from a bf16 input (the forward rounding its
// output to bf16) the cpu backend's bits.
BOOST_AUTO_TEST_CASE(bf16_activations_in_gemm_and_gelu, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("bf16 activations"));
    Pair p;
    for (const Gemm& g0 : {Gemm{.m = 37, .n = 53, .k = 29}, Gemm{.ta = true, .m = 64, .n = 96, .k = 128, .beta = 1},
                           Gemm{.ta = true, .m = 20, .n = 30, .k = 40, .lda = 24, .ldb = 33, .ldc = 31, .alpha = 0.5f},
                           Gemm{.tb = true, .m = 24, .n = 40, .k = 72, .ldb = 80},
                           Gemm{.ta = true, .m = 64, .n = 2500, .k = 4096}}) {  // B: three blocks of staging
        Gemm g = g0;
        g.inputs = Precision::bf16;
        const u64 ra = g.ta ? g.k : g.m, ca = g.ta ? g.m : g.k, rb = g.tb ? g.n : g.k, cb = g.tb ? g.k : g.n;
        const u64 lda = g.lda ? g.lda : ca, ldb = g.ldb ? g.ldb : cb, ldc = g.ldc ? g.ldc : g.n;
        const V16 a = halves(randn((ra - 1) * lda + ca, rng));
        const Vf b = randn((rb - 1) * ldb + cb, rng), c0 = randn((g.m - 1) * ldc + g.n, rng);
        const V16 b16 = halves(b);
        for (const bool b_bf16 : {false, true}) {
            auto fn = [&](Device& d) -> Outputs {
                auto da = up(d, a), db16 = up(d, b16);
                auto db = up(d, b), dc = up(d, c0);
                d.gemm(d.compute(), g, ConstView(da),
                       b_bf16 ? ConstView(db16) : ConstView(db), dc);
                return {{"C", down(d, dc)}};
            };
            const std::string what = std::string("gemm of a bf16 A by an ") + (b_bf16 ? "bf16" : "fp32") +
                                     " B, ta " + std::to_string(g.ta) + " n " + std::to_string(g.n) + " k " +
                                     std::to_string(g.k);
            expect_all(p.run(fn), what, false, 1e-2);
            expect_same_bits(*p.gpu, fn, what);
        }
    }
    Vf x = randn(100'000, rng, 3);
    x[0] = 12;  // past the tanh clamp
    x[1] = -12;
    x[2] = 0;
    const V16 x16 = halves(x);
    const Vf dout = randn(x.size(), rng);
    auto gelu = [&](Device& d) -> Outputs {
        auto out = up(d, V16(x.size(), 0x7fc0)), dx = up(d, x16);
        auto wide = poisoned(d, x.size()), dinp = poisoned(d, x.size()), go = up(d, dout);
        d.gelu_forward(d.compute(), out.span(), std::span<const std::uint16_t>(dx));
        d.cast(d.compute(), wide, std::span<const std::uint16_t>(out));
        d.gelu_backward(d.compute(), dinp, std::span<const std::uint16_t>(dx), go);
        return {{"out", down(d, wide)}, {"dinp", down(d, dinp)}};
    };
    expect_all(p.run(gelu), "gelu of bf16", true);
}

// The residual add fused into LayerNorm (one warp a row): res and the kept
// bf16 copy the cpu's bits (one add, one rounding), the norm's rows within
// 1e-5 as layernorm_forward's; C = 7 (scalar rows) and 768 (float4); two
// runs the same bits.
BOOST_AUTO_TEST_CASE(residual_layernorm_against_cpu, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("residual layernorm"));
    Pair p;
    for (const u64 C : {u64{7}, u64{768}})
        for (const bool kept : {false, true}) {
            const u64 N = 300;
            const Vf res0 = randn(N * C, rng, 2), add = randn(N * C, rng), w = randn(C, rng), b = randn(C, rng);
            auto fn = [&](Device& d) -> Outputs {
                auto out = poisoned(d, N * C), mean = poisoned(d, N), rstd = poisoned(d, N);
                auto res = up(d, res0), da = up(d, add), dw = up(d, w), db = up(d, b);
                auto k16 = up(d, V16(N * C, 0x7fc0));
                d.residual_layernorm_forward(d.compute(), out, mean, rstd, res, da, kept ? View(k16) : View(), dw, db,
                                             N, C);
                Vf k(N * C);
                const V16 h = down(d, k16);
                for (u64 i = 0; i < N * C; ++i) k[i] = kept ? from_bf16(h[i]) : 0.0f;
                return {{"out", down(d, out)}, {"mean", down(d, mean)}, {"rstd", down(d, rstd)}, {"res", down(d, res)},
                        {"kept", k}};
            };
            const std::string what = "residual_layernorm C " + std::to_string(C) + (kept ? " kept bf16" : "");
            expect_split(p.run(fn), what, {"res", "kept"});
            expect_same_bits(*p.gpu, fn, what);
        }
}

// A GEMM writing bf16 (cuBLASLt's bf16 D) and the epilogues (issue 43's
// bf16 part): gemm_bias (CUBLASLT_EPILOGUE_BIAS), gemm_bias_gelu
// (GELU_AUX_BIAS: the pre-activation its aux output), gemm_dbias (BGRADA or
// BGRADB into the stream's partials, added to dbias; its column sums the
// cpu's where a stand-in runs), fp32 and bf16, a tile's columns (ldc past
// n), the bias's gradient from B and from A: against the cpu backend,
// fp32 within 1e-5 and bf16 within 1e-2 (cuBLASLt's GELU takes the unrounded
// sum); two runs the same bits.
// fp32 A and B into a bf16 C (the head's logits under bf16 activations over
// fp32 parameters): cuBLASLt has no such GEMM, so cuda multiplies blocks of
// C's rows in fp32 and rounds them: the cpu's product rounded once, within
// a bf16 step of it (the two sum in other orders), and C's padding untouched.
BOOST_AUTO_TEST_CASE(fp32_operands_into_a_bf16_c, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("fp32 into bf16 C"));
    Pair p;
    for (const Gemm& g : {Gemm{.tb = true, .m = 300, .n = 1000, .k = 64, .ldc = 1024},
                          Gemm{.ta = true, .m = 37, .n = 53, .k = 29}, Gemm{.m = 5000, .n = 4096, .k = 16}}) {
        const u64 ldc = g.ldc ? g.ldc : g.n, nc = (g.m - 1) * ldc + g.n;
        const Vf a = randn(g.m * g.k, rng), b = randn(g.n * g.k, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto da = up(d, a), db = up(d, b);
            auto c16 = up(d, V16(nc, 0x7fc0));
            d.gemm(d.compute(), g, da, db, c16);
            V16 h(nc);
            d.synchronize(d.compute());
            d.copy(d.compute(), std::as_writable_bytes(std::span(h)), View(c16).bytes());
            d.synchronize(d.compute());
            Vf out(nc);
            for (u64 i = 0; i < nc; ++i) {
                if (i % ldc >= g.n) BOOST_TEST(h[i] == 0x7fc0, "padding at " << i << " written");
                out[i] = i % ldc < g.n ? from_bf16(h[i]) : 0.0f;
            }
            return {{"c", out}};
        };
        const std::string what = "fp32 into bf16 m " + std::to_string(g.m) + " ldc " + std::to_string(ldc);
        expect_all(p.run(fn), what, false, 1e-2);
        expect_same_bits(*p.gpu, fn, what);
    }
}

BOOST_AUTO_TEST_CASE(bf16_c_and_gemm_epilogues, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("gemm epilogues"));
    Pair p;
    for (const bool bf16 : {false, true})
        for (const Gemm& g0 : {Gemm{.m = 256, .n = 768, .k = 192}, Gemm{.tb = true, .m = 64, .n = 96, .k = 128, .ldc = 104},
                               Gemm{.m = 37, .n = 53, .k = 29}}) {
            Gemm g = g0;
            if (bf16) g.inputs = Precision::bf16;
            const u64 ldc = g.ldc ? g.ldc : g.n, nc = (g.m - 1) * ldc + g.n;
            const V16 a16 = halves(randn(g.m * g.k, rng)), b16 = halves(randn(g.n * g.k, rng));
            const Vf a = randn(g.m * g.k, rng), b = randn(g.n * g.k, rng), bias = randn(g.n, rng);
            auto fn = [&](Device& d) -> Outputs {
                auto da = up(d, a), db = up(d, b);
                auto da16 = up(d, a16), db16 = up(d, b16);
                auto dbias = up(d, bias);
                const ConstView A = bf16 ? ConstView(da16) : ConstView(da), B = bf16 ? ConstView(db16) : ConstView(db);
                Outputs o;
                auto read = [&](const View& v) {
                    Vf out(nc);
                    if (v.is_bf16()) {
                        V16 h(nc);
                        d.synchronize(d.compute());
                        d.copy(d.compute(), std::as_writable_bytes(std::span(h)), v.bytes());
                        d.synchronize(d.compute());
                        for (u64 i = 0; i < nc; ++i) out[i] = i % ldc < g.n ? from_bf16(h[i]) : 0.0f;
                    } else {
                        d.synchronize(d.compute());
                        d.copy(d.compute(), std::as_writable_bytes(std::span(out)), v.bytes());
                        d.synchronize(d.compute());
                        for (u64 i = 0; i < nc; ++i)
                            if (i % ldc >= g.n) out[i] = 0;
                    }
                    return out;
                };
                auto c32 = poisoned(d, nc), pre32 = poisoned(d, nc), out32 = poisoned(d, nc);
                auto c16 = up(d, V16(nc, 0x7fc0)), pre16 = up(d, V16(nc, 0x7fc0)), out16 = up(d, V16(nc, 0x7fc0));
                const View c = bf16 ? View(c16) : View(c32), pre = bf16 ? View(pre16) : View(pre32),
                           out = bf16 ? View(out16) : View(out32);
                d.gemm(d.compute(), g, A, B, c);
                o["gemm"] = read(c);
                d.gemm_bias(d.compute(), g, A, B, dbias, c);
                o["gemm_bias"] = read(c);
                d.gemm_bias_gelu(d.compute(), g, A, B, dbias, pre, out);
                o["pre"] = read(pre);
                o["gelu"] = read(out);
                return o;
            };
            const std::string what = std::string(bf16 ? "bf16" : "fp32") + " m " + std::to_string(g.m) + " ldc " +
                                     std::to_string(ldc);
            expect_all(p.run(fn), what, false, bf16 ? 1e-2 : 1e-5);
            expect_same_bits(*p.gpu, fn, what);
        }
    for (const bool bf16 : {false, true})
        for (const bool of_a : {false, true}) {
            const u64 N = 1000, in = 96, out = 64;
            const Vf x = randn(N * in, rng), dy = randn(N * out, rng), w0 = randn(in * out, rng), db0 = randn(out, rng);
            const V16 x16 = halves(x);
            Gemm g = of_a ? Gemm{.ta = true, .m = out, .n = in, .k = N, .beta = 1}
                          : Gemm{.ta = true, .m = in, .n = out, .k = N, .beta = 1};
            if (bf16) g.inputs = Precision::bf16;
            auto fn = [&](Device& d) -> Outputs {
                auto dx = up(d, x), ddy = up(d, dy), dw = up(d, w0), ddb = up(d, db0);
                auto dx16 = up(d, x16);
                // bf16: the activation kept bf16, dy fp32 (the staged mix: the stand-in's column sums).
                const ConstView X = bf16 ? ConstView(dx16) : ConstView(dx), DY = ConstView(ddy);
                d.gemm_dbias(d.compute(), g, of_a ? DY : X, of_a ? X : DY, dw, ddb, of_a);
                return {{"dw", down(d, dw)}, {"dbias", down(d, ddb)}};
            };
            const std::string what = std::string("gemm_dbias ") + (bf16 ? "bf16" : "fp32") + " from " + (of_a ? "A" : "B");
            expect_all(p.run(fn), what, false, bf16 ? 1e-2 : 1e-5);
            expect_same_bits(*p.gpu, fn, what);
        }
}

// LayerNorm: its rows (one warp each: float4 where C % 4 == 0, scalar
// otherwise) within 1e-5 of the cpu's, its weight and bias gradients (column
// sums, the cpu's order) bitwise; GELU bitwise.
BOOST_AUTO_TEST_CASE(layernorm_and_gelu, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("layernorm gelu"));
    Pair p;
    // unaligned rows (7, 33: the scalar loop), GPT-2's width, a Llama's
    for (const u64 C : {u64{7}, u64{33}, u64{64}, u64{77}, u64{768}, u64{2048}}) {
        const u64 N = 3 * kernel_math::kSumRows + 45;  // the column sums' chunks, the last short
        const Vf x = randn(N * C, rng, 2), w = randn(C, rng), b = randn(C, rng), dout = randn(N * C, rng);
        const Vf dinp0 = randn(N * C, rng), dw0 = randn(C, rng), db0 = randn(C, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, N * C), mean = poisoned(d, N), rstd = poisoned(d, N);
            auto dx = up(d, x), dw_ = up(d, w), db_ = up(d, b), go = up(d, dout);
            auto dinp = up(d, dinp0), dw = up(d, dw0), db = up(d, db0);
            d.layernorm_forward(d.compute(), out, mean, rstd, dx, dw_, db_, N, C);
            d.layernorm_backward(d.compute(), dinp, dw, db, go, dx, dw_, mean, rstd, N, C);
            return {{"out", down(d, out)}, {"mean", down(d, mean)}, {"rstd", down(d, rstd)},
                    {"dinp", down(d, dinp)}, {"dw", down(d, dw)},     {"db", down(d, db)}};
        };
        expect_split(p.run(fn), "layernorm C=" + std::to_string(C), {"dw", "db"});
        expect_same_bits(*p.gpu, fn, "layernorm");
        // The backward from an input stored bf16 (a GPT block's inner
        // residual kept under Shape::activations bf16): the cpu's bits.
        const V16 x16 = halves(x);
        auto bf16 = [&](Device& d) -> Outputs {
            auto out = poisoned(d, N * C), mean = poisoned(d, N), rstd = poisoned(d, N);
            auto xw = up(d, x), dw_ = up(d, w), db_ = up(d, b), go = up(d, dout);
            auto dinp = up(d, dinp0), dw = up(d, dw0), db = up(d, db0);
            auto dx = up(d, x16);
            d.layernorm_forward(d.compute(), out, mean, rstd, xw, dw_, db_, N, C);
            d.layernorm_backward(d.compute(), dinp, dw, db, go, std::span<const std::uint16_t>(dx), dw_, mean, rstd,
                                 N, C);
            return {{"dinp", down(d, dinp)}, {"dw", down(d, dw)}, {"db", down(d, db)}};
        };
        expect_split(p.run(bf16), "layernorm backward of bf16, C=" + std::to_string(C), {"dw", "db"});
        expect_same_bits(*p.gpu, bf16, "layernorm backward of bf16");
    }
    Vf x = randn(100'000, rng, 3);
    x[0] = 12;  // past the tanh clamp
    x[1] = -12;
    x[2] = 0;
    const Vf dout = randn(x.size(), rng);
    auto gelu = [&](Device& d) -> Outputs {
        auto out = poisoned(d, x.size()), dinp = poisoned(d, x.size());
        auto dx = up(d, x), go = up(d, dout);
        d.gelu_forward(d.compute(), out, dx);
        d.gelu_backward(d.compute(), dinp, dx, go);
        return {{"out", down(d, out)}, {"dinp", down(d, dinp)}};
    };
    expect_all(p.run(gelu), "gelu", true);
}

// The element-wise kernels' vectorised loops (elementwise.cu: 4 or 8
// elements a load where every pointer is 16-byte aligned, the tail after
// them, one at a time otherwise): a length with a tail past both widths, at
// an aligned start and one element in (every pointer unaligned), fp32 and
// bf16, bitwise the cpu backend's.
BOOST_AUTO_TEST_CASE(elementwise_tails_and_unaligned_starts, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("elementwise tails"));
    Pair p;
    const u64 n = 1003;  // 1003 = 8 * 125 + 3
    const Vf a = randn(n + 1, rng, 3), b = randn(n + 1, rng), c = randn(n + 1, rng);
    const V16 a16 = halves(a), b16 = halves(b);
    for (const u64 at : {u64{0}, u64{1}}) {
        auto fn = [&](Device& d) -> Outputs {
            auto A = up(d, a), B = up(d, b), acc = up(d, c), out = poisoned(d, n + 1), g = poisoned(d, n + 1),
                 dg = poisoned(d, n + 1), du = poisoned(d, n + 1), w = poisoned(d, n + 1);
            auto A16 = up(d, a16), B16 = up(d, b16), o16 = up(d, V16(n + 1, 0x7fc0)), c16 = up(d, V16(n + 1, 0x7fc0));
            auto s = [&](auto& arr) { return arr.span().subspan(at, n); };
            const std::span<const float> sa = s(A), sb = s(B);
            const std::span<const std::uint16_t> sa16 = s(A16), sb16 = s(B16);
            Outputs o;
            d.residual_forward(d.compute(), s(out), sa, sb);
            o["residual"] = down(d, out);
            d.accumulate(d.compute(), s(acc), sa);
            o["accumulate"] = down(d, acc);
            d.gelu_forward(d.compute(), s(g), sa);
            d.gelu_backward(d.compute(), s(dg), sa16, sb);
            o["gelu"] = down(d, g), o["gelu backward of bf16"] = down(d, dg);
            d.swiglu_forward(d.compute(), s(o16), sa16, sb16);
            d.cast(d.compute(), s(w), std::span<const std::uint16_t>(s(o16)));
            o["swiglu of bf16"] = down(d, w);
            d.swiglu_backward(d.compute(), s(dg), s(du), sb, sa, sb);
            o["swiglu dgate"] = down(d, dg), o["swiglu dup"] = down(d, du);
            d.cast(d.compute(), s(c16), sa);
            d.cast(d.compute(), s(w), std::span<const std::uint16_t>(s(c16)));
            o["cast there and back"] = down(d, w);
            return o;
        };
        expect_all(p.run(fn), "element-wise from element " + std::to_string(at), true);
    }
}

BOOST_AUTO_TEST_CASE(attention_forward_backward_decode, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("attention"));
    Pair p;
    struct Shape {
        u64 B, T, C, NH;
    };
    // T = 1, and T off the cpu's 64-row blocks of the causal triangle.
    for (const Shape s : {Shape{1, 1, 16, 2}, Shape{2, 7, 24, 3}, Shape{1, 70, 64, 2}, Shape{2, 33, 48, 4},
                          Shape{1, 130, 32, 1}}) {
        const u64 B = s.B, T = s.T, C = s.C, NH = s.NH;
        const Vf qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
        const std::string what = "attention B=" + std::to_string(B) + " T=" + std::to_string(T);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, B * T * C), att = poisoned(d, B * NH * T * T);
            auto dqkv = poisoned(d, B * T * 3 * C), datt = poisoned(d, B * NH * T * T);
            auto x = up(d, qkv), go = up(d, dout);
            d.attention_forward(d.compute(), out, att, x, B, T, C, NH);
            d.attention_backward(d.compute(), dqkv, datt, go, x, att, B, T, C, NH);
            return {{"out", down(d, out)}, {"att", down(d, att)}, {"dqkv", down(d, dqkv)}};
        };
        expect_all(p.run(fn), what);  // cuBLASLt's sums and expf: close, not bitwise
        expect_same_bits(*p.gpu, fn, what);

        // The backward alone on a given att (entries above the diagonal too,
        // which it must ignore): close (cuBLASLt's sums), the same bits twice.
        const Vf att = randn(B * NH * T * T, rng);
        auto backward = [&](Device& d) -> Outputs {
            auto dqkv = poisoned(d, B * T * 3 * C), datt = poisoned(d, B * NH * T * T);
            auto x = up(d, qkv), go = up(d, dout), a = up(d, att);
            d.attention_backward(d.compute(), dqkv, datt, go, x, a, B, T, C, NH);
            return {{"dqkv", down(d, dqkv)}};
        };
        expect_all(p.run(backward), what + " backward");
        expect_same_bits(*p.gpu, backward, what + " backward");
        // And from qkv and att stored bf16 (a GPT block's kept under
        // Shape::activations bf16): close too, and two runs the same bits.
        const V16 qkv16 = halves(qkv), att16 = halves(att);
        auto backward16 = [&](Device& d) -> Outputs {
            auto dqkv = poisoned(d, B * T * 3 * C), datt = poisoned(d, B * NH * T * T);
            auto x = up(d, qkv16), a = up(d, att16);
            auto go = up(d, dout);
            d.attention_backward(d.compute(), dqkv, datt, go, std::span<const std::uint16_t>(x),
                                 std::span<const std::uint16_t>(a), B, T, C, NH);
            return {{"dqkv", down(d, dqkv)}};
        };
        expect_all(p.run(backward16), what + " backward of bf16");
        expect_same_bits(*p.gpu, backward16, what + " backward of bf16");

        // Decoding the last position against (T,C) keys and values.
        const Vf q = randn(C, rng), k = randn(T * C, rng), v = randn(T * C, rng);
        auto decode = [&](Device& d) -> Outputs {
            auto out = poisoned(d, C), att_ = poisoned(d, NH * T);
            auto dq = up(d, q), dk = up(d, k), dv = up(d, v);
            d.attention_decode(d.compute(), out, att_, dq, dk, dv, T, C, NH);
            return {{"out", down(d, out)}, {"att", down(d, att_)}};
        };
        expect_all(p.run(decode), what + " decode");
    }
}

// Flash attention (flash.cu, --attention flash) on the GPU: against the
// cpu backend's flash kernels and against the GPU's own GEMM path, forward
// and backward, within 1e-5; the GPT's packed qkv and grouped-query heads
// (KVH = NH, KVH < NH, one kv head); T = 1, 7, 33, 65, 128 (the 32-row
// tiles' edges); head dims 8 to 128 (one to four dims a lane, 128 past the
// 48 KiB of shared memory a launch gets unasked); two runs the same bits;
// the backward from bf16 q, k, v and out close to the cpu's.
BOOST_AUTO_TEST_CASE(flash_attention_against_the_gemm_path, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("flash attention"));
    Pair p;
    struct Shape {
        u64 B, T, NH, KVH, hd;
    };
    for (const Shape s : {Shape{1, 1, 4, 2, 8}, Shape{2, 7, 6, 2, 8}, Shape{1, 33, 9, 3, 64}, Shape{2, 65, 4, 4, 16},
                          Shape{1, 128, 8, 1, 32}, Shape{1, 65, 2, 2, 96}, Shape{2, 33, 4, 2, 128}}) {
        const u64 B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, hd = s.hd;
        const Vf q = randn(B * T * NH * hd, rng), k = randn(B * T * KVH * hd, rng), v = randn(B * T * KVH * hd, rng);
        const Vf dout = randn(q.size(), rng);
        const std::string what = "flash B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
                                 std::to_string(NH) + " KVH=" + std::to_string(KVH) + " hd=" + std::to_string(hd);
        auto flash = [&](Device& d) -> Outputs {
            auto out = poisoned(d, q.size()), lse = poisoned(d, B * NH * T), delta = poisoned(d, B * NH * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q), K = up(d, k), Vv = up(d, v), go = up(d, dout);
            d.flash_gqa_forward(d.compute(), out, lse, Q, K, Vv, B, T, NH, KVH, hd);
            d.flash_gqa_backward(d.compute(), dq, dk, dv, delta, go, Q, K, Vv, out, lse, B, T, NH, KVH, hd);
            return {{"out", down(d, out)}, {"lse", down(d, lse)}, {"dq", down(d, dq)}, {"dk", down(d, dk)},
                    {"dv", down(d, dv)}};
        };
        auto gemm = [&](Device& d) -> Outputs {
            auto out = poisoned(d, q.size()), att = poisoned(d, B * NH * T * T), datt = poisoned(d, B * NH * T * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q), K = up(d, k), Vv = up(d, v), go = up(d, dout);
            d.gqa_forward(d.compute(), out, att, Q, K, Vv, B, T, NH, KVH, hd);
            d.gqa_backward(d.compute(), dq, dk, dv, datt, go, Q, K, Vv, att, B, T, NH, KVH, hd);
            return {{"out", down(d, out)}, {"dq", down(d, dq)}, {"dk", down(d, dk)}, {"dv", down(d, dv)}};
        };
        expect_all(p.run(flash), what + " against the cpu's flash");
        Outputs on_gpu = flash(*p.gpu);
        on_gpu.erase("lse");
        expect_all({gemm(*p.gpu), on_gpu}, what + " against the GPU's GEMM path");
        expect_same_bits(*p.gpu, flash, what);
        // From q, k, v and out kept bf16.
        const V16 q16 = halves(q), k16 = halves(k), v16 = halves(v);
        auto flash16 = [&](Device& d) -> Outputs {
            auto out = poisoned(d, q.size()), lse = poisoned(d, B * NH * T), delta = poisoned(d, B * NH * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q), K = up(d, k), Vv = up(d, v), go = up(d, dout);
            d.flash_gqa_forward(d.compute(), out, lse, Q, K, Vv, B, T, NH, KVH, hd);
            auto o16 = up(d, halves(down(d, out)));
            auto Q16 = up(d, q16), K16 = up(d, k16), V16_ = up(d, v16);
            d.flash_gqa_backward(d.compute(), dq, dk, dv, delta, go, std::span<const std::uint16_t>(Q16),
                                 std::span<const std::uint16_t>(K16), std::span<const std::uint16_t>(V16_),
                                 std::span<const std::uint16_t>(o16), lse, B, T, NH, KVH, hd);
            return {{"dq", down(d, dq)}, {"dk", down(d, dk)}, {"dv", down(d, dv)}};
        };
        expect_all(p.run(flash16), what + " backward of bf16");
    }
    // The GPT's packed qkv.
    for (const u64 T : {u64{1}, u64{33}, u64{128}}) {
        const u64 B = 2, C = 48, NH = 4;
        const Vf qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, B * T * C), lse = poisoned(d, B * NH * T), delta = poisoned(d, B * NH * T);
            auto dqkv = poisoned(d, qkv.size());
            auto x = up(d, qkv), go = up(d, dout);
            d.flash_attention_forward(d.compute(), out, lse, x, B, T, C, NH);
            d.flash_attention_backward(d.compute(), dqkv, delta, go, x, out, lse, B, T, C, NH);
            return {{"out", down(d, out)}, {"lse", down(d, lse)}, {"dqkv", down(d, dqkv)}};
        };
        expect_all(p.run(fn), "flash attention T=" + std::to_string(T));
        expect_same_bits(*p.gpu, fn, "flash attention T=" + std::to_string(T));
    }
}

BOOST_AUTO_TEST_CASE(crossentropy_with_and_without_gradient, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("crossentropy"));
    Pair p;
    for (const u64 V : {u64{50}, u64{1000}, u64{50257}}) {
        const u64 N = V > 10000 ? 9 : 37;
        const Vf logits = randn(N * V, rng, 4);
        const Vi targets = random_tokens(N, static_cast<std::int32_t>(V), rng);
        auto fn = [&](Device& d) -> Outputs {
            auto losses = poisoned(d, N), losses2 = poisoned(d, N);
            auto x = up(d, logits);
            auto t = up(d, targets);
            d.crossentropy_forward(d.compute(), losses2, x, t, N, V, 0);
            d.crossentropy_forward_backward(d.compute(), losses, x, t, 0.25f, N, V, 0);
            return {{"losses", down(d, losses)}, {"losses (forward only)", down(d, losses2)}, {"dlogits", down(d, x)}};
        };
        expect_all(p.run(fn), "crossentropy V=" + std::to_string(V));
        expect_same_bits(*p.gpu, fn, "crossentropy");
    }
}

// The fused classifier over padded rows (issue 43): fp32 and bf16 logits
// in rows padded to a multiple of 64 (each row 16-byte aligned: the 128-bit
// loads) and packed at an odd V (element loads); the pad poisoned first,
// written 0 by both; cuda against the cpu (bf16: the gradient within one
// bf16 rounding, as the file's GEMMs' 1e-2), two cuda runs the same bits;
// the aligned and element-wise paths the same bits on cuda.
BOOST_AUTO_TEST_CASE(classifier_padded_fp32_and_bf16, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("classifier"));
    Pair p;
    for (const u64 V : {u64{1}, u64{1001}, u64{50257}}) {
        const u64 N = V > 10000 ? 7 : 33, ld = (V + 63) / 64 * 64;
        const Vf logits = randn(N * V, rng, 4);
        Vi targets = random_tokens(N, static_cast<std::int32_t>(V), rng);
        targets[0] = 0, targets[1] = static_cast<std::int32_t>(V - 1);
        auto rows = [&](const Vf& x, u64 stride, float fill) {
            Vf out(N * stride, fill);
            for (u64 i = 0; i < N; ++i) std::copy_n(x.begin() + i * V, V, out.begin() + i * stride);
            return out;
        };
        auto fp32 = [&](u64 stride) {
            return [&, stride](Device& d) -> Outputs {
                auto losses = poisoned(d, N), only = poisoned(d, N);
                auto x = up(d, rows(logits, stride, kNaN));
                auto t = up(d, targets);
                d.crossentropy_forward(d.compute(), only, x, t, N, V, stride);
                d.crossentropy_forward_backward(d.compute(), losses, x, t, 0.25f, N, V, stride);
                return {{"losses", down(d, losses)}, {"losses (forward only)", down(d, only)}, {"dlogits", down(d, x)}};
            };
        };
        const std::string what = "classifier V=" + std::to_string(V);
        const auto padded = p.run(fp32(ld));
        expect_all(padded, what + " fp32 padded");
        for (u64 i = 0; i < N; ++i)
            for (u64 j = V; j < ld; ++j) BOOST_TEST(padded.second.at("dlogits")[i * ld + j] == 0.0f);
        expect_same_bits(*p.gpu, fp32(ld), what + " fp32 padded");
        // The element-wise path (packed rows of an odd V) gives the vector path's bits.
        const Outputs packed = fp32(V)(*p.gpu);
        for (const char* k : {"losses", "losses (forward only)"})
            BOOST_TEST(std::memcmp(packed.at(k).data(), padded.second.at(k).data(), N * 4) == 0, what << " " << k);
        for (u64 i = 0; i < N; ++i)
            BOOST_TEST(std::memcmp(packed.at("dlogits").data() + i * V, padded.second.at("dlogits").data() + i * ld,
                                   V * 4) == 0);
        auto bf16 = [&](Device& d) -> Outputs {
            auto losses = poisoned(d, N);
            V16 h = halves(rows(logits, ld, 0.0f));
            for (u64 i = 0; i < N; ++i)
                for (u64 j = V; j < ld; ++j) h[i * ld + j] = 0x7fc1;  // NaN in the pad
            auto x = up(d, h);
            auto t = up(d, targets);
            d.crossentropy_forward_backward(d.compute(), losses, View(x), t, 0.25f, N, V, ld);
            const V16 g = down(d, x);
            Vf wide(g.size());
            for (std::size_t i = 0; i < g.size(); ++i) wide[i] = from_bf16(g[i]);
            return {{"losses", down(d, losses)}, {"dlogits", wide}};
        };
        const auto b = p.run(bf16);
        expect_close(b.second.at("losses"), b.first.at("losses"), what + " bf16 losses");
        expect_close(b.second.at("dlogits"), b.first.at("dlogits"), what + " bf16 dlogits", false, 1e-2);
        expect_same_bits(*p.gpu, bf16, what + " bf16");
    }
}

BOOST_AUTO_TEST_CASE(casts_and_adamw_bitwise, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("casts adamw"));
    Pair p;
    Vf x = randn(70'001, rng, 100);
    // Ties to even, NaN, infinities, the largest finite, denormals.
    const std::uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xffc00000u, 0x7f800001u,
                                     0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x00000001u, 0x80400000u};
    for (std::size_t i = 0; i < std::size(special); ++i) std::memcpy(&x[i], &special[i], 4);
    auto casts = [&](Device& d) -> Outputs {
        auto src = up(d, x);
        auto b16 = up(d, V16(x.size(), 0xdead));
        auto back = poisoned(d, x.size());
        d.cast(d.compute(), b16, src);
        d.cast(d.compute(), back, b16);
        const V16 bits = down(d, b16);
        Vf as_float(bits.size());
        for (std::size_t i = 0; i < bits.size(); ++i) as_float[i] = float(bits[i]);  // exact: < 2^24
        return {{"bf16 bits", as_float}, {"back", down(d, back)}};
    };
    expect_all(p.run(casts), "casts", true);

    const u64 n = 50'000;
    const Vf w = randn(n, rng), m = randn(n, rng, 0.1f), g = randn(n, rng, 0.01f);
    Vf v = randn(n, rng, 0.01f);
    for (auto& e : v) e = std::abs(e);
    V16 g16(n);
    to_bf16(std::span<const float>(g), std::span<std::uint16_t>(g16));
    const auto k = optim::Scalars::make({.lr = 1e-3, .weight_decay = 0.1}, 7, 0.5);
    for (const bool bf16_grad : {false, true}) {
        auto fn = [&](Device& d) -> Outputs {
            auto dw = up(d, w), dm = up(d, m), dv = up(d, v), dg = up(d, g), p32 = poisoned(d, n);
            auto dg16 = up(d, g16), p16 = up(d, V16(n, 0xdead));
            optim::Update u{.master = dw, .exp_avg = dm, .exp_avg_sq = dv};
            if (bf16_grad) {
                u.grad_bf16 = dg16;
                u.param_bf16 = p16;
            } else {
                u.grad_f32 = dg;
                u.param_f32 = p32;
            }
            d.adamw(d.compute(), u, k);
            Outputs o{{"w", down(d, dw)}, {"m", down(d, dm)}, {"v", down(d, dv)}};
            if (bf16_grad) {
                const V16 bits = down(d, p16);
                o["p16"] = Vf(bits.begin(), bits.end());
            } else {
                o["p32"] = down(d, p32);
            }
            return o;
        };
        expect_all(p.run(fn), bf16_grad ? "adamw bf16" : "adamw f32", true);
    }
}

// One step of the model `spec` describes (a GPT or a Llama) on `d`: the
// parameters made from `spec` and `weights`, the batch in -> tg, the
// activations planned as `shape`, GEMM inputs of `arithmetic`: the losses
// and every gradient.
Outputs model_step(Device& d, const shard::ModelSpec& spec, u64 weights, const Vi& in, const Vi& tg,
                   const model::Shape& shape, Precision arithmetic) {
    const auto m = model::make_model(model::Config::from(spec));
    model::LanguageModel& net = *m;
    model::ResidentEngine eng(d, model::numels(net.params_table()));
    const auto ts = shard::tensors(spec);
    for (std::size_t t = 0; t < ts.size(); ++t) {
        Vf v(ts[t].numel);
        shard::fill_fp32(ts[t], spec, weights, 0, v);
        d.copy(d.compute(), std::as_writable_bytes(eng.values(t)), std::as_bytes(std::span<const float>(v)));
        d.synchronize(d.compute());
    }
    auto acts = net.plan(d, shape);
    d.copy(d.compute(), std::as_writable_bytes(acts.inputs.span()), std::as_bytes(std::span<const std::int32_t>(in)));
    d.copy(d.compute(), std::as_writable_bytes(acts.targets.span()), std::as_bytes(std::span<const std::int32_t>(tg)));
    model::Context c{d, d.compute(), eng, arithmetic};
    eng.zero_grad(c.stream);
    net.forward(c, acts);
    net.backward(c, acts);
    Vf g(eng.all_gradients().size());
    d.synchronize(c.stream);
    d.copy(c.stream, std::as_writable_bytes(std::span<float>(g)), std::as_bytes(eng.all_gradients()));
    d.synchronize(c.stream);
    return {{"losses", down(d, acts.losses)}, {"gradients", g}};
}

// A step of `model` (a GPT's spec by default) with bf16 activation
// checkpoints (and the blocks' activations kept as `activations`) under
// `arithmetic`: cuda against cpu, the losses within loss_tol and the
// gradients within grad_tol; on cuda, with checkpointing and without, the
// same bits, and two runs the same bits.
void bf16_step_against_cpu(const char* what, Precision activations, Precision arithmetic, double loss_tol,
                           double grad_tol, const char* model = "gpt:layers=3,hidden=64,heads=4,vocab=97,seq=32") {
    std::mt19937_64 rng(fresh_seed(what));
    const auto spec = shard::ModelSpec::parse(model);
    const u64 B = 2, T = 32, weights = rng();
    const Vi in = random_tokens(B * T, spec.vocab, rng), tg = random_tokens(B * T, spec.vocab, rng);
    auto step = [&](Device& d, bool checkpoint) -> Outputs {
        return model_step(d, spec, weights, in, tg,
                        {.batch = B, .seq = T, .checkpoint = checkpoint, .checkpoints = Precision::bf16,
                         .activations = activations},
                        arithmetic);
    };
    Pair p;
    const std::string w = what;
    const Outputs cpu = step(*p.cpu, true), gpu = step(*p.gpu, true);
    expect_close(gpu.at("losses"), cpu.at("losses"), w + ": losses", false, loss_tol);
    expect_close(gpu.at("gradients"), cpu.at("gradients"), w + ": gradients", false, grad_tol);
    const Outputs kept = step(*p.gpu, false);
    for (const char* name : {"losses", "gradients"})
        expect_close(kept.at(name), gpu.at(name), w + ", recomputed or kept: " + name, true);
    expect_same_bits(*p.gpu, [&](Device& d) { return step(d, true); }, w);
}

// bf16 activation checkpoints (zinf-train --precision bf16: the residual
// stream rounded to bf16 at each block boundary, kept so and widened into
// fp32 for the block that reads it, by the casts above), fp32 arithmetic:
// the losses within 1e-4 and the gradients within bf16's 1e-2 (a residual
// an ulp apart in fp32 may round to the neighbouring bf16).
BOOST_AUTO_TEST_CASE(bf16_checkpoints_through_a_gpt_step, *utf::precondition(GpuPresent())) {
    bf16_step_against_cpu("bf16 checkpoints", Precision::fp32, Precision::fp32, 1e-4, 1e-2);
}

// bf16 arithmetic with the blocks' activations kept bf16 too (zinf-train
// --precision bf16): the losses within 1e-2 and the gradients within 5e-2
// (cuBLASLt's bf16 tensor cores accumulate in another order, and a value an
// ulp apart may round to the neighbouring bf16 where it is kept).
BOOST_AUTO_TEST_CASE(bf16_activations_through_a_gpt_step, *utf::precondition(GpuPresent())) {
    bf16_step_against_cpu("bf16 activations", Precision::bf16, Precision::bf16, 1e-2, 5e-2);
}

// The same through a Llama step (RMSNorm outputs, q, k, v, the softmax,
// the attention's output, SwiGLU's gate, up and product kept bf16; SwiGLU
// and the attention's backward from bf16), grouped-query attention (4
// heads, 2 kv heads), joined q, k, v projections: the same tolerances.
BOOST_AUTO_TEST_CASE(bf16_activations_through_a_llama_step, *utf::precondition(GpuPresent())) {
    bf16_step_against_cpu("llama bf16 activations", Precision::bf16, Precision::bf16, 1e-2, 5e-2,
                          "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=160,vocab=97,seq=32");
}

BOOST_AUTO_TEST_CASE(bad_token_and_target_at_synchronize, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("bad tokens"));
    Pair p;
    const u64 B = 2, T = 5, C = 8, V = 50;
    Vi tok = random_tokens(B * T, V, rng);
    tok[1 * T + 2] = 50;
    tok[1 * T + 4] = 99;  // a later one: the first is reported
    const Vf wte = randn(V * C, rng), wpe = randn(T * C, rng);
    // The cpu backend's message, word for word, and its exit code.
    // fn enqueues the kernel and synchronizes (its arrays live until then).
    auto message = [&](Device& d, const std::function<void(Device&)>& fn) {
        std::string what;
        try {
            fn(d);
            BOOST_ERROR(d.backend() << ": no error at synchronize");
        } catch (const DataError& e) {
            what = e.what();
            BOOST_TEST(e.exit_code() == exit_code::data);
        }
        d.synchronize(d.compute());  // reported once; the stream goes on
        return what;
    };
    auto embedding = [&](Device& d) {
        auto out = d.alloc<float>(B * T * C, "out");
        auto dt = up(d, tok);
        auto te = up(d, wte), pe = up(d, wpe);
        d.embedding_forward(d.compute(), out, dt, te, pe, B, T, C, V);
        d.synchronize(d.compute());
    };
    auto cpu_what = message(*p.cpu, embedding), gpu_what = message(*p.gpu, embedding);
    BOOST_TEST(gpu_what == cpu_what);
    BOOST_TEST(testing::contains(gpu_what, "token 50 at batch row 1, position 2"), gpu_what);

    Vi tgt = random_tokens(B * T, V, rng);
    tgt[7] = -3;
    const Vf logits = randn(B * T * V, rng);
    auto ce = [&](Device& d) {
        auto x = up(d, logits);
        auto t = up(d, tgt);
        auto losses = d.alloc<float>(B * T, "losses");
        d.crossentropy_forward_backward(d.compute(), losses, x, t, 1, B * T, V, 0);
        d.synchronize(d.compute());
    };
    cpu_what = message(*p.cpu, ce);
    gpu_what = message(*p.gpu, ce);
    BOOST_TEST(gpu_what == cpu_what);
    BOOST_TEST(testing::contains(gpu_what, "target -3 at row 7"), gpu_what);

    // Reported through an event after the kernel, not through one before it.
    Device& d = *p.gpu;
    auto out = d.alloc<float>(B * T * C, "out");
    auto dt = up(d, tok);
    auto te = up(d, wte), pe = up(d, wpe);
    const Event before = d.record(d.compute());
    d.embedding_forward(d.compute(), out, dt, te, pe, B, T, C, V);
    const Event after = d.record(d.compute());
    d.synchronize(before);
    testing::what_of<DataError>([&] { d.synchronize(after); }, "event after the bad token");
    d.synchronize(d.compute());
}

BOOST_AUTO_TEST_CASE(host_jobs_in_order_and_their_errors, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("host jobs"));
    auto d = open({.backend = "cuda", .memory_bytes = 64 * MiB});
    Stream& s = d->compute();
    const u64 n = 1 << 20;
    const Vf x = randn(n, rng);
    auto a = up(*d, x), b = d->alloc<float>(n, "b");
    Vf host(n, kNaN), host2(n, kNaN);
    std::vector<int> order;
    // kernel -> copy out -> host job reads it and writes another -> copy in -> kernel.
    d->residual_forward(s, b, a, a);
    d->copy(s, std::as_writable_bytes(std::span<float>(host)), std::as_bytes(b.span()));
    d->host(s, [&] {
        order.push_back(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the stream must wait for it
        for (u64 i = 0; i < n; ++i) host2[i] = host[i] + 1;
    });
    d->copy(s, std::as_writable_bytes(b.span()), std::as_bytes(std::span<const float>(host2)));
    d->host(s, [&] { order.push_back(2); });
    d->accumulate(s, b, a);
    d->synchronize(s);
    BOOST_TEST((order == std::vector<int>{1, 2}));
    const Vf got = down(*d, b);
    std::size_t bad = 0;
    for (u64 i = 0; i < n; ++i) bad += got[i] != (x[i] + x[i] + 1) + x[i];
    BOOST_TEST(bad == 0u);

    // Across streams: a copy on h2d waits for a slow host job on compute.
    std::atomic<std::uint64_t> waited{0};
    d->host(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
    const Event e = d->record(s);
    d->wait(d->h2d(), e, waited);
    d->host(d->h2d(), [&] { order.push_back(3); });
    BOOST_TEST(!d->query(e));
    d->synchronize(d->h2d());
    BOOST_TEST(d->query(e));
    BOOST_TEST(order.back() == 3);
    BOOST_TEST(waited.load() >= 50'000'000u, "the copies stream stood " << waited.load() << " ns");

    // An error: thrown by the stream's synchronize (once), or an event's after
    // it; the jobs behind it dropped; the stream works afterwards.
    std::atomic<int> ran{0};
    d->host(s, [&] { ran += 1; });
    const Event clean = d->record(s);
    d->host(s, [] { throw std::runtime_error("boom"); });
    const Event covering = d->record(s);
    d->host(s, [&] { ran += 10; });
    d->synchronize(clean);
    const std::string what = testing::what_of<std::runtime_error>([&] { d->synchronize(covering); }, "job error");
    BOOST_TEST(what == "boom");
    d->synchronize(s);  // reported once
    BOOST_TEST(ran.load() == 1);
    d->host(s, [&] { ran += 100; });
    d->synchronize(s);
    BOOST_TEST(ran.load() == 101);
    d->host(s, [] { throw DataError("bad data"); });
    testing::what_of<DataError>([&] { d->synchronize(s); }, "stream after error");
}

BOOST_AUTO_TEST_CASE(gemm_rates_are_measured, *utf::precondition(GpuPresent())) {
    auto d = open({.backend = "cuda", .memory_bytes = 256 * MiB});
    const double f32 = measure_gemm_flops(*d, 1024, 5), bf16 = measure_gemm_bf16_flops(*d, 1024, 5);
    BOOST_TEST_MESSAGE("cuBLASLt 1024^3: fp32 " << f32 / 1e12 << " TFLOP/s, bf16 " << bf16 / 1e12 << " TFLOP/s");
    BOOST_TEST(f32 > 1e11);
    BOOST_TEST(bf16 > f32);
}

// comm::Communicator::enqueue on nccl (one rank): an allgather enqueued on
// the collectives stream's native handle after an event the h2d stream
// recorded behind the input's copy, then a bucket of two allreduces in the
// stream's own order; the stream's synchronize gives the results, and a
// blocking collective afterwards runs after them.
BOOST_AUTO_TEST_CASE(nccl_collectives_enqueued_on_a_device_stream, *utf::precondition(NcclPresent())) {
    std::mt19937_64 rng(fresh_seed("nccl enqueue"));
    auto d = open({.backend = "cuda", .memory_bytes = 64 * MiB});
    comm::Communicator c({.backend = comm::Backend::nccl, .memory = comm::Memory::device});
    const Vf h = randn(40'009, rng), g = randn(1'001, rng);
    auto src = d->alloc<float>(h.size(), "src"), gathered = poisoned(*d, h.size()), summed = poisoned(*d, h.size());
    auto gsrc = up(*d, g), gsum = poisoned(*d, g.size());
    d->copy(d->h2d(), std::as_writable_bytes(src.span()), std::as_bytes(std::span<const float>(h)));
    const Event copied = d->record(d->h2d());
    void* coll = d->native(d->stream(StreamKind::collectives));
    const comm::Buffer all{std::as_bytes(src.span()), std::as_writable_bytes(gathered.span()), {}};
    c.enqueue(comm::Kind::allgather, std::span(&all, 1), comm::DType::f32, coll, copied.handle.get());
    const comm::Buffer sums[] = {{std::as_bytes(src.span()), std::as_writable_bytes(summed.span()), {}},
                                 {std::as_bytes(gsrc.span()), std::as_writable_bytes(gsum.span()), {}}};
    c.enqueue(comm::Kind::allreduce, sums, comm::DType::f32, coll, nullptr, comm::Reduce::sum);
    d->synchronize(d->stream(StreamKind::collectives));
    BOOST_TEST(down(*d, gathered) == h);
    BOOST_TEST(down(*d, summed) == h);
    BOOST_TEST(down(*d, gsum) == g);
    c.barrier();
}

// A bucket of two buffers goes flat (one ncclAllGather) in device memory the
// caller gives from the arena (Communicator::set_flat_area), as the engine
// does: of the size flat_bytes says, enqueued on the collectives stream, it
// gathers both buffers; a bucket larger than the area given is an
// InternalError naming both sizes (NCCL allocates none of its own).
BOOST_AUTO_TEST_CASE(nccl_buckets_lay_flat_in_the_callers_area, *utf::precondition(NcclPresent())) {
    std::mt19937_64 rng(fresh_seed("nccl flat area"));
    auto d = open({.backend = "cuda", .memory_bytes = 64 * MiB});
    const Vf h = randn(40'009, rng), g = randn(1'001, rng);
    auto a = up(*d, h), b = up(*d, g), ga = poisoned(*d, h.size()), gb = poisoned(*d, g.size());
    const comm::Buffer bucket[] = {{std::as_bytes(a.span()), std::as_writable_bytes(ga.span()), {}},
                                   {std::as_bytes(b.span()), std::as_writable_bytes(gb.span()), {}}};
    const std::vector<std::vector<u64>> counts{{h.size()}, {g.size()}};
    void* coll = d->native(d->stream(StreamKind::collectives));
    {
        comm::Communicator c({.backend = comm::Backend::nccl, .memory = comm::Memory::device});
        const u64 need = c.flat_bytes(comm::Kind::allgather, counts, comm::DType::f32);
        // One rank: its block (each buffer 256-byte aligned) and its own copy.
        BOOST_TEST(need == 2 * (align_up(h.size() * 4, 256) + align_up(g.size() * 4, 256)));
        auto area = d->alloc<std::byte>(need, "flat bucket area");
        c.set_flat_area(area.span());
        c.enqueue(comm::Kind::allgather, bucket, comm::DType::f32, coll);
        d->synchronize(d->stream(StreamKind::collectives));
        BOOST_TEST(down(*d, ga) == h);
        BOOST_TEST(down(*d, gb) == g);
        c.set_flat_area({});
    }
    comm::Communicator c({.backend = comm::Backend::nccl, .memory = comm::Memory::device});
    auto small = d->alloc<std::byte>(4096, "too small a flat area");
    c.set_flat_area(small.span());
    const std::string what = testing::what_of<InternalError>(
        [&] { c.enqueue(comm::Kind::allgather, bucket, comm::DType::f32, coll); }, "a bucket past the area");
    BOOST_TEST(testing::contains(what, "needs a flat area of " +
                                           std::to_string(2 * (align_up(h.size() * 4, 256) + align_up(g.size() * 4, 256)))),
               what);
    BOOST_TEST(testing::contains(what, "the one given has 4096 bytes"), what);
}

// ---------------------------------------------------------------------------
// The Llama family's kernels (cuda/llama.hpp): RMSNorm's rows within 1e-5
// (a warp's shuffle tree) and its weight gradient bitwise (the cpu's column
// order); rotary embeddings, SwiGLU and the embedding without a position
// table bitwise the cpu backend's; grouped-query attention close (expf), its backward alone on a
// given softmax bitwise; every one the same bits on two cuda runs.
BOOST_AUTO_TEST_CASE(llama_rmsnorm_rope_swiglu_embedding, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("llama kernels"));
    Pair p;
    // unaligned rows (7, 33), smollm's width, GPT-2's, llama-3.2-1b's
    for (const u64 C : {u64{7}, u64{33}, u64{64}, u64{77}, u64{576}, u64{768}, u64{2048}}) {
        const u64 N = 3 * kernel_math::kSumRows + 45;  // the column sums' chunks, the last short
        const Vf x = randn(N * C, rng, 2), w = randn(C, rng), dout = randn(N * C, rng);
        const Vf dinp0 = randn(N * C, rng), dw0 = randn(C, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, N * C), rstd = poisoned(d, N);
            auto dx = up(d, x), dw_ = up(d, w), go = up(d, dout), dinp = up(d, dinp0), dw = up(d, dw0);
            d.rmsnorm_forward(d.compute(), out, rstd, dx, dw_, N, C, 1e-5f);
            d.rmsnorm_backward(d.compute(), dinp, dw, go, dx, dw_, rstd, N, C);
            // The residual add folded in: dinp += dout, then its norm.
            auto out2 = poisoned(d, N * C), rstd2 = poisoned(d, N);
            d.residual_rmsnorm_forward(d.compute(), out2, rstd2, dinp, go, dw_, N, C, 1e-5f);
            return {{"out", down(d, out)}, {"rstd", down(d, rstd)}, {"dinp", down(d, dinp)}, {"dw", down(d, dw)},
                    {"residual out", down(d, out2)}, {"residual rstd", down(d, rstd2)}};
        };
        // The rows within 1e-5 (a warp's shuffle tree), dw bitwise (the cpu's
        // column order); the residual add itself is exact, so the sum it
        // leaves (the second norm's input, dinp here) is checked with dinp.
        expect_split(p.run(fn), "rmsnorm C=" + std::to_string(C), {"dw"});
        expect_same_bits(*p.gpu, fn, "rmsnorm");
        // The backward from an input stored bf16 (a Llama block's inner
        // residual kept under Shape::activations bf16): the cpu's bits.
        const V16 x16 = halves(x);
        auto bf16 = [&](Device& d) -> Outputs {
            auto out = poisoned(d, N * C), rstd = poisoned(d, N);
            auto dx = up(d, x), dw_ = up(d, w), go = up(d, dout), dinp = up(d, dinp0), dw = up(d, dw0);
            auto x16d = up(d, x16);
            d.rmsnorm_forward(d.compute(), out, rstd, dx, dw_, N, C, 1e-5f);
            d.rmsnorm_backward(d.compute(), dinp, dw, go, std::span<const std::uint16_t>(x16d), dw_, rstd, N, C);
            return {{"dinp", down(d, dinp)}, {"dw", down(d, dw)}};
        };
        expect_split(p.run(bf16), "rmsnorm backward of bf16, C=" + std::to_string(C), {"dw"});
        expect_same_bits(*p.gpu, bf16, "rmsnorm backward of bf16");
    }
    {
        const u64 B = 2, T = 13, H = 7, hd = 64, pos0 = 5;
        Vf table((pos0 + T) * hd);
        for (u64 pos = 0; pos < pos0 + T; ++pos)
            for (u64 i = 0; i < hd / 2; ++i) {
                const double a = double(pos) * std::pow(500000.0, -2.0 * double(i) / double(hd));
                table[pos * hd + i] = float(std::cos(a));
                table[pos * hd + hd / 2 + i] = float(std::sin(a));
            }
        const Vf x = randn(B * T * H * hd, rng), dy = randn(x.size(), rng);
        auto fn = [&](Device& d) -> Outputs {
            auto dx = up(d, x), g = up(d, dy), tab = up(d, table);
            d.rope_forward(d.compute(), dx, tab, B, T, H, hd, pos0);
            d.rope_backward(d.compute(), g, tab, B, T, H, hd, pos0);
            return {{"x", down(d, dx)}, {"dx", down(d, g)}};
        };
        expect_all(p.run(fn), "rope", true);
    }
    {
        Vf g = randn(100'000, rng, 4);
        g[0] = 100, g[1] = -100, g[2] = 0;
        const Vf u = randn(g.size(), rng), dout = randn(g.size(), rng);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, g.size()), dg = poisoned(d, g.size()), du = poisoned(d, g.size());
            auto dgate = up(d, g), dup = up(d, u), go = up(d, dout);
            d.swiglu_forward(d.compute(), out, dgate, dup);
            d.swiglu_backward(d.compute(), dg, du, go, dgate, dup);
            return {{"out", down(d, out)}, {"dgate", down(d, dg)}, {"dup", down(d, du)}};
        };
        expect_all(p.run(fn), "swiglu", true);
        // From gate and up kept bf16 (a Llama block's, Shape::activations),
        // the forward's output rounded to bf16: the cpu backend's bits.
        const V16 g16 = halves(g), u16 = halves(u);
        auto bf16 = [&](Device& d) -> Outputs {
            auto out = up(d, V16(g.size(), 0x7fc0));
            auto wide = poisoned(d, g.size()), dg = poisoned(d, g.size()), du = poisoned(d, g.size());
            auto dgate = up(d, g16), dup = up(d, u16);
            auto go = up(d, dout);
            const std::span<const std::uint16_t> G(dgate), U(dup);
            d.swiglu_forward(d.compute(), out.span(), G, U);
            d.cast(d.compute(), wide, std::span<const std::uint16_t>(out));
            d.swiglu_backward(d.compute(), dg, du, go, G, U);
            return {{"out", down(d, wide)}, {"dgate", down(d, dg)}, {"dup", down(d, du)}};
        };
        expect_all(p.run(bf16), "swiglu of bf16", true);
        expect_same_bits(*p.gpu, bf16, "swiglu of bf16");
    }
    {
        const u64 B = 3, T = 17, C = 72, V = 101;
        Vi tok = random_tokens(B * T, V, rng);
        tok[5] = tok[9] = tok[40] = 7;
        const Vf wte = randn(V * C, rng), dout = randn(B * T * C, rng), dwte0 = randn(V * C, rng);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, B * T * C), dte = up(d, dwte0);
            auto dt = up(d, tok);
            auto te = up(d, wte), go = up(d, dout);
            d.embedding_forward(d.compute(), out, dt, te, {}, B, T, C, V);
            d.embedding_backward(d.compute(), dte, {}, go, dt, B, T, C, V);
            return {{"out", down(d, out)}, {"dwte", down(d, dte)}};
        };
        expect_all(p.run(fn), "embedding without positions", true);
        expect_same_bits(*p.gpu, fn, "embedding without positions");
    }
}

BOOST_AUTO_TEST_CASE(llama_grouped_query_attention, *utf::precondition(GpuPresent())) {
    std::mt19937_64 rng(fresh_seed("gqa"));
    Pair p;
    struct Shape {
        u64 B, T, NH, KVH, hd;
    };
    for (const Shape s : {Shape{1, 1, 4, 2, 8}, Shape{2, 7, 6, 2, 8}, Shape{1, 70, 9, 3, 64}, Shape{2, 33, 4, 4, 16},
                          Shape{1, 40, 8, 1, 32}, Shape{2, 65, 4, 4, 16}}) {
        const u64 B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, hd = s.hd;
        const Vf q = randn(B * T * NH * hd, rng), k = randn(B * T * KVH * hd, rng), v = randn(B * T * KVH * hd, rng);
        const Vf dout = randn(q.size(), rng);
        const std::string what = "gqa B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
                                 std::to_string(NH) + " KVH=" + std::to_string(KVH);
        auto fn = [&](Device& d) -> Outputs {
            auto out = poisoned(d, q.size()), att = poisoned(d, B * NH * T * T), datt = poisoned(d, B * NH * T * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q), K = up(d, k), Vv = up(d, v), go = up(d, dout);
            d.gqa_forward(d.compute(), out, att, Q, K, Vv, B, T, NH, KVH, hd);
            d.gqa_backward(d.compute(), dq, dk, dv, datt, go, Q, K, Vv, att, B, T, NH, KVH, hd);
            return {{"out", down(d, out)}, {"att", down(d, att)}, {"dq", down(d, dq)}, {"dk", down(d, dk)},
                    {"dv", down(d, dv)}};
        };
        expect_all(p.run(fn), what);
        expect_same_bits(*p.gpu, fn, what);

        const Vf att = randn(B * NH * T * T, rng);
        auto backward = [&](Device& d) -> Outputs {
            auto datt = poisoned(d, B * NH * T * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q), K = up(d, k), Vv = up(d, v), go = up(d, dout), a = up(d, att);
            d.gqa_backward(d.compute(), dq, dk, dv, datt, go, Q, K, Vv, a, B, T, NH, KVH, hd);
            return {{"dq", down(d, dq)}, {"dk", down(d, dk)}, {"dv", down(d, dv)}};
        };
        expect_all(p.run(backward), what + " backward");
        expect_same_bits(*p.gpu, backward, what + " backward");
        // And from q, k, v and att stored bf16 (a Llama block's kept under
        // Shape::activations bf16): close too, and two runs the same bits.
        const V16 q16 = halves(q), k16 = halves(k), v16 = halves(v), att16 = halves(att);
        auto backward16 = [&](Device& d) -> Outputs {
            auto datt = poisoned(d, B * NH * T * T);
            auto dq = poisoned(d, q.size()), dk = poisoned(d, k.size()), dv = poisoned(d, v.size());
            auto Q = up(d, q16), K = up(d, k16), Vv = up(d, v16), a = up(d, att16);
            auto go = up(d, dout);
            d.gqa_backward(d.compute(), dq, dk, dv, datt, go, std::span<const std::uint16_t>(Q),
                           std::span<const std::uint16_t>(K), std::span<const std::uint16_t>(Vv),
                           std::span<const std::uint16_t>(a), B, T, NH, KVH, hd);
            return {{"dq", down(d, dq)}, {"dk", down(d, dk)}, {"dv", down(d, dv)}};
        };
        expect_all(p.run(backward16), what + " backward of bf16");
        expect_same_bits(*p.gpu, backward16, what + " backward of bf16");

        const Vf q1 = randn(NH * hd, rng), kc = randn(T * KVH * hd, rng), vc = randn(T * KVH * hd, rng);
        auto decode = [&](Device& d) -> Outputs {
            auto out = poisoned(d, NH * hd), a = poisoned(d, NH * T);
            auto Q = up(d, q1), K = up(d, kc), Vv = up(d, vc);
            d.gqa_decode(d.compute(), out, a, Q, K, Vv, T, NH, KVH, hd);
            return {{"out", down(d, out)}, {"att", down(d, a)}};
        };
        expect_all(p.run(decode), what + " decode");
    }
}
