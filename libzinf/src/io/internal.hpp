// Private to libzinf/src/io: what the engine core and its backends share.
//
// The engine core (engine.cpp) cuts a request into pieces and owns every rule
// about results (short transfers, retries, errors, fault injection). A backend
// (uring_queue.cpp, thread_queue.cpp) only moves pieces to the kernel and hands
// each raw result back through Completer::complete.
#pragma once

#include <zinf/io.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace zinf::io {

struct File::Impl {
    std::string path;
    Fd fd;
    bool direct = false;
    std::size_t align = 1;      // offset/length alignment required (1 when buffered)
    std::size_t mem_align = 1;  // buffer address alignment required (1 when buffered)
    std::size_t dio_align = 4096;
    std::uint64_t id = 0;       // unique per open, so registrations never match a reused fd

    std::atomic<bool> has_faults{false};
    std::mutex fault_mu;
    std::vector<Fault> faults;
    std::uint64_t nth_read = 0, nth_write = 0;  // pieces submitted so far, under fault_mu

    // Called once per piece submission when has_faults.
    enum class FaultAction { none, fail, shorten, corrupt, delay };
    // err: the errno of fail, the milliseconds of delay.
    FaultAction take_fault(Op op, int& err);
};

namespace detail {

struct Request;

struct Piece {
    Request* req = nullptr;
    std::uint64_t offset = 0;  // file offset of the piece's first byte
    std::byte* buf = nullptr;  // memory of the piece's first byte
    std::size_t len = 0;       // bytes in the piece
    std::size_t done = 0;      // bytes already transferred
    int buf_slot = -1;         // registered buffer index, -1 when none
    unsigned retries = 0;      // EAGAIN/EINTR resubmissions so far
    bool corrupt = false;      // fault injection: flip a byte when the read completes
};

struct Request {
    Op op = Op::read;
    File::Impl* file = nullptr;
    int file_slot = -1;  // registered file index, -1 when none
    std::vector<Piece> pieces;
    std::atomic<std::uint32_t> pending{0};  // pieces not yet finished
    std::atomic<bool> failed{false};
    // Keeps the request alive while its last piece completes (see Engine::Impl::finish).
    std::shared_ptr<Request> self;
    // read_then/write_then: run on completion instead of waking a waiter.
    Engine::Done done;

    std::mutex err_mu;
    std::string err_msg;  // first failure, complete message
    int err = 0;
    std::uint64_t err_offset = 0;

    // The first failure as the error wait() throws; read only once `failed`.
    IoError error() const { return IoError(err_msg, {err, file->path, err_offset, -1}); }
};

// How a backend should treat a piece it is about to submit.
struct Submission {
    enum Kind { io, fail, skip } kind = io;
    int err = 0;          // for fail: the errno to complete with
    std::size_t len = 0;  // for io: bytes to ask the kernel for now
};

class Completer {
public:
    virtual ~Completer() = default;
    // Before every submission of a piece (first or resubmission).
    virtual Submission prepare(Piece& p) = 0;
    // With the kernel's result (bytes, or -errno). Returns true when the piece
    // must be submitted again (short transfer or EAGAIN); false when it is
    // finished and must not be touched any more.
    virtual bool complete(Piece& p, long res) = 0;
    // For a piece that prepare() said to skip (its request already failed).
    virtual void cancel(Piece& p) = 0;
};

class Queue {
public:
    virtual ~Queue() = default;
    virtual void push(std::span<Piece* const> pieces) = 0;
    // Registration in this queue's ring; 0 or -errno. Backends without
    // registration return -EOPNOTSUPP.
    virtual int update_buffer(unsigned slot, void* base, std::size_t len) = 0;
    virtual int update_file(unsigned slot, int fd) = 0;
    // Finishes everything queued, then stops the workers.
    virtual void stop() = 0;
};

inline constexpr unsigned kRegSlots = 256;            // registered buffers and files per ring
inline constexpr std::size_t kMaxFixedBuffer = GiB;   // io_uring's limit per registered buffer

// Sets up a ring on its own worker thread. On failure returns nullptr and sets
// `err` (-errno of io_uring_setup). `notes` gets the downgrades made.
std::unique_ptr<Queue> make_uring_queue(Completer& c, unsigned queue_depth, std::string& notes,
                                        bool& can_register, int& err);
std::unique_ptr<Queue> make_thread_queue(Completer& c, unsigned threads);


}  // namespace detail
}  // namespace zinf::io
