// The tiered optimizer step (zero.hpp): this rank's partitions of every
// state, held in memory or streamed from their files in chunks through the
// pinned pool, read / update / write overlapped, committed by manifest.
#include "optimizer.hpp"

#include <zinf/zero.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include <unistd.h>

namespace zinf::zero {

std::string detail::RoleState::name(int g) const { return base + shard::kGenerations[g]; }

using detail::Chunk;
using detail::Piece;
using detail::Role;
using detail::RoleState;

namespace {

std::string where_of(const shard::Manifest& m, std::size_t t, unsigned rank, const std::string& state) {
    return m.tensors[t].name + " rank " + std::to_string(rank) + " " + state;
}

bool has_master(const shard::Manifest& m) {
    return std::find(m.states.begin(), m.states.end(), "master") != m.states.end();
}

// The update runs on the device (zero.hpp, OptimizerOptions::device): a
// device given, the optimizer state on the gpu tier, and the working
// parameters there too (the update writes them; fp32 ones are the master
// weights themselves).
bool device_update(const shard::Manifest& m, const OptimizerOptions& o) {
    return o.device && m.opts.optim_tier == shard::Tier::gpu && m.opts.param_tier == shard::Tier::gpu;
}

// The bytes of `rank`'s file of `state` its partitions reach, aligned (RoleState::end).
std::uint64_t state_end(const shard::Manifest& m, unsigned rank, const std::string& state) {
    std::uint64_t end = 0;
    for (const auto& part : m.parts)
        if (part.rank == rank && part.state == state)
            end = std::max(end, align_up(part.offset + part.bytes, m.opts.alignment));
    return end;
}

// One piece's AdamW views, where `at(role, piece)` says its bytes are (host
// memory and file buffers, or the device arena): the master weights, the
// moments, the gradient in its dtype, and the bf16 working copy when there is one.
template <class At>
optim::Update piece_update(const At& at, const Piece& p, shard::DType grad, bool param) {
    const std::size_t n = p.e1 - p.e0;
    optim::Update u;
    u.master = {reinterpret_cast<float*>(at(Role::master, p)), n};
    u.exp_avg = {reinterpret_cast<float*>(at(Role::exp_avg, p)), n};
    u.exp_avg_sq = {reinterpret_cast<float*>(at(Role::exp_avg_sq, p)), n};
    if (grad == shard::DType::fp32)
        u.grad_f32 = {reinterpret_cast<const float*>(at(Role::grad, p)), n};
    else
        u.grad_bf16 = {reinterpret_cast<const std::uint16_t*>(at(Role::grad, p)), n};
    if (param) u.param_bf16 = {reinterpret_cast<std::uint16_t*>(at(Role::param, p)), n};
    return u;
}
}  // namespace

std::uint64_t Optimizer::device_bytes(const shard::Manifest& m, unsigned rank, const OptimizerOptions& opts) {
    if (!device_update(m, opts)) return 0;
    const auto block = [](std::uint64_t b) { return align_up(std::max<std::uint64_t>(b, 1), mem::kArenaAlignment); };
    std::uint64_t bytes = block(detail::packed_layout(m.tensors, m.opts, opts.grad_dtype).bytes);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) bytes += block(state_end(m, rank, state));
    bytes += block(state_end(m, rank, has_master(m) ? "master" : "param"));
    if (has_master(m)) bytes += block(state_end(m, rank, "param"));
    return bytes;
}

// ---------------------------------------------------------------------------
Optimizer::Impl::Impl(shard::Manifest& man, comm::Communicator& c, io::Engine& eng, mem::PinnedPool& p,
                      const OptimizerOptions& o)
    : m(man), comm(c), engine(eng), pool(p), opts(o) {
    opts.adamw.validate();
    lr = opts.adamw.lr;
    if (!(opts.grad_clip >= 0) || !std::isfinite(opts.grad_clip))
        throw UsageError("--grad-clip must be finite and >= 0");
    if (opts.slots < 2) throw UsageError("the optimizer needs at least 2 chunks in flight (slots)");
    if (!m.opts.train) throw DataError("the manifest holds no optimizer state (laid out with --inference)");
    if (m.dir.empty()) throw DataError("the manifest has no data directory: run zinf-shard init first");
    if (!m.initialised()) throw DataError("the manifest is not initialised (records without xxh3)");
    if (static_cast<unsigned>(comm.size()) != m.opts.dp)
        throw UsageError("the manifest is laid out for dp " + std::to_string(m.opts.dp) + ", but " +
                         std::to_string(comm.size()) + " rank(s) run the optimizer");
    rank = static_cast<unsigned>(comm.rank());
    on_device = device_update(m, opts);
    if (on_device) dev = opts.device;
    else if (m.opts.optim_tier == shard::Tier::gpu)
        log::warn_once("optim-gpu-tier", std::string("gpu-tier optimizer state is held in host memory and updated "
                                                     "by the CPU AdamW: ") +
                                             (opts.device ? "the working parameters are not on the gpu tier"
                                                          : "no device was given to the optimizer"));
    path = opts.manifest_path.empty() ? m.dir + "/manifest.jsonl" : opts.manifest_path;
    alignment = m.opts.alignment;
    tensor_count = m.tensors.size();

    // Every record at one step: a manifest with memory-held state not saved
    // since the last step is not a complete state.
    step = m.parts.front().step;
    for (const auto& part : m.parts)
        if (part.step != step)
            throw DataError("the manifest's states are at different steps (" + where_of(m, part.tensor, part.rank, part.state) +
                            " at " + std::to_string(part.step) + ", " +
                            where_of(m, m.parts.front().tensor, m.parts.front().rank, m.parts.front().state) + " at " +
                            std::to_string(step) +
                            "): it is not one state (the optimizer never commits such a manifest; was it "
                            "assembled from two runs?)");

    index_records();
    const bool masters = has_master(m);
    setup_role(Role::master, masters ? "master" : "param");
    setup_role(Role::exp_avg, "exp_avg");
    setup_role(Role::exp_avg_sq, "exp_avg_sq");
    if (masters) setup_role(Role::param, "param");
    for (Role r : {Role::master, Role::exp_avg, Role::exp_avg_sq, Role::param})
        if (roles[r].present && !roles[r].file) commit_steps = false;
    // Speculation needs the previous generation of everything the update
    // reads (a redo starts from it): every state but the bf16 parameters
    // streamed from its file. With master weights or moments in memory an
    // overlapped optimizer updates after backward, as without overlap.
    speculative = opts.overlap;
    for (Role r : {Role::master, Role::exp_avg, Role::exp_avg_sq})
        if (roles[r].present && !roles[r].file) speculative = false;
    if (opts.overlap && !speculative)
        log::debug("optimizer: the master weights and moments are held in memory, so the update runs after "
                  "backward (an update overlapped with backward could not be redone exactly without a second "
                  "copy of them)");
    speculated.assign(tensor_count, false);
    try {
        setup_grad();
        plan_chunks();
        plan_readahead();
        prepare_step();  // the files the first step writes exist before it starts
    } catch (...) {
        // Neither gradient scratch file outlives a failed open (the second
        // is made where the run is pipelined).
        if (grad_scratch)
            for (int slot = 0; slot < 2; ++slot) ::unlink(m.path_of(roles[Role::grad].name(slot)).c_str());
        throw;
    }
    if (speculative) worker = std::thread([this] { work(); });
    if (!file_roles.empty()) flusher = std::thread([this] { flush_loop(); });
}

