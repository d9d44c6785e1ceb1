// The cpu backend: device memory is host memory from a budgeted arena, a
// stream is a worker thread running a queue of jobs in order, an event is a
// count of the jobs a stream had been given. Each kernel, its spans checked
// on the caller's thread (checks.cpp), enqueues its body (kernels.hpp).
#include "backends.hpp"
#include "kernels.hpp"

#include <zinf/device.hpp>

#include <omp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zinf::device {

namespace {

using cpu::u64;

// ---------------------------------------------------------------------------
// A worker thread and its queue. Tickets count jobs from 1: job j is done
// when completed_ >= j. After a job throws, the jobs behind it are dropped
// (counted as completed, not run) until a synchronize reports the error;
// jobs marked `always` (waits on other streams) still run, so that what
// comes after a synchronize is ordered as it was asked.
class CpuStream final : public Stream {
public:
    CpuStream(std::string name, unsigned threads) : name_(std::move(name)), worker_([this, threads] { run(threads); }) {}

    // Runs what is queued, then stops.
    ~CpuStream() override {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        work_.notify_all();
        worker_.join();
        if (error_) {
            try {
                std::rethrow_exception(error_);
            } catch (const std::exception& e) {
                log::warn("device: stream " + name_ + " closed with an error nobody synchronized: " + e.what());
            } catch (...) {
                log::warn("device: stream " + name_ + " closed with an error nobody synchronized");
            }
        }
    }

    const std::string& name() const override { return name_; }

    // The job's ticket.
    u64 enqueue(std::function<void()> job, bool always = false) {
        u64 ticket;
        {
            std::lock_guard lk(mu_);
            queue_.push_back({std::move(job), always});
            ticket = ++enqueued_;
        }
        work_.notify_one();
        return ticket;
    }

    u64 ticket() const {
        std::lock_guard lk(mu_);
        return enqueued_;
    }

    bool completed(u64 ticket) const {
        std::lock_guard lk(mu_);
        return completed_ >= ticket;
    }

    void wait_for(u64 ticket) const {
        std::unique_lock lk(mu_);
        await(lk, ticket);
    }

    // Waits for every job enqueued so far; rethrows a job's error (once).
    void synchronize() { synchronize(ticket()); }

    // Waits for the jobs up to `ticket`; rethrows an error one of them threw.
    void synchronize(u64 ticket) {
        std::unique_lock lk(mu_);
        await(lk, ticket);
        if (error_ && error_ticket_ <= ticket) std::rethrow_exception(std::exchange(error_, nullptr));
    }

    // Waits for everything, reporting nothing (the device's destructor).
    void drain() const { wait_for(ticket()); }

private:
    struct Job {
        std::function<void()> fn;
        bool always = false;
    };

    // Under `lk`, until the jobs up to `ticket` are done. The worker wakes
    // the waiters only when the lowest ticket one of them awaits is done, not
    // after every job: a stream waiting on another's event (wait_on) or the
    // host waiting on a step's last kernel were woken for each job before it,
    // a futex storm of 1.4 million calls in test_engine's 20 s.
    void await(std::unique_lock<std::mutex>& lk, u64 ticket) const {
        while (completed_ < ticket) {
            awaited_ = std::min(awaited_, ticket);
            done_.wait(lk);
        }
    }

    void run(unsigned threads) {
        omp_set_num_threads(static_cast<int>(threads));
        std::unique_lock lk(mu_);
        for (;;) {
            work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, and nothing left
            Job job = std::move(queue_.front());
            queue_.pop_front();
            const bool run_it = job.always || !error_;
            lk.unlock();
            std::exception_ptr err;
            if (run_it) {
                try {
                    job.fn();
                } catch (...) {
                    err = std::current_exception();
                }
            }
            job.fn = nullptr;  // what it captured goes before the job counts as done
            lk.lock();
            ++completed_;
            if (err && !error_) {
                error_ = err;
                error_ticket_ = completed_;
            }
            if (completed_ >= awaited_) {  // (a waiter still short of its ticket sets it again)
                awaited_ = kNobody;
                done_.notify_all();
            }
        }
    }

