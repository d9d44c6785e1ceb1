// The ZeRO-Infinity engine (zero.hpp): its memory reserved and checked up
// front, the hooks, the recorded trace and the prefetcher that replays it,
// and the gradients reduce-scattered and handed to the optimizer as each
// module's backward ends.
#include "infinity.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace zinf::zero {

using detail::kNone;
using Impl = InfinityEngine::Impl;
using Fetch = Impl::Fetch;
using Slot = detail::Slot;

namespace {

// The modules `mod` is nested in that use parameters of their own (a
// TiledLinear around its tiles): their fetches stay live around its own.
std::vector<const Module*> ancestors(std::span<const Module* const> modules, const Module& mod) {
    std::vector<const Module*> out;
    for (const Module* a : modules)
        if (a != &mod && mod.name().size() > a->name().size() && mod.name().starts_with(a->name()) &&
            mod.name()[a->name().size()] == '.')
            out.push_back(a);
    return out;
}

// The numbered block a module is nested in ("h.3" of "h.3.mlp.c_fc",
// "model.layers.3" of "model.layers.3.self_attn.q_proj"); "" for none.
std::string block_of(const std::string& name) {
    for (std::size_t at = 0; at < name.size();) {
        const std::size_t end = std::min(name.find('.', at), name.size());
        if (end > at && std::all_of(name.begin() + at, name.begin() + end, [](char ch) { return ch >= '0' && ch <= '9'; }))
            return end < name.size() ? name.substr(0, end) : std::string();
        at = end + 1;
    }
    return {};
}

}  // namespace

std::vector<detail::ParamState> detail::describe_params(const shard::Manifest& m,
                                                        std::span<const Module* const> modules,
                                                        const InfinityOptions& opts, unsigned rank) {
    const unsigned dp = m.opts.dp;
    std::vector<ParamState> params(m.tensors.size());
    for (std::size_t t = 0; t < params.size(); ++t) {
        ParamState& p = params[t];
        p.tensor = t;
        p.numel = m.tensors[t].numel;
        p.per = shard::owned(p.numel, dp, 0).per;
        p.count = shard::owned(p.numel, dp, rank).count;
        p.dt = shard::dtype_bytes(m.opts.param_dtype);
        p.tier = m.opts.param_tier;
        p.persistent = p.numel < opts.persist_below;
        p.keep_bf16 = opts.keeps_bf16(m, t);
    }
    for (const Module* mod : modules) {
        for (std::size_t t : mod->params()) {
            if (t >= params.size()) throw InternalError("engine: module " + mod->name() + " declares tensor " + std::to_string(t));
            if (params[t].owner) throw InternalError("engine: " + m.tensors[t].name + " declared by two modules");
            params[t].owner = mod;
        }
        for (std::size_t t : mod->external()) {
            if (t >= params.size()) throw InternalError("engine: module " + mod->name() + " uses tensor " + std::to_string(t));
            params[t].shared_grad = true;
            if (opts.persist_shared) params[t].persistent = true;
        }
    }
    for (const auto& p : params)
        if (!p.owner) throw InternalError("engine: no module declares " + m.tensors[p.tensor].name);
    return params;
}

// Each module's gather of every parameter it uses (a fetch gathers a
// subset: its persistent ones only once a step) in the param dtype, and its
// reduce-scatter of the fp32 gradients it declares: the largest of them as
// `bytes_of` lays it flat, rounded to the arena's unit.
detail::Bucket detail::largest_bucket(std::span<const Module* const> modules, std::span<const std::uint64_t> numels,
                                      shard::DType param_dtype, const BucketBytes& bytes_of) {
    const comm::DType wire = param_dtype == shard::DType::bf16 ? comm::DType::bf16 : comm::DType::f32;
    Bucket out;
    for (const Module* mod : modules) {
        std::vector<std::size_t> used;
        for (auto list : {mod->params(), mod->external()})
            for (std::size_t t : list)
                if (std::find(used.begin(), used.end(), t) == used.end()) used.push_back(t);
        std::vector<std::uint64_t> gathered, declared;
        for (std::size_t t : used) gathered.push_back(numels[t]);
        for (std::size_t t : mod->params()) declared.push_back(numels[t]);
        for (const bool grads : {false, true}) {
            const std::uint64_t f = grads ? bytes_of(comm::Kind::reduce_scatter, declared, comm::DType::f32)
                                          : bytes_of(comm::Kind::allgather, gathered, wire);
            if (f > out.bytes) {
                out.bytes = align_up(f, mem::kArenaAlignment);
                out.module = mod->name();
                out.gradients = grads;
            }
        }
    }
    return out;
}

