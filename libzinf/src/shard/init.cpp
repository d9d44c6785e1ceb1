// init: every partition of a manifest written into a data directory, from
// the initial values (Philox keyed by seed, tensor, element) or another
// source (import), each hashed as it goes, under temporary names that
// commit() renames into place.
#include "disk.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

namespace zinf::shard {

using namespace detail;

Written init(Manifest& m, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts) {
    const ModelSpec spec = m.spec;
    const std::uint64_t seed = m.opts.seed;
    ValueSource initial;
    initial.fill = [spec, seed](const Tensor& t, std::uint64_t first, std::span<float> out, std::span<std::byte>) {
        fill_fp32(t, spec, seed, first, out);
    };
    return init(m, dir, engine, pool, opts, initial);
}

Written init(Manifest& m, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts,
             const ValueSource& values) {
    const auto ranks = rank_set(m, opts);
    const unsigned jobs = resolve_jobs(opts.jobs);
    // Initial (or imported) values: no optimizer step applied to them.
    for (auto& p : m.parts)
        if (ranks.count(p.rank)) p.step = 0;
    // Each worker holds a ring of buffers for the fp32 values (the master
    // copy, or the param state when it is fp32) and, with bf16 params, a
    // ring half as long for them, and the value source's scratch buffer when
    // it wants one; one more buffer holds zeros for everyone.
    const bool bf16 = m.opts.param_dtype == DType::bf16;
    const std::size_t min_ring = 2, own = values.scratch ? 1 : 0;
    const std::size_t min_worker = (bf16 ? 2 * min_ring : min_ring) + own;
    if (pool.buffers() < min_worker + 1)
        throw UsageError("the pinned pool (" + pool.config().describe() + ") needs at least " +
                         std::to_string(min_worker + 1) + " buffers for init");
    const unsigned workers = static_cast<unsigned>(std::min<std::size_t>(jobs, (pool.buffers() - 1) / min_worker));
    const std::size_t per_worker = std::min<std::size_t>((pool.buffers() - 1) / workers, 24 + own);
    const std::size_t rings = per_worker - own;
    const std::size_t bf16_ring = bf16 ? std::max(min_ring, rings / 3) : 0;
    const std::size_t fp32_ring = rings - bf16_ring;
    const std::uint64_t buf = pool.buffer_bytes();

    // One writer at a time: the directory is locked (and made) before its
    // committed manifest is read, so no other commit slips in between.
    OutFiles out;
    check_claims(m, dir, ranks, opts.force);  // before any lock: a refused writer writes nothing there
    out.written.lock = lock_state(m, LockMode::exclusive, std::vector<unsigned>(ranks.begin(), ranks.end()), dir, true);
    std::vector<std::string> superseded;
    try {
        if (ranks.count(0)) check_target(dir, opts.force);
        superseded = place_beside(m, dir);
        out.open(m, dir, ranks, opts.force);
        Zeros zeros(pool);
        // Units: (rank, tensor), every state of it at once, so each value is
        // drawn once for both the param and the master copy.
        std::vector<std::pair<unsigned, std::size_t>> units;
        for (unsigned r : ranks)
            for (std::size_t t = 0; t < m.tensors.size(); ++t) units.emplace_back(r, t);
        // Partition index by (rank, tensor, state).
        std::map<std::tuple<unsigned, std::size_t, std::string>, Partition*> index;
        for (auto& p : m.parts)
            if (ranks.count(p.rank)) index[{p.rank, p.tensor, p.state}] = &p;

        std::vector<std::vector<mem::Lease>> held(workers);
        std::deque<PartWriter> fp32_writers, bf16_writers;
        for (auto& h : held) {
            h = pool.lease_many(per_worker, "zinf-shard init");
            fp32_writers.emplace_back(engine, spans(h, 0, fp32_ring), zeros);
            if (bf16) bf16_writers.emplace_back(engine, spans(h, fp32_ring, bf16_ring), zeros);
        }
        std::vector<std::vector<float>> scratch(workers);  // bf16 without a master: values only
        run_units(units.size(), workers, opts, [&](std::size_t u, unsigned w) {
            const auto [rank, ti] = units[u];
            const Tensor& t = m.tensors[ti];
            PartWriter& fw = fp32_writers[w];
            PartWriter* bw = bf16 ? &bf16_writers[w] : nullptr;
            Partition* param = index.at({rank, ti, "param"});
            Partition* master = m.opts.train && bf16 ? index.at({rank, ti, "master"}) : nullptr;
            Partition* fp32_part = bf16 ? master : param;  // the partition written from fp32 values
            if (fp32_part) fw.start(out.files.at(fp32_part->file), *fp32_part, m.opts.alignment);
            if (bw) bw->start(out.files.at(param->file), *param, m.opts.alignment);
            const std::uint64_t per = m.elements_per_rank(t);
            for (std::uint64_t done = 0; done < per;) {
                check_stop(opts);
                std::span<float> vals;
                if (fp32_part) {
                    auto room = fw.here();
                    vals = {reinterpret_cast<float*>(room.data()), room.size() / 4};
                } else {
                    if (scratch[w].empty()) scratch[w].resize(buf / 4);
                    vals = scratch[w];
                }
                if (bw) vals = vals.first(std::min(vals.size(), bw->here().size() / 2));
                vals = vals.first(std::min<std::uint64_t>(vals.size(), per - done));
                values.fill(t, param->first + done, vals,
                            own ? held[w][rings].bytes() : std::span<std::byte>{});
                if (bw) {
                    to_bf16(vals, std::span(reinterpret_cast<std::uint16_t*>(bw->here().data()), vals.size()));
                    bw->advance(vals.size() * 2);
                }
                if (fp32_part) fw.advance(vals.size() * 4);
                done += vals.size();
                if (opts.progress) opts.progress(vals.size() * (4 * (fp32_part != nullptr) + 2 * bf16));
            }
            if (fp32_part) fp32_part->xxh3 = fw.finish();
            if (bw) param->xxh3 = bw->finish();
            // The moments start at zero.
            for (const char* s : {"exp_avg", "exp_avg_sq"}) {
                auto it = index.find({rank, ti, s});
                if (it == index.end()) continue;
                fw.start(out.files.at(it->second->file), *it->second, m.opts.alignment);
                it->second->xxh3 = fw.finish();
                if (opts.progress) opts.progress(it->second->bytes);
            }
        });
        for (auto& wr : fp32_writers) wr.drain();
        for (auto& wr : bf16_writers) wr.drain();
        fp32_writers.clear();
        bf16_writers.clear();
        held.clear();
        out.finish(engine);
    } catch (...) {
        out.discard();
        throw;
    }
    m.dir = absolute_dir(dir);
    return out.release(std::move(superseded));
}

}  // namespace zinf::shard
