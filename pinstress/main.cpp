// zinf-pinstress: stresses the pinned pool (threads leasing buffers, filling
// them with a keyed pattern, checking them with xxh3 before release) and
// measures copy bandwidth into pinned versus pageable memory, and with a CUDA
// device host<->device. See man/zinf-pinstress.1.
#include "stress.hpp"

#include <zinf/cli.hpp>
#include <zinf/device.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <random>

using namespace zinf;
using namespace zinf::pinstress;

namespace {

struct Options {
    std::string pinned = "256MiB", buffer = "16MiB";
    std::string allocator = "auto";
    unsigned threads = 4;
    std::string seconds = "5s";
    std::size_t max_lease = 2;
    std::string max_hold = "1ms";
    std::string timeout = "10s";
    std::uint64_t seed = 0;
    bool seed_given = false;
    unsigned copy_rounds = 20;
    bool no_copy = false;
    bool json = false;
    std::string device = "auto";  // auto, cpu (no device copies), cuda (a GPU or an error)
    int gpu = -1;
    std::string inject = "none";
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// Growth of the resident set tolerated before a warning: the C library's
// thread stacks and arenas, not the pool.
constexpr std::uint64_t kRssSlack = 16 * MiB;

double us(double ns) { return ns / 1000.0; }

// Data rows carry no '#'; everything else does (nccl-tests' convention).
void print_table(const StressSpec& spec, const mem::PoolStats& ps, const StressResult& r,
                 const std::vector<CopyResult>& copies, std::uint64_t rss0, std::uint64_t rss1,
                 std::uint64_t peak) {
    std::printf("# zinf-pinstress %s\n", version());
    std::printf("# pool %s = %zu x %s via %s, %s%s; seed %llu\n", format_size(ps.buffers * ps.buffer_bytes).c_str(),
                ps.buffers, format_size(ps.buffer_bytes).c_str(), ps.allocator.c_str(),
                ps.locked ? "page-locked" : "NOT page-locked", ps.registered ? ", registered with the io engine" : "",
                static_cast<unsigned long long>(spec.seed));
    std::printf("# %7s %9s %9s %9s %9s %9s %9s %9s %10s %8s\n", "threads", "seconds", "rounds", "GiB_chkd",
                "waits", "wait_s", "p50_us", "p99_us", "max_us", "problems");
    std::printf("  %7u %9.2f %9llu %9.2f %9llu %9.3f %9.2f %9.2f %10.1f %8zu\n", spec.threads, r.seconds,
                static_cast<unsigned long long>(r.rounds), static_cast<double>(r.bytes_checked) / GiB,
                static_cast<unsigned long long>(ps.waits),
                ps.wait_seconds, us(r.latency.quantile_ns(0.5)), us(r.latency.quantile_ns(0.99)),
                us(static_cast<double>(r.latency.max_ns())), r.problems.size());
    if (!copies.empty()) {
        std::printf("#\n# %7s %9s %14s %14s\n", "copy", "bytes", "pinned_gibps", "pageable_gibps");
        for (const auto& c : copies)
            std::printf("  %7s %9s %14.2f %14.2f\n", c.what.c_str(), format_size(c.bytes).c_str(), c.pinned_gibps,
                        c.pageable_gibps);
    }
    const long long growth = static_cast<long long>(rss1) - static_cast<long long>(rss0);
    std::printf("# resident: start %s, end %s (%s%s), peak %s\n", format_size(rss0).c_str(),
                format_size(rss1).c_str(), growth < 0 ? "-" : "+",
                format_size(static_cast<std::uint64_t>(growth < 0 ? -growth : growth)).c_str(),
                format_size(peak).c_str());
}

json::Json record(const StressSpec& spec, const mem::PinnedPool& pool, const StressResult& r,
                  const std::vector<CopyResult>& copies, std::uint64_t rss0, std::uint64_t rss1,
                  std::uint64_t peak, const mem::GpuInfo& gpu) {
    json::Json j = {{"schema", "zinf.pinstress/1"},
                    {"seed", spec.seed},
                    {"threads", spec.threads},
                    {"seconds", r.seconds},
                    {"max_lease", spec.max_lease},
                    {"max_hold_us", spec.max_hold_us},
                    {"pool", pool.stats().to_json()},
                    {"rounds", r.rounds},
                    {"bytes_checked", r.bytes_checked},
                    {"lease_count", r.latency.count()},
                    {"lease_p50_us", us(r.latency.quantile_ns(0.50))},
                    {"lease_p99_us", us(r.latency.quantile_ns(0.99))},
                    {"lease_max_us", us(static_cast<double>(r.latency.max_ns()))},
                    {"rss_start_bytes", rss0},
                    {"rss_end_bytes", rss1},
                    {"rss_peak_bytes", peak},
                    {"rss_growth_bytes", static_cast<std::int64_t>(rss1) - static_cast<std::int64_t>(rss0)},
                    {"gpu", gpu.count > 0 ? json::Json(gpu.name) : json::Json(nullptr)}};
    json::Json cs = json::Json::array();
    for (const auto& c : copies)
        cs.push_back({{"copy", c.what}, {"bytes", c.bytes}, {"pinned_gibps", c.pinned_gibps},
                      {"pageable_gibps", c.pageable_gibps}});
    j["copies"] = cs;
    json::Json ps = json::Json::array();
    for (const auto& p : r.problems) ps.push_back({{"kind", p.what}, {"message", p.message}});
    j["problems"] = ps;
    return j;
}

int run(const Options& o) {
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGHUP, on_signal);
    std::signal(SIGPIPE, SIG_IGN);