std::uint64_t InfinityEngine::nccl_flat_bytes(std::span<const Module* const> modules,
                                              std::span<const std::uint64_t> numels, unsigned dp,
                                              shard::DType param_dtype) {
    if (dp <= 1) return 0;
    return detail::largest_bucket(modules, numels, param_dtype,
                                  [&](comm::Kind kind, std::span<const std::uint64_t> sizes, comm::DType dtype) {
                                      return laid_flat_bytes(kind, sizes, dtype, dp);
                                  })
        .bytes;
}

InfinityEngine::Need InfinityEngine::need(const shard::Manifest& m, std::span<const Module* const> modules,
                                          const InfinityOptions& opts) {
    const auto params = detail::describe_params(m, modules, opts, 0);
    const unsigned dp = m.opts.dp;
    const bool bf16 = m.opts.param_dtype == shard::DType::bf16;
    Need n;
    for (const auto& p : params) {
        if (p.tier == shard::Tier::gpu) n.reserved += align_up(p.per * p.dt, mem::kArenaAlignment);
        if (p.persistent) n.reserved += detail::values_layout(p, dp, bf16).bytes;
        if (p.shared_grad) n.reserved += align_up(p.numel * 4, mem::kArenaAlignment);
    }
    std::map<std::string, std::uint64_t> by_block;
    for (const Module* mod : modules) {
        auto bytes = [&](const Module& x) { return detail::block_bytes(params, dp, bf16, x, !x.params().empty(), nullptr); };
        std::uint64_t b = bytes(*mod);
        for (const Module* a : ancestors(modules, *mod)) b += bytes(*a);
        if (b > n.largest) {
            n.largest = b;
            n.module = mod->name();
        }
        const std::string block = block_of(mod->name());
        if (!block.empty()) n.block = std::max(n.block, by_block[block] += detail::ring_bytes(bytes(*mod)));
    }
    // The flat area: as large as the largest bucket (largest_bucket).
    const comm::Communicator* c = opts.device_comm;
    if (dp > 1 && c) {
        std::vector<std::uint64_t> numels;
        for (const auto& p : params) numels.push_back(p.numel);
        const detail::Bucket b = detail::largest_bucket(
            modules, numels, m.opts.param_dtype,
            [&](comm::Kind kind, std::span<const std::uint64_t> sizes, comm::DType dtype) {
                return flat_bytes(*c, kind, sizes, dtype);
            });
        n.flat = b.bytes;
        n.flat_module = b.module;
        n.flat_gradients = b.gradients;
    }
    return n;
}

std::string InfinityEngine::Need::flat_what() const {
    if (!flat) return {};
    return "the " + format_size(flat) + " NCCL lays " + flat_module + "'s " +
           (flat_gradients ? "gradients" : "parameters") + " flat in";
}