Optimizer::Impl::~Impl() {
    // A pipelined update not settled: done, never committed (the manifest
    // names the step before it).
    if (pend_thread.joinable()) pend_thread.join();
    if (worker.joinable()) {
        {
            std::lock_guard lk(mu);
            quit = true;
        }
        cv.notify_all();
        worker.join();
    }
    if (flusher.joinable()) {
        {
            std::lock_guard lk(flush_mu);
            flush_quit = true;
        }
        flush_cv.notify_all();
        flusher.join();
    }
    auto& g = roles[Role::grad];
    if (g.file) {
        // Scratch, removed at once: no error of its close can lose anything.
        for (int slot = 0; slot < grad_slots; ++slot) {
            g.gen_f[slot] = io::File();
            ::unlink(m.path_of(g.name(slot)).c_str());
        }
    }
}

void Optimizer::Impl::index_records() {
    by_key.assign(tensor_count * m.opts.dp * m.states.size(), nullptr);
    for (auto& part : m.parts) {
        const std::size_t s = static_cast<std::size_t>(
            std::find(m.states.begin(), m.states.end(), part.state) - m.states.begin());
        by_key[(part.tensor * m.opts.dp + part.rank) * m.states.size() + s] = &part;
    }
}

shard::Partition* Optimizer::Impl::record(std::size_t t, unsigned r, const std::string& state) const {
    const std::size_t s =
        static_cast<std::size_t>(std::find(m.states.begin(), m.states.end(), state) - m.states.begin());
    return by_key[(t * m.opts.dp + r) * m.states.size() + s];
}

io::File Optimizer::Impl::open_file(const std::string& rel, bool create, std::uint64_t bytes, io::Direct direct) {
    const shard::Manifest::Place at = m.place(rel);
    const std::string full = at.path();
    io::OpenOptions oo{.access = io::Access::read_write, .create = create, .direct = direct};
    // A state file or rank folder that is a link out of the data directory
    // (or out of the rank's node-local folder) is refused.
    oo.beneath = at.root;
    io::File f = io::File::open_aligned(full, oo, alignment, "the manifest");
    if (create && f.size() < bytes) {
        f.preallocate(bytes);
        fsync_dir(std::filesystem::path(full).parent_path().string());  // the name, too, must survive a crash before the commit names it
    }
    if (f.size() < bytes)
        throw DataError(full + ": " + std::to_string(f.size()) + " bytes, but this rank's partitions reach " +
                        std::to_string(bytes));
    return f;
}

io::File& Optimizer::Impl::gen_file(detail::RoleState& rs, int g, bool create) {
    if (!rs.gen_f[g].impl()) rs.gen_f[g] = open_file(rs.name(g), create, rs.end);
    return rs.gen_f[g];
}

