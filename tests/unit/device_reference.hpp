// What the cpu backend's kernel suites share (test_device, test_device_llama):
// the comparisons against double-precision references, central finite
// differences, and a cpu device with copies in and out of it.
#pragma once

#include "device_testing.hpp"

#include <zinf/device.hpp>
#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace zinf::testing {

using Vf = std::vector<float>;
using Vd = std::vector<double>;

inline Vd dbl(const Vf& v) { return Vd(v.begin(), v.end()); }

// max |got - ref| over max |ref|: the error relative to the values' magnitude.
template <class G>
double max_err(const std::vector<G>& got, const Vd& ref) {
    BOOST_REQUIRE_EQUAL(got.size(), ref.size());
    double scale = 0, err = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        scale = std::max(scale, std::abs(ref[i]));
        err = std::max(err, std::abs(double(got[i]) - ref[i]));
        if (!std::isfinite(double(got[i]))) return INFINITY;
    }
    return scale > 0 ? err / scale : err;
}

inline Vd plus(const Vf& a, const Vd& b) {
    Vd r(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) r[i] = a[i] + b[i];
    return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The gradient of f at x by central differences, in double.
inline Vd numeric_grad(const std::function<double(const Vd&)>& f, Vd x, double h = 1e-6) {
    Vd g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + h;
        const double up = f(x);
        x[i] = keep - h;
        const double down = f(x);
        x[i] = keep;
        g[i] = (up - down) / (2 * h);
    }
    return g;
}

