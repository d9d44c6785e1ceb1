// Committing what init and reshard wrote: the temporaries renamed into
// place beside a committed state (place_beside names them so that the old
// manifest's files are never touched), the placed files taken back when the
// manifest cannot be committed, the old state's files retired once it is;
// and the check that a manifest's paths stay beneath its data directory.
#include <zinf/shard.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <set>
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
    : temps(std::move(o.temps)), finals(std::move(o.finals)), folders(std::move(o.folders)),
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
    std::sort(folders.begin(), folders.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    for (const auto& d : folders) ::rmdir(d.c_str());  // only when empty
    temps.clear();
    finals.clear();
    folders.clear();
}

// ---------------------------------------------------------------------------
std::string other_generation(const std::string& file) {
    const std::string alt = ".alt.bin", work = ".work.bin", bin = ".bin";
    if (file.ends_with(alt)) return file.substr(0, file.size() - alt.size()) + bin;
    if (file.ends_with(work)) return file.substr(0, file.size() - work.size()) + bin;
    if (file.ends_with(bin)) return file.substr(0, file.size() - bin.size()) + alt;
    return file + ".alt";
}

std::vector<std::string> place_beside(Manifest& m, const std::string& dir) {
    const std::string committed = dir + "/manifest.jsonl";
    struct stat st {};
    if (::lstat(committed.c_str(), &st) != 0) return {};
    std::set<std::string> named;
    bool readable = true;
    try {
        for (const auto& p : read_manifest_file(committed).parts) named.insert(p.file);
    } catch (const IoError&) {
        throw;  // a disk that fails a read is not written on: 74, the old state kept
    } catch (const Error& e) {
        // Nothing in the directory is trusted then; still, write beside
        // what is there where a free name is.
        readable = false;
        log::warn(committed + " cannot be read (" + e.what() + "); replacing it");
    }
    auto taken = [&](const std::string& f) {
        struct stat fst {};
        return readable ? named.count(f) != 0 : ::lstat((dir + "/" + f).c_str(), &fst) == 0;
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
        const auto now = m.files();
        const std::set<std::string> keep(now.begin(), now.end());
        for (const auto& f : named)
            if (!keep.count(f)) superseded.push_back(dir + "/" + f);
    }
    return superseded;
}

void check_paths(const Manifest& m) {
    if (m.dir.empty()) return;
    std::set<std::string> folders;
    for (const auto& f : m.files()) {
        const std::string folder = fs::path(f).parent_path().string();
        if (!folder.empty() && folders.insert(folder).second) {
            const int fd = open_beneath_raw(m.dir, folder, O_PATH | O_DIRECTORY, 0);
            if (fd == -EXDEV || fd == -ELOOP) throw_open_beneath(-fd, m.dir, folder, O_PATH);
            if (fd >= 0) ::close(fd);
        }
        const int fd = open_beneath_raw(m.dir, f, O_PATH, 0);
        if (fd == -EXDEV || fd == -ELOOP) throw_open_beneath(-fd, m.dir, f, O_PATH);
        if (fd >= 0) ::close(fd);
    }
}

}  // namespace zinf::shard
