// The cuda backend's row kernels: embedding, layernorm, and the sums over
// rows (dbias, dwte, dwpe, dw, db). Each sum over rows is one thread per
// output element walking the rows in order, as the cpu kernel's column
// blocks do, so the bits are the cpu backend's and never depend on the GPU
// (no atomics). LayerNorm's per-row sums are eight threads per row in the cpu
// backend's lane order (common.cuh).
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// dbias[o] += dout[0][o] + dout[1][o] + ... in row order.
__global__ void bias_backward_kernel(float* dbias, const float* dout, u64 N, u64 OC) {
    const u64 o = global_id();
    if (o >= OC) return;
    float acc = dbias[o];
    for (u64 r = 0; r < N; ++r) acc += dout[r * OC + o];
    dbias[o] = acc;
}

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

// Eight threads per row (32 rows per block of 256). Rows past N compute on
// row N-1 and write nothing: every lane must reach the shuffles.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, u64 N, u64 C, float eps) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const float* x = inp + (valid ? row : N - 1) * C;
    const float inv_c = 1.0f / static_cast<float>(C);
    const float m = lanes8([&](u64 c) { return x[c]; }, C) * inv_c;
    // The cpu kernel centres into `out`, then takes the dot of it with itself.
    const float var = lanes8([&](u64 c) { const float d = x[c] - m; return d * d; }, C) * inv_c;
    const float s = 1.0f / sqrtf(var + eps);
    if (!valid) return;
    float* o = out + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) o[c] = (x[c] - m) * s * w[c] + b[c];
    if ((threadIdx.x & 7u) == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class E>
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                               const float* mean, const float* rstd, u64 N, u64 C) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const u64 r = valid ? row : N - 1;
    const E* x = inp + r * C;
    const float* d = dout + r * C;
    const float m = mean[r], s = rstd[r];
    const float inv_c = 1.0f / static_cast<float>(C);
    const float dnorm_mean = lanes8([&](u64 c) { return w[c] * d[c]; }, C) * inv_c;
    const float dnorm_norm_mean =
        lanes8([&](u64 c) { return (w[c] * d[c]) * ((widen(x[c]) - m) * s); }, C) * inv_c;
    if (!valid) return;
    float* di = dinp + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) {
        const float norm = (widen(x[c]) - m) * s, dnorm = w[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// dw[c] += sum_r (x - mean) * rstd * dout, db[c] += sum_r dout, rows in order.
template <class E>
__global__ void layernorm_backward_dwdb_kernel(float* dw, float* db, const float* dout, const E* inp,
                                               const float* mean, const float* rstd, u64 N, u64 C) {
    const u64 c = global_id();
    if (c >= C) return;
    float aw = dw[c], ab = db[c];
    for (u64 r = 0; r < N; ++r) {
        const float d = dout[r * C + c];
        aw += (widen(inp[r * C + c]) - mean[r]) * rstd[r] * d;
        ab += d;
    }
    dw[c] = aw;
    db[c] = ab;
}

}  // namespace

cudaError_t preload_rows() {
    return load_kernels(bias_backward_kernel, embedding_forward_kernel<float>, embedding_forward_kernel<std::uint16_t>,
                        embedding_backward_wte_kernel,
                        embedding_backward_wpe_kernel, layernorm_forward_kernel,
                        layernorm_backward_dinp_kernel<float>, layernorm_backward_dwdb_kernel<float>,
                        layernorm_backward_dinp_kernel<std::uint16_t>, layernorm_backward_dwdb_kernel<std::uint16_t>);
}

void bias_backward(cudaStream_t s, float* dbias, const float* dout, u64 N, u64 OC) {
    if (OC) bias_backward_kernel<<<blocks_for(OC, 128), 128, 0, s>>>(dbias, dout, N, OC);
}

void embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       u64 B, u64 T, u64 C, u64 V) {
    if (B && T && C) embedding_forward_kernel<<<blocks_for(B * T * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B, T, C, V);
}

void embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens, const std::uint16_t* wte,
                       const std::uint16_t* wpe, u64 B, u64 T, u64 C, u64 V) {
    if (B && T && C) embedding_forward_kernel<<<blocks_for(B * T * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B, T, C, V);
}

void embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        u64 B, u64 T, u64 C, u64 V) {
    if (!B || !T || !C) return;
    const dim3 grid(blocks_for(C, 128), kGroups);
    embedding_backward_wte_kernel<<<grid, 128, 0, s>>>(dwte, dout, tokens, B * T, C, V);
    if (dwpe) embedding_backward_wpe_kernel<<<blocks_for(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
}

void layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, u64 N, u64 C, float eps) {
    if (!N || !C) return;
    layernorm_forward_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
}

namespace {
template <class E>
void layernorm_grad(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const E* inp,
                    const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    layernorm_backward_dinp_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd,
                                                                                    N, C);
    layernorm_backward_dwdb_kernel<<<blocks_for(C, 128), 128, 0, s>>>(dw, db, dout, inp, mean, rstd, N, C);
}
}  // namespace

void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    layernorm_grad(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout,
                        const std::uint16_t* inp, const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    layernorm_grad(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

}  // namespace zinf::device::cuda
