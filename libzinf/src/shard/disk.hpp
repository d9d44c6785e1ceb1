// Private to libzinf's shard module: what init, verify, cat and reshard
// share to run a manifest against the disk. All of it streams through the
// pinned pool in buffer-sized pieces, so memory stays flat whatever the model
// size, with the io engine's writes of one piece in flight while the next is
// computed.
#pragma once

#include <zinf/shard.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zinf::shard::detail {

// Worker threads: `jobs`, or the CPUs there are (at most 8) for 0.
unsigned resolve_jobs(unsigned jobs);
// Interrupted (130) once the run's stop flag is set.
void check_stop(const RunOptions& opts);

// Runs units 0..n-1 on `jobs` threads, in order of index as threads free up.
// The first exception (or a stop) ends the rest (units not yet started are
// skipped) and is rethrown once every thread has finished.
void run_units(std::size_t n, unsigned jobs, const RunOptions& opts,
               const std::function<void(std::size_t unit, unsigned worker)>& fn);

// The ranks a run does: opts.ranks, or every rank; UsageError past dp.
std::set<unsigned> rank_set(const Manifest& m, const RunOptions& opts);
// Partitions by (tensor, state), in rank order.
using PartitionGroups = std::map<std::pair<std::size_t, std::string>, std::vector<const Partition*>>;
PartitionGroups by_tensor_state(const Manifest& m);
// "h.0.attn.c_attn.weight rank 1 param", for messages.
std::string describe(const Manifest& m, const Partition& p);

// The files a run writes: opened under temporary names, space reserved.
struct OutFiles {
    std::map<std::string, io::File> files;  // by manifest file name
    Written written;
    std::vector<std::string> created;       // folders this run made
    std::vector<std::string> markers_made;  // rank folders' markers this run wrote
    std::vector<std::pair<std::string, std::string>> markers_replaced;  // (path, text before) it rewrote

    // Creates `dir` and the temporaries of every file `m` holds for `ranks`;
    // statvfs first, so a disk too small fails before anything is written.
    // Every folder and file is resolved beneath `dir`: a rank folder that is
    // a link leading outside is refused (65) before anything is made there.
    //
    // With node-local rank folders (m.rank_dirs) each rank's files go into
    // its own folder, made when absent; one that exists must be empty or hold
    // this rank's marker (kRankMarker) naming `dir`'s state as its owner
    // (another owner: CreateError, 73, unless `force` takes it over). The
    // marker naming `dir` is written into every folder this run writes
    // before its files; discard() removes or gives back what it replaced.
    void open(const Manifest& m, const std::string& dir, const std::set<unsigned>& ranks, bool force);
    // After a failure: the temporaries and the folders this run made, so
    // nothing is left behind.
    void discard() noexcept;
    // Every write done: fdatasync and a checked close of each file.
    void finish(io::Engine& engine);
    // After finish(): what the run wrote, for commit(), with the files of
    // the committed state it replaces (place_beside).
    Written release(std::vector<std::string> superseded);

    // `folder` holds files other than its lock, its marker and a killed
    // writer's temporaries.
    static bool holds_state_files(const std::string& folder);

private:
    // The files and, when this run writes it, the manifest: each rounded up
    // to whole blocks. A state that fits but whose manifest does not would
    // leave every file written and nothing committed.
    // Node-local rank folders are added up per file system (by device), so
    // two folders on one disk count together and each disk is checked.
    static void check_space(const Manifest& m, const std::string& dir, const std::map<std::string, std::uint64_t>& sizes,
                            bool manifest);
    // Rank r's node-local folder, made when absent (and its parents); one
    // that exists must be a real folder, empty or holding r's marker, whose
    // owner is `owner` unless `force`.
    std::string make_rank_folder(const Manifest& m, unsigned r, const std::string& owner, bool force);

    // A folder of the layout, beneath `dir`: one that exists must not lead
    // outside it; one that does not is made.
    void make_folder_beneath(const std::string& dir, const std::string& folder);
    // What an earlier run killed half-way left under its temporary names
    // beside `file` ("<file>.zinf-tmp.<random>"): removed, so that they
    // neither pile up nor count against the space.
    static void remove_stale_temps(const Manifest::Place& at);
    // Creates `path` and its missing parents, remembering which were new.
    void make_dirs(const std::string& path);
};

// Whether a writer of `dir`'s state may write rank r's node-local folder
// (m.rank_dirs[r]) when it exists: a real folder, empty or holding r's
// marker (else UsageError, 64), whose owner is `owner` and which `owner`'s
// committed manifest names when it holds a state's files (else
// CreateError, 73, unless `force`). check_claims runs it for `ranks` before
// the writer locks anything, so that a refused writer writes nothing there,
// not even its lock record; OutFiles::open again under the lock.
void check_claim(const Manifest& m, unsigned r, const std::string& owner, bool force);
void check_claims(const Manifest& m, const std::string& dir, const std::set<unsigned>& ranks, bool force);

// Zero bytes to write from: one pool buffer, cleared once, shared by every
// writer (the engine only reads it).
struct Zeros {
    mem::Lease lease;
    explicit Zeros(mem::PinnedPool& pool);
    std::span<const std::byte> first(std::uint64_t n) const { return lease.bytes().first(n); }
    std::optional<std::uint64_t> cached_hash(std::uint64_t bytes) const;
    void remember(std::uint64_t bytes, std::uint64_t hash) const;
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
    ~PartWriter();

    void start(io::File& file, const Partition& p, std::uint64_t alignment) {
        file_ = &file;
        part_ = &p;
        extent_ = align_up(p.bytes, alignment);
        pos_ = fill_ = 0;
        hash_.emplace();
    }
    // The next data bytes of the partition.
    void append(std::span<const std::byte> data);
    // Room to fill in place: write up to here().size() bytes, then advance().
    std::span<std::byte> here() { return bufs_[cur_].subspan(fill_); }
    void advance(std::size_t n) {
        fill_ += n;
        if (fill_ == bufs_[cur_].size()) flush(fill_);
    }
    // Zero padding to the end; returns the partition's xxh3. The writes may
    // still be in flight.
    std::uint64_t finish();
    void drain();

private:
    static constexpr std::size_t kMaxPending = 64;

    void hash_bytes(std::span<const std::byte> piece);
    void flush(std::size_t n);

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

// Leases [from, from + n) as the spans a PartWriter rings over.
std::vector<std::span<std::byte>> spans(std::vector<mem::Lease>& leases, std::size_t from, std::size_t n);

// A partition's file, for reading, resolved beneath the data directory: a
// data file that is a link leading outside it is refused (65), as is a folder.
// In a node-local rank folder, only one whose marker names the rank.
io::File open_data(const Manifest& m, const Partition& p);

// `dir` as the manifest's header records it: absolute, links resolved.
std::string absolute_dir(const std::string& dir);

}  // namespace zinf::shard::detail
