// The training step: the batch in, forward and backward on the device
// through the run's engine (zero::Engine), the loss agreed over the ranks,
// and the engine's update; the step's log.
#include <zinf/train.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <tuple>
#include <utility>

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
    model::Activations acts;
    std::unique_ptr<zero::Engine> engine;
    // The batch in and the per-token losses out, in page-locked memory from
    // the pool (io_mem): their copies are asynchronous, none staged.
    mem::Pinned io_mem;
    std::span<std::int32_t> inputs, targets;
    // A batch could not be read on some rank (the token file changed or
    // failed under the run): nothing of that step or evaluation was taken.
    bool input_failed = false;
    std::span<float> losses;
    CheckpointChoice ckpt;  // Options::checkpoint resolved, before the engine opens
    io::Bandwidth disk;  // this rank's share of its disk (Options::disk); zeros: no floor

    void measure_disk(const zero::DiskNeed& need);
    void disk_floor(StepLog& log, std::uint64_t acts_in, std::uint64_t acts_out) const;
    void floors(StepLog& log) const;

    // Pipelined (Options::pipeline): the step whose update runs beside the
    // next one's forward, and the last one settled, not handed out yet.
    std::optional<StepLog> pending, done;
    double waited = 0;  // what this step's forward waited for the step before's update
    void settle();

    // Queued work reads the activations, the engine's device memory and the
    // host vectors below: it must be done before they go (an error thrown
    // between two enqueues leaves some).
    ~Impl() {
        if (engine) engine->reset();  // the engine's own streams drained
        // The copy streams too: offloaded checkpoints move on them.
        for (auto k : {device::StreamKind::compute, device::StreamKind::d2h, device::StreamKind::h2d}) try {
                dev.synchronize(dev.stream(k));
            } catch (const std::exception& e) {
                log::warn(std::string("the device's last work failed as the trainer closed: ") + e.what());
            }
    }

    // The activations' shape: the batch, checkpointing, where the
    // checkpoints wait, and the precision of the checkpoints and of what a
    // block keeps, the arithmetic's (bf16 arithmetic keeps them bf16).
    model::Shape shape(bool recompute) const {
        return {.batch = opts.batch, .seq = opts.seq, .checkpoint = recompute,
                .offload = opts.offload_activations, .checkpoints = opts.precision, .activations = opts.precision,
                .attention = opts.attention};
    }
    model::Shape shape() const { return shape(ckpt.recompute); }
    std::uint64_t engine_bytes() const;
    zero::EngineOptions engine_options() const;
    zero::ActivationPlan activation_plan();
    double mean_loss();
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
      gpt(*model) {
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
            dn.pipeline = opts.overlap && opts.pipeline && !opts.resident;  // (the optimizer's, below)
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
    // Recompute the blocks or keep them: from what the device has left.
    // (Only auto without an offload weighs them: offloaded checkpoints are
    // always recomputed from.)
    {
        const mem::ArenaStats a = dev.arena().stats();
        const bool weigh =
            opts.checkpoint == Checkpointing::automatic && opts.offload_activations == model::Offload::none;
        ckpt = choose_checkpointing(opts.checkpoint, opts.offload_activations, weigh ? gpt.plan_bytes(shape(false)) : 0,
                                    weigh ? engine_bytes() : 0, a.bytes > a.used ? a.bytes - a.used : 0);
        // Every rank alike (a recomputed forward fetches, and at dp > 1
        // gathers, again): one rank's budget that asks for the recompute
        // (--device-memory auto reads each rank's free memory) asks it of all.
        if (weigh && comm.size() > 1) {
            const double mine = ckpt.recompute ? 1 : 0;
            double any = 0;
            comm.allreduce(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(&any, 1)),
                           comm::DType::f64, comm::Reduce::max);
            if (any > 0 && !ckpt.recompute)
                ckpt = {true, ckpt.why + ", but another rank's do not: every rank recomputes"};
        }
    }
    engine = zero::Engine::open(m, gpt.modules(), comm, e, p, dev, engine_options(), activation_plan());
    acts.store = engine->activation_store();
    const std::size_t n = o.batch * o.seq;
    io_mem = p.pin(3 * n * 4, "trainer's batch and losses");
    inputs = {reinterpret_cast<std::int32_t*>(io_mem.data()), n};
    targets = {inputs.data() + n, n};
    losses = {reinterpret_cast<float*>(io_mem.data() + 2 * n * 4), n};
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

