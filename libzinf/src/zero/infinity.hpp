// The ZeRO-Infinity engine's insides, shared by fetch.cpp (the ring of
// device memory, the nc -> cg -> gg pipeline) and infinity.cpp (hooks, the
// trace and its prefetcher, gradients out).
#pragma once

#include <zinf/zero.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <condition_variable>
#include <string>
#include <vector>

namespace zinf::zero::detail {

inline constexpr std::uint64_t kNone = ~std::uint64_t{0};

// The bytes a buffer of `bytes` takes in the ring (Ring::place): at least
// one, in whole units of the arena.
inline std::uint64_t ring_bytes(std::uint64_t bytes) {
    return align_up(std::max<std::uint64_t>(bytes, 1), mem::kArenaAlignment);
}

// The engine's working memory: one region of the arena, each fetch placed
// at the lowest address clear of live buffers. A place never overlaps a live
// buffer; it may overlap buffers the host has released, and then the work
// that first writes the place waits (on the device) for their release
// events. Whether a fetch fits depends only on the order of host calls,
// never on timing, so every rank makes the same prefetch decisions and
// issues its collectives in the same order.
class Ring {
public:
    void init(std::span<std::byte> region) { region_ = region; }
    std::uint64_t size() const { return region_.size(); }
    std::span<std::byte> bytes(std::uint64_t at, std::uint64_t n) const { return region_.subspan(at, n); }