// ---------------------------------------------------------------------------
Impl::Impl(const shard::Manifest& m_, std::span<const Module* const> mods, comm::Communicator& c, io::Engine& e,
           mem::PinnedPool& p, device::Device& d, ParamStore& o, const InfinityOptions& op)
    : m(m_), modules(mods.begin(), mods.end()), comm(c), io(e), pool(p), dev(d), store(o), opts(op) {
    dp = m.opts.dp;
    rank = static_cast<unsigned>(comm.rank());
    bf16 = m.opts.param_dtype == shard::DType::bf16;
    compute = &dev.stream(device::StreamKind::compute);
    h2d = &dev.stream(device::StreamKind::h2d);
    d2h = &dev.stream(device::StreamKind::d2h);
    coll = &dev.stream(device::StreamKind::collectives);
    coll_comm = opts.device_comm ? opts.device_comm : &comm;
    coll_ordered = coll_comm->stream_ordered();
    if (dp > 1 && (coll_comm->size() != comm.size() || coll_comm->rank() != comm.rank()))
        throw InternalError("engine: the device buffers' communicator (" + coll_comm->describe() +
                            ") is not over the same ranks as the host's (" + comm.describe() + ")");
    if (dp > 1 && !coll_ordered && !dev.host_addressable())
        throw UsageError("engine: at dp " + std::to_string(dp) + " the " + dev.backend() +
                         " device's gathers and reduce-scatters need a communicator that runs on its streams "
                         "(NCCL); " + coll_comm->describe() + " makes host calls, which cannot read device memory");
    params = detail::describe_params(m, modules, opts, rank);

    InfinityOptions sized = opts;
    sized.device_comm = coll_comm;
    const Need n = InfinityEngine::need(m, modules, sized);
    gradients.largest_block = n.largest;
    const mem::ArenaStats before = dev.arena().stats();
    if (n.total() > before.largest_free)
        throw DoesNotFit("engine: " + n.module + " needs " + format_size(n.largest) + " beside the " +
                             format_size(n.reserved + n.flat) + " kept for the run" +
                             (n.flat ? " (" + n.flat_what() + " among them)" : "") + "; " +
                             format_size(before.largest_free) + " of the device budget is left",
                         n.module, n.total(), before.largest_free);
    // The device communicator's flat area (NCCL's buckets): from the arena,
    // once, handed to it for the run at the end (taken back in the
    // destructor, which a constructor that throws never runs).
    if (n.flat) flat = dev.arena().allocate(n.flat, "NCCL's flat bucket area");

    std::uint64_t largest_count = 1, largest_resident = 0;
    for (auto& ps : params) {
        largest_count = std::max(largest_count, ps.count);
        if (ps.tier == shard::Tier::gpu) {
            largest_resident = std::max(largest_resident, ps.per * ps.dt);
            // The gpu tier: this rank's partition lives in the arena for the
            // run, filled from the optimizer's copy and refreshed by on_param.
            ps.resident = dev.arena().allocate(ps.per * ps.dt, "gpu-tier parameter partition");
            const ParamSource src = store.param_source(ps.tensor);
            dev.copy(*h2d, {ps.resident.data(), ps.resident.size()}, src.device.empty() ? src.memory : src.device);
        }
        if (ps.persistent) ps.persist = dev.arena().allocate(detail::values_layout(ps, dp, bf16).bytes, "persistent parameter");
        if (ps.shared_grad) ps.shared = dev.arena().allocate(ps.numel * 4, "shared gradient");
    }
    dev.synchronize(*h2d);
    gradients.slot = align_up(largest_count * 4, 4096);
    gradients.staging = pool.pin(GradientStage::kStaging * gradients.slot, "engine's gradient staging ring");
    gradients.worker = std::thread([this] { handover_loop(); });
    if (largest_resident) {
        refresh.piece = std::min<std::uint64_t>(largest_resident, pool.buffer_bytes());
        refresh.staging = pool.pin(RefreshStage::kPieces * refresh.piece, "engine's gpu-tier refresh staging");
    }

    const std::uint64_t left = align_down(dev.arena().stats().largest_free, mem::kArenaAlignment);
    ring.block = dev.arena().allocate(left, "engine working memory");
    ring.places.init({ring.block.data(), ring.block.size()});
    ring.base_used = dev.arena().stats().used - ring.block.size();
    if (flat) coll_comm->set_flat_area({flat.data(), flat.size()});
}

Impl::~Impl() {
    reset_streams();
    {
        std::lock_guard lk(gradients.mu);
        gradients.quit = true;
    }
    gradients.cv.notify_all();
    if (gradients.worker.joinable()) gradients.worker.join();
    if (flat) try {
            coll_comm->set_flat_area({});
        } catch (const std::exception& e) {
            log::debug(std::string("engine: the flat area not taken back: ") + e.what());
        }
}

void Impl::reset_streams() noexcept {
    for (device::Stream* s : {h2d, coll, compute, d2h}) try {
            if (s) dev.synchronize(*s);
        } catch (const std::exception& e) {
            log::debug(std::string("engine: dropped after a failure: ") + e.what());
        }
    for (auto& f : fetch.reads_out) try {
            f.get();
        } catch (const std::exception& e) {
            log::debug(std::string("engine: dropped after a failure: ") + e.what());
        }
    fetch.reads_out.clear();
    fetch.current.clear();
    fetch.candidate.reset();
    fetch.prefetched.clear();
    fetch.parked.clear();
    fetch.parked_bytes = 0;
    drain_handovers();
    {
        std::lock_guard lk(gradients.mu);
        gradients.error = nullptr;
    }
    gradients.handovers.clear();
    gradients.handover_bytes = 0;
    fetch.pre_read.clear();
    fetch.nc_next = 0;
    fetch.nc_held = 0;
    ring.places.clear();
    in_pass = false;
}

// ---------------------------------------------------------------------------
Impl::Fetch* Impl::fetch_of(const Module& mod) const {
    const auto it = fetch.current.find(&mod);
    return it == fetch.current.end() ? nullptr : it->second.get();
}

void Impl::drop_prefetched() {
    for (auto& [i, f] : fetch.prefetched) release(f, f->ready);
    fetch.prefetched.clear();
    fetch.ahead_bytes = 0;
    trace.pf_next = trace.order[train].size();
    fetch.pre_read.clear();  // reads in flight keep their buffers until they land
    fetch.nc_held = 0;
    fetch.nc_next = trace.pf_next;
}

