// The uring backend: one io_uring ring per queue, owned by one worker thread
// that submits in batches and reaps completions. Everything that touches the
// ring (setup, registration, submission, reaping) runs on that thread, which
// lets the ring use IORING_SETUP_SINGLE_ISSUER and DEFER_TASKRUN.
#include "internal.hpp"

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <thread>

#include <sys/eventfd.h>
#include <unistd.h>

#include <liburing.h>

namespace zinf::io::detail {
namespace {

struct SetupTry {
    unsigned flags;
    const char* name;
};

// Most capable first; each refused with EINVAL falls through to the next.
constexpr SetupTry kSetupTries[] = {
    {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, "SINGLE_ISSUER|DEFER_TASKRUN"},
    {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN, "SINGLE_ISSUER|COOP_TASKRUN"},
    {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},
    {0, "no optional flags"},
};

struct SetupResult {
    int err = 0;  // -errno of the last io_uring_queue_init_params
    std::string notes;
    bool can_register = false;
};

class UringQueue final : public Queue {
public:
    UringQueue(Completer& c, unsigned qd) : c_(c), qd_(qd) {}

    SetupResult start() {
        std::promise<SetupResult> setup;
        auto fut = setup.get_future();
        th_ = std::thread([this, &setup] { run(setup); });
        SetupResult r = fut.get();
        if (r.err != 0) th_.join();
        return r;
    }

    ~UringQueue() override { stop(); }

    void push(std::span<Piece* const> pieces) override {
        {
            std::lock_guard lk(mu_);
            incoming_.insert(incoming_.end(), pieces.begin(), pieces.end());
        }
        wake();
    }

    int update_buffer(unsigned slot, void* base, std::size_t len) override {
        return call([=, this] {
            iovec iov{base, len};
            int rc = io_uring_register_buffers_update_tag(&ring_, slot, &iov, nullptr, 1);
            return rc < 0 ? rc : 0;
        });
    }

    int update_file(unsigned slot, int fd) override {
        return call([=, this] {
            int rc = io_uring_register_files_update(&ring_, slot, const_cast<int*>(&fd), 1);
            return rc < 0 ? rc : 0;
        });
    }

    void stop() override {
        if (!th_.joinable()) return;
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        wake();
        th_.join();
    }

private:
    // The worker sleeps either on cv_ (nothing in flight) or inside
    // io_uring_enter (waiting for a completion). In the second case new work
    // would wait for the next completion, leaving a slot of the queue empty
    // for a whole completion interval; the doorbell, an eventfd read kept in
    // the ring, wakes it at once. Only rung when the worker is in the kernel.
    void wake() {
        if (in_kernel_.load(std::memory_order_seq_cst) && doorbell_.get() >= 0) {
            const std::uint64_t one = 1;
            ssize_t n = ::write(doorbell_.get(), &one, sizeof one);  // fault-site: none (eventfd)
            (void)n;  // EAGAIN: the counter is already non-zero, it will wake anyway
        }
        cv_.notify_one();
    }

    void arm_doorbell() {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) return;  // the next pass arms it
        io_uring_prep_read(sqe, doorbell_.get(), &doorbell_value_, sizeof doorbell_value_, 0);  // fault-site: none (eventfd)
        io_uring_sqe_set_data(sqe, &doorbell_value_);
        doorbell_armed_ = true;
    }
    // Runs `fn` on the ring's thread and returns its result.
    int call(std::function<int()> fn) {
        std::packaged_task<int()> task(std::move(fn));
        auto fut = task.get_future();
        {
            std::lock_guard lk(mu_);
            cmds_.push_back(std::move(task));
        }
        wake();  // the ring thread may be asleep in io_uring_enter
        return fut.get();
    }

    void run(std::promise<SetupResult>& setup_promise) {
        SetupResult sr;
        const SetupTry* used = nullptr;
        for (const SetupTry& t : kSetupTries) {
            io_uring_params p{};
            p.flags = t.flags;
            sr.err = io_uring_queue_init_params(qd_, &ring_, &p);
            if (sr.err == 0) {
                used = &t;
                break;
            }
            if (sr.err != -EINVAL) break;  // EPERM/ENOSYS/ENOMEM: no retry helps
        }
        if (!used) {
            setup_promise.set_value(sr);
            return;
        }
        if (used != &kSetupTries[0])
            sr.notes = std::string("io_uring refused IORING_SETUP_") + kSetupTries[0].name +
                       " (EINVAL); using " + used->name;
        // Sparse tables let buffers and files be registered one at a time later.
        int rb = io_uring_register_buffers_sparse(&ring_, kRegSlots);
        int rf = io_uring_register_files_sparse(&ring_, kRegSlots);
        sr.can_register = rb == 0 && rf == 0;
        if (!sr.can_register) {
            int e = rb ? -rb : -rf;
            sr.notes += std::string(sr.notes.empty() ? "" : "; ") +
                        "io_uring cannot register buffers and files (" + std::strerror(e) +
                        "); running without fixed buffers";
            if (rb == 0) io_uring_unregister_buffers(&ring_);
            if (rf == 0) io_uring_unregister_files(&ring_);
        }
        int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (efd >= 0) doorbell_ = Fd(efd);  // without it: woken by the next completion
        setup_promise.set_value(sr);  // `setup_promise` is gone after this line
        loop();
        io_uring_queue_exit(&ring_);
    }

