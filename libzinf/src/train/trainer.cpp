// The training step: forward and backward on the device through the
// ZeRO-Infinity engine (or the resident reference engine), the gradients
// averaged over the ranks into each rank's partitions, and the tiered
// optimizer step.
#include <zinf/train.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numbers>
#include <tuple>

namespace zinf::train {

double Schedule::at(std::uint64_t step) const {
    if (warmup && step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
    if (!cosine || total <= warmup) return lr;
    const double progress =
        std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
    const double min_lr = lr * min_ratio;
    return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

struct Trainer::Impl {
    Impl(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p, device::Device& d,
         const Options& o);

    shard::Manifest& m;
    comm::Communicator& comm;
    io::Engine& io;
    mem::PinnedPool& pinned;
    device::Device& dev;
    Options opts;
    unsigned dp = 1, rank = 0;
    std::unique_ptr<model::LanguageModel> model;
    model::LanguageModel& gpt;  // *model
    std::unique_ptr<model::ResidentEngine> resident;  // Options::resident
    model::Activations acts;
    std::uint64_t acts_used = 0;  // of the arena, after planning the activations
    std::unique_ptr<zero::Optimizer> optim;
    std::unique_ptr<zero::InfinityEngine> infinity;   // else
    zero::ParamEngine& engine() { return resident ? static_cast<zero::ParamEngine&>(*resident) : *infinity; }
    shard::DType param_dtype;
    std::size_t pbytes;
    // This rank's partition of each tensor: its averaged gradient (fp32) and
    // its new working parameters (param dtype), per elements each.
    std::vector<std::vector<float>> own_grad;
    std::vector<AlignedBuffer> own_param;
    std::vector<std::uint16_t> staging;  // the largest bf16 tensor, for the gather
    // The collectives' buckets, made once: every tensor in one collective.
    std::vector<zero::Scatter> grad_bucket;
    std::vector<zero::Gather> param_bucket;
    std::vector<std::int32_t> inputs, targets;
    // A batch could not be read on some rank (the token file changed or
    // failed under the run): nothing of that step or evaluation was taken.
    bool input_failed = false;
    std::vector<float> losses;
    io::Bandwidth disk;  // this rank's share of its disk (Options::disk); zeros: no floor

    void measure_disk(const zero::DiskNeed& need);
    void disk_floor(StepLog& log, std::uint64_t acts_in, std::uint64_t acts_out) const;

    // Queued work reads the activations and the host vectors below: it must be
    // done before they go (an error thrown between two enqueues leaves some).
    ~Impl() {
        infinity.reset();  // its streams drained, its device memory back
        // The copy streams too: offloaded checkpoints move on them.
        for (auto k : {device::StreamKind::compute, device::StreamKind::d2h, device::StreamKind::h2d}) try {
                dev.synchronize(dev.stream(k));
            } catch (const std::exception& e) {
                log::warn(std::string("the device's last work failed as the trainer closed: ") + e.what());
            }
    }

    void open_resident(io::Engine& e, mem::PinnedPool& p);
    void open_infinity(io::Engine& e, mem::PinnedPool& p);
    void open_store(io::Engine& e, mem::PinnedPool& p);
    // The activations' shape: the batch, checkpointing, where the
    // checkpoints wait, and the precision of the checkpoints and of what a
    // block keeps, the arithmetic's (bf16 arithmetic keeps them bf16).
    model::Shape shape() const {
        return {.batch = opts.batch, .seq = opts.seq, .checkpoint = opts.checkpoint,
                .offload = opts.offload_activations, .checkpoints = opts.precision, .activations = opts.precision};
    }
    void open_optimizer(io::Engine& e, mem::PinnedPool& p, zero::OptimizerOptions zo, std::uint64_t device_more);
    void load_weights(io::Engine& e, mem::PinnedPool& p);
    void install(std::size_t t, std::span<const std::byte> full);  // param dtype -> device fp32
    double mean_loss();
    void resident_update(StepLog& log);
    void load_batch(const data::Loader& l, std::uint64_t index);
};

namespace {

model::Config config_of(const shard::Manifest& m) { return model::Config::from(m.spec, m.opts.tile); }

}  // namespace

Trainer::Impl::Impl(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p, device::Device& d,
                    const Options& o)
    : m(m_),
      comm(c),
      io(e),
      pinned(p),
      dev(d),
      opts(o),
      dp(m_.opts.dp),
      rank(static_cast<unsigned>(c.rank())),
      model(model::make_model(config_of(m_))),
      gpt(*model),
      param_dtype(m_.opts.param_dtype),
      pbytes(shard::dtype_bytes(m_.opts.param_dtype)) {
    if (!m.opts.train)
        throw DataError("manifest " + o.manifest_path +
                        ": laid out for inference (no optimizer state); lay it out without --inference to train");
    if (static_cast<unsigned>(comm.size()) != dp)
        throw UsageError("manifest " + o.manifest_path + " is laid out for dp " + std::to_string(dp) + ", but " +
                         std::to_string(comm.size()) + " ranks are running (reshard it with zinf-shard reshard)");
    gpt.params_table().check(m, o.manifest_path);
    // bf16 arithmetic keeps bf16 working parameters bf16 on the device.
    opts.infinity.bf16_weights = opts.precision == device::Precision::bf16;
    // The disk the run will need, before anything is written: every rank
    // checks its own folder, and one rank's shortage is every rank's 73.
    // First its files: none may lead out of the data directory (or out of
    // the rank's node-local folder, which must be the one init made).
    {
        std::exception_ptr short_disk;
        try {
            shard::check_paths(m, {rank});
            zero::DiskNeedOptions dn;
            if (opts.offload_activations == model::Offload::nvme)
                dn.activation_bytes = model::offload_bytes(gpt.config(), opts.batch, opts.seq, opts.precision);
            const zero::DiskNeed need = zero::disk_need(m, rank, dn);
            zero::check_disk(need, rank);
            measure_disk(need);
        } catch (...) {
            short_disk = std::current_exception();
        }
        comm::agree(comm, short_disk, "the run did not start; nothing was written");
    }
    if (opts.resident) open_resident(e, p);
    else open_infinity(e, p);
    inputs.resize(o.batch * o.seq);
    targets.resize(o.batch * o.seq);
    losses.resize(o.batch * o.seq);
}

// The bandwidth of this rank's share of its disk, for runs that use one:
// given (shared out over the node's ranks), or probed in the rank's folder
// by every rank at once, in what the run leaves of the free space (none
// left: no floor). The probe's I/O errors are the run's, as any other
// file's: the disk the run is about to use failed.
void Trainer::Impl::measure_disk(const zero::DiskNeed& need) {
    const bool on_disk = m.opts.param_tier == shard::Tier::nvme || m.opts.optim_tier == shard::Tier::nvme ||
                         opts.offload_activations == model::Offload::nvme;
    if (!on_disk) return;
    const double ranks = std::max(1, comm.local_size());
    if (opts.disk.read_bps > 0 && opts.disk.write_bps > 0) {
        disk = {opts.disk.read_bps / ranks, opts.disk.write_bps / ranks};
        return;
    }
    if (!opts.disk_probe_bytes) return;
    std::uint64_t bytes = opts.disk_probe_bytes;
    if (need.free) bytes = std::min(bytes, *need.free > need.more() ? (*need.free - need.more()) / 2 : 0);
    if (bytes < 16 * MiB) {
        log::info("disk: too little free space beside the run's files for a probe; the steps report no disk floor");
        return;
    }
    disk = io::probe_bandwidth(io, need.folder, bytes);
    if (rank == 0)
        log::info("disk: " + need.folder + " reads " + std::to_string(disk.read_bps / 1e9).substr(0, 5) +
                  " GB/s and writes " + std::to_string(disk.write_bps / 1e9).substr(0, 5) + " GB/s per rank (a " +
                  format_size(bytes) + " probe; zinf-nvmebench --best as --config gives a sweep's)");
}

// The step's disk bytes and the least time they take (StepLog).
void Trainer::Impl::disk_floor(StepLog& log, std::uint64_t acts_in, std::uint64_t acts_out) const {
    log.activation_read_bytes = acts_in;
    log.activation_written_bytes = acts_out;
    log.disk_read_bytes = log.fetched_bytes[2] + log.optimizer_read_bytes - log.grad_scratch_read_bytes + acts_in;
    log.disk_written_bytes = log.optimizer_written_bytes - log.grad_scratch_written_bytes + acts_out;
    log.disk_read_bps = disk.read_bps;
    log.disk_write_bps = disk.write_bps;
    if (!(disk.read_bps > 0 && disk.write_bps > 0)) return;
    log.disk_floor_seconds = static_cast<double>(log.disk_read_bytes) / disk.read_bps +
                             static_cast<double>(log.disk_written_bytes) / disk.write_bps;
    if (log.disk_floor_seconds > 0) log.disk_floor_ratio = log.seconds / log.disk_floor_seconds;
}

static zero::OptimizerOptions optimizer_options(const Options& opts) {
    zero::OptimizerOptions zo;
    zo.adamw = opts.adamw;
    zo.adamw.lr = opts.schedule.at(1);
    zo.grad_clip = opts.grad_clip;
    zo.kernel = opts.kernel;
    zo.manifest_path = opts.manifest_path;
    zo.overlap = opts.overlap;
    zo.readahead = opts.optimizer_readahead;
    return zo;
}

// The optimizer opened: its read-ahead said once. A default budget leaves
// room for what a host-memory device (the cpu backend, whose pages are
// taken as used) will still touch: `device_more` bytes. The disk's
// bandwidths set the floor only, not the update's depths
// (OptimizerOptions::disk): the deeper read/write split they would give,
// in smaller pieces, was measured no faster than the default 3 slots
// (BENCHMARKS.md, issue 28); zinf-optbench --config measures it still.
void Trainer::Impl::open_optimizer(io::Engine& e, mem::PinnedPool& p, zero::OptimizerOptions zo,
                                   std::uint64_t device_more) {
    if (!dev.arena().on_gpu()) zo.readahead_reserve = device_more;
    optim = std::make_unique<zero::Optimizer>(m, comm, e, p, zo);
    const std::uint64_t state = optim->update_read_bytes(), ra = optim->readahead_bytes();
    if (rank == 0 && optim->gradient_scratch_bytes() > 0)
        log::info("optimizer: the gradients' scratch (" + format_size(optim->gradient_scratch_bytes()) + ") " +
                  (optim->gradient_scratch_in_memory()
                       ? std::string("in memory")
                       : "in a file beside the state: --optimizer-readahead " +
                             (zo.readahead == zero::OptimizerOptions::kReadaheadAuto ? std::string("(free memory)")
                                                                                     : format_size(zo.readahead)) +
                             " does not hold it"));
    if (rank != 0 || state == 0) return;
    log::info("optimizer: the update reads " + std::to_string(optim->read_depth()) + " chunk(s) ahead and writes " +
              std::to_string(optim->write_depth()) + " behind, pieces of " + format_size(optim->chunk_bytes()));
    if (zo.readahead == 0)
        log::info("optimizer: no read-ahead (--optimizer-readahead 0): a step after a clipped one reads its " +
                  format_size(state) + " of master weights and moments after backward");
    else
        log::info("optimizer: a step after a clipped one reads " + format_size(ra) + " of the " + format_size(state) +
                  " of master weights and moments it updates during backward (--optimizer-readahead " +
                  (zo.readahead == zero::OptimizerOptions::kReadaheadAuto ? "from free memory" : format_size(zo.readahead)) +
                  ")");
}

// The reference: every rank reads every tensor whole into its resident copy.
void Trainer::Impl::open_resident(io::Engine& e, mem::PinnedPool& p) {
    resident = std::make_unique<model::ResidentEngine>(dev, model::numels(gpt.params_table()));
    acts = gpt.plan(dev, shape());
    acts_used = dev.arena().stats().used;
    open_store(e, p);
    load_weights(e, p);
    own_grad.resize(m.tensors.size());
    own_param.resize(m.tensors.size());
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t per = m.elements_per_rank(m.tensors[t]);
        own_grad[t].assign(per, 0.0f);
        own_param[t] = AlignedBuffer::allocate(std::max<std::size_t>(per * pbytes, 1), 64);
    }
    zero::OptimizerOptions zo = optimizer_options(opts);
    zo.on_param = [this](std::size_t t, std::uint64_t first, std::span<const std::byte> v) {
        std::memcpy(own_param[t].data() + first * pbytes, v.data(), v.size());
    };
    open_optimizer(e, p, zo, dev.arena().stats().used);
    if (dp > 1 && !dev.host_addressable())
        throw UsageError("--resident at dp > 1 runs its collectives over device memory, which this device does not "
                         "allow; use the ZeRO-Infinity engine");
    std::uint64_t largest = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t n = m.tensors[t].numel;
        largest = std::max(largest, n);
        grad_bucket.push_back(
            {std::as_bytes(resident->gradient(t)), std::as_writable_bytes(std::span(own_grad[t])), n});
        param_bucket.push_back({own_param[t].bytes(), std::as_writable_bytes(resident->values(t)), n});
    }
    staging.resize(largest);
}

// Where offloaded activation checkpoints go: page-locked host memory, or a
// scratch file in the rank's folder beside its state.
void Trainer::Impl::open_store(io::Engine& e, mem::PinnedPool& p) {
    const model::Offload o = opts.offload_activations;
    if (o == model::Offload::none) return;
    const std::uint64_t n = model::offloaded_checkpoints(gpt.config());
    const std::uint64_t bytes = model::checkpoint_bytes(gpt.config(), opts.batch, opts.seq, opts.precision);
    std::string path;
    if (o == model::Offload::nvme) path = zero::disk_need(m, rank).folder + "/activations.bin";
    acts.store = std::make_shared<model::ActivationStore>(o, n, bytes, p, &e, path);
}

// The engine: activations first, then what the engine keeps for the run,
// then its working memory from what is left. A budget too small for the
// largest module is refused now, with the tile factor that would fit.
void Trainer::Impl::open_infinity(io::Engine& e, mem::PinnedPool& p) {
    const model::Shape shape = this->shape();
    const std::uint64_t budget = dev.arena().stats().bytes, acts_need = gpt.plan_bytes(shape);
    if (acts_need > budget) {
        const auto n = zero::InfinityEngine::need(m, gpt.modules(), opts.infinity);
        throw zero::DoesNotFit("the activations of a batch of " + std::to_string(opts.batch) + " x " +
                                   std::to_string(opts.seq) + " need " + format_size(acts_need) +
                                   ", more than the device budget of " + format_size(budget) +
                                   "; with the engine's " + format_size(n.total()) + " (its largest module, " +
                                   n.module + ", needs " + format_size(n.largest) +
                                   ") the run needs a device budget of at least " +
                                   std::to_string(acts_need + n.total()) + " bytes (" +
                                   format_size(acts_need + n.total()) + "; --device-memory, or a smaller --batch)",
                               "activations", acts_need + n.total(), budget);
    }
    acts = gpt.plan(dev, shape);
    acts_used = dev.arena().stats().used;
    open_store(e, p);
    // The budget checked before the optimizer opens (it prepares the files
    // its first step writes): a refused run leaves the state as it was.
    const auto n = zero::InfinityEngine::need(m, gpt.modules(), opts.infinity);
    const std::uint64_t left = dev.arena().stats().largest_free;
    if (n.total() > left) {
        std::string msg = n.module + " needs " + format_size(n.largest) + " of device memory for its parameters and " +
                          "their gradients, beside " + format_size(n.reserved + n.flat) +
                          " the engine keeps for the whole run (parameters on the gpu tier, persistent ones, the "
                          "tied embedding's gradient" + (n.flat ? ", " + n.flat_what() : std::string()) +
                          "); the device budget has " + format_size(left) +
                          " left after the activations (" + format_size(acts_used) +
                          "). The run needs a device budget of at least " + std::to_string(acts_used + n.total()) +
                          " bytes (" + format_size(acts_used + n.total()) + "; --device-memory, now " +
                          format_size(budget) + ")";
        for (unsigned k = std::max(2u, m.opts.tile * 2); k <= 64; k *= 2) {
            shard::LayoutOptions lo = m.opts;
            lo.tile = k;
            const shard::Manifest mk = shard::layout(m.spec, lo);
            const auto gk = model::make_model(model::Config::from(m.spec, k));
            const auto nk = zero::InfinityEngine::need(mk, gk->modules(), opts.infinity);
            if (nk.total() <= left) {
                msg += ", or a layout with --tile " + std::to_string(k) + " (zinf-shard layout --tile " +
                       std::to_string(k) + "; its largest module, " + nk.module + ", needs " +
                       format_size(nk.largest) + ")";
                break;
            }
        }
        throw zero::DoesNotFit(msg, n.module, acts_used + n.total(), budget);
    }
    zero::OptimizerOptions zo = optimizer_options(opts);
    zo.on_param = [this](std::size_t t, std::uint64_t first, std::span<const std::byte> v) {
        if (infinity) infinity->on_param(t, first, v);
    };
    // What this device's memory may hold at most beside the activations: the
    // engine's reserve and largest fetch, the fetches ahead, and a
    // checkpointed block's fetches kept for its backward.
    const std::uint64_t kept = opts.checkpoint && opts.infinity.prefetch_bytes ? n.block : 0;
    open_optimizer(e, p, zo, acts_used + n.total() + opts.infinity.prefetch_bytes + kept);
    infinity = std::make_unique<zero::InfinityEngine>(m, gpt.modules(), comm, e, p, dev, *optim, opts.infinity);
}

// Through a copy: device memory is not the host's to write.
void Trainer::Impl::install(std::size_t t, std::span<const std::byte> full) {
    auto dst = resident->values(t);
    auto& s = dev.stream(device::StreamKind::h2d);
    if (param_dtype == shard::DType::fp32) {
        dev.copy(s, std::as_writable_bytes(dst), full.first(dst.size_bytes()));
        dev.synchronize(s);
        return;
    }
    std::vector<float> wide(dst.size());
    const auto* src = reinterpret_cast<const std::uint16_t*>(full.data());
    from_bf16(std::span(src, wide.size()), std::span(wide));
    dev.copy(s, std::as_writable_bytes(dst), std::as_bytes(std::span(wide)));
    dev.synchronize(s);
}

// Every rank reads every tensor whole (the resident engine keeps them all):
// the working parameters the manifest names, at its committed step.
void Trainer::Impl::load_weights(io::Engine& e, mem::PinnedPool& p) {
    std::vector<std::byte> full;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        full.clear();
        full.reserve(m.tensors[t].numel * pbytes);
        shard::cat(m, t, "param", e, p, [&](std::span<const std::byte> piece) {
            full.insert(full.end(), piece.begin(), piece.end());
        });
        if (full.size() != m.tensors[t].numel * pbytes)
            throw DataError("manifest " + opts.manifest_path + ": tensor " + m.tensors[t].name + " gave " +
                            std::to_string(full.size()) + " bytes of parameters, expected " +
                            std::to_string(m.tensors[t].numel * pbytes));
        install(t, full);
    }
}

