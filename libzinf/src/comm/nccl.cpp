// The NCCL backend: device buffers, collectives on the communicator's own
// CUDA stream, NCCL's unique id broadcast over MPI, the GPU picked by the
// local rank. NCCL is opened at run time (dlopen of libnccl.so.2), so every
// program starts on machines without it and only `--backend nccl` needs it.
// The communicator is non-blocking (ncclConfig_t.blocking = 0): every call is
// polled against the deadline, and a timeout aborts it (ncclCommAbort).
// A bucket (the engine's module of parameters or gradients) is one NCCL
// call: laid flat with equal blocks (flat.cpp), since NCCL has no allgatherv
// or reduce-scatter-v, in device memory the caller gives (set_flat_area: the
// engine's arena, within --device-memory); the communicator allocates none
// for buckets.
#include "internal.hpp"

#include <zinf/mem.hpp>

#if ZINF_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

#include <array>
#include <optional>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>

namespace zinf::comm::detail {

#if ZINF_HAVE_NCCL
namespace {

// The NCCL entry points zinf calls, looked up once.
struct Library {
    decltype(&ncclGetVersion) GetVersion = nullptr;
    decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
    decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
    decltype(&ncclCommFinalize) CommFinalize = nullptr;
    decltype(&ncclCommDestroy) CommDestroy = nullptr;
    decltype(&ncclCommAbort) CommAbort = nullptr;
    decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
    decltype(&ncclGetErrorString) GetErrorString = nullptr;
    decltype(&ncclGroupStart) GroupStart = nullptr;
    decltype(&ncclGroupEnd) GroupEnd = nullptr;
    decltype(&ncclAllGather) AllGather = nullptr;
    decltype(&ncclReduceScatter) ReduceScatter = nullptr;
    decltype(&ncclAllReduce) AllReduce = nullptr;
    decltype(&ncclBroadcast) Broadcast = nullptr;