    const std::string name_;
    mutable std::mutex mu_;
    std::condition_variable work_;
    mutable std::condition_variable done_;
    std::deque<Job> queue_;
    u64 enqueued_ = 0, completed_ = 0;
    static constexpr u64 kNobody = ~u64{0};
    mutable u64 awaited_ = kNobody;  // the lowest ticket a waiter awaits
    std::exception_ptr error_;  // the first error not yet reported
    u64 error_ticket_ = 0;      // the job that threw it
    bool stop_ = false;
    std::thread worker_;  // last: starts once the rest is built
};

CpuStream& as_cpu(const Stream& s) {
    auto* c = dynamic_cast<const CpuStream*>(&s);
    if (!c) throw InternalError("device: a stream of another backend given to the cpu backend");
    return const_cast<CpuStream&>(*c);
}

// ---------------------------------------------------------------------------
class CpuDevice final : public Device {
public:
    explicit CpuDevice(const Options& opts) : threads_(opts.threads ? opts.threads : affinity_cpus()) {
        arena_ = std::make_unique<mem::DeviceArena>(mem::ArenaConfig{
            .bytes = opts.memory_bytes ? opts.memory_bytes : 1 * GiB, .max_block = opts.max_block, .backend = "host"});
        // Kernels run on compute with the device's whole team; the other
        // streams move bytes or run host jobs (a collective, a hand-over to
        // the optimizer) and get one thread each, so that they overlap the
        // kernels instead of competing with them for every core.
        for (std::size_t k = 0; k < streams_.size(); ++k) {
            const auto kind = static_cast<StreamKind>(k);
            streams_[k] = std::make_unique<CpuStream>(stream_kind_name(kind), kind == StreamKind::compute ? threads_ : 1);
        }
    }

    // A stream's jobs may wait on another's: all drain before any stops.
    ~CpuDevice() override {
        for (auto& s : streams_) s->drain();
        for (auto& s : streams_) s.reset();
    }

    const std::string& backend() const override {
        static const std::string name = "cpu";
        return name;
    }
    unsigned threads() const override { return threads_; }

    Stream& stream(StreamKind k) override {
        const auto i = static_cast<std::size_t>(k);
        if (i >= streams_.size()) throw InternalError("device: no stream of kind " + std::to_string(i));
        return *streams_[i];
    }
    bool host_addressable() const override { return true; }
    // The Stream itself: the cpu backend has no other stream object.
    void* native(Stream& s) override { return &s; }
    bool query(const Event& e) override { return !e.stream || as_cpu(*e.stream).completed(e.ticket); }

    Event record(Stream& s) override { return {.ticket = as_cpu(s).ticket(), .stream = &s}; }

    void wait(Stream& s, const Event& e) override { wait_on(s, e, nullptr); }
    void wait(Stream& s, const Event& e, std::atomic<std::uint64_t>& waited_ns) override { wait_on(s, e, &waited_ns); }


    void synchronize(Stream& s) override { as_cpu(s).synchronize(); }
    void synchronize(const Event& e) override {
        if (e.stream) as_cpu(*e.stream).synchronize(e.ticket);
    }

    void do_copy(Stream& s, std::span<std::byte> dst, std::span<const std::byte> src) override {
        if (src.empty()) return;
        as_cpu(s).enqueue([d = dst.data(), p = src.data(), n = src.size()] { std::memcpy(d, p, n); });
    }

    void do_copy_rows(Stream& s, std::span<float> dst, u64 ld_dst, std::span<const float> src, u64 ld_src, u64 rows,
                      u64 cols) override {
        as_cpu(s).enqueue([=, d = dst.data(), p = src.data()] { cpu::copy_rows(d, ld_dst, p, ld_src, rows, cols); });
    }

    void fill_zero(std::span<std::byte> dst) override {
        if (!dst.empty()) std::memset(dst.data(), 0, dst.size());
    }

    void zero(Stream& s, std::span<float> dst) override {
        if (dst.empty()) return;
        as_cpu(s).enqueue([d = dst.data(), n = dst.size()] { std::memset(d, 0, n * sizeof(float)); });
    }

    // ---- kernels: each enqueues its body (kernels.hpp's cpu::<name>) ---------
#define ZINF_KERNEL(name, ...)                                                                  \
    void do_##name(Stream& s, ZINF_KERNEL_PARAMS(__VA_ARGS__)) override {                       \
        as_cpu(s).enqueue([=] { cpu::name(ZINF_KERNEL_ARGS(__VA_ARGS__)); });                  \
    }
#include <zinf/kernels.def>

    void host(Stream& s, std::function<void()> fn) override { as_cpu(s).enqueue(std::move(fn)); }

