// zinf io (DeepNVMe): files opened for direct I/O when the file system takes it,
// and an asynchronous engine that cuts requests of any size into block-sized
// pieces spread over several io_uring rings (or a pread/pwrite thread pool).
//
//   zinf::io::Engine eng(zinf::io::EngineConfig{});       // auto: uring, else threads
//   auto f = zinf::io::File::open(path, {.access = zinf::io::Access::read});
//   auto t = eng.read(f, 0, buffer);                        // returns at once
//   eng.wait(t);                                            // throws IoError on failure
//
// Every completion is checked: short transfers are finished, EAGAIN/EINTR are
// retried, and any other failure reaches wait() as an IoError naming the path,
// the offset and errno. Buffers and files must outlive the tickets that use them.
#pragma once

#include <zinf/util.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::io {

// ---------------------------------------------------------------------------
// Engine configuration. The same keys are used on the command line (--engine,
// --block-size, --queue-depth, --queues), in JSON, and by `zinf-nvmebench --best`.
struct EngineConfig {
    std::string engine = "auto";          // "uring", "threads" or "auto"
    std::uint64_t block_size = 1 * MiB;   // bytes per piece a request is cut into
    unsigned queue_depth = 32;            // pieces in flight per queue
    unsigned queues = 2;                  // io_uring rings (or thread groups)
    // What zinf-nvmebench measured with this configuration (GiB/s; 0: not
    // measured): `--best` writes them, and zinf-train takes them as the
    // files' bandwidth for each step's disk floor instead of probing.
    double read_gibps = 0, write_gibps = 0;

    // Throws UsageError naming the key on a bad value.
    void validate() const;
    // Reads exactly the keys above (plus an optional "schema"; the measured
    // bandwidths are optional too); an unknown key is
    // an error, so a misspelt key never silently changes nothing. `where` names
    // the source in messages ("engine.json").
    static EngineConfig from_json(const json::Json& obj, const std::string& where);
    // Reads a file holding one such object (what `zinf-nvmebench --best`
    // prints): MissingInputError when absent, DataError naming the file else.
    static EngineConfig load(const std::string& path);
    json::Json to_json() const;
    std::string describe() const;  // "uring bs=1MiB qd=32 queues=2"
};

inline constexpr unsigned kMaxQueueDepth = 4096;
inline constexpr unsigned kMaxQueues = 64;

// The JSON schema tag written with an engine configuration.
inline constexpr const char* kEngineSchema = "zinf.engine/1";

// ---------------------------------------------------------------------------
enum class Access { read, write, read_write };
enum class Direct {
    prefer,    // O_DIRECT when the file system accepts it, else buffered (warned once)
    require,   // O_DIRECT or an error
    buffered,  // never O_DIRECT
};
enum class Op { read, write };

struct OpenOptions {
    Access access = Access::read;
    bool create = false;     // O_CREAT
    bool exclusive = false;  // with create: refuse an existing file (O_EXCL)
    bool truncate = false;   // O_TRUNC
    Direct direct = Direct::prefer;
    unsigned mode = 0666;    // less the umask, as every Unix tool creates files
    // A data directory the file must lie beneath: `path` is "<beneath>/<rel>"
    // and rel is resolved beneath it (open_beneath, util.hpp); a symbolic
    // link or ".." leading outside is refused (DataError, 65).
    std::string beneath;
};

// Fault injection for tests: the `nth` (1-based) read or write piece submitted
// on the file fails with `err`; or, when `err` is 0, comes back short (the
// kernel is asked for half the piece, so the engine must finish the rest); or,
// with `corrupt`, a read succeeds but one byte of it is flipped (silent
// corruption, which checksums must catch); or, with `delay_ms`, the piece
// is held that long before it goes to the kernel, then done whole (a slow
// write that someone may try to read around; with the io_uring backend the
// submissions queued behind it wait too, with the threads backend only the
// worker that holds it).
//
// Programs take faults from the environment too, for end-to-end tests:
//   ZINF_FAULTS="read:3:EIO,write:2:short,read:5:corrupt,write:4:delay300"
// applies to every file the process opens (each file counts its own pieces).
struct Fault {
    Op op = Op::read;
    std::uint64_t nth = 1;
    int err = 0;
    bool corrupt = false;
    std::uint32_t delay_ms = 0;
};

// Parses ZINF_FAULTS syntax; UsageError naming the bad item.
std::vector<Fault> parse_faults(std::string_view spec);

class File {
public:
    // Opens `path`. With Direct::prefer and a file system that refuses O_DIRECT,
    // falls back to buffered I/O and warns once per file system. With `create`,
    // the last component must not be a symbolic link (O_NOFOLLOW: DataError,
    // 65); beneath a folder, no file opened for writing may be one. A folder
    // is refused with a message that says so.
    static File open(const std::string& path, const OpenOptions& opts = {});
    // Opens `path` for I/O at offsets and lengths that are multiples of
    // `unit` bytes: as open() does, then again buffered (and without
    // `exclusive`: the first open made the file) when direct I/O needs an
    // alignment that does not divide `unit`. With `unit_of` (what sets the
    // unit: "the manifest"), says so once per file.
    static File open_aligned(const std::string& path, OpenOptions opts, std::uint64_t unit,
                             std::string_view unit_of = {});

    File();
    File(File&&) noexcept;
    File& operator=(File&&) noexcept;
    ~File();

    const std::string& path() const;
    int fd() const;
    bool direct() const;
    // Offset and length alignment that I/O on this file must keep (1 when buffered).
    std::size_t alignment() const;
    // Buffer address alignment that I/O on this file must keep (1 when buffered).
    std::size_t memory_alignment() const;
    // The file system's direct-I/O alignment even when this file is buffered:
    // what on-disk layouts should pad to so they work on any file system.
    std::size_t dio_alignment() const;
    std::uint64_t size() const;

