// What init, verify, cat and reshard share (disk.hpp): worker threads over
// units, the files a writer opens under temporary names, and the writer that
// streams partitions into them through the pinned pool.
#include "disk.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <sstream>
#include <streambuf>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <thread>
#include <unistd.h>

namespace zinf::shard::detail {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempSuffix = ".zinf-tmp.";

// Counts what is written to it, keeps nothing.
class CountingBuf : public std::streambuf {
public:
    std::uint64_t bytes = 0;

protected:
    int_type overflow(int_type c) override {
        if (c != traits_type::eof()) ++bytes;
        return c;
    }
    std::streamsize xsputn(const char*, std::streamsize n) override {
        bytes += static_cast<std::uint64_t>(n);
        return n;
    }
};

// The manifest init will commit for `m` in `dir` is at most this long: the
// records as they stand, plus the xxh3 each gets and the header's dir.
std::uint64_t manifest_bytes_bound(const Manifest& m, const std::string& dir) {
    CountingBuf count;
    std::ostream out(&count);
    write_manifest(out, m);
    const std::uint64_t xxh3_key = std::string_view(R"(,"xxh3":"0123456789abcdef")").size();
    return count.bytes + m.parts.size() * xxh3_key + fs::absolute(dir).string().size() + 4096;
}

}  // namespace

unsigned resolve_jobs(unsigned jobs) {
    if (jobs) return jobs;
    return std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
}

void check_stop(const RunOptions& opts) {
    if (opts.stop && opts.stop->load()) throw Interrupted("interrupted");
}

void run_units(std::size_t n, unsigned jobs, const RunOptions& opts,
               const std::function<void(std::size_t unit, unsigned worker)>& fn) {
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first;
    std::mutex mu;
    auto worker = [&](unsigned w) {
        try {
            for (std::size_t u; !failed.load() && (u = next.fetch_add(1)) < n;) {
                check_stop(opts);
                fn(u, w);
            }
        } catch (...) {
            std::lock_guard lk(mu);
            if (!first) first = std::current_exception();
            failed.store(true);
        }
    };
    jobs = static_cast<unsigned>(std::min<std::size_t>(jobs, std::max<std::size_t>(n, 1)));
    std::vector<std::thread> threads;
    for (unsigned w = 1; w < jobs; ++w) threads.emplace_back(worker, w);
    worker(0);
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
}

std::set<unsigned> rank_set(const Manifest& m, const RunOptions& opts) {
    std::set<unsigned> s;
    if (opts.ranks.empty())
        for (unsigned r = 0; r < m.opts.dp; ++r) s.insert(r);
    for (unsigned r : opts.ranks) {
        if (r >= m.opts.dp)
            throw UsageError("rank " + std::to_string(r) + " is not below dp " + std::to_string(m.opts.dp));
        s.insert(r);
    }
    return s;
}

PartitionGroups by_tensor_state(const Manifest& m) {
    PartitionGroups out;
    for (const auto& p : m.parts) out[{p.tensor, p.state}].push_back(&p);
    for (auto& [k, v] : out)
        std::sort(v.begin(), v.end(), [](const Partition* a, const Partition* b) { return a->rank < b->rank; });
    return out;
}

std::string describe(const Manifest& m, const Partition& p) {
    return m.tensor_of(p).name + " rank " + std::to_string(p.rank) + " " + p.state;
}

