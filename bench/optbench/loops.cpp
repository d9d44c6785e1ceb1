// zinf-optbench's OpenMP loops (loops.hpp says why they are a file of their own).
#include "loops.hpp"

#include <zinf/util.hpp>

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace zinf::bench {

// Random values in [-scale, scale), every thread its own counter-based stream.
void fill(std::span<float> v, std::uint64_t seed, float scale, bool positive) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < v.size(); ++i) {
        std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
        v[i] = positive ? (u + 0.01f) * scale : (2 * u - 1) * scale;
    }
}

Bandwidth memory_gibps(std::uint64_t n, unsigned threads) {
    n = std::clamp<std::uint64_t>(n, 16 << 20, 64 << 20);  // 64MiB to 256MiB per array
    const std::size_t bytes = n * 4;
    const int th = threads ? static_cast<int>(threads) : omp_get_max_threads();
    auto best = [&](std::size_t moved, auto pass) {
        double t = 1e30;
        for (int round = 0; round < 6; ++round) {
            Timer tm;
            pass();
            if (round) t = std::min(t, tm.seconds());  // the first is a warm-up
        }
        return static_cast<double>(moved) / GiB / t;
    };
    Bandwidth bw;
    AlignedBuffer a = AlignedBuffer::allocate(bytes), b = AlignedBuffer::allocate(bytes);
    std::memset(a.data(), 1, bytes);
    const std::size_t piece = 1 << 20, pieces = (bytes + piece - 1) / piece;
    bw.copy = best(2 * bytes, [&] {
#pragma omp parallel for num_threads(th) schedule(static)
        for (std::size_t i = 0; i < pieces; ++i)
            std::memcpy(b.data() + i * piece, a.data() + i * piece, std::min(piece, bytes - i * piece));
    });
    AlignedBuffer c = AlignedBuffer::allocate(bytes), d = AlignedBuffer::allocate(bytes);
    float *w = reinterpret_cast<float*>(a.data()), *m = reinterpret_cast<float*>(b.data()),
          *v = reinterpret_cast<float*>(c.data());
    const float* g = reinterpret_cast<const float*>(d.data());
    bw.streams = best(7 * bytes, [&] {
#pragma omp parallel for simd num_threads(th) schedule(static)
        for (std::size_t i = 0; i < n; ++i) {
            w[i] += g[i];
            m[i] += g[i];
            v[i] += g[i];
        }
    });
    return bw;
}

unsigned max_threads() { return static_cast<unsigned>(omp_get_max_threads()); }

}  // namespace zinf::bench
