// The run around the steps: which manifest a run reads and commits, whether
// it may continue a checkpoint, and the loop's cadence (validation, commits,
// a step that overflowed, a stop every rank agrees on).
#include <zinf/train.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace zinf::train {

namespace {

std::string four_places(double v) {
    if (std::isnan(v)) return "nan";
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

namespace {

// The step the manifest's records are at (they agree, or it was refused).
std::uint64_t committed_step(const shard::Manifest& m) {
    std::uint64_t at = 0;
    for (const auto& p : m.parts) at = std::max(at, p.step);
    return at;
}

// The weights of step `weights` gave a loss that is not finite: training
// diverged. The manifest must name the last step whose weights did not: when
// the diverged ones are committed (every state on NVMe commits each step; a
// checkpoint may have committed them), the commit before them, which this
// run saw give a finite loss (`good`), is committed again. Throws the
// DataError that says which step the manifest names.
[[noreturn]] void diverged(Trainer& t, const StepLog& log, const std::optional<shard::Manifest>& good,
                           const std::string& committed) {
    const std::uint64_t weights = log.step - 1, at = committed_step(t.manifest());
    const std::string what = "step " + std::to_string(log.step) + ": the loss is not finite (" +
                             four_places(log.loss) + ") on the weights of step " + std::to_string(weights) +
                             ": training diverged; ";
    const std::string advice = " (lower --lr or raise --warmup)";
    if (at < weights)  // the weights since the last commit were never committed
        throw DataError(what + committed + " stays committed at step " + std::to_string(at) +
                        ", the last step whose weights gave a finite loss" + advice);
    if (good && committed_step(*good) < at) {
        const std::uint64_t back = committed_step(*good);
        std::optional<std::string> why;
        try {
            why = t.rollback(*good);
        } catch (const IoError& e) {  // the disk failed reading step `back`'s files: its error (74, 73)
            throw IoError(what + committed + " is committed at step " + std::to_string(at) +
                              " and could not go back to step " + std::to_string(back) + ": " + e.message() + advice,
                          {e.err(), e.path(), e.offset(), e.rank()});
        }
        if (why)
            throw DataError(what + committed + " is committed at step " + std::to_string(at) +
                            " and could not go back to step " + std::to_string(back) +
                            ", the last whose weights gave a finite loss: its files did not hold it any more (" +
                            *why + "); run again from a copy made before, or with --no-overlap" + advice);
        throw DataError(what + committed + " is committed again at step " + std::to_string(back) +
                        ", the last step whose weights gave a finite loss" + advice);
    }
    // The weights the run started from (or the only commit it has seen).
    if (const auto bad = t.nonfinite_weights())
        throw DataError("step " + std::to_string(log.step) + ": the committed weights are not finite (" + *bad +
                        "): " + committed + " at step " + std::to_string(at) +
                        " cannot be trained; no update has run. Import or initialise them again "
                        "(zinf-shard import refuses values that are not finite)");
    throw DataError(what + committed + " stays committed at step " + std::to_string(at) +
                    ": its weights are finite, but give a loss that is not (lower --lr or raise --warmup, or "
                    "start again from an earlier copy)");
}

}  // namespace

void run(Trainer& t, comm::Communicator& comm, const data::Loader& train, const data::Loader* val, const Cadence& c,
         const StepSink& emit) {
    const std::string& committed = t.options().manifest_path;
    const bool lead = comm.rank() == 0;
    // The last commit whose weights a forward pass found to give a finite
    // loss: where a diverged run goes back to.
    std::optional<shard::Manifest> good;
    // Commits the current state once its weights give a finite loss (one
    // forward pass over a training batch): a run never ends with weights
    // the next run cannot use.
    // Pipelined (Options::pipeline): a step's line goes out once its update
    // is committed, during the next step (or when the loop must settle it:
    // a validation, a checkpoint, a stop, the last step). A line that could
    // not be written stops the run as below.
    std::exception_ptr output_failed;
    auto emit_finished = [&] {
        if (auto done = t.finished(); done && lead) try {
                emit(*done, std::nullopt);
            } catch (const Error&) {
                if (!output_failed) output_failed = std::current_exception();
            }
    };
    auto save_checked = [&] {
        t.settle();
        emit_finished();
        std::optional<shard::Manifest> before;
        if (committed_step(t.manifest()) == t.step_count()) before = t.manifest();
        const double loss = t.evaluate(train, 1);
        if (!std::isfinite(loss)) {
            StepLog log;
            log.step = t.step_count() + 1;
            log.loss = loss;
            diverged(t, log, good, committed);
        }
        if (before) good = std::move(before);
        t.save();
    };
    // A batch that cannot be read (the token file truncated or replaced
    // under the run, or a failed read): nothing of that step was taken, so
    // the steps so far are committed as an interrupt commits them, and the
    // error (65 or 74, naming the file and offset) is reported.
    try {
        for (std::uint64_t s = t.step_count(); s < c.steps; ++s) {
            // This step's forward pass runs on the committed weights when the
            // manifest is at the current step.
            std::optional<shard::Manifest> before;
            if (committed_step(t.manifest()) == t.step_count()) before = t.manifest();
            StepLog log;
            try {
                log = t.step(train);
            } catch (const Error&) {
                emit_finished();  // the step before, committed by this one's forward
                throw;
            }
            emit_finished();
            if (std::isfinite(log.loss) && before) good = std::move(before);
            if (log.overflow) {
                if (lead) emit(log, std::nullopt);
                if (!std::isfinite(log.loss)) diverged(t, log, good, committed);
                // fp32 with no loss scaling: a gradient that is not finite will be
                // again on the same batch. Stop rather than repeat the step. The
                // weights before it gave a finite loss: the state before it is whole.
                t.save();
                throw DataError("step " + std::to_string(log.step) + ": the gradient is not finite (loss " +
                                four_places(log.loss) + "): training diverged; " + committed + " is committed at step " +
                                std::to_string(t.step_count()) +
                                ", the last step, whose weights gave a finite loss (lower --lr or raise --warmup)");
            }
            std::optional<double> val_loss;
            const bool evaluating = c.eval_every && (log.step % c.eval_every == 0 || log.step == c.steps);
            const bool checkpoint = c.checkpoint_every && log.step % c.checkpoint_every == 0 && log.step != c.steps;
            // A pipelined step's line waits for its commit, unless one of
            // these needs it now.
            bool held = log.update_pending, settled_now = false;
            if (held && (evaluating || checkpoint || log.step == c.steps)) {
                t.settle();
                held = false;
                settled_now = true;
            }
            // (cut short by an interrupt: no validation loss, the stop below)
            if (evaluating) val_loss = t.evaluate(*val, c.eval_batches, c.stop);
            if (checkpoint) {
                t.save();
                if (lead) log::info("checkpoint committed at step " + std::to_string(log.step));
            }
            // A failed write of the step line (a closed pipe, a full disk) stops
            // the run like an interrupt: every rank saves together, then rank 0
            // reports the write's error.
            if (!held) {
                std::optional<StepLog> done;
                if (log.update_pending) done = t.finished();
                // Settled here, it ran under no backward of the next step.
                if (done && settled_now) done->update_under_backward = false;
                if (lead) try {
                        emit(done ? *done : log, val_loss);
                    } catch (const Error&) {
                        if (!output_failed) output_failed = std::current_exception();
                    }
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
                emit_finished();
                if (output_failed) std::rethrow_exception(output_failed);
                if (lead) log::warn("interrupted: checkpoint committed at step " + std::to_string(t.step_count()) +
                                    "; continue with --resume");
                throw Interrupted("interrupted at step " + std::to_string(t.step_count()));
            }
        }
        save_checked();
    } catch (const Error&) {
        if (!t.input_failed()) throw;
        t.save();
        emit_finished();
        if (lead)
            log::warn("the training data could not be read: checkpoint committed at step " +
                      std::to_string(t.step_count()) + "; continue with --resume once the data is whole again");
        throw;
    }
}

}  // namespace zinf::train
