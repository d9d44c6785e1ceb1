// The cuda backend's flash attention (kernels.def: flash_*, zinf-train
// --attention flash): causal attention as an online softmax over tiles of
// keys that never forms T x T, the cpu backend's math (device/flash.cpp),
// fp32 on CUDA cores (no tensor cores yet: written without a GPU at hand,
// the simple form first; docs/cuda-backend.md).
//
//   forward  a block per (32 query rows, head, batch row): the rows' q in
//            shared memory; for each tile of 32 keys up to the block's last
//            row, K and V through shared memory; a warp takes 4 rows, lane j
//            key j0 + j: its score, the tile's max and sum by xor-shuffles
//            (a fixed tree), then each lane its dims of the output (lane + 32
//            d), the tile's probabilities broadcast by shuffles in key order.
//            Each row keeps (max, sum) as it goes; lse = max + log(sum).
//   backward delta = dO . O a warp per row; dQ a block per 32 query rows
//            (keys in order, as the forward); dK and dV a block per 32 keys
//            of a kv head, its group's query heads in order, each head's
//            query tiles in order, lane i query i0 + i. No atomics: every
//            sum has one order, so two runs give the same bits.
//
// K (forward, dQ) or Q and dO (dK/dV) rows are read a lane a row: padded
// (pitch()) so that the lanes fall in distinct banks; where hd % 4 == 0 a
// dot product reads both rows 16 bytes at a time (the broadcast row and the
// lane's, rows hd + 4 apart: 8 lanes a phase on 32 banks). Head dims up to
// 128 (4 per lane); index math inside a head's rows in 32 bits.
#include "common.cuh"

#include <type_traits>

namespace zinf::device::cuda {

namespace {

constexpr unsigned kRows = 32;                 // query rows (or keys) a block owns
constexpr unsigned kFlashWarps = kThreads / 32;  // 8
constexpr unsigned kPer = kRows / kFlashWarps;  // rows (keys) a warp owns: w, w + 8, ...
constexpr unsigned kKeys = 32;                 // keys (or queries) a tile: a lane each
constexpr unsigned kMaxHd = 128;

// One call's heads: element strides of a row of q, of k and v, of out (dO).
struct Heads {
    unsigned B, T, NH, KVH, hd;
    u64 qs, ks, os;
};

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

// Row t of head h of batch row b at row stride `stride`.
__device__ inline u64 at(unsigned b, unsigned T, unsigned t, u64 stride, unsigned h, unsigned hd) {
    return (u64{b} * T + t) * stride + u64{h} * hd;
}

// rows x hd elements of heads' rows t0.. (zero past T) into s (row pitch
// `pitch`), widened; the whole block.
template <class E>
__device__ inline void load_rows(float* s, unsigned pitch, const E* src, unsigned b, unsigned T, unsigned t0,
                                 u64 stride, unsigned h, unsigned hd) {
    for (unsigned e = threadIdx.x; e < kRows * hd; e += blockDim.x) {
        const unsigned r = e / hd, d = e - r * hd, t = t0 + r;
        s[r * pitch + d] = t < T ? widen(src[at(b, T, t, stride, h, hd) + d]) : 0.0f;
    }
}

// The pitch of rows a lane each reads: hd + 4 (float4 reads) or hd + 1.
__host__ __device__ inline unsigned pitch(unsigned hd) { return hd % 4 ? hd + 1 : hd + 4; }

// a . b over hd, both rows in shared memory, 16-byte aligned where hd % 4 == 0.
__device__ inline float dot_rows(const float* a, const float* b, unsigned hd) {
    float s = 0;
    if (hd % 4 == 0) {
        for (unsigned d = 0; d < hd; d += 4) {
            const float4 x = *reinterpret_cast<const float4*>(a + d), y = *reinterpret_cast<const float4*>(b + d);
            s += x.x * y.x;
            s += x.y * y.y;
            s += x.z * y.z;
            s += x.w * y.w;
        }
    } else {
        for (unsigned d = 0; d < hd; ++d) s += a[d] * b[d];
    }
    return s;
}

// D = dims a lane owns (hd <= 32 D).
template <int D>
__global__ void flash_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Heads x,
                                     float scale) {
    extern __shared__ float4 flash_smem[];  // float4: 16-byte aligned rows
    float* const sm = reinterpret_cast<float*>(flash_smem);
    const unsigned hd = x.hd, kp = pitch(hd), T = x.T;
    float* sq = sm;                // (kRows, hd)
    float* sk = sq + kRows * hd;   // (kKeys, pitch)
    float* sv = sk + kKeys * kp;   // (kKeys, hd)
    const unsigned i0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z, g = h / (x.NH / x.KVH);
    const unsigned warp = threadIdx.x / 32, lane = lane_id(), i1 = min(T, i0 + kRows);
    load_rows(sq, hd, q, b, T, i0, x.qs, h, hd);
    float m[kPer], l[kPer], acc[kPer][D];
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr) {
        m[rr] = minus_inf();
        l[rr] = 0;
#pragma unroll
        for (int dd = 0; dd < D; ++dd) acc[rr][dd] = 0;
    }
    for (unsigned j0 = 0; j0 < i1; j0 += kKeys) {
        __syncthreads();  // the last tile's reads are done (and the q tile written)
        load_rows(sk, kp, k, b, T, j0, x.ks, g, hd);
        load_rows(sv, hd, v, b, T, j0, x.ks, g, hd);
        __syncthreads();
#pragma unroll
        for (unsigned rr = 0; rr < kPer; ++rr) {
            const unsigned r = warp + rr * kFlashWarps, i = i0 + r;
            if (i >= T || j0 > i) continue;  // the whole warp
            const unsigned j = j0 + lane, last = min(i - j0, kKeys - 1);
            const float s = j <= i ? dot_rows(sq + r * hd, sk + lane * kp, hd) * scale : minus_inf();
            const float mn = fmaxf(m[rr], warp_max(s));
            const float corr = expf(m[rr] - mn);
            const float p = j <= i ? expf(s - mn) : 0.0f;
            l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
            for (int dd = 0; dd < D; ++dd) acc[rr][dd] *= corr;
            for (unsigned jj = 0; jj <= last; ++jj) {
                const float pj = __shfl_sync(kFull, p, jj);
#pragma unroll
                for (int dd = 0; dd < D; ++dd) {
                    const unsigned d = lane + 32 * dd;
                    if (d < hd) acc[rr][dd] += pj * sv[jj * hd + d];
                }
            }
            m[rr] = mn;
        }
    }
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr) {
        const unsigned i = i0 + warp + rr * kFlashWarps;
        if (i >= T) continue;
        const float inv = 1.0f / l[rr];
        float* o = out + at(b, T, i, x.os, h, hd);
#pragma unroll
        for (int dd = 0; dd < D; ++dd) {
            const unsigned d = lane + 32 * dd;
            if (d < hd) o[d] = acc[rr][dd] * inv;
        }
        if (lane == 0) lse[(u64{b} * x.NH + h) * T + i] = m[rr] + logf(l[rr]);
    }
}