// ---------------------------------------------------------------------------
void OutFiles::open(const Manifest& m, const std::string& dir, const std::set<unsigned>& ranks, bool force) {
    // A rank folder that is another rank's default one (--rank-dir D/rank1
    // D/rank0) would have files of two layouts of one directory meet under
    // one name: a later init --force that failed left the old manifest
    // naming files it had removed. Refused before anything is made.
    for (unsigned r = 0; r < m.rank_dirs.size(); ++r) {
        const std::string mine = absolute_dir(m.rank_dirs[r]);
        const std::string name = fs::path(mine).filename().string();
        if (!name.starts_with("rank") || absolute_dir(fs::path(mine).parent_path().string()) != absolute_dir(dir))
            continue;
        const std::string digits = name.substr(4);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
        const unsigned q = static_cast<unsigned>(std::stoul(digits));
        if (q != r && q < m.opts.dp)
            throw UsageError("rank " + std::to_string(r) + "'s folder " + m.rank_dirs[r] + " (--rank-dir) is rank " +
                             std::to_string(q) + "'s folder in " + dir +
                             " without --rank-dir: name folders that are not another rank's");
    }
    make_dirs(dir);
    std::map<std::string, std::uint64_t> sizes;
    for (const auto& p : m.parts)
        if (ranks.count(p.rank))
            sizes[p.file] = std::max(sizes[p.file], align_up(p.offset + p.bytes, m.opts.alignment));
    // The state's owner, as every rank folder's marker records it.
    const std::string owner = absolute_dir(dir);
    std::vector<std::pair<unsigned, std::string>> markers;
    if (!m.rank_dirs.empty())
        for (const unsigned r : ranks) {
            markers.emplace_back(r, make_rank_folder(m, r, owner, force));
            written.lock.add(lock_folder(markers.back().second, LockMode::exclusive));  // the same hold when locked
        }
    std::set<std::pair<std::string, std::string>> folders;  // (root, folder beneath it)
    for (const auto& [f, b] : sizes) {
        const Manifest::Place at = m.place(f, dir);
        folders.insert({at.root, fs::path(at.rel).parent_path().string()});
    }
    for (const auto& [root, folder] : folders)
        if (!folder.empty()) make_folder_beneath(root, folder);
    for (const auto& [f, b] : sizes) remove_stale_temps(m.place(f, dir));
    check_space(m, dir, sizes, ranks.count(0) != 0);
    // Each folder's marker names this state, before anything is written
    // there: a new one (removed again when the run fails), or one that named
    // another (taken over with --force, or from before owners were
    // recorded: given back when the run fails).
    for (const auto& [r, folder] : markers) {
        const std::string path = folder + "/" + kRankMarker, text = rank_marker_text(r, owner);
        const auto mark = read_rank_marker(folder, static_cast<int>(r));  // checked above: this rank's
        if (mark && same_folder(mark->owner, owner)) continue;
        const std::string before = mark ? read_regular(path, 64 * 1024, "a rank marker") : std::string();
        const std::span<const std::byte> piece = std::as_bytes(std::span(text));
        write_file_atomic(path, {&piece, 1});
        if (mark) markers_replaced.emplace_back(path, before);
        else markers_made.push_back(path);
    }
    for (const auto& [f, bytes] : sizes) {
        const Manifest::Place at = m.place(f, dir);
        const std::string final_path = at.path();
        // Unpredictable and made with O_EXCL|O_NOFOLLOW: nothing planted
        // at a temporary's name is written through.
        const std::string tmp = temp_name(final_path, kTempSuffix);
        io::File file;
        try {
            file = io::File::open(tmp, {.access = io::Access::write, .create = true, .exclusive = true,
                                        .mode = 0666, .beneath = at.root});
        } catch (const CreateError& e) {  // no inode left: out of space too (73, zinf(7))
            if (e.err() != ENOSPC && e.err() != EDQUOT) throw;
            throw IoError("out of space creating a file; nothing was committed", {e.err(), tmp, {}, -1});
        }
        written.temps.push_back(tmp);
        written.finals.push_back(final_path);
        if (file.alignment() > m.opts.alignment)
            throw UsageError(tmp + ": the file system's direct-I/O alignment " + format_size(file.alignment()) +
                             " exceeds the manifest's " + format_size(m.opts.alignment) +
                             "; lay it out again with --align " + std::to_string(file.alignment()));
        try {
            file.preallocate(bytes);
        } catch (const CreateError& e) {  // out of space: 73, as during the writes (zinf(7))
            if (e.err() != ENOSPC && e.err() != EDQUOT) throw;
            throw IoError("out of space reserving " + format_size(bytes) + "; nothing was committed",
                          {e.err(), tmp, {}, -1});
        }
        files.emplace(f, std::move(file));
    }
}

