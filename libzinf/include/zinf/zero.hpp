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
#include <zinf/device.hpp>
#include <zinf/optim.hpp>
#include <zinf/shard.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// The same, stream-ordered (comm::Communicator::enqueue, nccl): enqueued on
// `stream` (device::Device::native) after `after` (null: the stream's own
// order); the buffers are device memory and the call does not wait.
void enqueue_gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype, void* stream,
                    void* after = nullptr);
void enqueue_reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                            void* stream, void* after = nullptr, comm::Reduce reduce = comm::Reduce::avg);
// The device memory `comm` lays a bucket of tensors of these sizes flat in
// (comm::Communicator::flat_bytes, the partition's counts): `kind` is
// allgather (gather) or reduce_scatter; 0 where comm needs none.
std::uint64_t flat_bytes(const comm::Communicator& comm, comm::Kind kind, std::span<const std::uint64_t> numels,
                         comm::DType dtype);
// The same as a backend that lays buckets flat (nccl) would over `dp` ranks.
std::uint64_t laid_flat_bytes(comm::Kind kind, std::span<const std::uint64_t> numels, comm::DType dtype, unsigned dp);

// ---------------------------------------------------------------------------
// The tiered optimizer step (paper §5.2.2, §6.4): each rank updates the
// partitions zinf-shard laid out for it, with the CPU AdamW of optim.hpp,
// wherever the manifest says each state lives.
//
//   gpu       with OptimizerOptions::device: the master weights and
//             moments (and the bf16 working parameters, when their tier is
//             gpu too) sit in the device's arena for the whole run, loaded
//             and checked when the optimizer opens; the update is the
//             device's AdamW (Device::adamw: kernels.def), one launch per
//             partition, which writes the working copy in the same pass.
//             The gradients are handed over on the host (their norm, and so
//             the clipping and the overflow skip, decided as for cpu) and
//             copied to the device by the update. Without a device, as cpu.
//   cpu       the rank's state sits in host memory for the whole run, loaded
//             (and checked against its xxh3) when the optimizer opens.
//   nvme      the state stays in its files and streams through the pinned
//             pool in chunks: chunk i+1 is read (master, moments, gradient)
//             while chunk i is updated while chunk i-1 is written, the
//             working parameters written to their tier in the same pass.
//
// Gradients follow the optimizer state: in memory for gpu and cpu. For nvme
// they are scratch, written as backward hands them over and read back by
// the same step's update, never needing to persist: held in memory when
// they fit the optimizer's memory budget (OptimizerOptions::readahead,
// which they take first), else in a scratch file beside the state
// (rank<R>/grad.bin, through the page cache, removed on close).
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
    // optimizer's own thread (one core), instead of all in step(): its
    // state's reads, update and writes overlap the rest of backward. The
    // update is speculative: it assumes the step is not clipped and the loss
    // scale is the last step's. When step() finds otherwise, it redoes every
    // tensor from the current generation (still on disk), or skips the step
    // (overflow) and puts back the working parameters it handed out, so the
    // result is bit for bit the step without overlap. Speculation needs the
    // master weights and moments streamed from NVMe; with them in memory the
    // update runs in step(), as without overlap.
    bool overlap = false;
    // Pipeline: step() returns once the global norm is known and the
    // update has started, on a thread of its own, in the order of the
    // state files (the order the forward reads the parameters: first module
    // first); the next step's forward runs beside it. param_source(t) waits
    // until tensor t's new values are written (the write complete, its
    // xxh3 known) and names them; the listener hears each piece as the
    // update makes it, as without the pipeline. settle() waits for the rest
    // (the writes of moments and master weights, their sync) and commits the
    // step: callers settle it at one point on every rank, before the next
    // step's first gradient (Engine::settle). A step never commits before
    // the one before it, and a kill at any instant leaves the manifest at
    // the last commit, the update's writes going to a generation it does not
    // name. The result is bit for bit the step without the pipeline.
    // With a second gradient scratch (update_under_backward: a second file
    // beside the first, or memory from the `readahead` budget where the
    // first is in memory), the next step's gradients may be handed over
    // while the update runs, into the other scratch: the update then runs
    // on under the next backward too and is settled after it, before the
    // next step() -- callers do so after a clipped step
    // (settle_after_backward), whose next step would not speculate
    // anyway; after an unclipped one they settle before the next
    // backward, which speculates. A step handed over beside the update
    // neither speculates nor prepares the
    // generation it will write (the one the commit frees) until the
    // settle; its read-ahead reads what the update writes, each chunk once
    // written, checked against the hashes the update computed.
    bool pipeline = false;
    // Read-ahead, with overlap: a step that does not speculate (the last one
    // was clipped or skipped, a rank's own gradients already force clipping,
    // or the step updates a generation in place) reads the master weights and
    // moments its update will need during backward, in the order the update
    // takes them, into page-locked memory of its own; step() updates from
    // there once the norm is known, and reads from the files only what did
    // not fit. The bytes read are checked against their xxh3 as they arrive,
    // as the update's own reads are; an I/O error fails the step. `readahead`
    // is the budget in bytes: the memory is taken by the first step that
    // reads ahead (PinnedPool::pin, at most the state the update reads, in
    // whole chunks; a run whose steps all speculate never takes it) and held
    // for the rest of the run; where the host refuses it then, the run goes
    // on without read-ahead (warned); 0: none. kReadaheadAuto: what the host can spare
    // (readahead_spare), less `readahead_reserve`, memory the caller will
    // still take (a host-memory device's working set).
    // The same budget holds the gradients' scratch first, with the optimizer
    // state on NVMe: when the whole of it fits (gradient_scratch_bytes), it
    // is kept in page-locked memory taken at open instead of the scratch
    // file, and the read-ahead has what is left. The scratch's bytes are
    // written and read once a step each; in a file they reach the drive as
    // the kernel writes back dirty pages (BENCHMARKS.md, issue 28), so they
    // come before the read-ahead, which only moves reads earlier. With
    // kReadaheadAuto and the scratch in a file, the read-ahead leaves room
    // for the file's pages in the page cache.
    static constexpr std::uint64_t kReadaheadAuto = ~std::uint64_t{0};
    std::uint64_t readahead = 0;
    std::uint64_t readahead_reserve = 0;
    unsigned slots = 3;              // chunks in flight on NVMe (read, update, write); 2 or more
    // This rank's share of the state's disk (the trainer's disk floor:
    // zinf-nvmebench --best, or its probe). Known, the update keeps more
    // chunks in the same pinned memory, its reads of the next running
    // beside its writes of the last, each direction as many chunks deep as
    // its share of a chunk's disk time (Optimizer::read_depth,
    // write_depth); zeros: `slots`, one chunk read ahead, one written behind.
    io::Bandwidth disk;
    optim::Kernel kernel;
    std::string manifest_path;       // where commits go; "" = <dir>/manifest.jsonl
    // The device that holds and updates gpu-tier optimizer state (above);
    // null: gpu-tier state is held on the host and updated by the CPU, as
    // cpu's. Used only when the optimizer state's tier is gpu and the
    // working parameters' (when there are any beside the master weights)
    // too; must outlive the optimizer. Its h2d stream runs the update.
    device::Device* device = nullptr;
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
    // Bytes the step's streams read and wrote (speculation, redo and the
    // rest; a skipped step's speculation too): every file role, the
    // gradients' scratch file's reads included in bytes_read and counted
    // again in grad_bytes_read.
    std::uint64_t bytes_read = 0, bytes_written = 0;
    std::uint64_t grad_bytes_written = 0;  // the gradients' scratch file, written as they were handed over
    std::uint64_t grad_bytes_read = 0;     // the gradients' scratch file, read back by the update
    // The gradients' scratch held in memory instead (OptimizerOptions::
    // readahead): the bytes handed over into it, each read back once by the
    // update; 0 when the file holds them or the state is not on NVMe.
    std::uint64_t grad_memory_bytes = 0;
    std::uint64_t chunks = 0;        // chunks streamed (0 when every state is in memory)
    std::uint64_t chunk_bytes = 0;   // room for one state's piece of a chunk (K, from the pool)
    std::uint64_t speculated = 0;    // overlap: tensors updated during backward
    double overlap_seconds = 0;      // overlap: seconds the optimizer thread streamed during backward
    bool redo = false;               // overlap: the speculation was wrong (clipped, or another loss scale)
                                     // and step() updated every tensor again from the current generation
    // Read-ahead: bytes of the master weights and moments read during
    // backward (in bytes_read), and of them the bytes the update took from
    // memory (less on a skipped step, which uses none).
    std::uint64_t readahead_bytes = 0, readahead_used_bytes = 0;
    // Pipeline (OptimizerOptions::pipeline): step()'s report is `pending`
    // while the update runs (its figures from update_seconds on, the bytes,
    // the commit and `step` not known yet); settle()'s is the whole step.
    // update_pipelined_seconds: the update's time from step()'s return to
    // its end, under the caller's next work; of it, update_waited_seconds
    // the caller waited in param_source for a parameter not yet written (a
    // forward's fetch), and settle_waited_seconds in settle() for the rest:
    // what the pipeline did not hide is the two waits.
    bool pending = false;
    double update_pipelined_seconds = 0, update_waited_seconds = 0, settle_waited_seconds = 0;
    bool device_update = false;      // the update ran on the device (OptimizerOptions::device), not the host
    // Pipelined with a second gradient scratch, a clipped step: the update
    // ran on under the next step's backward as well as its forward (settled
    // after it; Optimizer::settle_after_backward).
    bool update_under_backward = false;
};

