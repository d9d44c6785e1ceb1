// zinf train: one training step of a GPT over a manifest's state, as
// zinf-train runs it. By default the ZeRO-Infinity engine
// (zero::InfinityEngine) moves the parameters: each rank holds only its
// partitions, in the manifest's tiers, and every module's are fetched and
// gathered before it runs, its gradients reduce-scattered and handed to the
// tiered optimizer (zero::Optimizer) as its backward ends. The optimizer
// writes the new working parameters to their tier, where the next step
// fetches them. With `resident` the reference engine keeps the whole model
// on every rank instead (plain data parallel: one reduce-scatter after
// backward, the new parameters gathered back). Placement moves bytes; it
// never changes math.
//
//   zinf::train::Trainer t(manifest, comm, engine, pool, *dev, opts);
//   for (auto s = t.step_count(); s < opts.steps; ++s) log(t.step(loader));
//   t.save();
//
// A step's batch is the loader's batch number step_count() (0-based), so a
// run resumed from a committed step reads exactly the batches the
// uninterrupted run would have read.
//
// Device memory is reached through copies only. The collectives run over
// device buffers where the device says they are host-addressable (the cpu
// backend, with MPI); the cuda backend brings NCCL for the rest.
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
    bool resident = false;              // the reference engine instead of ZeRO-Infinity
    // The optimizer updates each tensor as backward hands its gradient over,
    // speculatively, redoing the step when it is clipped (zero.hpp,
    // OptimizerOptions::overlap); false: the whole update after backward.
    bool overlap = true;
    // Where each block's activation checkpoint (its input) waits for the
    // backward pass: in device memory, or offloaded to pinned host memory or
    // to NVMe (the rank's folder) and prefetched back before it is needed.
    model::Offload offload_activations = model::Offload::none;
    zero::InfinityOptions infinity;
};

struct StepLog {
    std::uint64_t step = 0;             // from 1
    double loss = 0;                    // mean over the global batch, before the update
    double lr = 0, grad_norm = 0;
    bool overflow = false;              // a gradient was not finite: the update was skipped
    double seconds = 0, forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
    std::uint64_t tokens = 0;           // over every rank
    double tokens_per_s = 0, flops_per_s = 0;  // model FLOPs (GPT::flops_per_step), every rank
    // This rank's engine, over the step (zeros with the resident engine,
    // which reads nothing during a step): bytes of its partitions fetched
    // from each tier (gpu, cpu, nvme), compute's wait for them, the device
    // budget's peak use, and the process's peak resident memory.
    std::uint64_t fetched_bytes[3] = {};
    double stall_seconds = 0;
    std::uint64_t device_peak_bytes = 0, peak_rss_bytes = 0;
    bool trace_diverged = false;
    // The optimizer: tensors updated during backward, the seconds its
    // thread streamed then, and whether step() had to redo them all
    // (the step was clipped, or its loss scale changed).
    std::uint64_t optimizer_speculated = 0;
    double optimizer_overlap_seconds = 0;
    bool optimizer_redo = false;
    // The optimizer's streams over the step (speculation, redo and the
    // rest): bytes read and written, seconds in the AdamW kernel and
    // waiting for its reads or for write space; then the sync of what it
    // wrote and the manifest commit.
    std::uint64_t optimizer_read_bytes = 0, optimizer_written_bytes = 0;
    double optimizer_update_seconds = 0, optimizer_wait_seconds = 0;
    double optimizer_commit_seconds = 0;
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
    // The resident engine (InternalError unless Options::resident).
    model::ResidentEngine& engine();
    // The ZeRO-Infinity engine (nullptr with Options::resident).
    zero::InfinityEngine* infinity();
    model::Activations& activations();
    // What the run needs of the device budget at the least: the activations
    // and the engine's reserved memory plus its largest fetch.
    std::uint64_t device_need() const;
    double flops_per_step() const;  // one rank's batch

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::train
