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

}  // namespace zinf::testing
