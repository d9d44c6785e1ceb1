// zinf device: where the model's arithmetic runs. A Device has streams
// (in-order queues of work), events (a point in a stream others can wait
// for), asynchronous copies, memory carved from a DeviceArena budget, and the
// kernels a GPT needs forward and backward.
//
//   auto dev = zinf::device::open({.backend = "cpu", .memory_bytes = 2 * GiB});
//   auto& s = dev->compute();
//   auto x = dev->alloc<float>(B * T * C, "x");
//   dev->layernorm_forward(s, ...);       // enqueued; returns at once
//   dev->synchronize(s);                  // everything before it is done
//
// Backends: `cpu`: GEMMs through OpenBLAS, the rest vectorised and
// threaded with OpenMP; a stream is a worker thread running its queue in
// order; an event is a completion count; device memory is host memory from
// the arena. `cuda` (device/cuda/): cuBLASLt and its own kernels on CUDA
// streams, events that own a cudaEvent_t, the arena from one cudaMalloc; the
// interface holds only what both can do: spans given to kernels are device
// memory, to be read on the host only after a copy and a synchronize. (Host
// code hands device memory to host collectives only where
// host_addressable() says it may; see train.hpp.)
//
// Numbers: fp32 everywhere inside the kernels; bf16 at the casts, at a GEMM
// asked for bf16 inputs (Precision::bf16, below), and in the working
// parameters a GEMM or the embedding reads stored bf16 (Weight, below).
// Every kernel is deterministic: the same inputs give the same bits for any
// thread count (reductions over rows are split by columns, never by rows),
// except GEMM, which the device cuts into column or row blocks by its thread
// count: its bits are the same for the same thread count.
//
// Shapes are written (rows, cols), row-major, in comments beside each span.
// N is a number of rows (tokens: B*T); C the channels. A kernel that
// accumulates says "+=": it adds to what the span holds.
#pragma once

#include <zinf/mem.hpp>
#include <zinf/optim.hpp>
#include <zinf/util.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace zinf::device {

struct Options {
    std::string backend = "cpu";    // "cpu", "cuda", or "auto" (cuda when a GPU is present, else cpu)
    std::uint64_t memory_bytes = 0;  // the arena budget; 0 = 1 GiB
    std::uint64_t max_block = 0;     // largest single allocation; 0 = no limit
    unsigned threads = 0;            // kernel threads (cpu); 0 = the CPUs this process may use
    int gpu = -1;                    // the GPU (cuda); -1 = select_gpu's choice by local rank
};

// The GPU a process takes among `count` visible: `requested` when >= 0
// (UsageError when it is not below `count`), else the launcher's local rank
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, the first set)
// modulo `count`, else 0. `env` reads a variable (nullptr: unset); a local
// rank that is not a number is a UsageError naming the variable.
int select_gpu(int requested, int count, const std::function<const char*(const char*)>& env);
int select_gpu(int requested, int count);  // from the process environment

// Why the cuda backend cannot run here ("" when it can): this build has no
// CUDA toolkit, or there is no usable GPU. `auto` picks cuda when "".
std::string cuda_unavailable();

// What a stream is for. The ZeRO engine gives each stage of its fetch
// pipeline its own (paper §6.2): copies host -> device (cg), device -> host
// (gradients out), collectives (gg, reduce-scatter), beside compute.
enum class StreamKind { compute, h2d, d2h, collectives };
const char* stream_kind_name(StreamKind k);

// An in-order queue of work. Made by the Device (stream()); lives as long as it.
class Stream {
public:
    virtual ~Stream() = default;
    virtual const std::string& name() const = 0;
};

// A point in a stream: done once everything enqueued on the stream before
// it is done. Copyable; a default Event is always done. `handle` owns the
// backend's own event object where it has one (a cudaEvent_t on cuda; empty
// on cpu, where the ticket is a count of the stream's jobs), so a copy of an
// Event keeps it alive as long as anyone may wait on it.
struct Event {
    std::uint64_t ticket = 0;
    const Stream* stream = nullptr;
    std::shared_ptr<void> handle;
};

