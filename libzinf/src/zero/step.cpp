// The optimizer's step (zero.hpp): gradients handed over, the global norm,
// the update (all at once, or tensor by tensor while backward runs), and the
// commit by manifest.
#include "optimizer.hpp"

#include <zinf/zero.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace zinf::zero {

using Impl = Optimizer::Impl;

using detail::Role;

void Impl::scalars(double grad_scale, optim::Scalars (&sc)[2]) const {
    optim::AdamW h = opts.adamw;
    h.lr = lr;
    sc[0] = optim::Scalars::make(h, step + 1, grad_scale, true);
    sc[1] = optim::Scalars::make(h, step + 1, grad_scale, false);
}

void Impl::put(std::size_t t, std::span<const float> f32, std::span<const std::uint16_t> b16) {
    if (pend && !under_backward())
        throw InternalError("put_gradient: the last step's update is still under way; settle() it first "
                            "(Engine::settle, before the next step's backward)");
    // (a pipelined update under way holds `broken` until its commit)
    if (broken && !pend) throw InternalError("an earlier step failed half-way: open the optimizer again from the manifest");
    if (t >= tensor_count)
        throw InternalError("put_gradient: tensor " + std::to_string(t) + " of " + std::to_string(tensor_count));
    const std::string& name = m.tensors[t].name;
    const shard::Owned own = shard::owned(m.tensors[t].numel, m.opts.dp, rank);
    const std::size_t n = f32.empty() ? b16.size() : f32.size();
    if (n != own.count)
        throw InternalError("put_gradient: " + name + ": " + std::to_string(n) + " elements, rank " +
                            std::to_string(rank) + " holds " + std::to_string(own.count));
    {
        std::lock_guard lk(mu);
        if (have_grad[t])
            throw InternalError("put_gradient: " + name + " (rank " + std::to_string(rank) +
                                ") handed over twice in one step");
        // The first gradient of a step fixes its scalars (overlap updates
        // start now; set_lr is refused until the step is done).
        if (std::none_of(have_grad.begin(), have_grad.end(), [](bool b) { return b; })) {
            // The last step's pipelined update still running (a second
            // gradient scratch): the generation this step writes is the one
            // that update's commit frees, so this step neither prepares it
            // nor speculates into it (settle() prepares it); its read-ahead
            // reads what that update writes, chunk by chunk once written.
            const bool after = pend;
            if (!after) {
                scalars(1 / spec_loss_scale, spec_sc);
                prepare_step();
                upd_slot = put_slot;
            }
            // A step after a clipped or skipped one is likely clipped too,
            // and a redo costs a whole second pass: it runs after backward,
            // from what is read ahead now.
            spec_off = after || in_place || last_clipped;
            // Parameters held in memory: what a speculative update
            // overwrites is kept (p_undo), in memory taken by the first
            // step that speculates and given back once one does not (a run
            // whose steps are all clipped never holds it). Refused by the
            // host now, this step does not speculate.
            if (!spec_off && roles[Role::param].present && !roles[Role::param].file && !p_undo.data()) try {
                    p_undo = pool.pin(roles[Role::param].end, "optimizer's undo copy of the parameters");
                } catch (const std::exception& e) {
                    log::warn(std::string("optimizer: this step's update waits for the norm (no room for the "
                                          "undo copy of the parameters a speculative update needs): ") + e.what());
                    spec_off = true;
                }
            if (spec_off) start_readahead();
        }
    }
    const double sq = f32.empty() ? optim::sum_squares(b16, opts.kernel) : optim::sum_squares(f32, opts.kernel);

    // Stored in the gradient's dtype, padding zero.
    detail::RoleState& g = roles[Role::grad];
    auto fill = [&](std::uint64_t e0, std::span<std::byte> out) {
        const std::uint64_t e1 = e0 + out.size() / g.dt, real = std::min<std::uint64_t>(e1, std::max(e0, n));
        const std::size_t k = static_cast<std::size_t>(real - std::min(e0, real));
        if (g.dtype == shard::DType::fp32) {
            auto* o = reinterpret_cast<float*>(out.data());
            if (!f32.empty()) std::copy_n(f32.data() + e0, k, o);
            else from_bf16(b16.subspan(e0, k), std::span(o, k));
        } else {
            auto* o = reinterpret_cast<std::uint16_t*>(out.data());
            if (!b16.empty()) std::copy_n(b16.data() + e0, k, o);
            else to_bf16(f32.subspan(e0, k), std::span(o, k));
        }
        std::fill(out.begin() + static_cast<std::ptrdiff_t>(k * g.dt), out.end(), std::byte{0});
    };
    const std::uint64_t bytes = per(t) * g.dt;
    if (!g.file) {
        fill(0, std::span<std::byte>(grad_mem(put_slot) + g.offset[t], bytes));
    } else {
        mem::Stream s(engine, pool, {.buffers = opts.overlap ? 2u : 0u, .who = "gradient"});
        s.write(g.gen_f[put_slot], g.offset[t], align_up(bytes, alignment),
                [&](std::uint64_t at, std::span<std::byte> piece) { fill(at / g.dt, piece); });
    }

    std::lock_guard lk(mu);
    if (g.file) grad_written += align_up(bytes, alignment);
    else if (grad_scratch) grad_held += align_up(bytes, alignment);
    grad_sq[t] = sq;
    have_grad[t] = true;
    if (!speculative) return;
    // Speculating further is wasted once this rank's own gradients say the
    // step will be skipped (not finite) or clipped (their norm alone is past
    // the limit; the global norm is at least theirs).
    double part = 0;
    for (std::size_t u = 0; u < tensor_count; ++u)
        if (have_grad[u]) part += grad_sq[u];
    if (!std::isfinite(part)) {
        spec_off = true;
    } else if (opts.grad_clip > 0 && optim::clip_coefficient(std::sqrt(part) / spec_loss_scale, opts.grad_clip) < 1) {
        // Clipped for certain: the update redoes every tensor after
        // backward, from what is read ahead from now on.
        spec_off = true;
        start_readahead();
    }
    queue.push_back(t);
    cv.notify_all();
}

