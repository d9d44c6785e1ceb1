// CommittedParams (zero.hpp): the engine's parameter source when no optimizer
// runs. It reads only what the manifest commits, and writes nothing: a
// sampler may run beside (or after) a trainer without touching its state.
#include <zinf/zero.hpp>

#include <cstring>
#include <map>

namespace zinf::zero {

struct CommittedParams::Impl {
    const shard::Manifest& m;
    unsigned rank = 0;
    std::vector<const shard::Partition*> part;  // by tensor: this rank's param record
    std::map<std::string, io::File> files;      // nvme: by the record's file
    std::map<std::string, mem::Pinned> images;  // gpu, cpu: each file's bytes, whole

    io::File& file(const std::string& rel) {
        auto it = files.find(rel);
        if (it != files.end()) return it->second;
        // A data file or rank folder that is a link out of the data directory
        // (or out of the rank's node-local folder) is refused.
        const shard::Manifest::Place at = m.place(rel);
        const std::string full = at.path();
        io::File f = io::File::open_aligned(full, {.access = io::Access::read, .beneath = at.root}, m.opts.alignment,
                                            "the manifest");
        return files.emplace(rel, std::move(f)).first->second;
    }

    std::string where(std::size_t t) const { return m.tensors[t].name + " rank " + std::to_string(rank) + " param"; }
};

CommittedParams::CommittedParams(const shard::Manifest& m, unsigned rank, io::Engine& engine, mem::PinnedPool& pool)
    : impl_(std::make_unique<Impl>(Impl{m, rank, {}, {}, {}})) {
    Impl& I = *impl_;
    if (m.dir.empty()) throw DataError("the manifest has no data directory: run zinf-shard init first");
    if (!m.initialised()) throw DataError("the manifest is not initialised (records without xxh3)");
    shard::check_rank_folders(m, {rank});  // a node-local folder: the one init made for this rank
    if (rank >= m.opts.dp)
        throw InternalError("CommittedParams: rank " + std::to_string(rank) + " of dp " + std::to_string(m.opts.dp));
    I.part.assign(m.tensors.size(), nullptr);
    for (const auto& p : m.parts)
        if (p.rank == rank && p.state == "param") I.part[p.tensor] = &p;
    const std::uint64_t pbytes = shard::dtype_bytes(m.opts.param_dtype);
    std::map<std::string, std::uint64_t> ends;  // bytes each file must have
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const shard::Partition* p = I.part[t];
        if (!p) throw DataError("the manifest has no record of " + I.where(t));
        if (p->bytes != m.elements_per_rank(m.tensors[t]) * pbytes)
            throw DataError(I.where(t) + ": " + std::to_string(p->bytes) + " bytes, the layout says " +
                            std::to_string(m.elements_per_rank(m.tensors[t]) * pbytes));
        auto& e = ends[p->file];
        e = std::max(e, align_up(p->offset + p->bytes, m.opts.alignment));
    }
    if (m.opts.param_tier == shard::Tier::nvme) {
        for (const auto& [rel, end] : ends) {
            io::File& f = I.file(rel);
            if (f.size() < end)
                throw DataError(m.path_of(rel) + ": " + std::to_string(f.size()) +
                                " bytes, but rank " + std::to_string(rank) + "'s param partitions reach " +
                                std::to_string(end));
        }
        return;
    }
    // gpu and cpu: the rank's partitions live in memory for the run, each
    // checked against its record now (the engine checks only file reads).
    for (const auto& [rel, end] : ends) {
        io::File& f = I.file(rel);
        if (f.size() < end)
            throw DataError(m.path_of(rel) + ": " + std::to_string(f.size()) + " bytes, but rank " +
                            std::to_string(rank) + "'s param partitions reach " + std::to_string(end));
        mem::Pinned image = pool.pin(end, "committed parameters in memory");
        engine.wait(engine.read(f, 0, image.bytes()));
        I.images.emplace(rel, std::move(image));
    }
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const shard::Partition& p = *I.part[t];
        const std::uint64_t got = xxh3(I.images.at(p.file).bytes().subspan(p.offset, p.bytes));
        if (got != *p.xxh3)
            throw DataError(I.where(t) + ": xxh3 " + hex64(got) + " of the bytes read, the manifest says " +
                                hex64(*p.xxh3),
                            {.path = m.path_of(p.file), .offset = p.offset, .rank = static_cast<int>(rank)});
    }
}

CommittedParams::~CommittedParams() = default;

ParamSource CommittedParams::param_source(std::size_t tensor) {
    Impl& I = *impl_;
    if (tensor >= I.part.size()) throw InternalError("param_source(): tensor " + std::to_string(tensor));
    const shard::Partition& p = *I.part[tensor];
    ParamSource src;
    src.bytes = p.bytes;
    src.where = I.where(tensor);
    if (const auto it = I.images.find(p.file); it != I.images.end()) {
        src.memory = it->second.bytes().subspan(p.offset, p.bytes);
        return src;
    }
    src.file = &I.file(p.file);
    src.offset = p.offset;
    src.xxh3 = p.xxh3;
    return src;
}

void CommittedParams::put_gradient(std::size_t tensor, std::span<const float>) {
    throw InternalError("the committed parameters of " + impl_->where(tensor) +
                        " take no gradient: a training pass needs the optimizer");
}

}  // namespace zinf::zero
