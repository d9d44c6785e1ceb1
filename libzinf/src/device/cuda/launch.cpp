// The cuda backend's kernels (backend.hpp) other than GEMM: each checks its
// ids where it takes any, launches the .cu file's kernel on the stream and
// checks the launch.
#include "backend.hpp"

#include "../../util/kernel_math.hpp"

namespace zinf::device::cuda_backend {

void CudaDevice::do_bias_add(Stream& s, std::span<float> out, std::span<const float> bias, u64 N, u64 OC) {
    bind();
    cuda::bias_add(as_cuda(s).native(), out.data(), bias.data(), N, OC);
    launched("bias_add");
}

void CudaDevice::do_bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) {
    bind();
    cuda::bias_backward(as_cuda(s).native(), dbias.data(), dout.data(), N, OC);
    launched("bias_backward");
}

void CudaDevice::do_embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                                      std::span<const float> wte, std::span<const float> wpe, u64 B, u64 T, u64 C,
                                      u64 V) {
    bind();
    CudaStream& cs = as_cuda(s);
    check_tokens(cs, tokens.data(), B, T, V);
    cuda::embedding_forward(cs.native(), out.data(), tokens.data(), wte.data(),
                            wpe.empty() ? nullptr : wpe.data(), B, T, C, V);
    launched("embedding_forward");
}

void CudaDevice::do_embedding_forward_bf16(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                                           std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe, u64 B,
                                           u64 T, u64 C, u64 V) {
    bind();
    CudaStream& cs = as_cuda(s);
    check_tokens(cs, tokens.data(), B, T, V);
    cuda::embedding_forward(cs.native(), out.data(), tokens.data(), wte.data(), wpe.empty() ? nullptr : wpe.data(),
                            B, T, C, V);
    launched("embedding_forward");
}

void CudaDevice::do_embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe,
                                       std::span<const float> dout, std::span<const std::int32_t> tokens, u64 B, u64 T,
                                       u64 C, u64 V) {
    bind();
    CudaStream& cs = as_cuda(s);
    check_tokens(cs, tokens.data(), B, T, V);
    cuda::embedding_backward(cs.native(), dwte.data(), dwpe.empty() ? nullptr : dwpe.data(), dout.data(),
                             tokens.data(), B, T, C, V);
    launched("embedding_backward");
}

void CudaDevice::do_layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                      std::span<const float> inp, std::span<const float> w, std::span<const float> b,
                                      u64 N, u64 C) {
    bind();
    cuda::layernorm_forward(as_cuda(s).native(), out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                            b.data(), N, C, kernel_math::kLayerNormEps);
    launched("layernorm_forward");
}

void CudaDevice::do_layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                                       std::span<const float> dout, std::span<const float> inp,
                                       std::span<const float> w, std::span<const float> mean,
                                       std::span<const float> rstd, u64 N, u64 C) {
    bind();
    cuda::layernorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                             w.data(), mean.data(), rstd.data(), N, C);
    launched("layernorm_backward");
}

void CudaDevice::do_layernorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw,
                                            std::span<float> db, std::span<const float> dout,
                                            std::span<const std::uint16_t> inp, std::span<const float> w,
                                            std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
    bind();
    cuda::layernorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                             w.data(), mean.data(), rstd.data(), N, C);
    launched("layernorm_backward (bf16)");
}

void CudaDevice::do_gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp) {
    const u64 n = out.size();
    bind();
    cuda::gelu_forward(as_cuda(s).native(), out.data(), inp.data(), n);
    launched("gelu_forward");
}

void CudaDevice::do_gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp,
                                  std::span<const float> dout) {
    const u64 n = dinp.size();
    bind();
    cuda::gelu_backward(as_cuda(s).native(), dinp.data(), inp.data(), dout.data(), n);
    launched("gelu_backward");
}

void CudaDevice::do_gelu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> inp) {
    const u64 n = out.size();
    bind();
    cuda::gelu_forward(as_cuda(s).native(), out.data(), inp.data(), n);
    launched("gelu_forward (bf16)");
}

