// zinf zero, first part: partitioned tensors over the data-parallel ranks
// (bandwidth-centric partitioning, paper §6.1). Every tensor is split over
// all ranks by shard::owned, the rule zinf-shard lays partitions out with; a
// rank holds its partition as stored: per = ceil(numel/dp) elements, the
// tail past the tensor's end being padding.
//
//   gather:         own partition (per elements)   -> the full tensor (numel) on every rank
//   reduce_scatter: the full gradient (numel) on every rank -> own partition of the average
//
// Only real elements travel: gather reads the first `count` elements of each
// partition, reduce_scatter writes them and leaves the padding as it was, so
// padding never reaches a caller's full tensor. A list of tensors is one
// collective (a bucket). Buffers live where the communicator's memory says.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/optim.hpp>
#include <zinf/shard.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace zinf::zero {

using shard::owned;
using shard::Owned;

struct Gather {
    std::span<const std::byte> own;  // this rank's partition: per elements
    std::span<std::byte> full;       // numel elements
    std::uint64_t numel = 0;
};

struct Scatter {
    std::span<const std::byte> full;  // numel elements: this rank's whole gradient
    std::span<std::byte> own;         // per elements: the real ones get the result
    std::uint64_t numel = 0;
};

comm::Handle start_gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype);
void gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype);
void gather(comm::Communicator& comm, const Gather& tensor, comm::DType dtype);

// reduce defaults to the average, as gradients want.
comm::Handle start_reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                                  comm::Reduce reduce = comm::Reduce::avg);
void reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                    comm::Reduce reduce = comm::Reduce::avg);
void reduce_scatter(comm::Communicator& comm, const Scatter& tensor, comm::DType dtype,
                    comm::Reduce reduce = comm::Reduce::avg);

// ---------------------------------------------------------------------------
// The tiered optimizer step (paper §5.2.2, §6.4): each rank updates the
// partitions zinf-shard laid out for it, with the CPU AdamW of optim.hpp,
// wherever the manifest says each state lives.
//
//   gpu, cpu  the rank's state sits in host memory for the whole run, loaded
//             (and checked against its xxh3) when the optimizer opens; gpu
//             runs the CPU update until the device layer brings its kernel.
//   nvme      the state stays in its files and streams through the pinned
//             pool in chunks: chunk i+1 is read (master, moments, gradient)
//             while chunk i is updated while chunk i-1 is written, the
//             working parameters written to their tier in the same pass.
//
// Gradients follow the optimizer state: in memory for gpu and cpu, for nvme
// in a scratch file beside the state (rank<R>/grad.bin, removed on close).
//
// Consistency on disk: a step never writes over the values the manifest
// names. A state file has three generations (master.bin, master.alt.bin,
// master.work.bin); a step reads the one holding the current values and
// writes one that holds neither them nor what the manifest names.
//   - Every state on nvme: each step syncs what it wrote and commits the
//     manifest (rank 0, atomically: temporary, fsync, rename) naming the new
//     files, each written partition with its new xxh3 and step. An
//     interrupted step leaves the manifest naming the old, complete files.
//   - Some state held in memory (gpu, cpu): steps commit nothing; the
//     manifest stays at the last save() and the streamed files rotate around
//     the ones it names. save() writes the memory-held state to new space
//     and commits everything at the current step. A crash loses the steps
//     since the last save, never the save.
// Every record says the step its values are at; a manifest whose records
// disagree is refused when opened rather than taken for complete.
struct OptimizerOptions {
    optim::AdamW adamw;              // lr is the starting rate; set_lr() changes it
    double grad_clip = 0;            // max global gradient norm (over all ranks); 0: none
    bool decay_1d = false;           // weight decay for 1-D tensors (biases, LayerNorm) too
    shard::DType grad_dtype = shard::DType::fp32;
    // Update each tensor as soon as put_gradient() hands it over, on the
    // optimizer's own thread, instead of all in step(): the update overlaps
    // the rest of the backward pass. Needs the whole gradient norm first, so
    // it refuses grad_clip and loss scaling (both need every gradient).
    bool overlap = false;
    unsigned slots = 3;              // chunks in flight on NVMe (read, update, write); 2 or more
    optim::Kernel kernel;
    std::string manifest_path;       // where commits go; "" = <dir>/manifest.jsonl
    // Called with the new working parameters of every piece a step updates:
    // elements [first, first + n) of the tensor's partition (padding included)
    // in the param dtype, on the thread that ran the update, before they are
    // written. A trainer keeping the parameters resident copies them here
    // instead of reading them back.
    std::function<void(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values)> on_param;
};

struct StepReport {
    std::uint64_t step = 0;          // the rank's committed step after this one
    double grad_norm = 0;            // global, unscaled; not finite on overflow
    double clip = 1;                 // the clipping coefficient applied
    bool overflow = false;           // a gradient was not finite: the step was skipped
    double seconds = 0;              // the whole step, commit included
    double update_seconds = 0;       // in the AdamW kernel
    double wait_seconds = 0;         // the update waiting for reads (or for write space)
    double commit_seconds = 0;       // sync of the written files and the manifest commit
    std::uint64_t bytes_read = 0, bytes_written = 0;
    std::uint64_t chunks = 0;        // chunks streamed (0 when every state is in memory)
    std::uint64_t chunk_bytes = 0;   // room for one state's piece of a chunk (K, from the pool)
};

class Optimizer {
public:
    // Opens this rank's state (comm.rank() of dp; comm.size() must equal the
    // manifest's dp). `m` must outlive the optimizer: commits update it.
    Optimizer(shard::Manifest& m, comm::Communicator& comm, io::Engine& engine, mem::PinnedPool& pool,
              const OptimizerOptions& opts);
    ~Optimizer();
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    unsigned rank() const;
    std::uint64_t step_count() const;  // steps committed (the records' step)
    void set_lr(double lr);            // between steps (InternalError once a gradient is in)

    // This rank's gradient of `tensor`: its `count` real elements (shard::owned),
    // fp32 or bf16 (converted to grad_dtype when that differs). Every tensor
    // once per step. With overlap, the tensor's update starts now.
    void put_gradient(std::size_t tensor, std::span<const float> grad);
    void put_gradient(std::size_t tensor, std::span<const std::uint16_t> grad_bf16);

    // Clips, updates every partition (or waits for the overlapped updates),
    // and commits. loss_scale divides the gradients (fp16); a gradient that is
    // not finite on any rank skips the step on every rank (overflow).
    StepReport step(double loss_scale = 1);

    // Writes the state held in memory (gpu and cpu tiers) to new space and
    // commits it with the streamed files' current generation, so the
    // manifest holds the whole state at step_count(). Not while a step has
    // gradients handed over.
    void save();

    // The working parameters of `tensor` (this rank's partition, `per`
    // elements of the param dtype) when the param state is held in memory.
    std::span<const std::byte> param(std::size_t tensor) const;

    // How the NVMe stream is cut: the bytes of one state's piece of a chunk.
    std::uint64_t chunk_bytes() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// The twin of a state file: "rank0/master.bin" <-> "rank0/master.alt.bin".
std::string twin_file(const std::string& file);

}  // namespace zinf::zero
