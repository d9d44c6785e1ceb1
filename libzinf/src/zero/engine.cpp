// The run's engine (zero.hpp, Engine): what both implementations share, and
// the ZeRO-Infinity one: its memory checks before anything is written, the
// optimizer (or the committed parameters) it reads from, the parameters'
// refresh after each update.
#include "engine.hpp"

#include <limits>

namespace zinf::zero {

namespace detail {

EngineBase::EngineBase(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p,
                       device::Device& d, const EngineOptions& o)
    : m(m_), comm(c), io(e), pool(p), dev(d), opts(o), dp(m_.opts.dp), rank(static_cast<unsigned>(c.rank())) {
    // Data parallel on device memory the host cannot address (cuda): the
    // engine's gathers and reduce-scatters go through NCCL on the device's
    // streams, the host's collectives (the optimizer's, the loss) stay on
    // comm. The resident engine's collectives are host calls (it refuses
    // such a device).
    if (!opts.resident && !opts.infinity.device_comm && comm.size() > 1 && !dev.host_addressable()) {
        device_comm = comm::device_communicator(comm, opts.gpu);
        opts.infinity.device_comm = device_comm.get();
        if (rank == 0) log::info("the engine's collectives: " + device_comm->describe());
    }
}

Optimizer& EngineBase::optimizer() const {
    if (!optim) throw InternalError("engine: a training step over the committed parameters, which take no update");
    return *optim;
}

void EngineBase::begin_step(double lr) {
    optimizer().set_lr(lr);  // before the first gradient is handed over
    if (acts) acts_in = acts->bytes_in(), acts_out = acts->bytes_out();
    begin_pass(true);
}

void EngineBase::begin_forward() {
    if (acts) acts_in = acts->bytes_in(), acts_out = acts->bytes_out();
    begin_pass(false);
}

std::uint64_t EngineBase::step_count() const {
    if (optim) return optim->step_count() + (optim->pending() ? 1 : 0);  // a pipelined update: taken
    return m.parts.empty() ? 0 : m.parts.front().step;  // the committed step
}

void EngineBase::save() { optimizer().save(); }

PassStats EngineBase::stats() const {
    PassStats s;
    static_cast<InfinityStats&>(s) = pass_stats();
    if (acts && acts->kind() == Offload::nvme) {
        s.activation_read_bytes = acts->bytes_in() - acts_in;
        s.activation_written_bytes = acts->bytes_out() - acts_out;
    }
    return s;
}

// The disk's bandwidths set the trainer's floor only, not the update's
// depths (OptimizerOptions::disk): the deeper read/write split they would
// give, in smaller pieces, was measured no faster than the default 3 slots
// (BENCHMARKS.md, issue 28); zinf-optbench --config measures it still.
void EngineBase::open_optimizer(std::uint64_t device_more, bool on_device) {
    OptimizerOptions zo = *opts.optimizer;
    if (!dev.arena().on_gpu()) zo.readahead_reserve = device_more;
    if (on_device) zo.device = &dev;
    optim = std::make_unique<Optimizer>(m, comm, io, pool, zo);
    if (rank == 0 && optim->updates_on_device())
        log::info("optimizer: the gpu-tier state (" + format_size(Optimizer::device_bytes(m, rank, zo)) +
                  " with the gradients' copy) is held and updated on the device");
    const std::uint64_t state = optim->update_read_bytes(), ra = optim->readahead_bytes();
    const auto budget = [&] {
        return zo.readahead == OptimizerOptions::kReadaheadAuto ? std::string("(free memory)")
                                                                : format_size(zo.readahead);
    };
    if (rank == 0 && optim->gradient_scratch_bytes() > 0)
        log::info("optimizer: the gradients' scratch (" + format_size(optim->gradient_scratch_bytes()) + ") " +
                  (optim->gradient_scratch_in_memory()
                       ? std::string("in memory")
                       : "in a file beside the state: --optimizer-readahead " + budget() + " does not hold it"));
    if (rank != 0 || state == 0) return;
    log::info("optimizer: the update reads " + std::to_string(optim->read_depth()) + " chunk(s) ahead and writes " +
              std::to_string(optim->write_depth()) + " behind, pieces of " + format_size(optim->chunk_bytes()));
    if (zo.readahead == 0)
        log::info("optimizer: no read-ahead (--optimizer-readahead 0): a step after a clipped one reads its " +
                  format_size(state) + " of master weights and moments after backward");
    else
        log::info("optimizer: a step after a clipped one reads " + format_size(ra) + " of the " + format_size(state) +
                  " of master weights and moments it updates during backward (--optimizer-readahead " +
                  (zo.readahead == OptimizerOptions::kReadaheadAuto ? "from free memory" : format_size(zo.readahead)) +
                  ")");
}

void EngineBase::open_activations(const ActivationPlan& plan) {
    if (plan.offload == Offload::none) return;
    std::string path;
    if (plan.offload == Offload::nvme) path = disk_need(m, rank).folder + "/activations.bin";
    acts = ActivationStore::open(plan.offload, plan.checkpoints, plan.checkpoint_bytes, pool, &io, path);
}

}  // namespace detail

namespace {

// ZeRO-Infinity: each rank holds only its partitions, in the manifest's
// tiers; the optimizer (training) or the committed parameters are the
// store the engine fetches from.
class InfinityRun final : public detail::EngineBase {
public:
    InfinityRun(shard::Manifest& m, std::span<const Module* const> modules, comm::Communicator& comm,
                io::Engine& io, mem::PinnedPool& pool, device::Device& dev, const EngineOptions& o,
                const ActivationPlan& plan);

