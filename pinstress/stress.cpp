#include "stress.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace zinf::pinstress {

// ---------------------------------------------------------------------------
std::size_t Histogram::bucket(std::uint64_t ns) {
    if (ns < kSub) return static_cast<std::size_t>(ns);
    const int e = std::bit_width(ns) - 1;                                  // 2^e <= ns
    const auto sub = static_cast<std::size_t>((ns >> (e - 4)) & (kSub - 1));  // the 4 bits below the top
    return static_cast<std::size_t>(e - 3) * kSub + sub;
}

std::uint64_t Histogram::upper(std::size_t b) {
    if (b < kSub) return b;
    const int e = static_cast<int>(b / kSub) + 3;
    const std::uint64_t sub = b % kSub;
    return ((kSub + sub + 1) << (e - 4)) - 1;
}

void Histogram::add(std::uint64_t ns) {
    ++n_[std::min(bucket(ns), n_.size() - 1)];
    ++count_;
    max_ = std::max(max_, ns);
}

void Histogram::merge(const Histogram& o) {
    for (std::size_t i = 0; i < n_.size(); ++i) n_[i] += o.n_[i];
    count_ += o.count_;
    max_ = std::max(max_, o.max_);
}

double Histogram::quantile_ns(double q) const {
    if (count_ == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count_)));
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < n_.size(); ++b) {
        seen += n_[b];
        if (seen >= std::max<std::uint64_t>(rank, 1)) return static_cast<double>(std::min(upper(b), max_));
    }
    return static_cast<double>(max_);
}