    struct Place {
        std::uint64_t id = 0, at = 0, bytes = 0;
        std::vector<device::Event> waits;  // release events of what it overlaps
    };
    // nullopt when no place clear of live buffers exists now. `busy` says
    // which release events the place had better not wait for.
    std::optional<Place> place(std::uint64_t bytes, const std::function<bool(const device::Event&)>& busy);
    void release(std::uint64_t id, const device::Event& done);
    void clear();  // everything released and done (the streams are idle)
    std::uint64_t live_bytes() const { return live_bytes_; }
    std::string describe_live() const;  // "[at, end) ..." of the live buffers, for errors
    std::uint64_t peak() const { return peak_; }
    void reset_peak() { peak_ = live_bytes_; }
    // Drops released entries whose events are done (fewer waits later).
    void prune(device::Device& dev);

private:
    struct Span {
        std::uint64_t id, at, bytes;
        bool small;
    };
    struct Released {
        std::uint64_t at, bytes;
        device::Event done;
    };
    std::span<std::byte> region_;
    std::vector<Span> live_;
    std::vector<Released> released_;
    std::uint64_t next_id_ = 1, live_bytes_ = 0, peak_ = 0;
    bool clear_of_live(std::uint64_t at, std::uint64_t n) const;
};

// A parameter's values memory, in a fetch or its own when persistent (byte
// offsets, kNone for none): this rank's partition on the device (not for the
// gpu tier, whose partition lives there), the bf16 gather buffer (dp > 1),
// the full fp32 values. A parameter kept bf16 (ParamState::keep_bf16) has
// no gather buffer and bf16 full values: gathered straight into them, or at
// dp 1 its partition is them (except the gpu tier's, copied in).
struct ValuesLayout {
    std::uint64_t own = kNone, staging = kNone, full = 0, bytes = 0;
};

// One parameter as the engine keeps it.
struct ParamState {
    std::size_t tensor = 0;
    std::uint64_t numel = 0, per = 0, count = 0;  // count: this rank's real elements
    std::size_t dt = 2;                           // bytes per element of the param dtype
    shard::Tier tier = shard::Tier::nvme;
    const Module* owner = nullptr;
    bool persistent = false;   // under persist_below: gathered once per step, kept
    bool shared_grad = false;  // used by other modules than its owner: gradient kept whole through backward
    bool keep_bf16 = false;    // its values held bf16 on the device (InfinityOptions::bf16_weights)
    mem::Block resident;       // gpu tier: this rank's partition (per * dt)
    mem::Block persist;        // persistent: its values memory (values_layout)
    std::uint64_t persist_version = kNone;
    device::Event persist_ready;
    mem::Block shared;         // shared_grad: the full fp32 gradient
    // gpu tier, guarded by the engine's refresh mutex (the optimizer's thread
    // refreshes while the engine's issues fetches): the last copy of new
    // values into `resident`, which the next gather waits for, and the last
    // gather that read it, which the next copy waits for.
    device::Event refreshed, last_read;
};

// Where one parameter's buffers sit in a fetch (byte offsets from the
// fetch's place, kNone for none): its values memory (not for a persistent
// one, which has its own) and, with gradients, the full gradient and this
// rank's reduce-scattered partition of it.
struct Slot {
    std::size_t param = 0;
    std::uint64_t values_at = kNone, grad = kNone, own_grad = kNone;
    ValuesLayout values;
};

// The buffers of one module's parameters, fetched for one use.
struct Fetch {
    const Module* module = nullptr;
    bool grads = false;        // with gradient buffers (a backward follows)
    std::size_t trace_index = 0;
    Ring::Place place;
    std::vector<Slot> slots;   // parameters that are not persistent
    device::Event ready;       // the gathers (and the gradients' zeroing) are done
    std::uint64_t bytes() const { return place.bytes; }
};

// One read of the nc stage: a pinned lease the file's bytes land in, and the
// outcome the cg stage waits for. Shared by the io callback and the copy
// stream's jobs, so the lease goes back to the pool only when both are done
// with it (a read still in flight never writes into a buffer someone else
// holds).
struct ReadCheck;
struct ReadPiece {
    mem::Lease lease;
    std::promise<void> done;
    std::shared_future<void> future;
    std::shared_ptr<ReadCheck> check;  // the partition's xxh3 (none without one to check)
};

// The xxh3 of a partition's pieces as their reads complete, on the io
// engine's completion thread (a host worker, not a device stream): each
// piece hashed once it and every piece before it are in, the digest checked
// against the record's when the last is. `verified` is set then: ready, or
// the DataError (65, naming file, offset and rank) of a mismatch, or the
// read's IoError. The copies to the device wait only for their reads; the
// stream waits for `verified` once, after them, before anything gathers the
// partition.
struct ReadCheck {
    std::mutex mu;
    Xxh3Stream hash;
    std::vector<std::shared_ptr<ReadPiece>> pieces;  // until hashed
    std::vector<std::uint64_t> real;                  // each piece's bytes of the partition
    std::vector<bool> in;                             // read
    std::size_t next = 0;                             // the next piece to hash
    bool settled = false;
    std::uint64_t want = 0;
    std::string where, path;
    std::uint64_t offset = 0;
    int rank = 0;
    std::promise<void> done;
    std::shared_future<void> verified;
    void arrived(std::size_t k, const IoError* e);  // the io callback of piece k
};

// A hook in the recorded order: a module fetched, for forward or with gradients.
struct TraceEntry {
    const Module* module = nullptr;
    bool backward = false;
    bool operator==(const TraceEntry&) const = default;
};

// Every parameter of the manifest as this rank keeps it (no memory yet).
std::vector<ParamState> describe_params(const shard::Manifest& m, std::span<const Module* const> modules,
                                        const InfinityOptions& opts, unsigned rank);
// The largest bucket a run's collectives lay flat (InfinityEngine::Need's
// flat, flat_module, flat_gradients), `bytes_of` saying what one bucket of
// tensors of these sizes takes (0: not laid flat).
struct Bucket {
    std::uint64_t bytes = 0;
    std::string module;
    bool gradients = false;
};
using BucketBytes = std::function<std::uint64_t(comm::Kind, std::span<const std::uint64_t>, comm::DType)>;
Bucket largest_bucket(std::span<const Module* const> modules, std::span<const std::uint64_t> numels,
                      shard::DType param_dtype, const BucketBytes& bytes_of);
// The bytes of one fetch of `mod` (see fetch.cpp), and its slots.
std::uint64_t block_bytes(const std::vector<ParamState>& params, unsigned dp, bool bf16, const Module& mod,
                          bool grads, std::vector<Slot>* slots);
ValuesLayout values_layout(const ParamState& p, unsigned dp, bool bf16);

}  // namespace zinf::zero::detail

namespace zinf::zero {

struct InfinityEngine::Impl {
    using ParamState = detail::ParamState;
    using Fetch = detail::Fetch;
    using Slot = detail::Slot;
    using TraceEntry = detail::TraceEntry;

    Impl(const shard::Manifest& m, std::span<const Module* const> modules, comm::Communicator& comm, io::Engine& io,
         mem::PinnedPool& pool, device::Device& dev, ParamStore& store, const InfinityOptions& opts);
    ~Impl();