// Read-ahead: a step that does not speculate starts it (under mu) once it
// knows; the overlap thread reads on between the gradients' hand-overs.
void Impl::start_readahead() {
    if (ra_chunks == 0 || ra_on) return;
    ra_on = true;
    ra_after_pend = pend;
    if (ra_after_pend)
        for (Role r : ra_roles) ra_gen[r] = pend_gen[r];
    cv.notify_all();
}

bool Impl::chunk_written(std::size_t c) const {
    for (std::size_t t : chunk_tensors[c])
        if (!pend_ready[t]) return false;
    return true;
}

bool Impl::wait_written(std::unique_lock<std::mutex>& lk) {
    const std::size_t c = ra_issued;
    const std::uint64_t epoch = handover_epoch;
    bool ok = false;
    lk.unlock();
    {
        std::unique_lock pl(pend_mu);
        // (a hand-over started afresh since, its read-ahead is another's)
        pend_cv.wait(pl, [&] { return pend_done || chunk_written(c) || epoch != handover_epoch; });
        ok = chunk_written(c);
    }
    lk.lock();
    return ok || epoch != handover_epoch;
}

// The overlap thread, under mu: the reads of the chunks up to a few ahead
// of the first not yet checked issued, then that one waited for and checked
// against the xxh3 its generation must have (as the update checks its own
// reads, in the same order; the hashes of a partition cut between chunks go
// on where the read-ahead stops). Once ra_stop is set only what is issued is
// finished. An error is the step's (worker_error), after every read still in
// flight into ra_mem is done.
void Impl::read_ahead(std::unique_lock<std::mutex>& lk) {
    // The memory is taken by the first step that needs it, not at open: a
    // run whose steps all speculate never holds it. Pinned off the lock (it
    // faults every page in); where the host refuses it now, the run goes on
    // without read-ahead, and says so.
    if (!ra_mem.data()) {
        lk.unlock();
        mem::Pinned got;
        std::string refused;
        try {
            got = pool.pin(ra_bytes, "optimizer's read-ahead");
        } catch (const std::exception& e) {
            refused = e.what();
        }
        lk.lock();
        if (!refused.empty()) {
            log::warn("optimizer: no read-ahead for the rest of the run: " + refused);
            ra_chunks = 0;
        } else {
            ra_mem = std::move(got);
        }
        cv.notify_all();
        return;  // the overlap thread's loop looks again at what is left to read
    }
    const std::size_t depth = std::max<std::size_t>(slots, 2);
    std::size_t from = ra_issued, to = ra_stop ? ra_issued : std::min(ra_chunks, ra_done + depth);
    if (ra_after_pend && to > from) {
        // After the last step's pipelined update: only chunks it has written.
        std::size_t w = from;
        {
            std::lock_guard pl(pend_mu);
            while (w < to && chunk_written(w)) ++w;
        }
        if (w == from && ra_done == ra_issued) {
            // Nothing in flight, the next chunk not written yet: wait for it
            // (or for that update's end: failed, it writes no more).
            if (!wait_written(lk)) ra_stop = true;
            cv.notify_all();
            return;
        }
        to = w;
    }
    const std::size_t i = ra_done;
    ra_issued = to;
    lk.unlock();
    std::uint64_t read = 0;
    try {
        for (std::size_t c = from; c < to; ++c)
            for (std::size_t j = 0; j < file_roles.size(); ++j) {
                const Role r = file_roles[j];
                if (!is_ra_role(r)) continue;
                detail::RoleState& rs = roles[r];
                const Chunk& ch = all_chunks[c];
                const std::span<std::byte> dst(ra_mem.data() + ra_at[c][j], ch.hi[r] - ch.lo[r]);
                ra_tickets[c].push_back(engine.read(rs.gen_f[ra_after_pend ? ra_gen[r] : rs.cur], ch.lo[r], dst));
                read += dst.size();
            }
        for (auto t : ra_tickets[i]) engine.wait(t);
        ra_tickets[i].clear();
        for (std::size_t j = 0; j < file_roles.size(); ++j)
            if (const Role r = file_roles[j]; is_ra_role(r))
                check_read(all_chunks[i], r, ra_mem.data() + ra_at[i][j] - all_chunks[i].lo[r],
                           ra_after_pend ? ra_gen[r] : -1, ra_after_pend ? &roles[r].new_hash : nullptr);
    } catch (...) {
        std::exception_ptr e = std::current_exception();
        for (std::size_t c = i; c < to; ++c) {
            for (auto t : ra_tickets[c]) try {
                    engine.wait(t);
                } catch (...) {
                }
            ra_tickets[c].clear();
        }
        lk.lock();
        totals.readahead += read;
        totals.read += read;
        if (!worker_error) worker_error = e;
        ra_done = ra_issued = to;
        cv.notify_all();
        return;
    }
    lk.lock();
    totals.readahead += read;
    totals.read += read;
    ra_done = i + 1;
    cv.notify_all();
}