double Trainer::Impl::mean_loss() {
    double sum = 0;  // in order, in double: the same bits every run
    for (float l : losses) sum += l;
    double mean = sum / static_cast<double>(losses.size());
    if (dp > 1)
        comm.allreduce(std::as_bytes(std::span(&mean, 1)), std::as_writable_bytes(std::span(&mean, 1)),
                       comm::DType::f64, comm::Reduce::avg);
    return mean;
}

void Trainer::Impl::load_batch(const data::Loader& l, std::uint64_t index) {
    // The tokens first, agreed by every rank before anything of the step
    // runs: a rank whose read failed must not leave the others waiting in a
    // collective, and run() commits the steps taken (input_failed).
    std::exception_ptr unread;
    try {
        l.batch(index, inputs, targets);
    } catch (const Error&) {
        unread = std::current_exception();
    }
    if (unread || comm.size() > 1) try {
            comm::agree(comm, unread, "its batch could not be read; nothing of this step was taken");
        } catch (...) {
            input_failed = true;
            throw;
        }
    auto& s = dev.compute();
    dev.copy(s, std::as_writable_bytes(acts.inputs.span()), std::as_bytes(std::span(inputs)));
    dev.copy(s, std::as_writable_bytes(acts.targets.span()), std::as_bytes(std::span(targets)));
}

