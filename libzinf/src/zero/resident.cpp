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
ResidentEngine::ResidentEngine(device::Device& dev, std::span<const std::uint64_t> numels) : dev_(dev) {
    std::uint64_t at = 0;
    for (const std::uint64_t n : numels) {
        offsets_.push_back(at);
        sizes_.push_back(n);
        at += (n + 15) / 16 * 16;  // 64-byte aligned starts
    }
    values_ = dev.alloc<float>(at, "parameters");
    grads_ = dev.alloc<float>(at, "gradients");
}

std::span<float> ResidentEngine::values(std::size_t param) {
    return values_.span().subspan(offsets_.at(param), sizes_[param]);
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