// The memory one rank may spare for the optimizer's read-ahead by default:
// MemAvailable now less a margin (an eighth of MemTotal, at least 1 GiB),
// shared out over the node's `local_ranks`; 0 where /proc/meminfo says
// nothing.
std::uint64_t readahead_spare(int local_ranks);
// The same rule for given figures (zinf-plan's node): `available` less the
// margin of `total`, over `local_ranks`.
std::uint64_t readahead_spare(std::uint64_t available, std::uint64_t total, int local_ranks);

// Where this rank's working parameters of a tensor are, for the engine that
// fetches them: in memory (param tier gpu or cpu: `memory`, page-locked) or
// in a file (nvme: `file` at `offset`). `bytes` is the partition with its
// padding (per elements of the param dtype); `xxh3` the hash of those bytes
// when the values come from a file.
struct ParamSource {
    io::File* file = nullptr;
    std::uint64_t offset = 0;
    std::span<const std::byte> memory;
    // Device memory instead (the optimizer's gpu-tier working parameters,
    // updated there: OptimizerOptions::device), in the order of the
    // device's h2d stream.
    std::span<const std::byte> device;
    std::uint64_t bytes = 0;
    std::optional<std::uint64_t> xxh3;
    std::string where;  // "h.0.attn.c_attn.weight rank 0 param", for messages
};

