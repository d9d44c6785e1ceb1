// Activation checkpoints offloaded to page-locked host memory or to NVMe
// (model.hpp, ActivationStore).
#include <zinf/model.hpp>

#include <algorithm>

#include <unistd.h>

namespace zinf::model {

const char* offload_name(Offload o) {
    switch (o) {
        case Offload::none: return "none";
        case Offload::cpu: return "cpu";
        case Offload::nvme: return "nvme";
    }
    return "?";
}

Offload parse_offload(std::string_view text) {
    for (Offload o : {Offload::none, Offload::cpu, Offload::nvme})
        if (text == offload_name(o)) return o;
    throw UsageError("activation offload '" + std::string(text) + "': expected none, cpu or nvme");
}

std::uint64_t offloaded_checkpoints(const Config& cfg) { return cfg.layers > 2 ? cfg.layers - 2 : 0; }

std::uint64_t checkpoint_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T, device::Precision p) {
    return B * T * cfg.hidden * (p == device::Precision::bf16 ? sizeof(std::uint16_t) : sizeof(float));
}

std::uint64_t offload_bytes(const Config& cfg, std::uint64_t B, std::uint64_t T, device::Precision p) {
    return offloaded_checkpoints(cfg) * align_up(checkpoint_bytes(cfg, B, T, p), 4096);
}

ActivationStore::ActivationStore(Offload kind, std::uint64_t count, std::uint64_t bytes_each, mem::PinnedPool& pool,
                                 io::Engine* io, std::string path)
    : kind_(kind), count_(count), bytes_(bytes_each), slot_(align_up(bytes_each, 4096)), io_(io),
      path_(std::move(path)), saved_(count), loaded_(count) {
    if (kind == Offload::none) throw InternalError("ActivationStore: nowhere to offload to");
    if (kind == Offload::cpu) {
        host_ = pool.pin(std::max<std::uint64_t>(count * slot_, 4096), "activation checkpoints");
        return;
    }
    if (!io_ || path_.empty()) throw InternalError("ActivationStore: nvme needs an io engine and a file");
    stage_out_ = pool.pin(slot_, "activation staging buffer (out)");
    stage_in_ = pool.pin(slot_, "activation staging buffer (in)");
    // Scratch: whatever an earlier run left is void.
    ::unlink(path_.c_str());
    io::OpenOptions oo{.access = io::Access::read_write, .create = true, .exclusive = true, .mode = 0600};
    file_ = io::File::open_aligned(path_, oo, slot_);
    file_.preallocate(std::max<std::uint64_t>(count * slot_, 1));
}

ActivationStore::~ActivationStore() {
    if (kind_ != Offload::nvme || !file_.impl()) return;
    try {
        file_.close();
    } catch (const Error& e) {
        log::warn(e.what());
    }
    ::unlink(path_.c_str());
}

void ActivationStore::save(device::Device& dev, device::Stream& compute, std::uint64_t j,
                           std::span<const std::byte> src) {
    if (j >= count_ || src.size_bytes() != bytes_) throw InternalError("ActivationStore::save: checkpoint " + std::to_string(j));
    auto& d2h = dev.stream(device::StreamKind::d2h);
    dev.wait(d2h, dev.record(compute));
    if (kind_ == Offload::cpu) {
        dev.copy(d2h, host_.bytes().subspan(j * slot_, bytes_), src);
    } else {
        dev.copy(d2h, stage_out_.bytes().first(bytes_), src);
        dev.host(d2h, [this, j] { io_->wait(io_->write(file_, j * slot_, stage_out_.bytes().first(slot_))); });
    }
    saved_[j] = dev.record(d2h);
    out_ += bytes_;
}

void ActivationStore::wait_saved(device::Device& dev, device::Stream& compute, std::uint64_t j) {
    dev.wait(compute, saved_.at(j));
}

void ActivationStore::load(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<std::byte> dst) {
    if (j >= count_ || dst.size_bytes() != bytes_) throw InternalError("ActivationStore::load: checkpoint " + std::to_string(j));
    auto& h2d = dev.stream(device::StreamKind::h2d);
    dev.wait(h2d, dev.record(compute));
    // Saved before it is read back: the d2h stream's copy (and write) first.
    dev.wait(h2d, saved_[j]);
    if (kind_ == Offload::cpu) {
        dev.copy(h2d, dst, host_.bytes().subspan(j * slot_, bytes_));
    } else {
        dev.host(h2d, [this, j] { io_->wait(io_->read(file_, j * slot_, stage_in_.bytes().first(slot_))); });
        dev.copy(h2d, dst, stage_in_.bytes().first(bytes_));
    }
    loaded_[j] = dev.record(h2d);
    in_ += bytes_;
}

void ActivationStore::wait_loaded(device::Device& dev, device::Stream& compute, std::uint64_t j) {
    dev.wait(compute, loaded_.at(j));
}

}  // namespace zinf::model