void Impl::drop_parked() {
    for (auto& [mod, f] : fetch.parked) release(f, dev.record(*compute));
    fetch.parked.clear();
    fetch.parked_bytes = 0;
}

// Which fetches a recorded order lets later hooks reuse: a module's forward
// followed at once by its own backward (the output head), and a forward run
// again inside backward (activation checkpointing) kept for the module's
// backward that comes after it. Such a fetch carries the gradient buffers.
void Impl::set_trace(bool train_pass, std::vector<TraceEntry> t) {
    auto& from = trace.reuse_from[train_pass];
    auto& fed = trace.feeds[train_pass];
    from.assign(t.size(), kNone);
    fed.assign(t.size(), false);
    std::size_t first_backward = t.size();
    for (std::size_t j = 0; j < t.size(); ++j) {
        if (t[j].backward && first_backward == t.size()) first_backward = j;
        if (!t[j].backward) continue;
        for (std::size_t i = j; i-- > 0;) {
            if (t[i].module != t[j].module) continue;
            if (!t[i].backward && (i + 1 == j || i > first_backward)) {
                from[j] = i;
                fed[i] = true;
            }
            break;
        }
    }
    // A recomputed forward's fetch (i > first_backward) is kept from i to
    // the backward j that reuses it: the most such fetches hold at once is
    // what parking every one of them takes (a checkpointed block's modules,
    // from its forward run again to their backward). Kept within the
    // prefetch budget alone, a block larger than it had its largest modules
    // fetched a third time in backward.
    std::vector<std::pair<std::size_t, std::int64_t>> edges;  // (entry, +bytes at i / -bytes at j)
    for (std::size_t j = first_backward; j < t.size(); ++j)
        if (from[j] != kNone && from[j] > first_backward) {
            const auto b = static_cast<std::int64_t>(detail::ring_bytes(block_bytes(*t[j].module, true, nullptr)));
            edges.emplace_back(from[j], b);
            edges.emplace_back(j, -b);
        }
    std::sort(edges.begin(), edges.end());
    std::int64_t held = 0, most = 0;
    for (const auto& [at, b] : edges) most = std::max(most, held += b);
    const std::uint64_t beside = opts.prefetch_bytes + 2 * gradients.largest_block;
    const std::uint64_t room = ring.places.size() > beside ? ring.places.size() - beside : 0;
    trace.park_bytes[train_pass] =
        opts.prefetch_bytes == 0 ? 0 : std::max(opts.prefetch_bytes, std::min<std::uint64_t>(most, room));
    trace.order[train_pass] = std::move(t);
}

Impl::Fetch& Impl::acquire(const Module& mod, bool backward) {
    if (!in_pass) throw InternalError("engine: " + mod.name() + " ran outside begin()/end()");
    if (fetch_of(mod)) throw InternalError("engine: " + mod.name() + " entered twice");
    const TraceEntry e{&mod, backward};
    const auto& tr = trace.order[train];
    std::size_t idx = trace.recording.size();
    trace.recording.push_back(e);

    std::unique_ptr<Fetch> f;
    const bool reuse = fetch.candidate && fetch.candidate->module == &mod && (!backward || fetch.candidate->grads);
    if (const auto it = fetch.parked.find(&mod); it != fetch.parked.end()) {
        fetch.parked_bytes -= it->second->bytes();
        if (backward && it->second->grads && !trace.diverged) {
            f = std::move(it->second);
            ++st.reused;
        } else {
            release(it->second, dev.record(*compute));
        }
        fetch.parked.erase(it);
    }
    if (trace.replay && !trace.diverged) {
        if (trace.pos >= tr.size() || !(tr[trace.pos] == e)) {
            trace.diverged = true;
            const std::string expected =
                trace.pos < tr.size() ? tr[trace.pos].module->name() + (tr[trace.pos].backward ? " (backward)" : " (forward)")
                                      : "the end of the pass";
            if (!trace.warned)
                log::warn("engine: the modules ran out of the recorded order at fetch " + std::to_string(trace.pos + 1) + " of the " +
                          (train ? "training step" : "evaluation") + ": " + mod.name() + (backward ? " (backward)" : " (forward)") +
                          " where the trace has " + expected + "; fetching on demand for the rest of this pass and recording the order again");
            trace.warned = true;
            drop_prefetched();
            drop_parked();
            if (f) {
                release(f, dev.record(*compute));
                --st.reused;
            }
        } else {
            idx = trace.pos++;
            const auto it = fetch.prefetched.find(idx);
            if (!f && it != fetch.prefetched.end()) {
                f = std::move(it->second);
                fetch.prefetched.erase(it);
                fetch.ahead_bytes -= f->bytes();
            }
        }
    }
    if (reuse && !f) {
        f = std::move(fetch.candidate);
        ++st.reused;
    } else if (fetch.candidate) {
        release(fetch.candidate, dev.record(*compute));
    }
    if (!f) {
        const bool grads = backward || (trace.replay && !trace.diverged && trace.feeds[train][idx]);
        f = issue(mod, grads, idx, false);
    }
    dev.wait(*compute, f->ready, fetch.stall_ns);
    for (auto list : {mod.params(), mod.external()})
        for (std::size_t pi : list)
            if (params[pi].persistent) dev.wait(*compute, params[pi].persist_ready, fetch.stall_ns);
    Fetch& ref = *f;
    fetch.current[&mod] = std::move(f);
    if (trace.replay && !trace.diverged) prefetch();
    return ref;
}