// step(): no more reads ahead; waits for those under way. The chunks read
// and checked.
std::size_t Impl::stop_readahead() {
    std::unique_lock lk(mu);
    ra_stop = true;
    cv.notify_all();
    cv.wait(lk, [&] { return ra_done == ra_issued; });
    return worker_error ? 0 : ra_done;
}

// Overlap: whatever gradients have arrived, in file order, streamed as one
// run of chunks, until the step has every tensor; between them, the
// read-ahead of a step that does not speculate.
void Impl::work() {
    std::unique_lock lk(mu);
    auto reading_ahead = [&] {
        return ra_on && !worker_error && ra_done < (ra_stop ? ra_issued : ra_chunks);
    };
    for (;;) {
        cv.wait(lk, [&] { return quit || !queue.empty() || reading_ahead(); });
        if (quit) {
            // A step abandoned (its start refused): no read may still fill
            // ra_mem once it is gone.
            for (auto& ts : ra_tickets)
                for (auto t : ts) try {
                        engine.wait(t);
                    } catch (...) {
                    }
            return;
        }
        if (queue.empty()) {
            read_ahead(lk);
            continue;
        }
        std::vector<std::size_t> batch(queue.begin(), queue.end());
        queue.clear();
        const bool skip = worker_error != nullptr || spec_off;
        const optim::Scalars sc[2] = {spec_sc[0], spec_sc[1]};
        lk.unlock();
        std::sort(batch.begin(), batch.end());
        if (!skip) try {
                Timer t;
                stream(cut(batch), sc, totals, true);
                totals.speculative += t.seconds();
                for (std::size_t u : batch) speculated[u] = true;
            } catch (...) {
                lk.lock();
                worker_error = std::current_exception();
                lk.unlock();
            }
        lk.lock();
        done_tensors += batch.size();
        cv.notify_all();
    }
}

// Where this step writes each streamed state. Two generations at most: the
// one the manifest names is never written; when the current values are in
// it (every state streamed, or just after a save), the step writes the
// other, else it updates the current one in place (state held in memory
// keeps the manifest at the last save, and the current generation is
// nothing a crash could lose). Only a step that writes the other
// generation can speculate: a redo reads the current one.
void Impl::prepare_step() {
    in_place = false;
    for (Role r : file_roles) {
        if (r == Role::grad) continue;
        auto& rs = roles[r];
        if (rs.cur != rs.committed) {
            rs.next = rs.cur;
            in_place = true;
        } else {
            rs.next = rs.cur == 0 ? 1 : 0;
        }
        gen_file(rs, rs.next, true);
    }
}

// Every rank learns whether any cannot go on before the step's collectives,
// so that one rank's refusal is every rank's error, not a wait.
void Impl::check_entry(const char* what, const std::exception_ptr& local) {
    comm::agree(comm, local, std::string(what) + " did not start on every rank; nothing was written");
}

