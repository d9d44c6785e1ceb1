// zinf-optbench's OpenMP loops (loops.cpp): its fills and its memory
// bandwidth. They are built by the library's compiler at -O2 with OpenMP,
// apart from the program's main, which is built as every program's option
// file is (Makefile: clang -O0 and the programs' precompiled header).
#pragma once

#include <cstdint>
#include <span>

namespace zinf::bench {

// Random values in [-scale, scale) (positive: (0.01, 1.01) * scale), every
// thread its own counter-based stream: the same values for any thread count.
void fill(std::span<float> v, std::uint64_t seed, float scale, bool positive = false);

// Memory bandwidth in GiB/s (bytes read plus bytes written), all threads,
// best of 5, on buffers well past the caches: `copy` from one buffer to
// another (memcpy, as STREAM's Copy), and `streams`, the update's own
// pattern with no arithmetic to speak of: four arrays read, three of them
// written back in place (w += g, m += g, v += g).
struct Bandwidth {
    double copy = 0, streams = 0;
    double bound() const { return copy > streams ? copy : streams; }
};
// n floats per array (clamped to 64-256 MiB); threads 0: OpenMP's default.
Bandwidth memory_gibps(std::uint64_t n, unsigned threads);

// OpenMP's default thread count.
unsigned max_threads();

}  // namespace zinf::bench
