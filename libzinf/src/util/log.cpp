#include <zinf/util.hpp>

#include <atomic>
#include <cstdio>
#include <set>
#include <unistd.h>

namespace zinf {
namespace log {
namespace {
std::string g_program = "zinf";
std::atomic<LogLevel> g_level{LogLevel::info};
std::mutex g_once_mu;
std::set<std::string> g_once;

void emit(const char* tag, const std::string& msg) {
    std::lock_guard lk(stderr_mutex());
    std::fprintf(stderr, "%s: %s%s\n", g_program.c_str(), tag, msg.c_str());
    std::fflush(stderr);
}
}  // namespace

std::mutex& stderr_mutex() {
    static std::mutex mu;
    return mu;
}
void set_program(std::string name) { g_program = std::move(name); }
const std::string& program() { return g_program; }
void set_level(LogLevel level) { g_level = level; }
LogLevel level() { return g_level; }

void warn(const std::string& msg) {
    if (g_level >= LogLevel::warn) emit("warning: ", msg);
}
void info(const std::string& msg) {
    if (g_level >= LogLevel::info) emit("", msg);
}
void debug(const std::string& msg) {
    if (g_level >= LogLevel::debug) emit("debug: ", msg);
}
void warn_once(const std::string& key, const std::string& msg) {
    {
        std::lock_guard lk(g_once_mu);
        if (!g_once.insert(key).second) return;
    }
    warn(msg);
}
}  // namespace log

bool Progress::enabled() {
    return log::level() >= LogLevel::info && ::isatty(STDERR_FILENO);
}

Progress::Progress(std::string label, std::uint64_t total_bytes, std::string items)
    : label_(std::move(label)), total_(total_bytes), items_(std::move(items)), active_(enabled()),
      start_(std::chrono::steady_clock::now()), last_draw_() {}

Progress::~Progress() {
    if (!active_) return;
    std::lock_guard lk(log::stderr_mutex());
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
}

void Progress::advance(std::uint64_t bytes) {
    if (!active_) return;
    std::lock_guard lk(mu_);
    done_ += bytes;
    draw(false);
}

void Progress::update(std::uint64_t bytes_done, std::uint64_t items_done) {
    if (!active_) return;
    std::lock_guard lk(mu_);
    done_ = bytes_done;
    items_done_ = items_done;
    draw(false);
}

void Progress::finish() {
    if (!active_) return;
    std::lock_guard lk(mu_);
    done_ = total_;
    draw(true);
}

void Progress::draw(bool force) {
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    if (frac > 1) frac = 1;
    constexpr int width = 30;
    int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    double gibps = secs > 0 ? static_cast<double>(done_) / static_cast<double>(GiB) / secs : 0;
    std::lock_guard lk(log::stderr_mutex());
    if (items_.empty()) {
        std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %.2f GiB/s", label_.c_str(), bar.c_str(), frac * 100, gibps);
    } else {
        const double mbps = secs > 0 ? static_cast<double>(done_) / 1e6 / secs : 0;
        if (total_)
            std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%%  %s  %.1f MB/s  %llu %s", label_.c_str(), bar.c_str(),
                         frac * 100, format_size(done_).c_str(), mbps, static_cast<unsigned long long>(items_done_),
                         items_.c_str());
        else
            std::fprintf(stderr, "\r\033[K%s  %s  %.1f MB/s  %llu %s", label_.c_str(), format_size(done_).c_str(),
                         mbps, static_cast<unsigned long long>(items_done_), items_.c_str());
    }
    std::fflush(stderr);
}

}  // namespace zinf