// Every rank learns whether the step can start on all of them.
void Impl::check_step(double loss_scale) {
    std::exception_ptr refused;
    try {
        if (broken) throw InternalError("an earlier step failed half-way: open the optimizer again from the manifest");
        if (!(loss_scale > 0) || !std::isfinite(loss_scale))
            throw UsageError("the loss scale must be finite and > 0, not " + std::to_string(loss_scale));
        std::lock_guard lk(mu);
        for (std::size_t t = 0; t < tensor_count; ++t)
            if (!have_grad[t])
                throw InternalError("step: no gradient for " + m.tensors[t].name + " (rank " + std::to_string(rank) +
                                    "); hand every tensor's over with put_gradient first");
    } catch (...) {
        refused = std::current_exception();
    }
    check_entry("the optimizer step", refused);
}

// The sum of squares of every rank's gradients, once the updates
// overlapped with backward are done.
double Impl::global_sum_squares() {
    if (speculative) {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return done_tensors == tensor_count; });
    }
    const double local = std::accumulate(grad_sq.begin(), grad_sq.end(), 0.0);
    double total = local;
    comm.allreduce(std::as_bytes(std::span(&local, 1)), std::as_writable_bytes(std::span(&total, 1)),
                   comm::DType::f64);
    return total;
}

// Skipped: the speculative writes went to a generation nothing names;
// parameters held in memory are put back.
void Impl::skip_step(const StepReport& rep) {
    std::exception_ptr failed;
    try {
        stop_flushing();
        if (worker_error) std::rethrow_exception(worker_error);
        if (rep.speculated) undo_speculation();
    } catch (...) {
        broken = true;
        failed = std::current_exception();
    }
    comm::agree(comm, failed, "the skipped step's speculative update could not be undone; the manifest names the "
                              "state before it");
    last_clipped = true;
}

// What the overlap left to update with the step's scalars `sc`: every
// tensor (no overlap, or scalars other than it assumed: clipped, or scaled
// other than assumed, redone from the current generation, still on disk),
// or the tensors it did not reach.
void Impl::update_rest(const optim::Scalars (&sc)[2], StepReport& rep, std::size_t ra, Totals& tot,
                       const std::vector<bool>& spec) {
    if (!speculative || rep.speculated == 0) {
        if (!speculative) prepare_step();
        stream(all_chunks, sc, tot, false, ra);
        return;
    }
    if (std::memcmp(sc, spec_sc, sizeof sc) != 0) {
        rep.redo = true;
        stream(all_chunks, sc, tot, false, ra);
        return;
    }
    std::vector<std::size_t> rest;
    for (std::size_t t = 0; t < tensor_count; ++t)
        if (!spec[t]) rest.push_back(t);
        else if (pend_marking) pend_mark(t);  // written during the backward, synced with the rest
    stream(cut(rest), sc, tot);
}

// The update, synced to disk, and the step made the current state: on
// every rank or (an error) on none.
void Impl::update_step(StepReport& rep, double loss_scale, std::size_t ra) {
    broken = true;  // until the step is whole again
    std::exception_ptr failed;
    std::vector<Role> written;
    for (Role r : file_roles)
        if (r != Role::grad) written.push_back(r);
    Timer c;
    try {
        optim::Scalars sc[2];
        scalars(rep.clip / loss_scale, sc);
        // A speculative update that failed before it finished a tensor
        // still failed: its error is the step's, never dropped for a redo.
        if (worker_error) std::rethrow_exception(worker_error);
        update_rest(sc, rep, ra, totals, speculated);
        c.reset();
        stop_flushing();
        for (Role r : written) engine.sync(roles[r].gen_f[roles[r].next]);
    } catch (...) {
        failed = std::current_exception();
        try {
            stop_flushing();  // the step's error is the one to report
        } catch (...) {
        }
    }
    comm::agree(comm, failed, "the step was not committed; the manifest names the state before it");
    advance(written);
    broken = false;
    rep.commit_seconds = c.seconds();
}

// The step is over, updated or skipped: the next one starts afresh.
void Impl::next_step(double loss_scale) {
    // The next step does not speculate: the undo copy goes back.
    if (last_clipped) p_undo = mem::Pinned();
    reset_handover(loss_scale);
}

// The hand-over of the next step's gradients starts afresh: at the step's
// end, or (pipelined) when its update is launched, the next step's
// hand-over going on beside it.
void Impl::reset_handover(double loss_scale) {
    std::lock_guard lk(mu);
    {
        std::lock_guard pl(pend_mu);
        ++handover_epoch;
    }
    pend_cv.notify_all();  // a read-ahead waiting for the update before goes back to its loop
    ra_after_pend = false;
    std::fill(have_grad.begin(), have_grad.end(), false);
    std::fill(speculated.begin(), speculated.end(), false);
    done_tensors = 0;
    grad_written = grad_held = 0;
    ra_on = ra_stop = false;
    ra_issued = ra_done = 0;
    totals = {};
    spec_loss_scale = loss_scale;  // what the next step's speculation assumes
}