Trainer::Trainer(shard::Manifest& m, comm::Communicator& comm, io::Engine& engine, mem::PinnedPool& pool,
                 device::Device& dev, const Options& opts)
    : impl_(std::make_unique<Impl>(m, comm, engine, pool, dev, opts)) {}

Trainer::~Trainer() = default;

std::uint64_t Trainer::step_count() const { return impl_->optim->step_count(); }
bool Trainer::input_failed() const { return impl_->input_failed; }
model::LanguageModel& Trainer::model() { return impl_->gpt; }
model::ResidentEngine& Trainer::resident_engine() {
    if (!impl_->resident) throw InternalError("Trainer::resident_engine(): the trainer runs the ZeRO-Infinity engine");
    return *impl_->resident;
}
zero::InfinityEngine* Trainer::infinity() { return impl_->infinity.get(); }
const Options& Trainer::options() const { return impl_->opts; }
model::Activations& Trainer::activations() { return impl_->acts; }
double Trainer::flops_per_step() const { return impl_->gpt.flops_per_step(impl_->opts.batch, impl_->opts.seq); }
void Trainer::save() { impl_->optim->save(); }
const shard::Manifest& Trainer::manifest() const { return impl_->m; }

std::optional<std::string> Trainer::rollback(const shard::Manifest& to) {
    Impl& I = *impl_;
    // This rank's partitions that the rollback would name again: each must
    // still hold what `to` says (the generation the steps since did not
    // write); every rank checks its own, all agree.
    std::exception_ptr failed;
    try {
        shard::Manifest check = to;
        check.parts.clear();
        std::map<std::tuple<std::size_t, unsigned, std::string>, const shard::Partition*> now;
        for (const auto& p : I.m.parts) now[{p.tensor, p.rank, p.state}] = &p;
        for (const auto& p : to.parts) {
            if (p.rank != I.rank) continue;
            const auto it = now.find({p.tensor, p.rank, p.state});
            if (it == now.end() || it->second->file != p.file || it->second->xxh3 != p.xxh3) check.parts.push_back(p);
        }
        shard::RunOptions ro;
        ro.ranks = {I.rank};
        ro.lock = false;  // the run holds the state's lock
        if (!check.parts.empty()) (void)shard::verify(check, I.io, I.pinned, ro);
    } catch (const Error&) {
        failed = std::current_exception();
    }
    try {
        comm::agree(I.comm, failed, "not rolled back");
    } catch (const Error& e) {
        // The files no longer hold `to` (a checksum, a short file): say so.
        // An I/O error reading them is the disk's, and its exit status.
        if (e.exit_code() != exit_code::data) throw;
        return std::string(e.what());
    }
    if (I.rank == 0) try {
            shard::save_manifest(to, I.opts.manifest_path);
        } catch (...) {
            failed = std::current_exception();
        }
    comm::agree(I.comm, failed, "the manifest may name either step (zinf-shard verify tells which)");
    I.m = to;
    return std::nullopt;
}

