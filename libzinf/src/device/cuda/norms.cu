// The cuda backend's norms (kernels.hpp): LayerNorm and RMSNorm. Forward
// and the backward's dinp are one warp per row (8 rows per block of 256):
// each lane sums its elements in order, the lanes meet by xor-shuffles (a
// fixed tree, so the same bits every run), loads and stores 128 bits wide
// (float4; bf16 inputs four at a time) where every row starts 16-byte
// aligned (C % 4 == 0 and the buffers aligned), a scalar loop otherwise;
// index math inside a row in 32 bits. The row sums' order is not the cpu
// backend's eight lanes (its sums would be a serial chain per lane), so the
// rows agree with the cpu within rounding (test_cuda: 1e-5), not to the
// bit. The weight (and bias) gradients are column sums (common.cuh's
// column_sums: chunks of rows over the whole chip, then the chunks in
// order), the cpu kernel's order, so their bits are the cpu backend's (this
// file keeps -fmad=false for them: the Makefile) and never depend on the
// GPU (no atomics).
#include "common.cuh"

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace zinf::device::cuda {

namespace {

inline constexpr unsigned kRowWarps = kThreads / 32;  // rows a block

__device__ inline float row_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

// The warp's row: row = blockIdx.x * kRowWarps + warp, `live` false past N
// (for the whole warp, which then returns before any shuffle).
__device__ inline u64 warp_row() { return u64{blockIdx.x} * kRowWarps + threadIdx.x / 32; }

// Every pointer 16-byte aligned and C a multiple of 4: every row of each
// starts 16-byte aligned (8 for a bf16 input, read 64 bits at a time).
inline bool rows_of_4(u64 C, std::initializer_list<const void*> ps) { return C % 4 == 0 && aligned16(ps); }

// `add` not null (residual_layernorm_forward): the row of inp (res) += add
// first, rounded into kept and widened back where kept is given, each lane
// its own elements (read back by the same lane below: no sync needed),
// then the norm of the row.
template <int W>
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, float* inp, const float* add,
                                         std::uint16_t* kept, const float* w, const float* b, u64 N, unsigned C,
                                         float eps) {
    const u64 row = warp_row();
    if (row >= N) return;  // the whole warp
    const unsigned lane = lane_id();
    float* x = inp + row * C;
    const float inv_c = 1.0f / static_cast<float>(C);
    float s = 0;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        Pack<W> a = load<W>(x + c);
        if (add) {
            const Pack<W> d = load<W>(add + row * C + c);
#pragma unroll
            for (int k = 0; k < W; ++k) a.v[k] += d.v[k];
            if (kept) {
#pragma unroll
                for (int k = 0; k < W; ++k) a.v[k] = widen(round_bf16(a.v[k]));
                store<W>(kept + row * C + c, a);  // exact: bf16 values
            }
            store<W>(x + c, a);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) s += a.v[k];
    }
    const float m = row_sum(s) * inv_c;
    float v = 0;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float d = a.v[k] - m;
            v += d * d;
        }
    }
    const float r = 1.0f / sqrtf(row_sum(v) * inv_c + eps);
    float* o = out + row * C;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c), bb = load<W>(b + c);
        Pack<W> y;
#pragma unroll
        for (int k = 0; k < W; ++k) y.v[k] = (a.v[k] - m) * r * ww.v[k] + bb.v[k];
        store<W>(o + c, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <int W, class E>
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                               const float* mean, const float* rstd, u64 N, unsigned C) {
    const u64 row = warp_row();
    if (row >= N) return;
    const unsigned lane = lane_id();
    const E* x = inp + row * C;
    const float* d = dout + row * C;
    const float m = mean[row], r = rstd[row];
    const float inv_c = 1.0f / static_cast<float>(C);
    float s1 = 0, s2 = 0;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c), dd = load<W>(d + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float dnorm = ww.v[k] * dd.v[k];
            s1 += dnorm;
            s2 += dnorm * ((a.v[k] - m) * r);
        }
    }
    const float dnorm_mean = row_sum(s1) * inv_c, dnorm_norm_mean = row_sum(s2) * inv_c;
    float* di = dinp + row * C;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c), dd = load<W>(d + c);
        Pack<W> g = load<W>(di + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float norm = (a.v[k] - m) * r, dnorm = ww.v[k] * dd.v[k];
            g.v[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
        store<W>(di + c, g);
    }
}