void Optimizer::Impl::setup_role(Role r, const std::string& state) {
    RoleState& rs = roles[r];
    rs.present = true;
    rs.state = state;
    rs.dtype = shard::state_dtype(m.opts, state);
    rs.dt = shard::dtype_bytes(rs.dtype);
    rs.file = (state == "param" ? m.opts.param_tier : m.opts.optim_tier) == shard::Tier::nvme;
    rs.offset.resize(tensor_count);
    rs.part.resize(tensor_count);
    rs.hash.resize(tensor_count);
    rs.read_hash.resize(tensor_count);
    rs.new_hash.assign(tensor_count, 0);
    rs.cur_hash.assign(tensor_count, 0);
    for (std::size_t t = 0; t < tensor_count; ++t) {
        shard::Partition* part = record(t, rank, state);
        if (!part) throw DataError("the manifest has no record of " + where_of(m, t, rank, state));
        if (t == 0) {
            const int g = shard::generation_of(part->file);
            if (g < 0)
                throw DataError(where_of(m, t, rank, state) + ": file " + part->file +
                                " does not end in .bin, so the optimizer cannot name its next generation");
            rs.base = shard::generation_base(part->file);
            rs.cur = rs.committed = g;
        } else if (part->file != rs.name(rs.cur)) {
            throw DataError(where_of(m, t, rank, state) + " is in " + part->file + ", " +
                            where_of(m, 0, rank, state) + " in " + rs.name(rs.cur) +
                            ": the optimizer needs each rank's state in one file per state");
        }
        rs.part[t] = part;
        rs.cur_hash[t] = part->xxh3.value_or(0);
        rs.offset[t] = part->offset;
        rs.end = std::max(rs.end, align_up(part->offset + part->bytes, alignment));
    }
    if (rs.file) {
        gen_file(rs, rs.cur, false);
        return;
    }
    // Held in memory for the run: read now, every partition checked.
    rs.image = pool.pin(rs.end, "optimizer's " + state + " in memory");
    io::File f = open_file(rs.name(rs.cur), false, rs.end);
    engine.wait(engine.read(f, 0, rs.image.bytes()));
    for (std::size_t t = 0; t < tensor_count; ++t) {
        const shard::Partition& part = *rs.part[t];
        const std::uint64_t h = xxh3(rs.image.bytes().subspan(part.offset, part.bytes));
        if (part.xxh3 && h != *part.xxh3)
            throw DataError(where_of(m, t, rank, state) + ": xxh3 " + hex64(h) + ", the manifest says " +
                                hex64(*part.xxh3),
                            {.path = m.path_of(part.file), .offset = part.offset, .rank = static_cast<int>(rank)});
    }
    if (!on_device) return;
    // On the device for the run: the checked bytes copied there, the host's
    // image given back.
    rs.dev = dev->arena().allocate(std::max<std::uint64_t>(rs.end, 1), "optimizer's gpu-tier " + state);
    device::Stream& s = dev->h2d();
    dev->copy(s, {rs.dev.data(), rs.end}, rs.image.bytes().first(rs.end));
    dev->synchronize(s);
    rs.image = mem::Pinned();
}

void Optimizer::Impl::setup_grad() {
    RoleState& g = roles[Role::grad];
    g.present = true;
    g.state = "gradient";
    g.dtype = opts.grad_dtype;
    g.dt = shard::dtype_bytes(g.dtype);
    grad_scratch = m.opts.optim_tier == shard::Tier::nvme;
    g.file = grad_scratch;
    detail::PackedLayout layout = detail::packed_layout(m.tensors, m.opts, g.dtype);
    g.offset = std::move(layout.offset);
    g.end = layout.bytes;
    grad_sq.assign(tensor_count, 0);
    have_grad.assign(tensor_count, false);
    mem_budget = memory_budget();
    const std::string folder = std::filesystem::path(roles[Role::master].base).parent_path().string();
    g.base = (folder.empty() ? "" : folder + "/") + "grad";
    if (grad_scratch)  // scratch: whatever a crashed run left is void
        for (int slot = 0; slot < 2; ++slot) ::unlink(m.path_of(g.name(slot)).c_str());
    // The scratch in memory when the budget holds it (OptimizerOptions::
    // readahead): written and read within the step, it never needs a file,
    // and a file's dirty pages reach the drive whether memory is free or
    // not (the kernel writes them back past vm.dirty_background_ratio, 10%
    // of memory, or after 30 s: gpt2-1.5b's 6.2 GB did every step;
    // BENCHMARKS.md, issue 28).
    if (grad_scratch && g.end <= mem_budget) {
        try {
            g.image = pool.pin(std::max<std::uint64_t>(g.end, 1), "optimizer's gradient scratch in memory");
            g.file = false;
            mem_budget -= g.end;
        } catch (const std::exception& e) {
            log::warn("optimizer: the gradients' scratch goes to " + m.path_of(g.name(0)) +
                      ": the host refused its memory: " + e.what());
        }
    }
    if (!g.file) {
        if (!g.image) g.image = pool.pin(std::max<std::uint64_t>(g.end, 1), "optimizer's gradients in memory");
        // Handed over on the host (their norm is the host's), copied to the
        // device by the update.
        if (on_device) g.dev = dev->arena().allocate(std::max<std::uint64_t>(g.end, 1), "optimizer's gradients");
    } else {
        // Past the budget, a file through the page cache, unlike every state
        // file: direct writes would put the gradients in the drive's write
        // cache, and every step's commit would flush them to the medium with
        // the state.
        g.gen_f[0] = open_file(g.name(0), true, g.end, io::Direct::buffered);
    }
    if (!opts.pipeline) return;
    // The pipelined update under the next backward: a second scratch where
    // the first is, in memory from the same budget (the gradients held in
    // memory on the gpu and cpu tiers too), or a second file. Where memory
    // does not hold it, the update is settled before the next backward, as
    // with one (and says so in the step record: update_under_backward).
    std::string refused;
    if (g.file) {
        g.gen_f[1] = open_file(g.name(1), true, g.end, io::Direct::buffered);
        grad_slots = 2;
    } else if (g.end > mem_budget) {
        refused = "it needs " + format_size(g.end) + ", the optimizer's memory budget has " + format_size(mem_budget) +
                  " left (--optimizer-readahead)";
    } else {
        try {
            grad_alt = pool.pin(std::max<std::uint64_t>(g.end, 1), "optimizer's second gradient scratch in memory");
            mem_budget -= g.end;
            grad_slots = 2;
        } catch (const std::exception& e) {
            refused = std::string("the host refused its memory: ") + e.what();
        }
    }
    if (grad_slots == 1) slot_refused = refused;
}

