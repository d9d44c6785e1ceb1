// zinf util: errors, exit codes, sizes, RAII kernel handles, aligned memory,
// logging and progress on stderr, timers, JSON and xxh3 helpers.
//
// Nothing in libzinf exits or writes to stdout; failures are exceptions derived
// from zinf::Error, and only a program's main turns them into a message and an
// exit code (see exit_code()).
#pragma once

#include <bit>
#include <chrono>
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace zinf {

// ---------------------------------------------------------------------------
// Exit codes (sysexits-style), shared by every program.
namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int usage = 64;        // bad command line
inline constexpr int data = 65;         // bad input data: manifest, checksum, verify mismatch
inline constexpr int no_input = 66;     // missing input file
inline constexpr int internal = 70;     // a bug in zinf
inline constexpr int cant_create = 73;  // cannot create output (exists, no space, no permission)
inline constexpr int io = 74;           // I/O error while reading or writing
inline constexpr int threshold = 75;    // a benchmark --min-* threshold was not met
// EX_TEMPFAIL, as the threshold: nothing is wrong with the input, a later try
// may succeed. The data directory is in use: another program holds its lock
// (zinf(7), LOCKS). No program can give both (the benchmarks lock nothing).
inline constexpr int locked = 75;
inline constexpr int interrupted = 130; // SIGINT
}  // namespace exit_code

// Set by cli::run when a program ends on an error, so that what would wait
// for peers at exit (MPI_Finalize) leaves at once instead: the launcher then
// stops the other ranks rather than leaving them waiting on this one.
void mark_failing() noexcept;
bool failing() noexcept;

// ---------------------------------------------------------------------------
// Errors. Every zinf error carries what is known of errno, path, offset, rank;
// what() is the full message, already naming them.
struct ErrorWhere {
    int err = 0;                          // errno, 0 when not a system error
    std::string path;                     // file the error concerns, if any
    std::optional<std::uint64_t> offset;  // byte offset in that file, if any
    int rank = -1;                        // data-parallel rank, -1 when not known
};

class Error : public std::runtime_error {
public:
    using Where = ErrorWhere;

    explicit Error(const std::string& msg, Where where = {});

    int err() const noexcept { return where_.err; }
    const std::string& path() const noexcept { return where_.path; }
    std::optional<std::uint64_t> offset() const noexcept { return where_.offset; }
    int rank() const noexcept { return where_.rank; }
    // The message without the path/offset/errno decoration.
    const std::string& message() const noexcept { return msg_; }
    virtual int exit_code() const noexcept { return exit_code::internal; }

private:
    std::string msg_;
    Where where_;
};

#define ZINF_ERROR_KIND(Name, code)                                     \
    class Name : public Error {                                         \
    public:                                                             \
        using Error::Error;                                             \
        int exit_code() const noexcept override { return code; }       \
    }

ZINF_ERROR_KIND(UsageError, exit_code::usage);         // bad option or argument value
ZINF_ERROR_KIND(DataError, exit_code::data);           // malformed or corrupt input data
ZINF_ERROR_KIND(MissingInputError, exit_code::no_input);
ZINF_ERROR_KIND(CreateError, exit_code::cant_create);
// One rule for output that cannot be written (zinf(7)): no space, no quota
// and a read-only file system are 73 whatever the call that met them
// (statvfs up front, open, fallocate, a write, standard output); every other
// failed read or write is 74.
class IoError : public Error {
public:
    using Error::Error;
    int exit_code() const noexcept override;
};
ZINF_ERROR_KIND(ThresholdError, exit_code::threshold);
ZINF_ERROR_KIND(LockedError, exit_code::locked);  // the message names the holder
ZINF_ERROR_KIND(InternalError, exit_code::internal);
ZINF_ERROR_KIND(Interrupted, exit_code::interrupted);
#undef ZINF_ERROR_KIND

// Throws the error kind that fits errno after a failed system call on `path`:
// ENOENT -> MissingInputError, EEXIST/ENOSPC/EACCES/EROFS on create -> CreateError,
// anything else -> IoError. `call` names the system call ("open", "pread").
[[noreturn]] void throw_errno(std::string_view call, int err, const std::string& path = {},
                              std::optional<std::uint64_t> offset = {}, bool creating = false);

