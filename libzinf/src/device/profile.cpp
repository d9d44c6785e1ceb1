// The device profile (profile.hpp): stamps around each call, read after the
// step's synchronize and summed per name.
#include <zinf/profile.hpp>

#include "kernels.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <vector>
#include <utility>

namespace zinf::device {

Profile::Profile(Device& dev) : dev_(dev), compute_(&dev.compute()) {}

Profile::~Profile() = default;

Stamp Profile::begin(Stream& s) { return dev_.stamp(s); }

void Profile::end(Stream& s, std::string_view name, const Cost& c, Stamp before) {
    Stamp after = dev_.stamp(s);
    std::lock_guard lk(mu_);
    pending_.push_back({&s, std::string(name), c, std::move(before), std::move(after)});
}

void Profile::stage(std::string_view name, Stamp a, Stamp b) {
    std::lock_guard lk(mu_);
    pending_.push_back({compute_, std::string(name), {}, std::move(a), std::move(b), true});
}

void Profile::stage(std::string_view name, double seconds) {
    std::lock_guard lk(mu_);
    Row& r = stages_[std::string(name)];
    if (r.name.empty()) r.name = name;
    ++r.calls;
    r.seconds += seconds;
}

void Profile::collect(double step_seconds) {
    std::vector<Pending> todo, later;
    {
        std::lock_guard lk(mu_);
        todo.swap(pending_);
    }
    for (Pending& p : todo) {
        const double sec = dev_.seconds_between(p.a, p.b);
        if (std::isnan(sec)) {  // its stream has not got there yet
            later.push_back(std::move(p));
            continue;
        }
        std::string key = p.name;
        if (p.stream != compute_ && !p.stage) key += "@" + p.stream->name();
        // The call counted in the row of `name` in `rows`.
        auto tally = [&](std::map<std::string, Row>& rows, const std::string& name) {
            Row& r = rows[name];
            if (r.name.empty()) {
                r.name = name;
                r.stream = p.stream->name();
            }
            ++r.calls;
            r.seconds += sec;
            r.flops += p.cost.flops;
            r.bytes += p.cost.bytes;
        };
        std::lock_guard lk(mu_);
        tally(p.stage ? stages_ : rows_, key);
        if (!p.cost.detail.empty()) tally(details_, key + " " + p.cost.detail);
    }
    std::lock_guard lk(mu_);
    pending_.insert(pending_.begin(), std::make_move_iterator(later.begin()), std::make_move_iterator(later.end()));
    ++steps_;
    step_seconds_ += step_seconds;
}

namespace {
std::vector<Profile::Row> by_seconds(const std::map<std::string, Profile::Row>& m) {
    std::vector<Profile::Row> out;
    for (const auto& [k, r] : m) out.push_back(r);
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
    return out;
}
}  // namespace

std::vector<Profile::Row> Profile::rows() const {
    std::lock_guard lk(mu_);
    return by_seconds(rows_);
}

std::vector<Profile::Row> Profile::stages() const {
    std::lock_guard lk(mu_);
    return by_seconds(stages_);
}

std::vector<Profile::Row> Profile::details() const {
    std::lock_guard lk(mu_);
    return by_seconds(details_);
}

std::size_t Profile::uncollected() const {
    std::lock_guard lk(mu_);
    return pending_.size();
}

double Profile::compute_seconds() const {
    std::lock_guard lk(mu_);
    double sum = 0;
    for (const auto& [k, r] : rows_)
        if (k.find('@') == std::string::npos) sum += r.seconds;  // compute's: no stream named
    return sum;
}

double floor_seconds(const Profile::Row& r, const Peaks& peaks) {
    const double f = peaks.flops > 0 ? r.flops / peaks.flops : 0.0;
    const double b = peaks.bytes > 0 ? r.bytes / peaks.bytes : 0.0;
    return std::max(f, b);
}

double measure_gemm(Device& dev, const GemmShape& shape, unsigned reps) {
    if (reps == 0) throw UsageError("measure_gemm: reps must be positive");
    Gemm g = shape.g;
    g.lda = g.ldb = g.ldc = 0;  // packed
    g.stride_a = g.stride_b = g.stride_c = 0;
    g.beta = 0;
    g.alpha = 1;
    const Gemm r = cpu::resolve(g);
    const u64 na = cpu::gemm_extent_a(r), nb = cpu::gemm_extent_b(r), nc = cpu::gemm_extent_c(r);
    Stream& s = dev.compute();
    std::mt19937 rng(4321);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> host(std::max(na, nb));
    for (auto& v : host) v = dist(rng);
    std::vector<std::uint16_t> half(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) half[i] = to_bf16(host[i]);
    // An operand stored as the step stored it: fp32, or bf16.
    struct Operand {
        Array<float> f;
        Array<std::uint16_t> h;
        ConstView view() const { return f ? ConstView(f) : ConstView(h); }
    };
    auto operand = [&](DType t, u64 n, const char* what) {
        Operand o;
        if (t == DType::bf16) {
            o.h = dev.alloc<std::uint16_t>(n, what);
            dev.copy(s, std::as_writable_bytes(o.h.span()), std::as_bytes(std::span<const std::uint16_t>(half).first(n)));
        } else {
            o.f = dev.alloc<float>(n, what);
            dev.copy(s, std::as_writable_bytes(o.f.span()), std::as_bytes(std::span<const float>(host).first(n)));
        }
        return o;
    };
    const Operand a = operand(shape.a, na, "gemm rate A"), b = operand(shape.b, nb, "gemm rate B");
    auto c = dev.alloc<float>(nc, "gemm rate C");
    dev.synchronize(s);  // the host vectors go with this function
    dev.gemm(s, g, a.view(), b.view(), c);  // warm-up: plans, workspace
    Stamp t0 = dev.stamp(s);
    for (unsigned i = 0; i < reps; ++i) dev.gemm(s, g, a.view(), b.view(), c);
    Stamp t1 = dev.stamp(s);
    dev.synchronize(s);
    const double sec = dev.seconds_between(t0, t1);
    return sec > 0 ? 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
                         static_cast<double>(g.batch) * reps / sec
                   : 0.0;
}

Peaks measure_peaks(Device& dev, Precision precision, std::uint64_t gemm_n, std::uint64_t copy_bytes,
                    unsigned reps) {
    if (reps == 0 || copy_bytes == 0) throw UsageError("measure_peaks: reps and copy_bytes must be positive");
    Peaks p;
    const double bf16 = precision == Precision::bf16 ? measure_gemm_bf16_flops(dev, gemm_n, reps) : 0.0;
    if (bf16 > 0) {
        p.flops = bf16;
        p.flops_peer = "bf16_gemm";
    } else {
        p.flops = measure_gemm_flops(dev, gemm_n, reps);
        p.flops_peer = "sgemm";
    }
    // A copy within device memory on compute, timed by stamps around it (the
    // device's own clock: events on cuda), best of reps after a warm-up.
    Stream& s = dev.compute();
    auto a = dev.alloc<std::byte>(copy_bytes, "profile copy source");
    auto b = dev.alloc<std::byte>(copy_bytes, "profile copy destination");
    double best = 0;
    for (unsigned r = 0; r <= reps; ++r) {
        Stamp t0 = dev.stamp(s);
        dev.copy(s, b.span(), a.span());
        Stamp t1 = dev.stamp(s);
        dev.synchronize(s);
        const double sec = dev.seconds_between(t0, t1);
        if (r > 0 && sec > 0) best = std::max(best, 2.0 * static_cast<double>(copy_bytes) / sec);
    }
    p.bytes = best;
    return p;
}

}  // namespace zinf::device