// One rank without a second scratch makes every rank settle before the
// backward (the settle's collectives are at one point on every rank).
void Optimizer::Impl::agree_grad_slots() {
    if (!opts.pipeline) return;
    std::uint8_t single = grad_slots == 1 ? 1 : 0;
    if (comm.size() > 1)
        comm.allreduce(std::as_bytes(std::span(&single, 1)), std::as_writable_bytes(std::span(&single, 1)),
                       comm::DType::u8, comm::Reduce::max);
    if (single && grad_slots == 2) {
        auto& g = roles[Role::grad];
        if (g.file) {
            g.gen_f[1] = io::File();
            ::unlink(m.path_of(g.name(1)).c_str());
        } else {
            grad_alt = mem::Pinned();
            mem_budget += g.end;
        }
        grad_slots = 1;
        slot_refused = "another rank has none";
    }
    if (single && rank == 0)
        log::info("optimizer: no second gradient scratch (" + slot_refused +
                  "): each step's update is settled before the next step's backward");
}

// The optimizer's memory beside its base (OptimizerOptions::readahead):
// the budget given, or what the host can spare less what the caller will
// still take.
std::uint64_t Optimizer::Impl::memory_budget() const {
    if (opts.readahead != OptimizerOptions::kReadaheadAuto) return opts.readahead;
    const std::uint64_t spare = readahead_spare(comm.local_size());
    return spare > opts.readahead_reserve ? spare - opts.readahead_reserve : 0;
}

detail::PackedLayout detail::packed_layout(std::span<const shard::Tensor> tensors, const shard::LayoutOptions& lo,
                                           shard::DType dtype) {
    const std::uint64_t dt = shard::dtype_bytes(dtype);
    PackedLayout out;
    out.offset.reserve(tensors.size());
    for (const auto& t : tensors) {
        out.offset.push_back(out.bytes);
        out.bytes = align_up(out.bytes + shard::owned(t.numel, lo.dp, 0).per * dt, lo.alignment);
    }
    return out;
}

std::uint64_t Optimizer::Impl::per(std::size_t t) const { return shard::owned(m.tensors[t].numel, m.opts.dp, 0).per; }

// ---------------------------------------------------------------------------
// Chunks: how much of each file one read or write covers. Every file role's
// piece must fit piece_bytes; a chunk ends where a file's next partition is
// not adjacent, and cuts inside a partition at multiples of cut_unit
// elements, where
// every dtype's offset stays aligned.
void Optimizer::Impl::plan_chunks() {
    std::vector<Role> files;
    for (int r = 0; r < Role::count; ++r)
        if (roles[r].present && roles[r].file) files.push_back(static_cast<Role>(r));
    file_roles = files;
    std::vector<std::size_t> all(tensor_count);
    std::iota(all.begin(), all.end(), std::size_t{0});
    if (files.empty()) {
        all_chunks = cut(all);
        return;
    }
    const std::size_t k = files.size(), N = pool.buffers(), B = pool.buffer_bytes();
    const std::size_t reserve = speculative && roles[Role::grad].file ? 2 : 0;  // put_gradient's stream
    slots = opts.slots;
    const std::size_t avail = N > reserve ? N - reserve : 0;
    if (avail < 2)
        throw UsageError("the pinned pool has " + std::to_string(N) + " buffer(s); the optimizer step needs " +
                         std::to_string(2 + reserve) + " or more (raise --pinned or lower --pinned-buffer)");
    slots = std::min<std::size_t>(slots, avail);
    per_buffer = (slots * k + avail - 1) / avail;
    piece_bytes = align_down(B / per_buffer, alignment);
    const std::uint64_t block = engine.config().block_size;
    if (piece_bytes >= block) piece_bytes = align_down(piece_bytes, block);
    cut_unit = alignment / 2;
    if (piece_bytes < 4 * cut_unit)
        throw UsageError("the pinned pool's buffers (" + format_size(B) + ") are too small for " +
                         std::to_string(slots) + " chunks of " + std::to_string(k) +
                         " states: each piece would be under " + format_size(4 * cut_unit) +
                         " (raise --pinned-buffer or --pinned)");
    leases = (slots * k + per_buffer - 1) / per_buffer;
    if (slots < opts.slots)
        log::warn("the pinned pool has " + std::to_string(N) + " buffers: " + std::to_string(slots) +
                  " chunks in flight instead of " + std::to_string(opts.slots));
    ahead = 1;
    behind = slots > 2 ? slots - 2 : 1;
    plan_depths(k, B);
    all_chunks = cut(all);
}

// Reads beside writes. A chunk's reads (master weights and moments) and
// its writes (those and the working parameters) take the disk for
// bytes / bandwidth each; with the rank's share of the disk known, the
// update keeps kDepth chunks in flight besides the one it updates, in the
// buffers the default takes for its `slots` (smaller pieces), shared out
// as the two directions' times are: the slower direction gets the deeper
// queue, so that neither waits for the other while the disk has room. The
// gradients' scratch file is read through the page cache and counts for
// nothing. Kept at the default when the pieces would fall under a block.
void Optimizer::Impl::plan_depths(std::size_t k, std::uint64_t B) {
    constexpr std::size_t kDepth = 4;
    if (!(opts.disk.read_bps > 0 && opts.disk.write_bps > 0) || opts.slots != OptimizerOptions{}.slots) return;
    double read_s = 0, write_s = 0;  // per element of a chunk
    for (Role r : file_roles) {
        if (r != Role::param && r != Role::grad) read_s += static_cast<double>(roles[r].dt) / opts.disk.read_bps;
        if (r != Role::grad) write_s += static_cast<double>(roles[r].dt) / opts.disk.write_bps;
    }
    if (!(read_s > 0 && write_s > 0)) return;
    const std::size_t S = kDepth + 1;
    const std::size_t pb = (S * k + leases - 1) / leases;
    std::uint64_t piece = align_down(B / pb, alignment);
    const std::uint64_t block = engine.config().block_size;
    if (piece < std::max<std::uint64_t>(block, 4 * cut_unit)) return;
    piece = align_down(piece, block);
    const auto w = static_cast<std::size_t>(std::lround(static_cast<double>(kDepth) * write_s / (read_s + write_s)));
    behind = std::clamp<std::size_t>(w, 1, kDepth - 1);
    ahead = kDepth - behind;
    slots = S;
    per_buffer = pb;
    piece_bytes = piece;
    leases = (slots * k + per_buffer - 1) / per_buffer;
}