std::optional<std::string> Trainer::nonfinite_weights() {
    Impl& I = *impl_;
    std::optional<std::string> found;
    std::exception_ptr failed;
    try {
        shard::RunOptions ro;
        ro.ranks = {I.rank};
        ro.lock = false;
        found = shard::find_nonfinite(I.m, {"master", "param"}, I.io, I.pinned, ro);
        if (found) throw DataError(*found);
    } catch (...) {
        failed = std::current_exception();
    }
    try {
        comm::agree(I.comm, failed, "the committed weights are not finite");
    } catch (const Error& e) {
        return std::string(e.what());
    }
    return std::nullopt;
}

std::uint64_t Trainer::device_need() const {
    const Impl& I = *impl_;
    if (I.resident) return I.acts_used;
    return I.acts_used + zero::InfinityEngine::need(I.m, I.gpt.modules(), I.opts.infinity).total();
}

// The resident engine's step: every gradient averaged into this rank's
// partitions in one collective, the optimizer, the new parameters back.
// What the optimizer's step report adds to a step's log.
static void optimizer_fields(StepLog& log, const zero::StepReport& r) {
    log.optimizer_speculated = r.speculated;
    log.optimizer_overlap_seconds = r.overlap_seconds;
    log.optimizer_redo = r.redo;
    log.optimizer_read_bytes = r.bytes_read;
    log.optimizer_written_bytes = r.bytes_written + r.grad_bytes_written;
    log.grad_scratch_read_bytes = r.grad_bytes_read;
    log.grad_scratch_written_bytes = r.grad_bytes_written;
    log.grad_scratch_memory_bytes = r.grad_memory_bytes;
    log.optimizer_update_seconds = r.update_seconds;
    log.optimizer_wait_seconds = r.wait_seconds;
    log.optimizer_commit_seconds = r.commit_seconds;
    log.optimizer_readahead_bytes = r.readahead_bytes;
    log.optimizer_readahead_used_bytes = r.readahead_used_bytes;
}

