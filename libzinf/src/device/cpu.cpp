// The cpu backend: device memory is host memory from a budgeted arena, a
// stream is a worker thread running a queue of jobs in order, an event is a
// count of the jobs a stream had been given. Each kernel, its spans checked
// on the caller's thread (checks.cpp), enqueues the kernel of kernels.hpp.
#include "backends.hpp"
#include "kernels.hpp"
#include "llama_kernels.hpp"

#include <zinf/device.hpp>

#include <omp.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
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

    // ---- kernels -----------------------------------------------------------
    void do_gemm(Stream& s, const Gemm& r, std::span<const float> a, std::span<const float> b,
                 std::span<float> c) override {
        as_cpu(s).enqueue([r, a = a.data(), b = b.data(), c = c.data()] { cpu::gemm(r, a, b, c); });
    }

    void do_gemm_bf16(Stream& s, const Gemm& r, std::span<const float> a, std::span<const std::uint16_t> b,
                      std::span<float> c) override {
        as_cpu(s).enqueue([r, a = a.data(), b = b.data(), c = c.data()] { cpu::gemm(r, a, b, c); });
    }

    void do_gemm_bf16a(Stream& s, const Gemm& r, std::span<const std::uint16_t> a, const Weight& b,
                       std::span<float> c) override {
        if (b.is_bf16())
            as_cpu(s).enqueue([r, a = a.data(), b = b.bf16.data(), c = c.data()] { cpu::gemm(r, a, b, c); });
        else
            as_cpu(s).enqueue([r, a = a.data(), b = b.f32.data(), c = c.data()] { cpu::gemm(r, a, b, c); });
    }

    void do_bias_add(Stream& s, std::span<float> out, std::span<const float> bias, u64 N, u64 OC) override {
        as_cpu(s).enqueue([=, o = out.data(), b = bias.data()] { cpu::bias_add(o, b, N, OC); });
    }

    void do_bias_backward(Stream& s, std::span<float> dbias, std::span<const float> dout, u64 N, u64 OC) override {
        as_cpu(s).enqueue([=, db = dbias.data(), d = dout.data()] { cpu::bias_backward(db, d, N, OC); });
    }

    void do_embedding_forward(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                              std::span<const float> wte, std::span<const float> wpe, u64 B, u64 T, u64 C,
                              u64 V) override {
        as_cpu(s).enqueue([=, o = out.data(), tok = tokens.data(), te = wte.data(),
                           pe = wpe.empty() ? nullptr : wpe.data()] {
            cpu::embedding_forward(o, tok, te, pe, B, T, C, V);
        });
    }

    void do_embedding_forward_bf16(Stream& s, std::span<float> out, std::span<const std::int32_t> tokens,
                                   std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe, u64 B,
                                   u64 T, u64 C, u64 V) override {
        as_cpu(s).enqueue([=, o = out.data(), tok = tokens.data(), te = wte.data(),
                           pe = wpe.empty() ? nullptr : wpe.data()] {
            cpu::embedding_forward(o, tok, te, pe, B, T, C, V);
        });
    }

    void do_embedding_backward(Stream& s, std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                               std::span<const std::int32_t> tokens, u64 B, u64 T, u64 C, u64 V) override {
        as_cpu(s).enqueue([=, te = dwte.data(), pe = dwpe.empty() ? nullptr : dwpe.data(), d = dout.data(),
                           tok = tokens.data()] {
            cpu::embedding_backward(te, pe, d, tok, B, T, C, V);
        });
    }

    void do_layernorm_forward(Stream& s, std::span<float> out, std::span<float> mean, std::span<float> rstd,
                              std::span<const float> inp, std::span<const float> w, std::span<const float> b, u64 N,
                              u64 C) override {
        as_cpu(s).enqueue([=, o = out.data(), m = mean.data(), r = rstd.data(), x = inp.data(), w = w.data(),
                           b = b.data()] { cpu::layernorm_forward(o, m, r, x, w, b, N, C); });
    }

    // E: float, or std::uint16_t for inp stored bf16.
    template <class E>
    void layernorm_backward_of(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                               std::span<const float> dout, std::span<const E> inp, std::span<const float> w,
                               std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) {
        as_cpu(s).enqueue([=, di = dinp.data(), dw = dw.data(), db = db.data(), d = dout.data(), x = inp.data(),
                           w = w.data(), m = mean.data(), r = rstd.data()] {
            cpu::layernorm_backward(di, dw, db, d, x, w, m, r, N, C);
        });
    }
    void do_layernorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                               std::span<const float> dout, std::span<const float> inp, std::span<const float> w,
                               std::span<const float> mean, std::span<const float> rstd, u64 N, u64 C) override {
        layernorm_backward_of(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }
    void do_layernorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<float> db,
                                    std::span<const float> dout, std::span<const std::uint16_t> inp,
                                    std::span<const float> w, std::span<const float> mean,
                                    std::span<const float> rstd, u64 N, u64 C) override {
        layernorm_backward_of(s, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }

    // Element-wise kernels: n is the size of the span they write.
    void do_gelu_forward(Stream& s, std::span<float> out, std::span<const float> inp) override {
        const u64 n = out.size();
        as_cpu(s).enqueue([=, o = out.data(), x = inp.data()] { cpu::gelu_forward(o, x, n); });
    }

    void do_gelu_backward(Stream& s, std::span<float> dinp, std::span<const float> inp,
                          std::span<const float> dout) override {
        const u64 n = dinp.size();
        as_cpu(s).enqueue([=, di = dinp.data(), x = inp.data(), d = dout.data()] { cpu::gelu_backward(di, x, d, n); });
    }

    void do_gelu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> inp) override {
        const u64 n = out.size();
        as_cpu(s).enqueue([=, o = out.data(), x = inp.data()] { cpu::gelu_forward(o, x, n); });
    }

    void do_gelu_backward_bf16(Stream& s, std::span<float> dinp, std::span<const std::uint16_t> inp,
                               std::span<const float> dout) override {
        const u64 n = dinp.size();
        as_cpu(s).enqueue([=, di = dinp.data(), x = inp.data(), d = dout.data()] { cpu::gelu_backward(di, x, d, n); });
    }

    void do_attention_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> qkv, u64 B,
                              u64 T, u64 C, u64 NH) override {
        as_cpu(s).enqueue([=, o = out.data(), a = att.data(), x = qkv.data()] {
            cpu::attention_forward(o, a, x, B, T, C, NH);
        });
    }

    // E: float, or std::uint16_t for qkv and att stored bf16.
    template <class E>
    void attention_backward_of(Stream& s, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                               std::span<const E> qkv, std::span<const E> att, u64 B, u64 T, u64 C, u64 NH) {
        as_cpu(s).enqueue([=, dx = dqkv.data(), da = datt.data(), d = dout.data(), x = qkv.data(), a = att.data()] {
            cpu::attention_backward(dx, da, d, x, a, B, T, C, NH);
        });
    }
    void do_attention_backward(Stream& s, std::span<float> dqkv, std::span<float> datt, std::span<const float> dout,
                               std::span<const float> qkv, std::span<const float> att, u64 B, u64 T, u64 C,
                               u64 NH) override {
        attention_backward_of(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
    }
    void do_attention_backward_bf16(Stream& s, std::span<float> dqkv, std::span<float> datt,
                                    std::span<const float> dout, std::span<const std::uint16_t> qkv,
                                    std::span<const std::uint16_t> att, u64 B, u64 T, u64 C, u64 NH) override {
        attention_backward_of(s, dqkv, datt, dout, qkv, att, B, T, C, NH);
    }

    void do_attention_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, u64 T, u64 C, u64 NH) override {
        as_cpu(s).enqueue([=, o = out.data(), a = att.data(), q = q.data(), k = k.data(), v = v.data()] {
            cpu::attention_decode(o, a, q, k, v, T, C, NH);
        });
    }

    // ---- the Llama family (llama.cpp) ---------------------------------------
    void do_rmsnorm_forward(Stream& s, std::span<float> out, std::span<float> rstd, std::span<float> inp,
                            std::span<const float> add, std::span<const float> w, u64 N, u64 C,
                            float eps) override {
        as_cpu(s).enqueue([=, o = out.data(), r = rstd.data(), x = inp.data(), a = add.data(), w = w.data()] {
            if (a)
                cpu::residual_rmsnorm_forward(o, r, x, a, w, N, C, eps);
            else
                cpu::rmsnorm_forward(o, r, x, w, N, C, eps);
        });
    }

    // E: float, or std::uint16_t for inp stored bf16.
    template <class E>
    void rmsnorm_backward_of(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                             std::span<const E> inp, std::span<const float> w, std::span<const float> rstd, u64 N,
                             u64 C) {
        as_cpu(s).enqueue([=, di = dinp.data(), dw = dw.data(), d = dout.data(), x = inp.data(), w = w.data(),
                           r = rstd.data()] { cpu::rmsnorm_backward(di, dw, d, x, w, r, N, C); });
    }
    void do_rmsnorm_backward(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                             std::span<const float> inp, std::span<const float> w, std::span<const float> rstd, u64 N,
                             u64 C) override {
        rmsnorm_backward_of(s, dinp, dw, dout, inp, w, rstd, N, C);
    }
    void do_rmsnorm_backward_bf16(Stream& s, std::span<float> dinp, std::span<float> dw, std::span<const float> dout,
                                  std::span<const std::uint16_t> inp, std::span<const float> w,
                                  std::span<const float> rstd, u64 N, u64 C) override {
        rmsnorm_backward_of(s, dinp, dw, dout, inp, w, rstd, N, C);
    }

    void do_rope(Stream& s, std::span<float> x, std::span<const float> table, u64 B, u64 T, u64 H, u64 hd,
                 u64 pos0, bool inverse) override {
        as_cpu(s).enqueue([=, x = x.data(), t = table.data()] { cpu::rope(x, t, B, T, H, hd, pos0, inverse); });
    }

    // E: float, or std::uint16_t for gate and up (and the forward's out) stored bf16.
    template <class E>
    void swiglu_forward_of(Stream& s, std::span<E> out, std::span<const E> gate, std::span<const E> up) {
        const u64 n = out.size();
        as_cpu(s).enqueue([=, o = out.data(), g = gate.data(), u = up.data()] { cpu::swiglu_forward(o, g, u, n); });
    }
    template <class E>
    void swiglu_backward_of(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                            std::span<const E> gate, std::span<const E> up) {
        const u64 n = dgate.size();
        as_cpu(s).enqueue([=, dg = dgate.data(), du = dup.data(), d = dout.data(), g = gate.data(), u = up.data()] {
            cpu::swiglu_backward(dg, du, d, g, u, n);
        });
    }

    void do_swiglu_forward(Stream& s, std::span<float> out, std::span<const float> gate,
                           std::span<const float> up) override {
        swiglu_forward_of(s, out, gate, up);
    }
    void do_swiglu_backward(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                            std::span<const float> gate, std::span<const float> up) override {
        swiglu_backward_of(s, dgate, dup, dout, gate, up);
    }
    void do_swiglu_forward_bf16(Stream& s, std::span<std::uint16_t> out, std::span<const std::uint16_t> gate,
                                std::span<const std::uint16_t> up) override {
        swiglu_forward_of(s, out, gate, up);
    }
    void do_swiglu_backward_bf16(Stream& s, std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                                 std::span<const std::uint16_t> gate, std::span<const std::uint16_t> up) override {
        swiglu_backward_of(s, dgate, dup, dout, gate, up);
    }

    void do_gqa_forward(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v, u64 B, u64 T, u64 NH, u64 KVH,
                        u64 hd) override {
        as_cpu(s).enqueue([=, o = out.data(), a = att.data(), q = q.data(), k = k.data(), v = v.data()] {
            cpu::gqa_forward(o, a, q, k, v, B, T, NH, KVH, hd);
        });
    }

    // E: float, or std::uint16_t for q, k, v and att stored bf16.
    template <class E>
    void gqa_backward_of(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                         std::span<float> datt, std::span<const float> dout, std::span<const E> q,
                         std::span<const E> k, std::span<const E> v, std::span<const E> att, u64 B, u64 T, u64 NH,
                         u64 KVH, u64 hd) {
        as_cpu(s).enqueue([=, dq = dq.data(), dk = dk.data(), dv = dv.data(), da = datt.data(), d = dout.data(),
                           q = q.data(), k = k.data(), v = v.data(), a = att.data()] {
            cpu::gqa_backward(dq, dk, dv, da, d, q, k, v, a, B, T, NH, KVH, hd);
        });
    }
    void do_gqa_backward(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                         std::span<float> datt, std::span<const float> dout, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, std::span<const float> att, u64 B, u64 T,
                         u64 NH, u64 KVH, u64 hd) override {
        gqa_backward_of(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
    }
    void do_gqa_backward_bf16(Stream& s, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                              std::span<float> datt, std::span<const float> dout, std::span<const std::uint16_t> q,
                              std::span<const std::uint16_t> k, std::span<const std::uint16_t> v,
                              std::span<const std::uint16_t> att, u64 B, u64 T, u64 NH, u64 KVH, u64 hd) override {
        gqa_backward_of(s, dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, KVH, hd);
    }

    void do_gqa_decode(Stream& s, std::span<float> out, std::span<float> att, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, u64 T, u64 NH, u64 KVH, u64 hd) override {
        as_cpu(s).enqueue([=, o = out.data(), a = att.data(), q = q.data(), k = k.data(), v = v.data()] {
            cpu::gqa_decode(o, a, q, k, v, T, NH, KVH, hd);
        });
    }

    void do_crossentropy_forward_backward(Stream& s, std::span<float> losses, std::span<float> logits,
                                          std::span<const std::int32_t> targets, float dloss, u64 N,
                                          u64 V) override {
        as_cpu(s).enqueue([=, l = losses.data(), x = logits.data(), t = targets.data()] {
            cpu::crossentropy_forward_backward(l, x, t, dloss, N, V);
        });
    }

    void do_crossentropy_forward(Stream& s, std::span<float> losses, std::span<const float> logits,
                                 std::span<const std::int32_t> targets, u64 N, u64 V) override {
        as_cpu(s).enqueue([=, l = losses.data(), x = logits.data(), t = targets.data()] {
            cpu::crossentropy_forward(l, x, t, N, V);
        });
    }

    void do_residual_forward(Stream& s, std::span<float> out, std::span<const float> a,
                             std::span<const float> b) override {
        const u64 n = out.size();
        as_cpu(s).enqueue([=, o = out.data(), a = a.data(), b = b.data()] { cpu::residual_forward(o, a, b, n); });
    }

    void do_accumulate(Stream& s, std::span<float> acc, std::span<const float> x) override {
        const u64 n = acc.size();
        as_cpu(s).enqueue([=, a = acc.data(), x = x.data()] { cpu::accumulate(a, x, n); });
    }

    void do_cast(Stream& s, std::span<std::uint16_t> dst, std::span<const float> src) override {
        const u64 n = dst.size();
        as_cpu(s).enqueue([=, d = dst.data(), x = src.data()] { cpu::to_bf16(d, x, n); });
    }

    void do_cast(Stream& s, std::span<float> dst, std::span<const std::uint16_t> src) override {
        const u64 n = dst.size();
        as_cpu(s).enqueue([=, d = dst.data(), x = src.data()] { cpu::from_bf16(d, x, n); });
    }

    void do_adamw(Stream& s, const optim::Update& u, const optim::Scalars& k) override {
        as_cpu(s).enqueue([u, k, kernel = optim::Kernel{.isa = optim::default_isa(), .threads = threads_}] {
            optim::adamw(u, k, kernel);
        });
    }

    void host(Stream& s, std::function<void()> fn) override { as_cpu(s).enqueue(std::move(fn)); }

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
