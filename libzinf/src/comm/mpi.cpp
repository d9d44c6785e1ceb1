// The MPI backend: host buffers. Built when mpicxx is found (ZINF_HAVE_MPI).
//
// Allgather, allreduce and broadcast go through MPI's blocking call, whose
// algorithms (coll/tuned) Open MPI picks per size and per machine; its
// non-blocking ones (coll/libnbc) are fixed: 1.8x slower for a 1 MiB
// reduce-scatter over 4 ranks here, 10% faster at 16 MiB
// (scripts/bench-comm.sh). The blocking call is the one users compare with
// and the one MPI's maintainers tune, so zinf is never behind it;
// non-blocking operations still overlap the caller's work, because they run
// on the communicator's own thread. A bucket is packed into one staging area
// and moved by one call; uneven blocks use the v-forms.
//
// Reduce-scatter is the exception: Open MPI 4.1's MPI_Reduce_scatter(_block)
// runs at a tenth or less of its own allreduce's bus bandwidth on one
// machine (BENCHMARKS.md), and it sums in an order of its choosing, so an
// element's bits could change with the bucket it travels in. zinf moves
// each rank's contribution to each block straight to the block's owner
// (MPI_Isend and MPI_Irecv pairs in chunks, MPI_Waitall) and sums the n
// contributions itself, in rank order 0..n-1 (reduce_in_order): the same
// bits on every rank, for any bucket split and any block bounds. bare()
// still calls MPI_Reduce_scatter_block, for zinf-commbench --raw.
//
// A blocking call cannot be interrupted, so a watchdog holds its deadline:
// when it passes, the watchdog says which operation on which rank hung, waits
// a moment so that peers stuck in the same collective can say so too, and
// ends the process (exit 74; the launcher then stops the job): the one place
// where libzinf ends a process, because a hung collective cannot be returned
// from. (Creating the communicator is non-blocking, and its timeout an
// exception.) MPI_Waitall of the reduce-scatter's pairs is such a call.
#include "internal.hpp"

#if ZINF_HAVE_MPI
#include <mpi.h>
#endif

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace zinf::comm::detail {

#if ZINF_HAVE_MPI
namespace {

std::string mpi_message(int code) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(buf, static_cast<std::size_t>(len));
}

const char* level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown thread level";
}