void CudaDevice::do_gelu_backward_bf16(Stream& s, std::span<float> dinp, std::span<const std::uint16_t> inp,
                                       std::span<const float> dout) {
    const u64 n = dinp.size();
    bind();
    cuda::gelu_backward(as_cuda(s).native(), dinp.data(), inp.data(), dout.data(), n);
    launched("gelu_backward (bf16)");
}

void CudaDevice::do_attention_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> qkv,
                                      u64 B, u64 T, u64 C, u64 NH) {
    bind();
    cuda::attention_forward(as_cuda(s).native(), out.data(), att.data(), qkv.data(), B, T, C, NH);
    launched("attention_forward");
}

void CudaDevice::do_attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt,
                                       std::span<const float> dout, std::span<const float> qkv,
                                       std::span<const float> att, u64 B, u64 T, u64 C, u64 NH) {
    bind();
    cuda::attention_backward(as_cuda(s).native(), dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                             B, T, C, NH);
    launched("attention_backward");
}

void CudaDevice::do_attention_backward_bf16(Stream& s, std::span<float> dqkv, std::span<float> datt,
                                            std::span<const float> dout, std::span<const std::uint16_t> qkv,
                                            std::span<const std::uint16_t> att, u64 B, u64 T, u64 C, u64 NH) {
    bind();
    cuda::attention_backward(as_cuda(s).native(), dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                             B, T, C, NH);
    launched("attention_backward (bf16)");
}

void CudaDevice::do_attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                                     std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) {
    bind();
    cuda::attention_decode(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), T, C, NH);
    launched("attention_decode");
}

void CudaDevice::do_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<float> inp,
                                    std::span<const float> add, std::span<const float> w, u64 N, u64 C, float eps) {
    bind();
    cuda::rmsnorm_forward(as_cuda(s).native(), out.data(), rstd.data(), inp.data(), add.data(), w.data(), N, C, eps);
    launched(add.empty() ? "rmsnorm_forward" : "residual_rmsnorm_forward");
}

void CudaDevice::do_rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                                     std::span<const float> inp, std::span<const float> w, std::span<const float> rstd,
                                     u64 N, u64 C) {
    bind();
    cuda::rmsnorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                           rstd.data(), N, C);
    launched("rmsnorm_backward");
}

void CudaDevice::do_rmsnorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw,
                                          std::span<const float> dout, std::span<const std::uint16_t> inp,
                                          std::span<const float> w, std::span<const float> rstd, u64 N, u64 C) {
    bind();
    cuda::rmsnorm_backward(as_cuda(s).native(), dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                           rstd.data(), N, C);
    launched("rmsnorm_backward (bf16)");
}

void CudaDevice::do_rope(Stream& s, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                         u64 pos0, bool inverse) {
    bind();
    cuda::rope(as_cuda(s).native(), x.data(), table.data(), B, T, H, hd, pos0, inverse);
    launched(inverse ? "rope_backward" : "rope_forward");
}

namespace {
// E: float, or std::uint16_t for gate and up (and the forward's out) stored bf16.
template <class E>
void swiglu_forward_of(cudaStream_t s, std::span<E> out, std::span<const E> gate, std::span<const E> up) {
    cuda::swiglu_forward(s, out.data(), gate.data(), up.data(), out.size());
}
template <class E>
void swiglu_backward_of(cudaStream_t s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                        std::span<const E> gate, std::span<const E> up) {
    cuda::swiglu_backward(s, dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), dgate.size());
}
}  // namespace

void CudaDevice::do_swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate,
                                   std::span<const float> up) {
    bind();
    swiglu_forward_of(as_cuda(s).native(), out, gate, up);
    launched("swiglu_forward");
}

void CudaDevice::do_swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup,
                                    std::span<const float> dout, std::span<const float> gate,
                                    std::span<const float> up) {
    bind();
    swiglu_backward_of(as_cuda(s).native(), dgate, dup, dout, gate, up);
    launched("swiglu_backward");
}

void CudaDevice::do_swiglu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> gate,
                                        std::span<const std::uint16_t> up) {
    bind();
    swiglu_forward_of(as_cuda(s).native(), out, gate, up);
    launched("swiglu_forward (bf16)");
}

