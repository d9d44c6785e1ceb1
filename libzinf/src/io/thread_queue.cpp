// The threads backend: blocking pread/pwrite on a pool of worker threads, for
// kernels or sandboxes that refuse io_uring. Results go through the same
// Completer as the uring backend, so short transfers and errors are judged once.
#include "internal.hpp"

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <system_error>
#include <thread>
#include <unistd.h>

namespace zinf::io::detail {
namespace {

// Runs one piece to the end with blocking pread/pwrite on this thread.
void run_piece_sync(Completer& c, Piece& p) {
    for (;;) {
        Submission s = c.prepare(p);
        if (s.kind == Submission::skip) {
            c.cancel(p);
            return;
        }
        long res;
        if (s.kind == Submission::fail) {
            res = -s.err;
        } else {
            const Request& r = *p.req;
            const int fd = r.file->fd.get();
            const auto off = static_cast<off_t>(p.offset + p.done);
            ssize_t n = r.op == Op::read ? ::pread(fd, p.buf + p.done, s.len, off)  // fault-site: engine (Completer::prepare)
                                         : ::pwrite(fd, p.buf + p.done, s.len, off);  // fault-site: engine (Completer::prepare)
            res = n < 0 ? -errno : n;
        }
        if (!c.complete(p, res)) return;
    }
}

class ThreadQueue final : public Queue {
public:
    ThreadQueue(Completer& c, unsigned threads) : c_(c) {
        try {
            for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
        } catch (const std::system_error& e) {
            // Joinable threads must not be destroyed: stop the ones started.
            stop();
            throw IoError("cannot start " + std::to_string(threads) + " I/O threads (" + e.what() +
                          "); lower --queue-depth or --queues");
        }
    }
    ~ThreadQueue() override { stop(); }

    void push(std::span<Piece* const> pieces) override {
        {
            std::lock_guard lk(mu_);
            q_.insert(q_.end(), pieces.begin(), pieces.end());
        }
        if (pieces.size() == 1)
            cv_.notify_one();
        else
            cv_.notify_all();
    }

    int update_buffer(unsigned, void*, std::size_t) override { return -EOPNOTSUPP; }
    int update_file(unsigned, int) override { return -EOPNOTSUPP; }

    void stop() override {
        {
            std::lock_guard lk(mu_);
            if (stop_) return;
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }

private:
    void work() {
        for (;;) {
            Piece* p;
            {
                std::unique_lock lk(mu_);
                cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
                if (q_.empty()) return;  // stopping, and everything queued is done
                p = q_.front();
                q_.pop_front();
            }
            run_piece_sync(c_, *p);
        }
    }

    Completer& c_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Piece*> q_;
    bool stop_ = false;
    std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Queue> make_thread_queue(Completer& c, unsigned threads) {
    return std::make_unique<ThreadQueue>(c, threads);
}

}  // namespace zinf::io::detail