std::uint64_t readahead_spare(int local_ranks) {
    return readahead_spare(meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal"), local_ranks);
}

std::uint64_t readahead_spare(std::uint64_t avail, std::uint64_t total, int local_ranks) {
    const std::uint64_t margin = std::max<std::uint64_t>(GiB, total / 8);
    return avail > margin ? (avail - margin) / static_cast<std::uint64_t>(std::max(1, local_ranks)) : 0;
}

// The read-ahead's memory: the chunks of all_chunks whose pieces of the
// master weights and moments fit the budget, from the first, each piece at
// an aligned offset.
void Optimizer::Impl::plan_readahead() {
    if (!speculative) return;
    for (Role r : {Role::master, Role::exp_avg, Role::exp_avg_sq})
        if (roles[r].present && roles[r].file) ra_roles.push_back(r);
    std::vector<std::uint64_t> need(all_chunks.size(), 0);
    for (std::size_t i = 0; i < all_chunks.size(); ++i)
        for (Role r : ra_roles) need[i] += align_up(all_chunks[i].hi[r] - all_chunks[i].lo[r], alignment);
    ra_state_bytes = std::accumulate(need.begin(), need.end(), std::uint64_t{0});
    if (opts.readahead == 0) {
        ra_roles.clear();
        return;
    }
    // What the gradients' scratch left of the budget; by default, with the
    // scratch in a file, less room for its pages in the page cache too (a
    // read-ahead that pushed them out would cost more disk than it saves).
    std::uint64_t budget = mem_budget;
    if (opts.readahead == OptimizerOptions::kReadaheadAuto && roles[Role::grad].file)
        budget = budget > roles[Role::grad].end ? budget - roles[Role::grad].end : 0;
    std::uint64_t bytes = 0;
    while (ra_chunks < all_chunks.size() && bytes + need[ra_chunks] <= budget) bytes += need[ra_chunks++];
    if (ra_chunks == 0) {
        if (opts.readahead != OptimizerOptions::kReadaheadAuto)
            log::debug("optimizer: a read-ahead budget of " + format_size(budget) + " holds no chunk (the first needs " +
                       format_size(need.empty() ? 0 : need[0]) + "): no read-ahead");
        ra_roles.clear();
        return;
    }
    ra_bytes = bytes;  // taken by the first step that reads ahead (read_ahead)
    ra_at.assign(ra_chunks, std::vector<std::uint64_t>(file_roles.size(), 0));
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < ra_chunks; ++i)
        for (std::size_t j = 0; j < file_roles.size(); ++j) {
            const Role r = file_roles[j];
            if (!is_ra_role(r)) continue;
            ra_at[i][j] = at;
            at += align_up(all_chunks[i].hi[r] - all_chunks[i].lo[r], alignment);
        }
    ra_tickets.resize(ra_chunks);
    chunk_tensors.assign(ra_chunks, {});
    for (std::size_t i = 0; i < ra_chunks; ++i)
        for (const Piece& p : all_chunks[i].pieces)
            if (chunk_tensors[i].empty() || chunk_tensors[i].back() != p.tensor) chunk_tensors[i].push_back(p.tensor);
}

bool Optimizer::Impl::adjacent(std::size_t a, std::size_t b) const {
    for (Role r : file_roles) {
        const RoleState& rs = roles[r];
        if (rs.offset[b] != align_up(rs.offset[a] + per(a) * rs.dt, alignment)) return false;
    }
    return true;
}

std::vector<Chunk> Optimizer::Impl::cut(const std::vector<std::size_t>& tensors) const {
    std::vector<Chunk> out;
    if (file_roles.empty()) {
        Chunk c;
        for (std::size_t t : tensors) c.pieces.push_back({t, 0, per(t)});
        out.push_back(std::move(c));
        return out;
    }
    std::size_t max_dt = 0;
    for (Role r : file_roles) max_dt = std::max(max_dt, roles[r].dt);
    Chunk c;
    std::uint64_t used = 0;  // the largest file span of the chunk so far
    auto close = [&] {
        if (c.pieces.empty()) return;
        for (Role r : file_roles) {
            const Piece &a = c.pieces.front(), &z = c.pieces.back();
            c.lo[r] = roles[r].offset[a.tensor] + a.e0 * roles[r].dt;
            c.hi[r] = z.e1 == per(z.tensor)
                          ? align_up(roles[r].offset[z.tensor] + per(z.tensor) * roles[r].dt, alignment)
                          : roles[r].offset[z.tensor] + z.e1 * roles[r].dt;
        }
        out.push_back(std::move(c));
        c = Chunk{};
        used = 0;
    };
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::size_t t = tensors[i];
        if (!c.pieces.empty() && !adjacent(c.pieces.back().tensor, t)) close();
        std::uint64_t e = 0;
        const std::uint64_t n = per(t);
        while (e < n) {
            // The span the rest of this partition takes, gap included.
            std::uint64_t need = 0;
            for (Role r : file_roles) need = std::max(need, align_up(n * roles[r].dt, alignment) - e * roles[r].dt);
            if (used + need <= piece_bytes) {
                c.pieces.push_back({t, e, n});
                used += need;
                break;
            }
            const std::uint64_t fit = align_down((piece_bytes - used) / max_dt, cut_unit);
            if (fit == 0) {
                close();
                continue;
            }
            c.pieces.push_back({t, e, e + fit});
            e += fit;
            close();
        }
    }
    close();
    return out;
}

