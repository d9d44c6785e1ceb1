// The cuda backend's embedding kernels (kernels.hpp): the tables' rows
// summed into the residual stream, and their gradients, each table element's
// sum on one thread in position order, as the cpu kernel sums it (no
// atomics). The tokens are checked first (check_ids): a bad one's row is
// skipped here and reported at the next synchronize.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// W: float, or std::uint16_t for tables stored bf16 (widened as read).
template <class W>
__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const W* wte, const W* wpe, u64 B,
                                         u64 T, u64 C, u64 V) {
    for (u64 i = global_id(); i < B * T * C; i += grid_threads()) {
        const u64 bt = i / C, c = i % C;
        const long long tok = tokens[bt];
        if (tok < 0 || static_cast<u64>(tok) >= V) continue;  // reported by check_ids
        const float te = widen(wte[static_cast<u64>(tok) * C + c]);
        out[i] = wpe ? te + widen(wpe[bt % T * C + c]) : te;
    }
}

// dwte: the vocabulary split into kGroups classes (id mod kGroups); thread
// (class g, column c) walks every position in order and adds the rows of the
// ids in its class, so each dwte element is summed by one thread in position
// order, as the cpu kernel does. Every thread of a block shares g and reads
// the same token at each step: no divergence.
constexpr u64 kGroups = 64;
__global__ void embedding_backward_wte_kernel(float* dwte, const float* dout, const std::int32_t* tokens, u64 BT,
                                              u64 C, u64 V) {
    const u64 c = u64{blockIdx.x} * blockDim.x + threadIdx.x;
    const u64 g = blockIdx.y;
    if (c >= C) return;
    for (u64 bt = 0; bt < BT; ++bt) {
        const long long tok = tokens[bt];
        if (tok < 0 || static_cast<u64>(tok) >= V || static_cast<u64>(tok) % kGroups != g) continue;
        dwte[static_cast<u64>(tok) * C + c] += dout[bt * C + c];
    }
}

// dwpe[t][c] += sum over b in order.
__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, u64 B, u64 T, u64 C) {
    const u64 i = global_id();
    if (i >= T * C) return;
    float acc = dwpe[i];
    for (u64 b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] = acc;
}

}  // namespace

cudaError_t preload_embedding() {
    return load_kernels(embedding_forward_kernel<float>, embedding_forward_kernel<std::uint16_t>,
                        embedding_backward_wte_kernel, embedding_backward_wpe_kernel);
}

void embedding_forward(const Launch& l, std::span<float> out, std::span<const std::int32_t> tokens, ConstView wte,
                       ConstView wpe, u64 B, u64 T, u64 C, u64 V) {
    check_ids(l, tokens.data(), B * T, T, V, kTokens);
    if (!B || !T || !C) return;
    with_dtype(wte.dtype(), [&](auto e) {
        using W = decltype(e);
        embedding_forward_kernel<<<blocks_for(B * T * C), kThreads, 0, l.stream>>>(
            out.data(), tokens.data(), wte.data<W>(), wpe.empty() ? nullptr : wpe.data<W>(), B, T, C, V);
    });
}

void embedding_backward(const Launch& l, std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                        std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) {
    check_ids(l, tokens.data(), B * T, T, V, kTokens);
    if (!B || !T || !C) return;
    const dim3 grid(blocks_for(C, 128), kGroups);
    embedding_backward_wte_kernel<<<grid, 128, 0, l.stream>>>(dwte.data(), dout.data(), tokens.data(), B * T, C, V);
    if (!dwpe.empty())
        embedding_backward_wpe_kernel<<<blocks_for(T * C), kThreads, 0, l.stream>>>(dwpe.data(), dout.data(), B, T,
                                                                                    C);
}

}  // namespace zinf::device::cuda