void OutFiles::check_space(const Manifest& m, const std::string& dir, const std::map<std::string, std::uint64_t>& sizes,
                           bool manifest) {
    struct Disk {
        std::string at;  // a folder on it, for statvfs and the message
        bool manifest = false;
    };
    std::map<dev_t, Disk> disks;
    std::map<std::string, Disk*> by_root;  // each folder stat'ed once
    auto disk_of = [&](const std::string& folder) -> Disk* {
        auto [it, fresh] = by_root.emplace(folder, nullptr);
        struct stat st {};
        if (fresh && ::stat(folder.c_str(), &st) == 0) {
            Disk& d = disks[st.st_dev];
            if (d.at.empty()) d.at = folder;
            it->second = &d;
        }
        return it->second;
    };
    for (const auto& [f, b] : sizes) disk_of(m.place(f, dir).root);
    if (manifest)
        if (Disk* d = disk_of(dir)) d->manifest = true;
    for (const auto& [dev, d] : disks) {
        struct statvfs sv {};
        if (::statvfs(d.at.c_str(), &sv) != 0) continue;
        const std::uint64_t block = std::max<std::uint64_t>(sv.f_frsize, 1);
        std::uint64_t need = 0;
        for (const auto& [f, b] : sizes)
            if (disk_of(m.place(f, dir).root) == &d) need += align_up(b, block);
        if (d.manifest) need += align_up(manifest_bytes_bound(m, dir), block);
        const std::uint64_t avail = std::uint64_t{sv.f_bavail} * sv.f_frsize;
        if (avail < need)
            throw IoError("not enough space for the model state" + std::string(d.manifest ? " and its manifest" : "") +
                              ": " + format_size(need) + " (" + std::to_string(need) + " bytes) needed, " +
                              format_size(avail) + " (" + std::to_string(avail) + " bytes) free; nothing was written",
                          {ENOSPC, d.at, {}, -1});
    }
}

std::string OutFiles::make_rank_folder(const Manifest& m, unsigned r, const std::string& owner, bool force) {
    const std::string& d = m.rank_dirs.at(r);
    struct stat st {};
    if (::lstat(d.c_str(), &st) != 0) {
        make_dirs(d);
        return d;
    }
    check_claim(m, r, owner, force);
    return d;
}

