// The cpu backend's kernels for the Llama family (device.hpp): RMSNorm,
// rotary embeddings, SwiGLU and grouped-query attention, with the rules of
// kernels.hpp: raw pointers, spans checked by the caller (cpu.cpp), every
// reduction in one order whatever the thread count.
#pragma once

#include "kernels.hpp"

namespace zinf::device::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, u64 N, u64 C, float eps);
// res += add, then rmsnorm_forward of res, a row at a time over the team.
void residual_rmsnorm_forward(float* out, float* rstd, float* res, const float* add, const float* w, u64 N, u64 C,
                              float eps);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      u64 N, u64 C);
// From inp stored bf16, widened as read: the fp32 kernel's bits on its copy.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const std::uint16_t* inp, const float* w,
                      const float* rstd, u64 N, u64 C);

// `inverse`: the backward's turn the other way.
void rope(float* x, const float* table, u64 B, u64 T, u64 H, u64 hd, u64 pos0, bool inverse);

void swiglu_forward(float* out, const float* gate, const float* up, u64 n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, u64 n);
// From bf16 gate and up (widened as read); the forward's out rounded to bf16.
void swiglu_forward(std::uint16_t* out, const std::uint16_t* gate, const std::uint16_t* up, u64 n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const std::uint16_t* gate, const std::uint16_t* up,
                     u64 n);

void gqa_forward(float* out, float* att, const float* q, const float* k, const float* v, u64 B, u64 T, u64 NH,
                 u64 KVH, u64 hd);
void gqa_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q, const float* k,
                  const float* v, const float* att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd);
// From q, k, v and att stored bf16, widened as read: the fp32 kernel's bits on their copies.
void gqa_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const std::uint16_t* q,
                  const std::uint16_t* k, const std::uint16_t* v, const std::uint16_t* att, u64 B, u64 T, u64 NH,
                  u64 KVH, u64 hd);
void gqa_decode(float* out, float* att, const float* q, const float* k, const float* v, u64 T, u64 NH, u64 KVH,
                u64 hd);

}  // namespace zinf::device::cpu