// Device memory holding `count` elements of T: a mem::Block seen as a span.
template <class T>
class Array {
public:
    Array() = default;
    explicit Array(mem::Block b) : block_(std::move(b)) {}
    std::span<T> span() const noexcept {
        return {reinterpret_cast<T*>(block_.data()), block_.size() / sizeof(T)};
    }
    operator std::span<T>() const noexcept { return span(); }
    operator std::span<const T>() const noexcept { return span(); }
    std::size_t size() const noexcept { return block_.size() / sizeof(T); }
    T* data() const noexcept { return reinterpret_cast<T*>(block_.data()); }
    explicit operator bool() const noexcept { return bool(block_); }

private:
    mem::Block block_;
};

// The arithmetic of a GEMM's inputs. fp32: the reference. bf16: A and B
// rounded to bf16 (nearest even), the products accumulated and C written in
// fp32, as llm.c's and every mixed-precision trainer's GEMMs on tensor cores.
// On cpu the inputs are rounded (or a bf16 B widened) into scratch and
// OpenBLAS's cblas_sgemm multiplies them (Debian 12's OpenBLAS 0.3.21 is
// built without cblas_sbgemm), so the bf16 arithmetic is exact up to fp32
// accumulation, the host's reference; on cuda cuBLASLt multiplies fp32
// spans with CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor cores, inputs
// converted inside the kernel), and a bf16 B with A rounded to bf16 as
// bf16 x bf16 -> fp32 (CUBLAS_COMPUTE_32F). zinf-train --precision bf16
// runs every GEMM of the model so, and where the manifest's working
// parameters are bf16 (zinf-shard layout's default) the engine keeps the
// matrices and embedding tables bf16 on the device too (Weight): gathered
// and held as bf16, read as bf16 by the GEMMs and the embedding, never
// widened. The activation checkpoints (the residual stream at each block
// boundary, model.hpp's Shape::checkpoints) are rounded to bf16 as they are
// made and kept, offloaded and read back bf16, widened to fp32 for the block
// that reads them: half the bytes on the device, in host memory and on NVMe.
// Layernorm and RMSNorm weights and biases are widened to fp32. The blocks
// keep the activations their GEMMs read (the norms' outputs, the
// attention's output, the GPT's MLP's pre- and post-GELU, the Llama's
// SwiGLU's gate, up and product) bf16 too (model.hpp's Shape::activations),
// written bf16 by the forward and read bf16 by the backward: a GEMM of a
// bf16 A (or, in a Llama weight's gradient dy^T x, a bf16 B), and GELU and
// SwiGLU from and to bf16 (a GEMM's input rounded to bf16 is what the bf16
// GEMM reads anyway, so only GELU's and SwiGLU's inputs change the
// arithmetic). A block keeps the residual between its attention and MLP
// bf16 too (its norm's backward reads it so), and its q/k/v and attention
// softmax, the attention's backward (the GPT's attention_backward, the
// Llama's gqa_backward) reading them bf16. The loss, gradients handed to
// the optimizer, master weights and optimizer state stay fp32.
enum class Precision { fp32, bf16 };
const char* precision_name(Precision p);
Precision parse_precision(std::string_view text);  // UsageError naming the text and the choices

// A parameter's values as a kernel reads them: fp32, or bf16 where the
// engine keeps the working parameters bf16 (Precision::bf16 over bf16
// partitions: the matrices a GEMM multiplies by and the embedding tables).
// Exactly one of the two is set (numel elements). A GEMM's A takes one too:
// an activation a block keeps fp32 or bf16 (model.hpp's Kept).
struct Weight {
    std::span<const float> f32;
    std::span<const std::uint16_t> bf16;
    bool is_bf16() const noexcept { return !bf16.empty(); }
    std::size_t size() const noexcept { return is_bf16() ? bf16.size() : f32.size(); }
};