    static const Library& get() {
        static const Library lib = open();
        return lib;
    }

private:
    template <class F>
    static void sym(void* h, const char* name, F& f) {
        f = reinterpret_cast<F>(dlsym(h, name));
        if (!f) throw UsageError(std::string("libnccl.so.2 has no ") + name + ": NCCL is too old (zinf needs 2.14 or newer)");
    }
    static Library open() {
        void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) throw UsageError(std::string("backend nccl: cannot load NCCL: ") + dlerror() +
                                " (put the CUDA toolkit's lib64 on LD_LIBRARY_PATH)");
        Library l;
        sym(h, "ncclGetVersion", l.GetVersion);
        sym(h, "ncclGetUniqueId", l.GetUniqueId);
        sym(h, "ncclCommInitRankConfig", l.CommInitRankConfig);
        sym(h, "ncclCommFinalize", l.CommFinalize);
        sym(h, "ncclCommDestroy", l.CommDestroy);
        sym(h, "ncclCommAbort", l.CommAbort);
        sym(h, "ncclCommGetAsyncError", l.CommGetAsyncError);
        sym(h, "ncclGetErrorString", l.GetErrorString);
        sym(h, "ncclGroupStart", l.GroupStart);
        sym(h, "ncclGroupEnd", l.GroupEnd);
        sym(h, "ncclAllGather", l.AllGather);
        sym(h, "ncclReduceScatter", l.ReduceScatter);
        sym(h, "ncclAllReduce", l.AllReduce);
        sym(h, "ncclBroadcast", l.Broadcast);
        return l;
    }
};

ncclDataType_t nccl_type(DType t) {
    switch (t) {
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    }
    return ncclUint8;
}

ncclRedOp_t nccl_op(Reduce r) {
    switch (r) {
    case Reduce::sum: return ncclSum;
    case Reduce::avg: return ncclAvg;
    case Reduce::max: return ncclMax;
    }
    return ncclSum;
}

class Nccl final : public Engine {
public:
    Nccl(const Launch& launch, std::chrono::milliseconds timeout, int gpu) {
        // Asking for NCCL on a machine without a GPU is the caller's mistake (64).
        const mem::GpuInfo gpus = mem::gpu_info();
        if (gpus.count == 0)
            throw UsageError("backend nccl needs a CUDA GPU: " + gpus.why_not, {.rank = launch.rank});
        const int devices = gpus.count;
        if (gpu >= devices)
            throw UsageError("backend nccl: GPU " + std::to_string(gpu) + " asked for, but " +
                                 std::to_string(devices) + " are visible",
                             {.rank = launch.rank});
        lib_ = &Library::get();
        // The GPU first, so that nothing (a CUDA-aware MPI included) makes a
        // context on another one; without a launcher, MPI says the local rank.
        if (gpu >= 0) cuda(cudaSetDevice(gpu), "cudaSetDevice");
        else if (!launch.launcher.empty()) cuda(cudaSetDevice(launch.local_rank % devices), "cudaSetDevice");
        boot_ = make_mpi(timeout);
        const int local = launch.launcher.empty() ? boot_->local_rank() : launch.local_rank;
        device_ = gpu >= 0 ? gpu : local % devices;
        cuda(cudaSetDevice(device_), "cudaSetDevice");
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) gpu_ = prop.name;
        // A blocking stream: it waits for work on the legacy default stream,
        // where callers' plain cudaMemcpy of the buffers runs.
        cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault), "cudaStreamCreateWithFlags");
        cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        cuda(cudaEventCreateWithFlags(&enqueued_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        cuda(cudaMalloc(&token_, sizeof(float)), "cudaMalloc");

        refuse_shared_gpu(timeout);

        // Rank 0 makes the id; MPI carries it to the others.
        ncclUniqueId id{};
        if (boot_->rank() == 0) call(lib_->GetUniqueId(&id), "ncclGetUniqueId");
        Op share;
        share.kind = Kind::broadcast;
        share.dtype = DType::u8;
        share.bufs.push_back({{}, std::as_writable_bytes(std::span(&id, 1)), {}});
        boot_->execute(share, Deadline::after(timeout));

        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        call(lib_->CommInitRankConfig(&comm_, boot_->size(), id, boot_->rank(), &cfg), "ncclCommInitRankConfig");
        settle(Deadline::after(timeout), "creating the NCCL communicator");
        int v = 0;
        lib_->GetVersion(&v);
        version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    }

    ~Nccl() override {
        if (comm_) {
            if (poisoned_) {
                lib_->CommAbort(comm_);
            } else {
                try {
                    call(lib_->CommFinalize(comm_), "ncclCommFinalize");
                    settle(Deadline::after(std::chrono::seconds(10)), "finalizing the NCCL communicator");
                    lib_->CommDestroy(comm_);
                } catch (const std::exception&) {
                    lib_->CommAbort(comm_);
                }
            }
        }
        if (token_) cudaFree(token_);
        if (done_) cudaEventDestroy(done_);
        if (enqueued_) cudaEventDestroy(enqueued_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    int rank() const override { return boot_->rank(); }
    int size() const override { return boot_->size(); }
    int local_rank() const override { return boot_->local_rank(); }
    int local_size() const override { return boot_->local_size(); }
    Backend kind() const override { return Backend::nccl; }
    bool stream_ordered() const override { return true; }
    bool lays_flat() const override { return true; }

    // The caller's device memory for buckets laid flat. Nothing still on a
    // stream may use the old area: the last stream-ordered collective and
    // this communicator's own stream are waited for (a host wait, once per
    // area). The new one is zeroed, so padding is never uninitialised memory.
    void set_flat_area(std::span<std::byte> area) override {
        cuda(cudaSetDevice(device_), "cudaSetDevice");
        if (enqueued_any_) cuda(cudaEventSynchronize(enqueued_), "cudaEventSynchronize");
        cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        flat_ = area;
        if (!area.empty()) {
            cuda(cudaMemsetAsync(area.data(), 0, area.size(), stream_), "cudaMemsetAsync");
            cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        }
    }
    std::string describe() const override {
        return "nccl " + version_ + ", rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " (local " +
               std::to_string(local_rank()) + " of " + std::to_string(local_size()) + "), GPU " +
               std::to_string(device_) + (gpu_.empty() ? "" : " (" + gpu_ + ")");
    }
    void poison() noexcept override {
        poisoned_ = true;
        boot_->poison();
    }

    void execute(Op& op, const Deadline& dl) override {
        cuda(cudaSetDevice(device_), "cudaSetDevice");  // this may be the communicator's own thread
        after_enqueued(stream_);
        launch(op, stream_, dl);
        cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
        for (;;) {
            const cudaError_t e = cudaEventQuery(done_);
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) cuda(e, "cudaEventQuery");
            async_error(op.what());
            if (dl.passed()) {
                lib_->CommAbort(comm_);
                comm_ = nullptr;
                throw Timeout(timeout_message(op.what(), dl), {.rank = rank()});
            }
            std::this_thread::yield();
        }
    }

    // On the caller's stream after its event: no host wait for the
    // collective, only for NCCL to take the group (non-blocking NCCL).
    void enqueue(Op& op, void* stream, void* after, const Deadline& dl) override {
        cuda(cudaSetDevice(device_), "cudaSetDevice");
        async_error(op.what());  // an earlier enqueued collective that failed
        const auto s = static_cast<cudaStream_t>(stream);
        if (after) cuda(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(after), 0), "cudaStreamWaitEvent");
        after_enqueued(s);
        launch(op, s, dl);
        cuda(cudaEventRecord(enqueued_, s), "cudaEventRecord");
        enqueued_any_ = true;
    }

    void bare(Op& op) override {
        cuda(cudaSetDevice(device_), "cudaSetDevice");
        after_enqueued(stream_);
        if (op.kind == Kind::barrier)
            call(lib_->AllReduce(token_, token_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
        else
            issue(op, op.bufs.at(0), stream_);
        settle(Deadline::after(std::chrono::milliseconds(0)), op.what());
        cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

private:
    // NCCL refuses two ranks on one GPU ("duplicate GPU"), after a wait and
    // as an internal error: every rank learns each rank's host and GPU (its
    // PCI address) and all refuse at once, with the exit code of a usage
    // mistake and the ranks named.
    void refuse_shared_gpu(std::chrono::milliseconds timeout) {
        constexpr std::size_t kKey = 128;
        std::array<char, kKey> mine{};
        char host[64] = {}, bus[32] = {};
        ::gethostname(host, sizeof host - 1);
        cuda(cudaDeviceGetPCIBusId(bus, sizeof bus, device_), "cudaDeviceGetPCIBusId");
        std::snprintf(mine.data(), kKey, "%s GPU %d (%s)", host, device_, bus);
        std::vector<char> all(kKey * static_cast<std::size_t>(boot_->size()));
        Op share;
        share.kind = Kind::allgather;
        share.dtype = DType::u8;
        share.bufs.push_back({std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), {}});
        boot_->execute(share, Deadline::after(timeout));
        for (int a = 0; a < boot_->size(); ++a)
            for (int b = a + 1; b < boot_->size(); ++b) {
                const char* ka = all.data() + a * kKey;
                if (std::strncmp(ka, all.data() + b * kKey, kKey) == 0)
                    throw UsageError("backend nccl: ranks " + std::to_string(a) + " and " + std::to_string(b) +
                                         " would share " + std::string(ka, strnlen(ka, kKey)) +
                                         "; NCCL needs a GPU of its own for each rank (as many GPUs as ranks on "
                                         "each node)",
                                     {.rank = rank()});
            }
    }

    // One operation on `stream`, as one NCCL group. A bucket of several
    // buffers, or one of uneven blocks, goes flat (internal.hpp's FlatPlan):
    // packed into the flat area on the stream, one collective of equal
    // blocks, unpacked on the stream; never one NCCL call per buffer or per
    // rank. The flat area is the caller's (set_flat_area), reused by the next
    // operation only after this one's unpacking (after_enqueued orders it).
    void launch(const Op& op, cudaStream_t stream, const Deadline& dl) {
        std::optional<FlatPlan> plan;
        std::byte *all = nullptr, *mine = nullptr;
        if (needs_flat(op)) {
            plan = plan_flat(op, size());
            const std::uint64_t B = plan->area(), n = static_cast<std::uint64_t>(size());
            const std::uint64_t need = plan->bytes(size());
            if (need > flat_.size())
                throw InternalError("nccl: " + op.what() + " needs a flat area of " + std::to_string(need) +
                                    " bytes (" + format_size(need) + "); the one given has " +
                                    std::to_string(flat_.size()) + " bytes (" + format_size(flat_.size()) + ")");
            all = flat_.data();  // every rank's block, then this rank's own
            mine = all + B * n;
            flat_pack(op, *plan, all, mine, on(stream));
        }
        call(lib_->GroupStart(), "ncclGroupStart");
        try {
            if (op.kind == Kind::barrier) {
                call(lib_->AllReduce(token_, token_, 1, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
            } else if (plan && op.kind == Kind::allgather) {
                call(lib_->AllGather(mine, all, plan->block, nccl_type(op.dtype), comm_, stream), "ncclAllGather");
            } else if (plan) {
                call(lib_->ReduceScatter(all, mine, plan->block, nccl_type(op.dtype), nccl_op(op.reduce), comm_,
                                         stream),
                     "ncclReduceScatter");
            } else {
                for (const Buffer& b : op.bufs) issue(op, b, stream);
            }
        } catch (...) {
            lib_->GroupEnd();  // never leave a group open
            throw;
        }
        call(lib_->GroupEnd(), "ncclGroupEnd");
        settle(dl, op.what());  // the collective is on the stream: the unpacking goes after it
        if (plan) flat_unpack(op, *plan, all, mine, on(stream));
    }

    // The flat area's copies (flat.cpp), on the stream.
    Copy2d on(cudaStream_t stream) {
        return [this, stream](std::byte* dst, std::uint64_t dpitch, const std::byte* src, std::uint64_t spitch,
                              std::uint64_t width, std::uint64_t rows) {
            cuda(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpy2DAsync");
        };
    }

    // One buffer of equal blocks (uneven ones and buckets go flat: launch).
    void issue(const Op& op, const Buffer& b, cudaStream_t stream) {
        const ncclDataType_t t = nccl_type(op.dtype);
        const std::size_t es = dtype_bytes(op.dtype);
        std::byte* recv = b.recv.data();
        const std::byte* send = b.send.data();
        switch (op.kind) {
        case Kind::allgather:
        case Kind::reduce_scatter:
            if (!b.counts.empty()) throw InternalError("nccl: an uneven " + op.what() + " not laid flat");
            if (op.kind == Kind::allgather)
                call(lib_->AllGather(send, recv, b.send.size() / es, t, comm_, stream), "ncclAllGather");
            else
                call(lib_->ReduceScatter(send, recv, b.recv.size() / es, t, nccl_op(op.reduce), comm_, stream),
                     "ncclReduceScatter");
            return;
        case Kind::allreduce:
            call(lib_->AllReduce(send, recv, b.recv.size() / es, t, nccl_op(op.reduce), comm_, stream), "ncclAllReduce");
            return;
        case Kind::broadcast:
            call(lib_->Broadcast(recv, recv, b.recv.size() / es, t, op.root, comm_, stream), "ncclBroadcast");
            return;
        case Kind::barrier: return;
        }
    }

    // One communicator's collectives run one after another in the order of
    // the calls, on every rank, whatever stream each was enqueued on: the
    // next one waits (on the device) for the last stream-ordered one.
    void after_enqueued(cudaStream_t s) {
        if (enqueued_any_) cuda(cudaStreamWaitEvent(s, enqueued_, 0), "cudaStreamWaitEvent");
    }

    void call(ncclResult_t rc, const char* what) const {
        if (rc != ncclSuccess && rc != ncclInProgress)
            throw CommError(std::string(what) + " failed: " + lib_->GetErrorString(rc), {.rank = rank()});
    }
    void cuda(cudaError_t e, const char* what) const {
        if (e != cudaSuccess)
            throw CommError(std::string(what) + " failed: " + cudaGetErrorString(e), {.rank = boot_ ? boot_->rank() : -1});
    }
    void async_error(const std::string& what) const {
        ncclResult_t st = ncclSuccess;
        lib_->CommGetAsyncError(comm_, &st);
        if (st != ncclSuccess && st != ncclInProgress)
            throw CommError(what + ": " + lib_->GetErrorString(st), {.rank = rank()});
    }
    // Non-blocking NCCL: a call may still be in progress when it returns.
    void settle(const Deadline& dl, const std::string& what) {
        for (;;) {
            ncclResult_t st = ncclSuccess;
            lib_->CommGetAsyncError(comm_, &st);
            if (st == ncclSuccess) return;
            if (st != ncclInProgress) throw CommError(what + ": " + lib_->GetErrorString(st), {.rank = rank()});
            if (dl.passed()) {
                lib_->CommAbort(comm_);
                comm_ = nullptr;
                throw Timeout(timeout_message(what, dl), {.rank = rank()});
            }
            std::this_thread::yield();
        }
    }

    const Library* lib_ = nullptr;
    std::unique_ptr<Engine> boot_;
    int device_ = 0;
    std::string gpu_, version_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t done_ = nullptr;
    cudaEvent_t enqueued_ = nullptr;  // recorded after the last stream-ordered collective
    bool enqueued_any_ = false;
    float* token_ = nullptr;
    std::span<std::byte> flat_;  // the caller's flat area for buckets (launch)
    ncclComm_t comm_ = nullptr;
    bool poisoned_ = false;
};

}  // namespace

bool nccl_built() { return true; }
bool nccl_usable() {
    if (mem::gpu_info().count == 0) return false;
    try {
        Library::get();
        return true;
    } catch (const Error&) {
        return false;
    }
}
std::unique_ptr<Engine> make_nccl(const Launch& launch, std::chrono::milliseconds timeout, int gpu) {
    return std::make_unique<Nccl>(launch, timeout, gpu);
}

#else  // no NCCL in this build

bool nccl_built() { return false; }
bool nccl_usable() { return false; }
std::unique_ptr<Engine> make_nccl(const Launch&, std::chrono::milliseconds, int) {
    throw UsageError("backend nccl: this zinf was built without NCCL (no CUDA toolkit with nccl.h was found, "
                     "or NO_CUDA=1)");
}

#endif

}  // namespace zinf::comm::detail