    // Reserves `bytes` from offset 0 with fallocate(2); where the file system
    // cannot, extends the file with ftruncate(2) and says so once.
    void preallocate(std::uint64_t bytes);
    void truncate(std::uint64_t bytes);
    void sync();   // fdatasync(2)
    void close();  // close(2), checked; the File is empty afterwards

    void inject_fault(const Fault& fault);
    void clear_faults();

    struct Impl;
    Impl* impl() const { return impl_.get(); }

private:
    std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
struct Ticket {
    std::uint64_t id = 0;
};

struct EngineStats {
    std::uint64_t requests = 0;
    std::uint64_t pieces = 0;
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    std::uint64_t short_retries = 0;   // short transfers finished by resubmitting the rest
    std::uint64_t again_retries = 0;   // EAGAIN/EINTR completions resubmitted
    std::uint64_t fixed_pieces = 0;    // pieces that used a registered buffer
};

class Engine;

// RAII registration of a buffer or a file with the engine's rings (io_uring
// fixed buffers and registered files); released on destruction. Registration is
// an optimisation: an engine that cannot register (threads backend, kernel
// limits) returns an inactive registration and I/O works unchanged. Releasing
// a registration waits for the pieces already cut that use it.
class Registration {
public:
    Registration() = default;
    Registration(Registration&& o) noexcept;
    Registration& operator=(Registration&& o) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration();
    bool active() const { return engine_ != nullptr; }
    void release();

private:
    friend class Engine;
    enum class Kind { buffer, file };
    Registration(Engine* e, Kind k, unsigned slot) : engine_(e), kind_(k), slot_(slot) {}
    Engine* engine_ = nullptr;
    Kind kind_ = Kind::buffer;
    unsigned slot_ = 0;
};

class Engine {
public:
    // Resolves "auto" (uring, else threads) and sets up the rings; what was
    // downgraded is in notes() and logged once.
    explicit Engine(const EngineConfig& cfg);
    // Waits for every request still in flight; an error nobody waited for is
    // logged, never dropped silently.
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // The configuration in effect ("auto" resolved to the backend used).
    const EngineConfig& config() const;
    // Setup downgrades, e.g. "io_uring refused IORING_SETUP_DEFER_TASKRUN".
    const std::string& notes() const;

    // Start a transfer; the span must stay valid until the ticket is waited.
    // Under O_DIRECT, offset, length and buffer address must be aligned
    // (File::alignment, File::memory_alignment) or an IoError (EINVAL) is thrown
    // here, before anything is submitted.
    Ticket read(File& file, std::uint64_t offset, std::span<std::byte> dst);
    Ticket write(File& file, std::uint64_t offset, std::span<const std::byte> src);

    // The same transfers without a ticket: `done` runs on one of the engine's
    // own threads as soon as the request has finished, with nullptr on success
    // or the error. It must be short and must not wait on this engine; it may
    // start new requests, which is how a caller keeps every queue full with no
    // thread hand-off per request. An exception it throws is kept and thrown by
    // wait_all(). wait_all(), sync() and the destructor also wait for these
    // requests and their callbacks, so a chain of callbacks must end. An empty
    // request's callback runs at once, on the calling thread.
    using Done = std::function<void(const IoError* error)>;
    void read_then(File& file, std::uint64_t offset, std::span<std::byte> dst, Done done);
    void write_then(File& file, std::uint64_t offset, std::span<const std::byte> src, Done done);

    // Blocks until the request is complete; throws IoError if any piece failed.
    // Each ticket is waited at most once.
    void wait(Ticket t);
    // True when the request is complete (wait() will not block).
    bool ready(Ticket t);
    // Blocks until at least one of `tickets` is complete and returns its index;
    // the ticket is not consumed: wait() on it then returns (or throws) at once.
    // This is how a caller keeps a fixed number of requests in flight without
    // a slow one holding back those that finished behind it.
    std::size_t wait_any(std::span<const Ticket> tickets);
    // Waits for every request not yet waited, and for every read_then/write_then
    // chain; throws the first error among the ticketed requests (or what a
    // callback threw) after all have finished.
    void wait_all();
    // Waits until this engine has no request in flight on `file` (and no
    // read_then/write_then chain at all), then fdatasync. Not from a callback.
    void sync(File& file);

    Registration register_buffer(std::span<std::byte> buf);
    Registration register_file(File& file);

    EngineStats stats() const;

    struct Impl;

private:
    friend class Registration;
    void unregister(Registration::Kind kind, unsigned slot);
    std::unique_ptr<Impl> impl_;
};

// A folder's bandwidth, bytes/s, as `bytes` written to a scratch file there
// (synced) and read back through `engine`, every request in flight at once;
// the file is removed. A short probe (zinf-train's disk floor when it has
// no zinf-nvmebench figures), not a sweep: IoError or CreateError when the
// folder does not take the file.
struct Bandwidth {
    double read_bps = 0, write_bps = 0;
};
Bandwidth probe_bandwidth(Engine& engine, const std::string& dir, std::uint64_t bytes);
// Fills `mem` with a xorshift stream: data no drive or file system can
// compress, for measurements.
void fill_incompressible(std::span<std::byte> mem);

// True when io_uring can be set up in this process (not refused by seccomp,
// io_uring_disabled, or an old kernel); `why` gets the reason when not.
bool uring_available(std::string* why = nullptr);

}  // namespace zinf::io