// Fetches ahead along the trace while the bytes fetched and not yet used
// stay under the budget and the ring has a place clear of live buffers.
void Impl::prefetch() {
    const auto& tr = trace.order[train];
    if (opts.prefetch_bytes == 0) return;
    trace.pf_next = std::max(trace.pf_next, trace.pos);
    while (trace.pf_next < tr.size()) {
        const TraceEntry& e = tr[trace.pf_next];
        if (trace.reuse_from[train][trace.pf_next] != kNone) {  // an earlier fetch serves it
            ++trace.pf_next;
            continue;
        }
        const bool grads = e.backward || trace.feeds[train][trace.pf_next];
        const std::uint64_t b = align_up(block_bytes(*e.module, grads, nullptr), mem::kArenaAlignment);
        if (fetch.ahead_bytes + b > opts.prefetch_bytes) break;
        // (A module whose parameters a pipelined update is still writing
        // is fetched ahead all the same: its fetch waits for them, and
        // what is fetched ahead, and so the ring's places, never depends
        // on the update's timing. The compute queued before it runs on.)
        auto f = issue(*e.module, grads, trace.pf_next, true);
        if (!f) break;
        fetch.ahead_bytes += f->bytes();
        fetch.prefetched[trace.pf_next++] = std::move(f);
    }
    read_ahead();
}

// The module's backward is queued: its parameters' gradients are final (a
// parameter used elsewhere too, the tied wte, is declared by the module whose
// backward runs last). Reduce-scatter them as one bucket on the collectives
// stream, copy this rank's partitions out and hand them to the optimizer on
// the d2h stream's thread, one after the other through one host buffer.
void Impl::hand_over(const Module& mod) {
    Fetch* f = fetch_of(mod);
    if (!f || !f->grads) throw InternalError("engine: " + mod.name() + "'s backward ended without its gradients");
    dev.wait(*coll, dev.record(*compute));
    struct Out {
        std::size_t tensor;
        std::span<const std::byte> src;  // device: this rank's averaged partition
        std::uint64_t count;
    };
    std::vector<Out> outs;
    std::vector<Scatter> bucket;
    for (std::size_t pi : mod.params()) {
        ParamState& p = params[pi];
        const auto slot = std::find_if(f->slots.begin(), f->slots.end(), [&](const Slot& s) { return s.param == pi; });
        // A gradient kept whole elsewhere at dp 1 needs no slot of its own.
        if (slot == f->slots.end() && !(p.shared_grad && dp == 1))
            throw InternalError("engine: no gradient slot for " + m.tensors[pi].name);
        const std::span<std::byte> full = p.shared_grad ? std::span<std::byte>(p.shared.data(), p.numel * 4)
                                                        : ring.places.bytes(f->place.at + slot->grad, p.numel * 4);
        if (dp > 1) {
            const auto own = ring.places.bytes(f->place.at + slot->own_grad, p.per * 4);
            bucket.push_back({full, own, p.numel});
            outs.push_back({pi, own.first(p.count * 4), p.count});
        } else {
            outs.push_back({pi, full, p.numel});
        }
        st.grad_bytes += p.count * 4;
    }
    if (dp > 1) {
        if (coll_ordered)
            zero::enqueue_reduce_scatter(*coll_comm, bucket, comm::DType::f32, dev.native(*coll));
        else
            dev.host(*coll, [c = coll_comm, bucket] { zero::reduce_scatter(*c, bucket, comm::DType::f32); });
        ++st.collectives;
    }
    dev.wait(*d2h, dev.record(*coll));
    auto& G = gradients;
    for (const Out& o : outs) {
        const std::uint64_t n = G.tickets++;
        const std::size_t i = n % GradientStage::kStaging;
        if (n >= GradientStage::kStaging)
            dev.host(*d2h, [&G, need = n - GradientStage::kStaging + 1] {
                std::unique_lock lk(G.mu);
                if (G.handed >= need) return;
                const auto t0 = std::chrono::steady_clock::now();
                G.cv.wait(lk, [&] { return G.handed >= need; });
                G.staging_wait_ns += static_cast<std::uint64_t>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
            });
        const auto host = G.staging.bytes().subspan(i * G.slot, o.count * 4);
        GradientStage::Job job{{}, i, o.tensor, o.count};
        // Every ticket reaches the worker, or the stream's later waits for it never end.
        auto queue = [&] {
            {
                std::lock_guard lk(G.mu);
                G.jobs.push_back(std::move(job));
            }
            G.cv.notify_all();
        };
        try {
            dev.copy(*d2h, host, o.src);
            job.copied = dev.record(*d2h);
        } catch (...) {
            job.dropped = true;
            queue();
            throw;
        }
        queue();
    }
}

