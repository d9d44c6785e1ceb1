// zinf train: one training step of a GPT over a manifest's state, as
// zinf-train runs it. The model's parameters stay resident on the device
// (model::ResidentEngine); gradients are averaged over the data-parallel
// ranks and handed, partition by partition, to the tiered optimizer
// (zero::Optimizer), whose new working parameters are gathered back into
// every rank's resident copy. Placement moves bytes; it never changes math.
//
//   zinf::train::Trainer t(manifest, comm, engine, pool, *dev, opts);
//   for (auto s = t.step_count(); s < opts.steps; ++s) log(t.step(loader));
//   t.save();
//
// A step's batch is the loader's batch number step_count() (0-based), so a
// run resumed from a committed step reads exactly the batches the
// uninterrupted run would have read.
//
// This stage runs on the cpu device only: the trainer loads and updates the
// resident parameters and hands the gradients to the optimizer and the
// collectives straight from device memory, which is host memory there. The
// cuda backend will stage these through copies.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/model.hpp>
#include <zinf/zero.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace zinf::train {

// Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay
// to lr*min_ratio at step `total`; steps count from 1.
struct Schedule {
    double lr = 3e-4, min_ratio = 0.1;
    std::uint64_t warmup = 0, total = 1;
    bool cosine = true;  // false: constant after warm-up
    double at(std::uint64_t step) const;
};

struct Options {
    std::uint64_t batch = 4, seq = 64;  // per rank: B rows of T tokens
    bool checkpoint = true;             // activation checkpointing per block
    Schedule schedule;
    optim::AdamW adamw{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    double grad_clip = 1.0;             // 0: none
    std::string manifest_path;          // where commits go
    optim::Kernel kernel;               // the optimizer's threads
};

struct StepLog {
    std::uint64_t step = 0;             // from 1
    double loss = 0;                    // mean over the global batch, before the update
    double lr = 0, grad_norm = 0;
    bool overflow = false;              // a gradient was not finite: the update was skipped
    double seconds = 0, forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
    std::uint64_t tokens = 0;           // over every rank
    double tokens_per_s = 0, flops_per_s = 0;  // model FLOPs (GPT::flops_per_step), every rank
};

class Trainer {
public:
    // Opens the manifest's state at its committed step: the working
    // parameters are read into the device and the optimizer opens its
    // partitions. `m` must outlive the trainer (commits update it).
    Trainer(shard::Manifest& m, comm::Communicator& comm, io::Engine& engine, mem::PinnedPool& pool,
            device::Device& dev, const Options& opts);
    ~Trainer();

    std::uint64_t step_count() const;  // steps committed or taken
    StepLog step(const data::Loader& train);
    // The mean loss over `batches` batches of `val` (0-based indices 0..),
    // averaged over the ranks. No gradients.
    double evaluate(const data::Loader& val, std::uint64_t batches);
    // Commits every state at step_count() into the manifest.
    void save();

    model::GPT& gpt();
    model::ResidentEngine& engine();
    model::Activations& activations();
    double flops_per_step() const;  // one rank's batch

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::train
