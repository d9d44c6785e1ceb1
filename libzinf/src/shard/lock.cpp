// One writer at a time: flock(2) on a lock file in the data directory and in
// each node-local rank folder (shard.hpp, Lock; zinf(7), LOCKS). The holder
// writes who it is into the file, so that a refused program can say who holds
// it; the kernel drops a dead holder's lock, so nothing is ever stale.
#include <zinf/shard.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zinf::shard {

namespace fs = std::filesystem;

namespace detail {

// One lock file this process holds, shared by every Lock that asked for it.
struct LockHold {
    int fd = -1;
    std::string path;
    LockMode mode = LockMode::shared;
    bool writable = false;
    bool made_file = false;  // this process created the lock file
    std::pair<dev_t, ino_t> key{};
    ~LockHold();
};

}  // namespace detail

namespace {

using detail::LockHold;

// The holds of this process, by lock file identity: a second request for one
// it holds gets the same hold (flock would refuse a second open file of the
// same process).
std::mutex g_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<LockHold>>& registry() {
    static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<LockHold>> r;
    return r;
}

// The holder's record: one JSON line, padded to a fixed size so that the
// holders sharing a lock (readers) overwrite each other whole.
constexpr std::size_t kRecordBytes = 512;

std::string hostname() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
    return buf;
}

// The command line that runs (argv, spaces between), cut to fit the record.
std::string command_line() {
    std::string out;
    const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);  // fault-site: /proc
    if (fd < 0) return out;
    char buf[512];
    const long n = ::read(fd, buf, sizeof buf);  // fault-site: /proc
    ::close(fd);
    for (long i = 0; i < n; ++i) out += buf[i] == '\0' ? ' ' : buf[i];
    while (!out.empty() && out.back() == ' ') out.pop_back();
    if (out.size() > 200) out = out.substr(0, 197) + "...";
    return out;
}

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string record_text(LockMode mode) {
    json::Json j = {{"zinf", "lock"},
                    {"program", log::program()},
                    {"command", command_line()},
                    {"pid", static_cast<long long>(::getpid())},
                    {"host", hostname()},
                    {"mode", mode == LockMode::exclusive ? "exclusive" : "shared"},
                    {"since", utc_now()}};
    std::string text = j.dump(-1, ' ', false, json::Json::error_handler_t::replace);
    if (text.size() > kRecordBytes - 1) {  // a huge host name: the essentials
        j.erase("command");
        text = j.dump(-1, ' ', false, json::Json::error_handler_t::replace).substr(0, kRecordBytes - 1);
    }
    text.resize(kRecordBytes - 1, ' ');
    return text + '\n';
}

void write_record(const LockHold& h) {
    if (!h.writable) return;
    const std::string text = record_text(h.mode);
    std::size_t done = 0;
    while (done < text.size()) {  // through short writes
        const long n = sys::pwrite(h.fd, text.data() + done, text.size() - done, done, h.path);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("write", errno, h.path, done);
        if (n == 0) throw IoError("writing the lock file's holder wrote nothing", {EIO, h.path, done, -1});
        done += static_cast<std::size_t>(n);
    }
}

// Who holds the lock at `path`, as its file records it.
std::string holder_of(int fd, const std::string& path) {
    char buf[kRecordBytes];
    std::size_t got = 0;
    while (got < sizeof buf) {
        const long n = sys::pread(fd, buf + got, sizeof buf - got, got, path);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
    }
    std::string text(buf, got);
    if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
    try {
        const json::Json j = json::Json::parse(text);
        const std::string program = j.value("program", std::string("?"));
        const std::string command = j.value("command", std::string());
        const std::string host = j.value("host", std::string("?"));
        const long long pid = j.value("pid", 0LL);
        std::string who = program + " (pid " + std::to_string(pid) + " on " + host + ", " +
                          j.value("mode", std::string("?")) + " since " + j.value("since", std::string("?"));
        if (!command.empty()) who += ": " + command;
        who += ")";
        if (host == hostname() && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
            who += ", as the lock file last recorded it; that process is gone, so another one (a reader, or a "
                   "child that inherited the lock) holds it now";
        return who;
    } catch (const std::exception&) {
        return "another process (the lock file does not say which)";
    }
}

std::pair<dev_t, ino_t> identity(const struct stat& st) { return {st.st_dev, st.st_ino}; }

// Creates `folder` and its missing parents; the ones made go to `made`
// (outermost first).
void make_folders(const std::string& folder, std::vector<std::string>& made) {
    std::vector<std::string> missing;
    for (fs::path p = fs::absolute(folder); !p.empty(); p = p.parent_path()) {
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0) break;
        missing.push_back(p.string());
        if (p == p.parent_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (sys::mkdir(*it, 0777) == 0) made.push_back(*it);
        else if (errno != EEXIST) throw_errno("mkdir", errno, *it, {}, true);
    }
}

}  // namespace