// ---------------------------------------------------------------------------
// The pipeline (OptimizerOptions::pipeline): the update after the norm runs
// on a thread of its own while the caller's next step starts; the caller
// settles it (syncs and commits) at one point on every rank.

void Impl::pend_mark(std::size_t t) {
    {
        std::lock_guard lk(pend_mu);
        pend_ready[t] = true;
    }
    pend_cv.notify_all();
}

// The caller's thread, in param_source: until tensor t's new values are
// written, or the update is over without them (it failed: its error).
void Impl::pend_wait(std::size_t t) {
    std::unique_lock lk(pend_mu);
    if (!pend_ready[t] && !pend_done) {
        Timer w;
        pend_cv.wait(lk, [&] { return pend_ready[t] || pend_done; });
        pend_waited += w.seconds();
    }
    if (pend_ready[t]) return;
    if (pend_error) std::rethrow_exception(pend_error);
    throw InternalError("param_source: " + m.tensors[t].name + " was not written by the step's update");
}

// The update with the step's scalars (fixed now, on the caller's thread:
// the rate and step of this step), then the sync of what it wrote; the
// commit waits for settle(). The gradients' hand-over is open again for
// set_lr (the next step's), not for put_gradient until then.
void Impl::launch_update(StepReport& rep, double loss_scale, std::size_t ra) {
    broken = true;  // until the step is committed
    optim::Scalars sc[2];
    scalars(rep.clip / loss_scale, sc);
    pend_rep = rep;
    pend_loss_scale = loss_scale;
    {
        std::lock_guard pl(pend_mu);
        pend_ready.assign(tensor_count, false);
        pend_done = false;
    }
    pend_error = nullptr;
    pend_sync = pend_waited = pend_elapsed = 0;
    pend_marking = true;
    for (Role r : file_roles) pend_gen[r] = roles[r].next;
    // This step's figures and speculation go with its update; the next
    // step's hand-over starts now, beside it (into the other gradient
    // scratch where there are two).
    std::exception_ptr werr;
    {
        std::lock_guard lk(mu);
        werr = worker_error;
        pend_totals = totals;
        pend_speculated = speculated;
        pend_grad_written = grad_written;
        pend_grad_held = grad_held;
    }
    reset_handover(loss_scale);
    if (under_backward()) put_slot ^= 1;
    pend = true;
    pend_clock.reset();
    pend_thread = std::thread([this, sc0 = sc[0], sc1 = sc[1], ra, werr] {
        const optim::Scalars s[2] = {sc0, sc1};
        std::exception_ptr failed;
        try {
            if (werr) std::rethrow_exception(werr);
            update_rest(s, pend_rep, ra, pend_totals, pend_speculated);
            Timer c;
            stop_flushing();
            for (Role r : file_roles)
                if (r != Role::grad) engine.sync(roles[r].gen_f[roles[r].next]);
            pend_sync = c.seconds();
        } catch (...) {
            failed = std::current_exception();
            try {
                stop_flushing();  // the step's error is the one to report
            } catch (...) {
            }
        }
        {
            std::lock_guard lk(pend_mu);
            pend_error = failed;
            pend_done = true;
            pend_elapsed = pend_clock.seconds();
        }
        pend_cv.notify_all();
    });
}

// Every rank at the same point: the update done and synced on all of them,
// or (an error on any) on none; then the commit, in step order (the step
// before was settled before this one started).
std::optional<StepReport> Impl::settle() {
    if (!pend) return std::nullopt;
    double settle_waited = 0;
    {
        std::unique_lock lk(pend_mu);
        if (!pend_done) {
            Timer w;
            pend_cv.wait(lk, [&] { return pend_done; });
            settle_waited = w.seconds();
        }
    }
    pend_thread.join();
    pend_marking = false;
    StepReport rep = pend_rep;
    Timer c;
    try {
        comm::agree(comm, pend_error, "the step was not committed; the manifest names the state before it");
        std::vector<Role> written;
        for (Role r : file_roles)
            if (r != Role::grad) written.push_back(r);
        // Under mu: the next step's hand-over may be under way (a second
        // gradient scratch), and its first gradient looks at `pend` and the
        // generations there.
        std::lock_guard lk(mu);
        advance(written);
        // The generation the next step writes is the one this commit freed.
        prepare_step();
        upd_slot = put_slot;
        pend = false;
    } catch (...) {
        pend = false;
        throw;
    }
    broken = false;
    rep.commit_seconds = pend_sync + c.seconds();
    rep.update_pipelined_seconds = pend_elapsed;
    rep.update_waited_seconds = pend_waited;
    rep.settle_waited_seconds = settle_waited;
    rep.pending = false;
    finish_report(rep, pend_loss_scale, pend_totals, pend_grad_written, pend_grad_held, true);
    return rep;
}