    const shard::Manifest& m;
    std::vector<const Module*> modules;
    comm::Communicator& comm;
    io::Engine& io;
    mem::PinnedPool& pool;
    device::Device& dev;
    ParamStore& store;  // the optimizer when training
    InfinityOptions opts;
    unsigned dp = 1, rank = 0;
    bool bf16 = true;
    // The collectives over device buffers (opts.device_comm, else comm), and
    // whether they are enqueued on the collectives stream (NCCL) rather than
    // run by host jobs on it.
    comm::Communicator* coll_comm = nullptr;
    bool coll_ordered = false;
    // Where coll_comm lays buckets flat (Need::flat; NCCL only), for the run.
    mem::Block flat;
    device::Stream *compute = nullptr, *h2d = nullptr, *d2h = nullptr, *coll = nullptr;

    std::vector<ParamState> params;
    std::uint64_t version = 0;   // optimizer steps seen (persistent parameters)

    // The pass under way.
    bool in_pass = false, train = false, in_backward = false;
    InfinityStats st;

    // The ring: the engine's working memory, each fetch a place in it.
    struct RingStage {
        mem::Block block;
        detail::Ring places;
        std::uint64_t base_used = 0;  // arena bytes used outside the ring
    } ring;

    // Fetches (nc -> cg -> gg) and who holds them.
    struct PreRead {
        std::vector<std::shared_ptr<detail::ReadPiece>> pieces;
        std::uint64_t bytes = 0;
    };
    struct FetchStage {
        std::map<const Module*, std::unique_ptr<Fetch>> current;  // in use by a module now
        std::unique_ptr<Fetch> candidate;  // after its forward; reused if the same module is next
        // A block's forward run again in backward, kept for the module's own
        // backward that the trace says follows (recompute -> backward reuse).
        std::map<const Module*, std::unique_ptr<Fetch>> parked;
        std::uint64_t parked_bytes = 0;  // within TraceStage::park_bytes
        std::map<std::size_t, std::unique_ptr<Fetch>> prefetched;  // by trace index
        std::uint64_t ahead_bytes = 0;   // of the prefetched
        // nc read ahead of the fetches: by (trace index, parameter).
        std::map<std::pair<std::size_t, std::size_t>, PreRead> pre_read;
        std::size_t nc_next = 0;
        std::uint64_t nc_held = 0;
        // Every read this engine has in flight (its pieces' futures): waited for
        // after a failure, before their buffers go. Not io.wait_all(): the
        // optimizer's thread has its own requests in flight on the same engine.
        std::vector<std::shared_future<void>> reads_out;
        std::atomic<std::uint64_t> stall_ns{0};  // compute waiting for them
    } fetch;

    // The recorded order of each kind of pass ([train]) and its replay.
    struct TraceStage {
        std::vector<TraceEntry> order[2], recording;
        // Per trace entry: the earlier entry whose fetch it reuses (kNone: none),
        // and whether a later one reuses its fetch (it then carries gradients).
        std::vector<std::uint64_t> reuse_from[2];
        std::vector<bool> feeds[2];
        // The most device bytes that fetches kept for a later backward may
        // hold (FetchStage::parked): the most the recorded order ever keeps
        // at once, where the ring holds it beside the prefetch budget and two
        // of the largest modules, else what it can; never under the prefetch
        // budget, and 0 with it (one module live at a time).
        std::uint64_t park_bytes[2] = {};
        bool replay = false, diverged = false, warned = false;
        std::size_t pos = 0, pf_next = 0;  // the replay's next entry, and the prefetch's
    } trace;
    void set_trace(bool train_pass, std::vector<TraceEntry> t);