// The engine's hand-over worker (GradientStage): each copy waited for, its
// partition handed to the store, its buffer freed, in queue order.
void Impl::handover_loop() {
    auto& G = gradients;
    std::unique_lock lk(G.mu);
    for (;;) {
        G.cv.wait(lk, [&] { return G.quit || !G.jobs.empty(); });
        if (G.jobs.empty()) return;  // quit, with nothing left
        GradientStage::Job job = std::move(G.jobs.front());
        G.jobs.pop_front();
        G.working = true;
        const bool failed = G.error != nullptr;
        lk.unlock();
        std::exception_ptr e;
        try {
            if (!job.dropped) dev.synchronize(job.copied);
            if (!failed && !job.dropped) {
                const auto host = G.staging.bytes().subspan(job.buffer * G.slot, job.count * 4);
                store.put_gradient(job.tensor,
                                   std::span<const float>(reinterpret_cast<const float*>(host.data()), job.count));
            }
        } catch (...) {
            e = std::current_exception();
        }
        lk.lock();
        if (e && !G.error) G.error = e;
        G.working = false;
        ++G.handed;
        G.cv.notify_all();
    }
}

void Impl::drain_handovers() noexcept {
    auto& G = gradients;
    std::unique_lock lk(G.mu);
    G.cv.wait(lk, [&] { return G.jobs.empty() && !G.working; });
}

// See RefreshStage. A piece's last copy is waited for by polling, not by
// synchronize: a stream's error belongs to the pass's end(), which reports
// it (a dropped copy counts as done; the failed step is not committed).
void Impl::refresh_param(ParamState& p, std::uint64_t first, std::span<const std::byte> values) {
    const std::uint64_t at0 = first * p.dt;
    if (at0 + values.size() > p.resident.size())
        throw InternalError("engine: a refresh of " + m.tensors[p.tensor].name + " writes bytes [" +
                            std::to_string(at0) + ", " + std::to_string(at0 + values.size()) + ") of a " +
                            std::to_string(p.resident.size()) + "-byte partition");
    std::lock_guard lk(refresh.mu);
    dev.wait(*h2d, p.last_read);
    for (std::uint64_t at = 0; at < values.size(); at += refresh.piece) {
        const std::uint64_t n = std::min<std::uint64_t>(refresh.piece, values.size() - at);
        device::Event& done = refresh.piece_done[refresh.next];
        while (!dev.query(done)) std::this_thread::sleep_for(std::chrono::microseconds(20));
        const auto buf = refresh.staging.bytes().subspan(refresh.next * refresh.piece, n);
        std::memcpy(buf.data(), values.data() + at, n);
        dev.copy(*h2d, {p.resident.data() + at0 + at, n}, buf);
        done = dev.record(*h2d);
        refresh.next = (refresh.next + 1) % RefreshStage::kPieces;
    }
    p.refreshed = dev.record(*h2d);
}

// ---------------------------------------------------------------------------
void InfinityEngine::before_forward(const Module& m) {
    if (impl_->has_params(m)) impl_->acquire(m, false);
}

