// The device profile (profile.hpp): stamps around each call, read after the
// step's synchronize and summed per name.
#include <zinf/profile.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
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
        std::lock_guard lk(mu_);
        Row& r = (p.stage ? stages_ : rows_)[key];
        if (r.name.empty()) {
            r.name = key;
            r.stream = p.stream->name();
        }
        ++r.calls;
        r.seconds += sec;
        r.flops += p.cost.flops;
        r.bytes += p.cost.bytes;
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