// A blocking MPI call that meets every rank and that nothing interrupts
// (MPI_Init_thread exchanges the ranks' addresses; MPI_Comm_split_type and
// MPI_Finalize meet them all): a rank that died before it would keep the
// others there for good under a launcher that leaves them running (mpirun
// --enable-recovery; tests/crash/rank.sh found init stuck in MPI_Init_thread).
// The call gets the collectives' deadline: past it, the process says so and
// ends (exit 74), as the watchdog below does.
class BlockingDeadline {
public:
    BlockingDeadline(std::chrono::milliseconds timeout, const char* what) {
        if (timeout.count() == 0) return;
        thread_ = std::thread([this, d = Deadline::after(timeout), what] {
            std::unique_lock lk(mu_);
            if (cv_.wait_until(lk, d.at, [this] { return done_; })) return;
            std::fprintf(stderr, "%s: rank %d: %s; stopping\n", log::program().c_str(), Launch::from_env().rank,
                         timeout_message(what, d).c_str());
            std::fflush(stderr);
            std::_Exit(exit_code::io);
        });
    }
    ~BlockingDeadline() {
        {
            std::lock_guard lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

// The process's MPI: initialised once, finalized at exit, unless an operation
// failed while still in flight (MPI may yet write into its buffers, and
// MPI_Finalize would wait for peers that are gone): then the process exits
// without it and the launcher stops the other ranks.
class Runtime {
public:
    // `timeout`: the deadline of MPI_Init_thread and MPI_Finalize, from the
    // first call (the first communicator's).
    static Runtime& get(std::chrono::milliseconds timeout = {}) {
        static Runtime r(timeout);
        return r;
    }
    int provided() const { return provided_; }
    void poison() noexcept { poisoned_ = true; }
    // Each communicator calls MPI from its own threads, serialised only
    // among themselves: a second one at a time needs MPI_THREAD_MULTIPLE.
    void attach() {
        if (engines_.fetch_add(1) >= 1 && provided_ < MPI_THREAD_MULTIPLE) {
            engines_.fetch_sub(1);
            throw CommError(std::string("MPI provides ") + level_name(provided_) +
                            ": one zinf communicator at a time (a second needs MPI_THREAD_MULTIPLE)");
        }
    }
    void detach() noexcept { engines_.fetch_sub(1); }
    ~Runtime() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        // After an error, MPI_Finalize would wait for peers that may be
        // waiting for this rank: leave without it (see zinf::failing()).
        if (owned_ && !poisoned_ && !failing() && !finalized) {
            BlockingDeadline guard(timeout_, "MPI_Finalize");
            MPI_Finalize();
        }
    }

private:
    explicit Runtime(std::chrono::milliseconds timeout) : timeout_(timeout) {
        int init = 0;
        MPI_Initialized(&init);
        if (!init) {
            // MULTIPLE asked, so that a program may use MPI beside us;
            // SERIALIZED is what the communicator's own thread needs.
            BlockingDeadline guard(timeout_, "MPI_Init_thread (every rank starting)");
            const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided_);
            if (rc != MPI_SUCCESS) throw CommError("MPI_Init_thread failed: " + mpi_message(rc));
            owned_ = true;
        } else {
            MPI_Query_thread(&provided_);
        }
        if (provided_ < MPI_THREAD_SERIALIZED)
            throw CommError(std::string("MPI provides ") + level_name(provided_) +
                            "; zinf needs MPI_THREAD_SERIALIZED or more (operations run on the "
                            "communicator's own thread)");
    }
    std::chrono::milliseconds timeout_;
    int provided_ = MPI_THREAD_SINGLE;
    bool owned_ = false;
    std::atomic<bool> poisoned_{false};
    std::atomic<int> engines_{0};
};

MPI_Datatype mpi_type(DType t) {
    switch (t) {
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return MPI_UINT16_T;  // reduced by our own operations
    }
    return MPI_BYTE;
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    bf16_reduce(static_cast<std::uint16_t*>(inout), static_cast<const std::uint16_t*>(in),
                static_cast<std::size_t>(*len), Reduce::sum);
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
    bf16_reduce(static_cast<std::uint16_t*>(inout), static_cast<const std::uint16_t*>(in),
                static_cast<std::size_t>(*len), Reduce::max);
}

// Holds the deadline of the blocking call in progress; see the top of the file.
class Watchdog {
public:
    explicit Watchdog(int rank) : rank_(rank) {}
    ~Watchdog() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    // Cheap on the hot path: a lock, no wake-up (the watchdog looks every 50 ms).
    void arm(const Deadline& d, const Op& op) {
        if (d.timeout.count() == 0) return;
        std::lock_guard lk(mu_);
        deadline_ = d;
        op_ = &op;
        if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
    }
    void disarm() {
        std::lock_guard lk(mu_);
        op_ = nullptr;
    }

private:
    void watch() {
        std::unique_lock lk(mu_);
        while (!stop_) {
            cv_.wait_for(lk, std::chrono::milliseconds(50));
            if (stop_ || !op_ || !deadline_.passed()) continue;
            const std::string msg = timeout_message(op_->what(), deadline_);
            {
                std::lock_guard out(log::stderr_mutex());
                std::fprintf(stderr, "%s: rank %d: %s; stopping the job\n", log::program().c_str(), rank_,
                             msg.c_str());
                std::fflush(stderr);
            }
            // Peers stuck in the same collective reach their deadlines within
            // moments: let them report before the job goes.
            const Op* hung = op_;
            cv_.wait_for(lk, std::min<std::chrono::milliseconds>(deadline_.timeout, std::chrono::seconds(1)),
                         [&] { return stop_ || op_ != hung; });
            if (stop_ || op_ != hung) {  // it finished during the grace after all
                std::lock_guard out(log::stderr_mutex());
                std::fprintf(stderr, "%s: rank %d: it completed after all, late; going on\n",
                             log::program().c_str(), rank_);
                continue;
            }
            // Not MPI_Abort: Open MPI 4.1's mpirun can crash tearing a job down
            // after it. A process that exits without MPI_Finalize makes mpirun
            // (and srun) stop the others, and the job's status is this one.
            std::_Exit(exit_code::io);
        }
    }

