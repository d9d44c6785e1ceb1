// reshard: the same state for a new dp degree, every new partition copied
// from the old ones through the pinned pool, each old one checked against its
// xxh3 as it is read.
#include "disk.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>

namespace zinf::shard {

using namespace detail;

namespace {

// The new layout for `dp` ranks, each record carrying what the old ones of
// its tensor and state agree on: keys this version does not know, and the
// optimizer step of the values (one for the whole tensor, or the old
// manifest is not one state).
Manifest new_layout(const Manifest& m, unsigned dp, const RunOptions& opts, const PartitionGroups& old_groups) {
    LayoutOptions lo = m.opts;
    lo.dp = dp;
    Manifest n = layout(m.spec, lo);
    n.extra = m.extra;
    if (!opts.rank_dirs.empty()) {
        if (opts.rank_dirs.size() != dp)
            throw InternalError("reshard: " + std::to_string(opts.rank_dirs.size()) + " rank folders for dp " +
                                std::to_string(dp));
        n.rank_dirs = opts.rank_dirs;
    }
    for (auto& q : n.parts) {
        const auto& olds = old_groups.at({q.tensor, q.state});
        const json::Json& first = *olds.front()->extra;
        for (auto it = first.begin(); it != first.end(); ++it) {
            bool same = std::all_of(olds.begin(), olds.end(), [&](const Partition* o) {
                return o->extra->contains(it.key()) && (*o->extra)[it.key()] == it.value();
            });
            if (same) (*q.extra)[it.key()] = it.value();
        }
        q.step = olds.front()->step;
        for (const Partition* o : olds)
            if (o->step != q.step)
                throw DataError(m.tensors[q.tensor].name + " " + q.state + ": rank " + std::to_string(o->rank) +
                                " is at step " + std::to_string(o->step) + ", rank " +
                                std::to_string(olds.front()->rank) + " at " + std::to_string(q.step) +
                                ": the manifest is not one state");
    }
    return n;
}

// One tensor and state: the old partitions read in rank order, each checked
// against its xxh3, their data poured into the new partitions in rank order.
void copy_unit(const Manifest& m, const Manifest& n, const std::vector<const Partition*>& olds,
               const std::vector<Partition*>& news, OutFiles& out, PartWriter& writer, io::Engine& engine,
               mem::PinnedPool& pool, const RunOptions& opts) {
    const std::uint64_t esize = dtype_bytes(olds.front()->dtype);
    std::size_t qi = 0;
    std::uint64_t q_left = 0;  // data bytes still to go into news[qi]
    auto open_next = [&] {
        const Partition& q = *news[qi];
        writer.start(out.files.at(q.file), q, n.opts.alignment);
        q_left = (q.last - q.first) * esize;
    };
    open_next();
    auto close_full = [&] {
        while (q_left == 0 && qi < news.size()) {
            news[qi]->xxh3 = writer.finish();
            if (opts.progress) opts.progress(news[qi]->bytes);
            if (++qi < news.size()) open_next();
        }
    };
    close_full();
    mem::Stream stream(engine, pool, {.buffers = 2, .who = "zinf-shard reshard read"});  // within the budget of reshard()
    for (const Partition* o : olds) {
        io::File file = open_data(m, *o);
        const std::uint64_t data = (o->last - o->first) * esize;
        Xxh3Stream h;
        stream.read(file, o->offset, o->bytes, [&](std::uint64_t at, std::span<const std::byte> piece) {
            check_stop(opts);
            h.update(piece);
            if (at >= data) return;  // the old padding
            piece = piece.first(std::min<std::uint64_t>(piece.size(), data - at));
            while (!piece.empty()) {
                const std::uint64_t k = std::min<std::uint64_t>(piece.size(), q_left);
                writer.append(piece.first(k));
                piece = piece.subspan(k);
                q_left -= k;
                close_full();
            }
        });
        if (o->xxh3 && h.digest() != *o->xxh3)
            throw DataError("xxh3 mismatch in the source: " + describe(m, *o) + " (manifest line " +
                                std::to_string(o->line) + "): expected " + hex64(*o->xxh3) + ", found " +
                                hex64(h.digest()) + "; nothing was resharded",
                            {0, m.path_of(*o), o->offset, static_cast<int>(o->rank)});
    }
    if (qi != news.size()) throw InternalError("reshard: " + n.tensors[olds.front()->tensor].name + " ran short of data");
}

}  // namespace

Manifest reshard(const Manifest& m, unsigned dp, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool,
                 const RunOptions& opts, Written& written) {
    if (m.dir.empty()) throw UsageError("the manifest names no data directory: reshard needs an initialised one");
    const auto old_groups = by_tensor_state(m);
    Manifest n = new_layout(m, dp, opts, old_groups);
    std::set<unsigned> all;
    for (unsigned r = 0; r < dp; ++r) all.insert(r);
    std::map<std::pair<std::size_t, std::string>, std::vector<Partition*>> new_groups;
    for (auto& q : n.parts) new_groups[{q.tensor, q.state}].push_back(&q);
    for (auto& [k, v] : new_groups)
        std::sort(v.begin(), v.end(), [](const Partition* a, const Partition* b) { return a->rank < b->rank; });
    std::vector<std::pair<std::size_t, std::string>> units;
    for (const auto& [k, v] : new_groups) units.push_back(k);
    std::sort(units.begin(), units.end());

    // Per worker: a write ring of at least two buffers and a reading stream of two.
    const std::size_t per_worker = 4;
    if (pool.buffers() < per_worker + 1)
        throw UsageError("the pinned pool (" + pool.config().describe() + ") needs at least " +
                         std::to_string(per_worker + 1) + " buffers for reshard");
    const unsigned workers = static_cast<unsigned>(
        std::min<std::size_t>(resolve_jobs(opts.jobs), (pool.buffers() - 1) / per_worker));
    // What the workers' reading streams (two buffers each) leave, for their write rings.
    const std::size_t ring = std::min<std::size_t>((pool.buffers() - 1) / workers - 2, 12);

    // The source read under a shared lock, the new directory written under
    // an exclusive one (made first, so that its committed manifest, if any,
    // is read under it).
    check_claims(n, dir, all, opts.force);  // before any lock: a refused writer writes nothing there
    Lock source = lock_state(m, LockMode::shared);
    OutFiles out;
    out.written.lock = lock_state(n, LockMode::exclusive, {}, dir, true);
    std::vector<std::string> superseded;
    try {
        check_target(dir, opts.force);
        superseded = place_beside(n, dir);
        out.open(n, dir, all, opts.force);
        Zeros zeros(pool);
        std::vector<std::vector<mem::Lease>> held(workers);
        std::deque<PartWriter> writers;
        for (auto& h : held) {
            h = pool.lease_many(ring, "zinf-shard reshard");
            writers.emplace_back(engine, spans(h, 0, ring), zeros);
        }
        run_units(units.size(), workers, opts, [&](std::size_t u, unsigned w) {
            copy_unit(m, n, old_groups.at(units[u]), new_groups.at(units[u]), out, writers[w], engine, pool, opts);
        });
        for (auto& wr : writers) wr.drain();
        writers.clear();
        held.clear();
        out.finish(engine);
    } catch (...) {
        out.discard();
        throw;
    }
    n.dir = absolute_dir(dir);
    written = out.release(std::move(superseded));
    return n;
}

}  // namespace zinf::shard
