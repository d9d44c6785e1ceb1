// What a training run will write on disk (zero.hpp, DiskNeed), worked out
// from the manifest before anything is written.
#include "optimizer.hpp"  // detail::packed_layout: the state files and the gradient scratch

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include <sys/stat.h>
#include <sys/statvfs.h>

namespace zinf::zero {

namespace fs = std::filesystem;

namespace {

// The bytes a file already has on disk, at most `cap` (a file is grown to
// its size, never past it): what a run reuses instead of taking anew.
std::uint64_t allocated(const std::string& path, std::uint64_t cap) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return std::min<std::uint64_t>(static_cast<std::uint64_t>(st.st_blocks) * 512, cap);
}

// The gradient scratch: with the optimizer state on NVMe, this rank's
// gradient partitions (made afresh each run).
std::uint64_t scratch_bytes(std::span<const shard::Tensor> tensors, const shard::LayoutOptions& lo,
                            shard::DType grad_dtype) {
    if (!lo.train || lo.optim_tier != shard::Tier::nvme) return 0;
    return detail::packed_layout(tensors, lo, grad_dtype).bytes;
}

std::string folder_of(const std::string& file) {
    const std::string f = fs::path(file).parent_path().string();
    return f.empty() ? "." : f;
}

}  // namespace

std::uint64_t DiskNeed::total() const { return states + gradients + activations + manifest; }
std::uint64_t DiskNeed::more() const { return total() > present ? total() - present : 0; }

DiskNeed disk_need(const shard::Manifest& m, unsigned rank, const DiskNeedOptions& o) {
    DiskNeed need;
    const std::uint64_t A = m.opts.alignment;
    // Every state's file, in two generations (the live copy and the last
    // committed one): a streamed state writes the other each step, a state
    // held in memory is saved beside the committed one.
    std::map<std::string, std::uint64_t> files;  // by name without the generation
    std::string folder;
    for (const auto& p : m.parts) {
        if (p.rank != rank) continue;
        const std::string base = shard::generation_base(p.file);
        files[base] = std::max(files[base], align_up(p.offset + p.bytes, A));
        if (folder.empty()) folder = folder_of(p.file);
    }
    need.folder = m.dir.empty() ? folder : m.rank_dirs.empty() ? m.dir + "/" + folder : m.rank_folder(rank);
    for (const auto& [base, bytes] : files) {
        need.states += 2 * bytes;
        if (!m.dir.empty())
            for (const char* g : {shard::kGenerations[0], shard::kGenerations[1]})
                need.present += allocated(m.path_of(base + g), bytes);
    }
    const std::uint64_t scratch = scratch_bytes(m.tensors, m.opts, o.grad_dtype);
    need.gradients = scratch * (o.pipeline ? 2 : 1);
    need.activations = o.activation_bytes;
    if (!m.dir.empty() && scratch && !files.empty()) {
        // The gradient scratch files a killed run left (the optimizer's
        // names, beside the state files): removed and made again at open,
        // so their blocks count as the run's own.
        const std::string f = fs::path(files.begin()->first).parent_path().string();
        const std::string base = (f.empty() ? "" : f + "/") + "grad";
        for (int slot = 0; slot < (o.pipeline ? 2 : 1); ++slot)
            need.present += allocated(m.path_of(base + shard::kGenerations[slot]), scratch);
    }
    if (!m.dir.empty()) {
        struct statvfs sv {};
        std::error_code ec;
        // The nearest folder that exists: a rank folder the run will make is
        // on its parent's file system.
        fs::path at = need.folder;
        while (!at.empty() && !fs::exists(at, ec)) at = at.parent_path();
        if (!at.empty() && ::statvfs(at.c_str(), &sv) == 0)
            need.free = std::uint64_t{sv.f_bavail} * sv.f_frsize;
        else
            need.free.reset();
        // Rank 0 commits the manifest: a temporary beside the committed one,
        // as long as the manifest grows to (a step's digits and every
        // record's hash), in whole blocks.
        struct stat a {}, b {};
        if (rank == 0 && need.free && ::stat(at.c_str(), &a) == 0 && ::stat(m.dir.c_str(), &b) == 0 &&
            a.st_dev == b.st_dev) {
            std::ostringstream text;
            shard::write_manifest(text, m);
            const std::uint64_t block = std::max<std::uint64_t>(sv.f_frsize, 1);
            need.manifest = align_up(text.str().size() + m.parts.size() * 64 + 4096, block);
        }
    }
    return need;
}

DiskNeed disk_need(const shard::ModelSpec& spec, const shard::LayoutOptions& lo, const DiskNeedOptions& o) {
    // The states and their dtypes as layout() makes them (a one-rank layout
    // is small); each rank's file packs its partitions at aligned offsets.
    shard::LayoutOptions one = lo;
    one.dp = 1;
    const shard::Manifest m1 = shard::layout(spec, one);
    DiskNeed need;
    for (const std::string& s : m1.states)
        need.states += 2 * detail::packed_layout(m1.tensors, lo, shard::state_dtype(lo, s)).bytes;
    need.gradients = scratch_bytes(m1.tensors, lo, o.grad_dtype) * (o.pipeline ? 2 : 1);
    need.activations = o.activation_bytes;
    return need;
}

void check_disk(const DiskNeed& n, unsigned rank) {
    if (!n.free || n.more() <= *n.free) return;
    // (the error's rank names the rank: not the message again)
    throw CreateError("the run needs " + format_size(n.total()) + " (" + std::to_string(n.total()) + " bytes) on " +
                          n.folder + ": the state in two generations " + format_size(n.states) +
                          ", gradient scratch " + format_size(n.gradients) + ", activation checkpoints " +
                          format_size(n.activations) +
                          (n.manifest ? ", the manifest's temporary " + format_size(n.manifest) : std::string()) +
                          "; its files hold " +
                          format_size(n.present) + " of that already, and the file system has " +
                          format_size(*n.free) + " (" + std::to_string(*n.free) + " bytes) free, " +
                          format_size(n.more() - *n.free) + " (" + std::to_string(n.more() - *n.free) +
                          " bytes) short; nothing was written",
                      {ENOSPC, n.folder, {}, static_cast<int>(rank)});
}

}  // namespace zinf::zero