// ---------------------------------------------------------------------------
// The pipeline: slot s holds chunk i (s = i mod slots). While chunk i is
// updated, the reads of up to `ahead` chunks after it and the writes of up
// to `behind` chunks before it are in flight; a slot takes its next chunk
// as soon as its last one is written. The reads are issued before the
// chunk's writes, so that the engine's queues do not hold them behind the
// writes: reads and writes reach the disk together.
void Optimizer::Impl::stream(const std::vector<Chunk>& chunks, const optim::Scalars (&sc)[2], Totals& tot,
                             bool on_worker, std::size_t ra) {
    if (chunks.empty()) return;
    std::vector<mem::Lease> held;
    if (!file_roles.empty()) held = pool.lease_many(leases, "optimizer step");
    const std::size_t k = file_roles.size();
    std::vector<bool> ahead_in_mem(k);  // role j's pieces of the first ra chunks are in ra_mem
    for (std::size_t j = 0; j < k; ++j) ahead_in_mem[j] = ra > 0 && is_ra_role(file_roles[j]);
    for (std::size_t i = 0; i < ra; ++i)
        for (std::size_t j = 0; j < k; ++j)
            if (ahead_in_mem[j]) tot.readahead_used += chunks[i].hi[file_roles[j]] - chunks[i].lo[file_roles[j]];
    // Chunk i's piece of role j: read ahead, or in the buffers of slot i mod slots.
    auto piece_buf = [&](std::size_t i, std::size_t j) {
        if (i < ra && ahead_in_mem[j]) return ra_mem.data() + ra_at[i][j];
        const std::size_t q = (i % slots) * k + j;
        return held[q / per_buffer].data() + (q % per_buffer) * piece_bytes;
    };
    std::vector<std::vector<io::Ticket>> reads(chunks.size()), writes(chunks.size());
    const std::size_t n = chunks.size();
    std::size_t next_read = 0;  // chunks [0, next_read) have their reads issued
    std::size_t written = 0;    // chunks [0, written) have their writes done

    auto issue_reads = [&](std::size_t i) {
        const Chunk& c = chunks[i];
        for (std::size_t j = 0; j < k; ++j) {
            const Role r = file_roles[j];
            if (r == Role::param) continue;  // output only
            if (i < ra && ahead_in_mem[j]) continue;
            RoleState& rs = roles[r];
            const std::span<std::byte> dst(piece_buf(i, j), c.hi[r] - c.lo[r]);
            reads[i].push_back(engine.read(rs.gen_f[r == Role::grad ? upd_slot : rs.cur], c.lo[r], dst));
            tot.read += dst.size();
            if (r == Role::grad) tot.grad_read += dst.size();
        }
    };
    auto issue_writes = [&](std::size_t i) {
        const Chunk& c = chunks[i];
        for (std::size_t j = 0; j < k; ++j) {
            const Role r = file_roles[j];
            if (r == Role::grad) continue;
            RoleState& rs = roles[r];
            const std::span<const std::byte> src(piece_buf(i, j), c.hi[r] - c.lo[r]);
            writes[i].push_back(engine.write(rs.gen_f[rs.next], c.lo[r], src));
            tot.written += src.size();
        }
    };
    auto wait_all = [&](std::vector<io::Ticket>& ts) {
        for (auto t : ts) engine.wait(t);
        ts.clear();
    };
    // The oldest chunk still being written is done (waited for when `block`,
    // else only when it is): what the next early flush covers, and its slot free.
    auto retire_write = [&](bool block) {
        std::vector<io::Ticket>& ts = writes[written];
        if (!block)
            for (auto t : ts)
                if (!engine.ready(t)) return false;
        wait_all(ts);
        const Chunk& c = chunks[written];
        for (Role r : file_roles)
            if (r != Role::grad) note_written(roles[r].gen_f[roles[r].next], c.hi[r] - c.lo[r]);
        // Pipelined: a tensor whose last piece is written may be fetched.
        if (pend_marking)
            for (const Piece& p : c.pieces)
                if (p.e1 == per(p.tensor)) pend_mark(p.tensor);
        ++written;
        return true;
    };
    // The reads of every chunk up to `last` whose slot is free.
    auto read_up_to = [&](std::size_t last) {
        while (next_read <= last && next_read < n && next_read < written + slots) issue_reads(next_read++);
    };

    try {
        read_up_to(ahead);
        for (std::size_t i = 0; i < n; ++i) {
            Timer w;
            while (next_read <= i) {  // its slot's last chunk is still being written
                retire_write(true);
                read_up_to(i + ahead);
            }
            wait_all(reads[i]);
            tot.wait += w.seconds();
            // What was read is what was written: nothing derived from a
            // corrupt state reaches a commit.
            w.reset();
            for (std::size_t j = 0; j < k; ++j)
                if (file_roles[j] != Role::grad && file_roles[j] != Role::param && !(i < ra && ahead_in_mem[j]))
                    check_read(chunks[i], file_roles[j], piece_buf(i, j) - chunks[i].lo[file_roles[j]]);
            tot.hash += w.seconds();
            update(chunks[i], i, piece_buf, sc, tot, on_worker);
            w.reset();
            while (written < i && retire_write(false)) {
            }
            read_up_to(i + ahead + 1);
            issue_writes(i);
            tot.wait += w.seconds();
            // Its new hashes while its writes run (both only read the
            // bytes): the disk starts on them a hash earlier.
            hash_written(chunks[i], i, piece_buf, tot, on_worker);
            w.reset();
            while (written + behind < i + 1) retire_write(true);
            read_up_to(i + ahead + 1);
            tot.wait += w.seconds();
        }
        Timer w;
        while (written < n) retire_write(true);
        tot.wait += w.seconds();
    } catch (...) {
        // The buffers go back to the pool only when nothing uses them.
        for (auto* list : {&reads, &writes})
            for (auto& ts : *list)
                for (auto t : ts) try {
                        engine.wait(t);
                    } catch (...) {
                    }
        throw;
    }
    if (!file_roles.empty()) tot.chunks += chunks.size();
}

