// The AdamW update and the gradient norm: hyper-parameters, the per-step
// scalars, the choice of instruction set and the OpenMP split. The element
// update itself is kernels.hpp's update_one; the vector paths are in
// avx2.cpp and avx512.cpp.
#include "kernels.hpp"

#include <zinf/optim.hpp>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace zinf::optim {

using namespace detail;

void AdamW::validate() const {
    auto bad = [](const std::string& what) { throw UsageError("AdamW: " + what); };
    if (!(lr >= 0) || !std::isfinite(lr)) bad("learning rate must be finite and >= 0, not " + std::to_string(lr));
    if (!(beta1 >= 0 && beta1 < 1)) bad("beta1 must be in [0, 1), not " + std::to_string(beta1));
    if (!(beta2 >= 0 && beta2 < 1)) bad("beta2 must be in [0, 1), not " + std::to_string(beta2));
    if (!(eps > 0) || !std::isfinite(eps)) bad("eps must be finite and > 0, not " + std::to_string(eps));
    if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
        bad("weight decay must be finite and >= 0, not " + std::to_string(weight_decay));
}

Scalars Scalars::make(const AdamW& h, std::uint64_t step, double grad_scale, bool decay) {
    h.validate();
    if (step == 0) throw UsageError("AdamW: steps count from 1");
    const double t = static_cast<double>(step);
    const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
    Scalars s;
    s.grad_scale = static_cast<float>(grad_scale);
    s.beta1 = static_cast<float>(h.beta1);
    s.one_minus_beta1 = static_cast<float>(1 - h.beta1);
    s.beta2 = static_cast<float>(h.beta2);
    s.one_minus_beta2 = static_cast<float>(1 - h.beta2);
    s.inv_sqrt_bc2 = static_cast<float>(1 / std::sqrt(bc2));
    s.eps = static_cast<float>(h.eps);
    s.decay = static_cast<float>(decay ? 1 - h.lr * h.weight_decay : 1.0);
    s.step_size = static_cast<float>(h.lr / bc1);
    return s;
}

// ---------------------------------------------------------------------------
const char* isa_name(Isa isa) {
    switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    }
    return "?";
}

Isa parse_isa(std::string_view text) {
    for (Isa i : {Isa::portable, Isa::avx2, Isa::avx512})
        if (text == isa_name(i)) return i;
    throw UsageError("unknown instruction set '" + std::string(text) + "' (portable, avx2, avx512)");
}

bool isa_supported(Isa isa) {
    switch (isa) {
    case Isa::portable: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2");
    case Isa::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    }
    return false;
}

Isa best_isa() {
    if (isa_supported(Isa::avx512)) return Isa::avx512;
    if (isa_supported(Isa::avx2)) return Isa::avx2;
    return Isa::portable;
}

namespace {
Isa isa_from_env() {
    const char* env = std::getenv("ZINF_SIMD");
    if (!env || !*env || std::string_view(env) == "auto") return best_isa();
    const Isa isa = parse_isa(env);
    if (!isa_supported(isa)) throw UsageError(std::string("ZINF_SIMD=") + env + ": this CPU does not have it");
    return isa;
}
}  // namespace

// Read once: every Kernel made anywhere takes it as its default.
Isa default_isa() {
    static const Isa isa = isa_from_env();
    return isa;
}

// ---------------------------------------------------------------------------
void Update::check() const {
    const std::size_t n = master.size();
    auto need = [&](std::size_t got, const char* what) {
        if (got != n)
            throw InternalError(std::string("AdamW: ") + what + " has " + std::to_string(got) + " elements, master " +
                                std::to_string(n));
    };
    need(exp_avg.size(), "exp_avg");
    need(exp_avg_sq.size(), "exp_avg_sq");
    if (!grad_f32.empty() && !grad_bf16.empty()) throw InternalError("AdamW: two gradients given");
    need(grad_f32.empty() ? grad_bf16.size() : grad_f32.size(), "the gradient");
    if (!param_f32.empty() && !param_bf16.empty()) throw InternalError("AdamW: two parameter outputs given");
    if (!param_f32.empty()) need(param_f32.size(), "param_f32");
    if (!param_bf16.empty()) need(param_bf16.size(), "param_bf16");
}

namespace detail {
void update_portable(const Ptrs& p, std::size_t first, std::size_t last, const Scalars& s) {
    for (std::size_t i = first; i < last; ++i) update_one(p, i, s);
}

double block_squares_portable(const float* f32, const std::uint16_t* b16, std::size_t n) {
    double acc[8] = {};
    square_tail(f32, b16, 0, n, acc);
    return add_lanes(acc);
}
}  // namespace detail