void Trainer::Impl::resident_update(StepLog& log) {
    const std::size_t T = m.tensors.size();
    auto& s = dev.compute();
    if (dp > 1) {
        zero::reduce_scatter(comm, grad_bucket, comm::DType::f32);
    } else {
        for (std::size_t i = 0; i < T; ++i)
            dev.copy(s, std::as_writable_bytes(std::span(own_grad[i])), std::as_bytes(resident->gradient(i)));
        dev.synchronize(s);
    }
    for (std::size_t i = 0; i < T; ++i) {
        const auto own = shard::owned(m.tensors[i].numel, dp, rank);
        optim->put_gradient(i, std::span<const float>(own_grad[i]).first(own.count));
    }
    const zero::StepReport r = optim->step();
    log.grad_norm = r.grad_norm;
    log.overflow = r.overflow;
    optimizer_fields(log, r);
    if (r.overflow) return;
    // The new working parameters back into every rank's resident copy.
    if (dp == 1) {
        for (std::size_t i = 0; i < T; ++i) install(i, own_param[i].bytes().first(m.tensors[i].numel * pbytes));
    } else if (param_dtype == shard::DType::fp32) {
        zero::gather(comm, param_bucket, comm::DType::f32);
    } else {  // bf16 on the wire, one tensor at a time through the staging buffer
        for (std::size_t i = 0; i < T; ++i) {
            const std::uint64_t n = m.tensors[i].numel;
            const auto full = std::span(staging).first(n);
            zero::gather(comm, zero::Gather{own_param[i].bytes(), std::as_writable_bytes(full), n}, comm::DType::bf16);
            install(i, std::as_bytes(full));
        }
    }
}