detail::LockHold::~LockHold() {
    {
        std::lock_guard lk(g_mu);
        auto it = registry().find(key);
        if (it != registry().end() && it->second.expired()) registry().erase(it);
    }
    if (fd >= 0) ::close(fd);  // drops the flock: this was its only open file
}

Lock::Lock() = default;
Lock::~Lock() { release(); }
Lock::Lock(Lock&& o) noexcept : holds_(std::move(o.holds_)), made_dirs_(std::move(o.made_dirs_)) {
    o.holds_.clear();
    o.made_dirs_.clear();
}
Lock& Lock::operator=(Lock&& o) noexcept {
    if (this != &o) {
        release();
        holds_ = std::move(o.holds_);
        made_dirs_ = std::move(o.made_dirs_);
        o.holds_.clear();
        o.made_dirs_.clear();
    }
    return *this;
}

std::vector<std::string> Lock::paths() const {
    std::vector<std::string> out;
    for (const auto& h : holds_) out.push_back(h->path);
    return out;
}

void Lock::add(Lock&& o) {
    for (auto& h : o.holds_) holds_.push_back(std::move(h));
    for (auto& d : o.made_dirs_) made_dirs_.push_back(std::move(d));
    o.holds_.clear();
    o.made_dirs_.clear();
}

void Lock::release() noexcept {
    holds_.clear();
    made_dirs_.clear();
}

void Lock::keep() noexcept {
    made_dirs_.clear();
    for (auto& h : holds_) h->made_file = false;
}

void Lock::remove_made_files() noexcept {
    // Only a file this process made and holds alone, exclusively: no other
    // process can be holding it, and one that opened it in the meantime
    // finds it unlinked after its flock and tries again (lock_folder).
    for (auto& h : holds_)
        if (h->made_file && h->mode == LockMode::exclusive && h.use_count() == 1) {
            ::unlink(h->path.c_str());
            h->made_file = false;
        }
}

void Lock::abandon() noexcept {
    remove_made_files();
    holds_.clear();
    std::vector<std::string> dirs = std::move(made_dirs_);
    made_dirs_.clear();
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());  // deepest first, when empty
}

