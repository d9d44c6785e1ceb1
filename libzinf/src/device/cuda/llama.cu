// The cuda backend's Llama kernels (llama.hpp). RMSNorm is layernorm's
// layout (eight threads per row in the cpu's lane order, one thread per
// column for dw); rotary embeddings and SwiGLU one thread per element pair
// or element; grouped-query attention softmax.cu's warps with the query and
// key-value heads apart, its backward in three launches: datt and dq per
// (batch, query head, position), then dk and dv per (batch, kv head, key
// position), each summed over the group's query heads, then the query
// positions, in the cpu kernel's order.
#include "common.cuh"
#include "llama.hpp"

namespace zinf::device::cuda {

namespace {

// `add` not null: the row of inp (res) += add first, each lane its columns,
// then the norm of the sum (residual_rmsnorm_forward).
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                                       u64 C, float eps) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    float* x = inp + (valid ? row : N - 1) * C;
    if (add && valid)
        for (u64 c = threadIdx.x & 7u; c < C; c += 8) x[c] += add[row * C + c];
    __syncwarp();  // the row's eight lanes: each reads the others' sums below
    const float inv_c = 1.0f / static_cast<float>(C);
    const float ss = lanes8([&](u64 c) { return x[c] * x[c]; }, C);
    const float s = 1.0f / sqrtf(ss * inv_c + eps);
    if (!valid) return;
    float* o = out + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) o[c] = x[c] * s * w[c];
    if ((threadIdx.x & 7u) == 0) rstd[row] = s;
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <class E>
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                             const float* rstd, u64 N, u64 C) {
    const u64 row = u64{blockIdx.x} * (blockDim.x / 8) + threadIdx.x / 8;
    const bool valid = row < N;
    const u64 r = valid ? row : N - 1;
    const E* x = inp + r * C;
    const float* d = dout + r * C;
    const float s = rstd[r];
    const float inv_c = 1.0f / static_cast<float>(C);
    const float m = lanes8([&](u64 c) { return (w[c] * d[c]) * (widen(x[c]) * s); }, C) * inv_c;
    if (!valid) return;
    float* di = dinp + row * C;
    for (u64 c = threadIdx.x & 7u; c < C; c += 8) {
        const float norm = widen(x[c]) * s, dnorm = w[c] * d[c];
        di[c] += (dnorm - norm * m) * s;
    }
}

template <class E>
__global__ void rmsnorm_backward_dw_kernel(float* dw, const float* dout, const E* inp, const float* rstd, u64 N,
                                           u64 C) {
    const u64 c = global_id();
    if (c >= C) return;
    float acc = dw[c];
    for (u64 r = 0; r < N; ++r) acc += widen(inp[r * C + c]) * rstd[r] * dout[r * C + c];
    dw[c] = acc;
}

__global__ void rope_kernel(float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 half = hd / 2;
    for (u64 e = global_id(); e < B * T * H * half; e += grid_threads()) {
        const u64 i = e % half, bth = e / half, bt = bth / H;
        const float* cs = table + (pos0 + bt % T) * hd;
        float* a = x + bth * hd;
        const float c = cs[i], sn = cs[half + i], x1 = a[i], x2 = a[half + i];
        if (!inverse) {
            a[i] = x1 * c - x2 * sn;
            a[half + i] = x2 * c + x1 * sn;
        } else {
            a[i] = x1 * c + x2 * sn;
            a[half + i] = x2 * c - x1 * sn;
        }
    }
}

// E: float, or std::uint16_t for gate and up (and the forward's out) stored bf16.
template <class E>
__global__ void swiglu_forward_kernel(E* out, const E* gate, const E* up, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) put(out + i, kernel_math::swiglu(widen(gate[i]), widen(up[i])));
}

template <class E>
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const E* gate, const E* up, u64 n) {
    for (u64 i = global_id(); i < n; i += grid_threads()) {
        float dg, du;
        kernel_math::swiglu_grad(widen(gate[i]), widen(up[i]), dout[i], &dg, &du);
        dgate[i] = dg;
        dup[i] = du;
    }
}

