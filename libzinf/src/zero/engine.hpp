// The run's engine (zero.hpp, Engine): what its two implementations share
// (the optimizer or the committed parameters, the activation checkpoints'
// store, the learning rate and the step count), and the implementations
// themselves: the resident reference (engine_resident.cpp) and ZeRO-Infinity
// (engine.cpp).
#pragma once

#include <zinf/zero.hpp>

#include <memory>

namespace zinf::zero::detail {

class EngineBase : public Engine {
public:
    EngineBase(shard::Manifest& m, comm::Communicator& comm, io::Engine& io, mem::PinnedPool& pool,
               device::Device& dev, const EngineOptions& opts);

    void begin_step(double lr) final;
    void begin_forward() final;
    std::uint64_t step_count() const override;
    void save() override;
    std::optional<StepReport> settle() override { return optim ? optim->settle() : std::nullopt; }
    bool update_under_backward() const override { return optim && optim->update_under_backward(); }
    bool settle_after_backward() const override { return optim && optim->settle_after_backward(); }
    PassStats stats() const final;
    const EngineOptions& options() const override { return opts; }
    std::shared_ptr<ActivationStore> activation_store() const override { return acts; }

protected:
    virtual void begin_pass(bool train) = 0;
    virtual InfinityStats pass_stats() const = 0;

    // The optimizer (InternalError where only forward passes run).
    Optimizer& optimizer() const;
    // Opens it, its read-ahead said once. A default budget leaves room for
    // what a host-memory device (the cpu backend, whose pages are taken as
    // used) will still touch: `device_more` bytes. `on_device`: gpu-tier
    // state is held and updated on the device (OptimizerOptions::device).
    void open_optimizer(std::uint64_t device_more, bool on_device = false);
    // Where offloaded activation checkpoints go: page-locked host memory, or
    // a scratch file in the rank's folder beside its state.
    void open_activations(const ActivationPlan& plan);

    shard::Manifest& m;
    comm::Communicator& comm;
    io::Engine& io;
    mem::PinnedPool& pool;
    device::Device& dev;
    EngineOptions opts;
    unsigned dp = 1, rank = 0;
    std::unique_ptr<comm::Communicator> device_comm;  // made here (opts.infinity.device_comm points at it)
    std::unique_ptr<Optimizer> optim;
    std::shared_ptr<ActivationStore> acts;
    std::uint64_t acts_in = 0, acts_out = 0;  // the store's counts when the pass began
};

std::unique_ptr<Engine> open_resident(shard::Manifest& m, comm::Communicator& comm, io::Engine& io,
                                      mem::PinnedPool& pool, device::Device& dev, const EngineOptions& opts,
                                      const ActivationPlan& plan);

}  // namespace zinf::zero::detail
