// The cuda backend's attention kernels (kernels.hpp): the GPT's causal
// self-attention over a packed qkv, the Llama family's grouped-query
// attention with the query and key-value heads apart, their decoding rows
// against a key-value cache, and the rotary embedding of q and k. Attention
// is one warp per (batch, query position, head), as the cpu kernel's task:
// each dot product on one thread in the cpu's eight-lane order, each sum over
// positions on one thread in position order (common.cuh's attend); only expf
// differs from the cpu's std::exp. The backward is three launches that split
// the cpu's loops, so that every dq, dk and dv element is summed by one
// thread over the same terms in the same order as there: datt and dq per
// (batch, query head, position), then dk and dv per (batch, kv head, key
// position), over the group's query heads and then the query positions. No
// atomics.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

// ---- the GPT's: q, k and v heads interleaved in qkv (B,T,3C) ----------------
__global__ void attention_forward_kernel(float* out, float* att, const float* qkv, u64 B, u64 T, u64 C, u64 NH,
                                         float scale) {
    const u64 task = warp_task();
    if (task >= B * T * NH) return;  // the whole warp
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
    const float* base = qkv + b * T * C3 + h * hs;
    attend(att + ((b * NH + h) * T + t) * T, base + t * C3, base + C, base + 2 * C, C3, t, T, hs, scale,
           out + (b * T + t) * C + h * hs);
}

__global__ void attention_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v,
                                        u64 T, u64 C, u64 NH, float scale) {
    const u64 h = warp_task();
    if (h >= NH) return;
    const u64 hs = C / NH;
    attend(att + h * T, q + h * hs, k + h * hs, v + h * hs, C, T - 1, T, hs, scale, out + h * hs);
}

// Backward, 1 of 3, per (b, h, t): datt row t = the softmax's backward of
// dout . v, as the cpu kernel leaves it in datt (before the scale). E, in
// the three: float, or std::uint16_t for qkv and att stored bf16 (widened
// as read: the fp32 kernels' bits on their copies).
template <class E>
__global__ void attention_datt_kernel(float* datt, const float* dout, const E* qkv, const E* att, u64 B,
                                      u64 T, u64 C, u64 NH) {
    const auto [b, h, t, lane, live] = head_row(B, NH, T);
    if (!live) return;
    const u64 hs = C / NH, C3 = 3 * C;
    const E* a = att + ((b * NH + h) * T + t) * T;
    float* da = datt + ((b * NH + h) * T + t) * T;
    const float* go = dout + (b * T + t) * C + h * hs;
    for (u64 t2 = lane; t2 <= t; t2 += 32) da[t2] = dot8(qkv + (b * T + t2) * C3 + 2 * C + h * hs, go, hs);
    softmax_row_backward(da, a, t, T);
}

// 2 of 3, per (b, h, t): dq[t] = sum over t2 <= t of (datt[t][t2] * scale) k[t2].
template <class E>
__global__ void attention_dq_kernel(float* dqkv, const float* datt, const E* qkv, u64 B, u64 T, u64 C, u64 NH,
                                    float scale) {
    const auto [b, h, t, lane, live] = head_row(B, NH, T);
    if (!live) return;
    const u64 hs = C / NH, C3 = 3 * C;
    const float* da = datt + ((b * NH + h) * T + t) * T;
    const E* k = qkv + b * T * C3 + C + h * hs;
    for (u64 i = lane; i < hs; i += 32) {
        float acc = 0;
        for (u64 t2 = 0; t2 <= t; ++t2) acc += (da[t2] * scale) * widen(k[t2 * C3 + i]);
        dqkv[(b * T + t) * C3 + h * hs + i] = acc;
    }
}

// 3 of 3, per (b, h, t2): dk[t2] and dv[t2], sums over t >= t2 in order.
template <class E>
__global__ void attention_dkv_kernel(float* dqkv, const float* datt, const float* dout, const E* qkv, const E* att,
                                     u64 B, u64 T, u64 C, u64 NH, float scale) {
    const auto [b, h, t2, lane, live] = head_row(B, NH, T);
    if (!live) return;
    const u64 hs = C / NH, C3 = 3 * C;
    const u64 row0 = (b * NH + h) * T * T;
    const E* q = qkv + b * T * C3 + h * hs;
    const float* go = dout + b * T * C + h * hs;
    for (u64 i = lane; i < hs; i += 32) {
        float dk = 0, dv = 0;
        for (u64 t = t2; t < T; ++t) {
            dv += widen(att[row0 + t * T + t2]) * go[t * C + i];
            dk += (datt[row0 + t * T + t2] * scale) * widen(q[t * C3 + i]);
        }
        float* d = dqkv + (b * T + t2) * C3 + h * hs + i;
        d[C] = dk;
        d[2 * C] = dv;
    }
}

// ---- grouped-query: q (B,T,NH*hd), k and v (B,T,KVH*hd) --------------------
__global__ void gqa_forward_kernel(float* out, float* att, const float* q, const float* k, const float* v, u64 B,
                                   u64 T, u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 task = warp_task();
    if (task >= B * T * NH) return;  // the whole warp
    const u64 QC = NH * hd, KC = KVH * hd, g = task % NH / (NH / KVH);
    const u64 h = task % NH, t = task / NH % T, b = task / NH / T;
    attend(att + ((b * NH + h) * T + t) * T, q + (b * T + t) * QC + h * hd, k + b * T * KC + g * hd,
           v + b * T * KC + g * hd, KC, t, T, hd, scale, out + (b * T + t) * QC + h * hd);
}