// The step against the larger of compute and disk (StepLog).
void Trainer::Impl::floors(StepLog& log) const {
    log.compute_floor_seconds = std::max(
        0.0, log.forward_seconds + log.backward_seconds - log.stall_seconds - log.update_waited_seconds);
    const double floor = std::max(log.compute_floor_seconds, log.disk_floor_seconds);
    if (floor > 0) log.step_floor_ratio = log.seconds / floor;
    log.optimizer_hidden_seconds = log.optimizer_overlap_seconds + log.update_overlap_seconds;
}

// What the engine takes of the device beside the activations, as
// choose_checkpointing weighs it: the resident engine's copy of every
// parameter and its gradient (fp32, each tensor at a 64-byte aligned start,
// as ResidentEngine lays them); ZeRO-Infinity's reserve and largest fetch
// (InfinityEngine::need) and its fetches ahead (--prefetch-bytes), which
// keeping every block's activations must not starve.
std::uint64_t Trainer::Impl::engine_bytes() const {
    if (opts.resident) {
        std::uint64_t floats = 0;
        for (const auto& t : m.tensors) floats += (t.numel + 15) / 16 * 16;
        return 2 * floats * sizeof(float);
    }
    return zero::InfinityEngine::need(m, gpt.modules(), opts.infinity).total() + opts.infinity.prefetch_bytes;
}

// The engine the trainer's options ask for: the optimizer's hyperparameters
// and overlap, the engine's placement and prefetch.
zero::EngineOptions Trainer::Impl::engine_options() const {
    zero::EngineOptions eo;
    eo.resident = opts.resident;
    eo.infinity = opts.infinity;
    eo.gpu = opts.gpu;
    zero::OptimizerOptions& zo = eo.optimizer.emplace();
    zo.adamw = opts.adamw;
    zo.adamw.lr = opts.schedule.at(1);
    zo.grad_clip = opts.grad_clip;
    zo.kernel = opts.kernel;
    zo.manifest_path = opts.manifest_path;
    zo.overlap = opts.overlap;
    // The next step beside this one's update: the ZeRO-Infinity engine's
    // fetches wait for each parameter's new values; the resident engine
    // gathers them all back after the step.
    zo.pipeline = opts.overlap && opts.pipeline && !opts.resident;
    zo.readahead = opts.optimizer_readahead;
    return eo;
}

