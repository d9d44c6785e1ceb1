// The engine core: requests cut into pieces, pieces spread over queues, and the
// one place where kernel results are judged (short transfers, retries, errors).
#include "internal.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <unordered_map>
#include <utility>

#include <sys/stat.h>

namespace zinf::io {

using detail::Piece;
using detail::Request;
using detail::Submission;

namespace {
constexpr unsigned kMaxAgainRetries = 64;

const char* op_name(Op op) { return op == Op::read ? "read" : "write"; }
}  // namespace

struct Engine::Impl final : detail::Completer {
    EngineConfig cfg;
    std::string notes;
    std::vector<std::unique_ptr<detail::Queue>> queues;
    bool can_register = false;

    std::mutex mu;  // guards live, next_id, rr
    std::unordered_map<std::uint64_t, std::shared_ptr<Request>> live;  // not yet waited
    std::uint64_t next_id = 1;
    std::uint64_t rr = 0;  // queue that gets the next request's first piece

    struct BufferRange {
        std::uintptr_t begin, end;
        unsigned slot;
    };
    std::mutex reg_mu;  // guards the registration tables
    std::vector<BufferRange> buffers;
    std::vector<bool> buffer_slots = std::vector<bool>(detail::kRegSlots);
    std::vector<bool> file_slots = std::vector<bool>(detail::kRegSlots);
    std::unordered_map<std::uint64_t, unsigned> file_slot_of;  // File::Impl::id -> slot
    std::vector<std::uint64_t> file_of_slot = std::vector<std::uint64_t>(detail::kRegSlots);
    // Pieces not yet finished that use each slot: a released registration
    // waits for these, and only these, before the slot is emptied.
    std::array<std::atomic<std::uint32_t>, detail::kRegSlots> buf_users{}, file_users{};

    // Bumped and notified whenever any request completes; wait_any sleeps on it.
    std::atomic<std::uint32_t> completions{0};

    std::atomic<std::uint64_t> n_requests{0}, n_pieces{0}, n_read{0}, n_written{0}, n_short{0},
        n_again{0}, n_fixed{0};

    // --- detail::Completer -------------------------------------------------
    Submission prepare(Piece& p) override {
        Request& r = *p.req;
        if (r.failed.load(std::memory_order_relaxed)) return {Submission::skip, 0, 0};
        std::size_t want = p.len - p.done;
        // The engine's reads and writes are I/O sites too (util.hpp: sys).
        if (sys::watched() && p.done == 0) {
            const int f = sys::site(r.op == Op::read ? sys::Kind::read : sys::Kind::write, r.file->path);
            if (f > 0) return {Submission::fail, f, 0};
            if (f == sys::kShort) {
                const std::size_t half = align_down(want / 2, r.file->align);
                if (half > 0) want = half;
            }
        }
        if (r.file->has_faults.load(std::memory_order_relaxed)) {
            int err = 0;
            switch (r.file->take_fault(r.op, err)) {
            case File::Impl::FaultAction::none: break;
            case File::Impl::FaultAction::fail: return {Submission::fail, err, 0};
            case File::Impl::FaultAction::corrupt: p.corrupt = true; break;
            case File::Impl::FaultAction::delay:
                std::this_thread::sleep_for(std::chrono::milliseconds(err));
                break;
            case File::Impl::FaultAction::shorten: {
                std::size_t half = align_down(want / 2, r.file->align);
                if (half > 0) want = half;
                break;
            }
            }
        }
        return {Submission::io, 0, want};
    }