void Optimizer::Impl::note_written(io::File& f, std::uint64_t bytes) {
    {
        std::lock_guard lk(flush_mu);
        if (std::find(flush_files.begin(), flush_files.end(), &f) == flush_files.end()) flush_files.push_back(&f);
        unflushed += bytes;
        if (flushing || unflushed < kFlushEvery) return;
        flush_now = true;
    }
    flush_cv.notify_all();
}

void Optimizer::Impl::flush_written() {
    {
        std::lock_guard lk(flush_mu);
        if (flush_files.empty() || flushing) return;
        flush_now = true;
    }
    flush_cv.notify_all();
}

// One flush at a time, of every file written since the last one began. The
// files stay open for the optimizer's life, so the pointers hold.
void Optimizer::Impl::flush_loop() {
    std::unique_lock lk(flush_mu);
    for (;;) {
        flush_cv.wait(lk, [&] { return flush_quit || flush_now; });
        if (flush_quit) return;
        std::vector<io::File*> files;
        files.swap(flush_files);
        unflushed = 0;
        flush_now = false;
        flushing = true;
        lk.unlock();
        std::exception_ptr failed;
        try {
            for (io::File* f : files) f->sync();
        } catch (...) {
            failed = std::current_exception();
        }
        lk.lock();
        flushing = false;
        if (failed && !flush_error) flush_error = failed;
        // What was written during this flush may already call for the next.
        if (unflushed >= kFlushEvery) flush_now = true;
        flush_cv.notify_all();
    }
}

void Optimizer::Impl::stop_flushing() {
    std::unique_lock lk(flush_mu);
    flush_now = false;
    flush_cv.wait(lk, [&] { return !flushing; });
    flush_files.clear();  // the step's own sync covers them, or nothing names them
    unflushed = 0;
    if (flush_error) {
        std::exception_ptr e = flush_error;
        flush_error = nullptr;
        std::rethrow_exception(e);
    }
}

// Piece by piece in order, each tensor's bytes as read against the xxh3 its
// current generation must have; DataError (65) at the first that differs.
void Optimizer::Impl::check_read(const Chunk& c, Role r, const std::byte* base, int gen,
                                 const std::vector<std::uint64_t>* expect) {
    RoleState& rs = roles[r];
    if (gen < 0) gen = rs.cur;
    if (!expect) expect = &rs.cur_hash;
    for (const Piece& p : c.pieces) {
        auto& h = rs.read_hash[p.tensor];
        if (p.e0 == 0) h = std::make_unique<Xxh3Stream>();
        h->update({base + rs.offset[p.tensor] + p.e0 * rs.dt, (p.e1 - p.e0) * rs.dt});
        if (p.e1 != per(p.tensor)) continue;
        const std::uint64_t got = h->digest();
        h.reset();
        if (got != (*expect)[p.tensor])
            throw DataError(where_of(m, p.tensor, rank, rs.state) + ": " + rs.name(gen) + " at offset " +
                                std::to_string(rs.offset[p.tensor]) + " has xxh3 " + hex64(got) + ", " +
                                (gen == rs.committed ? "the manifest says " : "the step that wrote it made ") +
                                hex64((*expect)[p.tensor]) +
                                ": the state on disk is damaged; nothing was committed (zinf-shard verify names "
                                "every damaged partition)",
                            {.path = m.path_of(rs.name(gen)), .offset = rs.offset[p.tensor],
                             .rank = static_cast<int>(rank)});
    }
}

template <class PieceBuf>
auto Optimizer::Impl::locator(const Chunk& c, std::size_t i, PieceBuf& piece_buf) {
    std::array<std::byte*, Role::count> base{};
    for (int r = 0; r < Role::count; ++r)
        if (roles[r].present && !roles[r].file) base[r] = r == Role::grad ? grad_mem(upd_slot) : roles[r].image.data();
    for (std::size_t j = 0; j < file_roles.size(); ++j) base[file_roles[j]] = piece_buf(i, j) - c.lo[file_roles[j]];
    return [this, base](Role r, const Piece& p) { return base[r] + roles[r].offset[p.tensor] + p.e0 * roles[r].dt; };
}

