// Unit tests of the device profile (zinf/profile.hpp) on the cpu backend:
// the cost formulas of GEMM and attention at shapes worked out by hand here
// (and attention's against the model's count), the profile's rows (calls,
// FLOPs and bytes summed as the formulas say, seconds measured where the
// kernels run and within the step's wall time), copies on another stream
// named by it and read only once that stream got there, and nothing timed
// once the profile is off.
#define BOOST_TEST_MODULE profile
#include "device_reference.hpp"

#include <zinf/device.hpp>
#include <zinf/profile.hpp>
#include <zinf/util.hpp>

#include <future>
#include <map>
#include <random>
#include <vector>

using namespace zinf;
using namespace zinf::device;
using testing::Rig;

namespace {

std::map<std::string, Profile::Row> by_name(const std::vector<Profile::Row>& rows) {
    std::map<std::string, Profile::Row> m;
    for (const auto& r : rows) m[r.name] = r;
    return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemm_cost_at_known_shapes) {
    // C (3,5) = A (3,7) B (7,5), twice (batch 2): 2*3*5*7 = 210 FLOPs a
    // matrix; A 21 floats, B 35, C 15 written: 284 bytes a matrix.
    std::vector<float> av(2 * 21), bv(2 * 35), c(2 * 15);
    const ConstView a{std::span<const float>(av)}, b{std::span<const float>(bv)};
    const Gemm g{.m = 3, .n = 5, .k = 7, .batch = 2};
    Cost k = cost::gemm(g, a, b, View(std::span<float>(c)));
    BOOST_TEST(k.flops == 420.0);
    BOOST_TEST(k.bytes == 2.0 * 4 * (21 + 35 + 15));
    // beta != 0: C read as well as written.
    Cost acc = cost::gemm(Gemm{.m = 3, .n = 5, .k = 7, .beta = 1}, a, b, View(std::span<float>(c)));
    BOOST_TEST(acc.flops == 210.0);
    BOOST_TEST(acc.bytes == 4.0 * (21 + 35 + 2 * 15));
    // A stored bf16: 2 bytes an element of it.
    std::vector<std::uint16_t> ah(21);
    Cost half = cost::gemm(Gemm{.m = 3, .n = 5, .k = 7, .inputs = Precision::bf16},
                           ConstView(std::span<const std::uint16_t>(ah)), b, View(std::span<float>(c)));
    BOOST_TEST(half.bytes == 2.0 * 21 + 4.0 * (35 + 15));
    // GPT-2 124M's MLP up-projection at B = 4, T = 1024: 2 * 4096 * 3072 * 768.
    Cost fc = cost::gemm(Gemm{.m = 4096, .n = 3072, .k = 768}, {}, {}, {});
    BOOST_TEST(fc.flops == 2.0 * 4096 * 3072 * 768);
}

BOOST_AUTO_TEST_CASE(attention_cost_at_known_shapes) {
    // B = 2, T = 4, C = 8, NH = 2: hd 4; query t sees t + 1 keys, 1+2+3+4 =
    // 10 pairs a head; 4 hd FLOPs a pair forward (the score's and the
    // value's multiply-adds): 4 * 4 * 10 * 2 heads * 2 rows = 640, the
    // model's 2 C T (T+1) per row; backward twice that.
    const Cost f = cost::attention_forward({}, {}, {}, 2, 4, 8, 2);
    BOOST_TEST(f.flops == 640.0);
    BOOST_TEST(f.flops == 2.0 * 8 * 4 * 5 * 2);
    // qkv (2,4,24) read, out (2,4,8) and att (2,2,4,4) written.
    BOOST_TEST(f.bytes == 4.0 * (2 * 4 * 24 + 2 * 4 * 8 + 2 * 2 * 4 * 4));
    std::vector<float> qkv_v(2 * 4 * 24), att_v(2 * 2 * 4 * 4);
    const ConstView qkv{std::span<const float>(qkv_v)}, att{std::span<const float>(att_v)};
    const Cost b = cost::attention_backward({}, {}, {}, qkv, att, 2, 4, 8, 2);
    BOOST_TEST(b.flops == 1280.0);
    // Grouped-query: B = 1, T = 3, 4 query heads of 8 over 2 kv heads: 6
    // pairs a head, 4 * 8 * 6 * 4 = 768; the kv heads' count does not change it.
    BOOST_TEST(cost::gqa_forward({}, {}, {}, {}, {}, 1, 3, 4, 2, 8).flops == 768.0);
    BOOST_TEST(cost::gqa_forward({}, {}, {}, {}, {}, 1, 3, 4, 4, 8).flops == 768.0);
    std::vector<float> qv(3 * 32), kvv(3 * 16), atv(4 * 9);
    const ConstView q{std::span<const float>(qv)}, kv{std::span<const float>(kvv)}, at{std::span<const float>(atv)};
    BOOST_TEST(cost::gqa_backward({}, {}, {}, {}, {}, q, kv, kv, at, 1, 3, 4, 2, 8).flops == 1536.0);
    // Decoding position T-1 = 9 of C = 8: 10 keys, 4 * 8 * 10.
    BOOST_TEST(cost::attention_decode({}, {}, {}, {}, {}, 10, 8, 2).flops == 320.0);
}

BOOST_AUTO_TEST_CASE(rows_sum_the_calls_and_their_costs) {
    Rig r(2);
    std::mt19937_64 rng(testing::fresh_seed("profile rows"));
    const u64 m = 64, n = 48, k = 80;
    auto a = r.up(testing::randn(m * k, rng));
    auto b = r.up(testing::randn(k * n, rng));
    auto c = r->alloc<float>(m * n, "c");
    auto bias = r.up(testing::randn(n, rng));
    Profile prof(*r.dev);
    r->set_profile(&prof);
    Timer t;
    for (int i = 0; i < 3; ++i) r->gemm(r.s(), Gemm{.m = m, .n = n, .k = k}, a, b, c);
    r->bias_add(r.s(), c, bias, m, n);
    r->synchronize(r.s());
    const double wall = t.seconds();
    r->set_profile(nullptr);
    prof.collect(wall);
    // Off: not timed, not counted.
    r->bias_add(r.s(), c, bias, m, n);
    r->synchronize(r.s());
    prof.collect(0);

    auto rows = by_name(prof.rows());
    BOOST_TEST_REQUIRE(rows.count("gemm") == 1u);
    BOOST_TEST_REQUIRE(rows.count("bias_add") == 1u);
    BOOST_TEST(rows.size() == 2u);
    BOOST_TEST(rows["gemm"].calls == 3u);
    BOOST_TEST(rows["gemm"].flops == 3.0 * 2 * m * n * k);
    BOOST_TEST(rows["gemm"].bytes == 3.0 * 4 * (m * k + k * n + m * n));
    BOOST_TEST(rows["bias_add"].calls == 1u);
    BOOST_TEST(rows["bias_add"].flops == double(m * n));
    BOOST_TEST(rows["gemm"].stream == "compute");
    // Timed on the worker, between its jobs: each positive, together within
    // the wall time the host saw from before the first enqueue to after the
    // synchronize.
    BOOST_TEST(rows["gemm"].seconds > 0);
    BOOST_TEST(rows["bias_add"].seconds > 0);
    BOOST_TEST(prof.compute_seconds() == rows["gemm"].seconds + rows["bias_add"].seconds);
    BOOST_TEST(prof.compute_seconds() <= wall);
    BOOST_TEST(prof.steps() == 2u);
    BOOST_TEST(prof.step_seconds() == wall);
    BOOST_TEST(prof.uncollected() == 0u);
}

BOOST_AUTO_TEST_CASE(stamps_are_read_once_their_stream_got_there) {
    Rig r(2);
    std::vector<float> src(1 << 16, 1.5f);
    auto dst = r->alloc<float>(src.size(), "dst");
    Profile prof(*r.dev);
    r->set_profile(&prof);
    // The h2d stream held by a host job until the promise is kept: its copy
    // has not run when the first collect reads.
    std::promise<void> go;
    auto held = go.get_future().share();
    device::Stream& h2d = r->h2d();
    r->host(h2d, [held] { held.wait(); });
    r->copy(h2d, std::as_writable_bytes(dst.span()), std::as_bytes(std::span<const float>(src)));
    r->set_profile(nullptr);
    prof.collect(0.001);
    BOOST_TEST(prof.uncollected() == 1u);
    BOOST_TEST(prof.rows().empty());
    go.set_value();
    r->synchronize(h2d);
    prof.collect(0.001);
    BOOST_TEST(prof.uncollected() == 0u);
    auto rows = by_name(prof.rows());
    BOOST_TEST_REQUIRE(rows.count("copy@h2d") == 1u);
    BOOST_TEST(rows["copy@h2d"].stream == "h2d");
    BOOST_TEST(rows["copy@h2d"].bytes == 2.0 * 4 * src.size());
    BOOST_TEST(rows["copy@h2d"].seconds > 0);
    // Another stream's rows are not compute's: they overlap the step.
    BOOST_TEST(prof.compute_seconds() == 0.0);
}

BOOST_AUTO_TEST_CASE(stages_and_floors) {
    Rig r(1);
    Profile prof(*r.dev);
    auto x = r->alloc<float>(1 << 16, "x");
    Stamp a = r->stamp(r.s());
    r->zero(r.s(), x);
    Stamp b = r->stamp(r.s());
    prof.stage("zeroing", a, b);
    prof.stage("engine", 0.25);
    prof.stage("engine", 0.5);
    r->synchronize(r.s());
    prof.collect(1);
    auto st = by_name(prof.stages());
    BOOST_TEST_REQUIRE(st.count("zeroing") == 1u);
    BOOST_TEST(st["zeroing"].seconds >= 0);
    BOOST_TEST(st["engine"].calls == 2u);
    BOOST_TEST(st["engine"].seconds == 0.75);
    BOOST_TEST(prof.rows().empty());  // stages are not kernels
    // The floor: the longer of FLOPs at the FLOP peak and bytes at the byte peak.
    Profile::Row row{.name = "k", .calls = 1, .seconds = 1, .flops = 1e9, .bytes = 4e9};
    BOOST_TEST(floor_seconds(row, {.flops = 1e10, .bytes = 1e10}) == 0.4);
    BOOST_TEST(floor_seconds(row, {.flops = 1e9, .bytes = 1e10}) == 1.0);
    BOOST_TEST(floor_seconds(row, {}) == 0.0);
}

BOOST_AUTO_TEST_CASE(peaks_are_measured) {
    Rig r(2);
    const Peaks p = measure_peaks(*r.dev, Precision::fp32, 256, 8 * MiB, 2);
    BOOST_TEST(p.flops > 1e6);  // any CPU of this decade does a 256^3 sgemm faster than 1 MFLOP/s
    BOOST_TEST(p.bytes > 1e6);
    BOOST_TEST(p.flops_peer == "sgemm");
    // bf16 on cpu has no bf16 GEMM: held to sgemm.
    BOOST_TEST(measure_peaks(*r.dev, Precision::bf16, 256, 1 * MiB, 1).flops_peer == "sgemm");
}

BOOST_AUTO_TEST_CASE(gemm_rows_name_their_shape) {
    const Gemm g{.ta = true, .m = 4096, .n = 2304, .k = 768, .batch = 3, .inputs = Precision::bf16};
    const std::string d = gemm_detail(g, DType::bf16, DType::f32);
    BOOST_TEST(d == "4096x2304x768 T N x3 bf16 bf16 fp32");
    const auto back = gemm_of_detail(d);
    BOOST_TEST_REQUIRE(back.has_value());
    BOOST_TEST(back->g.ta);
    BOOST_TEST(!back->g.tb);
    BOOST_TEST(back->g.m == 4096u);
    BOOST_TEST(back->g.n == 2304u);
    BOOST_TEST(back->g.k == 768u);
    BOOST_TEST(back->g.batch == 3u);
    BOOST_TEST((back->g.inputs == Precision::bf16));
    BOOST_TEST((back->a == DType::bf16 && back->b == DType::f32));
    for (const char* bad : {"", "4096x2304x768 T N x3 bf16 bf16", "4096x2304x768 T N x3 bf16 bf16 fp32 extra",
                            "4096x2304x768 Q N x3 bf16 bf16 fp32", "0x1x1 N N x1 fp32 fp32 fp32",
                            "1x1x1 N N x1 fp16 fp32 fp32"})
        BOOST_TEST(!gemm_of_detail(bad).has_value(), "'" << bad << "' read as a GEMM");
    // A profiled GEMM's finer row carries its shape, and measure_gemm times that shape.
    Rig r(2);
    std::mt19937_64 rng(testing::fresh_seed("gemm detail"));
    const u64 m = 32, n = 24, k = 40;
    auto a = r.up(testing::randn(k * m, rng));
    auto b = r.up(testing::randn(k * n, rng));
    auto c = r->alloc<float>(m * n, "c");
    Profile prof(*r.dev);
    r->set_profile(&prof);
    r->gemm(r.s(), Gemm{.ta = true, .m = m, .n = n, .k = k}, a, b, c);
    r->set_profile(nullptr);
    r->synchronize(r.s());
    prof.collect(1);
    const auto details = prof.details();
    BOOST_TEST_REQUIRE(details.size() == 1u);
    BOOST_TEST(details[0].name == "gemm 32x24x40 T N x1 fp32 fp32 fp32");
    BOOST_TEST(details[0].calls == 1u);
    const auto shape = gemm_of_detail(details[0].name.substr(5));
    BOOST_TEST_REQUIRE(shape.has_value());
    BOOST_TEST(measure_gemm(*r.dev, *shape, 3) > 0);
    BOOST_TEST(measure_gemm(*r.dev, {.g = Gemm{.m = 16, .n = 16, .k = 16, .inputs = Precision::bf16},
                                     .a = DType::bf16, .b = DType::f32}, 2) > 0);
}