    bool complete(Piece& p, long res) override {
        Request& r = *p.req;
        if ((res == -EAGAIN || res == -EINTR) && p.retries < kMaxAgainRetries) {
            ++p.retries;
            n_again.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
        if (res < 0) {
            fail(r, static_cast<int>(-res), p.offset + p.done,
                 std::string(op_name(r.op)) + " of " + std::to_string(p.len - p.done) +
                     " bytes failed");
            finish(p);
            return false;
        }
        if (res == 0) {
            fail_zero(r, p);
            finish(p);
            return false;
        }
        p.done += static_cast<std::size_t>(res);
        (r.op == Op::read ? n_read : n_written).fetch_add(static_cast<std::uint64_t>(res),
                                                          std::memory_order_relaxed);
        if (p.done < p.len) {
            n_short.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
        if (p.corrupt) p.buf[p.len / 2] ^= std::byte{0x5a};
        finish(p);
        return false;
    }

    void cancel(Piece& p) override { finish(p); }

    // --- the rest ---------------------------------------------------------
    void fail(Request& r, int err, std::uint64_t offset, const std::string& what) {
        std::lock_guard lk(r.err_mu);
        if (r.failed.load()) return;  // the first failure is the one reported
        r.err = err;
        r.err_offset = offset;
        r.err_msg = what;
        r.failed.store(true);
    }

    // A transfer of zero bytes: end of file on a read; on a write the kernel
    // made no progress, which would loop forever if retried.
    void fail_zero(Request& r, const Piece& p) {
        const std::uint64_t at = p.offset + p.done;
        if (r.op == Op::write) {
            fail(r, EIO, at, "write made no progress (0 bytes written)");
            return;
        }
        struct stat st {};
        std::string size_note;
        if (::fstat(r.file->fd.get(), &st) == 0)
            size_note = " (the file has " + std::to_string(st.st_size) + " bytes)";
        fail(r, 0, at,
             "unexpected end of file reading bytes [" + std::to_string(at) + ", " +
                 std::to_string(p.offset + p.len) + ")" + size_note);
    }

    // The last piece of a request to finish wakes its waiter. `self` keeps the
    // request alive across the notify even if the waiter frees it at once.
    void finish(Piece& p) {
        Request* r = p.req;
        release_slots(p);
        if (r->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        std::shared_ptr<Request> keep = std::move(r->self);
        if (r->done) {
            run_callback(std::move(keep));
            return;
        }
        r->pending.notify_all();
        completions.fetch_add(1, std::memory_order_release);
        completions.notify_all();
    }

    void release_slots(const Piece& p) {
        auto drop = [](std::atomic<std::uint32_t>& users) {
            if (users.fetch_sub(1, std::memory_order_acq_rel) == 1) users.notify_all();
        };
        if (p.buf_slot >= 0) drop(buf_users[p.buf_slot]);
        if (p.req->file_slot >= 0) drop(file_users[p.req->file_slot]);
    }

    // Runs a finished read_then/write_then callback, then lets the request go
    // (closure included) before the request stops counting as in flight, so
    // that nothing of it is still being destroyed when wait_all returns.
    void run_callback(std::shared_ptr<Request> r) {
        Done cb = std::move(r->done);
        try {
            if (r->failed.load()) {
                const IoError e = r->error();
                cb(&e);
            } else {
                cb(nullptr);
            }
        } catch (...) {
            std::lock_guard lk(mu);
            if (!callback_error) callback_error = std::current_exception();
        }
        cb = nullptr;
        r.reset();
        // Decremented last: requests the callback started were counted first,
        // so the count cannot touch zero while a chain goes on.
        if (detached.fetch_sub(1, std::memory_order_acq_rel) == 1) detached.notify_all();
    }

    void await_detached() {
        std::uint32_t v;
        while ((v = detached.load(std::memory_order_acquire)) != 0) detached.wait(v);
    }

    // read_then/write_then requests in flight, their callbacks included.
    std::atomic<std::uint32_t> detached{0};
    std::exception_ptr callback_error;  // guarded by mu

    int buffer_slot_for(const std::byte* begin, std::size_t len) {
        auto b = reinterpret_cast<std::uintptr_t>(begin);
        for (const BufferRange& br : buffers)
            if (b >= br.begin && b + len <= br.end) return static_cast<int>(br.slot);
        return -1;
    }

    Ticket submit(Op op, File& file, std::uint64_t offset, std::byte* buf, std::size_t bytes,
                  Done done = {});
    void await(Request& r);
    std::shared_ptr<Request> take(Ticket t);
    // The live request of `t`; the caller holds mu. `who` names the call in
    // the error for a ticket that is unknown or already waited.
    std::shared_ptr<Request>& find(Ticket t, const char* who) {
        auto it = live.find(t.id);
        if (it == live.end())
            throw InternalError(std::string(who) + " on an unknown or already waited I/O ticket " +
                                std::to_string(t.id));
        return it->second;
    }
    void throw_if_failed(Request& r);
};

Engine::Engine(const EngineConfig& cfg) : impl_(std::make_unique<Impl>()) {
    cfg.validate();
    Impl& m = *impl_;
    m.cfg = cfg;
    if (cfg.engine != "threads") {
        std::string notes;
        int err = 0;
        bool can_register = true;
        std::vector<std::unique_ptr<detail::Queue>> qs;
        for (unsigned i = 0; i < cfg.queues; ++i) {
            auto q = detail::make_uring_queue(m, cfg.queue_depth, notes, can_register, err);
            if (!q) break;
            qs.push_back(std::move(q));
        }
        if (qs.size() == cfg.queues) {
            m.queues = std::move(qs);
            m.cfg.engine = "uring";
            m.can_register = can_register;
            m.notes = notes;
        } else {
            for (auto& q : qs) q->stop();
            std::string why = "io_uring_setup failed: " + std::string(std::strerror(-err));
            if (cfg.engine == "uring")
                throw IoError("the uring engine is unavailable (" + why +
                                  "); use --engine threads or auto",
                              {-err, {}, {}, -1});
            m.notes = "io_uring unavailable (" + why + "); using the threads engine";
            log::warn_once("uring-refused", m.notes);
        }
    }
    if (m.queues.empty()) {
        m.cfg.engine = "threads";
        // queue_depth threads per queue, so that the same key means the same
        // concurrency on both backends; bounded to keep thread counts sane.
        unsigned per_queue = std::max(1u, std::min(cfg.queue_depth, 256u / cfg.queues));
        for (unsigned i = 0; i < cfg.queues; ++i)
            m.queues.push_back(detail::make_thread_queue(m, per_queue));
    }
    if (!m.notes.empty()) log::debug("io engine: " + m.notes);
}

Engine::~Engine() {
    Impl& m = *impl_;
    // Callback chains may still start requests on any queue: let them end
    // before the queues stop taking work.
    m.await_detached();
    for (auto& q : m.queues) q->stop();
    if (m.callback_error) {
        try {
            std::rethrow_exception(m.callback_error);
        } catch (const std::exception& e) {
            log::warn(std::string("an I/O completion callback failed and nobody called wait_all: ") + e.what());
        } catch (...) {
            log::warn("an I/O completion callback threw a non-exception and nobody called wait_all");
        }
    }
    for (auto& [id, r] : m.live) {
        if (r->failed.load())
            log::warn("an I/O error was never waited for (ticket " + std::to_string(id) +
                      "): " + r->error().what());
    }
}

const EngineConfig& Engine::config() const { return impl_->cfg; }
const std::string& Engine::notes() const { return impl_->notes; }

Ticket Engine::read(File& file, std::uint64_t offset, std::span<std::byte> dst) {
    return impl_->submit(Op::read, file, offset, dst.data(), dst.size());
}

Ticket Engine::write(File& file, std::uint64_t offset, std::span<const std::byte> src) {
    // The engine never writes into a source buffer; the cast only lets both
    // directions share one piece type.
    return impl_->submit(Op::write, file, offset, const_cast<std::byte*>(src.data()), src.size());
}

Ticket Engine::Impl::submit(Op op, File& file, std::uint64_t offset, std::byte* buf,
                            std::size_t bytes, Done done) {
    File::Impl* fi = file.impl();
    if (!fi) throw InternalError("I/O on a closed zinf::io::File");
    if (fi->direct) {
        auto refuse = [&](const std::string& what) {
            throw IoError("misaligned direct I/O " + std::string(op_name(op)) + ": " + what,
                          {EINVAL, fi->path, offset, -1});
        };
        if (!is_aligned(offset, fi->align))
            refuse("the offset is not a multiple of the file's direct-I/O alignment " +
                   std::to_string(fi->align));
        if (!is_aligned(bytes, fi->align))
            refuse("the length " + std::to_string(bytes) +
                   " is not a multiple of the file's direct-I/O alignment " +
                   std::to_string(fi->align));
        if (!is_aligned(buf, fi->mem_align))
            refuse("the buffer address is not a multiple of the memory alignment " +
                   std::to_string(fi->mem_align));
    }

    auto r = std::make_shared<Request>();
    r->op = op;
    r->file = fi;
    // Pieces keep the file's alignment so that each is a valid direct transfer.
    const std::size_t piece = std::max<std::size_t>(align_down(cfg.block_size, fi->align), fi->align);
    const std::size_t n = bytes ? (bytes + piece - 1) / piece : 0;
    r->pieces.resize(n);
    {
        std::lock_guard lk(reg_mu);
        if (auto it = file_slot_of.find(fi->id); it != file_slot_of.end())
            r->file_slot = static_cast<int>(it->second);
        for (std::size_t i = 0; i < n; ++i) {
            Piece& p = r->pieces[i];
            p.req = r.get();
            p.offset = offset + i * piece;
            p.buf = buf + i * piece;
            p.len = std::min(piece, bytes - i * piece);
            p.buf_slot = buffers.empty() ? -1 : buffer_slot_for(p.buf, p.len);
            if (p.buf_slot >= 0) {
                buf_users[p.buf_slot].fetch_add(1, std::memory_order_relaxed);
                n_fixed.fetch_add(1, std::memory_order_relaxed);
            }
        }
        if (r->file_slot >= 0) file_users[r->file_slot].fetch_add(static_cast<std::uint32_t>(n));
    }
    r->pending.store(static_cast<std::uint32_t>(n));
    r->done = std::move(done);
    if (r->done) {
        detached.fetch_add(1, std::memory_order_relaxed);
        if (n == 0) {  // nothing to transfer: finished now, on this thread
            run_callback(std::move(r));
            return Ticket{0};
        }
    }
    if (n > 0) r->self = r;

    std::uint64_t id = 0, first;
    {
        std::lock_guard lk(mu);
        if (!r->done) {
            id = next_id++;
            live.emplace(id, r);
        }
        first = rr;
        rr += std::max<std::size_t>(n, 1);
    }
    n_requests.fetch_add(1, std::memory_order_relaxed);
    n_pieces.fetch_add(n, std::memory_order_relaxed);

    // Piece i goes to queue (first + i) % Q: consecutive pieces on different
    // rings, and each queue gets its share in one push.
    const std::size_t nq = queues.size();
    std::vector<Piece*> batch;
    batch.reserve(n / nq + 1);
    for (std::size_t q = 0; q < nq; ++q) {
        batch.clear();
        const std::size_t start = (q + nq - first % nq) % nq;
        for (std::size_t i = start; i < n; i += nq) batch.push_back(&r->pieces[i]);
        if (!batch.empty()) queues[q]->push(batch);
    }
    return Ticket{id};
}

void Engine::Impl::await(Request& r) {
    std::uint32_t v;
    while ((v = r.pending.load(std::memory_order_acquire)) != 0) r.pending.wait(v);
}

std::shared_ptr<Request> Engine::Impl::take(Ticket t) {
    std::lock_guard lk(mu);
    std::shared_ptr<Request> r = std::move(find(t, "wait"));
    live.erase(t.id);
    return r;
}

void Engine::Impl::throw_if_failed(Request& r) {
    if (!r.failed.load()) return;
    throw r.error();
}

void Engine::read_then(File& file, std::uint64_t offset, std::span<std::byte> dst, Done done) {
    if (!done) throw InternalError("read_then without a callback");
    impl_->submit(Op::read, file, offset, dst.data(), dst.size(), std::move(done));
}

void Engine::write_then(File& file, std::uint64_t offset, std::span<const std::byte> src, Done done) {
    if (!done) throw InternalError("write_then without a callback");
    impl_->submit(Op::write, file, offset, const_cast<std::byte*>(src.data()), src.size(),
                  std::move(done));
}

void Engine::wait(Ticket t) {
    std::shared_ptr<Request> r = impl_->take(t);
    impl_->await(*r);
    impl_->throw_if_failed(*r);
}

bool Engine::ready(Ticket t) {
    std::lock_guard lk(impl_->mu);
    return impl_->find(t, "ready")->pending.load(std::memory_order_acquire) == 0;
}

std::size_t Engine::wait_any(std::span<const Ticket> tickets) {
    if (tickets.empty()) throw InternalError("wait_any on no tickets");
    std::vector<std::shared_ptr<Request>> reqs(tickets.size());  // alive whoever else waits
    {
        std::lock_guard lk(impl_->mu);
        for (std::size_t i = 0; i < tickets.size(); ++i)
            reqs[i] = impl_->find(tickets[i], "wait_any");
    }
    for (;;) {
        // Read the counter before looking, so a completion between the look
        // and the sleep changes it and the sleep returns at once.
        const std::uint32_t seen = impl_->completions.load(std::memory_order_acquire);
        for (std::size_t i = 0; i < reqs.size(); ++i)
            if (reqs[i]->pending.load(std::memory_order_acquire) == 0) return i;
        impl_->completions.wait(seen, std::memory_order_acquire);
    }
}

void Engine::wait_all() {
    std::unordered_map<std::uint64_t, std::shared_ptr<Request>> all;
    {
        std::lock_guard lk(impl_->mu);
        all.swap(impl_->live);
    }
    // In ticket order, so that "the first error" means the earliest request.
    std::vector<std::pair<std::uint64_t, std::shared_ptr<Request>>> sorted(all.begin(), all.end());
    std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.first < b.first; });
    Request* first_failed = nullptr;
    for (auto& [id, r] : sorted) {
        impl_->await(*r);
        if (!first_failed && r->failed.load()) first_failed = r.get();
    }
    impl_->await_detached();
    if (first_failed) impl_->throw_if_failed(*first_failed);
    std::exception_ptr cb;
    {
        std::lock_guard lk(impl_->mu);
        std::swap(cb, impl_->callback_error);
    }
    if (cb) std::rethrow_exception(cb);
}

void Engine::sync(File& file) {
    File::Impl* fi = file.impl();
    if (!fi) throw InternalError("sync of a closed zinf::io::File");
    std::vector<std::shared_ptr<Request>> mine;
    {
        std::lock_guard lk(impl_->mu);
        for (auto& [id, r] : impl_->live)
            if (r->file == fi) mine.push_back(r);
    }
    for (auto& r : mine) impl_->await(*r);
    // read_then/write_then requests have no ticket to find by file: wait for
    // all of them (so sync must not be called from a callback).
    impl_->await_detached();
    file.sync();
}

// Registration never holds reg_mu across a ring-thread call: a ring thread
// running a callback may be submitting (and so taking reg_mu) at that moment.
Registration Engine::register_buffer(std::span<std::byte> buf) {
    Impl& m = *impl_;
    if (!m.can_register || buf.empty() || buf.size() > detail::kMaxFixedBuffer) return {};
    unsigned slot;
    {
        std::lock_guard lk(m.reg_mu);
        auto free_slot = std::find(m.buffer_slots.begin(), m.buffer_slots.end(), false);
        if (free_slot == m.buffer_slots.end()) return {};
        slot = static_cast<unsigned>(free_slot - m.buffer_slots.begin());
        m.buffer_slots[slot] = true;  // reserved; not used by requests until published
    }
    for (std::size_t q = 0; q < m.queues.size(); ++q) {
        int rc = m.queues[q]->update_buffer(slot, buf.data(), buf.size());
        if (rc != 0) {
            for (std::size_t u = 0; u < q; ++u) m.queues[u]->update_buffer(slot, nullptr, 0);
            log::warn_once("fixedbuf:" + std::to_string(-rc),
                           "io_uring refused to register a " + format_size(buf.size()) +
                               " buffer (" + std::strerror(-rc) +
                               "); I/O goes on without fixed buffers"
                               " (raise RLIMIT_MEMLOCK with `ulimit -l` for them)");
            std::lock_guard lk(m.reg_mu);
            m.buffer_slots[slot] = false;
            return {};
        }
    }
    std::lock_guard lk(m.reg_mu);
    auto b = reinterpret_cast<std::uintptr_t>(buf.data());
    m.buffers.push_back({b, b + buf.size(), slot});
    return Registration(this, Registration::Kind::buffer, slot);
}

Registration Engine::register_file(File& file) {
    Impl& m = *impl_;
    File::Impl* fi = file.impl();
    if (!fi) throw InternalError("register_file of a closed zinf::io::File");
    if (!m.can_register) return {};
    unsigned slot;
    {
        std::lock_guard lk(m.reg_mu);
        if (m.file_slot_of.count(fi->id)) return {};  // already registered by another Registration
        auto free_slot = std::find(m.file_slots.begin(), m.file_slots.end(), false);
        if (free_slot == m.file_slots.end()) return {};
        slot = static_cast<unsigned>(free_slot - m.file_slots.begin());
        m.file_slots[slot] = true;  // reserved
    }
    for (std::size_t q = 0; q < m.queues.size(); ++q) {
        int rc = m.queues[q]->update_file(slot, fi->fd.get());
        if (rc != 0) {
            for (std::size_t u = 0; u < q; ++u) m.queues[u]->update_file(slot, -1);
            log::debug("io_uring refused to register " + fi->path + ": " + std::strerror(-rc));
            std::lock_guard lk(m.reg_mu);
            m.file_slots[slot] = false;
            return {};
        }
    }
    std::lock_guard lk(m.reg_mu);
    if (!m.file_slot_of.emplace(fi->id, slot).second) {  // a concurrent registration won
        for (auto& q : m.queues) q->update_file(slot, -1);
        m.file_slots[slot] = false;
        return {};
    }
    m.file_of_slot[slot] = fi->id;
    return Registration(this, Registration::Kind::file, slot);
}

void Engine::unregister(Registration::Kind kind, unsigned slot) {
    Impl& m = *impl_;
    const bool buffer = kind == Registration::Kind::buffer;
    {   // No new request takes the slot from here on...
        std::lock_guard lk(m.reg_mu);
        if (buffer)
            std::erase_if(m.buffers, [&](const Impl::BufferRange& b) { return b.slot == slot; });
        else
            m.file_slot_of.erase(m.file_of_slot[slot]);
    }
    // ...and the pieces already cut with it finish before it is emptied.
    auto& users = buffer ? m.buf_users[slot] : m.file_users[slot];
    for (std::uint32_t v; (v = users.load(std::memory_order_acquire)) != 0;) users.wait(v);
    for (auto& q : m.queues) {
        if (buffer)
            q->update_buffer(slot, nullptr, 0);
        else
            q->update_file(slot, -1);
    }
    std::lock_guard lk(m.reg_mu);
    (buffer ? m.buffer_slots : m.file_slots)[slot] = false;
}

EngineStats Engine::stats() const {
    const Impl& m = *impl_;
    return {m.n_requests.load(), m.n_pieces.load(), m.n_read.load(),   m.n_written.load(),
            m.n_short.load(),    m.n_again.load(),  m.n_fixed.load()};
}

Registration::Registration(Registration&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), kind_(o.kind_), slot_(o.slot_) {}

Registration& Registration::operator=(Registration&& o) noexcept {
    if (this != &o) {
        release();
        engine_ = std::exchange(o.engine_, nullptr);
        kind_ = o.kind_;
        slot_ = o.slot_;
    }
    return *this;
}

Registration::~Registration() { release(); }

void Registration::release() {
    if (engine_) std::exchange(engine_, nullptr)->unregister(kind_, slot_);
}

}  // namespace zinf::io
