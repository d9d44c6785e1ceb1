// zinf-pinstress: the stress run (threads leasing, filling, hashing and checking
// pinned buffers) and the copy-bandwidth measurements.
#pragma once

#include <zinf/mem.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace zinf::pinstress {

// Lease latencies in a fixed histogram (no allocation while the run goes, so
// the resident set stays flat): 16 sub-buckets per power of two of ns.
class Histogram {
public:
    void add(std::uint64_t ns);
    void merge(const Histogram& o);
    std::uint64_t count() const { return count_; }
    std::uint64_t max_ns() const { return max_; }
    // The upper edge of the bucket holding quantile q (0..1), in ns.
    double quantile_ns(double q) const;

private:
    static constexpr int kSub = 16;
    static std::size_t bucket(std::uint64_t ns);
    static std::uint64_t upper(std::size_t b);
    std::array<std::uint64_t, 64 * kSub> n_{};
    std::uint64_t count_ = 0, max_ = 0;
};

enum class Inject { none, corrupt, leak };

struct StressSpec {
    unsigned threads = 4;
    double seconds = 5;
    std::size_t max_lease = 2;     // buffers per lease_many, drawn from 1..max_lease
    double max_hold_us = 1000;     // hold time drawn from 0..max_hold_us
    std::uint64_t seed = 0;
    Inject inject = Inject::none;
};

struct Problem {
    std::string what;  // "corrupt", "leak" or "error"
    std::string message;
};

struct StressResult {
    Histogram latency;           // per lease call, ns
    std::uint64_t rounds = 0;    // lease, fill, hash, hold, check, release
    std::uint64_t bytes_checked = 0;
    double seconds = 0;
    std::vector<Problem> problems;
};

// Runs the stress; returns what it saw (a lease timeout or other error is a
// problem of kind "error", the run stops early).
StressResult stress(mem::PinnedPool& pool, const StressSpec& spec, const std::atomic<bool>& stop);

struct CopyResult {
    std::string what;  // "memcpy", "h2d", "d2h"
    std::uint64_t bytes = 0;
    double pinned_gibps = 0;
    double pageable_gibps = 0;
};

// memcpy into a pinned buffer versus into pageable memory; with a CUDA device
// also host->device and device->host, pinned versus pageable. `pageable` is
// ordinary memory of at least `bytes`, allocated (and touched) by the caller
// before the run so that the resident set does not move.
std::vector<CopyResult> copy_bandwidth(mem::PinnedPool& pool, mem::DeviceArena* arena, std::span<std::byte> pageable,
                                       std::span<std::byte> source, unsigned rounds);

// Fills `buf` (a multiple of 8 bytes is filled, the rest left) with
// mt19937_64 words drawn from `seed`: the copy source, the same for a seed.
void fill_random(std::span<std::byte> buf, std::uint64_t seed);

}  // namespace zinf::pinstress