// Told of the new working parameters of every piece a step updates:
// elements [first, first + n) of the tensor's partition (padding included)
// in the param dtype, before they are written, on the thread that ran the
// update (the optimizer's own while its update overlaps the backward). It
// copies what it needs and returns. An engine that keeps parameters on the
// device (the gpu tier, the resident copy) refreshes them here instead of
// reading them back.
class ParamListener {
public:
    virtual ~ParamListener() = default;
    virtual void updated(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values) = 0;
    // The same, the values in device memory (an optimizer whose update runs
    // on the device): valid in the order of stream `s`, where the listener
    // queues what it takes of them. InternalError from a listener that
    // cannot take device memory.
    virtual void updated_on_device(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values,
                                   device::Stream& s);
};

// What the ZeRO-Infinity engine reads parameters from and hands gradients
// to: the Optimizer while training, CommittedParams when only forward
// passes run (zinf-sample).
class ParamStore {
public:
    virtual ~ParamStore() = default;
    virtual ParamSource param_source(std::size_t tensor) = 0;
    // Whether param_source(tensor) returns now, without waiting (false
    // while an update is still writing the tensor's new values): the
    // engine reads ahead only what is ready, and waits only for the module
    // that runs.
    virtual bool param_ready(std::size_t) { return true; }
    // This rank's averaged gradient of `tensor`: its real elements.
    virtual void put_gradient(std::size_t tensor, std::span<const float> grad) = 0;
    // The one listener told of the parameters' updates (null: none), set
    // between steps; the engine that reads the store sets itself and clears
    // itself before it goes. A store whose parameters never change tells
    // no one.
    virtual void listen(ParamListener*) {}
};

class Optimizer : public ParamStore {
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
    void put_gradient(std::size_t tensor, std::span<const float> grad) override;
    void put_gradient(std::size_t tensor, std::span<const std::uint16_t> grad_bf16);
    // Every piece a step updates (its speculation, its redo, and the
    // parameters put back after a skipped step) is told to `l`.
    void listen(ParamListener* l) override;

    // Clips, updates every partition (or waits for the overlapped updates),
    // and commits. loss_scale divides the gradients (fp16); a gradient that is
    // not finite on any rank skips the step on every rank (overflow).
    StepReport step(double loss_scale = 1);
    // Pipeline: the step whose update runs (step() returned it pending)
    // synced and committed, on every rank at once (collectives; an update
    // that failed on any rank fails it on all: the manifest names the step
    // before, 74 naming the file), and its whole report; nullopt when no
    // update runs. The next step's first gradient (with one gradient
    // scratch; with two, the next step()), save() and the destructor
    // (which commits nothing) wait for it first.
    std::optional<StepReport> settle();
    bool pending() const;  // an update started by step() is not settled yet

    // Writes the state held in memory (gpu and cpu tiers) to new space and
    // commits it with the streamed files' current generation, so the
    // manifest holds the whole state at step_count(). Not while a step has
    // gradients handed over.
    void save();

    // Where this rank's current working parameters of `tensor` are (the
    // ParamStore's contract). Valid until the next step(). While a
    // pipelined update runs, waits until the tensor's new values are
    // written and names them (memory, or the generation the update writes
    // with its new xxh3); the update's error, if it fails first.
    using ParamSource = zero::ParamSource;
    ParamSource param_source(std::size_t tensor) override;
    bool param_ready(std::size_t tensor) override;