// delta (B,NH,T) = dO . O: a warp per row, lanes over the dims, a fixed tree.
template <class E>
__global__ void flash_delta_kernel(float* delta, const float* dout, const E* out, Heads x) {
    const u64 row = warp_task();
    if (row >= u64{x.B} * x.NH * x.T) return;  // the whole warp
    const unsigned T = x.T, t = static_cast<unsigned>(row % T), h = static_cast<unsigned>(row / T % x.NH),
                   b = static_cast<unsigned>(row / T / x.NH);
    const u64 o = at(b, T, t, x.os, h, x.hd);
    float s = 0;
    for (unsigned d = lane_id(); d < x.hd; d += 32) s += dout[o + d] * widen(out[o + d]);
    s = warp_sum(s);
    if (lane_id() == 0) delta[row] = s;
}

// dQ: a block per (32 query rows, head, batch row), as the forward's.
template <int D, class E>
__global__ void flash_dq_kernel(float* dq, const float* dout, const E* q, const E* k, const E* v, const float* lse,
                                const float* delta, Heads x, float scale) {
    extern __shared__ float4 flash_smem[];  // float4: 16-byte aligned rows
    float* const sm = reinterpret_cast<float*>(flash_smem);
    const unsigned hd = x.hd, kp = pitch(hd), T = x.T;
    float* sq = sm;                 // (kRows, hd)
    float* sdo = sq + kRows * hd;   // (kRows, hd)
    float* sk = sdo + kRows * hd;   // (kKeys, pitch)
    float* sv = sk + kKeys * kp;    // (kKeys, pitch)
    const unsigned i0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z, g = h / (x.NH / x.KVH);
    const unsigned warp = threadIdx.x / 32, lane = lane_id(), i1 = min(T, i0 + kRows);
    load_rows(sq, hd, q, b, T, i0, x.qs, h, hd);
    load_rows(sdo, hd, dout, b, T, i0, x.os, h, hd);
    float acc[kPer][D], row_lse[kPer], row_delta[kPer];
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr) {
        const unsigned i = i0 + warp + rr * kFlashWarps;
        const u64 row = (u64{b} * x.NH + h) * T + i;
        row_lse[rr] = i < T ? lse[row] : 0.0f;
        row_delta[rr] = i < T ? delta[row] : 0.0f;
#pragma unroll
        for (int dd = 0; dd < D; ++dd) acc[rr][dd] = 0;
    }
    for (unsigned j0 = 0; j0 < i1; j0 += kKeys) {
        __syncthreads();
        load_rows(sk, kp, k, b, T, j0, x.ks, g, hd);
        load_rows(sv, kp, v, b, T, j0, x.ks, g, hd);
        __syncthreads();
#pragma unroll
        for (unsigned rr = 0; rr < kPer; ++rr) {
            const unsigned r = warp + rr * kFlashWarps, i = i0 + r;
            if (i >= T || j0 > i) continue;  // the whole warp
            const unsigned j = j0 + lane, last = min(i - j0, kKeys - 1);
            float ds = 0;
            if (j <= i) {
                const float p = expf(dot_rows(sq + r * hd, sk + lane * kp, hd) * scale - row_lse[rr]);
                ds = p * (dot_rows(sdo + r * hd, sv + lane * kp, hd) - row_delta[rr]);
            }
            for (unsigned jj = 0; jj <= last; ++jj) {
                const float dsj = __shfl_sync(kFull, ds, jj);
#pragma unroll
                for (int dd = 0; dd < D; ++dd) {
                    const unsigned d = lane + 32 * dd;
                    if (d < hd) acc[rr][dd] += dsj * sk[jj * kp + d];
                }
            }
        }
    }
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr) {
        const unsigned i = i0 + warp + rr * kFlashWarps;
        if (i >= T) continue;
        float* o = dq + at(b, T, i, x.qs, h, hd);
#pragma unroll
        for (int dd = 0; dd < D; ++dd) {
            const unsigned d = lane + 32 * dd;
            if (d < hd) o[d] = acc[rr][dd] * scale;
        }
    }
}

