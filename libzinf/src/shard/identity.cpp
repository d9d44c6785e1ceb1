// A state's identity on disk (zinf-manifest(5), MOVED AND COPIED FOLDERS):
// which folder a committed manifest belongs to, which state a node-local rank
// folder belongs to, and adopting a folder that was copied or moved. One
// place for each rule; every program that reads or writes a state calls it.
#include "disk.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

namespace zinf::shard {

using namespace detail;
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestName = "manifest.jsonl";
// A marker holds its rank and its owner's absolute path: a few KiB at most.
constexpr std::size_t kMarkerMax = 16 * 1024;

// The message for a committed manifest in `folder` that names `names`.
std::string moved(const std::string& folder, const std::string& path, const std::string& names) {
    return "this committed manifest names the data directory " + names + ", not " + folder +
           " where it lies: the folder was copied or moved there (cp -r, mv), and reading or writing through it "
           "would read or write " + names + "'s files; nothing was opened. To use the state where it lies, adopt "
           "it: zinf-shard verify -m " + path + " --data-dir " + folder + " (checks every partition in " + folder +
           " and commits a manifest naming it)";
}

// The folder holds a data directory's own files: its lock file, or the
// state's first file where the manifest would put it beneath the folder.
bool holds_a_state(const Manifest& m, const std::string& folder) {
    struct stat st {};
    if (::lstat((folder + "/" + kLockFile).c_str(), &st) == 0) return true;
    for (const auto& p : m.parts)
        if (m.rank_dirs.empty() || m.place(p.file, folder).root == folder)
            return ::lstat(m.place(p.file, folder).path().c_str(), &st) == 0;
    return false;
}

}  // namespace