    const int rank_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    Deadline deadline_;
    const Op* op_ = nullptr;
    std::thread thread_;
};

class Mpi final : public Engine {
public:
    explicit Mpi(std::chrono::milliseconds timeout) {
        provided_ = Runtime::get(timeout).provided();
        Runtime::get().attach();
        struct Detach {
            bool armed = true;
            ~Detach() { if (armed) Runtime::get().detach(); }
        } detach_on_throw;
        // A duplicate of the world, so no one else's messages meet ours;
        // non-blocking, so a rank that never arrives is a timeout, not a hang.
        MPI_Request req;
        check(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &req), "MPI_Comm_idup");
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        wait(req, Deadline::after(timeout), "creating the communicator");
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_size(comm_, &size_);
        MPI_Comm node;
        {
            BlockingDeadline guard(timeout, "MPI_Comm_split_type (the ranks on this node)");
            check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                  "MPI_Comm_split_type");
        }
        MPI_Comm_rank(node, &local_rank_);
        MPI_Comm_size(node, &local_size_);
        MPI_Comm_free(&node);
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        version_.assign(lib, static_cast<std::size_t>(len));
        version_ = version_.substr(0, version_.find_first_of(",\n"));
        MPI_Op_create(&bf16_sum, 1, &bf16_sum_);
        MPI_Op_create(&bf16_max, 1, &bf16_max_);
        watchdog_ = std::make_unique<Watchdog>(rank_);
        detach_on_throw.armed = false;
        attached_ = true;
    }

    ~Mpi() override {
        if (attached_) Runtime::get().detach();
        if (poisoned_) return;
        MPI_Op_free(&bf16_sum_);
        MPI_Op_free(&bf16_max_);
        MPI_Comm_free(&comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int local_rank() const override { return local_rank_; }
    int local_size() const override { return local_size_; }
    Backend kind() const override { return Backend::mpi; }
    std::string describe() const override {
        return "mpi, rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (local " +
               std::to_string(local_rank_) + " of " + std::to_string(local_size_) + "), " + level_name(provided_) +
               ", " + version_;
    }
    void poison() noexcept override {
        poisoned_ = true;
        Runtime::get().poison();
    }

    void execute(Op& op, const Deadline& dl) override {
        watchdog_->arm(dl, op);
        try {
            run(op);
        } catch (...) {
            watchdog_->disarm();
            throw;
        }
        watchdog_->disarm();
    }

    void bare(Op& op) override { blocking(op); }

private:
    // One buffer of equal blocks through the plain call; uneven blocks
    // through the v-forms; a bucket packed into one staging area;
    // reduce-scatter always by zinf's exchange (see the top of the file).
    void run(Op& op) {
        if (op.kind == Kind::barrier ||
            (op.kind != Kind::reduce_scatter && op.bufs.size() == 1 && op.bufs[0].counts.empty())) {
            blocking(op);
            return;
        }
        const MPI_Datatype t = mpi_type(op.dtype);
        const std::size_t es = dtype_bytes(op.dtype);
        switch (op.kind) {
        case Kind::allgather: allgather(op); return;
        case Kind::reduce_scatter:
            reduce_scatter(op);
            average(op);
            return;
        case Kind::broadcast: {
            auto stage = pack_whole(op);
            check(MPI_Bcast(stage.data(), count(stage.size() / es), t, op.root, comm_), "MPI_Bcast", op);
            if (rank_ != op.root) unpack_whole(op, stage);
            return;
        }
        case Kind::allreduce: {
            auto stage = pack_whole(op);
            check(MPI_Allreduce(MPI_IN_PLACE, stage.data(), count(stage.size() / es), t, reduction(op), comm_),
                  "MPI_Allreduce", op);
            unpack_whole(op, stage);
            average(op);
            return;
        }
        case Kind::barrier: return;
        }
    }

    // One buffer of equal blocks, or a barrier, through MPI's blocking call.
    void blocking(Op& op) {
        const MPI_Datatype t = mpi_type(op.dtype);
        const std::size_t es = dtype_bytes(op.dtype);
        if (op.kind == Kind::barrier) {
            check(MPI_Barrier(comm_), "MPI_Barrier", op);
            return;
        }
        auto& b = op.bufs.at(0);
        switch (op.kind) {
        case Kind::allgather: {
            const bool in_place = b.send.data() == b.recv.data() + static_cast<std::size_t>(rank_) * b.send.size();
            check(MPI_Allgather(in_place ? MPI_IN_PLACE : b.send.data(), count(b.send.size() / es), t, b.recv.data(),
                                count(b.send.size() / es), t, comm_),
                  "MPI_Allgather", op);
            break;
        }
        case Kind::reduce_scatter:
            check(MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), count(b.recv.size() / es), t, reduction(op),
                                           comm_),
                  "MPI_Reduce_scatter_block", op);
            break;
        case Kind::allreduce:
            check(MPI_Allreduce(b.send.data() == b.recv.data() ? MPI_IN_PLACE : b.send.data(), b.recv.data(),
                                count(b.recv.size() / es), t, reduction(op), comm_),
                  "MPI_Allreduce", op);
            break;
        case Kind::broadcast:
            check(MPI_Bcast(b.recv.data(), count(b.recv.size() / es), t, op.root, comm_), "MPI_Bcast", op);
            break;
        case Kind::barrier: break;
        }
        average(op);
    }

    // --- allgather: one buffer in place or straight; a bucket through staging.
    void allgather(Op& op) {
        const MPI_Datatype t = mpi_type(op.dtype);
        const std::size_t es = dtype_bytes(op.dtype);
        if (op.bufs.size() == 1) {  // uneven blocks (equal ones went to blocking())
            auto& b = op.bufs[0];
            const std::byte* own = b.recv.data() + block_first(op, b, rank_, size_) * es;
            const void* send = b.send.data() == own ? MPI_IN_PLACE : b.send.data();
            set_counts([&](int r) { return block_count(op, b, r, size_); });
            check(MPI_Allgatherv(send, counts_[rank_], t, b.recv.data(), counts_.data(), displs_.data(), t, comm_),
                  "MPI_Allgatherv", op);
            return;
        }
        // Rank r's part of the staging area: its block of every buffer, in order.
        set_counts([&](int r) { return bucket_block(op, r); });
        auto mine = send_.get(static_cast<std::size_t>(counts_[rank_]) * es);
        std::size_t at = 0;
        for (const auto& b : op.bufs) {
            copy_bytes(mine.data() + at, b.send.data(), b.send.size());
            at += b.send.size();
        }
        auto all = recv_.get(static_cast<std::size_t>(total_) * es);
        check(MPI_Allgatherv(mine.data(), counts_[rank_], t, all.data(), counts_.data(), displs_.data(), t, comm_),
              "MPI_Allgatherv", op);
        for (int r = 0; r < size_; ++r) {
            std::size_t from = static_cast<std::size_t>(displs_[r]) * es;
            for (const auto& b : op.bufs) {
                const std::size_t n = block_count(op, b, r, size_) * es;
                copy_bytes(b.recv.data() + block_first(op, b, r, size_) * es, all.data() + from, n);
                from += n;
            }
        }
    }

    // --- reduce-scatter: rank r's block of every buffer goes to rank r;
    // each rank sums what it received in rank order. One buffer is sent from
    // where it lies; a bucket is packed first, rank r's blocks back to back.
    void reduce_scatter(Op& op) {
        const std::size_t es = dtype_bytes(op.dtype);
        outs_.clear();
        if (op.bufs.size() == 1) {
            auto& b = op.bufs[0];
            set_counts([&](int r) { return block_count(op, b, r, size_); });
            outs_.push_back(b.recv);
            exchange(op, [&](int r) { return b.send.data() + block_first(op, b, r, size_) * es; });
            return;
        }
        set_counts([&](int r) { return bucket_block(op, r); });
        auto all = send_.get(static_cast<std::size_t>(total_) * es);
        std::size_t at = 0;
        for (int r = 0; r < size_; ++r)
            for (const auto& b : op.bufs) {
                const std::size_t n = block_count(op, b, r, size_) * es;
                copy_bytes(all.data() + at, b.send.data() + block_first(op, b, r, size_) * es, n);
                at += n;
            }
        for (const auto& b : op.bufs) outs_.push_back(b.recv);
        exchange(op, [&](int r) { return all.data() + static_cast<std::size_t>(displs_[r]) * es; });
    }

    // Sends rank r its block (counts_[r] elements at to(r)), receives this
    // rank's block (counts_[rank_] elements) from every other rank, and sums
    // the n contributions in rank order into outs_ (this rank's block, in
    // pieces, back to back). Blocks travel in chunks of kChunkBytes, every
    // send posted at once and the receives one chunk at a time, so that a
    // chunk is summed while it is still in cache. Non-blocking pairs, nearest
    // ranks first, finished by MPI_Waitall, which the watchdog holds to the
    // deadline like the blocking calls.
    template <class To>
    void exchange(const Op& op, To&& to) {
        const MPI_Datatype t = mpi_type(op.dtype);
        const std::size_t es = dtype_bytes(op.dtype), chunk = kChunkBytes / es;
        const std::size_t mine = static_cast<std::size_t>(counts_[rank_]);
        sends_.clear();
        for (int k = 1; k < size_; ++k) {
            const int dst = (rank_ + k) % size_;
            const std::byte* p = to(dst);
            for (std::size_t done = 0, n = static_cast<std::size_t>(counts_[dst]); done < n; done += chunk) {
                sends_.emplace_back();
                check(MPI_Isend(p + done * es, static_cast<int>(std::min(chunk, n - done)), t, dst, kTag, comm_,
                                &sends_.back()),
                      "MPI_Isend", op);
            }
        }
        const std::byte* own = to(rank_);
        auto slots = recv_.get(std::min(chunk, mine) * es * static_cast<std::size_t>(size_));
        std::size_t out = 0, out_at = 0;  // where the next summed element goes: outs_[out], byte out_at
        for (std::size_t done = 0; done < mine; done += chunk) {
            const std::size_t m = std::min(chunk, mine - done), slot = m * es;
            recvs_.clear();
            for (int k = 1; k < size_; ++k) {
                const int src = (rank_ + size_ - k) % size_;
                recvs_.emplace_back();
                check(MPI_Irecv(slots.data() + static_cast<std::size_t>(src) * slot, static_cast<int>(m), t, src,
                                kTag, comm_, &recvs_.back()),
                      "MPI_Irecv", op);
            }
            check(MPI_Waitall(static_cast<int>(recvs_.size()), recvs_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall",
                  op);
            // The chunk's elements, split where the outputs split.
            for (std::size_t from = 0; from < slot;) {
                while (out_at == outs_[out].size()) ++out, out_at = 0;
                const std::size_t piece = std::min(slot - from, outs_[out].size() - out_at);
                inputs_.resize(static_cast<std::size_t>(size_));
                for (int r = 0; r < size_; ++r)
                    inputs_[static_cast<std::size_t>(r)] = r == rank_ ? own + done * es + from
                                                                      : slots.data() + static_cast<std::size_t>(r) * slot + from;
                reduce_in_order(outs_[out].subspan(out_at, piece), inputs_, op.dtype, op.reduce);
                from += piece;
                out_at += piece;
            }
        }
        check(MPI_Waitall(static_cast<int>(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall", op);
    }
    // 256 KiB: a chunk from every peer, this rank's own and the result stay
    // within a core's L2 at 4 ranks; measured best of 128K-512K and whole
    // blocks at np 2 and 4 (BENCHMARKS.md).
    static constexpr std::size_t kChunkBytes = std::size_t{256} << 10;

    // Elements of rank r's block summed over a bucket's buffers.
    std::uint64_t bucket_block(const Op& op, int r) const {
        std::uint64_t n = 0;
        for (const auto& b : op.bufs) n += block_count(op, b, r, size_);
        return n;
    }

    template <class F>
    void set_counts(F&& per_rank) {
        counts_.resize(static_cast<std::size_t>(size_));
        displs_.resize(static_cast<std::size_t>(size_));
        std::uint64_t at = 0;
        for (int r = 0; r < size_; ++r) {
            counts_[r] = count(per_rank(r));
            displs_[r] = count(at, "an offset of");
            at += static_cast<std::uint64_t>(counts_[r]);
        }
        total_ = at;
    }

    // allreduce and broadcast of a bucket: every buffer back to back.
    std::span<std::byte> pack_whole(const Op& op) {
        std::size_t total = 0;
        for (const auto& b : op.bufs) total += b.recv.size();
        auto stage = send_.get(total);
        std::size_t at = 0;
        for (const auto& b : op.bufs) {
            const bool has_send = op.kind == Kind::allreduce;
            if (op.kind != Kind::broadcast || rank_ == op.root)
                copy_bytes(stage.data() + at, has_send ? b.send.data() : b.recv.data(), b.recv.size());
            at += b.recv.size();
        }
        return stage;
    }
    static void unpack_whole(const Op& op, std::span<const std::byte> stage) {
        std::size_t at = 0;
        for (const auto& b : op.bufs) {
            copy_bytes(b.recv.data(), stage.data() + at, b.recv.size());
            at += b.recv.size();
        }
    }

    void average(Op& op) const {
        if (op.reduce != Reduce::avg) return;
        for (auto& b : op.bufs) divide(b.recv, op.dtype, size_);
    }

    MPI_Op reduction(const Op& op) const {
        if (op.dtype == DType::bf16) return op.reduce == Reduce::max ? bf16_max_ : bf16_sum_;
        return op.reduce == Reduce::max ? MPI_MAX : MPI_SUM;
    }

    // MPI counts and offsets are int: 2^31 elements or more are refused plainly.
    static int count(std::uint64_t n, const char* what = "a block of") {
        if (n > static_cast<std::uint64_t>(INT_MAX))
            throw CommError(std::string(what) + " " + std::to_string(n) +
                            " elements is more than MPI's int count (2^31 - 1); split it into smaller buckets");
        return static_cast<int>(n);
    }

    void check(int rc, const char* call, const Op& op = {}) const {
        if (rc != MPI_SUCCESS)
            throw CommError(std::string(call) + " failed" + (op.bufs.empty() ? "" : " in " + op.what()) + ": " +
                                mpi_message(rc),
                            {.rank = rank_});
    }

    // The one non-blocking call left (MPI_Comm_idup): tested until done or
    // past its deadline, so a rank that never arrives is a Timeout.
    void wait(MPI_Request& req, const Deadline& dl, const std::string& doing) const {
        for (unsigned tries = 0;; ++tries) {
            if (tries > 64) std::this_thread::yield();  // a long wait leaves the core to others
            int done = 0;
            check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
            if (done) return;
            if (dl.passed()) throw Timeout(timeout_message(doing, dl), {.rank = rank_});
        }
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, provided_ = 0;
    std::string version_;
    MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
    bool poisoned_ = false, attached_ = false;
    std::unique_ptr<Watchdog> watchdog_;
    Scratch send_, recv_;
    std::vector<int> counts_, displs_;
    std::uint64_t total_ = 0;
    std::vector<MPI_Request> sends_, recvs_;
    std::vector<const std::byte*> inputs_;
    std::vector<std::span<std::byte>> outs_;
    // The reduce-scatter's pairs: alone on comm_ (a duplicate nobody else
    // uses), matched in order between any two ranks, so one tag serves all.
    static constexpr int kTag = 17;
};

}  // namespace

bool mpi_built() { return true; }

bool mpi_running() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

std::unique_ptr<Engine> make_mpi(std::chrono::milliseconds timeout) { return std::make_unique<Mpi>(timeout); }

#else  // no MPI in this build

bool mpi_built() { return false; }
bool mpi_running() { return false; }
std::unique_ptr<Engine> make_mpi(std::chrono::milliseconds) {
    throw UsageError("backend mpi: this zinf was built without MPI (mpicxx was not found, or NO_MPI=1); "
                     "install libopenmpi-dev and rebuild");
}

#endif

}  // namespace zinf::comm::detail