// C (m,n) = alpha * op(A) (m,k) * op(B) (k,n) + beta * C, row-major, `batch`
// times with the given element strides between matrices. op(X) is X or its
// transpose; lda is the row stride of A as stored ((m,k) or (k,m) when ta).
struct Gemm {
    bool ta = false, tb = false;
    std::uint64_t m = 0, n = 0, k = 0;
    std::uint64_t lda = 0, ldb = 0, ldc = 0;  // 0 = packed (the stored row length)
    float alpha = 1, beta = 0;
    std::uint64_t batch = 1;
    std::uint64_t stride_a = 0, stride_b = 0, stride_c = 0;  // 0 = packed (one matrix)
    Precision inputs = Precision::fp32;                        // A's and B's arithmetic (see Precision)
};

class Device {
public:
    virtual ~Device() = default;

    virtual const std::string& backend() const = 0;
    virtual unsigned threads() const = 0;
    mem::DeviceArena& arena() { return *arena_; }

    // ---- memory -----------------------------------------------------------
    // From the arena (OutOfMemory names `what`); zero-filled.
    template <class T>
    Array<T> alloc(std::size_t count, std::string_view what) {
        Array<T> a(arena_->allocate(count * sizeof(T), what));
        fill_zero(std::as_writable_bytes(a.span()));
        return a;
    }

