// What offloading activation checkpoints moves (model.hpp): which
// checkpoints leave the device and their bytes. Where they wait is the
// engine's (zero.hpp, ActivationStore).
#include <zinf/model.hpp>

namespace zinf::model {

std::uint64_t offloaded_checkpoints(const Config& cfg) { return cfg.layers > 2 ? cfg.layers - 2 : 0; }

std::uint64_t checkpoint_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T, device::Precision p) {
    return B * T * cfg.hidden * (p == device::Precision::bf16 ? sizeof(std::uint16_t) : sizeof(float));
}

std::uint64_t offload_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T, device::Precision p) {
    return offloaded_checkpoints(cfg) * align_up(checkpoint_bytes(cfg, B, T, p), 4096);
}

}  // namespace zinf::model