    // How the NVMe stream is cut: the bytes of one state's piece of a chunk.
    std::uint64_t chunk_bytes() const;
    // Chunks the update keeps read ahead of the one it updates, and whose
    // writes it lets run behind it (OptimizerOptions::disk).
    std::size_t read_depth() const;
    std::size_t write_depth() const;
    // The read-ahead memory a step that reads ahead takes
    // (OptimizerOptions::readahead resolved to whole chunks; 0 when there is
    // none), and the bytes a step's update
    // reads of the master weights and moments from their files.
    std::uint64_t readahead_bytes() const;
    std::uint64_t update_read_bytes() const;
    // The gradients' scratch (the optimizer state on NVMe): its bytes, and
    // whether memory holds it (else rank<R>/grad.bin); 0 and false when the
    // gradients live with a state held in memory.
    // With a second scratch (update_under_backward), the bytes of both.
    std::uint64_t gradient_scratch_bytes() const;
    bool gradient_scratch_in_memory() const;
    // Pipelined, with a second gradient scratch on every rank: the next
    // step's gradients may be handed over while an update runs, which is
    // settled after that backward (OptimizerOptions::pipeline).
    bool update_under_backward() const;
    // The update under way is to be settled after the next backward, not
    // before it: a second scratch, and the step was clipped (the next one
    // would not speculate anyway). After an unclipped step the update is
    // settled before the next backward, which then speculates as without
    // the pipeline. The same on every rank (the norm is global).
    bool settle_after_backward() const;
    // The device memory the optimizer takes from `opts.device`'s arena when
    // it opens m for `rank` (its gpu-tier state and the gradients' copy on
    // the device); 0 when its update runs on the host. The engine counts it
    // in its budget before the optimizer opens.
    static std::uint64_t device_bytes(const shard::Manifest& m, unsigned rank, const OptimizerOptions& opts);
    bool updates_on_device() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// This rank's committed working parameters, read only: what the engine
// fetches when no optimizer runs. The manifest's param records of the rank
// are the source: on nvme their files, opened read-only, each read checked
// against the record's xxh3 by the engine; on gpu and cpu every partition
// read once into page-locked memory the pool pins (PinnedPool::pin) and
// checked here (DataError naming tensor, rank, file and offset). Nothing is
// written. put_gradient refuses (InternalError): a pass with gradients needs
// the Optimizer.
class CommittedParams : public ParamStore {
public:
    CommittedParams(const shard::Manifest& m, unsigned rank, io::Engine& engine, mem::PinnedPool& pool);
    ~CommittedParams() override;
    ParamSource param_source(std::size_t tensor) override;
    void put_gradient(std::size_t tensor, std::span<const float> grad) override;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// The engine's side of the model (paper §7): the model calls a ParamEngine's
// hooks around every module's forward and backward and asks it for each
// parameter's values and gradient inside them; the engine decides where the
// parameters live and when they move. A model author writes no data movement.
//
// Hooks, in order, for a module M: before_forward(M), its children's hooks,
// after_forward(M); then in backward before_backward(M) ... after_backward(M).
// Hooks run when work is queued, not when it runs: an engine orders device
// work with events and releases a buffer on an event, never at the hook.

// What an engine sees of a module: its name, the parameters it declared and
// the ones of other modules it uses (the tied embedding in the output head).
// Parameters are indices into the manifest's tensors.
class Module {
public:
    explicit Module(std::string name) : name_(std::move(name)) {}
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    const std::string& name() const { return name_; }
    std::span<const std::size_t> params() const { return own_; }         // declared here
    std::span<const std::size_t> external() const { return external_; }  // other modules', used here
    bool uses(std::size_t param) const;

protected:
    void add_param(std::size_t param) { own_.push_back(param); }
    void use_external(std::size_t param) { external_.push_back(param); }

private:
    std::string name_;
    std::vector<std::size_t> own_, external_;
};

// The parameter engine: where a module finds its parameters and gradients
// (ResidentEngine, InfinityEngine). Not io::Engine, which moves bytes
// between files and memory for it.
class ParamEngine {
public:
    virtual ~ParamEngine() = default;
    virtual void before_forward(const Module&) {}
    virtual void after_forward(const Module&) {}
    virtual void before_backward(const Module&) {}
    virtual void after_backward(const Module&) {}

    // Device memory, valid inside the module's hooks: the values (numel
    // fp32), and the gradient the backward adds to (numel fp32). Both refuse
    // (InternalError) a parameter the module neither declared nor uses.
    std::span<const float> weight(const Module& m, std::size_t param);
    std::span<float> grad(const Module& m, std::size_t param);
    // The values as the engine stores them (a device::ConstView): bf16 where
    // it keeps the parameter bf16 (InfinityOptions::bf16_weights), else
    // weight()'s fp32. weight() of a parameter kept bf16 is an InternalError:
    // a kernel reads it through a ConstView (gemm, embedding_forward).
    device::ConstView stored(const Module& m, std::size_t param);

protected:
    virtual std::span<const float> weight_of(const Module& m, std::size_t param) = 0;
    virtual std::span<float> grad_of(const Module& m, std::size_t param) = 0;
    // Empty where the parameter is not kept bf16 (then weight_of's fp32).
    virtual std::span<const std::uint16_t> weight_bf16_of(const Module&, std::size_t) { return {}; }
};

// The reference engine: every parameter and its gradient resident in device
// memory, one Array each for all values and all gradients (fp32). Records
// the hooks it sees when tracing. The trainer loads it and refreshes it
// after each step through copies (--resident).
//
// A parameter marked in `bf16` keeps its working values bf16 instead
// (--precision bf16 over bf16 parameters, InfinityOptions::bf16_weights's
// rule: the matrices and embedding tables), in a second Array of their own,
// read through stored() as bf16 by the GEMMs and the embedding, never
// widened or staged; values() of it is an InternalError. Gradients stay fp32
// for every parameter, laid out as without `bf16`.
class ResidentEngine : public ParamEngine {
public:
    ResidentEngine(device::Device& dev, std::span<const std::uint64_t> numels, const std::vector<bool>& bf16 = {});

    std::span<float> values(std::size_t param);   // device memory, fp32 (InternalError when kept bf16)
    std::span<std::uint16_t> values_bf16(std::size_t param);  // device memory; empty unless kept bf16
    bool kept_bf16(std::size_t param) const { return bf16_offsets_.at(param) != kNone; }
    std::span<float> gradient(std::size_t param); // device memory
    // Every fp32 value (the parameters not kept bf16), every gradient.
    std::span<float> all_values() { return values_.span(); }
    std::span<float> all_gradients() { return grads_.span(); }
    std::uint64_t offset(std::size_t param) const { return offsets_[param]; }  // elements, into all_gradients()
    void zero_grad(device::Stream& s);

