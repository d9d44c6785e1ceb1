// The communicator core: picks a backend, checks every operation's buffers,
// and runs operations in order, inline or on its own thread, each under its
// deadline. Backends only execute.
#include "internal.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <exception>
#include <numeric>
#include <thread>

namespace zinf::comm {

// ---------------------------------------------------------------------------
// Names.
std::size_t dtype_bytes(DType t) {
    switch (t) {
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::i32:
    case DType::f32: return 4;
    case DType::i64:
    case DType::f64: return 8;
    }
    return 1;
}

std::string_view name(Backend b) {
    switch (b) {
    case Backend::automatic: return "auto";
    case Backend::self: return "self";
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
    }
    return "?";
}

std::string_view name(DType t) {
    switch (t) {
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    }
    return "?";
}

std::string_view name(Reduce r) {
    switch (r) {
    case Reduce::sum: return "sum";
    case Reduce::avg: return "avg";
    case Reduce::max: return "max";
    }
    return "?";
}

std::string_view name(Kind k) {
    switch (k) {
    case Kind::allgather: return "allgather";
    case Kind::reduce_scatter: return "reduce-scatter";
    case Kind::allreduce: return "allreduce";
    case Kind::broadcast: return "broadcast";
    case Kind::barrier: return "barrier";
    }
    return "?";
}

bool usable(Backend b) { return b == Backend::nccl ? detail::nccl_usable() : compiled(b); }

Backend parse_backend(std::string_view text) {
    for (Backend b : {Backend::automatic, Backend::self, Backend::mpi, Backend::nccl})
        if (text == name(b)) return b;
    throw UsageError("backend '" + std::string(text) + "': expected auto, self, mpi or nccl");
}

DType parse_dtype(std::string_view text) {
    if (text == "float" || text == "fp32") return DType::f32;
    if (text == "double" || text == "fp64") return DType::f64;
    for (DType t : {DType::u8, DType::i32, DType::i64, DType::f32, DType::f64, DType::bf16})
        if (text == name(t)) return t;
    throw UsageError("dtype '" + std::string(text) + "': expected f32 (float), bf16, f64 (double), i32, i64 or u8");
}

bool compiled(Backend b) {
    switch (b) {
    case Backend::mpi: return detail::mpi_built();
    case Backend::nccl: return detail::nccl_built();
    case Backend::automatic:
    case Backend::self: return true;
    }
    return false;
}

// ---------------------------------------------------------------------------
// The launcher's environment.
namespace {
std::optional<int> env_int(const char* key) {
    const char* v = std::getenv(key);
    if (!v || !*v) return std::nullopt;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end || n < 0 || n > (1 << 24)) return std::nullopt;
    return static_cast<int>(n);
}
}  // namespace