// dK and dV: a block per (32 keys, kv head, batch row); a warp takes 4 keys,
// lane i query i0 + i of each tile of queries from the block's first key on,
// the group's query heads in order.
template <int D, class E>
__global__ void flash_dkv_kernel(float* dk, float* dv, const float* dout, const E* q, const E* k, const E* v,
                                 const float* lse, const float* delta, Heads x, float scale) {
    extern __shared__ float4 flash_smem[];  // float4: 16-byte aligned rows
    float* const sm = reinterpret_cast<float*>(flash_smem);
    const unsigned hd = x.hd, kp = pitch(hd), T = x.T;
    float* sk = sm;                 // (kRows, hd): the block's keys
    float* sv = sk + kRows * hd;    // (kRows, hd)
    float* sq = sv + kRows * hd;    // (kKeys, pitch): a tile of queries
    float* sdo = sq + kKeys * kp;   // (kKeys, pitch)
    float* slse = sdo + kKeys * kp; // (kKeys)
    float* sdl = slse + kKeys;      // (kKeys)
    const unsigned j0 = blockIdx.x * kRows, g = blockIdx.y, b = blockIdx.z, group = x.NH / x.KVH;
    const unsigned warp = threadIdx.x / 32, lane = lane_id();
    load_rows(sk, hd, k, b, T, j0, x.ks, g, hd);
    load_rows(sv, hd, v, b, T, j0, x.ks, g, hd);
    float ak[kPer][D], av[kPer][D];
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr)
#pragma unroll
        for (int dd = 0; dd < D; ++dd) ak[rr][dd] = av[rr][dd] = 0;
    for (unsigned h = g * group; h < (g + 1) * group; ++h)
        for (unsigned i0 = j0; i0 < T; i0 += kKeys) {
            __syncthreads();
            load_rows(sq, kp, q, b, T, i0, x.qs, h, hd);
            load_rows(sdo, kp, dout, b, T, i0, x.os, h, hd);
            if (threadIdx.x < kKeys) {
                const unsigned i = i0 + threadIdx.x;
                const u64 row = (u64{b} * x.NH + h) * T + i;
                slse[threadIdx.x] = i < T ? lse[row] : 0.0f;
                sdl[threadIdx.x] = i < T ? delta[row] : 0.0f;
            }
            __syncthreads();
            const unsigned last = min(T - i0, kKeys) - 1;  // queries i0..i0+last
#pragma unroll
            for (unsigned rr = 0; rr < kPer; ++rr) {
                const unsigned r = warp + rr * kFlashWarps, j = j0 + r;
                if (j >= T) continue;  // the whole warp
                const unsigned i = i0 + lane;
                float p = 0, ds = 0;
                if (i < T && i >= j) {
                    p = expf(dot_rows(sq + lane * kp, sk + r * hd, hd) * scale - slse[lane]);
                    ds = p * (dot_rows(sdo + lane * kp, sv + r * hd, hd) - sdl[lane]);
                }
                for (unsigned ii = 0; ii <= last; ++ii) {
                    const float pi = __shfl_sync(kFull, p, ii), dsi = __shfl_sync(kFull, ds, ii);
#pragma unroll
                    for (int dd = 0; dd < D; ++dd) {
                        const unsigned d = lane + 32 * dd;
                        if (d < hd) {
                            av[rr][dd] += pi * sdo[ii * kp + d];
                            ak[rr][dd] += dsi * sq[ii * kp + d];
                        }
                    }
                }
            }
        }
