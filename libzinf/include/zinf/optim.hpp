// zinf optim: the CPU AdamW update and the global gradient norm, vectorised
// (AVX-512, AVX2, portable) and threaded with OpenMP.
//
//   auto s = zinf::optim::Scalars::make({.lr = 3e-4}, step, grad_scale);
//   zinf::optim::adamw({.master = w, .exp_avg = m, .exp_avg_sq = v,
//                       .grad_bf16 = g, .param_bf16 = p}, s);
//
// One definition of the update, element by element, in fp32 (no fused
// multiply-add, so every path rounds the same way):
//
//   g  = grad * grad_scale                  (unscale and clip in one factor)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   d  = sqrt(v) * (1 / sqrt(1 - beta2^t)) + eps
//   w  = w * (1 - lr * wd) - (lr / (1 - beta1^t)) * (m / d)
//   p  = w                                  (fp32), or bf16(w) rounded to nearest even
//
// which is PyTorch's AdamW (decoupled weight decay, bias correction) with its
// per-step scalars computed once in double. Every instruction-set path gives
// the same bits as the portable one; the tests check it.
#pragma once

#include <zinf/util.hpp>

#include <cstdint>
#include <span>
#include <string_view>

namespace zinf::optim {

struct AdamW {
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
    // UsageError naming the bad hyper-parameter (lr < 0, betas outside [0, 1), ...).
    void validate() const;
};

// What one step multiplies by, as fp32, every path the same.
struct Scalars {
    float grad_scale = 1;                 // 1/loss_scale times the clipping coefficient
    float beta1 = 0, one_minus_beta1 = 0;
    float beta2 = 0, one_minus_beta2 = 0;
    float inv_sqrt_bc2 = 1;               // 1 / sqrt(1 - beta2^t)
    float eps = 0;
    float decay = 1;                      // 1 - lr * weight_decay
    float step_size = 0;                  // lr / (1 - beta1^t)
    // `step` counts from 1. `decay` false leaves the weights undecayed (biases,
    // LayerNorm). UsageError on step 0.
    static Scalars make(const AdamW& h, std::uint64_t step, double grad_scale = 1, bool decay = true);
};

// ---------------------------------------------------------------------------
// Instruction sets. The widest the CPU has runs unless ZINF_SIMD names
// another (portable, avx2, avx512): the tests and benchmarks compare them.
enum class Isa { portable, avx2, avx512 };
const char* isa_name(Isa isa);
Isa parse_isa(std::string_view text);  // UsageError
bool isa_supported(Isa isa);           // this CPU runs it
Isa best_isa();                        // the widest supported
Isa default_isa();                     // ZINF_SIMD if set (UsageError if unsupported), else best

struct Kernel {
    Isa isa = default_isa();
    unsigned threads = 0;  // OpenMP threads; 0 = OpenMP's default (every core)
};

// ---------------------------------------------------------------------------
// One contiguous range of n elements. master, exp_avg and exp_avg_sq have n
// elements and are updated in place; the gradient is one of grad_f32 or
// grad_bf16 (n elements); the working parameters are written to param_f32 or
// param_bf16 when one is given (none when master is itself the parameter).
struct Update {
    std::span<float> master, exp_avg, exp_avg_sq;
    std::span<const float> grad_f32;
    std::span<const std::uint16_t> grad_bf16;
    std::span<float> param_f32;
    std::span<std::uint16_t> param_bf16;
    std::size_t size() const { return master.size(); }
    // InternalError naming the span whose size is not n, or two gradients.
    void check() const;
};

// Updates the range, split over the kernel's threads. Bitwise the same for
// every Isa and thread count.
void adamw(const Update& u, const Scalars& s, const Kernel& k = {});
// Single-threaded, on the calling thread (for callers that thread themselves).
void adamw_serial(const Update& u, const Scalars& s, Isa isa);
// Many ranges at once (the partitions in one chunk of a step), range i with
// scalars[i], shared out over the threads in one parallel region.
void adamw(std::span<const Update> us, std::span<const Scalars> scalars, const Kernel& k = {});

// ---------------------------------------------------------------------------
// Sum of squares in double, in one fixed order whatever the Isa and threads:
// blocks of kNormBlock elements, each summed in 8 lanes (lane j takes the
// elements i = j mod 8, in order), the lanes added as ((0+1)+(2+3))+((4+5)+(6+7)),
// the blocks added in order. A non-finite element makes the sum non-finite,
// which is how an overflow is found.
inline constexpr std::size_t kNormBlock = 4096;
double sum_squares(std::span<const float> g, const Kernel& k = {});
double sum_squares(std::span<const std::uint16_t> g_bf16, const Kernel& k = {});

// The clipping coefficient for a global norm, as PyTorch's clip_grad_norm_:
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm is 0 (no clipping).
double clip_coefficient(double norm, double max_norm);

// ---------------------------------------------------------------------------
// Dynamic loss scaling for fp16 gradients: the loss is multiplied by scale();
// after a step, update(overflow) halves the scale on an overflow (the step
// was skipped) and doubles it after `growth_interval` clean steps in a row.
class LossScaler {
public:
    struct Options {
        double initial = 65536, factor = 2, min = 1;
        std::uint64_t growth_interval = 1000;
    };
    LossScaler();
    explicit LossScaler(Options o);
    double scale() const { return scale_; }
    void update(bool overflow);
    std::uint64_t overflows() const { return overflows_; }

private:
    Options o_;
    double scale_;
    std::uint64_t clean_ = 0, overflows_ = 0;
};

}  // namespace zinf::optim