    // Gradients on their way to the optimizer (release event, bytes): the
    // host waits for the oldest while they hold more than the prefetch
    // budget (and two of the largest modules), so backward cannot run
    // arbitrarily far ahead of the hand-over and spread its buffers over the
    // whole ring.
    //
    // The partitions leave through a ring of kStaging page-locked buffers
    // (one region from the pool, each the largest partition): a partition's
    // copy goes on the d2h stream into the next buffer, and a host worker of
    // the engine's own (not a stream: put_gradient blocks, writes files and
    // may throw) waits for the copy's event and hands it to the store, in
    // the order they were queued, then frees the buffer. The copies are
    // numbered (tickets, in queue order; buffer = ticket mod kStaging): the
    // d2h stream waits, before the copy of ticket n, until the hand-overs
    // before n - kStaging + 1 are done (a wait of its own, timed in
    // `staging_wait_ns`; the backward's caller never waits, so the launches
    // stay ahead of the device). So a slow hand-over holds up neither the
    // d2h stream nor the next copies while a buffer is free, and never sees
    // its bytes overwritten. The worker's first error is the pass's
    // (end()); what is queued after it is dropped, its buffers freed.
    struct GradientStage {
        static constexpr std::size_t kStaging = 3;
        mem::Pinned staging;  // host: kStaging buffers of `slot` bytes
        std::uint64_t slot = 0;
        struct Job {
            device::Event copied;
            std::size_t buffer;
            std::size_t tensor;
            std::uint64_t count;
            bool dropped = false;  // its copy was never queued: only counted
        };
        std::thread worker;
        std::mutex mu;
        std::condition_variable cv;
        std::deque<Job> jobs;          // queued, not yet handed over
        std::uint64_t tickets = 0;     // copies queued, this run
        std::uint64_t handed = 0;      // hand-overs done (or dropped), in ticket order
        bool working = false;          // the worker is handing one over
        bool quit = false;
        std::exception_ptr error;      // the first hand-over that failed
        std::atomic<std::uint64_t> staging_wait_ns{0};  // the d2h stream waiting for a free buffer, this pass
        std::deque<std::pair<device::Event, std::uint64_t>> handovers;
        std::uint64_t handover_bytes = 0;
        std::uint64_t largest_block = 0;  // the largest module's fetch, gradients included
    } gradients;
    void handover_loop();
    void drain_handovers() noexcept;  // waits until every queued hand-over is done (or dropped)

    // The gpu tier's refresh after the optimizer (on_param, called on the
    // optimizer's thread, during backward when its update overlaps it): the
    // new values are copied into a piece of page-locked staging of the
    // engine's own, and from there into the resident partition by an
    // asynchronous copy on the h2d stream, after the last gather that read
    // the old values; the next gather of the parameter waits for the copy's
    // event. The caller's memory is free again when on_param returns; the
    // host waits only when every piece is still on its way to the device.
    struct RefreshStage {
        static constexpr std::size_t kPieces = 2;
        std::mutex mu;             // the pieces, and every ParamState's refreshed and last_read
        mem::Pinned staging;       // kPieces pieces of `piece` bytes (none without a gpu tier)
        std::uint64_t piece = 0;
        device::Event piece_done[kPieces];
        std::size_t next = 0;
    } refresh;
    void refresh_param(ParamState& p, std::uint64_t first, std::span<const std::byte> values);

    // fetch.cpp
    std::uint64_t block_bytes(const Module& mod, bool grads, std::vector<Slot>* slots) const {
        return detail::block_bytes(params, dp, bf16, mod, grads, slots);
    }
    std::unique_ptr<Fetch> issue(const Module& mod, bool grads, std::size_t trace_index, bool prefetch);
    // One parameter between cg and gg: its partition on the device (once the
    // h2d stream gets there), the bf16 gather buffer (dp > 1 with bf16), the
    // full values (fp32, or bf16 when kept so).
    struct Staged {
        ParamState* p = nullptr;
        std::span<const std::byte> src;
        std::span<std::byte> staging;
        std::span<std::byte> full;
    };
    Staged stage(ParamState& p, std::span<std::byte> mem, const detail::ValuesLayout& l,
                 const std::vector<device::Event>& waits, std::size_t trace_index);
    std::span<const std::byte> copy_in(ParamState& p, std::span<std::byte> own, const std::vector<device::Event>& waits,
                                       std::size_t trace_index);
    void gather(const std::vector<Staged>& bucket, const std::vector<device::Event>& waits);
    std::vector<std::shared_ptr<detail::ReadPiece>> read_partition(const ParamSource& src,
                                                               std::uint64_t pbytes, bool try_only);
    void read_ahead();
    void release(std::unique_ptr<Fetch>& f, const device::Event& done);
    // The full values `mod` reads of `param` in its fetch (or its persistent memory).
    std::span<const std::byte> full_values(const Module& mod, std::size_t param) const;
    void reset_streams() noexcept;

    // infinity.cpp
    Fetch& acquire(const Module& mod, bool backward);
    void prefetch();
    void drop_prefetched();
    void drop_parked();
    void hand_over(const Module& mod);
    bool has_params(const Module& mod) const { return !mod.params().empty() || !mod.external().empty(); }

    Fetch* fetch_of(const Module& mod) const;
};

}  // namespace zinf::zero