namespace {
using UpdateFn = void (*)(const Ptrs&, std::size_t, std::size_t, const Scalars&);
using SquaresFn = double (*)(const float*, const std::uint16_t*, std::size_t);

UpdateFn update_fn(Isa isa) {
    if (!isa_supported(isa)) throw UsageError(std::string("instruction set ") + isa_name(isa) + " is not on this CPU");
    switch (isa) {
    case Isa::avx512: return update_avx512;
    case Isa::avx2: return update_avx2;
    default: return update_portable;
    }
}

SquaresFn squares_fn(Isa isa) {
    if (!isa_supported(isa)) throw UsageError(std::string("instruction set ") + isa_name(isa) + " is not on this CPU");
    switch (isa) {
    case Isa::avx512: return block_squares_avx512;
    case Isa::avx2: return block_squares_avx2;
    default: return block_squares_portable;
    }
}

// Elements per OpenMP work item: big enough to stream, small enough to share
// a range of a few MiB between the cores; a multiple of every vector width.
constexpr std::size_t kGrain = 16384;

int threads_of(const Kernel& k) { return k.threads ? static_cast<int>(k.threads) : omp_get_max_threads(); }
}  // namespace

void adamw_serial(const Update& u, const Scalars& s, Isa isa) {
    u.check();
    update_fn(isa)(ptrs(u), 0, u.size(), s);
}

void adamw(const Update& u, const Scalars& s, const Kernel& k) {
    u.check();
    const auto fn = update_fn(k.isa);
    const Ptrs p = ptrs(u);
    const std::size_t n = u.size(), items = (n + kGrain - 1) / kGrain;
    const int threads = std::min<int>(threads_of(k), static_cast<int>(std::max<std::size_t>(items, 1)));
    if (threads <= 1) {
        fn(p, 0, n, s);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::size_t it = 0; it < items; ++it) fn(p, it * kGrain, std::min(n, (it + 1) * kGrain), s);
}

void adamw(std::span<const Update> us, std::span<const Scalars> scalars, const Kernel& k) {
    if (us.size() != scalars.size()) throw InternalError("AdamW: one Scalars per range");
    const auto fn = update_fn(k.isa);
    struct Item {
        std::size_t range, first, last;
    };
    std::vector<Item> items;
    for (std::size_t r = 0; r < us.size(); ++r) {
        us[r].check();
        for (std::size_t i = 0, n = us[r].size(); i < n; i += kGrain) items.push_back({r, i, std::min(n, i + kGrain)});
    }
    const int threads = std::min<int>(threads_of(k), static_cast<int>(std::max<std::size_t>(items.size(), 1)));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (std::size_t it = 0; it < items.size(); ++it)
        fn(ptrs(us[items[it].range]), items[it].first, items[it].last, scalars[items[it].range]);
}

namespace {
double squares(const float* f32, const std::uint16_t* b16, std::size_t n, const Kernel& k) {
    const auto fn = squares_fn(k.isa);
    const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
    // Block sums in batches on the stack, each batch filled in parallel and
    // added in order: the same sum for any thread count, and no allocation.
    constexpr std::size_t kBatch = 1024;
    std::array<double, kBatch> sums;
    const int threads = threads_of(k);
    double total = 0;
    for (std::size_t b0 = 0; b0 < blocks; b0 += kBatch) {
        const std::size_t nb = std::min(kBatch, blocks - b0);
        auto one = [&](std::size_t j) {
            const std::size_t first = (b0 + j) * kNormBlock, len = std::min(kNormBlock, n - first);
            sums[j] = fn(f32 ? f32 + first : nullptr, b16 ? b16 + first : nullptr, len);
        };
        if (threads <= 1 || nb < 4) {
            for (std::size_t j = 0; j < nb; ++j) one(j);
        } else {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (std::size_t j = 0; j < nb; ++j) one(j);
        }
        for (std::size_t j = 0; j < nb; ++j) total += sums[j];
    }
    return total;
}
}  // namespace

double sum_squares(std::span<const float> g, const Kernel& k) { return squares(g.data(), nullptr, g.size(), k); }
double sum_squares(std::span<const std::uint16_t> g, const Kernel& k) {
    return squares(nullptr, g.data(), g.size(), k);
}

double clip_coefficient(double norm, double max_norm) {
    if (max_norm <= 0 || !std::isfinite(norm)) return 1;
    return std::min(1.0, max_norm / (norm + 1e-6));
}

// ---------------------------------------------------------------------------
LossScaler::LossScaler() : LossScaler(Options{}) {}
LossScaler::LossScaler(Options o) : o_(o), scale_(o.initial) {
    if (!(o.initial >= o.min && o.min > 0 && o.factor > 1 && o.growth_interval > 0))
        throw UsageError("loss scaler: needs initial >= min > 0, factor > 1 and a growth interval");
}

void LossScaler::update(bool overflow) {
    if (overflow) {
        ++overflows_;
        clean_ = 0;
        scale_ = std::max(o_.min, scale_ / o_.factor);
    } else if (++clean_ == o_.growth_interval) {
        clean_ = 0;
        scale_ *= o_.factor;
    }
}

}  // namespace zinf::optim