// The step's figures from its streams; the next step starts afresh (a
// pipelined one's next step started when its update was launched).
void Impl::finish_report(StepReport& rep, double loss_scale, const Totals& tot, std::uint64_t gw, std::uint64_t gh,
                         bool pipelined) {
    rep.update_seconds = tot.update;
    rep.wait_seconds = tot.wait;
    rep.bytes_read = tot.read;
    rep.bytes_written = tot.written;
    rep.grad_bytes_read = tot.grad_read;
    rep.grad_bytes_written = gw;
    rep.grad_memory_bytes = gh;
    rep.chunks = tot.chunks;
    rep.chunk_bytes = piece_bytes;
    rep.readahead_bytes = tot.readahead;
    rep.readahead_used_bytes = tot.readahead_used;
    rep.device_update = on_device;
    rep.update_under_backward = pipelined && under_backward() && last_clipped;  // settle_after_backward()
    if (pipelined) {
        if (last_clipped) p_undo = mem::Pinned();
    } else {
        next_step(loss_scale);
    }
    rep.step = step;
}

StepReport Impl::run_step(double loss_scale) {
    Timer all;
    StepReport rep;
    if (pend) {
        std::exception_ptr refused = std::make_exception_ptr(
            InternalError("step: the last step's update is still under way; settle() it first"));
        check_entry("the optimizer step", refused);
    }
    check_step(loss_scale);
    flush_written();  // what the backward's updates wrote, beside the rest of the step
    const double total = global_sum_squares();
    const std::size_t ra = speculative ? stop_readahead() : 0;
    for (std::size_t t = 0; t < tensor_count; ++t) rep.speculated += speculated[t];
    rep.overlap_seconds = totals.speculative;
    rep.grad_norm = std::sqrt(total) / loss_scale;
    rep.overflow = !std::isfinite(total);
    if (rep.overflow) {
        skip_step(rep);
    } else {
        rep.clip = optim::clip_coefficient(rep.grad_norm, opts.grad_clip);
        last_clipped = rep.clip < 1;
        if (opts.pipeline) {
            rep.pending = true;
            launch_update(rep, loss_scale, ra);
            rep.step = step;
            rep.seconds = all.seconds();
            return rep;
        }
        update_step(rep, loss_scale, ra);
    }
    finish_report(rep, loss_scale, totals, grad_written, grad_held, false);
    rep.seconds = all.seconds();
    return rep;
}

// The roles a step wrote become the current ones, at the next step:
// committed (every state on nvme), or, for state held in memory, which
// reaches the disk only by save(), rotated around the manifest's files (the
// manifest stays at the last save).
void Impl::advance(const std::vector<Role>& written) {
    if (commit_steps) {
        std::vector<std::pair<Role, int>> changed;
        for (Role r : written) changed.emplace_back(r, roles[r].next);
        commit(changed, step + 1);
        return;
    }
    for (Role r : written) {
        roles[r].cur = roles[r].next;
        roles[r].cur_hash = roles[r].new_hash;
    }
    ++step;
}

// Every rank's new xxh3s to every rank; rank 0 writes the manifest naming
// the new generations; all agree before anyone takes the old files as free
// space. A failure leaves the optimizer broken: the manifest on disk names
// one state or the other, and only reopening from it is safe.
void Impl::commit(const std::vector<std::pair<Role, int>>& changed, std::uint64_t new_step) {
    if (changed.empty()) {
        step = new_step;
        return;
    }
    const unsigned dp = m.opts.dp;
    std::vector<std::int64_t> mine, all(changed.size() * tensor_count * dp);
    for (auto [r, g] : changed)
        for (std::size_t t = 0; t < tensor_count; ++t) mine.push_back(static_cast<std::int64_t>(roles[r].new_hash[t]));
    comm.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), comm::DType::i64);

    struct Old {
        shard::Partition* p;
        std::string file;
        std::optional<std::uint64_t> xxh3;
        std::uint64_t step;
    };
    std::vector<Old> old;
    old.reserve(all.size());
    std::size_t i = 0;
    for (unsigned q = 0; q < dp; ++q)
        for (auto [r, g] : changed)
            for (std::size_t t = 0; t < tensor_count; ++t) {
                shard::Partition* p = record(t, q, roles[r].state);
                old.push_back({p, p->file, p->xxh3, p->step});
                p->file = shard::generation_base(p->file) + shard::kGenerations[g];
                p->xxh3 = static_cast<std::uint64_t>(all[i++]);
                p->step = new_step;
            }
    std::exception_ptr failed;
    if (rank == 0) try {
            shard::save_manifest(m, path);
        } catch (...) {
            failed = std::current_exception();
        }
    try {
        comm::agree(comm, failed,
                    "the manifest was not committed, or not durably; open the optimizer again from " + path);
    } catch (...) {
        for (auto& o : old) {
            o.p->file = o.file;
            o.p->xxh3 = o.xxh3;
            o.p->step = o.step;
        }
        broken = true;
        throw;
    }
    for (auto [r, g] : changed) {
        roles[r].cur = roles[r].committed = g;
        roles[r].cur_hash = roles[r].new_hash;
    }
    step = new_step;
}