    struct Hook {
        enum Kind { before_forward, after_forward, before_backward, after_backward } kind;
        std::string module;
    };
    bool tracing = false;
    std::vector<Hook> trace;

    void before_forward(const Module& m) override;
    void after_forward(const Module& m) override;
    void before_backward(const Module& m) override;
    void after_backward(const Module& m) override;

protected:
    std::span<const float> weight_of(const Module&, std::size_t param) override { return values(param); }
    std::span<float> grad_of(const Module&, std::size_t param) override { return gradient(param); }
    std::span<const std::uint16_t> weight_bf16_of(const Module&, std::size_t param) override {
        return values_bf16(param);
    }

private:
    static constexpr std::uint64_t kNone = ~std::uint64_t{0};
    device::Device& dev_;
    // offsets_: every parameter's, into the gradients; f32_offsets_ and
    // bf16_offsets_ into values_ and values_bf16_, kNone where it is kept
    // in the other.
    std::vector<std::uint64_t> offsets_, sizes_, f32_offsets_, bf16_offsets_;
    device::Array<float> values_, grads_;
    device::Array<std::uint16_t> values_bf16_;
};

// ---------------------------------------------------------------------------
// The ZeRO-Infinity engine (paper §5-6). Each rank holds only its partition
// of every parameter, in the manifest's param tier (gpu: the device arena;
// cpu: the optimizer's page-locked memory; nvme: the param file). Before a
// module runs, its parameters are fetched through the pipeline
//   nc  NVMe -> pinned pool leases (io engine; a partition larger than a
//       buffer spans several leases; the partition's bytes, hashed across
//       them, are checked against its xxh3), read ahead of gg along the trace
//   cg  pinned -> device (the h2d stream)
//   gg  allgather of the partitions into a full fp32 working buffer (the
//       collectives stream; bf16 gathered as bf16, widened on the device,
//       or with bf16_weights kept bf16 where two-dimensional)
// each stage ordered after the one before by device events, compute after
// gg. After the module's forward or backward its buffers are released on
// an event, except parameters under `persist_below` elements and those
// several modules use (`persist_shared`), which stay gathered for the step.
// A module's gradients are reduce-scattered on the collectives stream as its
// backward ends, and this rank's partition is copied out (d2h) and handed to
// the optimizer on that stream's thread, a bounded number in flight.
//
// The first pass of each kind (a training step, an evaluation) records the
// order of modules; later passes replay it, fetching ahead while the bytes
// in flight stay under `prefetch_bytes`. A module out of order stops the
// prefetch for the rest of the pass (fetched on demand, warned once) and
// the trace is recorded again.
//
// Device memory: what the activations leave of the arena is the engine's:
// the persistent parameters and the gradients of parameters used by more
// than one module (the tied wte, kept whole through backward) are reserved
// up front; the rest is a ring each fetch takes one place in, at the lowest
// address clear of live buffers. A fetch whose place overlaps a released
// buffer waits for that buffer's release event on the device (the host
// waits only where the buffer's gradients are still going to the optimizer,
// whose NVMe stream shares the pinned pool with the fetches).
struct InfinityOptions {
    std::uint64_t prefetch_bytes = 64 * MiB;  // device bytes fetched ahead of compute (0: on demand only)
    std::uint64_t persist_below = 0;          // parameters of fewer elements stay gathered (0: none)
    // A parameter several modules use (the tied wte: the embedding's first
    // and last, the head's in between) stays gathered for the step instead of
    // being fetched at each use: one fetch where there would be three.
    bool persist_shared = true;
    // The communicator of the engine's collectives over device buffers (the
    // allgather of a fetch, the reduce-scatter of a module's gradients) at
    // dp > 1. One that orders collectives on device streams (nccl) has them
    // enqueued on the device's collectives stream, the host never waiting;
    // otherwise they run as host jobs on that stream, which needs device
    // memory the host can address (the cpu backend). Null: the engine's
    // `comm`, which also serves every host-side collective (the optimizer's).
    comm::Communicator* device_comm = nullptr;
    // Keep the working parameters bf16 on the device (zinf-train --precision
    // bf16 over a manifest whose parameters are bf16): every parameter of
    // two or more dimensions (the matrices a GEMM multiplies by, the
    // embedding tables) is gathered into and held as bf16, half the bytes of
    // the fp32 it is otherwise widened to, and read through stored(); the
    // one-dimensional ones (LayerNorm, RMSNorm, biases) are still widened to
    // fp32. Ignored over fp32 parameters, which are their own master.
    bool bf16_weights = false;
    // That rule for tensor `t` of `m` (both engines keep what it says).
    bool keeps_bf16(const shard::Manifest& m, std::size_t t) const {
        return bf16_weights && m.opts.param_dtype == shard::DType::bf16 && m.tensors[t].shape.size() >= 2;
    }
};

struct InfinityStats {
    // Bytes of this rank's partitions read, by the tier they came from
    // (gpu, cpu, nvme), and bytes the allgathers delivered.
    std::uint64_t fetched_bytes[3] = {};
    std::uint64_t gathered_bytes = 0;
    std::uint64_t fetches = 0, prefetched = 0, on_demand = 0, reused = 0;
    std::uint64_t read_ahead = 0;      // partitions the nc stage read ahead of their fetch
    std::uint64_t grad_bytes = 0;      // this rank's gradient partitions handed to the optimizer
    // Collectives the engine started: allgathers of parameters and
    // reduce-scatters of gradients (0 at dp 1).
    std::uint64_t collectives = 0;
    double stall_seconds = 0;          // compute waiting for parameters
    // The d2h stream waiting for a free buffer of the gradients' staging
    // ring (every one still on its way to the optimizer): the hand-over's
    // stall.
    double staging_wait_seconds = 0;
    std::uint64_t device_peak = 0;     // the arena's peak use (bytes)
    bool diverged = false;             // a module ran out of trace order
};

// A module whose fetch does not fit the device budget (before the first
// step): exit 64, as a budget too small for the job is (mem::OutOfMemory).
class DoesNotFit : public Error {
public:
    DoesNotFit(const std::string& msg, std::string module_, std::uint64_t need_, std::uint64_t have_)
        : Error(msg), module(std::move(module_)), need(need_), have(have_) {}
    int exit_code() const noexcept override { return exit_code::usage; }
    std::string module;
    std::uint64_t need = 0, have = 0;
};

class InfinityEngine : public ParamEngine, private ParamListener {
public:
    // `modules`: every module of the model that uses a parameter, each once.
    // Reserves its device memory now (after the activations were planned)
    // and refuses (DoesNotFit, 64) when the largest module's fetch does not
    // fit what is left. The store (the optimizer when training) must outlive
    // the engine, which listens to it for the updated parameters.
    InfinityEngine(const shard::Manifest& m, std::span<const Module* const> modules, comm::Communicator& comm,
                   io::Engine& io, mem::PinnedPool& pool, device::Device& dev, ParamStore& store,
                   const InfinityOptions& opts);
    ~InfinityEngine() override;