// The weight and bias gradients' terms (common.cuh's column_sums): LayerNorm's
// (x - mean) * rstd * dout and dout; RMSNorm's x * rstd * dout.
template <class E>
struct LayerNormTerm {
    const float* dout;
    const E* inp;
    const float *mean, *rstd;
    u64 C;
    __device__ void operator()(u64 r, u64 c, float* v) const {
        const float d = dout[r * C + c];
        v[0] = (widen(inp[r * C + c]) - mean[r]) * rstd[r] * d;
        v[1] = d;
    }
};

template <class E>
struct RmsNormTerm {
    const float* dout;
    const E* inp;
    const float* rstd;
    u64 C;
    __device__ void operator()(u64 r, u64 c, float* v) const {
        v[0] = widen(inp[r * C + c]) * rstd[r] * dout[r * C + c];
    }
};

// `add` not null: the row of inp (res) += add first, each lane its own
// elements (read back by the same lane below), then the norm of the sum
// (residual_rmsnorm_forward).
template <int W>
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                                       unsigned C, float eps) {
    const u64 row = warp_row();
    if (row >= N) return;
    const unsigned lane = lane_id();
    float* x = inp + row * C;
    float ss = 0;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        Pack<W> a = load<W>(x + c);
        if (add) {
            const Pack<W> b = load<W>(add + row * C + c);
#pragma unroll
            for (int k = 0; k < W; ++k) a.v[k] += b.v[k];
            store<W>(x + c, a);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) ss += a.v[k] * a.v[k];
    }
    const float r = 1.0f / sqrtf(row_sum(ss) * (1.0f / static_cast<float>(C)) + eps);
    float* o = out + row * C;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c);
        Pack<W> y;
#pragma unroll
        for (int k = 0; k < W; ++k) y.v[k] = a.v[k] * r * ww.v[k];
        store<W>(o + c, y);
    }
    if (lane == 0) rstd[row] = r;
}

// E, in the two: float, or std::uint16_t for inp stored bf16 (widened as read).
template <int W, class E>
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const E* inp, const float* w,
                                             const float* rstd, u64 N, unsigned C) {
    const u64 row = warp_row();
    if (row >= N) return;
    const unsigned lane = lane_id();
    const E* x = inp + row * C;
    const float* d = dout + row * C;
    const float r = rstd[row];
    float s = 0;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c), dd = load<W>(d + c);
#pragma unroll
        for (int k = 0; k < W; ++k) s += (ww.v[k] * dd.v[k]) * (a.v[k] * r);
    }
    const float m = row_sum(s) * (1.0f / static_cast<float>(C));
    float* di = dinp + row * C;
    for (unsigned c = lane * W; c < C; c += 32 * W) {
        const Pack<W> a = load<W>(x + c), ww = load<W>(w + c), dd = load<W>(d + c);
        Pack<W> g = load<W>(di + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float norm = a.v[k] * r, dnorm = ww.v[k] * dd.v[k];
            g.v[k] += (dnorm - norm * m) * r;
        }
        store<W>(di + c, g);
    }
}

// f(std::integral_constant<int, W>): 4 where every row of every pointer is
// 16-byte aligned (a bf16 input's rows 8-byte: its loads are 64 bits), else 1.
template <class F>
void with_width(bool four, F&& f) {
    if (four)
        f(std::integral_constant<int, 4>{});
    else
        f(std::integral_constant<int, 1>{});
}

// A row's index math is 32-bit: C past 2^31 is refused.
unsigned row_length(u64 C) {
    if (C >= (u64{1} << 31)) throw std::length_error("cuda: a norm over rows of " + std::to_string(C) + " elements");
    return static_cast<unsigned>(C);
}

// The backward's two launches, for inp stored either way.
template <class E>
void layernorm_grad(const Launch& l, float* dinp, float* dw, float* db, const float* dout, const E* inp,
                    const float* w, const float* mean, const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    const unsigned c = row_length(C);
    with_width(rows_of_4(C, {dinp, dout, inp, w}), [&](auto W) {
        layernorm_backward_dinp_kernel<decltype(W)::value><<<blocks_for(N, kRowWarps), kThreads, 0, l.stream>>>(
            dinp, dout, inp, w, mean, rstd, N, c);
    });
    column_sums(l, SumOuts<2>{{dw, db}}, N, C, LayerNormTerm<E>{dout, inp, mean, rstd, C});
}

template <class E>
void rmsnorm_grad(const Launch& l, float* dinp, float* dw, const float* dout, const E* inp, const float* w,
                  const float* rstd, u64 N, u64 C) {
    if (!N || !C) return;
    const unsigned c = row_length(C);
    with_width(rows_of_4(C, {dinp, dout, inp, w}), [&](auto W) {
        rmsnorm_backward_dinp_kernel<decltype(W)::value><<<blocks_for(N, kRowWarps), kThreads, 0, l.stream>>>(
            dinp, dout, inp, w, rstd, N, c);
    });
    column_sums(l, SumOuts<1>{{dw}}, N, C, RmsNormTerm<E>{dout, inp, rstd, C});
}

