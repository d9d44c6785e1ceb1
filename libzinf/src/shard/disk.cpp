// The manifest against the disk: init writes every partition, verify hashes
// them again, cat gathers one tensor, reshard copies them to a new dp degree.
// All of it streams through the pinned pool in buffer-sized pieces, so memory
// stays flat whatever the model size, with the io engine's writes of one piece
// in flight while the next is computed.
#include <zinf/shard.hpp>

#include "generate.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <streambuf>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <thread>
#include <unistd.h>

namespace zinf::shard {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempSuffix = ".zinf-tmp.";

unsigned resolve_jobs(unsigned jobs) {
    if (jobs) return jobs;
    return std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
}

void check_stop(const RunOptions& opts) {
    if (opts.stop && opts.stop->load()) throw Interrupted("interrupted");
}

// Runs units 0..n-1 on `jobs` threads, in order of index as threads free up.
// The first exception (or a stop) ends the rest (units not yet started are
// skipped) and is rethrown once every thread has finished.

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

// Partitions by (tensor, state), in rank order.
std::map<std::pair<std::size_t, std::string>, std::vector<const Partition*>> by_tensor_state(const Manifest& m) {
    std::map<std::pair<std::size_t, std::string>, std::vector<const Partition*>> out;
    for (const auto& p : m.parts) out[{p.tensor, p.state}].push_back(&p);
    for (auto& [k, v] : out)
        std::sort(v.begin(), v.end(), [](const Partition* a, const Partition* b) { return a->rank < b->rank; });
    return out;
}

std::string describe(const Manifest& m, const Partition& p) {
    return m.tensor_of(p).name + " rank " + std::to_string(p.rank) + " " + p.state;
}

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

// The files a run writes: opened under temporary names, space reserved.
struct OutFiles {
    std::map<std::string, io::File> files;  // by manifest file name
    Written written;