    // The steady clock read by the stream's worker as it gets there, between
    // the jobs before and after: where the kernels run. -1 until then (and
    // for good when the job is dropped behind an error).
    Stamp stamp(Stream& s) override {
        auto ns = std::make_shared<std::atomic<std::int64_t>>(-1);
        as_cpu(s).enqueue([ns] {
            ns->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count(),
                      std::memory_order_relaxed);
        });
        return {std::move(ns)};
    }
    double seconds_between(const Stamp& a, const Stamp& b) override {
        auto read = [](const Stamp& st) {
            return st.handle ? static_cast<const std::atomic<std::int64_t>*>(st.handle.get())->load() : -1;
        };
        const std::int64_t t0 = read(a), t1 = read(b);
        if (t0 < 0 || t1 < 0) return std::numeric_limits<double>::quiet_NaN();
        return static_cast<double>(t1 - t0) * 1e-9;
    }

private:
    const unsigned threads_;
    std::array<std::unique_ptr<CpuStream>, 4> streams_;  // by StreamKind

    // `s` stops (a job run even after an error) until `e`'s stream has passed
    // it, adding the time it stood to `waited_ns` when given.
    void wait_on(Stream& s, const Event& e, std::atomic<std::uint64_t>* waited_ns) {
        if (!e.stream || e.stream == &s) return;  // a stream is in order already
        CpuStream& other = as_cpu(*e.stream);
        as_cpu(s).enqueue(
            [&other, waited_ns, t = e.ticket] {
                if (!waited_ns) return other.wait_for(t);
                if (other.completed(t)) return;
                const auto t0 = std::chrono::steady_clock::now();
                other.wait_for(t);
                *waited_ns += static_cast<std::uint64_t>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
            },
            true);
    }
};

}  // namespace

// ---------------------------------------------------------------------------
const char* stream_kind_name(StreamKind k) {
    switch (k) {
        case StreamKind::compute: return "compute";
        case StreamKind::h2d: return "h2d";
        case StreamKind::d2h: return "d2h";
        case StreamKind::collectives: return "collectives";
    }
    return "?";
}

std::unique_ptr<Device> open(const Options& opts) {
    if (opts.backend == "cuda" || (opts.backend == "auto" && cuda_unavailable().empty())) return open_cuda(opts);
    if (opts.backend != "cpu" && opts.backend != "auto")
        throw UsageError("unknown device backend '" + opts.backend + "' (the backends: auto, cpu, cuda)");
    // OpenBLAS runs one thread inside each call (gemm.cpp sets it so as the
    // program starts): the device splits a GEMM over its own OpenMP team.
    return std::make_unique<CpuDevice>(opts);
}

double measure_gemm_flops(Device& dev, std::uint64_t n, unsigned reps) {
    if (n == 0 || reps == 0) throw UsageError("measure_gemm_flops: n and reps must be positive");
    if (dev.backend() == "cuda") return cuda_gemm_flops(dev, n, reps, false);
    Stream& s = dev.compute();
    auto a = dev.alloc<float>(n * n, "gemm benchmark A");
    auto b = dev.alloc<float>(n * n, "gemm benchmark B");
    auto c = dev.alloc<float>(n * n, "gemm benchmark C");
    std::vector<float> host(n * n);
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& v : host) v = dist(rng);
    dev.copy(s, std::as_writable_bytes(a.span()), std::as_bytes(std::span<const float>(host)));
    dev.copy(s, std::as_writable_bytes(b.span()), std::as_bytes(std::span<const float>(host)));
    const Gemm g = cpu::resolve(Gemm{.m = n, .n = n, .k = n});
    // OpenBLAS as a user would call it: one cblas_sgemm on its own threads.
    auto run = [&, threads = static_cast<int>(dev.threads())] {
#if ZINF_HAVE_OPENBLAS
        cpu::blas_threaded(g, a.data(), b.data(), c.data(), threads);
#else
        cpu::gemm(g, a.data(), b.data(), c.data());
#endif
    };
    dev.host(s, run);  // warm-up
    dev.synchronize(s);
    Timer timer;
    for (unsigned r = 0; r < reps; ++r) dev.host(s, run);
    dev.synchronize(s);
    const double seconds = timer.seconds();
    return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * reps / seconds;
}

double measure_gemm_bf16_flops(Device& dev, std::uint64_t n, unsigned reps) {
    if (n == 0 || reps == 0) throw UsageError("measure_gemm_bf16_flops: n and reps must be positive");
    return dev.backend() == "cuda" ? cuda_gemm_flops(dev, n, reps, true) : 0.0;
}

}  // namespace zinf::device