void rmsnorm_rows(const Launch& l, float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                  u64 C, float eps) {
    if (!N || !C) return;
    const unsigned c = row_length(C);
    with_width(rows_of_4(C, {out, inp, add, w}), [&](auto W) {
        rmsnorm_forward_kernel<decltype(W)::value><<<blocks_for(N, kRowWarps), kThreads, 0, l.stream>>>(
            out, rstd, inp, add, w, N, c, eps);
    });
}

}  // namespace

cudaError_t preload_norms() {
    return load_kernels(
        layernorm_forward_kernel<4>, layernorm_forward_kernel<1>, layernorm_backward_dinp_kernel<4, float>,
        layernorm_backward_dinp_kernel<1, float>, layernorm_backward_dinp_kernel<4, std::uint16_t>,
        layernorm_backward_dinp_kernel<1, std::uint16_t>, column_partials_kernel<2, LayerNormTerm<float>>,
        column_partials_kernel<2, LayerNormTerm<std::uint16_t>>, column_totals_kernel<2>, rmsnorm_forward_kernel<4>,
        rmsnorm_forward_kernel<1>, rmsnorm_backward_dinp_kernel<4, float>, rmsnorm_backward_dinp_kernel<1, float>,
        rmsnorm_backward_dinp_kernel<4, std::uint16_t>, rmsnorm_backward_dinp_kernel<1, std::uint16_t>,
        column_partials_kernel<1, RmsNormTerm<float>>, column_partials_kernel<1, RmsNormTerm<std::uint16_t>>,
        column_totals_kernel<1>);
}

namespace {
// inp is only read by layernorm_forward: the kernel writes its rows only where `add` is given.
void layernorm_rows(const Launch& l, float* out, float* mean, float* rstd, float* inp, const float* add,
                    std::uint16_t* kept, const float* w, const float* b, u64 N, u64 C) {
    if (!N || !C) return;
    const unsigned c = row_length(C);
    with_width(rows_of_4(C, {out, inp, add, kept, w, b}), [&](auto W) {
        layernorm_forward_kernel<decltype(W)::value><<<blocks_for(N, kRowWarps), kThreads, 0, l.stream>>>(
            out, mean, rstd, inp, add, kept, w, b, N, c, kernel_math::kLayerNormEps);
    });
}
}  // namespace

void layernorm_forward(const Launch& l, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N, u64 C) {
    layernorm_rows(l, out.data(), mean.data(), rstd.data(), const_cast<float*>(inp.data()), nullptr, nullptr,
                   w.data(), b.data(), N, C);
}

void residual_layernorm_forward(const Launch& l, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                std::span<float> res, std::span<const float> add, View kept, std::span<const float> w,
                                std::span<const float> b, u64 N, u64 C) {
    layernorm_rows(l, out.data(), mean.data(), rstd.data(), res.data(), add.data(),
                   kept.empty() ? nullptr : kept.data<std::uint16_t>(), w.data(), b.data(), N, C);
}

void layernorm_backward(const Launch& l, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                        std::span<const float> dout, ConstView inp, std::span<const float> w,
                        std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        layernorm_grad(l, dinp.data(), dw.data(), db.data(), dout.data(), inp.data<decltype(e)>(), w.data(),
                       mean.data(), rstd.data(), N, C);
    });
}

void rmsnorm_forward(const Launch& l, std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                     std::span<const float> w, u64 N, u64 C, float eps) {
    // inp is only read: the kernel writes its row only where `add` is given.
    rmsnorm_rows(l, out.data(), rstd.data(), const_cast<float*>(inp.data()), nullptr, w.data(), N, C, eps);
}

void residual_rmsnorm_forward(const Launch& l, std::span<float> out, std::span<float> rstd, std::span<float> res,
                              std::span<const float> add, std::span<const float> w, u64 N, u64 C, float eps) {
    rmsnorm_rows(l, out.data(), rstd.data(), res.data(), add.data(), w.data(), N, C, eps);
}

void rmsnorm_backward(const Launch& l, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                      ConstView inp, std::span<const float> w, std::span<const float> rstd, u64 N, u64 C) {
    with_dtype(inp.dtype(), [&](auto e) {
        rmsnorm_grad(l, dinp.data(), dw.data(), dout.data(), inp.data<decltype(e)>(), w.data(), rstd.data(),
                     N, C);
    });
}

}  // namespace zinf::device::cuda