// ---------------------------------------------------------------------------
// Sizes and durations.
//
// parse_size: "4096", "512k", "1M", "4GiB", "2T" are binary (k = 1024);
// "1kB", "5MB", "2GB", "1TB" are decimal; a trailing "B" or "iB" is optional for
// binary units. Throws UsageError naming the text on anything else or overflow.
std::uint64_t parse_size(std::string_view text);
// 1048576 -> "1MiB", 1536 -> "1.5KiB", 1000 -> "1000B": the shortest exact binary
// form when there is one, else one decimal; in units parse_size reads (up to
// TiB: 2^50 is "1024TiB").
std::string format_size(std::uint64_t bytes);
// "10s", "500ms", "2m", "1h", "250us", plain number = seconds (may be fractional).
std::chrono::nanoseconds parse_duration(std::string_view text);

inline constexpr std::uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
constexpr bool is_aligned(std::uint64_t v, std::uint64_t a) { return v % a == 0; }
inline bool is_aligned(const void* p, std::uint64_t a) {
    return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}
constexpr bool is_pow2(std::uint64_t v) { return v && !(v & (v - 1)); }

// ---------------------------------------------------------------------------
// The first call of every program's main: a standard descriptor (0, 1 or 2)
// that is closed at start (`zinf-train ... >&-`) is opened on /dev/null, so
// that the first file the program opens (a lock file, a data file) never
// becomes its stdout and receives what it prints. Returns 0, or 74 (after a
// message on stderr, where that is open, naming `program`) when /dev/null
// cannot be opened; main returns that status.
int open_standard_fds(const char* program) noexcept;
// Standard output flushed (std::cout, then C's stdout) and checked: a full
// disk, a closed pipe or a descriptor not open for writing is an IoError
// naming stdout with its errno (73 for no space or quota, else 74), never
// a run that exits 0 having lost its output.
void flush_stdout();

// ---------------------------------------------------------------------------
// RAII kernel handles. Move-only; factories are named after the system call;
// each method wraps one call and throws with its name on failure.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) noexcept : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(o.release()) {}
    Fd& operator=(Fd&& o) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();  // closes quietly: call close() yourself after writing

    // open(2); throws MissingInputError/CreateError/IoError naming `path`.
    static Fd open(const std::string& path, int flags, unsigned mode = 0666);

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept { int f = fd_; fd_ = -1; return f; }
    // close(2), checked: a failed close after writing is an I/O error.
    void close(const std::string& path_for_errors = {});

private:
    int fd_ = -1;
};

// An unpredictable name beside `path` for a temporary: `path`, `tag` and
// 16 hex digits from getrandom(2) ("rank0/param.bin.zinf-tmp.3f9c..."), so
// that nobody can plant a link at it beforehand. Create it with
// O_CREAT|O_EXCL|O_NOFOLLOW.
std::string temp_name(const std::string& path, std::string_view tag);

// open(2) of `rel` resolved beneath the folder `root` (openat2 with
// RESOLVE_BENEATH, or on a kernel without it the same check made on the
// opened file): a symbolic link or ".." that leads outside `root` is refused;
// with O_CREAT or for writing, the last component must not be a link
// (O_NOFOLLOW). Returns the descriptor, or -errno (EXDEV: it leads outside,
// ELOOP: a link where a file is written).
int open_beneath_raw(const std::string& root, const std::string& rel, int flags, unsigned mode) noexcept;
// The error for a failed open_beneath_raw: DataError (65) naming the path
// for EXDEV and for a link where a file is written, else throw_errno's kind.
[[noreturn]] void throw_open_beneath(int err, const std::string& root, const std::string& rel, int flags);
// open_beneath_raw, throwing; `root`/`rel` name the file in messages.
Fd open_beneath(const std::string& root, const std::string& rel, int flags, unsigned mode = 0666);