Lock lock_folder(const std::string& folder, LockMode mode, bool make) {
    Lock out;
    std::vector<std::string> made;
    if (make) make_folders(folder, made);
    const std::string path = (folder.empty() ? std::string(".") : folder) + "/" + kLockFile;
    const bool exclusive = mode == LockMode::exclusive;
    for (int attempt = 0;; ++attempt) {
        bool made_file = false, writable = true;
        int fd = sys::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0 && errno == ENOENT) {
            fd = sys::open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
            if (fd >= 0) made_file = true;
            else if (errno == EEXIST && attempt < 8) continue;  // made by another just now
        }
        if (fd < 0 && !exclusive && (errno == EACCES || errno == EROFS || errno == EPERM)) {
            // A reader of a folder it cannot write: the lock as it is, or none
            // when there is no lock file (nobody who could write has run there).
            writable = false;
            fd = sys::open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            if (fd < 0 && (errno == ENOENT || errno == EACCES)) return out;
        }
        if (fd < 0) {
            const int err = errno;
            if (err == ELOOP)
                throw DataError("the lock file is a symbolic link: zinf writes no file through a link", {err, path, {}, -1});
            // A folder in its place is bad data, as a FIFO there is (below).
            if (err == EISDIR) throw DataError("the lock file is a folder, not a regular file", {0, path, {}, -1});
            // A reader of a folder that is not there: the read that follows says so.
            if (!exclusive && !make && (err == ENOENT || err == ENOTDIR)) return out;
            throw_errno("open", err, path, {}, make);
        }
        Fd guard(fd);
        struct stat st {};
        if (::fstat(fd, &st) != 0) throw_errno("fstat", errno, path);
        if (!S_ISREG(st.st_mode)) throw DataError("the lock file is not a regular file", {0, path, {}, -1});
        const auto key = identity(st);
        std::shared_ptr<LockHold> hold;
        {
            std::lock_guard lk(g_mu);
            auto it = registry().find(key);
            if (it != registry().end()) hold = it->second.lock();
        }
        if (hold) {  // this process holds it already
            if (exclusive && hold->mode == LockMode::shared) {
                if (::flock(hold->fd, LOCK_EX | LOCK_NB) != 0) {
                    if (errno == EWOULDBLOCK)
                        throw LockedError("in use by " + holder_of(fd, path) +
                                              ": this process reads it and cannot also write it while another "
                                              "reads it (zinf(7), LOCKS)",
                                          {0, path, {}, -1});
                    throw_errno("flock", errno, path);
                }
                hold->mode = LockMode::exclusive;
                write_record(*hold);
            }
            out.holds_.push_back(hold);
            out.made_dirs_ = std::move(made);
            return out;
        }
        int rc;
        do rc = ::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB);
        while (rc != 0 && errno == EINTR);
        if (rc != 0) {
            if (errno != EWOULDBLOCK) throw_errno("flock", errno, path);
            const std::string who = holder_of(fd, path);
            for (auto d = made.rbegin(); d != made.rend(); ++d) ::rmdir(d->c_str());
            throw LockedError("in use by " + who + ": " +
                                  (exclusive ? "one program writes a data directory at a time, and none while "
                                               "another reads it"
                                             : "nothing reads a data directory while a program writes it") +
                                  "; try again once it has finished (a holder that dies releases the lock at "
                                  "once; zinf(7), LOCKS)",
                              {0, path, {}, -1});
        }
        // The file may have been removed (a failed writer's abandon()) between
        // our open and our flock: then the lock is on a name nobody else sees.
        struct stat now {};
        if (::stat(path.c_str(), &now) != 0 || identity(now) != key) {
            if (attempt < 8) continue;
            throw LockedError("the lock file keeps changing under this process; try again",
                              {0, path, {}, -1});
        }
        hold = std::make_shared<LockHold>();
        hold->fd = guard.release();
        hold->path = path;
        hold->mode = mode;
        hold->writable = writable;
        hold->made_file = made_file;
        hold->key = key;
        write_record(*hold);
        {
            std::lock_guard lk(g_mu);
            registry()[key] = hold;
        }
        out.holds_.push_back(std::move(hold));
        out.made_dirs_ = std::move(made);
        return out;
    }
}

Lock lock_state(const Manifest& m, LockMode mode, const std::vector<unsigned>& ranks, const std::string& dir,
                bool make) {
    Lock out;
    const std::string d = dir.empty() ? m.dir : dir;
    const bool rank0 = ranks.empty() || std::find(ranks.begin(), ranks.end(), 0u) != ranks.end();
    try {
        if (rank0 && !d.empty()) out.add(lock_folder(d, mode, make));
        if (!m.rank_dirs.empty()) {
            std::vector<unsigned> mine = ranks;
            if (mine.empty())
                for (unsigned r = 0; r < m.rank_dirs.size(); ++r) mine.push_back(r);
            for (unsigned r : mine)
                if (r < m.rank_dirs.size()) {
                    // A writer's node-local folder is made (and checked) by the
                    // writer itself; one that exists is locked now.
                    struct stat st {};
                    if (::lstat(m.rank_dirs[r].c_str(), &st) == 0 && S_ISDIR(st.st_mode))
                        out.add(lock_folder(m.rank_dirs[r], mode, false));
                }
        }
    } catch (...) {
        out.abandon();
        throw;
    }
    return out;
}

void check_target(const std::string& dir, bool force) {
    const std::string m = dir + "/manifest.jsonl";
    struct stat st {};
    if (::lstat(m.c_str(), &st) == 0 && !force)
        throw CreateError(dir + " already holds a manifest (manifest.jsonl); give --force to replace it "
                                "(the old state stays intact until the new one is complete)");
}

}  // namespace zinf::shard
