// zinf train: one training step of a GPT over a manifest's state, as
// zinf-train runs it. The run's engine (zero::Engine) moves the parameters:
// by default ZeRO-Infinity, each rank holding only its partitions, in the
// manifest's tiers, every module's fetched and gathered before it runs, its
// gradients reduce-scattered and handed to the tiered optimizer as its
// backward ends; with `resident` the reference engine, the whole model on
// every rank (plain data parallel). The trainer drives the engine's step
// the same way whatever the placement; placement moves bytes, it never
// changes math.
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

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace zinf::train {

// Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay
// to lr*min_ratio at step `total`; steps count from 1.
struct Schedule {
    double lr = 3e-4, min_ratio = 0.1;
    std::uint64_t warmup = 0, total = 1;
    bool cosine = true;  // false: constant after warm-up
    double at(std::uint64_t step) const;
};

// Activation checkpointing (zinf-train --checkpoint): `all` keeps each
// block's input alone and runs every block's forward again inside its
// backward; `none` keeps every block's activations; `automatic` keeps them
// when they fit the device memory left beside the engine's need, else
// recomputes (choose_checkpointing); offloaded checkpoints are recomputed
// from, always. The same bits whichever (the recompute is the forward).
enum class Checkpointing { all, none, automatic };
Checkpointing parse_checkpointing(std::string_view text);  // "auto", "all", "none"; else UsageError naming them
const char* checkpointing_name(Checkpointing c);           // "auto", "all", "none"

// A run's choice (model::Shape::checkpoint) and why, for its account of
// itself (zinf-train's second line).
struct CheckpointChoice {
    bool recompute = true;
    std::string why;
};
// The rule, once (the Trainer's, zinf-train --bench's): `keep_bytes` the
// activations with every block's kept (LanguageModel::plan_bytes),
// `engine_bytes` what the engine takes of the device beside them,
// `free_bytes` what the device has left before either. `automatic` keeps
// every block's when keep_bytes + engine_bytes <= free_bytes and nothing is
// offloaded. `none` with an offload is refused (UsageError, 64).
CheckpointChoice choose_checkpointing(Checkpointing mode, model::Offload offload, std::uint64_t keep_bytes,
                                      std::uint64_t engine_bytes, std::uint64_t free_bytes);

struct Options {
    std::uint64_t batch = 4, seq = 64;  // per rank: B rows of T tokens
    // Activation checkpointing per block: the library's default is the
    // recompute (`all`); zinf-train's is `automatic`.
    Checkpointing checkpoint = Checkpointing::all;
    Schedule schedule;
    optim::AdamW adamw{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    double grad_clip = 1.0;             // 0: none
    std::string manifest_path;          // where commits go
    optim::Kernel kernel;               // the optimizer's threads
    bool resident = false;              // the reference engine instead of ZeRO-Infinity
    // The arithmetic of the model's GEMM inputs (device.hpp's Precision):
    // fp32 the reference; bf16 rounds what every GEMM reads, the loss,
    // gradients, master weights and optimizer state staying fp32, and over
    // bf16 working parameters the ZeRO-Infinity engine keeps the matrices
    // and embedding tables bf16 on the device (sets
    // infinity.bf16_weights): half the bytes held and read.
    device::Precision precision = device::Precision::fp32;
    // The optimizer updates each tensor as backward hands its gradient over,
    // speculatively, redoing the step when it is clipped (zero.hpp,
    // OptimizerOptions::overlap); false: the whole update after backward.
    bool overlap = true;
    // With overlap and the ZeRO-Infinity engine, the next step starts while
    // this one's update runs (OptimizerOptions::pipeline): step() returns
    // the step's log `update_pending`, finished by the next step's forward
    // (or settle()) and handed out then by finished(); false: each step's
    // update is committed before step() returns.
    bool pipeline = false;
    // With overlap, the bytes of master weights and moments a step that does
    // not speculate (after a clipped one) reads during backward, page-locked
    // for the run (OptimizerOptions::readahead); the default, kReadaheadAuto,
    // takes what the host can spare less what the device will still touch
    // when its memory is the host's; 0: none.
    std::uint64_t optimizer_readahead = zero::OptimizerOptions::kReadaheadAuto;
    // Where each block's activation checkpoint (its input) waits for the
    // backward pass: in device memory, or offloaded to pinned host memory or
    // to NVMe (the rank's folder) and prefetched back before it is needed.
    model::Offload offload_activations = model::Offload::none;
    // The blocks' attention kernels (model::Shape::attention: --attention).
    model::Attention attention = model::Attention::gemm;
    zero::InfinityOptions infinity;
    // The device's GPU (device::Options::gpu), for the communicator of the
    // engine's collectives at dp > 1 on cuda (zero::EngineOptions::gpu).
    int gpu = -1;
    // The bandwidth each step's disk traffic is held against (StepLog's
    // disk floor): what one process measured on the disk of the state files
    // (zinf-nvmebench --best's read_gibps and write_gibps, bytes/s here),
    // shared out over the ranks of a node, which use one disk together.
    // Zero: each rank probes its own folder at start-up with
    // `disk_probe_bytes` (all ranks at once, so each measures its share;
    // at most half the free space the run leaves; an I/O error there fails
    // the start like any other file's); 0 there too: no floor (zinf-train
    // probes 64 MiB by default). Only runs with a state or checkpoint on NVMe.
    io::Bandwidth disk;
    std::uint64_t disk_probe_bytes = 0;
};

struct StepLog {
    std::uint64_t step = 0;             // from 1
    double loss = 0;                    // mean over the global batch, before the update
    double lr = 0, grad_norm = 0;
    bool overflow = false;              // a gradient (or the loss) was not finite: the update was skipped
    double seconds = 0, forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
    std::uint64_t tokens = 0;           // over every rank
    double tokens_per_s = 0, flops_per_s = 0;  // model FLOPs (LanguageModel::flops_per_step), every rank
    // This rank's engine, over the step (zeros with the resident engine,
    // which reads nothing during a step): bytes of its partitions fetched
    // from each tier (gpu, cpu, nvme), compute's wait for them, the device
    // budget's peak use, and the process's peak resident memory.
    std::uint64_t fetched_bytes[3] = {};
    std::uint64_t collectives = 0;      // the engine's allgathers and reduce-scatters (dp > 1)
    double stall_seconds = 0;
    // Host <-> device over the step (Device::h2d_bytes, d2h_bytes: the
    // parameters fetched, the batch, the gradients out, the losses), each
    // over the step's seconds as GB/s (h2d_gbps, d2h_gbps: the rate the
    // step kept up, not the link's); the compute's wait on each: h2d_stall
    // is stall_seconds (parameters not there yet), d2h_stall_seconds the
    // gradients' copies waiting for a free buffer of their staging ring.
    std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
    double d2h_stall_seconds = 0;
    // The optimizer's work on the host's cores (its AdamW, 0 when the
    // device updates), and how much of the update ran beside the device's
    // compute: during backward (optimizer_overlap_seconds) and, pipelined,
    // beside the next forward (update_overlap_seconds), their sum.
    double optimizer_host_seconds = 0, optimizer_hidden_seconds = 0;
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
    // Read-ahead: bytes of master weights and moments read during backward
    // (in optimizer_read_bytes), and of them those the update took.
    std::uint64_t optimizer_readahead_bytes = 0, optimizer_readahead_used_bytes = 0;
    // This rank's disk traffic over the step and the least time it takes.
    // disk_read_bytes: parameters fetched from NVMe (fetched_bytes[2]), the
    // optimizer's reads of its state, activation checkpoints read back;
    // disk_written_bytes: the optimizer's writes of its state, checkpoints
    // offloaded. The gradients' scratch is kept in memory when the
    // optimizer's budget (--optimizer-readahead) holds it: its bytes,
    // handed over and read back once each, are grad_scratch_memory_bytes
    // and touch no file. Past the budget it is a file through the page
    // cache, counted apart (grad_scratch_read_bytes and _written_bytes; in
    // optimizer_read_bytes and optimizer_written_bytes too) and left out of
    // the floor, though the kernel may write it back.
    //   disk_floor_seconds = disk_read_bytes / disk_read_bps
    //                      + disk_written_bytes / disk_write_bps
    //   disk_floor_ratio   = seconds / disk_floor_seconds
    // (the drive reads and writes in turn, each at its measured best).
    // Floor and ratio are 0 without a bandwidth (Options::disk) or bytes.
    std::uint64_t disk_read_bytes = 0, disk_written_bytes = 0;
    std::uint64_t grad_scratch_read_bytes = 0, grad_scratch_written_bytes = 0;
    std::uint64_t grad_scratch_memory_bytes = 0;
    std::uint64_t activation_read_bytes = 0, activation_written_bytes = 0;  // offloaded to NVMe
    double disk_read_bps = 0, disk_write_bps = 0;
    double disk_floor_seconds = 0, disk_floor_ratio = 0;
    // The step against the larger of its two floors: compute_floor_seconds
    // is the forward and backward with no stall (forward_seconds +
    // backward_seconds - stall_seconds - what they waited for the step
    // before's update, update_waited_seconds), and
    //   step_floor_ratio = seconds / max(compute_floor_seconds, disk_floor_seconds)
    // (1: the step took no longer than the slower of compute and disk).
    // update_overlap_seconds: how much of this step's update ran under the
    // next step's compute (Options::pipeline; 0 without): its time after
    // step() returned less what the next step waited for it (for its
    // parameters, and for its end before the commit);
    // update_waited_seconds how long this step's forward (and backward)
    // waited for parameters the step before's update had not written yet.
    // update_under_backward: this step's update could run on under the
    // next step's backward too (a second gradient scratch; the next step
    // settles it after its backward), not only under its forward (false:
    // no room for the second scratch, or not pipelined; zinf-train's record
    // says false for a step it settles at once: the last, a validation's,
    // a checkpoint's).
    // Pipelined, `seconds` runs from the step's start to its step() return
    // (the update goes on beside the next step), so that the steps' seconds
    // add up to the run's.
    double compute_floor_seconds = 0, step_floor_ratio = 0;
    double update_overlap_seconds = 0, update_waited_seconds = 0;
    bool update_under_backward = false;
    // Pipelined: step() returned with the update running; the update's
    // figures (optimizer_read_bytes on, the disk floor, step_floor_ratio)
    // are filled when it settles (Trainer::finished).
    bool update_pending = false;
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
    // Reads its batch first: when that fails on any rank (the token file
    // changed or failed under the run, data.hpp), every rank throws before
    // anything of the step runs, and input_failed() says so from then on.
    StepLog step(const data::Loader& train);
    // Pipelined (Options::pipeline): the log of the step whose update was
    // settled since the last call (by the next step's forward, settle() or
    // save()), whole; nullopt when none.
    std::optional<StepLog> finished();
    // Waits for the update under way and commits it (every rank at once);
    // nothing without one. Its log is then finished().
    void settle();
    bool input_failed() const;
    // The mean loss over `batches` batches of `val` (0-based indices 0..),
    // averaged over the ranks. No gradients.
    double evaluate(const data::Loader& val, std::uint64_t batches);
    // The same, stopping between batches once `stop` is set on any rank
    // (every rank agrees each batch): nullopt then. An interrupt is honoured
    // within one batch's forward pass, not after all of them.
    std::optional<double> evaluate(const data::Loader& val, std::uint64_t batches, const std::atomic<bool>* stop);
    // Commits every state at step_count() into the manifest (settles the
    // update under way first).
    void save();
    // The manifest as last committed (or as opened).
    const shard::Manifest& manifest() const;
    // Commits `to`, a manifest this run committed before (the last whose
    // weights gave a finite loss), again: every rank first checks that the
    // files of its partitions `to` names still hold what it says. nullopt
    // once committed; else why not (nothing is committed then). An I/O
    // error reading those files is thrown (74, 73): the disk's, not theirs.
    std::optional<std::string> rollback(const shard::Manifest& to);
    // The first committed weight (master, else param) of any rank that is not
    // finite, described; nullopt when every one is. Every rank reads its own.
    std::optional<std::string> nonfinite_weights();

    model::LanguageModel& model();  // the GPT or the Llama the manifest's spec names
    zero::Engine& engine();           // the run's engine: its hooks, its last pass's figures
    model::Activations& activations();
    // Whether the blocks are recomputed (Options::checkpoint resolved), and why.
    const CheckpointChoice& checkpointing() const;
    // What the run needs of the device budget at the least: the activations
    // and the engine's reserved memory plus its largest fetch.
    std::uint64_t device_need() const;
    double flops_per_step() const;  // one rank's batch

    const Options& options() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// The checkpoint a run reads and commits: the committed manifest `given`
// leads to (shard::read_committed: a copy elsewhere goes stale with the
// first step), its files checked to stay beneath the data directory
// (shard::check_paths; with node-local rank folders every rank checks its
// own, in the Trainer), since the engine and the optimizer open them later.
// Read under the lock this process holds for the run (Committed::lock,
// exclusive: rank 0 the data directory, each rank its node-local folder,
// the rank taken from the launcher's environment): LockedError (75) when
// another program uses the state.
shard::Committed read_checkpoint(const std::string& given);

// The step a run starts from: a manifest past step 0 is a checkpoint,
// continued only with `resume`, and only when it is short of `steps`
// (UsageError naming `path` otherwise).
std::uint64_t resume_step(const shard::Manifest& m, const std::string& path, bool resume, std::uint64_t steps);

// The run's cadence, as zinf-train keeps it.
struct Cadence {
    std::uint64_t steps = 1;             // train until this step (a resumed run counts from its checkpoint)
    std::uint64_t eval_every = 0;        // the validation loss every N steps and at the last (0: never)
    std::uint64_t eval_batches = 4;      // batches per validation
    std::uint64_t checkpoint_every = 0;  // commit every N steps (0: at the end only)
    // Set by a signal: every rank commits at the same step and the run
    // throws Interrupted (130).
    const std::atomic<bool>* stop = nullptr;
};

// Rank 0's step line: the step's log and its validation loss, if one was
// taken. An Error it throws (a closed pipe, a full disk) stops the run like
// an interrupt: every rank commits, then rank 0 throws it.
using StepSink = std::function<void(const StepLog&, std::optional<double> val_loss)>;

// Steps `t` from its step_count() to c.steps, committing at the end. A step
// whose gradient is not finite (fp32, no loss scaling: it would be again on
// the same batch) is reported, the state before it committed, and the run
// stops with DataError. `val` is needed only with eval_every.
void run(Trainer& t, comm::Communicator& comm, const data::Loader& train, const data::Loader* val, const Cadence& c,
         const StepSink& emit);

}  // namespace zinf::train