// A skipped step after speculative updates: the files they wrote are named
// by nothing, but the working parameters they handed out (to the listener, and
// the memory-held bf16 copy) are put back to the current generation's.
void Impl::undo_speculation() {
    const Role out = roles[Role::param].present ? Role::param : Role::master;
    detail::RoleState& rs = roles[out];
    for (std::size_t t = 0; t < tensor_count; ++t) {
        if (!speculated[t]) continue;
        const std::uint64_t bytes = per(t) * rs.dt;
        if (!rs.file) {
            std::memcpy(rs.image.data() + rs.offset[t], p_undo.data() + rs.offset[t], bytes);
            if (listener) listener->updated(t, 0, rs.image.bytes().subspan(rs.offset[t], bytes));
            continue;
        }
        if (!listener) continue;
        // Through one buffer of the pool, checked against its hash as read.
        mem::Lease lease = pool.lease("optimizer: parameters put back after a skipped step");
        const std::uint64_t B = align_down(lease.size(), alignment);
        Xxh3Stream h;
        for (std::uint64_t at = 0; at < bytes; at += B) {
            const std::uint64_t n = std::min(B, bytes - at);
            auto buf = lease.bytes().first(align_up(n, alignment));
            engine.wait(engine.read(gen_file(rs, rs.cur, false), rs.offset[t] + at, buf));
            h.update(buf.first(n));
            listener->updated(t, at / rs.dt, buf.first(n));
        }
        if (h.digest() != rs.cur_hash[t])
            throw DataError(m.tensors[t].name + " rank " + std::to_string(rank) + " " + rs.state + ": " +
                                rs.name(rs.cur) + " changed on disk during the step",
                            {.path = m.path_of(rs.name(rs.cur)), .offset = rs.offset[t],
                             .rank = static_cast<int>(rank)});
    }
}

void Impl::save() {
    std::exception_ptr refused;
    if (broken)
        refused = std::make_exception_ptr(
            InternalError("an earlier step failed half-way: open the optimizer again from the manifest"));
    {
        std::lock_guard lk(mu);
        if (!refused && std::any_of(have_grad.begin(), have_grad.end(), [](bool b) { return b; }))
            refused = std::make_exception_ptr(InternalError("save: a step is under way (gradients handed over)"));
    }
    if (!refused && pend)
        refused = std::make_exception_ptr(InternalError("save: the last step's update is not settled"));
    check_entry("save", refused);
    std::vector<std::pair<Role, int>> changed;
    std::exception_ptr failed;
    try {
        for (Role r : {Role::master, Role::exp_avg, Role::exp_avg_sq, Role::param}) {
            auto& rs = roles[r];
            if (!rs.present) continue;
            if (rs.file) {
                // Synced by its step; only the manifest must name it.
                if (rs.cur != rs.committed) {
                    rs.new_hash = rs.cur_hash;
                    changed.emplace_back(r, rs.cur);
                }
                continue;
            }
            const int g = rs.committed == 0 ? 1 : 0;
            io::File f = open_file(rs.name(g), true, rs.end);
            // On the device: its bytes through page-locked memory, for the save only.
            mem::Pinned held;
            const std::span<const std::byte> bytes = rs.dev ? host_copy(rs, held) : rs.image.bytes().first(rs.end);
            engine.wait(engine.write(f, 0, bytes));
            engine.sync(f);
            f.close();
            for (std::size_t t = 0; t < tensor_count; ++t)
                rs.new_hash[t] = xxh3(bytes.subspan(rs.part[t]->offset, rs.part[t]->bytes));
            changed.emplace_back(r, g);
        }
    } catch (...) {
        failed = std::current_exception();
    }
    comm::agree(comm, failed, "nothing was saved; the manifest names the state before");
    commit(changed, step);
}

void ParamListener::updated_on_device(std::size_t tensor, std::uint64_t, std::span<const std::byte>, device::Stream&) {
    throw InternalError("the optimizer updated tensor " + std::to_string(tensor) +
                        " on the device, but its listener takes host memory only");
}