    // What the engine needs of the device budget at the least, beside the
    // activations (reserved memory plus the largest module's fetch), and
    // which module that is. Static: for refusals and zinf-plan alike.
    // `flat`: the area in which opts.device_comm lays its buckets flat (NCCL;
    // 0 for every other communicator and at dp 1), as large as the largest
    // bucket of the run needs: a module's parameters (all it gathers, its
    // persistent ones included) or its gradients; `flat_module` is that
    // module, and `flat_gradients` whether it is its gradients.
    struct Need {
        std::uint64_t reserved = 0, largest = 0, flat = 0;
        // The fetches (with gradients) of the modules nested in one numbered
        // block ("h.3"), the largest: what a checkpointed block's forward run
        // again in backward keeps for the block's backward at the most,
        // where the device memory left holds it (not counted in total()).
        std::uint64_t block = 0;
        std::string module, flat_module;
        bool flat_gradients = false;
        std::uint64_t total() const { return reserved + flat + largest; }
        // "the 2MiB NCCL lays h.0.mlp.c_fc's gradients flat in"; empty without one.
        std::string flat_what() const;
    };
    static Need need(const shard::Manifest& m, std::span<const Module* const> modules,
                     const InfinityOptions& opts);
    // Need::flat for NCCL at `dp` (comm::laid_flat_bytes), from the modules
    // and every tensor's numel alone: what zinf-plan adds to a device's need
    // before there is a manifest or a communicator. 0 at dp 1.
    static std::uint64_t nccl_flat_bytes(std::span<const Module* const> modules,
                                         std::span<const std::uint64_t> numels, unsigned dp,
                                         shard::DType param_dtype);

    // A pass: a training step's forward and backward (gradients handed to the
    // optimizer) or an evaluation's forward. end() waits for every stage and
    // throws what one of them threw (IoError 74 naming file and offset,
    // DataError 65 for a checksum); the gradients are all handed over when
    // it returns. After a failure, reset() before anything else.
    void begin(bool train);
    void end();
    void reset() noexcept;
    // The optimizer's step changed the parameters: a gpu-tier partition is
    // refreshed by `on_param` (the engine listens to its store for it:
    // ParamStore::listen), and persistent ones are gathered again in the
    // next pass. on_param may be called from another thread than the hooks
    // (the optimizer's, during backward when its update overlaps it); it
    // copies `values` and returns without waiting for the device: the copy
    // to the device goes on the h2d stream after the gathers already asked
    // to read the old values, and the next gather of the parameter waits
    // for it.
    void on_param(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values);
    void after_step();

    InfinityStats stats() const;  // of the last pass
    std::vector<std::string> trace(bool train) const;  // module names in recorded order

    void before_forward(const Module& m) override;
    void after_forward(const Module& m) override;
    void before_backward(const Module& m) override;
    void after_backward(const Module& m) override;