#pragma unroll
    for (unsigned rr = 0; rr < kPer; ++rr) {
        const unsigned j = j0 + warp + rr * kFlashWarps;
        if (j >= T) continue;
        float *ok = dk + at(b, T, j, x.ks, g, hd), *ov = dv + at(b, T, j, x.ks, g, hd);
#pragma unroll
        for (int dd = 0; dd < D; ++dd) {
            const unsigned d = lane + 32 * dd;
            if (d < hd) {
                ok[d] = ak[rr][dd] * scale;
                ov[d] = av[rr][dd];
            }
        }
    }
}

// Shared memory of each kernel for head dim hd (bytes).
u64 forward_smem(unsigned hd) { return 4 * (kRows * hd + kKeys * pitch(hd) + kKeys * hd); }
u64 dq_smem(unsigned hd) { return 4 * (2 * kRows * hd + 2 * kKeys * pitch(hd)); }
u64 dkv_smem(unsigned hd) { return 4 * (2 * kRows * hd + 2 * kKeys * pitch(hd) + 2 * kKeys); }

// f(std::integral_constant<int, D>) for the D = ceil(hd / 32) the kernels
// are built for.
template <class F>
void with_lanes(u64 hd, F&& f) {
    switch ((hd + 31) / 32) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        default: return f(std::integral_constant<int, 4>{});
    }
}

// The kernel's dynamic shared memory raised past the 48 KiB default where it needs more.
template <class K>
void allow_smem(K kernel, u64 bytes) {
    if (bytes <= 48 * 1024) return;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess)
        throw std::runtime_error(std::string("cuda: flash attention's ") + std::to_string(bytes) +
                                 " bytes of shared memory: " + cudaGetErrorString(e));
}

Heads heads(u64 B, u64 T, u64 NH, u64 KVH, u64 hd, u64 qs, u64 ks, u64 os) {
    if (hd > kMaxHd)
        throw std::length_error("cuda: flash attention takes heads of up to " + std::to_string(kMaxHd) +
                                " dims, not " + std::to_string(hd) + " (--attention gemm does)");
    if (T >= (u64{1} << 31) || B > 65535 || NH > 65535)
        throw std::length_error("cuda: flash attention over B = " + std::to_string(B) + ", T = " + std::to_string(T) +
                                ", " + std::to_string(NH) + " heads is past its grid");
    return {static_cast<unsigned>(B), static_cast<unsigned>(T), static_cast<unsigned>(NH), static_cast<unsigned>(KVH),
            static_cast<unsigned>(hd), qs, ks, os};
}

dim3 grid(const Heads& x, unsigned heads) { return dim3((x.T + kRows - 1) / kRows, heads, x.B); }

void forward(const Launch& l, const Heads& x, float* out, float* lse, const float* q, const float* k,
             const float* v) {
    if (!x.B || !x.T || !x.NH) return;
    with_lanes(x.hd, [&](auto D) {
        const auto kernel = flash_forward_kernel<decltype(D)::value>;
        allow_smem(kernel, forward_smem(x.hd));
        kernel<<<grid(x, x.NH), kThreads, forward_smem(x.hd), l.stream>>>(
            out, lse, q, k, v, x, kernel_math::attention_scale(x.hd));
    });
}