void InfinityEngine::after_forward(const Module& m) {
    Impl& I = *impl_;
    if (!I.has_params(m)) return;
    auto it = I.fetch.current.find(&m);
    if (it == I.fetch.current.end()) throw InternalError("engine: after_forward of " + m.name() + " without its fetch");
    auto& f = it->second;
    // Kept for the module's backward while the kept fetches stay within
    // their budget (TraceStage::park_bytes; with a prefetch budget of 0, none:
    // one module live at a time, the least memory, tiles released one by one).
    const auto& feeds = I.trace.feeds[I.train];
    const bool park = I.trace.replay && !I.trace.diverged && I.in_backward && f->grads &&
                      f->trace_index < feeds.size() && feeds[f->trace_index] &&
                      I.fetch.parked_bytes + f->bytes() <= I.trace.park_bytes[I.train];
    if (park) {
        I.fetch.parked_bytes += f->bytes();
        I.fetch.parked[&m] = std::move(f);
    } else {
        if (I.fetch.candidate) I.release(I.fetch.candidate, I.dev.record(*I.compute));
        I.fetch.candidate = std::move(f);
    }
    I.fetch.current.erase(it);
}

void InfinityEngine::before_backward(const Module& m) {
    Impl& I = *impl_;
    if (!I.train) throw InternalError("engine: backward in an evaluation pass");
    I.in_backward = true;
    if (I.has_params(m)) I.acquire(m, true);
}

void InfinityEngine::after_backward(const Module& m) {
    Impl& I = *impl_;
    if (!I.has_params(m)) return;
    auto it = I.fetch.current.find(&m);
    if (it == I.fetch.current.end())
        throw InternalError("engine: after_backward of " + m.name() + " without its fetch");
    if (!m.params().empty()) {
        I.hand_over(m);
        const device::Event done = I.dev.record(*I.d2h);
        const std::uint64_t bytes = it->second->bytes();
        I.release(it->second, done);
        I.gradients.handovers.emplace_back(done, bytes);
        I.gradients.handover_bytes += bytes;
        // At least two of the largest modules, so that one module's hand-over
        // overlaps the next one's backward whatever the prefetch budget.
        const std::uint64_t window = std::max<std::uint64_t>(I.opts.prefetch_bytes, 2 * I.gradients.largest_block);
        while (!I.gradients.handovers.empty() &&
               (I.gradients.handover_bytes > window || I.dev.query(I.gradients.handovers.front().first))) {
            I.dev.synchronize(I.gradients.handovers.front().first);
            I.gradients.handover_bytes -= I.gradients.handovers.front().second;
            I.gradients.handovers.pop_front();
        }
    } else {
        I.release(it->second, I.dev.record(*I.compute));
    }
    I.fetch.current.erase(it);
}

std::span<const std::byte> Impl::full_values(const Module& mod, std::size_t param) const {
    const auto& p = params.at(param);
    const std::uint64_t bytes = p.numel * (p.keep_bf16 ? 2 : 4);
    if (p.persistent) return {p.persist.data() + detail::values_layout(p, dp, bf16).full, bytes};
    const Fetch* f = fetch_of(mod);
    if (!f) throw InternalError("engine: " + mod.name() + " asked for a weight outside its hooks");
    for (const Slot& s : f->slots)
        if (s.param == param && s.values_at != kNone)
            return ring.places.bytes(f->place.at + s.values_at + s.values.full, bytes);
    throw InternalError("engine: " + mod.name() + "'s fetch has no buffer for " + m.tensors[param].name);
}

std::span<const float> InfinityEngine::weight_of(const Module& m, std::size_t param) {
    Impl& I = *impl_;
    if (I.params.at(param).keep_bf16)
        throw InternalError("engine: " + m.name() + " asked for " + I.m.tensors[param].name +
                            " in fp32; it is kept bf16 (read it through stored())");
    const auto v = I.full_values(m, param);
    return {reinterpret_cast<const float*>(v.data()), v.size() / 4};
}

std::span<const std::uint16_t> InfinityEngine::weight_bf16_of(const Module& m, std::size_t param) {
    Impl& I = *impl_;
    if (!I.params.at(param).keep_bf16) return {};
    const auto v = I.full_values(m, param);
    return {reinterpret_cast<const std::uint16_t*>(v.data()), v.size() / 2};
}

std::span<float> InfinityEngine::grad_of(const Module& m, std::size_t param) {
    Impl& I = *impl_;
    auto& p = I.params.at(param);
    const Fetch* f = I.fetch_of(m);
    if (!I.in_backward || !f || !f->grads)
        throw InternalError("engine: " + m.name() + " asked for a gradient outside its backward");
    if (p.shared_grad) return {reinterpret_cast<float*>(p.shared.data()), p.numel};
    for (const Slot& s : f->slots)
        if (s.param == param && s.grad != kNone)
            return {reinterpret_cast<float*>(I.ring.places.bytes(f->place.at + s.grad, 4).data()), p.numel};
    throw InternalError("engine: " + m.name() + "'s fetch has no gradient for " + I.m.tensors[param].name);
}