    struct Impl;

protected:
    std::span<const float> weight_of(const Module& m, std::size_t param) override;
    std::span<float> grad_of(const Module& m, std::size_t param) override;
    std::span<const std::uint16_t> weight_bf16_of(const Module& m, std::size_t param) override;

private:
    void updated(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values) override {
        on_param(tensor, first, values);
    }
    // The device's AdamW wrote them: copied on the device, in `s`'s order.
    void updated_on_device(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values,
                           device::Stream& s) override;
    std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Activation checkpoints off the device (paper §5.1.2): the model hands a
// block's checkpoint to a store after the block's forward and takes it back
// one block ahead of the block's backward; the store decides where it
// waits. save() copies checkpoint j out on the d2h stream once the compute
// stream has made it; load() brings it back on the h2d stream once the
// compute stream is done with the buffer it lands in; the compute stream
// waits for either with wait_saved / wait_loaded.
enum class Offload { none, cpu, nvme };
const char* offload_name(Offload o);
Offload parse_offload(std::string_view text);  // UsageError

class ActivationStore {
public:
    // `count` checkpoints of `bytes_each` bytes in page-locked host memory
    // (cpu) or in a scratch file at `path` on NVMe (nvme; removed when the
    // store goes), device to disk through one page-locked staging buffer
    // per direction, which the streams keep in order. The page-locked
    // memory comes from `pool` (PinnedPool::pin: registered with CUDA and
    // the io engine), which must outlive the store, as must `io`.
    static std::unique_ptr<ActivationStore> open(Offload kind, std::uint64_t count, std::uint64_t bytes_each,
                                                 mem::PinnedPool& pool, io::Engine* io = nullptr,
                                                 std::string path = {});
    virtual ~ActivationStore() = default;

    virtual Offload kind() const = 0;
    // src and dst: bytes_each bytes of device memory (fp32 or bf16 elements).
    virtual void save(device::Device& dev, device::Stream& compute, std::uint64_t j,
                      std::span<const std::byte> src) = 0;
    virtual void wait_saved(device::Device& dev, device::Stream& compute, std::uint64_t j) = 0;
    virtual void load(device::Device& dev, device::Stream& compute, std::uint64_t j, std::span<std::byte> dst) = 0;
    virtual void wait_loaded(device::Device& dev, device::Stream& compute, std::uint64_t j) = 0;
    virtual std::uint64_t bytes_out() const = 0;  // since construction
    virtual std::uint64_t bytes_in() const = 0;
};

// ---------------------------------------------------------------------------
// One owner of a run's engine: the parameter engine the model's hooks reach
// (ZeRO-Infinity, or the resident reference), the store it reads parameters
// from and hands gradients to (the optimizer when training, the committed
// parameters when only forward passes run), the refresh of the parameters
// after each update, the activation checkpoints it offloads, and the
// device-memory checks made before anything is written. zinf-train and
// zinf-sample drive it alike, whatever the placement:
//
//   auto e = zero::Engine::open(m, model.modules(), comm, io, pool, dev, opts, plan);
//   model::Context ctx{dev, dev.compute(), e->hooks()};
//   e->begin_step(lr);                  // a training step
//   model.forward(ctx, acts); model.backward(ctx, acts);
//   e->end();                           // the backward's gradients all handed over
//   const zero::StepReport r = e->step();  // the update; the next pass reads its parameters
//
// and for a pass of forward only (an evaluation, a sampled token):
// begin_forward(), the forward, end(). After a failure anywhere in a pass,
// reset() before anything else; the step is then not taken.
//
// The step's phases are the engine's: what overlaps what (today the
// optimizer's update with the backward, the fetches with compute) is
// decided inside it, so that callers never change when it does.
struct EngineOptions {
    // The reference engine instead of ZeRO-Infinity: every parameter and its
    // gradient resident on every rank's device, read whole from the manifest;
    // after the backward one reduce-scatter of every gradient into the
    // rank's partitions, the optimizer, and the new parameters gathered back
    // (plain data parallel).
    bool resident = false;
    InfinityOptions infinity;
    // Forward passes only: every parameter kept gathered on the device after
    // its first fetch when all of them fit the device memory left, else
    // none (infinity.persist_below is set by the engine).
    bool persist_if_fits = false;
    // Training: the optimizer's options; the engine opens the optimizer over
    // the manifest's state. Unset: forward passes only, over the committed
    // parameters (CommittedParams), and nothing is written.
    std::optional<OptimizerOptions> optimizer;
    // The device's GPU, for the communicator of the engine's collectives
    // over device memory that the engine makes itself
    // (comm::device_communicator) at dp > 1 on a device whose memory the
    // host cannot address, when infinity.device_comm does not name one.
    int gpu = -1;
};

// What a training step keeps on the device beside the engine, taken from
// the arena before the engine's working memory (the model's activations),
// and where its checkpoints wait for the backward.
struct ActivationPlan {
    std::uint64_t batch = 0, seq = 0;  // per rank, for messages
    std::uint64_t bytes = 0;           // what take() takes from the arena
    std::function<void()> take;
    // Blocks run their forward again inside the backward (activation
    // checkpointing): each keeps its fetches for its own backward.
    bool recompute = false;
    Offload offload = Offload::none;
    std::uint64_t checkpoints = 0, checkpoint_bytes = 0;  // offloaded, and the bytes of each
    // The engine's need under a layout with tile factor `tile` (zinf-shard
    // layout --tile), with these options: a refusal says which would fit.
    std::function<InfinityEngine::Need(unsigned tile, const InfinityOptions&)> retiled;
};

// What a pass moved: the ZeRO-Infinity engine's figures (zeros with the
// resident engine but device_peak, the arena's), and the activation
// checkpoints read back from and written to NVMe.
struct PassStats : InfinityStats {
    std::uint64_t activation_read_bytes = 0, activation_written_bytes = 0;
};

class Engine {
public:
    // Opens the run's engine over `m` at its committed step (`m` must
    // outlive it: commits update it). In order: the engine's device
    // communicator; for ZeRO-Infinity, the activations checked against the
    // device budget beside the engine's need (DoesNotFit, 64: the budget or
    // the tile factor that would do), taken, their checkpoints' store, the
    // engine's need checked against what is left; then the optimizer, whose
    // state files are prepared for its first step, so that a refused run
    // leaves the state as it was; last the parameter engine, whose memory
    // is the rest of the device budget. The resident engine takes its
    // copies of every parameter and gradient first, then the activations,
    // and reads the parameters in.
    static std::unique_ptr<Engine> open(shard::Manifest& m, std::span<const Module* const> modules,
                                        comm::Communicator& comm, io::Engine& io, mem::PinnedPool& pool,
                                        device::Device& dev, const EngineOptions& opts,
                                        const ActivationPlan& activations = {});
    virtual ~Engine() = default;
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // The hooks the model calls and the parameters and gradients it reads.
    virtual ParamEngine& hooks() = 0;