    // ---- streams and events -------------------------------------------------
    // One stream of each kind, made with the device and living as long as it.
    virtual Stream& stream(StreamKind k) = 0;
    Stream& compute() { return stream(StreamKind::compute); }  // where kernels go by default
    Stream& h2d() { return stream(StreamKind::h2d); }  // host -> device copies
    virtual Event record(Stream& s) = 0;
    // Work enqueued on `s` after this call starts once `e` is done; the host
    // does not wait. This is how one stage orders itself after another: a
    // collective on the collectives stream after the copy that fed it, the
    // compute after the gather of the weights it reads.
    virtual void wait(Stream& s, const Event& e) = 0;
    // The same, adding to `waited_ns` how long `s` stood waiting for `e` (the
    // engine's stall time: compute waiting for its parameters).
    virtual void wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) = 0;
    virtual void synchronize(Stream& s) = 0;
    virtual void synchronize(const Event& e) = 0;
    // Whether `e` is done now, without waiting (and without reporting errors).
    virtual bool query(const Event& e) = 0;
    // Whether device memory can be handed to host code as it is (the cpu
    // backend, whose device memory is host memory): then a host-memory
    // collective (MPI) may run over device buffers from a host() job on the
    // collectives stream. Otherwise the buffers cross through copies, or the
    // collective runs on the device (NCCL on the stream's native handle).
    virtual bool host_addressable() const = 0;
    // The backend's own stream object (a cudaStream_t on cuda; on cpu, which
    // has none, the Stream itself), for libraries that enqueue on it (NCCL).
    virtual void* native(Stream& s) = 0;
    // A kernel's error (a bad shape, a token past the vocabulary) is thrown by
    // the next synchronize of its stream (or of an event after it), and the
    // stream drops the rest of its queue until that synchronize reports it.

    // Asynchronous copies: host <-> device <-> device. `dst` and `src` must
    // stay alive and untouched until the stream passes this point.
    void copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src);
    // A device-to-device copy of a (rows, cols) block of floats between
    // row-major matrices of row strides ld_dst and ld_src (>= cols): row r's
    // cols elements from src + r ld_src to dst + r ld_dst, the rest of dst
    // untouched (a column block out of a wider matrix, or into one).
    void copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                   std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols);
    virtual void fill_zero(std::span<std::byte> dst) = 0;  // synchronous
    virtual void zero(Stream& s, std::span<float> dst) = 0;

    // ---- kernels (enqueued on `s`) -------------------------------------------
    // See Gemm. A, B and C must hold every element the shape reaches.
    void gemm(Stream& s, const Gemm& g, std::span<const float> a, std::span<const float> b,
              std::span<float> c);
    // The same with B stored bf16 (a working parameter under Precision::bf16,
    // as a model multiplies by a weight, or a Llama block's kept activation
    // in its weight's gradient dy^T x: g.inputs must be bf16 and `batch` 1,
    // A transposed or not): the bits of gemm() on B widened to fp32.
    void gemm(Stream& s, const Gemm& g, std::span<const float> a, std::span<const std::uint16_t> b,
              std::span<float> c);
    // Either of the two, as `b` is stored.
    void gemm(Stream& s, const Gemm& g, std::span<const float> a, const Weight& b, std::span<float> c);
    // A and B each as stored. A stored bf16 (an activation a block keeps
    // bf16) needs g.inputs bf16 and `batch` 1 (A transposed or not, as a
    // Linear's forward and its weight's gradient read it): the bits of
    // gemm() on A widened to fp32 (exact), B as stored.
    void gemm(Stream& s, const Gemm& g, const Weight& a, const Weight& b, std::span<float> c);
    // out (N,OC) += bias (OC) broadcast over rows.
    void bias_add(Stream& s, std::span<float> out, std::span<const float> bias, std::uint64_t N,
                  std::uint64_t OC);
    // dbias (OC) += sum over rows of dout (N,OC).
    void bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, std::uint64_t N,
                       std::uint64_t OC);

    // out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C). A token >= V is
    // an error (DataError naming the position) at synchronize. An empty wpe
    // (dwpe in backward) is a model without a position table (the Llama
    // family's rotary embeddings): out = wte[token].
    void embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                           std::span<const float> wte, std::span<const float> wpe, std::uint64_t B,
                           std::uint64_t T, std::uint64_t C, std::uint64_t V);
    // The same from tables stored bf16 (widened as read: the same bits as
    // from their fp32 copies), or from either as stored (both alike).
    void embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                           std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe, std::uint64_t B,
                           std::uint64_t T, std::uint64_t C, std::uint64_t V);
    void embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens, const Weight& wte,
                           const Weight& wpe, std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t V);
    // dwte (V,C) += and dwpe (maxT,C) += the gradient dout (B,T,C) spreads.
    void embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe,
                            std::span<const float> dout, std::span<const std::int32_t> tokens,
                            std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t V);

    // out (N,C) = (inp - mean) * rstd * w (C) + b (C); mean, rstd (N) kept for
    // backward. eps 1e-5 as torch.nn.LayerNorm.
    void layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                           std::span<const float> inp, std::span<const float> w, std::span<const float> b,
                           std::uint64_t N, std::uint64_t C);
    // dinp (N,C) +=, dw (C) +=, db (C) +=.
    void layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                            std::span<const float> dout, std::span<const float> inp,
                            std::span<const float> w, std::span<const float> mean,
                            std::span<const float> rstd, std::uint64_t N, std::uint64_t C);
    // The same from inp stored bf16 (a GPT block's inner residual kept
    // under Shape::activations bf16), widened as read: the fp32 kernel's bits
    // on its fp32 copy.
    void layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                            std::span<const float> dout, std::span<const std::uint16_t> inp,
                            std::span<const float> w, std::span<const float> mean,
                            std::span<const float> rstd, std::uint64_t N, std::uint64_t C);

    // GELU, tanh form (GPT-2): out (n) = gelu(inp); dinp (n) = gelu'(inp) * dout (written, not +=).
    void gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp);
    void gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp,
                       std::span<const float> dout);
    // The same from a bf16 inp (widened as read), the forward writing out
    // rounded to bf16 (nearest even): the bits of the fp32 kernels on inp's
    // fp32 copy, out then cast to bf16.
    void gelu_forward(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> inp);
    void gelu_backward(Stream& s, std::span<float> dinp, std::span<const std::uint16_t> inp,
                       std::span<const float> dout);

    // Causal self-attention over qkv (B,T,3C) laid out [q | k | v], NH heads of
    // C/NH: out (B,T,C); att (B,NH,T,T) keeps the softmax for backward (the
    // entries above the diagonal are zero).
    void attention_forward(Stream& s, std::span<float> out, std::span<float> att,
                           std::span<const float> qkv, std::uint64_t B, std::uint64_t T, std::uint64_t C,
                           std::uint64_t NH);
    // dqkv (B,T,3C) written (not +=); datt (B,NH,T,T) is scratch.
    void attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt,
                            std::span<const float> dout, std::span<const float> qkv,
                            std::span<const float> att, std::uint64_t B, std::uint64_t T, std::uint64_t C,
                            std::uint64_t NH);
    // The same from qkv and att stored bf16 (a GPT block's kept q/k/v and
    // softmax under Shape::activations bf16), widened as read: the bits of
    // the fp32 kernel on their fp32 copies. (Its forward is the fp32 kernel
    // on qkv widened into scratch, att then rounded: model.hpp.)
    void attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt,
                            std::span<const float> dout, std::span<const std::uint16_t> qkv,
                            std::span<const std::uint16_t> att, std::uint64_t B, std::uint64_t T, std::uint64_t C,
                            std::uint64_t NH);

    // One new position's attention against a key-value cache (decoding): the
    // query q (C) of position T-1 attends to the keys k (T,C) and values
    // v (T,C) of positions 0..T-1: out (C); att (NH,T) keeps the softmax.
    // The same arithmetic, in the same order, as attention_forward's row T-1.
    void attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                          std::span<const float> k, std::span<const float> v, std::uint64_t T,
                          std::uint64_t C, std::uint64_t NH);

    // ---- the Llama family: RMSNorm, rotary embeddings, SwiGLU, grouped-query
    // attention (Hugging Face's LlamaForCausalLM, op for op) ------------------
    // out (N,C) = inp * rstd * w (C), rstd (N) = 1 / sqrt(mean(inp^2) + eps)
    // kept for backward.
    void rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                         std::span<const float> w, std::uint64_t N, std::uint64_t C, float eps);
    // res (N,C) += add, then rmsnorm_forward of res: a residual add and the
    // norm after it in one pass over the rows (the bits of accumulate and then
    // rmsnorm_forward).
    void residual_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<float> res,
                                  std::span<const float> add, std::span<const float> w, std::uint64_t N,
                                  std::uint64_t C, float eps);
    // dinp (N,C) +=, dw (C) +=.
    void rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                          std::span<const float> inp, std::span<const float> w, std::span<const float> rstd,
                          std::uint64_t N, std::uint64_t C);
    // The same from inp stored bf16 (a Llama block's inner residual kept
    // under Shape::activations bf16), widened as read: the fp32 kernel's
    // bits on its fp32 copy.
    void rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                          std::span<const std::uint16_t> inp, std::span<const float> w, std::span<const float> rstd,
                          std::uint64_t N, std::uint64_t C);
    // Rotary position embedding, in place over x (B,T,H,hd), "rotate half"
    // as Hugging Face's checkpoints expect it: dimension i < hd/2 of a head
    // pairs with i + hd/2, the pair turned by the angle of position p and
    // frequency i: x'[i] = x[i] cos - x[i+hd/2] sin, x'[i+hd/2] = x[i+hd/2] cos
    // + x[i] sin. table (P,hd): row p holds cos for i < hd/2, then sin; row
    // (b,t) of x is at position pos0 + t (pos0 + T <= P).
    void rope_forward(Stream& s, std::span<float> x, std::span<const float> table, std::uint64_t B,
                      std::uint64_t T, std::uint64_t H, std::uint64_t hd, std::uint64_t pos0);
    // The gradient through it (the inverse turn), in place over dx (B,T,H,hd).
    void rope_backward(Stream& s, std::span<float> dx, std::span<const float> table, std::uint64_t B,
                       std::uint64_t T, std::uint64_t H, std::uint64_t hd, std::uint64_t pos0);
    // SwiGLU: out (n) = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
    void swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate,
                        std::span<const float> up);
    // dgate (n), dup (n) written (not +=); either may be dout's own buffer.
    void swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                         std::span<const float> gate, std::span<const float> up);
    // The same from gate and up stored bf16 (a Llama block's kept
    // activations, widened as read), the forward writing out rounded to bf16
    // (nearest even): the bits of the fp32 kernels on their fp32 copies, out
    // then cast to bf16.
    void swiglu_forward(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> gate,
                        std::span<const std::uint16_t> up);
    void swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                         std::span<const std::uint16_t> gate, std::span<const std::uint16_t> up);
    // Causal grouped-query attention: NH query heads and KVH key-value heads
    // of hd each, query head h reading kv head h / (NH / KVH). q (B,T,NH*hd),
    // k and v (B,T,KVH*hd): out (B,T,NH*hd); att (B,NH,T,T) keeps the
    // softmax (zero above the diagonal). KVH == NH is multi-head attention.
    void gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                     std::span<const float> k, std::span<const float> v, std::uint64_t B, std::uint64_t T,
                     std::uint64_t NH, std::uint64_t KVH, std::uint64_t hd);
    // dq (B,T,NH*hd), dk and dv (B,T,KVH*hd) written (not +=); datt
    // (B,NH,T,T) is scratch.
    void gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                      std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v, std::span<const float> att,
                      std::uint64_t B, std::uint64_t T, std::uint64_t NH, std::uint64_t KVH,
                      std::uint64_t hd);
    // The same from q, k, v and att stored bf16 (a Llama block's kept q/k/v
    // and softmax under Shape::activations bf16), widened as read: the bits
    // of the fp32 kernel on their fp32 copies.
    void gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                      std::span<float> datt, std::span<const float> dout, std::span<const std::uint16_t> q,
                      std::span<const std::uint16_t> k, std::span<const std::uint16_t> v,
                      std::span<const std::uint16_t> att, std::uint64_t B, std::uint64_t T, std::uint64_t NH,
                      std::uint64_t KVH, std::uint64_t hd);
    // One new position against a key-value cache: q (NH*hd) of position T-1,
    // k and v (T,KVH*hd) of positions 0..T-1 (each kv head cached once for
    // its group): out (NH*hd); att (NH,T). gqa_forward's row T-1, to the bit.
    void gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                    std::span<const float> k, std::span<const float> v, std::uint64_t T, std::uint64_t NH,
                    std::uint64_t KVH, std::uint64_t hd);

    // Softmax cross-entropy fused with the logits' gradient. logits (N,V):
    // losses (N) = -log softmax(logits)[target]; then logits is overwritten
    // with dloss * (softmax - onehot(target)). A target >= V is an error.
    void crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                       std::span<const std::int32_t> targets, float dloss,
                                       std::uint64_t N, std::uint64_t V);
    // The same loss without the gradient (evaluation); logits untouched.
    void crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                              std::span<const std::int32_t> targets, std::uint64_t N, std::uint64_t V);

    // out (n) = a + b; acc (n) += x.
    void residual_forward(Stream& s, std::span<float> out, std::span<const float> a,
                          std::span<const float> b);
    void accumulate(Stream& s, std::span<float> acc, std::span<const float> x);

    // Casts, round to nearest even (zinf::to_bf16).
    void cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src);
    void cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src);

    // AdamW over one piece (optim.hpp's definition and bits).
    void adamw(Stream& s, const optim::Update& u, const optim::Scalars& k);

    // Runs `fn` on the stream in order with the kernels (host work that must
    // wait for them, e.g. a collective over their output on the cpu backend).
    virtual void host(Stream& s, std::function<void()> fn) = 0;