void check_claim(const Manifest& m, unsigned r, const std::string& owner, bool force) {
    const std::string& d = m.rank_dirs.at(r);
    struct stat st {};
    if (::lstat(d.c_str(), &st) != 0) return;  // made by the writer
    if (!S_ISDIR(st.st_mode))
        throw UsageError("rank " + std::to_string(r) + "'s folder " + d + " (--rank-dir) is " +
                         (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a folder") + "; name a folder");
    bool empty = true;
    if (DIR* dd = ::opendir(d.c_str())) {
        while (const dirent* e = ::readdir(dd)) {
            const std::string_view n = e->d_name;
            if (n != "." && n != ".." && n != kLockFile) empty = false;
        }
        ::closedir(dd);
    }
    if (empty) return;
    std::optional<RankMarker> mark;
    try {
        mark = read_rank_marker(d, static_cast<int>(r));
        if (!mark || mark->rank != r) check_rank_folders(m, {r}, owner);  // says what is wrong
    } catch (const Error& e) {
        throw UsageError("rank " + std::to_string(r) + "'s folder " + d +
                         " (--rank-dir) holds files and is not that rank's folder: name an empty or new "
                         "folder (" + e.message() + ")");
    }
    if (force || mark->owner.empty()) return;
    const Error::Where at{0, d + "/" + kRankMarker, {}, static_cast<int>(r)};
    // Another state's folder (two runs given one --rank-dir template):
    // writing there would destroy that state.
    const bool here = same_folder(mark->owner, owner) || absolute_dir(mark->owner) == owner;  // (made later)
    if (!here)
        throw CreateError("rank " + std::to_string(r) + "'s folder " + d + " (--rank-dir) belongs to the state in " +
                              mark->owner + " (its " + kRankMarker + "): give each run rank folders of its own, "
                              "or --force to take it over (the state in " + mark->owner + " then no longer verifies)",
                          at);
    // So is one whose marker names this directory but which the state
    // committed here does not name, and that holds more than a killed
    // writer's temporaries: the state that was here was moved away (mv run1
    // run1-old) and still uses it.
    if (!OutFiles::holds_state_files(d)) return;
    bool ours = false;
    try {
        const Manifest committed = read_manifest_file(owner + "/manifest.jsonl");
        ours = r < committed.rank_dirs.size() && same_folder(committed.rank_dirs[r], d);
    } catch (const Error&) {
    }
    if (!ours)
        throw CreateError("rank " + std::to_string(r) + "'s folder " + d + " (--rank-dir) holds the files of a state "
                              "that was in " + owner + " (its " + kRankMarker + "), which " + owner +
                              "/manifest.jsonl no longer names: that state was moved or copied away and may still "
                              "use them; give this run rank folders of its own, or --force to take them",
                          at);
}

void check_claims(const Manifest& m, const std::string& dir, const std::set<unsigned>& ranks, bool force) {
    if (m.rank_dirs.empty()) return;
    const std::string owner = absolute_dir(dir);
    for (const unsigned r : ranks) check_claim(m, r, owner, force);
}

bool OutFiles::holds_state_files(const std::string& folder) {
    bool any = false;
    if (DIR* dd = ::opendir(folder.c_str())) {
        while (const dirent* e = ::readdir(dd)) {
            const std::string_view n = e->d_name;
            if (n != "." && n != ".." && n != kLockFile && n != kRankMarker && n.find(kTempSuffix) == n.npos)
                any = true;
        }
        ::closedir(dd);
    }
    return any;
}

void OutFiles::make_folder_beneath(const std::string& dir, const std::string& folder) {
    const int flags = O_PATH | O_DIRECTORY;
    int fd = open_beneath_raw(dir, folder, flags, 0);
    if (fd == -EXDEV || fd == -ELOOP) throw_open_beneath(-fd, dir, folder, flags);
    if (fd < 0) {
        make_dirs(dir + "/" + folder);
        fd = open_beneath_raw(dir, folder, flags, 0);
        // A file where the folder must go: it cannot be made (73).
        if (fd < 0) throw_open_beneath(-fd, dir, folder, flags | O_CREAT);
    }
    ::close(fd);
}

void OutFiles::remove_stale_temps(const Manifest::Place& at) {
    const fs::path f(at.rel);
    const std::string folder = f.parent_path().string();
    const std::string prefix = f.filename().string() + kTempSuffix;
    const std::string folder_rel = folder.empty() ? "." : folder;
    const int fd = open_beneath_raw(at.root, folder_rel, O_RDONLY | O_DIRECTORY, 0);
    // Made just before: failing to list it is an I/O error, not nothing to remove.
    if (fd < 0) throw_open_beneath(-fd, at.root, folder_rel, O_RDONLY);
    DIR* d = ::fdopendir(fd);
    if (!d) {
        ::close(fd);
        return;
    }
    while (const dirent* e = ::readdir(d))
        if (std::string_view(e->d_name).starts_with(prefix)) ::unlinkat(::dirfd(d), e->d_name, 0);
    ::closedir(d);
}

void OutFiles::make_dirs(const std::string& path) {
    std::vector<std::string> missing;
    for (fs::path p = fs::absolute(path); !p.empty() && !fs::exists(p); p = p.parent_path()) {
        missing.push_back(p.string());
        if (p == p.parent_path()) break;
    }
    // Outermost first, 0777 less the umask; another rank may make one too.
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (sys::mkdir(*it, 0777) == 0) created.push_back(*it);  // discard removes the deepest first
        else if (errno != EEXIST) throw_errno("mkdir", errno, *it, {}, true);
    }
}

void OutFiles::discard() noexcept {
    files.clear();
    for (const auto& f : markers_made) ::unlink(f.c_str());
    for (const auto& [f, text] : markers_replaced) try {
            const std::span<const std::byte> piece = std::as_bytes(std::span(text));
            write_file_atomic(f, {&piece, 1});
        } catch (const Error& e) {
            log::warn(f + ": the rank folder's marker cannot be given back (" + e.message() + ")");
        }
    markers_made.clear();
    markers_replaced.clear();
    written.folders = std::move(created);
    written.discard();
}

void OutFiles::finish(io::Engine& engine) {
    for (auto& [f, file] : files) {
        engine.sync(file);
        file.close();
    }
    files.clear();
}

Written OutFiles::release(std::vector<std::string> superseded) {
    written.folders = std::move(created);
    written.superseded = std::move(superseded);
    return std::move(written);
}

// ---------------------------------------------------------------------------
Zeros::Zeros(mem::PinnedPool& pool) : lease(pool.lease("zinf-shard zeros")) {
    std::memset(lease.data(), 0, lease.size());
}

std::optional<std::uint64_t> Zeros::cached_hash(std::uint64_t bytes) const {
    std::lock_guard lk(mu);
    auto it = hashes.find(bytes);
    return it == hashes.end() ? std::nullopt : std::optional(it->second);
}

void Zeros::remember(std::uint64_t bytes, std::uint64_t hash) const {
    std::lock_guard lk(mu);
    hashes[bytes] = hash;
}

PartWriter::~PartWriter() {
    for (auto& t : tickets_)
        if (t) try {
                engine_.wait(*t);
            } catch (...) {
            }
    for (auto& t : pending_) try {
            engine_.wait(t);
        } catch (...) {
        }
}

void PartWriter::append(std::span<const std::byte> data) {
    while (!data.empty()) {
        auto buf = bufs_[cur_];
        const std::size_t n = std::min<std::size_t>(data.size(), buf.size() - fill_);
        std::memcpy(buf.data() + fill_, data.data(), n);
        fill_ += n;
        data = data.subspan(n);
        if (fill_ == buf.size()) flush(buf.size());
    }
}

std::uint64_t PartWriter::finish() {
    std::uint64_t rest = extent_ - (pos_ + fill_);
    if (fill_) {
        const std::size_t pad = std::min<std::uint64_t>(rest, bufs_[cur_].size() - fill_);
        std::memset(bufs_[cur_].data() + fill_, 0, pad);
        fill_ += pad;
        rest -= pad;
        flush(fill_);
    }
    // The rest is all zeros: written from the shared zero buffer, and its
    // hash taken from the cache when this many zeros were hashed before
    // (the moments: every layer alike).
    const bool all_zero = pos_ == 0;
    std::optional<std::uint64_t> cached;
    if (all_zero) cached = zeros_.cached_hash(part_->bytes);
    while (rest > 0) {
        const std::uint64_t n = std::min<std::uint64_t>(rest, zeros_.lease.size());
        if (!cached) hash_bytes(zeros_.first(n));
        if (pending_.size() >= kMaxPending) {
            io::Ticket t = pending_.front();
            pending_.erase(pending_.begin());
            engine_.wait(t);
        }
        pending_.push_back(engine_.write(*file_, part_->offset + pos_, zeros_.first(n)));
        pos_ += n;
        rest -= n;
    }
    const std::uint64_t digest = cached ? *cached : hash_->digest();
    if (all_zero && !cached) zeros_.remember(part_->bytes, digest);
    return digest;
}

void PartWriter::drain() {
    std::exception_ptr first;
    auto take = [&](io::Ticket t) {
        try {
            engine_.wait(t);
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    };
    for (auto& t : tickets_)
        if (t) {
            io::Ticket x = *t;
            t.reset();
            take(x);
        }
    for (auto t : pending_) take(t);
    pending_.clear();
    if (first) std::rethrow_exception(first);
}

void PartWriter::hash_bytes(std::span<const std::byte> piece) {
    // Only the partition's bytes count, not the alignment padding after them.
    if (pos_ >= part_->bytes) return;
    hash_->update(piece.first(std::min<std::uint64_t>(piece.size(), part_->bytes - pos_)));
}

void PartWriter::flush(std::size_t n) {
    auto piece = bufs_[cur_].first(n);
    hash_bytes(piece);
    tickets_[cur_] = engine_.write(*file_, part_->offset + pos_, piece);
    pos_ += n;
    fill_ = 0;
    cur_ = (cur_ + 1) % bufs_.size();
    if (tickets_[cur_]) {  // the next buffer's write must be done before it is refilled
        io::Ticket x = *tickets_[cur_];
        tickets_[cur_].reset();
        engine_.wait(x);
    }
}

std::vector<std::span<std::byte>> spans(std::vector<mem::Lease>& leases, std::size_t from, std::size_t n) {
    std::vector<std::span<std::byte>> out;
    for (std::size_t i = from; i < from + n; ++i) out.push_back(leases[i].bytes());
    return out;
}

io::File open_data(const Manifest& m, const Partition& p) {
    if (!m.rank_dirs.empty()) check_rank_folders(m, {p.rank});
    const Manifest::Place at = m.place(p.file);
    return io::File::open(at.path(), {.beneath = at.root});
}

std::string absolute_dir(const std::string& dir) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
    return (ec ? fs::absolute(dir) : p).lexically_normal().string();
}

}  // namespace zinf::shard::detail
