#include <zinf/util.hpp>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace zinf {
namespace {
std::string decorate(const std::string& msg, const Error::Where& w) {
    std::string out;
    if (!w.path.empty()) out += w.path + ": ";
    if (w.rank >= 0) out += "rank " + std::to_string(w.rank) + ": ";
    out += msg;
    if (w.offset) out += " at offset " + std::to_string(*w.offset);
    if (w.err) out += ": " + std::string(std::strerror(w.err)) + " (errno " + std::to_string(w.err) + ")";
    return out;
}
}  // namespace

Error::Error(const std::string& msg, Where where)
    : std::runtime_error(decorate(msg, where)), msg_(msg), where_(std::move(where)) {}

int IoError::exit_code() const noexcept {
    return err() == ENOSPC || err() == EDQUOT || err() == EROFS ? exit_code::cant_create : exit_code::io;
}

void throw_errno(std::string_view call, int err, const std::string& path,
                 std::optional<std::uint64_t> offset, bool creating) {
    Error::Where w{err, path, offset, -1};
    std::string msg(call);
    msg += " failed";
    if (err == ENOENT && !creating) throw MissingInputError(msg, w);
    if (creating && (err == EEXIST || err == ENOSPC || err == EACCES || err == EROFS ||
                     err == EDQUOT || err == ENOENT || err == EISDIR || err == ENOTDIR))
        throw CreateError(msg, w);
    throw IoError(msg, w);
}

namespace {
std::atomic<bool> g_failing{false};
}
void mark_failing() noexcept { g_failing.store(true); }
bool failing() noexcept { return g_failing.load(); }

const char* version() {
#ifdef ZINF_VERSION
    return ZINF_VERSION;
#else
    return "unknown";
#endif
}

}  // namespace zinf