// Opens an input for reading without ever blocking in open(2), as opening a
// FIFO with no writer would, and checks what it is. A folder is refused
// (DataError naming it). `regular`: anything but a regular file is refused
// (DataError: a FIFO, a device, a socket). `stream`: a FIFO, pipe or
// character device is taken too, after waiting with poll(2) until its writer
// has written or gone; a signal ends the wait (Interrupted, 130), so SIGINT
// and SIGTERM are honoured even with handlers that only set a flag.
enum class Input { regular, stream };
Fd open_input(const std::string& path, Input kind);
// The flag a program's signal handlers set (SIGINT, SIGTERM, SIGHUP), or
// nullptr. open_input's wait for a stream's writer also ends (Interrupted)
// when it is set: a signal that lands after the handler is installed but
// before poll(2) starts sets the flag and no EINTR ever comes.
void watch_stop_flag(const std::atomic<bool>* flag) noexcept;
// A std::istream over open_input(path, Input::stream), for line readers.
std::unique_ptr<std::istream> input_stream(const std::string& path);
// The whole of a regular file (open_input(path, Input::regular): a FIFO or
// a folder is refused at once) of at most `max` bytes: a larger one is a
// DataError naming it and `what` ("a Hugging Face index"), before anything
// is read. For inputs parsed whole (a JSON index, a SentencePiece model).
std::string read_regular(const std::string& path, std::uint64_t max, const std::string& what);

// fsync(2) of a folder, so that names created or renamed in it survive a
// crash ("" is the current folder); IoError naming it on failure.
void fsync_dir(const std::string& dir);

// Removes the regular files writers killed half-way left under
// temp_name(path, tag) (exactly `path`, `tag` and 16 hex digits): garbage,
// never state, so errors are ignored. write_file_atomic calls it after its
// rename, so a commit that a SIGKILL interrupted before its rename leaves
// nothing behind once the next commit of the same file is done; a writer
// that locks a data directory calls it on the manifest at once.
void remove_stale_temps(const std::string& path, std::string_view tag) noexcept;

// Writes `pieces`, one after another, as the whole of `path`, complete or not
// at all: a temporary beside it under an unpredictable name (temp_name,
// "<path>.tmp.<16 hex>", created O_EXCL|O_NOFOLLOW), fsync, rename over
// `path`, fsync of the folder. The new file keeps the mode of the regular
// file it replaces; a new one gets 0666 less the umask. The temporary is
// removed on failure.
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces);

// The same, written as it comes: for outputs too large to hold (a token file
// of a whole corpus). create() opens the temporary; write() appends through
// short writes, pwrite() rewrites bytes already written (a header whose
// counts are known only at the end), truncate() cuts it; commit() makes it
// `path` (fsync, rename, fsync of the folder). Destroyed or moved-over
// uncommitted, the temporary is removed and `path` is untouched.
class AtomicFile {
public:
    AtomicFile();
    static AtomicFile create(const std::string& path);
    AtomicFile(AtomicFile&& o) noexcept;
    AtomicFile& operator=(AtomicFile&& o) noexcept;
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile();

    void write(std::span<const std::byte> bytes);
    void pwrite(std::span<const std::byte> bytes, std::uint64_t offset);
    // pread of what was written; IoError at a short read.
    void pread(std::span<std::byte> bytes, std::uint64_t offset) const;
    void truncate(std::uint64_t bytes);
    // Starts an fdatasync of what is written so far on a thread of its own,
    // and returns true; false while the last one still runs. The writer
    // goes on meanwhile, and commit()'s fsync waits only for what came after
    // it (on this VM's disk, 40 MB took 35 ms to sync, the 8 MB after it 8 ms).
    // Its failure is commit()'s.
    bool sync_behind();
    void commit();
    std::uint64_t size() const noexcept { return size_; }  // bytes written so far
    const std::string& path() const noexcept { return path_; }

private:
    struct Behind;
    void abandon() noexcept;
    int join_behind() noexcept;  // 0, or the errno of the sync behind
    std::string path_, tmp_;
    Fd fd_;
    std::uint64_t size_ = 0;
    std::unique_ptr<Behind> behind_;
};

