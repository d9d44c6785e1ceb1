// The cpu backend's embedding kernels (kernels.def): the token and position
// tables' rows summed into the residual stream, and their gradients summed
// back per column block, so that each table element's sum runs over the
// positions in order whatever the thread count (llm.c's encoder). And the
// one wording of a bad token or target, every backend's.
#include "kernels.hpp"

#include <zinf/util.hpp>

#include <algorithm>
#include <string>

namespace zinf::device {
using cpu::u64;
namespace {
std::string not_an_id(std::int64_t v, u64 V) {
    return v < 0 ? "a valid token id (negative)" : "below the vocabulary size " + std::to_string(V);
}
}  // namespace

DataError bad_token(std::int64_t v, u64 b, u64 t, u64 V) {
    return DataError("token " + std::to_string(v) + " at batch row " + std::to_string(b) + ", position " +
                     std::to_string(t) + " is not " + not_an_id(v, V));
}

DataError bad_target(std::int64_t v, u64 row, u64 V) {
    return DataError("target " + std::to_string(v) + " at row " + std::to_string(row) + " is not " + not_an_id(v, V));
}
}  // namespace zinf::device

namespace zinf::device::cpu {

namespace {

// tokens (B,T): each in [0, V), else DataError naming where.
void check_tokens(const std::int32_t* tokens, u64 B, u64 T, u64 V) {
    for (u64 b = 0; b < B; ++b)
        for (u64 t = 0; t < T; ++t) {
            const std::int64_t v = tokens[b * T + t];
            if (v < 0 || static_cast<u64>(v) >= V) throw bad_token(v, b, t, V);
        }
}

// W: float, or std::uint16_t for tables stored bf16 (widened as read).
template <class W>
void embedding_rows(float* out, const std::int32_t* tokens, const W* wte, const W* wpe, u64 B, u64 T, u64 C, u64 V) {
    check_tokens(tokens, B, T, V);
#pragma omp parallel for schedule(static) if (B * T * C >= kParallelMin)
    for (u64 bt = 0; bt < B * T; ++bt) {
        const u64 t = bt % T;
        const W* te = wte + static_cast<u64>(tokens[bt]) * C;
        float* o = out + bt * C;
        if (!wpe) {  // no position table (rotary embeddings)
            for (u64 c = 0; c < C; ++c) o[c] = widen(te[c]);
            continue;
        }
        const W* pe = wpe + t * C;
        for (u64 c = 0; c < C; ++c) o[c] = widen(te[c]) + widen(pe[c]);
    }
}

// dwte and dwpe per column block, each column's sum over the positions in order.
void embedding_grad(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, u64 B, u64 T, u64 C,
                    u64 V) {
    check_tokens(tokens, B, T, V);
#pragma omp parallel for schedule(static) if (B * T * C >= kParallelMin)
    for (u64 blk = 0; blk < column_blocks(C); ++blk) {
        const u64 c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
        for (u64 bt = 0; bt < B * T; ++bt) {
            const float* d = dout + bt * C;
            float* te = dwte + static_cast<u64>(tokens[bt]) * C;
            if (!dwpe) {
                for (u64 c = c0; c < c1; ++c) te[c] += d[c];
                continue;
            }
            float* pe = dwpe + (bt % T) * C;
            for (u64 c = c0; c < c1; ++c) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

}  // namespace

void embedding_forward(std::span<float> out, std::span<const std::int32_t> tokens, ConstView wte, ConstView wpe,
                       u64 B, u64 T, u64 C, u64 V) {
    with_dtype(wte.dtype(), [&](auto e) {
        using W = decltype(e);
        embedding_rows(out.data(), tokens.data(), wte.data<W>(), wpe.empty() ? nullptr : wpe.data<W>(), B, T, C, V);
    });
}

void embedding_backward(std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                        std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) {
    embedding_grad(dwte.data(), dwpe.empty() ? nullptr : dwpe.data(), dout.data(), tokens.data(), B, T, C, V);
}

}  // namespace zinf::device::cpu