StepLog Trainer::step(const data::Loader& train) {
    Impl& I = *impl_;
    auto& dev = I.dev;
    auto& s = dev.compute();
    model::Context ctx{dev, s, I.engine(), I.opts.precision};
    StepLog log;
    log.step = step_count() + 1;
    log.lr = I.opts.schedule.at(log.step);
    I.optim->set_lr(log.lr);  // before the engine hands over the first gradient
    const bool acts_on_disk = I.acts.store && I.acts.store->kind() == model::Offload::nvme;
    const std::uint64_t acts_in = acts_on_disk ? I.acts.store->bytes_in() : 0,
                        acts_out = acts_on_disk ? I.acts.store->bytes_out() : 0;
    Timer total;

    // Forward: the batch in, the per-token losses and the logits' gradient
    // out; backward, the engine handing every gradient to the optimizer.
    // Where no collective can be under way between the two (one rank, or the
    // resident engine, whose collectives follow backward), the loss is known
    // before backward: when it is not finite the weights are, in effect,
    // diverged, and nothing goes to the optimizer, which would otherwise
    // write the step's (speculative) update over the generation a rollback
    // needs (run()).
    const bool loss_first = I.resident || I.comm.size() == 1;
    Timer t;
    std::exception_ptr failed;
    const std::string not_taken = "step " + std::to_string(log.step) + " was not taken; the manifest stays at step " +
                                  std::to_string(step_count());
    try {
        I.load_batch(train, log.step - 1);
        if (I.resident) I.resident->zero_grad(s);
        else I.infinity->begin(true);
        I.gpt.forward(ctx, I.acts);
        dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
        dev.synchronize(s);
        log.forward_seconds = t.seconds();
    } catch (...) {
        failed = std::current_exception();
        if (I.infinity) I.infinity->reset();
    }
    if (loss_first) {
        comm::agree(I.comm, failed, not_taken);
        log.loss = I.mean_loss();
        if (!std::isfinite(log.loss)) {
            if (I.infinity) I.infinity->reset();
            log.overflow = true;  // no update: nothing was handed to the optimizer
            log.grad_norm = std::numeric_limits<double>::quiet_NaN();
            log.seconds = total.seconds();
            log.peak_rss_bytes = peak_resident_bytes();
            return log;
        }
    }
    if (!failed) try {
            t.reset();
            I.gpt.backward(ctx, I.acts);
            if (I.infinity) I.infinity->end();
            dev.synchronize(s);
            log.backward_seconds = t.seconds();
        } catch (...) {
            failed = std::current_exception();
            if (I.infinity) I.infinity->reset();
        }
    // One rank's failed fetch or gradient write is every rank's: nothing
    // reaches the optimizer, the manifest stays at the last commit.
    comm::agree(I.comm, failed, not_taken);
    if (!loss_first) log.loss = I.mean_loss();

    t.reset();
    if (I.resident) {
        I.resident_update(log);
    } else {
        const zero::StepReport r = I.optim->step();
        log.grad_norm = r.grad_norm;
        log.overflow = r.overflow;
        optimizer_fields(log, r);
        const zero::InfinityStats st = I.infinity->stats();
        std::copy(std::begin(st.fetched_bytes), std::end(st.fetched_bytes), log.fetched_bytes);
        log.stall_seconds = st.stall_seconds;
        log.collectives = st.collectives;
        log.device_peak_bytes = st.device_peak;
        log.trace_diverged = st.diverged;
        if (!r.overflow) I.infinity->after_step();
    }
    log.optimizer_seconds = t.seconds();
    if (I.resident) log.device_peak_bytes = dev.arena().stats().peak;
    log.peak_rss_bytes = peak_resident_bytes();

    log.seconds = total.seconds();
    if (acts_on_disk) I.disk_floor(log, I.acts.store->bytes_in() - acts_in, I.acts.store->bytes_out() - acts_out);
    else I.disk_floor(log, 0, 0);
    log.tokens = I.opts.batch * I.opts.seq * I.dp;
    log.tokens_per_s = static_cast<double>(log.tokens) / log.seconds;
    log.flops_per_s = flops_per_step() * I.dp / log.seconds;
    return log;
}