class Mmap {
public:
    Mmap() = default;
    Mmap(Mmap&& o) noexcept;
    Mmap& operator=(Mmap&& o) noexcept;
    Mmap(const Mmap&) = delete;
    Mmap& operator=(const Mmap&) = delete;
    ~Mmap();

    // Which pages back an anonymous mapping. `huge` asks for transparent huge
    // pages (MADV_HUGEPAGE) on a 2MiB-aligned range: fewer pages to pin, one
    // DMA segment per 2MiB instead of per 4KiB; a kernel without THP gives
    // small pages. `small` refuses them (MADV_NOHUGEPAGE), for comparisons.
    enum class Pages { any, huge, small };
    static constexpr std::size_t kHugePage = 2 * 1024 * 1024;

    // Private anonymous mapping; `populate` pre-faults it, so first use pays no
    // page faults.
    static Mmap anonymous(std::size_t bytes, bool populate = false, Pages pages = Pages::any);
    // Shared read-only mapping of a whole file.
    static Mmap file_readonly(const Fd& fd, std::size_t bytes, const std::string& path);

    std::span<std::byte> bytes() const noexcept { return {static_cast<std::byte*>(addr_), len_}; }
    std::byte* data() const noexcept { return static_cast<std::byte*>(addr_); }
    std::size_t size() const noexcept { return len_; }
    // mlock(2); returns the errno on failure instead of throwing, because callers
    // degrade (run unlocked and say so) rather than fail.
    int lock() noexcept;
    bool locked() const noexcept { return locked_; }

private:
    void* addr_ = nullptr;
    std::size_t len_ = 0;
    bool locked_ = false;
};

// A zero-filled buffer aligned to `align` (a power of two); page-aligned memory
// from mmap so that any direct-I/O alignment is met, populated, and on
// transparent huge pages from 2MiB up.
class AlignedBuffer {
public:
    AlignedBuffer() = default;
    static AlignedBuffer allocate(std::size_t bytes, std::size_t align = 4096);
    std::span<std::byte> bytes() const noexcept { return map_.bytes().first(size_); }
    std::byte* data() const noexcept { return map_.data(); }
    std::size_t size() const noexcept { return size_; }
    // mlock(2) of the whole buffer; the errno on failure (see Mmap::lock).
    int lock() noexcept { return map_.lock(); }

private:
    Mmap map_;
    std::size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// bf16: the top half of an fp32, rounded to nearest even; a NaN stays a (quiet)
// NaN instead of rounding into infinity. One definition for every module.
std::uint16_t to_bf16(float v);
// Exact: the bf16 is the top half of the fp32. Inline, so that a loop over it
// vectorises.
inline float from_bf16(std::uint16_t v) { return std::bit_cast<float>(std::uint32_t{v} << 16); }
// out[i] = to_bf16(in[i]) and out[i] = from_bf16(in[i]), vectorised;
// out.size() >= in.size().
void to_bf16(std::span<const float> in, std::span<std::uint16_t> out);
void from_bf16(std::span<const std::uint16_t> in, std::span<float> out);

// ---------------------------------------------------------------------------
// Logging: stderr only, one line per call, prefixed with the program name.
enum class LogLevel { quiet = 0, warn = 1, info = 2, debug = 3 };

namespace log {
void set_program(std::string name);  // "zinf-nvmebench"
const std::string& program();
void set_level(LogLevel level);
LogLevel level();
void warn(const std::string& msg);
void info(const std::string& msg);
void debug(const std::string& msg);
// Warns only the first time `key` is seen in this process.
void warn_once(const std::string& key, const std::string& msg);
// Serialises writers to stderr (the progress bar shares it).
std::mutex& stderr_mutex();
}  // namespace log

// Progress bar on stderr: drawn only when stderr is a TTY and the log level is
// info or louder; otherwise every method is a no-op. Thread-safe `advance`.
// With `items` ("tokens"): the count of them beside the bytes, set by
// update(), and the rate in MB/s; a total of 0 (a pipe's) draws no bar.
class Progress {
public:
    Progress(std::string label, std::uint64_t total_bytes, std::string items = {});
    ~Progress();  // erases the bar
    void advance(std::uint64_t bytes);
    void update(std::uint64_t bytes_done, std::uint64_t items_done);
    void finish();
    static bool enabled();

private:
    void draw(bool force);
    std::string label_;
    std::uint64_t total_;
    std::string items_;
    std::uint64_t done_ = 0, items_done_ = 0;
    bool active_;
    std::chrono::steady_clock::time_point start_, last_draw_;
    std::mutex mu_;
};

// ---------------------------------------------------------------------------
class Timer {
public:
    Timer() : t0_(std::chrono::steady_clock::now()) {}
    void reset() { t0_ = std::chrono::steady_clock::now(); }
    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }

private:
    std::chrono::steady_clock::time_point t0_;
};