__global__ void gqa_forward_kernel(float* out, float* att, const float* q, const float* k, const float* v, u64 B,
                                   u64 T, u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * T * NH) return;  // the whole warp
    const u64 QC = NH * hd, KC = KVH * hd, g = task % NH / (NH / KVH);
    const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
    attend(att + ((b * NH + h) * T + t) * T, q + (b * T + t) * QC + h * hd, k + b * T * KC + g * hd,
           v + b * T * KC + g * hd, KC, t, T, hd, scale, out + (b * T + t) * QC + h * hd);
}

__global__ void gqa_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v, u64 T,
                                  u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 h = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (h >= NH) return;
    const u64 g = h / (NH / KVH);
    attend(att + h * T, q + h * hd, k + g * hd, v + g * hd, KVH * hd, T - 1, T, hd, scale, out + h * hd);
}

// Backward, 1 of 3, per (b, h, t): datt row t, the softmax's backward of
// dout . v. E, in the three: float, or std::uint16_t for q, k, v and att
// stored bf16 (widened as read: the fp32 kernels' bits on their copies).
template <class E>
__global__ void gqa_datt_kernel(float* datt, const float* dout, const E* v, const E* att, u64 B, u64 T, u64 NH,
                                u64 KVH, u64 hd) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * NH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 QC = NH * hd, KC = KVH * hd;
    const u64 t = task % T, h = task / T % NH, b = task / T / NH, g = h / (NH / KVH);
    const E* a = att + ((b * NH + h) * T + t) * T;
    float* da = datt + ((b * NH + h) * T + t) * T;
    const float* go = dout + (b * T + t) * QC + h * hd;
    for (u64 t2 = lane; t2 <= t; t2 += 32) da[t2] = dot8(v + (b * T + t2) * KC + g * hd, go, hd);
    softmax_row_backward(da, a, t, T);
}

// 2 of 3, per (b, h, t): dq[t] = sum over t2 <= t of (datt[t][t2] * scale) k[t2].
template <class E>
__global__ void gqa_dq_kernel(float* dq, const float* datt, const E* k, u64 B, u64 T, u64 NH, u64 KVH, u64 hd,
                              float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * NH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 QC = NH * hd, KC = KVH * hd;
    const u64 t = task % T, h = task / T % NH, b = task / T / NH, g = h / (NH / KVH);
    const float* da = datt + ((b * NH + h) * T + t) * T;
    const E* kb = k + b * T * KC + g * hd;
    for (u64 i = lane; i < hd; i += 32) {
        float acc = 0;
        for (u64 t2 = 0; t2 <= t; ++t2) acc += (da[t2] * scale) * widen(kb[t2 * KC + i]);
        dq[(b * T + t) * QC + h * hd + i] = acc;
    }
}

// 3 of 3, per (b, g, t2): dk[t2] and dv[t2], over the group's heads, then t >= t2, in order.
template <class E>
__global__ void gqa_dkv_kernel(float* dk, float* dv, const float* datt, const float* dout, const E* q, const E* att,
                               u64 B, u64 T, u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 task = u64{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (task >= B * KVH * T) return;
    const unsigned lane = threadIdx.x & 31u;
    const u64 QC = NH * hd, KC = KVH * hd, group = NH / KVH;
    const u64 t2 = task % T, g = task / T % KVH, b = task / T / KVH;
    for (u64 i = lane; i < hd; i += 32) {
        float ak = 0, av = 0;
        for (u64 h = g * group; h < (g + 1) * group; ++h) {
            const u64 row0 = (b * NH + h) * T * T;
            const E* qh = q + b * T * QC + h * hd;
            const float* go = dout + b * T * QC + h * hd;
            for (u64 t = t2; t < T; ++t) {
                av += widen(att[row0 + t * T + t2]) * go[t * QC + i];
                ak += (datt[row0 + t * T + t2] * scale) * widen(qh[t * QC + i]);
            }
        }
        dk[(b * T + t2) * KC + g * hd + i] = ak;
        dv[(b * T + t2) * KC + g * hd + i] = av;
    }
}

}  // namespace