Launch Launch::from_env() {
    Launch l;
    // Open MPI's mpirun, then Slurm's srun, then MPICH/Hydra's mpiexec.
    struct Source {
        const char *launcher, *rank, *size, *local_rank, *local_size;
    };
    static constexpr Source sources[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        // SLURM_STEP_NUM_TASKS: set by srun, not in the batch script itself.
        {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"},
        {"mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    };
    for (const auto& s : sources) {
        auto rank = env_int(s.rank), size = env_int(s.size);
        if (!rank || !size || *size < 1 || *rank >= *size) continue;
        l.launcher = s.launcher;
        l.rank = *rank;
        l.size = *size;
        l.local_rank = env_int(s.local_rank).value_or(0);
        l.local_size = std::max(env_int(s.local_size).value_or(1), l.local_rank + 1);
        break;
    }
    return l;
}

std::chrono::milliseconds to_timeout(std::chrono::nanoseconds d) {
    return std::chrono::ceil<std::chrono::milliseconds>(d);
}

std::chrono::milliseconds default_timeout() {
    const char* v = std::getenv("ZINF_COMM_TIMEOUT");
    if (!v || !*v) return std::chrono::seconds(300);
    try {
        return to_timeout(parse_duration(v));
    } catch (const UsageError& e) {
        throw UsageError("ZINF_COMM_TIMEOUT: " + e.message());
    }
}

// ---------------------------------------------------------------------------
// Operations.
namespace detail {

void Op::finish(std::exception_ptr e) {
    {
        std::lock_guard lk(mu);
        error = std::move(e);
        done = true;
    }
    cv.notify_all();
}

std::string Op::what() const {
    std::uint64_t bytes = 0;
    for (const auto& b : bufs) bytes += std::max(b.send.size(), b.recv.size());
    std::string s(name(kind));
    if (kind == Kind::barrier) return s;
    s += bufs.size() == 1 ? " of 1 buffer" : " of " + std::to_string(bufs.size()) + " buffers";
    s += " (" + format_size(bytes) + ", " + std::string(name(dtype)) + ")";
    return s;
}

std::string timeout_message(const std::string& what, const Deadline& d) {
    const auto ms = d.timeout.count();
    const std::string limit = ms % 1000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s";
    return what + " did not complete within " + limit +
           ": a rank died, hangs, or did not call it (ZINF_COMM_TIMEOUT or --comm-timeout sets the limit)";
}

std::uint64_t block_count(const Op& op, const Buffer& b, int rank, int /*size*/) {
    if (!b.counts.empty()) return b.counts[static_cast<std::size_t>(rank)];
    const std::uint64_t es = dtype_bytes(op.dtype);
    return op.kind == Kind::allgather ? b.send.size() / es : b.recv.size() / es;
}

std::uint64_t block_first(const Op& op, const Buffer& b, int rank, int size) {
    if (b.counts.empty()) return block_count(op, b, 0, size) * static_cast<std::uint64_t>(rank);
    return std::accumulate(b.counts.begin(), b.counts.begin() + rank, std::uint64_t{0});
}

std::uint64_t total_count(const Op& op, const Buffer& b, int size) {
    if (b.counts.empty()) return block_count(op, b, 0, size) * static_cast<std::uint64_t>(size);
    return std::accumulate(b.counts.begin(), b.counts.end(), std::uint64_t{0});
}

namespace {

// The caller's buffers must fit the operation: a mismatch is a bug in the
// caller, named precisely.
void check(const Op& op, int rank, int size) {
    const auto bad = [&](std::size_t i, const std::string& why) {
        throw InternalError("comm: " + std::string(name(op.kind)) + ", buffer " + std::to_string(i) + ": " + why);
    };
    if (op.kind == Kind::barrier) {
        if (!op.bufs.empty()) bad(0, "a barrier takes no buffers");
        return;
    }
    if (op.bufs.empty()) throw InternalError("comm: " + std::string(name(op.kind)) + " with no buffers");
    if (op.reduce == Reduce::avg && (op.dtype == DType::u8 || op.dtype == DType::i32 || op.dtype == DType::i64))
        throw InternalError("comm: avg of integers (" + std::string(name(op.dtype)) + ")");
    if (op.root < 0 || op.root >= size)
        throw InternalError("comm: root " + std::to_string(op.root) + " is not a rank of " + std::to_string(size));
    const std::uint64_t es = dtype_bytes(op.dtype);
    for (std::size_t i = 0; i < op.bufs.size(); ++i) {
        const Buffer& b = op.bufs[i];
        if (b.send.size() % es || b.recv.size() % es)
            bad(i, "sizes " + std::to_string(b.send.size()) + "/" + std::to_string(b.recv.size()) +
                       " are not whole " + std::string(name(op.dtype)) + " elements");
        const std::uint64_t ns = b.send.size() / es, nr = b.recv.size() / es;
        const auto want = [&](std::uint64_t got, std::uint64_t need, const char* what) {
            if (got != need)
                bad(i, std::string(what) + " has " + std::to_string(got) + " elements, want " + std::to_string(need));
        };
        if (!b.counts.empty()) {
            if (op.kind != Kind::allgather && op.kind != Kind::reduce_scatter)
                bad(i, "per-rank counts are for allgather and reduce-scatter");
            if (b.counts.size() != static_cast<std::size_t>(size))
                bad(i, std::to_string(b.counts.size()) + " counts for " + std::to_string(size) + " ranks");
        }
        switch (op.kind) {
        case Kind::allgather:
            want(ns, block_count(op, b, rank, size), "send");
            want(nr, total_count(op, b, size), "recv");
            break;
        case Kind::reduce_scatter:
            want(nr, block_count(op, b, rank, size), "recv");
            want(ns, total_count(op, b, size), "send");
            break;
        case Kind::allreduce: want(ns, nr, "send"); break;
        case Kind::broadcast:
            if (!b.send.empty()) bad(i, "a broadcast sends from recv; send must be empty");
            break;
        case Kind::barrier: break;
        }
        // Send and recv may not overlap but in the two in-place forms.
        if (!b.send.empty() && !b.recv.empty()) {
            const std::byte *s0 = b.send.data(), *s1 = s0 + b.send.size(), *r0 = b.recv.data(), *r1 = r0 + b.recv.size();
            const bool in_place =
                (op.kind == Kind::allreduce && s0 == r0) ||
                (op.kind == Kind::allgather && b.send.size() == block_count(op, b, rank, size) * es &&
                 s0 == r0 + block_first(op, b, rank, size) * es);
            if (s0 < r1 && r0 < s1 && !in_place)
                bad(i, "send and recv overlap (in place is send == recv for allreduce, and send == this rank's "
                       "block of recv for allgather)");
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// The core: one backend, operations in order, inline when nothing is queued,
// else on the communicator's own thread.
class Core {
public:
    explicit Core(const Options& opts) : timeout_(opts.timeout ? *opts.timeout : default_timeout()), memory_(opts.memory) {
        engine_ = choose(opts, timeout_.load());
    }
    Core(std::unique_ptr<Engine> engine, Memory memory, std::optional<std::chrono::milliseconds> timeout)
        : engine_(std::move(engine)), timeout_(timeout ? *timeout : default_timeout()), memory_(memory) {
        if (!engine_) throw InternalError("comm: a communicator over no backend");
    }

    ~Core() {
        {
            std::lock_guard lk(mu_);
            stopping_ = true;
            // Unwinding from an error: operations not yet started are failed,
            // not run (their buffers may be going, their peers elsewhere).
            if (std::uncaught_exceptions() > 0 && broken_.empty()) broken_ = "the program is ending on an error";
        }
        cv_.notify_all();
        if (worker_.joinable()) worker_.join();
    }

    Engine& engine() { return *engine_; }
    std::chrono::milliseconds timeout() const { return timeout_.load(); }
    void set_timeout(std::chrono::milliseconds t) { timeout_.store(t); }
    Memory memory() const { return memory_; }

    std::shared_ptr<Op> make(Kind kind, std::span<const Buffer> bufs, DType dtype, Reduce reduce, int root) {
        auto op = std::make_shared<Op>();
        op->kind = kind;
        op->dtype = dtype;
        op->reduce = reduce;
        op->root = root;
        op->bufs.assign(bufs.begin(), bufs.end());
        check(*op, engine_->rank(), engine_->size());
        // Equal counts are equal blocks: the plain collective, not its v-form.
        for (auto& b : op->bufs)
            if (!uneven(b.counts)) b.counts.clear();
        return op;
    }

    void start(const std::shared_ptr<Op>& op) {
        std::lock_guard lk(mu_);
        refuse_if_broken();
        queue_.push_back(op);
        if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
        cv_.notify_all();
    }

    // Blocking: in this thread when the backend is idle, else after what is queued.
    void run(const std::shared_ptr<Op>& op) {
        {
            std::unique_lock lk(mu_);
            refuse_if_broken();
            if (!queue_.empty() || busy_) {
                queue_.push_back(op);
                if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
                cv_.notify_all();
                lk.unlock();
                Handle::wait_op(*op);
                return;
            }
            busy_ = true;
        }
        execute(*op, [&](Op& o, const Deadline& d) { engine_->execute(o, d); });
        release();
        Handle::wait_op(*op);
    }

    // Stream-ordered: after what is queued, in this thread, without waiting
    // for the collective itself (the op is finished once it is enqueued).
    void enqueue(const std::shared_ptr<Op>& op, void* stream, void* after) {
        {
            std::unique_lock lk(mu_);
            refuse_if_broken();
            cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
            refuse_if_broken();
            busy_ = true;
        }
        execute(*op, [&](Op& o, const Deadline& d) { engine_->enqueue(o, stream, after, d); });
        release();
        Handle::wait_op(*op);
    }

    void set_flat_area(std::span<std::byte> area) {
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
            busy_ = true;
        }
        try {
            engine_->set_flat_area(area);
        } catch (...) {
            release();
            throw;
        }
        release();
    }

    void bare(const std::shared_ptr<Op>& op) {
        {
            std::unique_lock lk(mu_);
            refuse_if_broken();
            cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
            refuse_if_broken();  // an operation before it may have failed
            busy_ = true;
        }
        execute(*op, [&](Op& o, const Deadline&) { engine_->bare(o); });
        release();
        Handle::wait_op(*op);
    }

private:
    template <class F>
    void execute(Op& op, F&& f) {
        try {
            f(op, Deadline::after(timeout_.load()));
            op.finish(nullptr);
        } catch (const std::exception& e) {
            {
                std::lock_guard lk(mu_);
                if (broken_.empty()) broken_ = e.what();
            }
            engine_->poison();
            op.finish(std::current_exception());
        }
    }

    void release() {
        {
            std::lock_guard lk(mu_);
            busy_ = false;
        }
        cv_.notify_all();
    }

    void refuse_if_broken() const {
        if (!broken_.empty())
            throw CommError("the communicator is unusable after an earlier failure: " + broken_,
                            {.rank = engine_->rank()});
    }

    void work() {
        std::unique_lock lk(mu_);
        for (;;) {
            cv_.wait(lk, [&] { return (!queue_.empty() && !busy_) || (stopping_ && queue_.empty()); });
            if (queue_.empty()) return;
            auto op = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            const bool broken = !broken_.empty();
            lk.unlock();
            if (broken) {
                try {
                    refuse_if_broken();
                } catch (...) {
                    op->finish(std::current_exception());
                }
            } else {
                execute(*op, [&](Op& o, const Deadline& d) { engine_->execute(o, d); });
            }
            lk.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }

    static std::unique_ptr<Engine> choose(const Options& opts, std::chrono::milliseconds timeout) {
        Backend b = opts.backend;
        const Launch launch = Launch::from_env();
        if (b == Backend::automatic) {
            if (opts.memory == Memory::device)
                b = Backend::nccl;
            else if (launch.size > 1 || mpi_running())
                b = Backend::mpi;
            else
                b = Backend::self;
        }
        if (opts.memory == Memory::device && b != Backend::nccl)
            throw UsageError("backend " + std::string(name(b)) + " takes host buffers; device buffers need nccl");
        if (opts.memory == Memory::host && b == Backend::nccl)
            throw UsageError("backend nccl takes device buffers, not host buffers");
        switch (b) {
        case Backend::self:
            if (launch.size > 1)
                throw UsageError("backend self is one rank, but " + launch.launcher + " started " +
                                 std::to_string(launch.size) + " processes");
            return make_self();
        case Backend::mpi: return make_mpi(timeout);
        case Backend::nccl: return make_nccl(launch, timeout, opts.gpu);
        case Backend::automatic: break;
        }
        throw InternalError("comm: no backend chosen");
    }

    std::unique_ptr<Engine> engine_;
    std::atomic<std::chrono::milliseconds> timeout_;
    const Memory memory_;

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Op>> queue_;
    bool busy_ = false, stopping_ = false;
    std::string broken_;  // the first failure's message
    std::thread worker_;
};

}  // namespace detail

// ---------------------------------------------------------------------------
// Handle.
void Handle::wait_op(detail::Op& op) {
    std::unique_lock lk(op.mu);
    op.cv.wait(lk, [&] { return op.done; });
    if (op.error) std::rethrow_exception(op.error);
}

void Handle::wait() {
    if (!op_) throw InternalError("comm: wait() on an empty handle");
    wait_op(*op_);
}

bool Handle::test() {
    if (!op_) throw InternalError("comm: test() on an empty handle");
    std::lock_guard lk(op_->mu);
    if (op_->done && op_->error) std::rethrow_exception(op_->error);
    return op_->done;
}

// ---------------------------------------------------------------------------
// Communicator.
Communicator::Communicator(const Options& opts) : core_(std::make_unique<detail::Core>(opts)) {}
Communicator::Communicator(std::unique_ptr<detail::Engine> engine, Memory memory,
                           std::optional<std::chrono::milliseconds> timeout)
    : core_(std::make_unique<detail::Core>(std::move(engine), memory, timeout)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return core_->engine().rank(); }
int Communicator::size() const { return core_->engine().size(); }
int Communicator::local_rank() const { return core_->engine().local_rank(); }
int Communicator::local_size() const { return core_->engine().local_size(); }
Backend Communicator::backend() const { return core_->engine().kind(); }
Memory Communicator::memory() const { return core_->memory(); }
std::chrono::milliseconds Communicator::timeout() const { return core_->timeout(); }
void Communicator::set_timeout(std::chrono::milliseconds t) { core_->set_timeout(t); }
std::string Communicator::describe() const { return core_->engine().describe(); }
bool Communicator::stream_ordered() const { return core_->engine().stream_ordered(); }

Handle Communicator::start(Kind kind, std::span<const Buffer> bufs, DType dtype, Reduce reduce, int root) {
    auto op = core_->make(kind, bufs, dtype, reduce, root);
    core_->start(op);
    return Handle(op);
}

void Communicator::run(Kind kind, std::span<const Buffer> bufs, DType dtype, Reduce reduce, int root) {
    core_->run(core_->make(kind, bufs, dtype, reduce, root));
}

void Communicator::enqueue(Kind kind, std::span<const Buffer> bufs, DType dtype, void* stream, void* after,
                           Reduce reduce, int root) {
    // Refused before anything is queued: a mistake of the caller's, which
    // leaves the communicator usable.
    if (!stream_ordered())
        throw UsageError("comm: a stream-ordered collective needs the nccl backend (device buffers on a CUDA "
                         "stream); backend " +
                         std::string(name(backend())) + " runs host calls: use run() or start()");
    if (!stream) throw InternalError("comm: enqueue() without a stream");
    core_->enqueue(core_->make(kind, bufs, dtype, reduce, root), stream, after);
}

std::unique_ptr<Communicator> device_communicator(const Communicator& host, int gpu) {
    const std::string what = "data parallelism over device memory (" + std::to_string(host.size()) +
                             " ranks) needs NCCL on the device's streams";
    if (!compiled(Backend::nccl))
        throw UsageError(what + ", and this zinf was built without it (no nccl.h in the CUDA toolkit, or NO_CUDA=1); "
                                "run one rank, or --device cpu",
                         {.rank = host.rank()});
    if (!usable(Backend::nccl))
        throw UsageError(what + ", which cannot run here (no GPU visible, or libnccl.so.2 does not load: put the "
                                "CUDA toolkit's lib64 on LD_LIBRARY_PATH)",
                         {.rank = host.rank()});
    auto c = std::make_unique<Communicator>(
        Options{.backend = Backend::nccl, .memory = Memory::device, .timeout = host.timeout(), .gpu = gpu});
    if (c->size() != host.size() || c->rank() != host.rank())
        throw InternalError("comm: the nccl communicator has rank " + std::to_string(c->rank()) + " of " +
                            std::to_string(c->size()) + ", the host's " + std::to_string(host.rank()) + " of " +
                            std::to_string(host.size()));
    return c;
}

void detail::Engine::enqueue(Op&, void*, void*, const Deadline&) {
    throw InternalError("comm: backend " + std::string(name(kind())) + " has no stream-ordered collectives");
}

void detail::Engine::set_flat_area(std::span<std::byte> area) {
    if (!area.empty())
        throw InternalError("comm: backend " + std::string(name(kind())) + " lays no bucket flat; it was given " +
                            std::to_string(area.size()) + " bytes for it");
}

std::uint64_t laid_flat_bytes(Kind kind, std::span<const std::vector<std::uint64_t>> counts, DType dtype, int size) {
    detail::Op op;
    op.kind = kind;
    op.dtype = dtype;
    for (const auto& c : counts) {
        if (c.size() != static_cast<std::size_t>(size))
            throw InternalError("comm: flat_bytes given " + std::to_string(c.size()) + " counts for " +
                                std::to_string(size) + " ranks");
        op.bufs.push_back({{}, {}, c});
    }
    return detail::needs_flat(op) ? detail::plan_flat(op, size).bytes(size) : 0;
}

std::uint64_t Communicator::flat_bytes(Kind kind, std::span<const std::vector<std::uint64_t>> counts,
                                       DType dtype) const {
    return core_->engine().lays_flat() ? laid_flat_bytes(kind, counts, dtype, size()) : 0;
}

void Communicator::set_flat_area(std::span<std::byte> area) { core_->set_flat_area(area); }

void Communicator::bare(Kind kind, const Buffer& buf, DType dtype, Reduce reduce, int root) {
    if (!buf.counts.empty()) throw InternalError("comm: bare() takes equal blocks only");
    core_->bare(core_->make(kind, std::span(&buf, kind == Kind::barrier ? 0 : 1), dtype, reduce, root));
}

void Communicator::allgather(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype) {
    const Buffer b{send, recv, {}};
    run(Kind::allgather, std::span(&b, 1), dtype);
}
Handle Communicator::iallgather(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype) {
    const Buffer b{send, recv, {}};
    return start(Kind::allgather, std::span(&b, 1), dtype);
}
void Communicator::reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                                  Reduce reduce) {
    const Buffer b{send, recv, {}};
    run(Kind::reduce_scatter, std::span(&b, 1), dtype, reduce);
}
Handle Communicator::ireduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                                     Reduce reduce) {
    const Buffer b{send, recv, {}};
    return start(Kind::reduce_scatter, std::span(&b, 1), dtype, reduce);
}
void Communicator::allreduce(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                             Reduce reduce) {
    const Buffer b{send, recv, {}};
    run(Kind::allreduce, std::span(&b, 1), dtype, reduce);
}
Handle Communicator::iallreduce(std::span<const std::byte> send, std::span<std::byte> recv, DType dtype,
                                Reduce reduce) {
    const Buffer b{send, recv, {}};
    return start(Kind::allreduce, std::span(&b, 1), dtype, reduce);
}
void Communicator::broadcast(std::span<std::byte> buf, DType dtype, int root) {
    const Buffer b{{}, buf, {}};
    run(Kind::broadcast, std::span(&b, 1), dtype, Reduce::sum, root);
}
Handle Communicator::ibroadcast(std::span<std::byte> buf, DType dtype, int root) {
    const Buffer b{{}, buf, {}};
    return start(Kind::broadcast, std::span(&b, 1), dtype, Reduce::sum, root);
}
void Communicator::barrier() { run(Kind::barrier, {}, DType::u8); }
Handle Communicator::ibarrier() { return start(Kind::barrier, {}, DType::u8); }

void agree(Communicator& c, const std::exception_ptr& failed, const std::string& outcome) {
    std::int32_t mine[2] = {0, -1}, all[2] = {0, -1};
    if (failed) {
        try {
            std::rethrow_exception(failed);
        } catch (const Error& e) {
            mine[0] = e.exit_code();
        } catch (...) {
            mine[0] = exit_code::internal;
        }
        mine[1] = c.rank();
    }
    c.allreduce(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), DType::i32, Reduce::max);
    if (all[0] == 0) return;
    if (failed) std::rethrow_exception(failed);
    throw Elsewhere("rank " + std::to_string(all[1]) + " failed (see its message); " + outcome, all[0]);
}

}  // namespace zinf::comm