    ParamEngine& hooks() override { return *engine; }
    void end() override { engine->end(); }
    StepReport step() override;
    std::optional<StepReport> settle() override;
    void reset() noexcept override { engine->reset(); }
    bool loss_before_backward() const override { return comm.size() == 1; }
    std::vector<std::string> trace(bool train) const override { return engine->trace(train); }
    std::uint64_t device_need() const override { return need; }

private:
    void begin_pass(bool train) override;
    InfinityStats pass_stats() const override { return engine->stats(); }
    void take_activations(std::span<const Module* const> modules, const ActivationPlan& plan);
    void check_fits(const ActivationPlan& plan, const InfinityEngine::Need& n, std::uint64_t optimizer_bytes) const;

    std::unique_ptr<CommittedParams> committed;  // forward passes only
    std::unique_ptr<InfinityEngine> engine;
    std::uint64_t acts_used = 0;  // of the arena, after the activations
    std::uint64_t need = 0;       // device_need()
};

InfinityRun::InfinityRun(shard::Manifest& m_, std::span<const Module* const> modules, comm::Communicator& c,
                         io::Engine& e, mem::PinnedPool& p, device::Device& d, const EngineOptions& o,
                         const ActivationPlan& plan)
    : EngineBase(m_, c, e, p, d, o) {
    // Sampling: one fetch for the whole text when every parameter fits.
    if (opts.persist_if_fits) {
        opts.infinity.persist_below = std::numeric_limits<std::uint64_t>::max();
        if (InfinityEngine::need(m, modules, opts.infinity).total() > dev.arena().stats().largest_free)
            opts.infinity.persist_below = 0;
    }
    take_activations(modules, plan);
    const auto n = InfinityEngine::need(m, modules, opts.infinity);
    need = acts_used + n.total();
    ParamStore* store = nullptr;
    if (opts.optimizer) {
        // The budget checked before the optimizer opens (it prepares the
        // files its first step writes): a refused run leaves the state as it
        // was.
        // The optimizer's gpu-tier state, when the device updates it, is
        // taken from the arena before the engine's memory.
        OptimizerOptions with_dev = *opts.optimizer;
        with_dev.device = &dev;
        const std::uint64_t od = Optimizer::device_bytes(m, rank, with_dev);
        check_fits(plan, n, od);
        // What this device's memory may hold at most beside the activations:
        // the engine's reserve and largest fetch, the fetches ahead, and a
        // checkpointed block's fetches kept for its backward.
        const std::uint64_t kept = plan.recompute && opts.infinity.prefetch_bytes ? n.block : 0;
        open_optimizer(acts_used + od + n.total() + opts.infinity.prefetch_bytes + kept, true);
        need += od;
        store = optim.get();
    } else {
        committed = std::make_unique<CommittedParams>(m, rank, io, pool);
        store = committed.get();
    }
    engine = std::make_unique<InfinityEngine>(m, modules, comm, io, pool, dev, *store, opts.infinity);
}

// The activations first (refused before they are taken when they and the
// engine cannot fit the budget), then their checkpoints' store.
void InfinityRun::take_activations(std::span<const Module* const> modules, const ActivationPlan& plan) {
    const std::uint64_t budget = dev.arena().stats().bytes;
    if (plan.bytes > budget) {
        const auto n = InfinityEngine::need(m, modules, opts.infinity);
        throw DoesNotFit("the activations of a batch of " + std::to_string(plan.batch) + " x " +
                             std::to_string(plan.seq) + " need " + format_size(plan.bytes) +
                             ", more than the device budget of " + format_size(budget) + "; with the engine's " +
                             format_size(n.total()) + " (its largest module, " + n.module + ", needs " +
                             format_size(n.largest) + ") the run needs a device budget of at least " +
                             std::to_string(plan.bytes + n.total()) + " bytes (" +
                             format_size(plan.bytes + n.total()) + "; --device-memory, or a smaller --batch)",
                         "activations", plan.bytes + n.total(), budget);
    }
    if (plan.take) plan.take();
    acts_used = dev.arena().stats().used;
    open_activations(plan);
}

// A budget too small for the largest module is refused now, with the tile
// factor that would fit.
void InfinityRun::check_fits(const ActivationPlan& plan, const InfinityEngine::Need& n, std::uint64_t od) const {
    const std::uint64_t left = dev.arena().stats().largest_free;
    if (n.total() + od <= left) return;
    std::string msg = n.module + " needs " + format_size(n.largest) + " of device memory for its parameters and " +
                      "their gradients, beside " + format_size(n.reserved + n.flat) +
                      " the engine keeps for the whole run (parameters on the gpu tier, persistent ones, the "
                      "tied embedding's gradient" + (n.flat ? ", " + n.flat_what() : std::string()) + ")" +
                      (od ? " and " + format_size(od) + " of optimizer state on the gpu tier" : std::string()) +
                      "; the device budget has " + format_size(left) + " left after the activations (" +
                      format_size(acts_used) + "). The run needs a device budget of at least " +
                      std::to_string(acts_used + od + n.total()) + " bytes (" +
                      format_size(acts_used + od + n.total()) + "; --device-memory, now " +
                      format_size(dev.arena().stats().bytes) + ")";
    for (unsigned k = std::max(2u, m.opts.tile * 2); plan.retiled && k <= 64; k *= 2) {
        const auto nk = plan.retiled(k, opts.infinity);
        if (nk.total() + od <= left) {
            msg += ", or a layout with --tile " + std::to_string(k) + " (zinf-shard layout --tile " +
                   std::to_string(k) + "; its largest module, " + nk.module + ", needs " + format_size(nk.largest) +
                   ")";
            break;
        }
    }
    throw DoesNotFit(msg, n.module, acts_used + od + n.total(), dev.arena().stats().bytes);
}

void InfinityRun::begin_pass(bool train) { engine->begin(train); }

// The commit's collectives go on the communicator the engine's fetches
// ahead use at dp > 1 (host jobs on its collectives stream, gathering the
// backward's first modules after the forward): those are done first, so
// that the two never interleave. Their error, if any, is the pass's (end()
// reports it); this call goes on to the collectives every rank makes.
std::optional<StepReport> InfinityRun::settle() {
    if (optim && optim->pending() && comm.size() > 1) try {
            dev.synchronize(dev.stream(device::StreamKind::collectives));
        } catch (const std::exception& e) {
            log::debug(std::string("engine: before the commit, a fetch's collective failed: ") + e.what());
        }
    return EngineBase::settle();
}

StepReport InfinityRun::step() {
    const StepReport r = optimizer().step();
    if (!r.overflow) engine->after_step();
    return r;
}

}  // namespace

std::unique_ptr<Engine> Engine::open(shard::Manifest& m, std::span<const Module* const> modules,
                                     comm::Communicator& comm, io::Engine& io, mem::PinnedPool& pool,
                                     device::Device& dev, const EngineOptions& opts, const ActivationPlan& plan) {
    if (opts.resident) return detail::open_resident(m, comm, io, pool, dev, opts, plan);
    return std::make_unique<InfinityRun>(m, modules, comm, io, pool, dev, opts, plan);
}

}  // namespace zinf::zero