bool same_folder(const std::string& a, const std::string& b) {
    struct stat sa {}, sb {};
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && S_ISDIR(sa.st_mode) &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_home(const Manifest& m, const std::string& path, bool found) {
    if (path == "-" || m.dir.empty()) return;
    const fs::path p(path);
    if (p.filename() != kManifestName) return;
    const std::string folder = p.has_parent_path() ? p.parent_path().string() : ".";
    if (same_folder(m.dir, folder)) return;
    // A copy of a manifest kept elsewhere (init's stdout saved as
    // manifest.jsonl) only leads to its directory; a copy among a state's
    // files is that state moved or copied.
    if (!found && !holds_a_state(m, folder)) return;
    throw DataError(moved(folder, path, m.dir), {0, path, {}, -1});
}

// ---------------------------------------------------------------------------
std::string rank_marker_text(unsigned rank, const std::string& owner) {
    return R"({"zinf":"rank folder","rank":)" + std::to_string(rank) + R"(,"dir":)" +
           json::Json(owner).dump(-1, ' ', false, json::Json::error_handler_t::replace) + "}\n";
}

std::optional<RankMarker> read_rank_marker(const std::string& folder, int rank_for_errors) {
    const std::string path = folder + "/" + kRankMarker;
    const int fd = open_beneath_raw(folder, kRankMarker, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd == -ENOENT) return std::nullopt;
    if (fd < 0) throw_open_beneath(-fd, folder, kRankMarker, O_RDONLY);
    Fd guard(fd);
    std::string text(kMarkerMax + 1, '\0');
    std::size_t got = 0;
    while (got < text.size()) {
        const long n = sys::read(fd, text.data() + got, text.size() - got, path);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("read", errno, path);
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
    }
    text.resize(got);
    const Error::Where at{0, path, {}, rank_for_errors};
    if (got > kMarkerMax) throw DataError("is not a rank folder's marker (more than 16KiB)", at);
    try {
        const json::Json j = json::Json::parse(text);
        if (!j.is_object() || j.value("zinf", std::string()) != "rank folder" || !j.contains("rank") ||
            !j["rank"].is_number_unsigned() || j["rank"].get<std::uint64_t>() > UINT32_MAX ||
            (j.contains("dir") && (!j["dir"].is_string() || j["dir"].get<std::string>().empty())))
            throw DataError("", at);
        RankMarker r;
        r.rank = j["rank"].get<unsigned>();
        if (j.contains("dir")) r.owner = j["dir"].get<std::string>();
        return r;
    } catch (const std::exception&) {
        throw DataError("is not a rank folder's marker ({\"zinf\":\"rank folder\",\"rank\":R,\"dir\":D})", at);
    }
}

void check_rank_folders(const Manifest& m, const std::vector<unsigned>& ranks, const std::string& owner) {
    if (m.rank_dirs.empty()) return;
    const std::string& home = owner.empty() ? m.dir : owner;
    std::vector<unsigned> all;
    const std::vector<unsigned>* which = &ranks;
    if (ranks.empty()) {
        for (unsigned r = 0; r < m.opts.dp; ++r) all.push_back(r);
        which = &all;
    }
    for (const unsigned r : *which) {
        const std::string& d = m.rank_dirs.at(r);
        const std::string who = "rank " + std::to_string(r) + "'s folder " + d + " (the manifest's rank_dirs)";
        const Error::Where at{0, d + "/" + kRankMarker, {}, static_cast<int>(r)};
        struct stat st {};
        if (::stat(d.c_str(), &st) != 0) {
            const int err = errno;
            if (err == ENOENT)
                throw MissingInputError(who + " does not exist on this node: run the rank where its node-local "
                                              "disk is, or initialise it there (zinf-shard init --rank-dir)",
                                        {err, d, {}, static_cast<int>(r)});
            throw_errno("stat", err, d);
        }
        if (!S_ISDIR(st.st_mode)) throw DataError(who + " is not a folder", {0, d, {}, static_cast<int>(r)});
        std::optional<RankMarker> mark;
        try {
            mark = read_rank_marker(d, static_cast<int>(r));
        } catch (const DataError& e) {
            throw DataError(who + "'s " + kRankMarker + " " + e.message() +
                                ": it is not a rank folder zinf-shard init made; nothing is read or written there",
                            at);
        }
        if (!mark || mark->rank != r)
            throw DataError(who + (mark ? "'s " + std::string(kRankMarker) + " does not name rank " + std::to_string(r)
                                        : " holds no " + std::string(kRankMarker)) +
                                ": it is not a rank folder zinf-shard init made; nothing is read or written there",
                            at);
        // A marker from before owners were recorded names none: taken as this
        // state's (its next init or reshard records the owner).
        if (!mark->owner.empty() && !home.empty() && !same_folder(mark->owner, home))
            throw DataError(who + " belongs to the state in " + mark->owner + " (its " + kRankMarker + "), not to " +
                                home + "'s: another run took the folder over (zinf-shard init or reshard --force), "
                                "or this state was copied or moved with the rank folders left shared; nothing is "
                                "read or written there",
                            at);
    }
}

// ---------------------------------------------------------------------------
std::optional<Manifest> adopt(const std::string& dir, io::Engine& engine, mem::PinnedPool& pool,
                              const RunOptions& opts) {
    const std::string path = dir + "/" + kManifestName;
    // One writer: the folder is locked before its manifest is read.
    Lock lock = lock_folder(dir, LockMode::exclusive);
    Manifest m = read_manifest_file(path);
    if (m.dir.empty()) throw DataError(path + " names no data directory: it is a layout, not a committed state");
    if (same_folder(m.dir, dir)) return std::nullopt;
    const std::string origin = m.dir, home = absolute_dir(dir);
    if (!opts.ranks.empty())
        throw UsageError("--ranks: " + path + " names " + origin + ": adopting " + dir +
                         " verifies every rank; leave --ranks out");
    m.dir = home;
    // Node-local rank folders: a move leaves them to the moved state (the
    // origin no longer names them); a copy cannot share them with its origin.
    std::vector<std::pair<std::string, std::string>> markers;  // (path, text before) of those taken over
    if (!m.rank_dirs.empty()) {
        std::optional<Manifest> still;  // the origin's state, where it still stands
        try {
            Manifest o = read_manifest_file(origin + "/" + kManifestName);
            if (same_folder(o.dir, origin)) still = std::move(o);
        } catch (const MissingInputError&) {
        }
        for (unsigned r = 0; r < m.rank_dirs.size(); ++r) {
            const std::string& d = m.rank_dirs[r];
            const auto mark = read_rank_marker(d, static_cast<int>(r));
            if (!mark || mark->rank != r) check_rank_folders(m, {r});  // says what is wrong
            const std::string owner = mark->owner.empty() ? origin : mark->owner;
            if (same_folder(owner, dir)) continue;  // taken over by an adoption killed before its commit
            const bool shared = still && r < still->rank_dirs.size() && same_folder(still->rank_dirs[r], d);
            if (shared || (!same_folder(owner, origin) && fs::exists(owner)))
                throw DataError(path + " (a copy or move of " + origin + "): rank " + std::to_string(r) +
                                    "'s folder " + d + " belongs to the state in " + owner +
                                    (shared ? ", which still names it" : "") +
                                    ": a copy of a data directory cannot share its rank folders; copy the state "
                                    "into rank folders of its own (zinf-shard reshard -m " + owner + "/" +
                                    kManifestName + " --dir NEW --rank-dir ...)",
                                {0, d + "/" + kRankMarker, {}, static_cast<int>(r)});
            lock.add(lock_folder(d, LockMode::exclusive));
            markers.emplace_back(d + "/" + kRankMarker, read_regular(d + "/" + kRankMarker, kMarkerMax, "a rank marker"));
            const std::string text = rank_marker_text(r, home);
            const std::span<const std::byte> piece = std::as_bytes(std::span(text));
            write_file_atomic(markers.back().first, {&piece, 1});
        }
    }
    try {
        RunOptions ro = opts;
        ro.lock = false;  // held above, exclusively
        ro.ranks.clear();
        verify(m, engine, pool, ro);
        save_manifest(m, path);
    } catch (...) {
        // Not adopted: the rank folders go back to their owner.
        for (const auto& [at, text] : markers) try {
                const std::span<const std::byte> piece = std::as_bytes(std::span(text));
                write_file_atomic(at, {&piece, 1});
            } catch (const Error& e) {
                log::warn(at + ": cannot be given back to " + origin + " (" + e.message() + ")");
            }
        throw;
    }
    return m;
}

}  // namespace zinf::shard