inline double dot(const Vd& a, const Vd& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// A device and the copies in and out of it, all on the compute stream.
struct Rig {
    std::unique_ptr<device::Device> dev;
    std::vector<std::shared_ptr<void>> held;  // after dev: freed before it
    explicit Rig(unsigned threads = 0, std::uint64_t bytes = 256 * MiB)
        : dev(device::open({.backend = "cpu", .memory_bytes = bytes, .threads = threads})) {}
    device::Stream& s() { return dev->compute(); }
    device::Device* operator->() { return dev.get(); }

    template <class T>
    device::Array<T> up(const std::vector<T>& v) {
        auto a = dev->alloc<T>(v.size(), "test input");
        dev->copy(s(), std::as_writable_bytes(a.span()), std::as_bytes(std::span<const T>(v)));
        dev->synchronize(s());  // `v` may go as soon as this returns
        return a;
    }
    // An input that lives as long as the rig: work on a stream may still read
    // it after the statement that enqueued that work.
    template <class T>
    std::span<const T> in(const std::vector<T>& v) {
        auto a = std::make_shared<device::Array<T>>(up(v));
        held.push_back(a);
        return *a;
    }
    template <class T>
    std::vector<T> down(const device::Array<T>& a) {
        std::vector<T> v(a.size());
        dev->copy(s(), std::as_writable_bytes(std::span<T>(v)), std::as_bytes(a.span()));
        dev->synchronize(s());
        return v;
    }
};

// The column sums' order (kernels.def's bias_backward), written out: for
// each column c, chunks of R rows each summed in row order from zero, the
// chunks' sums in order from zero, then base[c] + the total. term(r, c) is
// each row's term (its own statement: nothing fused into the sums).
template <class Term>
std::vector<float> column_sum_order(const std::vector<float>& base, std::uint64_t N, std::uint64_t C,
                                    std::uint64_t R, Term term) {
    std::vector<float> out(C);
    for (std::uint64_t c = 0; c < C; ++c) {
        float total = 0;
        for (std::uint64_t r0 = 0; r0 < N; r0 += R) {
            float part = 0;
            for (std::uint64_t r = r0; r < std::min(N, r0 + R); ++r) {
                const float t = term(r, c);
                part += t;
            }
            total += part;
        }
        out[c] = base[c] + total;
    }
    return out;
}

// ---------------------------------------------------------------------------
// The attention kernels as the cpu backend ran them before their GEMM
// decomposition (issue 43): a task per (b, t, h) of dot products against each
// key (eight lanes), the softmax, the sum over positions; the backward a task
// per query row (datt, then dq), then per key (dk and dv over the group's
// query heads, then the query positions). The GEMM form is held to it within
// 1e-5. Grouped-query form: q (B,T,..) of row stride qs, head h at h*hd; k
// and v of row stride ks, kv head h / (NH/KVH) at that times hd; out and
// dout of row stride os; dq of row stride dqs, dk and dv of dks.
struct TodayHeads {
    std::uint64_t B, T, NH, KVH, hd, qs, ks, os;
};

inline float dot8(const float* a, const float* b, std::uint64_t n) {
    float acc[8] = {};
    std::uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += a[i] * b[i];
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

inline void today_attention_forward(const TodayHeads& x, const float* q, const float* k, const float* v, float* att,
                                    float* out) {
    const std::uint64_t T = x.T, hd = x.hd, group = x.NH / x.KVH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (std::uint64_t b = 0; b < x.B; ++b)
        for (std::uint64_t h = 0; h < x.NH; ++h)
            for (std::uint64_t t = 0; t < T; ++t) {
                const std::uint64_t g = h / group;
                const float* qq = q + (b * T + t) * x.qs + h * hd;
                float* a = att + ((b * x.NH + h) * T + t) * T;
                float mx = -INFINITY;
                for (std::uint64_t t2 = 0; t2 <= t; ++t2) {
                    a[t2] = dot8(qq, k + (b * T + t2) * x.ks + g * hd, hd) * scale;
                    mx = std::max(mx, a[t2]);
                }
                float sum = 0;
                for (std::uint64_t t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - mx));
                const float inv = sum == 0 ? 0.0f : 1.0f / sum;
                for (std::uint64_t t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
                for (std::uint64_t t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
                float* o = out + (b * T + t) * x.os + h * hd;
                std::fill(o, o + hd, 0.0f);
                for (std::uint64_t t2 = 0; t2 <= t; ++t2)
                    for (std::uint64_t i = 0; i < hd; ++i) o[i] += a[t2] * v[(b * T + t2) * x.ks + g * hd + i];
            }
}

inline void today_attention_backward(const TodayHeads& x, const float* dout, const float* q, const float* k,
                                     const float* v, const float* att, float* dq, std::uint64_t dqs, float* dk,
                                     float* dv, std::uint64_t dks) {
    const std::uint64_t T = x.T, hd = x.hd, group = x.NH / x.KVH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> datt(x.B * x.NH * T * T);
    for (std::uint64_t b = 0; b < x.B; ++b)
        for (std::uint64_t h = 0; h < x.NH; ++h)
            for (std::uint64_t t = 0; t < T; ++t) {
                const std::uint64_t g = h / group;
                const float* a = att + ((b * x.NH + h) * T + t) * T;
                float* da = datt.data() + ((b * x.NH + h) * T + t) * T;
                const float* go = dout + (b * T + t) * x.os + h * hd;
                for (std::uint64_t t2 = 0; t2 <= t; ++t2) da[t2] = dot8(v + (b * T + t2) * x.ks + g * hd, go, hd);
                const float s = dot8(a, da, t + 1);
                for (std::uint64_t t2 = 0; t2 <= t; ++t2) da[t2] = a[t2] * (da[t2] - s);
                float* d = dq + (b * T + t) * dqs + h * hd;
                std::fill(d, d + hd, 0.0f);
                for (std::uint64_t t2 = 0; t2 <= t; ++t2)
                    for (std::uint64_t i = 0; i < hd; ++i)
                        d[i] += (da[t2] * scale) * k[(b * T + t2) * x.ks + g * hd + i];
            }
    for (std::uint64_t b = 0; b < x.B; ++b)
        for (std::uint64_t g = 0; g < x.KVH; ++g)
            for (std::uint64_t t2 = 0; t2 < T; ++t2) {
                float* dkk = dk + (b * T + t2) * dks + g * hd;
                float* dvv = dv + (b * T + t2) * dks + g * hd;
                std::fill(dkk, dkk + hd, 0.0f);
                std::fill(dvv, dvv + hd, 0.0f);
                for (std::uint64_t h = g * group; h < (g + 1) * group; ++h)
                    for (std::uint64_t t = t2; t < T; ++t) {
                        const float wt = att[((b * x.NH + h) * T + t) * T + t2];
                        const float gs = datt[((b * x.NH + h) * T + t) * T + t2] * scale;
                        for (std::uint64_t i = 0; i < hd; ++i) {
                            dvv[i] += wt * dout[(b * T + t) * x.os + h * hd + i];
                            dkk[i] += gs * q[(b * T + t) * x.qs + h * hd + i];
                        }
                    }
            }
}

}  // namespace zinf::testing
