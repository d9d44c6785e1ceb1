// Committing what init and reshard wrote: the temporaries renamed into
// place beside a committed state (place_beside names them so that the old
// manifest's files are never touched), the placed files taken back when the
// manifest cannot be committed, the old state's files retired once it is;
// the same over several processes (init_ranks); and the check that a
// manifest's paths stay beneath its data directory.
#include <zinf/comm.hpp>
#include <zinf/shard.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <sys/stat.h>
#include <unistd.h>

namespace zinf::shard {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
void Written::commit() {
    std::set<std::string> dirs;
    for (std::size_t i = 0; i < temps.size(); ++i) {
        if (sys::rename(temps[i], finals[i]) != 0) {
            const int err = errno;
            const std::string failed = finals[i];  // discard() clears finals
            // The names are new ones beside the committed state
            // (place_beside): what was renamed so far goes with the rest.
            for (std::size_t j = 0; j < i; ++j) ::unlink(finals[j].c_str());
            discard();
            throw_errno("rename", err, failed);
        }
        dirs.insert(fs::path(finals[i]).parent_path().string());
    }
    for (const auto& f : dirs) fsync_dir(f);
    placed = std::move(finals);
    temps.clear();
    finals.clear();
    folders.clear();
    lock.keep();  // the folders it made hold the new files
}

void Written::unplace() noexcept {
    for (const auto& f : placed) ::unlink(f.c_str());
    placed.clear();
}

void Written::retire() noexcept {
    for (const auto& f : superseded)
        if (::unlink(f.c_str()) != 0 && errno != ENOENT)
            log::warn(f + ": the committed manifest no longer names it, but it cannot be removed: " +
                      std::strerror(errno));
    superseded.clear();
    placed.clear();
}

Written::Written(Written&& o) noexcept
    : lock(std::move(o.lock)),
      temps(std::move(o.temps)), finals(std::move(o.finals)), folders(std::move(o.folders)),
      placed(std::move(o.placed)), superseded(std::move(o.superseded)) {
    o.temps.clear();
    o.finals.clear();
    o.folders.clear();
    o.placed.clear();
    o.superseded.clear();
}

Written& Written::operator=(Written&& o) noexcept {
    if (this != &o) {
        discard();
        lock = std::move(o.lock);
        temps = std::move(o.temps);
        finals = std::move(o.finals);
        folders = std::move(o.folders);
        placed = std::move(o.placed);
        superseded = std::move(o.superseded);
        o.temps.clear();
        o.finals.clear();
        o.folders.clear();
        o.placed.clear();
        o.superseded.clear();
    }
    return *this;
}

void Written::discard() noexcept {
    for (const auto& t : temps) ::unlink(t.c_str());
    lock.remove_made_files();  // a rank folder this run made holds its lock file
    std::sort(folders.begin(), folders.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    for (const auto& d : folders) ::rmdir(d.c_str());  // only when empty
    temps.clear();
    finals.clear();
    folders.clear();
    lock.abandon();  // and the data directory, when this run made it
}

namespace {

// The manifest's identity on disk, to tell after a failed save whether its
// rename happened (then the new state is committed and must be kept).
std::pair<dev_t, ino_t> identity(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return {0, 0};
    return {st.st_dev, st.st_ino};
}

// Commits `m` over whatever manifest `path` holds. The files are in place
// under names the old manifest does not name (place_beside), so the old
// state is whole until the rename inside save_manifest replaces it: a
// failure or a kill before that leaves it committed, and what was placed
// goes. After it, the old state's files go (the caller's retire()).
void save_placed(Written& w, const Manifest& m, const std::string& path) {
    const auto before = identity(path);
    try {
        save_manifest(m, path);
    } catch (...) {
        if (identity(path) == before) w.unplace();
        throw;
    }
}

// Every process learns whether any failed; on a failure each removes what
// it wrote before the error leaves (comm::agree).
void agree(comm::Communicator& c, const std::exception_ptr& failed, Written* w = nullptr,
           const char* outcome = "nothing was committed") {
    try {
        comm::agree(c, failed, outcome);
    } catch (...) {
        if (w) w->discard();
        throw;
    }
}

// Process 0's manifest, with the names beside an old state set (the same
// for every process), to every process.
Manifest share(comm::Communicator& c, const std::function<Manifest()>& prepare, const std::string& dir) {
    std::string text;
    std::exception_ptr failed;
    if (c.rank() == 0) try {
            Manifest m = prepare();
            (void)place_beside(m, dir);
            std::ostringstream s;
            write_manifest(s, m);
            text = s.str();
        } catch (...) {
            failed = std::current_exception();
        }
    agree(c, failed);
    std::int64_t size = static_cast<std::int64_t>(text.size());
    c.broadcast(std::as_writable_bytes(std::span(&size, 1)), comm::DType::i64, 0);
    text.resize(static_cast<std::size_t>(size));
    c.broadcast(std::as_writable_bytes(std::span(text.data(), text.size())), comm::DType::u8, 0);
    std::istringstream in(text);
    return read_manifest(in, "<the manifest from rank 0>");
}

// Every partition's xxh3, gathered by process in manifest order: process p
// hashed the ranks r with r % N == p.
void gather_hashes(comm::Communicator& c, Manifest& m) {
    const auto procs = static_cast<unsigned>(c.size()), me = static_cast<unsigned>(c.rank());
    const auto owner = [&](const Partition& p) { return p.rank % procs; };
    std::vector<std::int64_t> mine, all(m.parts.size());
    std::vector<std::uint64_t> counts(procs);
    for (const auto& p : m.parts) {
        ++counts[owner(p)];
        if (owner(p) == me) mine.push_back(static_cast<std::int64_t>(p.xxh3.value_or(0)));
    }
    const comm::Buffer hashes{std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), counts};
    c.run(comm::Kind::allgather, std::span(&hashes, 1), comm::DType::i64);
    std::vector<std::size_t> next(procs);
    for (unsigned q = 1; q < procs; ++q) next[q] = next[q - 1] + counts[q - 1];
    for (auto& p : m.parts) p.xxh3 = static_cast<std::uint64_t>(all[next[owner(p)]++]);
}

// Every process's files go into place beside the old state (names its
// manifest does not use, place_beside), then process 0 commits the manifest
// over the old one; then every process retires the old state's files it
// can reach (with node-local rank folders, only its own node holds them).
// When the commit failed, the others keep what they placed: the manifest
// may name it. (Process 0 holds rank 0, so its init set m.dir.)
void commit_ranks(comm::Communicator& c, Written& w, const Manifest& m) {
    const std::string path = m.dir + "/manifest.jsonl";
    std::exception_ptr failed;
    try {
        w.commit();
    } catch (...) {
        failed = std::current_exception();
    }
    try {
        comm::agree(c, failed, "nothing was committed; the directory's manifest is the one before");
    } catch (...) {
        w.unplace();
        w.discard();
        throw;
    }
    if (c.rank() == 0) try {
            save_placed(w, m, path);
        } catch (...) {
            failed = std::current_exception();
        }
    comm::agree(c, failed, "process 0 could not commit the new manifest (zinf-shard verify tells which one stands)");
    w.retire();
    w.lock.release();
}

}  // namespace

void commit(Written& w, const Manifest& m) {
    try {
        w.commit();
    } catch (...) {
        w.discard();
        throw;
    }
    save_placed(w, m, m.dir + "/manifest.jsonl");
    w.retire();
    w.lock.release();  // committed: the next program may have the directory
}

DistributedResult init_ranks(comm::Communicator& c, const std::function<Manifest()>& prepare, const std::string& dir,
                             const DistributedInit& opts) {
    const bool lead = c.rank() == 0;
    const auto procs = static_cast<unsigned>(c.size()), me = static_cast<unsigned>(c.rank());
    DistributedResult out;
    Manifest& m = out.manifest;
    // Process 0 commits the manifest: it locks the directory (made when
    // absent) before reading the one there, and holds it to the commit;
    // every process locks the node-local folders of its ranks in init().
    Lock dir_lock;
    std::exception_ptr refused;
    if (lead) try {
            dir_lock = lock_folder(dir, LockMode::exclusive, true);
        } catch (...) {
            refused = std::current_exception();
        }
    comm::agree(c, refused, "nothing was written");
    Written w;
    try {
        m = share(c, prepare, dir);
        if (lead && procs > m.opts.dp)
            log::warn(std::to_string(procs) + " processes for dp " + std::to_string(m.opts.dp) + ": processes " +
                      std::to_string(m.opts.dp) + " and up have nothing to write");

        RunOptions ro = opts.run;
        ro.ranks.clear();
        for (unsigned r = me; r < m.opts.dp; r += procs) ro.ranks.push_back(r);
        const auto limit = c.timeout();
        if (!opts.limit_write_wait) c.set_timeout(std::chrono::milliseconds(0));
        Timer t;
        std::exception_ptr failed;
        try {
            if (!ro.ranks.empty()) {
                io::Engine engine(opts.engine());
                mem::PinnedPool pool(opts.pool(), &engine);
                Progress bar("init", m.total_bytes() / procs);
                if (lead) ro.progress = [&bar](std::uint64_t n) { bar.advance(n); };
                w = init(m, dir, engine, pool, ro);
            }
        } catch (...) {
            failed = std::current_exception();
        }
        agree(c, failed, &w);
        c.set_timeout(limit);

        gather_hashes(c, m);
        commit_ranks(c, w, m);
        out.write_seconds = t.seconds();
    } catch (...) {
        w.discard();
        dir_lock.abandon();  // a directory process 0 made for nothing goes again
        throw;
    }
    return out;
}

namespace {

// The committed state `given` (read from the file `source`) leads to: the
// data directory's own manifest.jsonl (read again when `source` is it and
// `again`), each checked to belong where it lies (check_home).
Committed locate(const Manifest& given, const std::string& source, bool again) {
    Committed c;
    c.manifest = given;
    check_home(given, source, false);
    const std::string& dir = given.dir;
    if (dir.empty())
        throw DataError("manifest " + source + " has no data directory: run zinf-shard init first");
    c.path = dir + "/manifest.jsonl";
    std::error_code ec;
    const bool is_it = source != "-" && fs::equivalent(source, c.path, ec);
    if (!is_it && !fs::exists(c.path))
        throw DataError("manifest " + source + ": its data directory " + dir +
                        " holds no manifest.jsonl (was it made by zinf-shard init?)");
    if (!is_it || again) c.manifest = read_manifest_file(c.path);
    check_home(c.manifest, c.path, true);
    if (!is_it) c.copy_of = source;
    return c;
}

}  // namespace

Committed read_committed(const std::string& given) { return locate(read_manifest_input(given), given, false); }

Manifest committed_state(const Manifest& given, const std::string& source, bool follow, const std::string& data_dir) {
    // --data-dir says where the state is; without it, the file given must
    // not be a copied or moved folder's own manifest.
    if (data_dir.empty()) check_home(given, source, false);
    const std::string dir = data_dir.empty() ? given.dir : data_dir;
    Manifest as_given = given;
    as_given.dir = dir;
    if (dir.empty()) return as_given;
    const std::string path = dir + "/manifest.jsonl";
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return as_given;
    std::error_code ec;
    if (source != "-" && fs::equivalent(source, path, ec)) {
        check_home(as_given, path, true);  // (--data-dir naming the folder it lies in reads that folder)
        return as_given;
    }
    Manifest c;
    try {
        c = read_manifest_file(path);
    } catch (const Error& e) {
        if (follow) throw;  // the state to read cannot be known
        log::warn(path + " cannot be read (" + e.message() + "); checking " + source + " as given");
        return as_given;
    }
    check_home(c, path, true);
    auto at = [](const Manifest& m) {
        std::uint64_t s = 0;
        for (const auto& p : m.parts) s = std::max(s, p.step);
        return s;
    };
    bool same = c.parts.size() == given.parts.size() && c.spec == given.spec && c.opts.dp == given.opts.dp;
    if (same) {
        std::map<std::tuple<std::size_t, unsigned, std::string>, const Partition*> by;
        for (const auto& p : c.parts) by[{p.tensor, p.rank, p.state}] = &p;
        for (const auto& p : given.parts) {
            const auto it = by.find({p.tensor, p.rank, p.state});
            if (it == by.end() || it->second->file != p.file || it->second->xxh3 != p.xxh3 || it->second->step != p.step) {
                same = false;
                break;
            }
        }
    }
    if (same) return as_given;
    const std::string what = source + " is not what " + path + " commits (that is at step " + std::to_string(at(c)) +
                             ", " + source + " at step " + std::to_string(at(given)) + ")";
    if (!follow) {
        log::warn(what + ": checking " + source + " as given; the committed state is " + path);
        return as_given;
    }
    log::info(what + ": reading the committed " + path + " (zinf-manifest(5): a copy only finds the directory)");
    c.dir = dir;
    return c;
}

Committed read_committed(const std::string& given, LockMode mode, const std::vector<unsigned>& ranks) {
    // The given file (read once: it may be a pipe) leads to the directory;
    // its committed manifest is read again once the directory is locked.
    // Nothing is locked before both are known to belong where they lie.
    const Manifest g = read_manifest_input(given);
    Lock lock = lock_state(locate(g, given, false).manifest, mode, ranks);
    Committed c = locate(g, given, true);
    // The directory's writer: a manifest temporary there is a killed
    // commit's (no other writer can hold the lock), removed now rather than
    // at this run's first commit, which may never come (a run that
    // diverges at its first step, or is interrupted before it).
    if (mode == LockMode::exclusive && (ranks.empty() || std::find(ranks.begin(), ranks.end(), 0u) != ranks.end()))
        remove_stale_temps(c.path, ".tmp.");
    c.lock = std::move(lock);
    return c;
}

// ---------------------------------------------------------------------------
int generation_of(const std::string& file) {
    for (int g : {1, 2, 0}) {
        const std::string_view suffix = kGenerations[g];
        if (file.size() > suffix.size() && file.ends_with(suffix)) return g;
    }
    return -1;
}

std::string generation_base(const std::string& file) {
    const int g = generation_of(file);
    return g < 0 ? file : file.substr(0, file.size() - std::string_view(kGenerations[g]).size());
}

std::string other_generation(const std::string& file) {
    // Unlike generation_of, a name that is the suffix alone has a twin too.
    for (int g : {1, 2, 0}) {
        const std::string_view suffix = kGenerations[g];
        if (file.ends_with(suffix))
            return file.substr(0, file.size() - suffix.size()) + kGenerations[g == 0 ? 1 : 0];
    }
    return file + ".alt";
}

std::vector<std::string> place_beside(Manifest& m, const std::string& dir) {
    const std::string committed = dir + "/manifest.jsonl";
    struct stat st {};
    if (::lstat(committed.c_str(), &st) != 0) return {};
    std::set<std::string> named;
    bool readable = true;
    Manifest old;
    try {
        old = read_manifest_file(committed);
        for (const auto& p : old.parts) named.insert(p.file);
    } catch (const IoError&) {
        throw;  // a disk that fails a read is not written on: 74, the old state kept
    } catch (const Error& e) {
        // Nothing in the directory is trusted then; still, write beside
        // what is there where a free name is.
        readable = false;
        log::warn(committed + " cannot be read (" + e.what() + "); replacing it");
    }
    // Compared where the files lie: with node-local rank folders a name
    // can be one file in the old state's folders and another in the new.
    std::set<std::string> named_at;
    if (readable)
        for (const auto& f : named) named_at.insert(old.place(f, dir).path());
    auto taken = [&](const std::string& f) {
        struct stat fst {};
        const std::string at = m.place(f, dir).path();
        return readable ? named_at.count(at) != 0 : ::lstat(at.c_str(), &fst) == 0;
    };
    std::map<std::string, std::string> to;
    for (const auto& f : m.files()) {
        if (!taken(f)) continue;
        const std::string other = other_generation(f);
        if (readable && taken(other))
            throw DataError(committed + " names both " + f + " and " + other +
                            ": no name is free for the new state beside it; write it into a new directory");
        if (!taken(other)) to[f] = other;
    }
    for (auto& p : m.parts)
        if (auto it = to.find(p.file); it != to.end()) p.file = it->second;
    std::vector<std::string> superseded;
    if (readable) {
        std::set<std::string> keep;  // where the new state's files lie
        for (const auto& f : m.files()) keep.insert(m.place(f, dir).path());
        // The old state's files in node-local rank folders go only from a
        // folder its marker shows to be that rank's; one not on this node
        // stays (its own node's next init replaces it).
        // So do the rank folders of a manifest that is a copy's (it names
        // another directory: those folders are its origin's).
        std::set<unsigned> gone;
        for (unsigned r = 0; r < old.rank_dirs.size(); ++r) try {  // each folder once
                check_rank_folders(old, {r}, dir);
            } catch (const Error&) {
                gone.insert(r);
            }
        // Each old file, and its other generation (the optimizer's twin,
        // which no manifest names), unless the new state lies there.
        for (const auto& p : old.parts)
            if (!gone.count(p.rank))
                for (const std::string& f : {p.file, other_generation(p.file)}) {
                    const std::string at = old.place(f, dir).path();
                    if (keep.insert(at).second) superseded.push_back(at);  // once
                }
    }
    return superseded;
}

void check_paths(const Manifest& m, const std::vector<unsigned>& ranks) {
    if (m.dir.empty()) return;
    check_rank_folders(m, ranks);
    const std::set<unsigned> mine(ranks.begin(), ranks.end());
    std::set<std::string> folders, files;
    for (const auto& p : m.parts)
        if (mine.empty() || mine.count(p.rank)) files.insert(p.file);
    for (const auto& f : files) {
        const Manifest::Place at = m.place(f);
        const std::string folder = fs::path(at.rel).parent_path().string();
        if (!folder.empty() && folders.insert(at.root + "/" + folder).second) {
            const int fd = open_beneath_raw(at.root, folder, O_PATH | O_DIRECTORY, 0);
            if (fd == -EXDEV || fd == -ELOOP) throw_open_beneath(-fd, at.root, folder, O_PATH);
            if (fd >= 0) ::close(fd);
        }
        const int fd = open_beneath_raw(at.root, at.rel, O_PATH, 0);
        if (fd == -EXDEV || fd == -ELOOP) throw_open_beneath(-fd, at.root, at.rel, O_PATH);
        if (fd >= 0) ::close(fd);
    }
}

}  // namespace zinf::shard