protected:
    // The backends' kernels, each called by the public kernel of its name
    // once that has checked the spans against the shape (checks.cpp, the one
    // place for every backend): a span too short for its shape is an
    // InternalError on the caller's thread before anything is enqueued.
    // do_gemm's Gemm is resolved (kernels.hpp's cpu::resolve: its zero
    // strides filled in); do_rope is rope_forward's turn, or rope_backward's
    // with `inverse`.
    virtual void do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) = 0;
    virtual void do_copy_rows(Stream& s, std::span<float> dst, std::uint64_t ld_dst, std::span<const float> src,
                              std::uint64_t ld_src, std::uint64_t rows, std::uint64_t cols) = 0;
    virtual void do_gemm(Stream& s, const Gemm& resolved, std::span<const float> a, std::span<const float> b,
                         std::span<float> c) = 0;
    virtual void do_gemm_bf16(Stream& s, const Gemm& resolved, std::span<const float> a,
                              std::span<const std::uint16_t> b, std::span<float> c) = 0;
    // A stored bf16 (batch 1), B as stored.
    virtual void do_gemm_bf16a(Stream& s, const Gemm& resolved, std::span<const std::uint16_t> a, const Weight& b,
                               std::span<float> c) = 0;
    virtual void do_bias_add(Stream& s, std::span<float> out, std::span<const float> bias, std::uint64_t N,
                             std::uint64_t OC) = 0;
    virtual void do_bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, std::uint64_t N,
                                  std::uint64_t OC) = 0;
    virtual void do_embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                                      std::span<const float> wte, std::span<const float> wpe, std::uint64_t B,
                                      std::uint64_t T, std::uint64_t C, std::uint64_t V) = 0;
    virtual void do_embedding_forward_bf16(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                                           std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe,
                                           std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t V) = 0;
    virtual void do_embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe,
                                       std::span<const float> dout, std::span<const std::int32_t> tokens,
                                       std::uint64_t B, std::uint64_t T, std::uint64_t C, std::uint64_t V) = 0;
    virtual void do_layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                                      std::span<const float> inp, std::span<const float> w, std::span<const float> b,
                                      std::uint64_t N, std::uint64_t C) = 0;
    virtual void do_layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                                       std::span<const float> dout, std::span<const float> inp,
                                       std::span<const float> w, std::span<const float> mean,
                                       std::span<const float> rstd, std::uint64_t N, std::uint64_t C) = 0;
    virtual void do_layernorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw,
                                            std::span<float> db, std::span<const float> dout,
                                            std::span<const std::uint16_t> inp, std::span<const float> w,
                                            std::span<const float> mean, std::span<const float> rstd,
                                            std::uint64_t N, std::uint64_t C) = 0;
    virtual void do_gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp) = 0;
    virtual void do_gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp,
                                  std::span<const float> dout) = 0;
    virtual void do_gelu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> inp) = 0;
    virtual void do_gelu_backward_bf16(Stream& s, std::span<float> dinp, std::span<const std::uint16_t> inp,
                                       std::span<const float> dout) = 0;
    virtual void do_attention_forward(Stream& s, std::span<float> out, std::span<float> att,
                                      std::span<const float> qkv, std::uint64_t B, std::uint64_t T, std::uint64_t C,
                                      std::uint64_t NH) = 0;
    virtual void do_attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt,
                                       std::span<const float> dout, std::span<const float> qkv,
                                       std::span<const float> att, std::uint64_t B, std::uint64_t T, std::uint64_t C,
                                       std::uint64_t NH) = 0;
    virtual void do_attention_backward_bf16(Stream& s, std::span<float> dqkv, std::span<float> datt,
                                            std::span<const float> dout, std::span<const std::uint16_t> qkv,
                                            std::span<const std::uint16_t> att, std::uint64_t B, std::uint64_t T,
                                            std::uint64_t C, std::uint64_t NH) = 0;
    virtual void do_attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                                     std::span<const float> k, std::span<const float> v, std::uint64_t T,
                                     std::uint64_t C, std::uint64_t NH) = 0;
    // `add` empty: rmsnorm_forward of inp (not written); else
    // residual_rmsnorm_forward, inp being res.
    virtual void do_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<float> inp,
                                    std::span<const float> add, std::span<const float> w, std::uint64_t N,
                                    std::uint64_t C, float eps) = 0;
    virtual void do_rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                                     std::span<const float> inp, std::span<const float> w, std::span<const float> rstd,
                                     std::uint64_t N, std::uint64_t C) = 0;
    virtual void do_rmsnorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw,
                                          std::span<const float> dout, std::span<const std::uint16_t> inp,
                                          std::span<const float> w, std::span<const float> rstd, std::uint64_t N,
                                          std::uint64_t C) = 0;
    virtual void do_swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate,
                                   std::span<const float> up) = 0;
    virtual void do_swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup,
                                    std::span<const float> dout, std::span<const float> gate,
                                    std::span<const float> up) = 0;
    virtual void do_swiglu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> gate,
                                        std::span<const std::uint16_t> up) = 0;
    virtual void do_swiglu_backward_bf16(Stream& s, std::span<float> dgate, std::span<float> dup,
                                         std::span<const float> dout, std::span<const std::uint16_t> gate,
                                         std::span<const std::uint16_t> up) = 0;
    virtual void do_gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                                std::span<const float> k, std::span<const float> v, std::uint64_t B, std::uint64_t T,
                                std::uint64_t NH, std::uint64_t KVH, std::uint64_t hd) = 0;
    virtual void do_gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                                 std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                                 std::span<const float> k, std::span<const float> v, std::span<const float> att,
                                 std::uint64_t B, std::uint64_t T, std::uint64_t NH, std::uint64_t KVH,
                                 std::uint64_t hd) = 0;
    virtual void do_gqa_backward_bf16(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                                      std::span<float> datt, std::span<const float> dout,
                                      std::span<const std::uint16_t> q, std::span<const std::uint16_t> k,
                                      std::span<const std::uint16_t> v, std::span<const std::uint16_t> att,
                                      std::uint64_t B, std::uint64_t T, std::uint64_t NH, std::uint64_t KVH,
                                      std::uint64_t hd) = 0;
    virtual void do_gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                               std::span<const float> k, std::span<const float> v, std::uint64_t T, std::uint64_t NH,
                               std::uint64_t KVH, std::uint64_t hd) = 0;
    virtual void do_crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                                  std::span<const std::int32_t> targets, float dloss,
                                                  std::uint64_t N, std::uint64_t V) = 0;
    virtual void do_crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                                         std::span<const std::int32_t> targets, std::uint64_t N, std::uint64_t V) = 0;
    virtual void do_residual_forward(Stream& s, std::span<float> out, std::span<const float> a,
                                     std::span<const float> b) = 0;
    virtual void do_accumulate(Stream& s, std::span<float> acc, std::span<const float> x) = 0;
    virtual void do_cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src) = 0;
    virtual void do_cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src) = 0;
    virtual void do_adamw(Stream& s, const optim::Update& u, const optim::Scalars& k) = 0;
    virtual void do_rope(Stream& s, std::span<float> x, std::span<const float> table, std::uint64_t B,
                         std::uint64_t T, std::uint64_t H, std::uint64_t hd, std::uint64_t pos0, bool inverse) = 0;

    std::unique_ptr<mem::DeviceArena> arena_;

private:
    void check_rope_spans(const char* kernel, std::span<float> x, std::span<const float> table, std::uint64_t B,
                          std::uint64_t T, std::uint64_t H, std::uint64_t hd, std::uint64_t pos0);
};

// UsageError for an unknown backend, or for "cuda" where it cannot run
// (built without the toolkit, or no GPU: the error says which).
std::unique_ptr<Device> open(const Options& opts);

// The peer's sgemm rate on this device: C = A*B on n x n fp32 matrices,
// `reps` times after one warm-up, FLOP/s (2 n^3 per product). On the cpu
// backend that is OpenBLAS's cblas_sgemm on its own threads, as a user would
// call it (the device's own GEMMs split over its OpenMP team instead). For --bench.
// On cuda it is cuBLASLt's fp32 GEMM (TF32 off), timed on the compute stream.
double measure_gemm_flops(Device& dev, std::uint64_t n, unsigned reps);
// cuBLASLt's bf16 GEMM (bf16 inputs and output, fp32 accumulation) on cuda,
// the rate a bf16 step compares against; 0 on a backend without one (cpu).
double measure_gemm_bf16_flops(Device& dev, std::uint64_t n, unsigned reps);

}  // namespace zinf::device