    // Creates `dir` and the temporaries of every file `m` holds for `ranks`;
    // statvfs first, so a disk too small fails before anything is written.
    // Every folder and file is resolved beneath `dir`: a rank folder that is
    // a link leading outside is refused (65) before anything is made there.
    //
    // With node-local rank folders (m.rank_dirs) each rank's files go into
    // its own folder, made when absent; one that exists must be empty or hold
    // this rank's marker (kRankMarker), which is written (as a temporary,
    // committed with the files) into every folder this run writes.
    void open(const Manifest& m, const std::string& dir, const std::set<unsigned>& ranks) {
        make_dirs(dir);
        std::map<std::string, std::uint64_t> sizes;
        for (const auto& p : m.parts)
            if (ranks.count(p.rank))
                sizes[p.file] = std::max(sizes[p.file], align_up(p.offset + p.bytes, m.opts.alignment));
        std::vector<std::pair<unsigned, std::string>> markers;
        if (!m.rank_dirs.empty())
            for (const unsigned r : ranks) markers.emplace_back(r, make_rank_folder(m, r));
        std::set<std::pair<std::string, std::string>> folders;  // (root, folder beneath it)
        for (const auto& [f, b] : sizes) {
            const Manifest::Place at = m.place(f, dir);
            folders.insert({at.root, fs::path(at.rel).parent_path().string()});
        }
        for (const auto& [root, folder] : folders)
            if (!folder.empty()) make_folder_beneath(root, folder);
        for (const auto& [f, b] : sizes) remove_stale_temps(m.place(f, dir));
        check_space(m, dir, sizes, ranks.count(0) != 0);
        for (const auto& [r, folder] : markers) {
            const std::string path = folder + "/" + kRankMarker, text = rank_marker_text(r);
            struct stat st {};
            if (::lstat(path.c_str(), &st) == 0) continue;  // checked above: this rank's
            const std::span<const std::byte> piece = std::as_bytes(std::span(text));
            write_file_atomic(path, {&piece, 1});
            markers_made.push_back(path);
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

    // The files and, when this run writes it, the manifest: each rounded up
    // to whole blocks. A state that fits but whose manifest does not would
    // leave every file written and nothing committed.
    // Node-local rank folders are added up per file system (by device), so
    // two folders on one disk count together and each disk is checked.
    static void check_space(const Manifest& m, const std::string& dir, const std::map<std::string, std::uint64_t>& sizes,
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

    // Rank r's node-local folder, made when absent (and its parents); one
    // that exists must be a real folder, empty or holding r's marker.
    std::string make_rank_folder(const Manifest& m, unsigned r) {
        const std::string& d = m.rank_dirs.at(r);
        struct stat st {};
        if (::lstat(d.c_str(), &st) != 0) {
            make_dirs(d);
            return d;
        }
        if (!S_ISDIR(st.st_mode))
            throw UsageError("rank " + std::to_string(r) + "'s folder " + d + " (--rank-dir) is " +
                             (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a folder") + "; name a folder");
        bool empty = true;
        if (DIR* dd = ::opendir(d.c_str())) {
            while (const dirent* e = ::readdir(dd)) {
                const std::string_view n = e->d_name;
                if (n != "." && n != "..") empty = false;
            }
            ::closedir(dd);
        }
        if (!empty) try {
                check_rank_folders(m, {r});
            } catch (const Error& e) {
                throw UsageError("rank " + std::to_string(r) + "'s folder " + d +
                                 " (--rank-dir) holds files and is not that rank's folder: name an empty or new "
                                 "folder (" + e.message() + ")");
            }
        return d;
    }

    // A folder of the layout, beneath `dir`: one that exists must not lead
    // outside it; one that does not is made.
    void make_folder_beneath(const std::string& dir, const std::string& folder) {
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

    // What an earlier run killed half-way left under its temporary names
    // beside `file` ("<file>.zinf-tmp.<random>"): removed, so that they
    // neither pile up nor count against the space.
    static void remove_stale_temps(const Manifest::Place& at) {
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

    // Creates `path` and its missing parents, remembering which were new.
    void make_dirs(const std::string& path) {
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
    // After a failure: the temporaries and the folders this run made, so
    // nothing is left behind.
    void discard() noexcept {
        files.clear();
        for (const auto& f : markers_made) ::unlink(f.c_str());
        written.folders = std::move(created);
        written.discard();
    }
    std::vector<std::string> created;
    std::vector<std::string> markers_made;  // rank folders' markers this run wrote

    // Every write done: fdatasync and a checked close of each file.
    void finish(io::Engine& engine) {
        for (auto& [f, file] : files) {
            engine.sync(file);
            file.close();
        }
        files.clear();
    }
};

// Zero bytes to write from: one pool buffer, cleared once, shared by every
// writer (the engine only reads it).
struct Zeros {
    mem::Lease lease;
    explicit Zeros(mem::PinnedPool& pool) : lease(pool.lease("zinf-shard zeros")) {
        std::memset(lease.data(), 0, lease.size());
    }
    std::span<const std::byte> first(std::uint64_t n) const { return lease.bytes().first(n); }
    std::optional<std::uint64_t> cached_hash(std::uint64_t bytes) const {
        std::lock_guard lk(mu);
        auto it = hashes.find(bytes);
        return it == hashes.end() ? std::nullopt : std::optional(it->second);
    }
    void remember(std::uint64_t bytes, std::uint64_t hash) const {
        std::lock_guard lk(mu);
        hashes[bytes] = hash;
    }
    mutable std::mutex mu;
    mutable std::map<std::uint64_t, std::uint64_t> hashes;  // xxh3 of that many zero bytes
};

// Writes partitions front to back in aligned pieces, padding each with zeros
// to its aligned end, and hashes its `bytes` as they go. A ring of buffers
// takes turns, so several pieces are being written while the next is filled;
// a writer lives as long as its worker, so the writes of one partition are
// still in flight while the next partition is computed. drain() waits for
// everything (errors surface there at the latest).
class PartWriter {
public:
    PartWriter(io::Engine& engine, std::vector<std::span<std::byte>> bufs, const Zeros& zeros)
        : engine_(engine), bufs_(std::move(bufs)), tickets_(bufs_.size()), zeros_(zeros) {}
    ~PartWriter() {
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

    void start(io::File& file, const Partition& p, std::uint64_t alignment) {
        file_ = &file;
        part_ = &p;
        extent_ = align_up(p.bytes, alignment);
        pos_ = fill_ = 0;
        hash_.emplace();
    }
    // The next data bytes of the partition.
    void append(std::span<const std::byte> data) {
        while (!data.empty()) {
            auto buf = bufs_[cur_];
            const std::size_t n = std::min<std::size_t>(data.size(), buf.size() - fill_);
            std::memcpy(buf.data() + fill_, data.data(), n);
            fill_ += n;
            data = data.subspan(n);
            if (fill_ == buf.size()) flush(buf.size());
        }
    }
    // Room to fill in place: write up to here().size() bytes, then advance().
    std::span<std::byte> here() { return bufs_[cur_].subspan(fill_); }
    void advance(std::size_t n) {
        fill_ += n;
        if (fill_ == bufs_[cur_].size()) flush(fill_);
    }
    // Zero padding to the end; returns the partition's xxh3. The writes may
    // still be in flight.
    std::uint64_t finish() {
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
    void drain() {
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

private:
    static constexpr std::size_t kMaxPending = 64;

    void hash_bytes(std::span<const std::byte> piece) {
        // Only the partition's bytes count, not the alignment padding after them.
        if (pos_ >= part_->bytes) return;
        hash_->update(piece.first(std::min<std::uint64_t>(piece.size(), part_->bytes - pos_)));
    }
    void flush(std::size_t n) {
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

    io::Engine& engine_;
    std::vector<std::span<std::byte>> bufs_;
    std::vector<std::optional<io::Ticket>> tickets_;
    std::vector<io::Ticket> pending_;  // zero writes in flight
    const Zeros& zeros_;
    std::size_t cur_ = 0, fill_ = 0;
    io::File* file_ = nullptr;
    const Partition* part_ = nullptr;
    std::uint64_t extent_ = 0, pos_ = 0;
    std::optional<Xxh3Stream> hash_;
};

std::vector<std::span<std::byte>> spans(std::vector<mem::Lease>& leases, std::size_t from, std::size_t n) {
    std::vector<std::span<std::byte>> out;
    for (std::size_t i = from; i < from + n; ++i) out.push_back(leases[i].bytes());
    return out;
}

// A partition's file, for reading, resolved beneath the data directory: a
// data file that is a link leading outside it is refused (65), as is a folder.
// In a node-local rank folder, only one whose marker names the rank.
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

}  // namespace

// ---------------------------------------------------------------------------
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

    std::vector<std::string> superseded = place_beside(m, dir);
    OutFiles out;
    try {
        out.open(m, dir, ranks);
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
    out.written.folders = std::move(out.created);
    out.written.superseded = std::move(superseded);
    return std::move(out.written);
}

// ---------------------------------------------------------------------------
VerifyResult verify(const Manifest& m, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts) {
    const auto ranks = rank_set(m, opts);
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
        const auto& [name, parts] = files[u];
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
Manifest reshard(const Manifest& m, unsigned dp, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool,
                 const RunOptions& opts, Written& written) {
    if (m.dir.empty()) throw UsageError("the manifest names no data directory: reshard needs an initialised one");
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
    const auto old_groups = by_tensor_state(m);
    // Record keys this version does not know move to the new records when
    // every old partition of the tensor and state agrees on them.
    for (auto& q : n.parts) {
        const auto& olds = old_groups.at({q.tensor, q.state});
        const json::Json& first = *olds.front()->extra;
        for (auto it = first.begin(); it != first.end(); ++it) {
            bool same = std::all_of(olds.begin(), olds.end(), [&](const Partition* o) {
                return o->extra->contains(it.key()) && (*o->extra)[it.key()] == it.value();
            });
            if (same) (*q.extra)[it.key()] = it.value();
        }
        // The optimizer step of the values: one for the whole tensor, or the
        // old manifest is not one state.
        q.step = olds.front()->step;
        for (const Partition* o : olds)
            if (o->step != q.step)
                throw DataError(m.tensors[q.tensor].name + " " + q.state + ": rank " + std::to_string(o->rank) +
                                " is at step " + std::to_string(o->step) + ", rank " +
                                std::to_string(olds.front()->rank) + " at " + std::to_string(q.step) +
                                ": the manifest is not one state");
    }
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

    std::vector<std::string> superseded = place_beside(n, dir);
    OutFiles out;
    try {
        out.open(n, dir, all);
        Zeros zeros(pool);
        std::vector<std::vector<mem::Lease>> held(workers);
        std::deque<PartWriter> writers;
        for (auto& h : held) {
            h = pool.lease_many(ring, "zinf-shard reshard");
            writers.emplace_back(engine, spans(h, 0, ring), zeros);
        }
        run_units(units.size(), workers, opts, [&](std::size_t u, unsigned w) {
            const auto& key = units[u];
            const auto& olds = old_groups.at(key);
            const auto& news = new_groups.at(key);
            const std::uint64_t esize = dtype_bytes(olds.front()->dtype);
            PartWriter& writer = writers[w];
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
            mem::Stream stream(engine, pool, {.buffers = 2, .who = "zinf-shard reshard read"});  // within the budget above
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
            if (qi != news.size()) throw InternalError("reshard: " + n.tensors[key.first].name + " ran short of data");
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
    out.written.folders = std::move(out.created);
    out.written.superseded = std::move(superseded);
    written = std::move(out.written);
    return n;
}

}  // namespace zinf::shard