template <class PieceBuf>
void Optimizer::Impl::update(const Chunk& c, std::size_t i, PieceBuf& piece_buf, const optim::Scalars (&sc)[2],
                             Totals& tot, bool on_worker) {
    if (on_device) {
        update_on_device(c, sc, tot);
        return;
    }
    const auto at = locator(c, i, piece_buf);

    std::vector<optim::Update> us;
    std::vector<optim::Scalars> ss;
    us.reserve(c.pieces.size());
    ss.reserve(c.pieces.size());
    for (const Piece& p : c.pieces) {
        const std::size_t n = p.e1 - p.e0;
        const optim::Update u = piece_update(at, p, roles[Role::grad].dtype, roles[Role::param].present);
        if (roles[Role::param].present) {
            // A speculative update of parameters held in memory keeps what
            // it overwrites: a skipped step puts them back.
            if (on_worker && !roles[Role::param].file)
                std::memcpy(p_undo.data() + (at(Role::param, p) - roles[Role::param].image.data()), at(Role::param, p),
                            n * roles[Role::param].dt);
            // The gap after a partition's last element is written too: zero it.
            if (roles[Role::param].file && p.e1 == per(p.tensor)) {
                std::byte* end = at(Role::param, p) + n * roles[Role::param].dt;
                const std::uint64_t part_bytes = per(p.tensor) * roles[Role::param].dt;
                const std::uint64_t gap = align_up(part_bytes, alignment) - part_bytes;
                std::memset(end, 0, gap);
            }
        }
        us.push_back(u);
        ss.push_back(sc[decays(p.tensor) ? 0 : 1]);
    }
    Timer t;
    optim::Kernel kernel = opts.kernel;
    if (on_worker) kernel.threads = 1;  // beside the compute, which has every core
    optim::adamw(us, ss, kernel);
    tot.update += t.seconds();
    if (listener) {
        const Role out = roles[Role::param].present ? Role::param : Role::master;
        for (const Piece& p : c.pieces) listener->updated(p.tensor, p.e0, {at(out, p), (p.e1 - p.e0) * roles[out].dt});
    }
}

// The same update as the host's, element for element (kernel_math's
// adamw_update, no fused multiply-add on either backend), with the same
// scalars: the clipping coefficient and the loss scale are in grad_scale,
// decided on the host from the norm of the gradients as handed over, and a
// skipped step never gets here. The gradients the host holds go to the
// device first, in one copy (the pieces are in file order, and so is the
// gradients' layout). All on the h2d stream, in order: the copy, the
// kernels, what the listener queues; the host then waits for the stream to
// get there, so that the next step's hand-over may write the gradients'
// host copy and the update's time is the device's.
void Optimizer::Impl::update_on_device(const Chunk& c, const optim::Scalars (&sc)[2], Totals& tot) {
    if (c.pieces.empty()) return;
    device::Device& d = *dev;
    device::Stream& s = d.h2d();
    Timer t;
    RoleState& g = roles[Role::grad];
    const Piece &a = c.pieces.front(), &z = c.pieces.back();
    const std::uint64_t lo = g.offset[a.tensor] + a.e0 * g.dt, hi = g.offset[z.tensor] + z.e1 * g.dt;
    d.copy(s, {g.dev.data() + lo, hi - lo}, std::span<const std::byte>(grad_mem(upd_slot) + lo, hi - lo));
    const auto at = [&](Role r, const Piece& p) {
        return roles[r].dev.data() + roles[r].offset[p.tensor] + p.e0 * roles[r].dt;
    };
    for (const Piece& p : c.pieces)
        d.adamw(s, piece_update(at, p, g.dtype, roles[Role::param].present), sc[decays(p.tensor) ? 0 : 1]);
    if (listener) {
        const Role out = roles[Role::param].present ? Role::param : Role::master;
        for (const Piece& p : c.pieces)
            listener->updated_on_device(p.tensor, p.e0, {at(out, p), (p.e1 - p.e0) * roles[out].dt}, s);
    }
    d.synchronize(d.record(s));
    tot.update += t.seconds();
}

std::span<const std::byte> Optimizer::Impl::host_copy(RoleState& rs, mem::Pinned& out) {
    out = pool.pin(std::max<std::uint64_t>(rs.end, 1), "optimizer's " + rs.state + " from the device");
    device::Stream& s = dev->stream(device::StreamKind::d2h);
    dev->copy(s, out.bytes().first(rs.end), {rs.dev.data(), rs.end});
    dev->synchronize(s);
    return out.bytes().first(rs.end);
}

// Piece by piece in order, each written file partition's new xxh3.
template <class PieceBuf>
void Optimizer::Impl::hash_written(const Chunk& c, std::size_t i, PieceBuf& piece_buf, Totals& tot, bool on_worker) {
    const auto at = locator(c, i, piece_buf);
    Timer t;
    std::vector<Role> hashed;
    for (Role r : file_roles)
        if (r != Role::grad) hashed.push_back(r);
    const int hash_threads = on_worker ? 1 : static_cast<int>(std::max<std::size_t>(hashed.size(), 1));
#pragma omp parallel for schedule(dynamic) num_threads(hash_threads)
    for (std::size_t j = 0; j < hashed.size(); ++j) {
        const Role r = hashed[j];
        RoleState& rs = roles[r];
        for (const Piece& p : c.pieces) {
            auto& h = rs.hash[p.tensor];
            if (p.e0 == 0) h = std::make_unique<Xxh3Stream>();
            h->update({at(r, p), (p.e1 - p.e0) * rs.dt});
            if (p.e1 == per(p.tensor)) {
                rs.new_hash[p.tensor] = h->digest();
                h.reset();
            }
        }
    }
    tot.hash += t.seconds();
}

bool Optimizer::Impl::decays(std::size_t t) const { return opts.decay_1d || m.tensors[t].shape.size() >= 2; }

}  // namespace zinf::zero
