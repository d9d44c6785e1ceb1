// The cuda backend's launchers for the Llama family's kernels (device.hpp;
// the cpu backend's llama.cpp is the reference), built by nvcc in llama.cu.
// The rules of kernels.hpp: raw device pointers (checked by checks.cpp), no
// atomics, every sum in the cpu kernel's order. RMSNorm, rotary embeddings
// and SwiGLU (whose exp is util/kernel_math.hpp's arithmetic on both backends)
// give the cpu backend's bits; grouped-query attention differs from it only
// by expf in the softmax, as attention does.
#pragma once

#include "kernels.hpp"

namespace zinf::device::cuda {

cudaError_t preload_llama();

// `add` not null: inp += add first (residual_rmsnorm_forward); else inp is only read.
void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, float* inp, const float* add, const float* w, u64 N,
                     u64 C, float eps);
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, u64 N, u64 C);
// From inp stored bf16, widened as read.
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const std::uint16_t* inp,
                      const float* w, const float* rstd, u64 N, u64 C);
void rope(cudaStream_t s, float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse);
void swiglu_forward(cudaStream_t s, float* out, const float* gate, const float* up, u64 n);
void swiglu_backward(cudaStream_t s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     u64 n);
// From bf16 gate and up (widened as read); the forward's out rounded to bf16.
void swiglu_forward(cudaStream_t s, std::uint16_t* out, const std::uint16_t* gate, const std::uint16_t* up, u64 n);
void swiglu_backward(cudaStream_t s, float* dgate, float* dup, const float* dout, const std::uint16_t* gate,
                     const std::uint16_t* up, u64 n);
void gqa_forward(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 B, u64 T,
                 u64 NH, u64 KVH, u64 hd);
void gqa_backward(cudaStream_t s, float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q,
                  const float* k, const float* v, const float* att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd);
// From q, k, v and att stored bf16, widened as read.
void gqa_backward(cudaStream_t s, float* dq, float* dk, float* dv, float* datt, const float* dout,
                  const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v, const std::uint16_t* att,
                  u64 B, u64 T, u64 NH, u64 KVH, u64 hd);
void gqa_decode(cudaStream_t s, float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 NH,
                u64 KVH, u64 hd);

}  // namespace zinf::device::cuda