// ---------------------------------------------------------------------------
namespace {

// The pattern a holder writes: keyed by (thread, round, buffer), so a buffer
// shared by mistake, or stale data from an earlier round, cannot match.
void fill(std::span<std::byte> buf, std::uint64_t key) {
    std::uint64_t x = key * 0x9E3779B97F4A7C15ull + 1;
    std::size_t i = 0;
    for (; i + 8 <= buf.size(); i += 8) {
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        std::memcpy(buf.data() + i, &x, 8);
    }
    for (; i < buf.size(); ++i) buf[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

std::uint64_t key_of(unsigned thread, std::uint64_t round, std::size_t j) {
    return (std::uint64_t(thread) << 48) ^ (round << 8) ^ j;
}

// The first byte that differs from the pattern, for the report.
std::size_t first_difference(std::span<const std::byte> got, std::uint64_t key, std::vector<std::byte>& scratch) {
    scratch.resize(got.size());
    fill(scratch, key);
    auto [a, b] = std::mismatch(got.begin(), got.end(), scratch.begin());
    return static_cast<std::size_t>(a - got.begin());
}

// Leases kept past their owner's end by --inject leak, held for the process's life.
std::vector<mem::Lease>& leaked() {
    static std::vector<mem::Lease> v;
    return v;
}

}  // namespace

StressResult stress(mem::PinnedPool& pool, const StressSpec& spec, const std::atomic<bool>& stop) {
    StressResult total;
    std::mutex mu;
    std::atomic<bool> halt{false};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(spec.seconds);
    Timer clock;

    auto worker = [&](unsigned t) {
        std::mt19937_64 rng(spec.seed ^ (0xA24BAED4963EE407ull * (t + 1)));
        std::uniform_int_distribution<std::size_t> n_of(1, std::min(spec.max_lease, pool.buffers()));
        std::uniform_int_distribution<std::uint64_t> len_of(1, pool.buffer_bytes());
        std::uniform_real_distribution<double> hold_of(0, spec.max_hold_us);
        const std::string who = "pinstress thread " + std::to_string(t);
        Histogram hist;
        std::uint64_t rounds = 0, checked = 0;
        std::vector<Problem> problems;
        std::vector<std::byte> scratch;
        std::vector<std::uint64_t> hashes(spec.max_lease), lens(spec.max_lease);
        try {
            while (!halt.load(std::memory_order_relaxed) && !stop.load(std::memory_order_relaxed) &&
                   std::chrono::steady_clock::now() < deadline) {
                const std::size_t n = n_of(rng);
                const auto t0 = std::chrono::steady_clock::now();
                auto leases = n == 1 ? [&] {
                    std::vector<mem::Lease> one;
                    one.push_back(pool.lease(who));
                    return one;
                }() : pool.lease_many(n, who);
                hist.add(static_cast<std::uint64_t>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
                for (std::size_t j = 0; j < n; ++j) {
                    lens[j] = len_of(rng);
                    auto b = leases[j].bytes().first(lens[j]);
                    fill(b, key_of(t, rounds, j));
                    hashes[j] = xxh3(b);
                }
                if (spec.inject == Inject::corrupt && t == 0 && rounds == 1)
                    leases[0].bytes()[lens[0] / 2] ^= std::byte{0x5A};
                const double hold = hold_of(rng);
                if (hold >= 1) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(hold));
                for (std::size_t j = 0; j < n; ++j) {
                    auto b = leases[j].bytes().first(lens[j]);
                    checked += b.size();
                    if (xxh3(b) == hashes[j]) continue;
                    std::ostringstream os;
                    os << "buffer " << leases[j].index() << " leased by thread " << t << " in round " << rounds
                       << " changed while held: first bad byte at offset "
                       << first_difference(b, key_of(t, rounds, j), scratch) << " of " << b.size();
                    problems.push_back({"corrupt", os.str()});
                }
                if (spec.inject == Inject::leak && t == 0 && rounds == 2) {
                    std::lock_guard lk(mu);
                    leaked().push_back(std::move(leases.back()));
                }
                ++rounds;
            }
        } catch (const std::exception& e) {
            problems.push_back({"error", e.what()});
            halt = true;
        }
        std::lock_guard lk(mu);
        total.latency.merge(hist);
        total.rounds += rounds;
        total.bytes_checked += checked;
        for (auto& p : problems) total.problems.push_back(std::move(p));
    };

    std::vector<std::thread> threads;
    std::vector<std::thread::id> ids;
    for (unsigned t = 0; t < spec.threads; ++t) {
        threads.emplace_back(worker, t);
        ids.push_back(threads.back().get_id());
    }
    for (auto& th : threads) th.join();
    total.seconds = clock.seconds();

    // Every lease must have come back with its owner's end.
    for (const mem::Holder& h : pool.holders()) {
        auto it = std::find(ids.begin(), ids.end(), h.thread);
        if (it == ids.end()) continue;
        std::ostringstream os;
        os.precision(3);
        os << "buffer " << h.buffer << " leased by '" << h.who << "' " << h.held_seconds
           << "s ago is still held after its thread ended";
        total.problems.push_back({"leak", os.str()});
    }
    return total;
}

// ---------------------------------------------------------------------------
namespace {

double gibps(std::uint64_t bytes, double seconds) {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / static_cast<double>(GiB) : 0;
}

// Bandwidth of `copy` over `rounds` after one warm-up.
template <class F>
double measure(std::uint64_t bytes, unsigned rounds, F copy) {
    copy();
    Timer t;
    for (unsigned r = 0; r < rounds; ++r) copy();
    return gibps(bytes * rounds, t.seconds());
}

}  // namespace

void fill_random(std::span<std::byte> buf, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::size_t i = 0; i + 8 <= buf.size(); i += 8) {
        const std::uint64_t x = rng();
        std::memcpy(buf.data() + i, &x, 8);
    }
}

std::vector<CopyResult> copy_bandwidth(mem::PinnedPool& pool, mem::DeviceArena* arena, std::span<std::byte> pageable,
                                       std::span<std::byte> source, unsigned rounds) {
    auto lease = pool.lease("pinstress copy");
    const std::size_t n = std::min({lease.size(), pageable.size(), source.size()});
    auto pinned = lease.bytes().first(n);
    auto paged = pageable.first(n);
    std::vector<CopyResult> out;
    out.push_back({"memcpy", n,
                   measure(n, rounds, [&] { std::memcpy(pinned.data(), source.data(), n); }),
                   measure(n, rounds, [&] { std::memcpy(paged.data(), source.data(), n); })});
    if (arena && arena->on_gpu()) {
        mem::Block dev = arena->allocate(n, "pinstress copy");
        out.push_back({"h2d", n, measure(n, rounds, [&] { arena->copy_in(dev, 0, pinned); }),
                       measure(n, rounds, [&] { arena->copy_in(dev, 0, paged); })});
        out.push_back({"d2h", n, measure(n, rounds, [&] { arena->copy_out(pinned, dev, 0); }),
                       measure(n, rounds, [&] { arena->copy_out(paged, dev, 0); })});
    }
    return out;
}

}  // namespace zinf::pinstress