    mem::PoolConfig pc;
    pc.bytes = cli::parse_sizes({o.pinned}, "--pinned")[0];
    pc.buffer = cli::parse_sizes({o.buffer}, "--pinned-buffer")[0];
    pc.allocator = o.allocator;
    pc.lease_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(parse_duration(o.timeout));
    pc.validate();

    StressSpec spec;
    spec.threads = o.threads;
    spec.seconds = std::chrono::duration<double>(parse_duration(o.seconds)).count();
    spec.max_lease = o.max_lease;
    spec.max_hold_us = std::chrono::duration<double, std::micro>(parse_duration(o.max_hold)).count();
    spec.seed = o.seed_given ? o.seed : (std::uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    spec.inject = o.inject == "corrupt" ? Inject::corrupt : o.inject == "leak" ? Inject::leak : Inject::none;
    if (spec.max_lease > pc.buffers())
        throw UsageError("--max-lease " + std::to_string(spec.max_lease) + " exceeds the pool's " +
                         std::to_string(pc.buffers()) + " buffers (" + pc.describe() + ")");

    const mem::GpuInfo gpu = mem::gpu_info();
    if (o.device == "cuda" && gpu.count == 0) throw UsageError("--device cuda: " + gpu.why_not);
    if (o.device == "cpu" && o.gpu >= 0) throw UsageError("--gpu is for --device cuda (or auto on a GPU host)");
    const bool on_gpu = gpu.count > 0 && o.device != "cpu";
    mem::PinnedPool pool(pc);
    std::unique_ptr<mem::DeviceArena> arena;
    if (on_gpu && !o.no_copy)
        arena = std::make_unique<mem::DeviceArena>(mem::ArenaConfig{
            .bytes = pc.buffer, .backend = "cuda", .gpu = device::select_gpu(o.gpu, gpu.count)});
    // Everything the run uses is allocated and touched before the first sample.
    AlignedBuffer pageable, source;
    if (!o.no_copy) {
        pageable = AlignedBuffer::allocate(pc.buffer);
        source = AlignedBuffer::allocate(pc.buffer);
        fill_random(source.bytes(), spec.seed);
    }
    const mem::PoolStats st = pool.stats();
    log::info("seed " + std::to_string(spec.seed) + " (replay with --seed " + std::to_string(spec.seed) + ")");
    log::info("pool " + pc.describe() + " via " + st.allocator + (st.locked ? ", page-locked" : ", NOT page-locked") +
              "; " + std::to_string(spec.threads) + " threads for " + o.seconds +
              (gpu.count > 0 ? "; GPU: " + gpu.name : "; no GPU (" + gpu.why_not + ")"));
    const std::uint64_t rss0 = resident_bytes();
    log::info("resident at start: " + format_size(rss0));

    StressResult r = stress(pool, spec, g_stop);
    std::vector<CopyResult> copies;
    const bool failed = std::any_of(r.problems.begin(), r.problems.end(), [](auto& p) { return p.what == "error"; });
    if (!o.no_copy && !g_stop && !failed) copies = copy_bandwidth(pool, arena.get(), pageable.bytes(), source.bytes(), o.copy_rounds);
    const std::uint64_t rss1 = resident_bytes(), peak = peak_resident_bytes();
    log::info("resident at end: " + format_size(rss1) + " (peak " + format_size(peak) + ")");

    if (o.json)
        std::fputs(json::line(record(spec, pool, r, copies, rss0, rss1, peak, gpu)).c_str(), stdout);
    else
        print_table(spec, pool.stats(), r, copies, rss0, rss1, peak);
    flush_stdout();

    if (g_stop) throw Interrupted("interrupted; the figures above cover the run so far");
    // A lease timeout (an error) outranks the checks; the checks' failures are
    // all named in the message (the first few; the JSON has every one).
    for (const auto& p : r.problems)
        if (p.what == "error") throw InternalError(p.message);
    if (!r.problems.empty()) {
        std::string msg = std::to_string(r.problems.size()) + " problem(s) found (seed " + std::to_string(spec.seed) + ")";
        for (std::size_t i = 0; i < std::min<std::size_t>(r.problems.size(), 5); ++i)
            msg += "\n  " + r.problems[i].what + ": " + r.problems[i].message;
        if (r.problems.size() > 5) msg += "\n  ... and " + std::to_string(r.problems.size() - 5) + " more";
        throw DataError(msg);
    }
    if (rss1 > rss0 + kRssSlack)
        log::warn("resident memory grew by " + format_size(rss1 - rss0) + " during the run (the pool never allocates "
                  "after start-up; this is worth a bug report)");
    return exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-pinstress")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-pinstress: stress the pinned-memory pool from many threads (seeded random\n"
                 "lease sizes and hold times, every buffer checked with xxh3 before release) and\n"
                 "measure copy bandwidth into pinned versus pageable memory"};
    app.name("zinf-pinstress");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("--pinned", o.pinned, "Page-locked memory in the pool");
    app.add_option("--pinned-buffer", o.buffer, "Bytes per pool buffer (a multiple of 4KiB)");
    app.add_option("--allocator", o.allocator, "auto: cudaHostAlloc with a GPU, else mmap + mlock; host: mmap + mlock")
        ->check(CLI::IsMember({"auto", "host"}));
    app.add_option("-t,--threads", o.threads, "Threads leasing at once")->check(CLI::Range(1u, 1024u));
    app.add_option("-s,--seconds", o.seconds, "How long to run (10s, 500ms, 2m)");
    app.add_option("--max-lease", o.max_lease, "Most buffers taken by one lease (drawn from 1..N)")
        ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
    app.add_option("--max-hold", o.max_hold, "Longest a lease is held (drawn from 0..this)");
    app.add_option("--timeout", o.timeout, "A lease waiting longer than this fails, naming the holders");
    auto* seed = app.add_option("--seed", o.seed, "Random seed (default: drawn at random, and printed)")
        ->default_str("random");
    app.add_option("--copy-rounds", o.copy_rounds, "Copies per bandwidth figure")->check(CLI::Range(1u, 100000u));
    app.add_flag("--no-copy", o.no_copy, "Skip the copy-bandwidth measurements");
    app.add_option("--device", o.device,
                   "Where the copies go: auto (the GPU when there is one), cpu (no device copies), cuda (a GPU, "
                   "else an error)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--gpu", o.gpu, "The GPU; default: the local rank modulo the GPUs, else 0")
        ->check(cli::non_negative());
    app.add_flag("--json", o.json, "Print one JSON record (zinf.pinstress/1) instead of the table");
    app.add_option("--inject", o.inject, "Test the checks: corrupt a held buffer, or leak a lease past its thread")
        ->check(CLI::IsMember({"none", "corrupt", "leak"}));
    app.footer("Exit status: 0 ok, 64 usage, 65 a buffer changed while held or a lease outlived its\n"
               "thread, 70 a lease timed out (the message names the holders), 73 no space for stdout,\n"
               "74 memory not allocated or stdout not written, 130 interrupted.");
    return cli::run(app, argc, argv, "zinf-pinstress", common, [&] {
        o.seed_given = seed->count() > 0;
        return run(o);
    });
}