// This process's resident memory now (VmRSS) and its peak so far (VmHWM), in
// bytes, from /proc/self/status; 0 where it cannot be read.
std::uint64_t resident_bytes();
std::uint64_t peak_resident_bytes();
// A /proc/meminfo figure ("MemTotal", "MemAvailable") in bytes; 0 where it
// cannot be read.
std::uint64_t meminfo_bytes(std::string_view key);
// The CPUs this process may run on (sched_getaffinity), at least 1.
unsigned affinity_cpus();
// A thread count asked for on the command line (`option`, "--threads"):
// UsageError above kThreadsPerCpu times the CPUs this machine has. More only
// wait for each other, and OpenMP cannot start tens of thousands: libgomp
// exits 1 or dies inside a parallel region where no error can be caught.
inline constexpr unsigned kThreadsPerCpu = 4;
void check_thread_count(unsigned threads, std::string_view option);
// The median of a benchmark's rounds (the mean of the middle two of an even
// count; 0 of none).
double median(std::vector<double> v);

// ---------------------------------------------------------------------------
// JSON helpers over nlohmann-json.
// Only the declarations are here (json_fwd.hpp): nlohmann/json is 50k lines,
// so a file that reads or builds JSON includes <nlohmann/json.hpp> itself.
namespace json {
using Json = nlohmann::json;
// One JSON value held by pointer, for public structs that keep one (a
// manifest's unknown keys) without making every includer compile the whole of
// nlohmann/json. A value, not a reference: copies copy. Defaults to {}; a
// moved-from Value may only be assigned to or destroyed.
class Value {
public:
    Value();
    Value(const Json& v);  // NOLINT: converts, as a Json would
    Value(Json&& v);       // NOLINT
    Value(const Value& o);
    Value(Value&& o) noexcept;
    Value& operator=(const Value& o);
    Value& operator=(Value&& o) noexcept;
    ~Value();
    Json& operator*() noexcept { return *v_; }
    const Json& operator*() const noexcept { return *v_; }
    Json* operator->() noexcept { return v_.get(); }
    const Json* operator->() const noexcept { return v_.get(); }
    friend bool operator==(const Value& a, const Value& b);

private:
    std::unique_ptr<Json> v_;
};
// One compact record and a newline, as JSON Lines want.
std::string line(const Json& record);
// What a parse of untrusted JSON (a manifest, a safetensors header, an index
// or configuration file) may build: nesting deeper than `depth` or more than
// `values` values in all is refused before it is built (a 100 MiB header of
// nested arrays made gigabytes), and so is a key twice in one object (which
// nlohmann would take the last of).
struct ParseLimits {
    unsigned depth = 32;
    std::uint64_t values = std::uint64_t{1} << 22;
};
// Json::parse under `limits`: DataError (no path: the caller adds it) for
// a limit passed or a key twice; nlohmann's parse_error and out_of_range for
// text that is not JSON, as Json::parse.
Json parse_untrusted(std::string_view text, const ParseLimits& limits = {});
// Parses one JSON Lines record; DataError names `source` and the 1-based line.
Json parse_line(std::string_view text, const std::string& source, std::size_t line_no);
// Reads every non-blank line of a JSON Lines stream.
std::vector<Json> read_lines(std::istream& in, const std::string& source);
// Typed field access that names the key, the record's source and line on error.
std::uint64_t get_u64(const Json& obj, const std::string& key, const std::string& where);
std::string get_string(const Json& obj, const std::string& key, const std::string& where);
}  // namespace json

