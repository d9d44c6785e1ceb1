// Private to libzinf's shard module: the vectorised normal generator.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::shard::detail {

// out[j] = sd * N(0,1) value number first+j of `stream` under `seed`: value v
// is output v%4 of the Philox4x32-10 block with counter {v/4, stream} and key
// seed, mapped to normals by Box-Muller on outputs (0,1) and (2,3).
void normals(std::uint64_t seed, std::uint64_t stream, std::uint64_t first, std::size_t n, float sd, float* out);

}  // namespace zinf::shard::detail