    // A training step's forward and backward, its update at the learning
    // rate `lr` (the optimizer's; set before the first gradient is handed
    // over); a pass of forward only. end() waits for the engine's stages
    // and throws what one of them threw (IoError 74 naming file and offset,
    // DataError 65 for a checksum); a training step's gradients are all
    // handed over when it returns.
    virtual void begin_step(double lr) = 0;
    virtual void begin_forward() = 0;
    virtual void end() = 0;
    // The update after a step's end(): clipping, the optimizer, the commit
    // where the state streams from NVMe, and the parameters every later
    // pass reads. Not taken (report.overflow) when a gradient was not finite.
    virtual StepReport step() = 0;
    // The pipeline (OptimizerOptions::pipeline): step() returns its report
    // pending while the update runs beside the next pass, which reads each
    // parameter once its new values are written; settle() waits for the
    // rest and commits, on every rank at the same point (collectives), and
    // returns the whole report; nullopt when no update is under way (the
    // sequential step, or settled already).
    virtual std::optional<StepReport> settle() { return std::nullopt; }
    // The optimizer has a second gradient scratch
    // (Optimizer::update_under_backward); and whether the pending update
    // runs on under the next backward (Optimizer::settle_after_backward):
    // callers then settle it after that backward, before step(); else
    // after the next forward, before the backward.
    virtual bool update_under_backward() const { return false; }
    virtual bool settle_after_backward() const { return false; }
    virtual void reset() noexcept = 0;
    // No collective of the engine's runs between a step's forward and its
    // backward (one rank, or the resident engine, whose collectives follow
    // the backward): the loss may be agreed over the ranks in between.
    virtual bool loss_before_backward() const = 0;

    virtual std::uint64_t step_count() const = 0;  // steps committed or taken
    // Commits every state at step_count() into the manifest (training).
    virtual void save() = 0;

    virtual PassStats stats() const = 0;  // of the last pass
    // Module hooks in the recorded order ("h.0.attn forward"); none for the resident engine.
    virtual std::vector<std::string> trace(bool train) const = 0;
    // The device budget the run needs at the least: what the activations
    // and the resident engine took, or the activations and the ZeRO-Infinity
    // engine's reserve and largest fetch.
    virtual std::uint64_t device_need() const = 0;
    // The options as the engine runs them (persist_below decided, its
    // device communicator named).
    virtual const EngineOptions& options() const = 0;
    // Where the activation checkpoints wait (null: on the device).
    virtual std::shared_ptr<ActivationStore> activation_store() const = 0;

protected:
    Engine() = default;
};

// ---------------------------------------------------------------------------
// The disk a training run needs, worked out before step 1 so that a short
// disk is refused at once (73) instead of failing hours later. Per rank, on
// the folder of its state files: every state file in two generations (the
// live copy and the last committed one; a state held in memory is saved
// beside the committed one), the gradient scratch when the optimizer state
// is on NVMe, and activation checkpoints offloaded to NVMe. `present` is
// what those files already hold, so a resumed run asks only for the rest.
// zinf-plan reports the same figure (nvme_bytes_needed).
struct DiskNeedOptions {
    shard::DType grad_dtype = shard::DType::fp32;
    std::uint64_t activation_bytes = 0;  // checkpoints this rank writes to NVMe
    // Pipelined (OptimizerOptions::pipeline): a second gradient scratch
    // file beside the first where memory does not hold them, so twice the
    // scratch.
    bool pipeline = false;
};
struct DiskNeed {
    std::string folder;                   // where the rank's files are
    std::uint64_t states = 0, gradients = 0, activations = 0;
    // Rank 0, when the data directory is on the rank folder's file system:
    // the temporary every commit writes beside the committed manifest.
    std::uint64_t manifest = 0;
    std::uint64_t present = 0;            // already allocated by the files there
    std::optional<std::uint64_t> free;    // the file system's free bytes (none without a data directory)
    std::uint64_t total() const;
    std::uint64_t more() const;           // total() - present: what the run takes from `free`
};
DiskNeed disk_need(const shard::Manifest& m, unsigned rank, const DiskNeedOptions& o = {});
// The same for a layout not made yet (zinf-plan): one rank's need (every
// rank's is the same), nothing present, no free space known.
DiskNeed disk_need(const shard::ModelSpec& spec, const shard::LayoutOptions& lo, const DiskNeedOptions& o = {});
// CreateError (73) with the figures when more() exceeds free.
void check_disk(const DiskNeed& n, unsigned rank);

}  // namespace zinf::zero