// ---------------------------------------------------------------------------
// xxh3 (64-bit) helpers over xxHash.
std::uint64_t xxh3(std::span<const std::byte> data, std::uint64_t seed = 0);
std::string hex64(std::uint64_t v);  // 16 lower-case hex digits
// Parses hex64's output; DataError on anything else.
std::uint64_t parse_hex64(std::string_view text);

class Xxh3Stream {
public:
    explicit Xxh3Stream(std::uint64_t seed = 0);
    ~Xxh3Stream();
    Xxh3Stream(const Xxh3Stream&) = delete;
    Xxh3Stream& operator=(const Xxh3Stream&) = delete;
    void update(std::span<const std::byte> data);
    std::uint64_t digest() const;

private:
    void* state_;
};

// ---------------------------------------------------------------------------
// File-system calls. Every open, read, write, fsync, rename, fallocate,
// truncate, mkdir and checked close that libzinf and the programs make goes
// through these (tests/e2e/faults.sh refuses a raw call outside
// libzinf/src/util/sys.cpp), so that each is a named I/O site a test can find
// and fail. They behave as the system calls do: a result, or -1 with errno.
// (An O_PATH open moves no data and only resolves a name: it is no site.)
//
// For tests, two environment variables:
//   ZINF_FAULT_TRACE=FILE  appends "kind<TAB>path" to FILE the first time
//                          this process meets each site (random temporary
//                          suffixes written "*"), listing what a run touches;
//   ZINF_FAULT_SITE=KIND:HOW:PATH  makes the first call of that kind on that
//                          path (as the trace spells it) fail with HOW, one of
//                          EIO, ENOSPC, or "short": a read or write that
//                          moves half of what was asked (the caller must
//                          finish the rest).
namespace sys {
enum class Kind { open, read, write, fsync, rename, fallocate, truncate, mkdir, close };
const char* kind_name(Kind k);
// What the site says before a call: 0 go ahead, an errno to fail with, or
// kShort (reads and writes only).
inline constexpr int kShort = -1;
int site(Kind kind, const std::string& path) noexcept;
// True when ZINF_FAULT_TRACE or ZINF_FAULT_SITE is set (checked once).
bool watched() noexcept;

int open(const std::string& path, int flags, unsigned mode = 0) noexcept;
// openat(2) of `rel` in `dir_fd`; `path` names the file for the site.
int openat(int dir_fd, const std::string& rel, int flags, unsigned mode, const std::string& path) noexcept;
// openat2(2) with its resolve flags; -1/errno (ENOSYS where the kernel lacks it).
long openat2(int dir_fd, const std::string& rel, int flags, unsigned mode, std::uint64_t resolve,
             const std::string& path) noexcept;
long read(int fd, void* buf, std::size_t n, const std::string& path) noexcept;
long pread(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& path) noexcept;
long write(int fd, const void* buf, std::size_t n, const std::string& path) noexcept;
long pwrite(int fd, const void* buf, std::size_t n, std::uint64_t offset, const std::string& path) noexcept;
int fsync(int fd, const std::string& path) noexcept;
int fdatasync(int fd, const std::string& path) noexcept;
// The site is the destination: what a failed rename leaves unchanged.
int rename(const std::string& from, const std::string& to) noexcept;
// renameat2(2) RENAME_EXCHANGE: `a` and `b` swap names, atomically (EINVAL
// where the file system cannot); the site is `b`.
int exchange(const std::string& a, const std::string& b) noexcept;
int fallocate(int fd, std::uint64_t bytes, const std::string& path) noexcept;
int ftruncate(int fd, std::uint64_t bytes, const std::string& path) noexcept;
int mkdir(const std::string& path, unsigned mode) noexcept;
int close(int fd, const std::string& path) noexcept;
}  // namespace sys

// The library's version, from the Makefile.
const char* version();

}  // namespace zinf