// The activations the engine takes from the device budget first, where
// their checkpoints wait, and the model at another tile factor for the
// engine's refusal to name.
zero::ActivationPlan Trainer::Impl::activation_plan() {
    zero::ActivationPlan ap;
    ap.batch = opts.batch;
    ap.seq = opts.seq;
    ap.bytes = gpt.plan_bytes(shape());
    ap.take = [this] { acts = gpt.plan(dev, shape()); };
    ap.recompute = ckpt.recompute;
    ap.offload = opts.offload_activations;
    if (ap.offload != model::Offload::none) {
        ap.checkpoints = model::offloaded_checkpoints(gpt.config());
        ap.checkpoint_bytes = model::checkpoint_bytes(gpt.config(), opts.batch, opts.seq, opts.precision);
    }
    ap.retiled = [this](unsigned k, const zero::InfinityOptions& inf) {
        shard::LayoutOptions lo = m.opts;
        lo.tile = k;
        const shard::Manifest mk = shard::layout(m.spec, lo);
        const auto gk = model::make_model(model::Config::from(m.spec, k));
        return zero::InfinityEngine::need(mk, gk->modules(), inf);
    };
    return ap;
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

std::uint64_t Trainer::step_count() const { return impl_->engine->step_count(); }
bool Trainer::input_failed() const { return impl_->input_failed; }
model::LanguageModel& Trainer::model() { return impl_->gpt; }
zero::Engine& Trainer::engine() { return *impl_->engine; }
const Options& Trainer::options() const { return impl_->opts; }
model::Activations& Trainer::activations() { return impl_->acts; }
const CheckpointChoice& Trainer::checkpointing() const { return impl_->ckpt; }

Checkpointing parse_checkpointing(std::string_view text) {
    if (text == "auto") return Checkpointing::automatic;
    if (text == "all") return Checkpointing::all;
    if (text == "none") return Checkpointing::none;
    throw UsageError("--checkpoint " + std::string(text) + ": expected auto, all or none");
}

const char* checkpointing_name(Checkpointing c) {
    switch (c) {
        case Checkpointing::automatic: return "auto";
        case Checkpointing::none: return "none";
        case Checkpointing::all: break;
    }
    return "all";
}

CheckpointChoice choose_checkpointing(Checkpointing mode, model::Offload offload, std::uint64_t keep_bytes,
                                      std::uint64_t engine_bytes, std::uint64_t free_bytes) {
    const bool offloaded = offload != model::Offload::none;
    switch (mode) {
        case Checkpointing::all: return {true, "--checkpoint all"};
        case Checkpointing::none:
            if (offloaded)
                throw UsageError("--offload-activations " + std::string(model::offload_name(offload)) +
                                 " needs activation checkpointing: not with --checkpoint none");
            return {false, "--checkpoint none"};
        case Checkpointing::automatic: break;
    }
    if (offloaded)
        return {true, "--checkpoint auto: the checkpoints are offloaded (--offload-activations " +
                          std::string(model::offload_name(offload)) + ")"};
    const std::string sizes = "every block's " + format_size(keep_bytes) + " and the engine's " +
                              format_size(engine_bytes);
    if (keep_bytes + engine_bytes <= free_bytes)
        return {false, "--checkpoint auto: " + sizes + " fit the device's " + format_size(free_bytes) + " free"};
    return {true, "--checkpoint auto: " + sizes + " would pass the device's " + format_size(free_bytes) + " free"};
}
double Trainer::flops_per_step() const { return impl_->gpt.flops_per_step(impl_->opts.batch, impl_->opts.seq); }
void Trainer::save() {
    impl_->settle();
    impl_->engine->save();
}
void Trainer::settle() { impl_->settle(); }
std::optional<StepLog> Trainer::finished() { return std::exchange(impl_->done, std::nullopt); }
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

std::uint64_t Trainer::device_need() const { return impl_->engine->device_need(); }

// What the engine's update adds to a step's log (pipelined: once settled).
static void update_fields(StepLog& log, const zero::StepReport& r) {
    log.optimizer_redo = r.redo;
    log.optimizer_host_seconds = r.device_update ? 0.0 : r.update_seconds;
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
    log.update_under_backward = r.update_under_backward;
}

// What the engine's step and its last pass add to a step's log.
static void engine_fields(StepLog& log, const zero::StepReport& r, const zero::PassStats& st) {
    log.grad_norm = r.grad_norm;
    log.overflow = r.overflow;
    log.optimizer_speculated = r.speculated;
    log.optimizer_overlap_seconds = r.overlap_seconds;
    if (!r.pending) update_fields(log, r);
    std::copy(std::begin(st.fetched_bytes), std::end(st.fetched_bytes), log.fetched_bytes);
    log.stall_seconds = st.stall_seconds;
    log.d2h_stall_seconds = st.staging_wait_seconds;
    log.collectives = st.collectives;
    log.device_peak_bytes = st.device_peak;
    log.trace_diverged = st.diverged;
}

// The pipelined update under way, synced and committed (every rank at
// once), its step's log finished: how much of the update ran under this
// step's compute, and the floors with its bytes.
void Trainer::Impl::settle() {
    if (!pending) return;
    StepLog log = std::move(*pending);
    pending.reset();
    const std::optional<zero::StepReport> r = engine->settle();
    if (!r) return;
    update_fields(log, *r);
    log.update_pending = false;
    log.update_overlap_seconds =
        std::max(0.0, r->update_pipelined_seconds - r->update_waited_seconds - r->settle_waited_seconds);
    waited = r->update_waited_seconds;
    disk_floor(log, log.activation_read_bytes, log.activation_written_bytes);
    floors(log);
    done = std::move(log);
}

StepLog Trainer::step(const data::Loader& train) {
    Impl& I = *impl_;
    zero::Engine& engine = *I.engine;
    auto& dev = I.dev;
    auto& s = dev.compute();
    model::Context ctx{dev, s, engine.hooks(), I.opts.precision};
    StepLog log;
    log.step = step_count() + 1;
    log.lr = I.opts.schedule.at(log.step);
    Timer total;
    const std::uint64_t h2d0 = dev.h2d_bytes(), d2h0 = dev.d2h_bytes();

    // Forward: the batch in, the per-token losses and the logits' gradient
    // out; backward, the engine handing every gradient to the optimizer.
    // Where no collective of the engine's can be under way between the two,
    // the loss is known before backward: when it is not finite the weights
    // are, in effect, diverged, and nothing goes to the optimizer, which
    // would otherwise write the step's (speculative) update over the
    // generation a rollback needs (run()).
    const bool loss_first = engine.loss_before_backward();
    Timer t;
    std::exception_ptr failed;
    I.waited = 0;
    try {
        I.load_batch(train, log.step - 1);
    } catch (...) {
        // Nothing of this step ran: the step before's update is settled
        // (input_failed: run() commits the steps taken).
        I.settle();
        throw;
    }
    try {
        engine.begin_step(log.lr);
        I.gpt.forward(ctx, I.acts);
        dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
        dev.synchronize(s);
        log.forward_seconds = t.seconds();
    } catch (...) {
        failed = std::current_exception();
        engine.reset();
    }
    // Pipelined: the step before's update ran beside this forward, which
    // read each parameter once its new values were written; settled here,
    // on every rank, before this step's first gradient reaches the
    // optimizer (a failed update is every rank's: this step is not taken)
    // -- or, with a second gradient scratch after a clipped step, after
    // this backward, which it runs under too.
    // A forward that failed has no backward for it to run under: settled
    // now, so that the step before is committed whatever this one's fate
    // (as it is where no second scratch lets it run on).
    const bool under_backward = engine.settle_after_backward() && !failed;
    if (!under_backward) try {
            I.settle();
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
    log.update_waited_seconds = I.waited;
    const std::string not_taken = "step " + std::to_string(log.step) + " was not taken; the manifest stays at step " +
                                  std::to_string(step_count());
    if (loss_first) {
        comm::agree(I.comm, failed, not_taken);
        log.loss = I.mean_loss();
        if (!std::isfinite(log.loss)) {
            engine.reset();
            I.settle();
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
            engine.end();
            dev.synchronize(s);
            log.backward_seconds = t.seconds();
        } catch (...) {
            failed = std::current_exception();
            engine.reset();
        }
    if (under_backward) {
        try {
            I.settle();
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
        log.update_waited_seconds = I.waited;
    }
    // One rank's failed fetch or gradient write is every rank's: nothing
    // reaches the optimizer, the manifest stays at the last commit.
    comm::agree(I.comm, failed, not_taken);
    if (!loss_first) log.loss = I.mean_loss();

    t.reset();
    const zero::StepReport r = engine.step();
    log.optimizer_seconds = t.seconds();
    const zero::PassStats st = engine.stats();
    engine_fields(log, r, st);
    log.peak_rss_bytes = peak_resident_bytes();

    log.seconds = total.seconds();
    log.h2d_bytes = dev.h2d_bytes() - h2d0;
    log.d2h_bytes = dev.d2h_bytes() - d2h0;
    I.disk_floor(log, st.activation_read_bytes, st.activation_written_bytes);
    log.tokens = I.opts.batch * I.opts.seq * I.dp;
    log.tokens_per_s = static_cast<double>(log.tokens) / log.seconds;
    log.flops_per_s = flops_per_step() * I.dp / log.seconds;
    if (r.pending) {
        log.update_pending = true;  // the update's figures and the floors when it settles
        I.pending = log;
    } else {
        I.floors(log);
    }
    return log;
}

double Trainer::evaluate(const data::Loader& val, std::uint64_t batches) { return *evaluate(val, batches, nullptr); }

std::optional<double> Trainer::evaluate(const data::Loader& val, std::uint64_t batches, const std::atomic<bool>* stop) {
    Impl& I = *impl_;
    zero::Engine& engine = *I.engine;
    auto& s = I.dev.compute();
    model::Context ctx{I.dev, s, engine.hooks(), I.opts.precision};
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
            engine.begin_forward();
            I.gpt.forward(ctx, I.acts, false);
            I.dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
            engine.end();
            I.dev.synchronize(s);
        } catch (...) {
            failed = std::current_exception();
            engine.reset();
        }
        comm::agree(I.comm, failed, "the evaluation did not finish; nothing was committed by it");
        sum += I.mean_loss();
    }
    return batches ? sum / static_cast<double>(batches) : 0.0;
}

}  // namespace zinf::train