double Trainer::evaluate(const data::Loader& val, std::uint64_t batches) { return *evaluate(val, batches, nullptr); }

std::optional<double> Trainer::evaluate(const data::Loader& val, std::uint64_t batches, const std::atomic<bool>* stop) {
    Impl& I = *impl_;
    auto& s = I.dev.compute();
    model::Context ctx{I.dev, s, I.engine(), I.opts.precision};
    double sum = 0;
    for (std::uint64_t b = 0; b < batches; ++b) {
        if (stop) {
            std::uint8_t now = stop->load() ? 1 : 0;
            if (I.comm.size() > 1)
                I.comm.allreduce(std::as_bytes(std::span(&now, 1)), std::as_writable_bytes(std::span(&now, 1)),
                                 comm::DType::u8, comm::Reduce::max);
            if (now) return std::nullopt;
        }
        std::exception_ptr failed;
        try {
            I.load_batch(val, b);
            if (I.infinity) I.infinity->begin(false);
            I.gpt.forward(ctx, I.acts, false);
            I.dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
            if (I.infinity) I.infinity->end();
            I.dev.synchronize(s);
        } catch (...) {
            failed = std::current_exception();
            if (I.infinity) I.infinity->reset();
        }
        comm::agree(I.comm, failed, "the evaluation did not finish; nothing was committed by it");
        sum += I.mean_loss();
    }
    return batches ? sum / static_cast<double>(batches) : 0.0;
}

}  // namespace zinf::train
