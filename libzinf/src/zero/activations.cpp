// Activation checkpoints offloaded to page-locked host memory or to NVMe
// (zero.hpp, ActivationStore): the model hands them over and takes them
// back; where they wait, and the files and pinned memory that takes, are
// the engine's.
#include <zinf/zero.hpp>

#include <algorithm>
#include <utility>

#include <unistd.h>

namespace zinf::zero {

namespace {
// Each place's name, once: what --offload-activations takes and logs say.
constexpr std::pair<Offload, const char*> kOffloadNames[] = {
    {Offload::none, "none"}, {Offload::cpu, "cpu"}, {Offload::nvme, "nvme"}};
}  // namespace

const char* offload_name(Offload o) {
    for (const auto& [kind, name] : kOffloadNames)
        if (kind == o) return name;
    return "?";
}

Offload parse_offload(std::string_view text) {
    for (const auto& [kind, name] : kOffloadNames)
        if (text == name) return kind;
    throw UsageError("activation offload '" + std::string(text) + "': expected none, cpu or nvme");
}

namespace {

// Checkpoint j in slot j: of host memory (cpu), or of the scratch file
// (nvme), through one staging buffer per direction.
class Store final : public ActivationStore {
public:
    Store(Offload kind, std::uint64_t count, std::uint64_t bytes_each, mem::PinnedPool& pool, io::Engine* io,
          std::string path);
    ~Store() override;

    Offload kind() const override { return kind_; }
    void save(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<const std::byte> src) override;
    void wait_saved(device::Device& dev, device::Stream& compute, std::uint64_t j) override {
        dev.wait(compute, saved_.at(j));
    }
    void load(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<std::byte> dst) override;
    void wait_loaded(device::Device& dev, device::Stream& compute, std::uint64_t j) override {
        dev.wait(compute, loaded_.at(j));
    }
    std::uint64_t bytes_out() const override { return out_; }
    std::uint64_t bytes_in() const override { return in_; }

private:
    Offload kind_;
    std::uint64_t count_, bytes_, slot_;
    io::Engine* io_;
    std::string path_;
    io::File file_;
    mem::Pinned host_, stage_out_, stage_in_;
    std::vector<device::Event> saved_, loaded_;
    std::uint64_t out_ = 0, in_ = 0;
};

Store::Store(Offload kind, std::uint64_t count, std::uint64_t bytes_each, mem::PinnedPool& pool, io::Engine* io,
             std::string path)
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

Store::~Store() {
    if (kind_ != Offload::nvme || !file_.impl()) return;
    try {
        file_.close();
    } catch (const Error& e) {
        log::warn(e.what());
    }
    ::unlink(path_.c_str());
}

void Store::save(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<const std::byte> src) {
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

void Store::load(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<std::byte> dst) {
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

}  // namespace

std::unique_ptr<ActivationStore> ActivationStore::open(Offload kind, std::uint64_t count, std::uint64_t bytes_each,
                                                       mem::PinnedPool& pool, io::Engine* io, std::string path) {
    return std::make_unique<Store>(kind, count, bytes_each, pool, io, std::move(path));
}

}  // namespace zinf::zero