void CudaDevice::do_swiglu_backward_bf16(Stream& s, std::span<float> dgate, std::span<float> dup,
                                         std::span<const float> dout, std::span<const std::uint16_t> gate,
                                         std::span<const std::uint16_t> up) {
    bind();
    swiglu_backward_of(as_cuda(s).native(), dgate, dup, dout, gate, up);
    launched("swiglu_backward (bf16)");
}

void CudaDevice::do_gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                                std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH,
                                u64 hd) {
    bind();
    cuda::gqa_forward(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, KVH, hd);
    launched("gqa_forward");
}

void CudaDevice::do_gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                                 std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                                 std::span<const float> k, std::span<const float> v, std::span<const float> att, u64 B,
                                 u64 T, u64 NH, u64 KVH, u64 hd) {
    bind();
    cuda::gqa_backward(as_cuda(s).native(), dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), q.data(),
                       k.data(), v.data(), att.data(), B, T, NH, KVH, hd);
    launched("gqa_backward");
}

void CudaDevice::do_gqa_backward_bf16(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                                      std::span<float> datt, std::span<const float> dout,
                                      std::span<const std::uint16_t> q, std::span<const std::uint16_t> k,
                                      std::span<const std::uint16_t> v, std::span<const std::uint16_t> att, u64 B,
                                      u64 T, u64 NH, u64 KVH, u64 hd) {
    bind();
    cuda::gqa_backward(as_cuda(s).native(), dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), q.data(),
                       k.data(), v.data(), att.data(), B, T, NH, KVH, hd);
    launched("gqa_backward (bf16)");
}

void CudaDevice::do_gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                               std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) {
    bind();
    cuda::gqa_decode(as_cuda(s).native(), out.data(), att.data(), q.data(), k.data(), v.data(), T, NH, KVH, hd);
    launched("gqa_decode");
}

void CudaDevice::do_crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                                  std::span<const std::int32_t> targets, float dloss, u64 N, u64 V) {
    bind();
    CudaStream& cs = as_cuda(s);
    check_targets(cs, targets.data(), N, V);
    cuda::crossentropy_forward_backward(cs.native(), losses.data(), logits.data(), targets.data(), dloss, N, V);
    launched("crossentropy_forward_backward");
}

void CudaDevice::do_crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                                         std::span<const std::int32_t> targets, u64 N, u64 V) {
    bind();
    CudaStream& cs = as_cuda(s);
    check_targets(cs, targets.data(), N, V);
    cuda::crossentropy_forward(cs.native(), losses.data(), logits.data(), targets.data(), N, V);
    launched("crossentropy_forward");
}

void CudaDevice::do_residual_forward(Stream& s, std::span<float> out, std::span<const float> a,
                                     std::span<const float> b) {
    const u64 n = out.size();
    bind();
    cuda::residual_forward(as_cuda(s).native(), out.data(), a.data(), b.data(), n);
    launched("residual_forward");
}

void CudaDevice::do_accumulate(Stream& s, std::span<float> acc, std::span<const float> x) {
    const u64 n = acc.size();
    bind();
    cuda::accumulate(as_cuda(s).native(), acc.data(), x.data(), n);
    launched("accumulate");
}

void CudaDevice::do_cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src) {
    const u64 n = dst.size();
    bind();
    cuda::to_bf16(as_cuda(s).native(), dst.data(), src.data(), n);
    launched("cast to bf16");
}

void CudaDevice::do_cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src) {
    const u64 n = dst.size();
    bind();
    cuda::from_bf16(as_cuda(s).native(), dst.data(), src.data(), n);
    launched("cast from bf16");
}

void CudaDevice::do_adamw(Stream& s, const optim::Update& u, const optim::Scalars& k) {
    bind();
    const cuda::AdamPtrs p{u.master.data(),    u.exp_avg.data(),   u.exp_avg_sq.data(), u.grad_f32.data(),
                           u.grad_bf16.data(), u.param_f32.data(), u.param_bf16.data()};
    const cuda::AdamScalars ks{k.grad_scale,      k.beta1, k.one_minus_beta1, k.beta2,    k.one_minus_beta2,
                               k.inv_sqrt_bc2, k.eps,   k.decay,           k.step_size};
    cuda::adamw(as_cuda(s).native(), p, u.size(), ks);
    launched("adamw");
}
}  // namespace zinf::device::cuda_backend