// ---------------------------------------------------------------------------
Optimizer::Optimizer(shard::Manifest& m, comm::Communicator& comm, io::Engine& engine, mem::PinnedPool& pool,
                     const OptimizerOptions& opts) {
    // Every rank opens, or none does (a rank left out would wait in the
    // first step's collectives until its deadline).
    std::exception_ptr failed;
    try {
        impl_ = std::make_unique<Impl>(m, comm, engine, pool, opts);
    } catch (...) {
        failed = std::current_exception();
    }
    comm::agree(comm, failed, "the optimizer was not opened");
    impl_->agree_grad_slots();
}
Optimizer::~Optimizer() = default;

unsigned Optimizer::rank() const { return impl_->rank; }
std::uint64_t Optimizer::step_count() const { return impl_->step; }
std::uint64_t Optimizer::chunk_bytes() const { return impl_->piece_bytes; }
std::size_t Optimizer::read_depth() const { return impl_->ahead; }
std::size_t Optimizer::write_depth() const { return impl_->behind; }
std::uint64_t Optimizer::readahead_bytes() const { return impl_->ra_bytes; }
std::uint64_t Optimizer::update_read_bytes() const { return impl_->ra_state_bytes; }
std::uint64_t Optimizer::gradient_scratch_bytes() const {
    return impl_->grad_scratch ? impl_->roles[Role::grad].end * static_cast<std::uint64_t>(impl_->grad_slots) : 0;
}
bool Optimizer::update_under_backward() const { return impl_->opts.pipeline && impl_->under_backward(); }
bool Optimizer::settle_after_backward() const {
    // (last_clipped: the pending step's, set by its step(), before the next)
    return impl_->pend && impl_->under_backward() && impl_->last_clipped;
}
bool Optimizer::gradient_scratch_in_memory() const { return impl_->grad_scratch && !impl_->roles[Role::grad].file; }
bool Optimizer::updates_on_device() const { return impl_->on_device; }

void Optimizer::set_lr(double lr) {
    optim::AdamW h = impl_->opts.adamw;
    h.lr = lr;
    h.validate();
    std::lock_guard lk(impl_->mu);
    if (std::any_of(impl_->have_grad.begin(), impl_->have_grad.end(), [](bool b) { return b; }))
        throw InternalError("set_lr: gradients of this step were handed over already; set the rate between steps");
    impl_->lr = lr;
}

void Optimizer::put_gradient(std::size_t tensor, std::span<const float> grad) { impl_->put(tensor, grad, {}); }
void Optimizer::listen(ParamListener* l) {
    // A pipelined update tells the listener of every piece until it is
    // over: a listener that goes waits for it.
    if (impl_->pend) {
        std::unique_lock lk(impl_->pend_mu);
        impl_->pend_cv.wait(lk, [&] { return impl_->pend_done; });
    }
    impl_->listener = l;
}
void Optimizer::put_gradient(std::size_t tensor, std::span<const std::uint16_t> grad_bf16) {
    impl_->put(tensor, {}, grad_bf16);
}

StepReport Optimizer::step(double loss_scale) { return impl_->run_step(loss_scale); }
std::optional<StepReport> Optimizer::settle() { return impl_->settle(); }
bool Optimizer::pending() const { return impl_->pend; }
bool Optimizer::param_ready(std::size_t tensor) {
    Impl& I = *impl_;
    if (!I.pend) return true;
    std::lock_guard lk(I.pend_mu);
    return I.pend_done || I.pend_ready.at(tensor);
}
void Optimizer::save() { impl_->save(); }

Optimizer::ParamSource Optimizer::param_source(std::size_t tensor) {
    Impl& I = *impl_;
    if (tensor >= I.tensor_count) throw InternalError("param_source(): tensor " + std::to_string(tensor));
    auto& rs = I.roles[I.roles[Role::param].present ? Role::param : Role::master];
    ParamSource src;
    src.bytes = I.per(tensor) * rs.dt;
    src.where = I.m.tensors[tensor].name + " rank " + std::to_string(I.rank) + " " + rs.state;
    // A pipelined update under way: its new values once written.
    const bool updating = I.pend;
    if (updating) I.pend_wait(tensor);
    if (rs.dev) {
        src.device = {rs.dev.data() + rs.offset[tensor], src.bytes};
        return src;
    }
    if (!rs.file) {
        src.memory = rs.image.bytes().subspan(rs.offset[tensor], src.bytes);
        return src;
    }
    src.offset = rs.offset[tensor];
    if (updating) {
        src.file = &I.gen_file(rs, rs.next, false);
        src.xxh3 = rs.new_hash[tensor];
        return src;
    }
    src.file = &I.gen_file(rs, rs.cur, false);
    // The manifest's hash while the current generation is the committed one;
    // else the one the step that wrote it computed.
    src.xxh3 = rs.cur_hash[tensor];
    return src;
}

}  // namespace zinf::zero