__global__ void gqa_decode_kernel(float* out, float* att, const float* q, const float* k, const float* v, u64 T,
                                  u64 NH, u64 KVH, u64 hd, float scale) {
    const u64 h = warp_task();
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
    const auto [b, h, t, lane, live] = head_row(B, NH, T);
    if (!live) return;
    const u64 QC = NH * hd, KC = KVH * hd, g = h / (NH / KVH);
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
    const auto [b, h, t, lane, live] = head_row(B, NH, T);
    if (!live) return;
    const u64 QC = NH * hd, KC = KVH * hd, g = h / (NH / KVH);
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
    const auto [b, g, t2, lane, live] = head_row(B, KVH, T);
    if (!live) return;
    const u64 QC = NH * hd, KC = KVH * hd, group = NH / KVH;
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

// ---- rotary embeddings: x (B,T,H,hd), a thread per pair (i, i + hd/2) ------
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

// `inverse`: the backward's turn the other way.
void rope(cudaStream_t s, float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse) {
    const u64 n = B * T * H * (hd / 2);
    if (n) rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, table, B, T, H, hd, pos0, inverse);
}

// The backwards' three launches, for inputs stored either way.
template <class E>
void attention_grad(cudaStream_t s, float* dqkv, float* datt, const float* dout, const E* qkv, const E* att, u64 B,
                    u64 T, u64 C, u64 NH) {
    if (!B || !T || !C) return;
    const unsigned grid = blocks_for(B * NH * T, kWarps);
    const float scale = kernel_math::attention_scale(C / NH);
    attention_datt_kernel<<<grid, kThreads, 0, s>>>(datt, dout, qkv, att, B, T, C, NH);
    attention_dq_kernel<<<grid, kThreads, 0, s>>>(dqkv, datt, qkv, B, T, C, NH, scale);
    attention_dkv_kernel<<<grid, kThreads, 0, s>>>(dqkv, datt, dout, qkv, att, B, T, C, NH, scale);
}

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

cudaError_t preload_attention() {
    return load_kernels(attention_forward_kernel, attention_decode_kernel, attention_datt_kernel<float>,
                        attention_dq_kernel<float>, attention_dkv_kernel<float>, attention_datt_kernel<std::uint16_t>,
                        attention_dq_kernel<std::uint16_t>, attention_dkv_kernel<std::uint16_t>, gqa_forward_kernel,
                        gqa_decode_kernel, gqa_datt_kernel<float>, gqa_dq_kernel<float>, gqa_dkv_kernel<float>,
                        gqa_datt_kernel<std::uint16_t>, gqa_dq_kernel<std::uint16_t>, gqa_dkv_kernel<std::uint16_t>,
                        rope_kernel);
}

void attention_forward(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B,
                       u64 T, u64 C, u64 NH) {
    if (!B || !T || !C) return;
    attention_forward_kernel<<<blocks_for(B * T * NH, kWarps), kThreads, 0, l.stream>>>(
        out.data(), att.data(), qkv.data(), B, T, C, NH, kernel_math::attention_scale(C / NH));
}

void attention_backward(const Launch& l, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                        ConstView qkv, ConstView att, u64 B, u64 T, u64 C, u64 NH) {
    with_dtype(qkv.dtype(), [&](auto e) {
        using E = decltype(e);
        attention_grad(l.stream, dqkv.data(), datt.data(), dout.data(), qkv.data<E>(), att.data<E>(), B, T, C, NH);
    });
}

void attention_decode(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) {
    if (!T || !C) return;
    attention_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, l.stream>>>(
        out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH, kernel_math::attention_scale(C / NH));
}

void gqa_forward(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                 std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const u64 tasks = B * T * NH;
    if (tasks)
        gqa_forward_kernel<<<blocks_for(tasks, kWarps), kThreads, 0, l.stream>>>(
            out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, KVH, hd, kernel_math::attention_scale(hd));
}

void gqa_backward(const Launch& l, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                  std::span<float> datt, std::span<const float> dout, ConstView q, ConstView k, ConstView v,
                  ConstView att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    with_dtype(q.dtype(), [&](auto e) {
        using E = decltype(e);
        gqa_grad(l.stream, dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), q.data<E>(), k.data<E>(),
                 v.data<E>(), att.data<E>(), B, T, NH, KVH, hd);
    });
}

void gqa_decode(const Launch& l, std::span<float> out, std::span<float> att, std::span<const float> q,
                std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    if (NH && T)
        gqa_decode_kernel<<<blocks_for(NH, kWarps), kThreads, 0, l.stream>>>(
            out.data(), att.data(), q.data(), k.data(), v.data(), T, NH, KVH, hd, kernel_math::attention_scale(hd));
}

void rope_forward(const Launch& l, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                  u64 pos0) {
    rope(l.stream, x.data(), table.data(), B, T, H, hd, pos0, false);
}

void rope_backward(const Launch& l, std::span<float> dx, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                   u64 pos0) {
    rope(l.stream, dx.data(), table.data(), B, T, H, hd, pos0, true);
}

}  // namespace zinf::device::cuda
