// Reading a committed state back: verify hashes every partition again
// against its xxh3, cat gathers one tensor from its partitions.
#include "disk.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace zinf::shard {

using namespace detail;

VerifyResult verify(const Manifest& m, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts) {
    const auto ranks = rank_set(m, opts);
    // No writer beside: what is read is one state (a reader's lock).
    const Lock lock = opts.lock ? lock_state(m, LockMode::shared) : Lock();
    for (const auto& p : m.parts)
        if (ranks.count(p.rank) && !p.xxh3)
            throw DataError("line " + std::to_string(p.line) + ": " + describe(m, p) +
                            " has no xxh3: the manifest was not written by 'init'");
    // One unit per file: read front to back, each partition hashed in order.
    std::map<std::string, std::vector<const Partition*>> by_file;
    for (const auto& p : m.parts)
        if (ranks.count(p.rank)) by_file[p.file].push_back(&p);
    std::vector<std::pair<std::string, std::vector<const Partition*>>> files(by_file.begin(), by_file.end());
    for (auto& [f, ps] : files)
        std::sort(ps.begin(), ps.end(), [](const Partition* a, const Partition* b) { return a->offset < b->offset; });
    const unsigned jobs = static_cast<unsigned>(std::max<std::size_t>(
        1, std::min<std::size_t>(resolve_jobs(opts.jobs), pool.buffers() / 2)));
    std::atomic<std::uint64_t> bytes{0};
    run_units(files.size(), jobs, opts, [&](std::size_t u, unsigned) {
        const auto& parts = files[u].second;  // (not a structured binding: clang 14 cannot capture one)
        const std::string path = m.path_of(*parts.front());
        io::File file = open_data(m, *parts.front());
        const std::uint64_t size = file.size();
        for (const Partition* p : parts)
            if (p->offset + p->bytes > size)
                throw DataError("short file: " + describe(m, *p) + " needs bytes [" + std::to_string(p->offset) +
                                    ", " + std::to_string(p->offset + p->bytes) + ") but the file has " +
                                    std::to_string(size),
                                {0, path, p->offset, static_cast<int>(p->rank)});
        const std::uint64_t end = parts.back()->offset + parts.back()->bytes;
        std::size_t i = 0;
        std::optional<Xxh3Stream> h;
        mem::Stream stream(engine, pool, {.buffers = std::max<std::size_t>(2, pool.buffers() / jobs), .who = "zinf-shard verify"});
        stream.read(file, 0, end, [&](std::uint64_t at, std::span<const std::byte> piece) {
            check_stop(opts);
            while (!piece.empty() && i < parts.size()) {
                const Partition& p = *parts[i];
                if (at < p.offset) {  // alignment gap before the partition
                    const std::uint64_t skip = std::min<std::uint64_t>(piece.size(), p.offset - at);
                    at += skip;
                    piece = piece.subspan(skip);
                    continue;
                }
                if (!h) h.emplace();
                const std::uint64_t n = std::min<std::uint64_t>(piece.size(), p.offset + p.bytes - at);
                h->update(piece.first(n));
                at += n;
                piece = piece.subspan(n);
                if (at == p.offset + p.bytes) {
                    const std::uint64_t got = h->digest();
                    h.reset();
                    if (got != *p.xxh3)
                        throw DataError("xxh3 mismatch: " + describe(m, p) + " (bytes [" + std::to_string(p.offset) +
                                            ", " + std::to_string(p.offset + p.bytes) + ")" +
                                            (p.line ? ", manifest line " + std::to_string(p.line) : std::string()) +
                                            "): expected " + hex64(*p.xxh3) + ", found " +
                                            hex64(got),
                                        {0, path, p.offset, static_cast<int>(p.rank)});
                    bytes.fetch_add(p.bytes);
                    if (opts.progress) opts.progress(p.bytes);
                    ++i;
                }
            }
        });
        file.close();
    });
    VerifyResult r;
    r.bytes = bytes.load();
    for (const auto& [f, ps] : files) r.partitions += ps.size();
    return r;
}

// ---------------------------------------------------------------------------
void cat(const Manifest& m, std::size_t tensor, const std::string& state, io::Engine& engine, mem::PinnedPool& pool,
         const Sink& sink) {
    if (std::find(m.states.begin(), m.states.end(), state) == m.states.end())
        throw UsageError("state '" + state + "' is not in this manifest (" + json::Json(m.states).dump() + ")");
    if (tensor >= m.tensors.size())
        throw UsageError("tensor index " + std::to_string(tensor) + " is past the model's " +
                         std::to_string(m.tensors.size()) + " tensors");
    auto groups = by_tensor_state(m);
    mem::Stream stream(engine, pool, {.who = "zinf-shard cat"});
    for (const Partition* p : groups.at({tensor, state})) {
        if (p->last == p->first) continue;
        io::File file = open_data(m, *p);
        stream.read(file, p->offset, (p->last - p->first) * dtype_bytes(p->dtype),
                    [&](std::uint64_t, std::span<const std::byte> piece) { sink(piece); });
    }
}

// ---------------------------------------------------------------------------
std::optional<std::string> find_nonfinite(const Manifest& m, const std::vector<std::string>& states,
                                          io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts) {
    const auto ranks = rank_set(m, opts);
    const Lock lock = opts.lock ? lock_state(m, LockMode::shared) : Lock();
    mem::Stream stream(engine, pool, {.who = "zinf: a check for values that are not finite"});
    for (const auto& p : m.parts) {
        if (!ranks.count(p.rank) || std::find(states.begin(), states.end(), p.state) == states.end()) continue;
        if (p.last == p.first) continue;
        const std::size_t eb = dtype_bytes(p.dtype);
        std::optional<std::string> found;
        io::File file = open_data(m, p);
        stream.read(file, p.offset, (p.last - p.first) * eb, [&](std::uint64_t at, std::span<const std::byte> piece) {
            check_stop(opts);
            if (found) return;
            for (std::size_t i = 0; i + eb <= piece.size(); i += eb) {
                float v;
                if (p.dtype == DType::fp32) {
                    std::memcpy(&v, piece.data() + i, 4);
                } else {
                    std::uint16_t b;
                    std::memcpy(&b, piece.data() + i, 2);
                    v = from_bf16(b);
                }
                if (std::isfinite(v)) continue;
                const std::uint64_t index = p.first + (at + i) / eb;
                found = m.tensor_of(p).name + " element " + std::to_string(index) + " is " +
                        (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") + " (rank " + std::to_string(p.rank) + " " +
                        p.state + ", " + m.path_of(p) + ")";
                return;
            }
        });
        if (found) return found;
    }
    return std::nullopt;
}

}  // namespace zinf::shard
