// The run around the steps: which manifest a run reads and commits, whether
// it may continue a checkpoint, and the loop's cadence (validation, commits,
// a step that overflowed, a stop every rank agrees on).
#include <zinf/train.hpp>

#include <algorithm>
#include <cstdio>

namespace zinf::train {

namespace {

std::string four_places(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
}

}  // namespace

shard::Committed read_checkpoint(const std::string& given) {
    // One writer at a time: this process's share of the state locked
    // (rank 0 the data directory, every rank its node-local folder) before
    // the committed manifest is read, held for the run (c.lock).
    const auto rank = static_cast<unsigned>(comm::Launch::from_env().rank);
    shard::Committed c = shard::read_committed(given, shard::LockMode::exclusive, {rank});
    // The engine and the optimizer open these files later: none may lead
    // outside the data directory (a rank folder that is a link elsewhere
    // would have every checkpoint written there). Node-local rank folders
    // are each on their own node: every rank checks its own (Trainer).
    if (c.manifest.rank_dirs.empty()) shard::check_paths(c.manifest);
    return c;
}

std::uint64_t resume_step(const shard::Manifest& m, const std::string& path, bool resume, std::uint64_t steps) {
    std::uint64_t at = 0;
    for (const auto& p : m.parts) at = std::max(at, p.step);
    if (at > 0 && !resume)
        throw UsageError("manifest " + path + " is a checkpoint at step " + std::to_string(at) +
                         ": pass --resume to continue it, or lay out and init a new one");
    if (at >= steps)
        throw UsageError("manifest " + path + " is already at step " + std::to_string(at) + " of --steps " +
                         std::to_string(steps));
    return at;
}

void run(Trainer& t, comm::Communicator& comm, const data::Loader& train, const data::Loader* val, const Cadence& c,
         const StepSink& emit) {
    const std::string& committed = t.options().manifest_path;
    const bool lead = comm.rank() == 0;
    for (std::uint64_t s = t.step_count(); s < c.steps; ++s) {
        const StepLog log = t.step(train);
        if (log.overflow) {
            // fp32 with no loss scaling: a gradient that is not finite will be
            // again on the same batch. Stop rather than repeat the step.
            if (lead) emit(log, std::nullopt);
            t.save();  // the update was skipped on every rank: the state before it is whole
            throw DataError("step " + std::to_string(log.step) + ": the gradient is not finite (loss " +
                            four_places(log.loss) + "): training diverged; " + committed + " is committed at step " +
                            std::to_string(t.step_count()) + " (lower --lr or raise --warmup)");
        }
        std::optional<double> val_loss;
        if (c.eval_every && (log.step % c.eval_every == 0 || log.step == c.steps))
            val_loss = t.evaluate(*val, c.eval_batches);
        if (c.checkpoint_every && log.step % c.checkpoint_every == 0 && log.step != c.steps) {
            t.save();
            if (lead) log::info("checkpoint committed at step " + std::to_string(log.step));
        }
        // A failed write of the step line (a closed pipe, a full disk) stops
        // the run like an interrupt: every rank saves together, then rank 0
        // reports the write's error.
        std::exception_ptr output_failed;
        if (lead) try {
                emit(log, val_loss);
            } catch (const Error&) {
                output_failed = std::current_exception();
            }
        // Every rank stops at the same step: agree on the flag.
        std::uint8_t stop = output_failed ? 2 : (c.stop && c.stop->load()) ? 1 : 0;
        if (comm.size() > 1)
            comm.allreduce(std::as_bytes(std::span(&stop, 1)), std::as_writable_bytes(std::span(&stop, 1)),
                           comm::DType::u8, comm::Reduce::max);
        if (stop == 2) {
            t.save();  // the steps taken are not lost with the output
            if (output_failed) std::rethrow_exception(output_failed);
            throw IoError("rank 0 could not write its output: stopped at step " + std::to_string(t.step_count()) +
                          ", committed");
        }
        if (stop && log.step < c.steps) {
            t.save();
            if (lead) log::warn("interrupted: checkpoint committed at step " + std::to_string(t.step_count()) +
                                "; continue with --resume");
            throw Interrupted("interrupted at step " + std::to_string(t.step_count()));
        }
    }
    t.save();
}

}  // namespace zinf::train
