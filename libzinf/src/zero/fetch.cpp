// The engine's fetch pipeline (zero.hpp, paper §6.2): device memory from the
// ring, for each parameter nc (NVMe -> pinned leases) and cg (pinned ->
// device, the h2d stream), then gg for the module's parameters as one bucket
// (one allgather into their full fp32 buffers, the collectives stream), each
// stage ordered after the last by device events.
#include "infinity.hpp"

#include <algorithm>
#include <future>

namespace zinf::zero {

using detail::kNone;

namespace detail {

// ---------------------------------------------------------------------------
std::string Ring::describe_live() const {
    std::string out;
    for (const Span& s : live_) out += (out.empty() ? "" : " ") + ("[" + std::to_string(s.at) + ", " + std::to_string(s.at + s.bytes) + ")");
    return out;
}

bool Ring::clear_of_live(std::uint64_t at, std::uint64_t n) const {
    if (at + n > region_.size()) return false;
    for (const Span& s : live_)
        if (at < s.at + s.bytes && s.at < at + n) return false;
    return true;
}

std::optional<Ring::Place> Ring::place(std::uint64_t bytes, const std::function<bool(const device::Event&)>& busy) {
    bytes = ring_bytes(bytes);
    // Whether a place fits depends on the live buffers alone, which the
    // host's calls decide: every rank makes the same decision. Where it goes
    // among the places that fit may follow timing: the lowest address (the
    // cpu backend's device memory is host memory, touched as used: low
    // places keep the resident set at the peak of live bytes), avoiding
    // released buffers whose release has not happened yet (a gradient still
    // on its way to the optimizer) when another place is free of them.
    // Small buffers (a LayerNorm, a tiled Linear's bias) go to the top,
    // above every large one, and large ones to the bottom, below every
    // small one, where they can: a small one left live between large ones
    // would split the ring, and a module as large as the ring less its
    // ancestors would no longer fit.
    const bool small = bytes * 8 <= region_.size();
    std::uint64_t big_end = 0, small_at = region_.size();
    for (const Span& s : live_) {
        if (s.small) small_at = std::min(small_at, s.at);
        else big_end = std::max(big_end, s.at + s.bytes);
    }
    std::vector<std::uint64_t> candidates{0};
    for (const Span& s : live_) candidates.push_back(s.at + s.bytes);
    if (small && region_.size() >= bytes) {
        candidates.push_back(align_down(region_.size() - bytes, mem::kArenaAlignment));
        for (const Span& s : live_)
            if (s.at >= bytes) candidates.push_back(align_down(s.at - bytes, mem::kArenaAlignment));
    }
    std::sort(candidates.begin(), candidates.end());
    if (small) std::reverse(candidates.begin(), candidates.end());
    std::optional<std::uint64_t> found, fallback;
    for (const bool zoned : {true, false}) {
        for (const std::uint64_t at : candidates) {
            if (zoned && (small ? at < big_end : at + bytes > small_at)) continue;
            if (!clear_of_live(at, bytes)) continue;
            if (!fallback) fallback = at;
            const bool waits_on_busy = std::any_of(released_.begin(), released_.end(), [&](const Released& r) {
                return at < r.at + r.bytes && r.at < at + bytes && busy && busy(r.done);
            });
            // A small one takes the highest place even if that waits: moved
            // down to avoid the wait, it would sit in the middle later.
            if (!waits_on_busy || small) {
                found = at;
                break;
            }
        }
        if (found || fallback) break;
    }
    if (!found) found = fallback;
    if (!found) return std::nullopt;
    const std::uint64_t at = *found;
    Place p;
    p.id = next_id_++;
    p.at = at;
    p.bytes = bytes;
    for (const Released& r : released_)
        if (at < r.at + r.bytes && r.at < at + bytes) p.waits.push_back(r.done);
    live_.push_back({p.id, at, bytes, small});
    live_bytes_ += bytes;
    peak_ = std::max(peak_, live_bytes_);
    return p;
}

void Ring::release(std::uint64_t id, const device::Event& done) {
    const auto it = std::find_if(live_.begin(), live_.end(), [&](const Span& s) { return s.id == id; });
    if (it == live_.end()) throw InternalError("engine ring: release of an unknown buffer");
    released_.push_back({it->at, it->bytes, done});
    live_bytes_ -= it->bytes;
    live_.erase(it);
}

void Ring::prune(device::Device& dev) {
    std::erase_if(released_, [&](const Released& r) { return dev.query(r.done); });
}

void Ring::clear() {
    live_.clear();
    released_.clear();
    live_bytes_ = 0;
}

}  // namespace detail

// ---------------------------------------------------------------------------
// One allocation per fetch: for each parameter that is not persistent, its
// values memory (values_layout); with gradients, the full fp32 gradient of
// each declared parameter (unless kept whole elsewhere) and this rank's
// reduce-scattered partition of it (dp > 1).
std::uint64_t detail::block_bytes(const std::vector<ParamState>& params, unsigned dp, bool bf16, const Module& mod,
                                  bool grads, std::vector<Slot>* slots) {
    const std::uint64_t A = mem::kArenaAlignment;
    std::uint64_t at = 0;
    auto take = [&](std::uint64_t n) {
        const std::uint64_t here = at;
        at += align_up(n, A);
        return here;
    };
    auto add = [&](std::size_t pi, bool declared) {
        const ParamState& p = params[pi];
        Slot s;
        s.param = pi;
        if (!p.persistent) {
            s.values = values_layout(p, dp, bf16);
            s.values_at = take(s.values.bytes);
        }
        if (grads && declared) {
            if (!p.shared_grad) s.grad = take(p.numel * 4);
            if (dp > 1) s.own_grad = take(p.per * 4);
        }
        if (slots && (s.values_at != kNone || s.grad != kNone || s.own_grad != kNone)) slots->push_back(s);
    };
    for (std::size_t pi : mod.params()) add(pi, true);
    for (std::size_t pi : mod.external()) add(pi, false);
    return at;
}

detail::ValuesLayout detail::values_layout(const ParamState& p, unsigned dp, bool bf16) {
    const std::uint64_t A = mem::kArenaAlignment;
    ValuesLayout l;
    if (p.tier != shard::Tier::gpu) {
        l.own = l.bytes;
        l.bytes += align_up(p.per * p.dt, A);
    }
    if (p.keep_bf16) {
        if (dp == 1 && l.own != kNone) {
            l.full = l.own;  // the partition is the whole tensor
        } else {
            l.full = l.bytes;
            l.bytes += align_up(p.numel * 2, A);
        }
        return l;
    }
    if (dp > 1 && bf16) {
        l.staging = l.bytes;
        l.bytes += align_up(p.numel * 2, A);
    }
    l.full = l.bytes;
    l.bytes += align_up(p.numel * 4, A);
    return l;
}

void InfinityEngine::Impl::release(std::unique_ptr<Fetch>& f, const device::Event& done) {
    if (!f) return;
    ring.places.release(f->place.id, done);
    f.reset();
}

// The parameters of `mod` into a new place of the ring: every stage enqueued
// now, `ready` recorded on the collectives stream after the last gather.
std::unique_ptr<InfinityEngine::Impl::Fetch> InfinityEngine::Impl::issue(const Module& mod, bool grads,
                                                                         std::size_t trace_index, bool prefetch) {
    auto f = std::make_unique<Fetch>();
    f->module = &mod;
    f->grads = grads;
    f->trace_index = trace_index;
    const std::uint64_t bytes = block_bytes(mod, grads, &f->slots);
    ring.places.prune(dev);
    // A place still being handed over to the optimizer is busy.
    const auto busy = [this](const device::Event& e) { return e.stream == d2h && !dev.query(e); };
    auto place = ring.places.place(bytes, busy);
    if (!place) {
        if (prefetch) return nullptr;
        drop_prefetched();
        drop_parked();
        place = ring.places.place(bytes, busy);
        if (!place)
            throw InternalError("engine: " + mod.name() + " needs " + format_size(bytes) + " of device memory, and " +
                                format_size(ring.places.size() - ring.places.live_bytes()) + " of the engine's " +
                                format_size(ring.places.size()) + " is not held by other modules (live: " +
                                ring.places.describe_live() + ")");
    }
    f->place = std::move(*place);
    // A place that held gradients still being handed to the optimizer: wait
    // here, on the host. Left to the copy stream, that wait could hold the
    // pool's buffers the hand-over itself needs (the optimizer streams
    // gradients to NVMe through the same pool).
    for (const auto& w : f->place.waits)
        if (w.stream == d2h) dev.synchronize(w);

    // nc and cg for every parameter the module needs now (its persistent
    // ones once per step, into their own memory), then gg for them all as
    // one bucket: one collective per module fetch, not one per parameter.
    std::vector<Staged> bucket;
    std::vector<ParamState*> persisted;
    for (auto list : {mod.params(), mod.external()})
        for (std::size_t pi : list) {
            ParamState& p = params[pi];
            if (!p.persistent || p.persist_version == version) continue;
            if (std::find(persisted.begin(), persisted.end(), &p) != persisted.end()) continue;
            bucket.push_back(stage(p, {p.persist.data(), p.persist.size()}, detail::values_layout(p, dp, bf16), {}, kNone));
            persisted.push_back(&p);
        }
    const std::uint64_t base = f->place.at;
    for (const Slot& s : f->slots)
        if (s.values_at != kNone)
            bucket.push_back(stage(params[s.param], ring.places.bytes(base + s.values_at, s.values.bytes), s.values,
                                   f->place.waits, trace_index));
    gather(bucket, f->place.waits);
    if (!persisted.empty()) {
        const device::Event ready = dev.record(*coll);
        for (ParamState* p : persisted) {
            p->persist_ready = ready;
            p->persist_version = version;
        }
    }
    for (const Slot& s : f->slots)
        if (s.grad != kNone) {
            // The gradient the backward adds to starts at zero, written on the
            // collectives stream after whatever used the place before.
            for (const auto& w : f->place.waits) dev.wait(*coll, w);
            auto g = ring.places.bytes(base + s.grad, params[s.param].numel * 4);
            dev.zero(*coll, {reinterpret_cast<float*>(g.data()), params[s.param].numel});
        }
    f->ready = dev.record(*coll);
    ++st.fetches;
    ++(prefetch ? st.prefetched : st.on_demand);
    return f;
}

// nc and cg for one parameter into its values memory `mem` laid out as `l`:
// its partition on the device once the h2d stream gets there, and where
// its gather goes.
InfinityEngine::Impl::Staged InfinityEngine::Impl::stage(ParamState& p, std::span<std::byte> mem,
                                                         const detail::ValuesLayout& l,
                                                         const std::vector<device::Event>& waits,
                                                         std::size_t trace_index) {
    auto own = l.own == kNone ? std::span<std::byte>{} : mem.subspan(l.own, p.per * p.dt);
    Staged s;
    s.p = &p;
    s.staging = l.staging == kNone ? std::span<std::byte>{} : mem.subspan(l.staging, p.numel * 2);
    s.full = mem.subspan(l.full, p.numel * (p.keep_bf16 ? 2 : 4));
    s.src = copy_in(p, own, waits, trace_index);
    return s;
}

// nc: the partition (padded to the file's alignment, which the layout
// guarantees is on disk) read into pool buffers, one piece per buffer. With
// `try_only`, nothing is read unless every buffer can be had now.
std::vector<std::shared_ptr<detail::ReadPiece>> InfinityEngine::Impl::read_partition(const ParamSource& src,
                                                                                 std::uint64_t pbytes, bool try_only) {
    const std::uint64_t align = std::max<std::uint64_t>(src.file->alignment(), 1);
    const std::uint64_t total = align_up(pbytes, align), B = pool.buffer_bytes();
    std::vector<std::shared_ptr<detail::ReadPiece>> pieces;
    for (std::uint64_t at = 0; at < total; at += B) {
        auto piece = std::make_shared<detail::ReadPiece>();
        piece->lease = try_only ? pool.try_lease("engine read-ahead of " + src.where)
                                : pool.lease("engine fetch of " + src.where);
        if (!piece->lease) return {};
        piece->future = piece->done.get_future().share();
        pieces.push_back(std::move(piece));
    }
    std::shared_ptr<detail::ReadCheck> check;
    if (src.xxh3) {
        check = std::make_shared<detail::ReadCheck>();
        check->pieces = pieces;
        check->in.assign(pieces.size(), false);
        for (std::size_t k = 0; k < pieces.size(); ++k) {
            const std::uint64_t at = k * B;
            check->real.push_back(at < pbytes ? std::min(B, pbytes - at) : 0);
            pieces[k]->check = check;
        }
        check->want = *src.xxh3;
        check->where = src.where;
        check->path = src.file->path();
        check->offset = src.offset;
        check->rank = static_cast<int>(rank);
        check->verified = check->done.get_future().share();
    }
    std::erase_if(fetch.reads_out, [](const std::shared_future<void>& f) {
        return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    for (auto& piece : pieces) fetch.reads_out.push_back(piece->future);
    if (check) fetch.reads_out.push_back(check->verified);
    for (std::size_t k = 0; k < pieces.size(); ++k) {
        auto& piece = pieces[k];
        const std::uint64_t at = k * B, n = std::min(B, total - at);
        io.read_then(*src.file, src.offset + at, piece->lease.bytes().first(n), [piece, check, k](const IoError* e) {
            // The hash first: the copy that waits for this piece finds the
            // partition's check under way, never a stream held while it runs.
            if (check) check->arrived(k, e);
            if (e)
                piece->done.set_exception(std::make_exception_ptr(*e));
            else
                piece->done.set_value();
        });
    }
    return pieces;
}

void detail::ReadCheck::arrived(std::size_t k, const IoError* e) {
    std::lock_guard lk(mu);
    if (settled) return;
    if (e) {
        settled = true;
        pieces.clear();
        done.set_exception(std::make_exception_ptr(*e));
        return;
    }
    in[k] = true;
    while (next < in.size() && in[next]) {
        hash.update(pieces[next]->lease.bytes().first(real[next]));
        pieces[next].reset();  // its lease goes back once its copy is done too
        ++next;
    }
    if (next < in.size()) return;
    settled = true;
    pieces.clear();
    const std::uint64_t got = hash.digest();
    if (got == want) {
        done.set_value();
        return;
    }
    done.set_exception(std::make_exception_ptr(
        DataError(where + ": xxh3 " + hex64(got) + " of the bytes read, the state says " + hex64(want) +
                      " (the file changed under the run, or the disk returned other bytes)",
                  {.path = path, .offset = offset, .rank = rank})));
}

// The nc stage runs further ahead than gg: past the fetches in flight, the
// partitions of the next modules on NVMe are read into pinned buffers while
// their bytes stay under the prefetch budget and at least half the pool is
// left to the fetches and the optimizer; never waiting for a buffer.
void InfinityEngine::Impl::read_ahead() {
    const auto& tr = trace.order[train];
    fetch.nc_next = std::max(fetch.nc_next, trace.pf_next);
    while (fetch.nc_next < tr.size()) {
        const TraceEntry& e = tr[fetch.nc_next];
        if (trace.reuse_from[train][fetch.nc_next] != kNone) {
            ++fetch.nc_next;
            continue;
        }
        std::vector<std::size_t> on_nvme;  // the module's parameters read from their file
        std::uint64_t bytes = 0, buffers = 0;
        for (auto list : {e.module->params(), e.module->external()})
            for (std::size_t pi : list) {
                const ParamState& p = params[pi];
                if (p.tier != shard::Tier::nvme || p.persistent) continue;
                on_nvme.push_back(pi);
                bytes += p.per * p.dt;
                buffers += (p.per * p.dt + pool.buffer_bytes() - 1) / pool.buffer_bytes();
            }
        const mem::PoolStats ps = pool.stats();
        if (fetch.nc_held + bytes > opts.prefetch_bytes || ps.in_use + buffers > ps.buffers / 2) return;
        // A parameter an update is still writing: read when it is written
        // (the next hook), never waited for here.
        for (std::size_t pi : on_nvme)
            if (!store.param_ready(pi)) return;
        for (std::size_t pi : on_nvme) {
            const ParamSource src = store.param_source(pi);
            auto pieces = read_partition(src, params[pi].per * params[pi].dt, true);
            if (pieces.empty()) return;  // the pool is busy: try again at the next hook
            fetch.pre_read[{fetch.nc_next, pi}] = {std::move(pieces), params[pi].per * params[pi].dt};
            ++st.read_ahead;
            fetch.nc_held += params[pi].per * params[pi].dt;
        }
        ++fetch.nc_next;
    }
}

// nc -> cg for one parameter: this rank's partition on the device, once the
// h2d stream gets there. `own` is where it goes (empty for the gpu tier,
// whose partition is resident).
std::span<const std::byte> InfinityEngine::Impl::copy_in(ParamState& p, std::span<std::byte> own,
                                                         const std::vector<device::Event>& waits,
                                                         std::size_t trace_index) {
    const std::uint64_t pbytes = p.per * p.dt;
    std::span<const std::byte> src_dev;  // this rank's partition on the device, once cg is done
    if (p.tier == shard::Tier::gpu) {
        // The gather reads it after the optimizer's last refresh of it: a
        // pipelined update under way has refreshed it once param_source
        // returns (it waits for the tensor's new values).
        (void)store.param_source(p.tensor);
        {
            std::lock_guard lk(refresh.mu);
            dev.wait(*coll, p.refreshed);
        }
        src_dev = {p.resident.data(), pbytes};
        st.fetched_bytes[0] += pbytes;
    } else {
        for (const auto& w : waits) dev.wait(*h2d, w);
        const ParamSource src = store.param_source(p.tensor);
        if (src.bytes != pbytes) throw InternalError("engine: " + src.where + ": partition sizes disagree");
        if (!src.file) {
            // cg straight from the optimizer's page-locked memory.
            dev.copy(*h2d, own, src.memory);
            st.fetched_bytes[1] += pbytes;
        } else {
            // nc: the reads the stage started ahead (read_ahead), or now.
            std::vector<std::shared_ptr<detail::ReadPiece>> pieces;
            if (const auto it = fetch.pre_read.find({trace_index, p.tensor}); it != fetch.pre_read.end()) {
                pieces = std::move(it->second.pieces);
                fetch.nc_held -= it->second.bytes;
                fetch.pre_read.erase(it);
            } else {
                pieces = read_partition(src, pbytes, false);
            }
            const std::uint64_t B = pool.buffer_bytes();
            std::shared_ptr<detail::ReadCheck> check = pieces.empty() ? nullptr : pieces.front()->check;
            for (std::size_t k = 0; k < pieces.size(); ++k) {
                auto piece = pieces[k];
                const std::uint64_t at = k * B;
                // cg: once the read is in, copy what belongs to the partition
                // to the device (its hash runs on the io thread meanwhile:
                // ReadCheck); the lease goes back after the copy.
                const std::uint64_t real = at < pbytes ? std::min(B, pbytes - at) : 0;
                dev.host(*h2d, [piece] { piece->future.get(); });
                if (real) dev.copy(*h2d, own.subspan(at, real), piece->lease.bytes().first(real));
                dev.host(*h2d, [piece]() mutable { piece.reset(); });
            }
            // Before anything gathers it: the partition is what the record says.
            if (check) dev.host(*h2d, [check] { check->verified.get(); });
            st.fetched_bytes[2] += pbytes;
        }
        src_dev = own;
    }
    return src_dev;
}

// gg: every rank's partitions into the full tensors of a bucket, on the
// collectives stream after the copies (and after whatever used these places
// before): one collective for the bucket, enqueued on that stream (NCCL) or
// run by a host job on it (MPI over the cpu backend's memory). An allgather moves bytes and adds
// nothing, so the bucket's split cannot change a bit.
void InfinityEngine::Impl::gather(const std::vector<Staged>& bucket, const std::vector<device::Event>& waits) {
    if (bucket.empty()) return;
    dev.wait(*coll, dev.record(*h2d));
    for (const auto& w : waits) dev.wait(*coll, w);
    if (dp > 1) {
        std::vector<Gather> all;
        all.reserve(bucket.size());
        for (const Staged& s : bucket)
            all.push_back({s.src, bf16 && !s.p->keep_bf16 ? s.staging : s.full, s.p->numel});
        const comm::DType dtype = bf16 ? comm::DType::bf16 : comm::DType::f32;
        if (coll_ordered)
            zero::enqueue_gather(*coll_comm, all, dtype, dev.native(*coll));
        else
            dev.host(*coll, [c = coll_comm, all = std::move(all), dtype] { zero::gather(*c, all, dtype); });
        ++st.collectives;
    }
    for (const Staged& s : bucket) {
        const std::uint64_t n = s.p->numel;
        if (s.p->keep_bf16) {
            if (dp == 1 && s.full.data() != s.src.data()) dev.copy(*coll, s.full, s.src.first(n * 2));
        } else if (bf16) {
            dev.cast(*coll, {reinterpret_cast<float*>(s.full.data()), n},
                     {reinterpret_cast<const std::uint16_t*>(dp > 1 ? s.staging.data() : s.src.data()), n});
        } else if (dp == 1) {
            dev.copy(*coll, s.full, s.src.first(n * 4));
        }
        st.gathered_bytes += n * s.p->dt;
    }
    // The gpu tier's next refresh writes over what these read: after them.
    std::vector<ParamState*> resident;
    for (const Staged& s : bucket)
        if (s.p->tier == shard::Tier::gpu) resident.push_back(s.p);
    if (!resident.empty()) {
        const device::Event read = dev.record(*coll);
        std::lock_guard lk(refresh.mu);
        for (ParamState* p : resident) p->last_read = read;
    }
}

}  // namespace zinf::zero