    void loop() {
        std::deque<Piece*> backlog;
        std::deque<std::packaged_task<int()>> cmds;
        unsigned inflight = 0;
        for (;;) {
            {
                std::unique_lock lk(mu_);
                if (backlog.empty() && inflight == 0)
                    cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !cmds_.empty(); });
                backlog.insert(backlog.end(), incoming_.begin(), incoming_.end());
                incoming_.clear();
                cmds.swap(cmds_);
                if (stop_ && backlog.empty() && inflight == 0 && cmds.empty()) return;
            }
            for (auto& cmd : cmds) cmd();
            cmds.clear();

            unsigned queued = 0;
            while (!backlog.empty() && inflight + queued < qd_) {
                Piece* p = backlog.front();
                backlog.pop_front();
                Submission s = c_.prepare(*p);
                if (s.kind == Submission::skip) {
                    c_.cancel(*p);
                    continue;
                }
                if (s.kind == Submission::fail) {
                    if (c_.complete(*p, -s.err)) backlog.push_front(p);
                    continue;
                }
                io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
                if (!sqe) {  // the ring is full; submit what we have first
                    backlog.push_front(p);
                    break;
                }
                prep(sqe, *p, s.len);
                ++queued;
            }
            if (inflight + queued == 0) continue;
            if (!doorbell_armed_ && doorbell_.get() >= 0) arm_doorbell();

            // Announce the sleep, then look once more: a push either sees
            // in_kernel_ (and rings) or its pieces are seen here (no sleep).
            // With work waiting, do not sleep, but still collect completions:
            // under DEFER_TASKRUN they are only posted when we ask for events.
            // (A stop is not work: pieces in flight are waited for as usual.)
            in_kernel_.store(true, std::memory_order_seq_cst);
            bool more;
            {
                std::lock_guard lk(mu_);
                more = !incoming_.empty() || !cmds_.empty();
            }
            int rc = more ? io_uring_submit_and_get_events(&ring_) : io_uring_submit_and_wait(&ring_, 1);
            in_kernel_.store(false, std::memory_order_relaxed);
            if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
                // The kernel took nothing from the submission queue; the next
                // pass submits the same entries again.
                log::warn_once("uring-enter:" + std::to_string(-rc),
                               std::string("io_uring_enter failed (") + std::strerror(-rc) +
                                   "); retrying");
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            inflight += queued;

            unsigned head, seen = 0;
            io_uring_cqe* cqe;
            io_uring_for_each_cqe(&ring_, head, cqe) {
                ++seen;
                if (io_uring_cqe_get_data(cqe) == &doorbell_value_) {
                    doorbell_armed_ = false;  // rung (or failed): re-armed next pass
                    continue;
                }
                --inflight;
                auto* p = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
                if (c_.complete(*p, cqe->res)) backlog.push_front(p);
            }
            io_uring_cq_advance(&ring_, seen);
        }
    }

    void prep(io_uring_sqe* sqe, Piece& p, std::size_t len) {
        Request& r = *p.req;
        const int fd = r.file_slot >= 0 ? r.file_slot : r.file->fd.get();
        std::byte* buf = p.buf + p.done;
        const auto n = static_cast<unsigned>(len);
        const std::uint64_t off = p.offset + p.done;
        if (r.op == Op::read) {
            if (p.buf_slot >= 0)
                io_uring_prep_read_fixed(sqe, fd, buf, n, off, p.buf_slot);  // fault-site: engine (Completer::prepare)
            else
                io_uring_prep_read(sqe, fd, buf, n, off);  // fault-site: engine (Completer::prepare)
        } else {
            if (p.buf_slot >= 0)
                io_uring_prep_write_fixed(sqe, fd, buf, n, off, p.buf_slot);  // fault-site: engine (Completer::prepare)
            else
                io_uring_prep_write(sqe, fd, buf, n, off);  // fault-site: engine (Completer::prepare)
        }
        if (r.file_slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data(sqe, &p);
    }

    Completer& c_;
    const unsigned qd_;
    io_uring ring_{};
    std::thread th_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Piece*> incoming_;
    std::deque<std::packaged_task<int()>> cmds_;
    bool stop_ = false;
    std::atomic<bool> in_kernel_{false};
    Fd doorbell_;                       // eventfd
    std::uint64_t doorbell_value_ = 0;  // the doorbell read's buffer; its address tags its CQE
    bool doorbell_armed_ = false;       // worker thread only
};

}  // namespace

std::unique_ptr<Queue> make_uring_queue(Completer& c, unsigned queue_depth, std::string& notes,
                                        bool& can_register, int& err) {
    auto q = std::make_unique<UringQueue>(c, queue_depth);
    SetupResult r = q->start();
    if (r.err != 0) {
        err = r.err;
        return nullptr;
    }
    if (!r.notes.empty() && notes.find(r.notes) == std::string::npos) {
        notes += (notes.empty() ? "" : "; ") + r.notes;
        log::warn_once("uring-setup:" + r.notes, r.notes);
    }
    can_register = can_register && r.can_register;
    return q;
}

}  // namespace zinf::io::detail

namespace zinf::io {

bool uring_available(std::string* why) {
    io_uring ring;
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc == 0) {
        io_uring_queue_exit(&ring);
        return true;
    }
    if (why) *why = std::string("io_uring_setup: ") + std::strerror(-rc);
    return false;
}

}  // namespace zinf::io