template <class E>
void backward(const Launch& l, const Heads& x, float* dq, float* dk, float* dv, float* delta, const float* dout,
              const E* q, const E* k, const E* v, const E* out, const float* lse) {
    if (!x.B || !x.T || !x.NH) return;
    const u64 rows = u64{x.B} * x.NH * x.T;
    flash_delta_kernel<E><<<blocks_for(rows, kWarps), kThreads, 0, l.stream>>>(delta, dout, out, x);
    const float scale = kernel_math::attention_scale(x.hd);
    with_lanes(x.hd, [&](auto D) {
        const auto dq_kernel = flash_dq_kernel<decltype(D)::value, E>;
        allow_smem(dq_kernel, dq_smem(x.hd));
        dq_kernel<<<grid(x, x.NH), kThreads, dq_smem(x.hd), l.stream>>>(dq, dout, q, k, v, lse, delta, x, scale);
        const auto dkv_kernel = flash_dkv_kernel<decltype(D)::value, E>;
        allow_smem(dkv_kernel, dkv_smem(x.hd));
        dkv_kernel<<<grid(x, x.KVH), kThreads, dkv_smem(x.hd), l.stream>>>(dk, dv, dout, q, k, v, lse, delta, x,
                                                                            scale);
    });
}

}  // namespace

cudaError_t preload_flash() {
    return load_kernels(flash_forward_kernel<1>, flash_forward_kernel<2>, flash_forward_kernel<3>,
                        flash_forward_kernel<4>, flash_delta_kernel<float>, flash_delta_kernel<std::uint16_t>,
                        flash_dq_kernel<1, float>, flash_dq_kernel<2, float>, flash_dq_kernel<3, float>,
                        flash_dq_kernel<4, float>, flash_dq_kernel<1, std::uint16_t>,
                        flash_dq_kernel<2, std::uint16_t>, flash_dq_kernel<3, std::uint16_t>,
                        flash_dq_kernel<4, std::uint16_t>, flash_dkv_kernel<1, float>, flash_dkv_kernel<2, float>,
                        flash_dkv_kernel<3, float>, flash_dkv_kernel<4, float>, flash_dkv_kernel<1, std::uint16_t>,
                        flash_dkv_kernel<2, std::uint16_t>, flash_dkv_kernel<3, std::uint16_t>,
                        flash_dkv_kernel<4, std::uint16_t>);
}

void flash_attention_forward(const Launch& l, std::span<float> out, std::span<float> lse,
                             std::span<const float> qkv, u64 B, u64 T, u64 C, u64 NH) {
    const float* p = qkv.data();
    forward(l, heads(B, T, NH, NH, C / NH, 3 * C, 3 * C, C), out.data(), lse.data(), p, p + C, p + 2 * C);
}

void flash_attention_backward(const Launch& l, std::span<float> dqkv, std::span<float> delta,
                              std::span<const float> dout, ConstView qkv, ConstView out, std::span<const float> lse,
                              u64 B, u64 T, u64 C, u64 NH) {
    const Heads x = heads(B, T, NH, NH, C / NH, 3 * C, 3 * C, C);
    float* d = dqkv.data();
    with_dtype(qkv.dtype(), [&](auto e) {
        using E = decltype(e);
        const E* p = qkv.data<E>();
        backward<E>(l, x, d, d + C, d + 2 * C, delta.data(), dout.data(), p, p + C, p + 2 * C, out.data<E>(),
                    lse.data());
    });
}

void flash_gqa_forward(const Launch& l, std::span<float> out, std::span<float> lse, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    forward(l, heads(B, T, NH, KVH, hd, NH * hd, KVH * hd, NH * hd), out.data(), lse.data(), q.data(), k.data(),
            v.data());
}

void flash_gqa_backward(const Launch& l, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<float> delta, std::span<const float> dout, ConstView q, ConstView k, ConstView v,
                        ConstView out, std::span<const float> lse, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) {
    const Heads x = heads(B, T, NH, KVH, hd, NH * hd, KVH * hd, NH * hd);
    with_dtype(q.dtype(), [&](auto e) {
        using E = decltype(e);
        backward<E>(l, x, dq.data(), dk.data(), dv.data(), delta.data(), dout.data(), q.data<E>(), k.data<E>(),
                    v.data<E>(), out.data<E>(), lse.data());
    });
}

}  // namespace zinf::device::cuda