// ---------------------------------------------------------------------------
InfinityEngine::InfinityEngine(const shard::Manifest& m, std::span<const Module* const> modules,
                               comm::Communicator& comm, io::Engine& io, mem::PinnedPool& pool, device::Device& dev,
                               ParamStore& store, const InfinityOptions& opts)
    : impl_(std::make_unique<Impl>(m, modules, comm, io, pool, dev, store, opts)) {
    store.listen(this);
}

InfinityEngine::~InfinityEngine() { impl_->store.listen(nullptr); }

void InfinityEngine::begin(bool train) {
    Impl& I = *impl_;
    if (I.in_pass) throw InternalError("engine: begin() inside a pass");
    I.in_pass = true;
    I.train = train;
    I.in_backward = false;
    I.trace.recording.clear();
    I.trace.diverged = false;
    I.trace.pos = I.trace.pf_next = 0;
    I.fetch.ahead_bytes = 0;
    I.fetch.stall_ns = 0;
    I.gradients.staging_wait_ns = 0;
    I.st = {};
    I.ring.places.reset_peak();
    I.trace.replay = !I.trace.order[train].empty();
    if (train)  // gradients kept whole through backward start from zero
        for (auto& p : I.params)
            if (p.shared_grad) I.dev.zero(*I.compute, {reinterpret_cast<float*>(p.shared.data()), p.numel});
    if (I.trace.replay) I.prefetch();
}

void InfinityEngine::end() {
    Impl& I = *impl_;
    std::exception_ptr failed;
    // The copy-in stream first: a read's error (74) or a checksum's (65) is
    // the cause of whatever the later stages then computed.
    for (device::Stream* s : {I.h2d, I.coll, I.compute, I.d2h}) try {
            I.dev.synchronize(*s);
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
    // Every gradient handed over (or the first hand-over's error).
    I.drain_handovers();
    {
        std::lock_guard lk(I.gradients.mu);
        if (!failed && I.gradients.error) failed = I.gradients.error;
        I.gradients.error = nullptr;
    }
    I.st.staging_wait_seconds = static_cast<double>(I.gradients.staging_wait_ns.load()) / 1e9;
    if (!failed && (!I.fetch.current.empty()))
        failed = std::make_exception_ptr(InternalError("engine: a pass ended inside a module's hooks"));
    if (!failed && (I.trace.order[I.train].empty() || I.trace.diverged))
        I.set_trace(I.train, std::move(I.trace.recording));
    I.st.stall_seconds = static_cast<double>(I.fetch.stall_ns.load()) / 1e9;
    I.st.device_peak = I.ring.base_used + I.ring.places.peak();
    I.st.diverged = I.trace.diverged;
    I.reset_streams();
    if (failed) std::rethrow_exception(failed);
}

void InfinityEngine::reset() noexcept { impl_->reset_streams(); }

void InfinityEngine::on_param(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values) {
    Impl& I = *impl_;
    auto& p = I.params.at(tensor);
    if (p.tier == shard::Tier::gpu) I.refresh_param(p, first, values);
}

// The device's AdamW wrote the new values (the optimizer's copy on the
// device): copied into the resident partition on the device, on the
// optimizer's stream `s` after its kernels and after the last gather that
// read the old values; the next gather waits for it.
void InfinityEngine::updated_on_device(std::size_t tensor, std::uint64_t first, std::span<const std::byte> values,
                                       device::Stream& s) {
    Impl& I = *impl_;
    auto& p = I.params.at(tensor);
    if (p.tier != shard::Tier::gpu) return;
    const std::uint64_t at0 = first * p.dt;
    if (at0 + values.size() > p.resident.size())
        throw InternalError("engine: a refresh of " + I.m.tensors[p.tensor].name + " writes bytes [" +
                            std::to_string(at0) + ", " + std::to_string(at0 + values.size()) + ") of a " +
                            std::to_string(p.resident.size()) + "-byte partition");
    std::lock_guard lk(I.refresh.mu);
    I.dev.wait(s, p.last_read);
    I.dev.copy(s, {p.resident.data() + at0, values.size()}, values);
    p.refreshed = I.dev.record(s);
}

void InfinityEngine::after_step() { ++impl_->version; }

InfinityStats InfinityEngine::stats() const { return impl_->st; }

std::vector<std::string> InfinityEngine::trace(bool train) const {
    std::vector<std::string> out;
    for (const auto& e : impl_->trace.order[train])
        out.push_back(e.module->name() + (e.backward ? " backward" : " forward"));
    return out;
}

}  // namespace zinf::zero
