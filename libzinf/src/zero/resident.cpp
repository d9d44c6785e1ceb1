// The hook interface's checks (zero.hpp: a module reaches only the
// parameters it declared or uses) and the resident reference engine.
#include <zinf/zero.hpp>

#include <algorithm>

namespace zinf::zero {

bool Module::uses(std::size_t param) const {
    return std::find(own_.begin(), own_.end(), param) != own_.end() ||
           std::find(external_.begin(), external_.end(), param) != external_.end();
}

namespace {
void check_uses(const Module& m, std::size_t param, const char* what) {
    if (!m.uses(param))
        throw InternalError("module " + m.name() + " asked for " + what + std::to_string(param) +
                            ", which it neither declared nor registered as external");
}
}  // namespace

std::span<const float> ParamEngine::weight(const Module& m, std::size_t param) {
    check_uses(m, param, "parameter ");
    return weight_of(m, param);
}

device::ConstView ParamEngine::stored(const Module& m, std::size_t param) {
    check_uses(m, param, "parameter ");
    if (const auto b = weight_bf16_of(m, param); !b.empty()) return b;
    return weight_of(m, param);
}

std::span<float> ParamEngine::grad(const Module& m, std::size_t param) {
    check_uses(m, param, "the gradient of parameter ");
    return grad_of(m, param);
}

// ---------------------------------------------------------------------------
ResidentEngine::ResidentEngine(device::Device& dev, std::span<const std::uint64_t> numels,
                               const std::vector<bool>& bf16)
    : dev_(dev) {
    if (!bf16.empty() && bf16.size() != numels.size())
        throw InternalError("ResidentEngine: " + std::to_string(bf16.size()) + " bf16 marks for " +
                            std::to_string(numels.size()) + " parameters");
    std::uint64_t at = 0, at_f32 = 0, at_bf16 = 0;
    for (std::size_t i = 0; i < numels.size(); ++i) {
        const std::uint64_t n = numels[i];
        const bool keep = !bf16.empty() && bf16[i];
        offsets_.push_back(at);
        sizes_.push_back(n);
        f32_offsets_.push_back(keep ? kNone : at_f32);
        bf16_offsets_.push_back(keep ? at_bf16 : kNone);
        at += (n + 15) / 16 * 16;  // 64-byte aligned starts
        if (keep)
            at_bf16 += (n + 31) / 32 * 32;
        else
            at_f32 += (n + 15) / 16 * 16;
    }
    values_ = dev.alloc<float>(at_f32, "parameters");
    if (at_bf16) values_bf16_ = dev.alloc<std::uint16_t>(at_bf16, "bf16 parameters");
    grads_ = dev.alloc<float>(at, "gradients");
}

std::span<float> ResidentEngine::values(std::size_t param) {
    const std::uint64_t at = f32_offsets_.at(param);
    if (at == kNone)
        throw InternalError("ResidentEngine: parameter " + std::to_string(param) +
                            " is kept bf16; its values are read through stored()");
    return values_.span().subspan(at, sizes_[param]);
}

std::span<std::uint16_t> ResidentEngine::values_bf16(std::size_t param) {
    const std::uint64_t at = bf16_offsets_.at(param);
    if (at == kNone) return {};
    return values_bf16_.span().subspan(at, sizes_[param]);
}

std::span<float> ResidentEngine::gradient(std::size_t param) {
    return grads_.span().subspan(offsets_.at(param), sizes_[param]);
}

void ResidentEngine::zero_grad(device::Stream& s) { dev_.zero(s, grads_); }

void ResidentEngine::before_forward(const Module& m) {
    if (tracing) trace.push_back({Hook::before_forward, m.name()});
}
void ResidentEngine::after_forward(const Module& m) {
    if (tracing) trace.push_back({Hook::after_forward, m.name()});
}
void ResidentEngine::before_backward(const Module& m) {
    if (tracing) trace.push_back({Hook::before_backward, m.name()});
}
void ResidentEngine::after_backward(const Module& m) {
    if (tracing) trace.push_back({Hook::after_backward, m.name()});
}

}  // namespace zinf::zero