cudaError_t preload_llama() {
    return load_kernels(rmsnorm_forward_kernel, rmsnorm_backward_dinp_kernel<float>, rmsnorm_backward_dw_kernel<float>,
                        rmsnorm_backward_dinp_kernel<std::uint16_t>, rmsnorm_backward_dw_kernel<std::uint16_t>,
                        rope_kernel,
                        swiglu_forward_kernel<float>, swiglu_forward_kernel<std::uint16_t>,
                        swiglu_backward_kernel<float>, swiglu_backward_kernel<std::uint16_t>, gqa_forward_kernel, gqa_decode_kernel,
                        gqa_datt_kernel<float>, gqa_dq_kernel<float>, gqa_dkv_kernel<float>,
                        gqa_datt_kernel<std::uint16_t>, gqa_dq_kernel<std::uint16_t>, gqa_dkv_kernel<std::uint16_t>);
}

void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                     u64 C, float eps) {
    if (!N || !C) return;
    rmsnorm_forward_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, s>>>(out, rstd, inp, add, w, N, C, eps);
}

namespace {
template <class E>
void rmsnorm_grad(cudaStream_t s, float* dinp, float* dw, const float* dout, const E* inp, const float* w,
                  const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    rmsnorm_backward_dinp_kernel<<<blocks_for(N, kThreads / 8), kThreads, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
    rmsnorm_backward_dw_kernel<<<blocks_for(C, 128), 128, 0, s>>>(dw, dout, inp, rstd, N, C);
}
}  // namespace

void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, u64 N, u64 C) {
    rmsnorm_grad(s, dinp, dw, dout, inp, w, rstd, N, C);
}

void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const std::uint16_t* inp,
                      const float* w, const float* rstd, u64 N, u64 C) {
    rmsnorm_grad(s, dinp, dw, dout, inp, w, rstd, N, C);
}

void rope(cudaStream_t s, float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 n = B * T * H * (hd / 2);
    if (n) rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, table, B, T, H, hd, pos0, inverse);
}

void swiglu_forward(cudaStream_t s, float* out, const float* gate, const float* up, u64 n) {
    if (n) swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, gate, up, n);
}

void swiglu_backward(cudaStream_t s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     u64 n) {
    if (n) swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dgate, dup, dout, gate, up, n);
}

void swiglu_forward(cudaStream_t s, std::uint16_t* out, const std::uint16_t* gate, const std::uint16_t* up, u64 n) {
    if (n) swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, gate, up, n);
}

void swiglu_backward(cudaStream_t s, float* dgate, float* dup, const float* dout, const std::uint16_t* gate,
                     const std::uint16_t* up, u64 n) {
    if (n) swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dgate, dup, dout, gate, up, n);
}

void gqa_forward(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 B, u64 T,
                 u64 NH, u64 KVH, u64 hd) {
    const u64 tasks = B * T * NH;
    if (tasks)
        gqa_forward_kernel<<<blocks_for(tasks, kWarps), kThreads, 0, s>>>(out, att, q, k, v, B, T, NH, KVH, hd,
                                                                          kernel_math::attention_scale(hd));
}

namespace {
template <class E>
void gqa_grad(cudaStream_t s, float* dq, float* dk, float* dv, float* datt, const float* dout, const E* q, const E* k,
              const E* v, const E* att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const u64 tasks = B * NH * T;
    if (!tasks) return;
    const float scale = kernel_math::attention_scale(hd);
    gqa_datt_kernel<<<blocks_for(tasks, kWarps), kThreads, 0, s>>>(datt, dout, v, att, B, T, NH, KVH, hd);
    gqa_dq_kernel<<<blocks_for(tasks, kWarps), kThreads, 0, s>>>(dq, datt, k, B, T, NH, KVH, hd, scale);
    gqa_dkv_kernel<<<blocks_for(B * KVH * T, kWarps), kThreads, 0, s>>>(dk, dv, datt, dout, q, att, B, T, NH, KVH, hd,
                                                                        scale);
}
}  // namespace

void gqa_backward(cudaStream_t s, float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q,
                  const float* k, const float* v, const float* att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    gqa_grad(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
}

void gqa_backward(cudaStream_t s, float* dq, float* dk, float* dv, float* datt, const float* dout,
                  const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v, const std::uint16_t* att,
                  u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    gqa_grad(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
}

void gqa_decode(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 NH,
                u64 KVH, u64 hd) {
    if (NH && T)
        gqa_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, s>>>(out, att, q, k, v, T, NH, KVH, hd,
                                                                      kernel_math::attention_scale(hd));
}

}  // namespace zinf::device::cuda
