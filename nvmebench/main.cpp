// zinf-nvmebench: NVMe / file-system bandwidth sweep over block size, queue
// depth, queues and engine, measured through the same io::Engine that zinf uses
// to move model state. See man/zinf-nvmebench.1.
#include "report.hpp"
#include "sweep.hpp"

#include <zinf/cli.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <set>

using namespace zinf;
using namespace zinf::nvmebench;

namespace {

struct Options {
    std::string dir = ".";
    std::string file;
    std::string size = "1GiB";
    std::string rw = "both";
    std::vector<std::string> block_sizes = {"128KiB", "1MiB", "8MiB"};
    std::vector<unsigned> queue_depths = {4, 32};
    std::vector<unsigned> queues = {1, 2};
    std::vector<std::string> engines = {"auto"};
    unsigned loops = 1;
    bool direct = false, buffered = false;
    bool verify = false, json = false, best = false;
    double min_read = 0, min_write = 0;
    bool keep = false, force = false;
};

void on_signal(int) { g_interrupted.store(true); }

// A list with repeats ("1M,1M") would measure one configuration twice.
template <class T>
std::vector<T> unique(std::vector<T> v) {
    std::vector<T> out;
    for (auto& x : v)
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    return out;
}

SweepSpec make_spec(const Options& o) {
    SweepSpec s;
    s.engines = unique(o.engines);
    s.block_sizes = unique(cli::parse_sizes(o.block_sizes, "--block-size"));
    s.queue_depths = unique(o.queue_depths);
    s.queues = unique(o.queues);
    s.read = o.rw == "read" || o.rw == "both";
    s.write = o.rw == "write" || o.rw == "both";
    s.size = cli::parse_sizes({o.size}, "--size")[0];
    s.loops = o.loops;
    s.verify = o.verify;
    if (s.size < 4096 || s.size % 4096)
        throw UsageError("--size " + o.size + " must be a positive multiple of 4KiB");
    for (std::uint64_t bs : s.block_sizes)
        if (bs < 4096 || bs % 4096)
            throw UsageError("--block-size " + std::to_string(bs) +
                             " must be a positive multiple of 4KiB");
    for (const io::EngineConfig& c : s.configs()) c.validate();  // names the bad value
    if (s.verify && !s.read)
        throw UsageError("--verify checks what is read back: use --rw read or both");
    if (o.min_read > 0 && !s.read) throw UsageError("--min-read-gibps needs --rw read or both");
    if (o.min_write > 0 && !s.write) throw UsageError("--min-write-gibps needs --rw write or both");
    return s;
}

int run(const Options& o) {
    SweepSpec spec = make_spec(o);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGHUP, on_signal);
    // A closed output pipe (`| head`) must not kill us before the test file
    // is removed: the failed write becomes an I/O error (74) instead.
    std::signal(SIGPIPE, SIG_IGN);

    Target::Options to;
    to.dir = o.dir;
    to.file = o.file;
    to.size = spec.size;
    to.need_write = spec.write || spec.verify;
    to.force = o.force;
    to.keep = o.keep;
    to.direct = o.direct ? io::Direct::require : o.buffered ? io::Direct::buffered : io::Direct::prefer;
    Target target(to);

    RunInfo info;
    info.file = target.path();
    info.created = target.created();
    info.kept = o.keep;
    info.direct = target.file().direct();
    info.alignment = target.file().alignment();
    info.size = spec.size;
    info.loops = spec.loops;
    info.verify = spec.verify;

    const auto configs = spec.configs();
    std::unique_ptr<Pattern> pattern = spec.verify ? std::make_unique<Pattern>(spec.size) : nullptr;
    const std::size_t total = configs.size() * ((spec.read ? 1 : 0) + (spec.write ? 1 : 0));
    log::info("sweeping " + std::to_string(total) + " measurements of " +
              format_size(spec.size * spec.loops) + " on " + target.path() +
              (info.direct ? " (direct I/O)" : " (buffered I/O)"));

    // Reads need data: a file we just created, or one --verify must know, is
    // written once first (not measured).
    if (spec.read && !spec.write && (!target.has_data() || spec.verify)) {
        log::info("writing the file once before the reads (" + format_size(spec.size) + ")");
        SweepSpec once = spec;
        once.loops = 1;
        measure(target, configs.front(), io::Op::write, once, pattern.get(), {});
    }

    std::vector<Result> results;
    std::set<std::string> notes;
    Progress bar("sweep", total * spec.size * spec.loops);
    for (const io::EngineConfig& cfg : configs) {
        for (io::Op op : {io::Op::write, io::Op::read}) {
            if ((op == io::Op::read && !spec.read) || (op == io::Op::write && !spec.write)) continue;
            Result r = measure(target, cfg, op, spec, pattern.get(),
                               [&](std::uint64_t n) { bar.advance(n); });
            results.push_back(r);
            if (!r.notes.empty()) notes.insert(r.notes);
            log::info("[" + std::to_string(results.size()) + "/" + std::to_string(total) + "] " +
                      (op == io::Op::read ? "read  " : "write ") + r.cfg.describe() + ": " +
                      std::to_string(r.gibps()).substr(0, 6) + " GiB/s");
            if (o.json) {
                std::fputs(json::line(record(r, info)).c_str(), stdout);
                flush_stdout();
            }
        }
    }
    bar.finish();
    for (const auto& n : notes) info.engine_notes += (info.engine_notes.empty() ? "" : "; ") + n;

    Best best = find_best(results);
    if (o.best) {
        if (best.overall) std::fputs(json::line(best_config(results, *best.overall).to_json()).c_str(), stdout);
    } else if (!o.json) {
        print_table(stdout, results, best, info);
    }
    flush_stdout();

    std::string unmet;
    if (o.min_read > 0 && (!best.read || results[*best.read].gibps() < o.min_read))
        unmet += "best read " + std::to_string(best.read ? results[*best.read].gibps() : 0) +
                 " GiB/s is below --min-read-gibps " + std::to_string(o.min_read) + ". ";
    if (o.min_write > 0 && (!best.write || results[*best.write].gibps() < o.min_write))
        unmet += "best write " + std::to_string(best.write ? results[*best.write].gibps() : 0) +
                 " GiB/s is below --min-write-gibps " + std::to_string(o.min_write) + ". ";
    if (!unmet.empty()) throw ThresholdError(unmet.substr(0, unmet.size() - 2));
    return exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-nvmebench")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-nvmebench: measure read and write bandwidth of a drive or file system\n"
                 "through zinf's I/O engine, over block size x queue depth x queues x engine.\n"
                 "Lists are comma-separated: --block-size 1M,8M --queue-depth 8,64"};
    app.name("zinf-nvmebench");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    auto* dir = app.add_option("--dir", o.dir, "Directory to create the test file in");
    app.add_option("--file", o.file,
                   "Use this file instead; an existing file is written only with --force")
        ->excludes(dir);
    app.add_option("--size", o.size, "Bytes per pass over the file (a multiple of 4KiB)");
    app.add_option("--rw", o.rw, "Which operations to measure")
        ->check(CLI::IsMember({"read", "write", "both"}));
    app.add_option("-b,--block-size", o.block_sizes, "Block sizes: bytes per request")->delimiter(',');
    app.add_option("-d,--queue-depth", o.queue_depths, "Requests in flight per queue")->delimiter(',');
    app.add_option("-Q,--queues", o.queues, "io_uring rings (thread groups for the threads engine)")
        ->delimiter(',');
    app.add_option("-e,--engine", o.engines, "Engines: uring, threads, auto")
        ->delimiter(',')
        ->check(CLI::IsMember({"uring", "threads", "auto"}));
    app.add_option("--loops", o.loops, "Passes over the file per measurement")
        ->check(CLI::Range(1u, 1000000u));
    auto* direct = app.add_flag("--direct", o.direct, "Require O_DIRECT (fail if refused)");
    app.add_flag("--buffered", o.buffered, "Use the page cache (no O_DIRECT)")->excludes(direct);
    app.add_flag("--verify", o.verify,
                 "Write a pattern and check every block read with xxh3 (exit 65 on mismatch)");
    auto* json = app.add_flag("--json", o.json, "Print JSON Lines (zinf.nvmebench/1), one per measurement");
    app.add_flag("--best", o.best, "Print only the best engine configuration, as the engine reads it")
        ->excludes(json);
    app.add_option("--min-read-gibps", o.min_read, "Exit 75 if the best read is slower")
        ->check(cli::non_negative());
    app.add_option("--min-write-gibps", o.min_write, "Exit 75 if the best write is slower")
        ->check(cli::non_negative());
    app.add_flag("--keep", o.keep, "Keep the test file the run created");
    app.add_flag("--force", o.force, "Allow writing over an existing --file");
    app.footer("Exit status: 0 ok, 64 usage, 65 verify mismatch, 66 missing input, 73 cannot\n"
               "create the file (or no space for stdout), 74 I/O error, 75 a --min-* threshold not met, 130 interrupted.");
    return cli::run(app, argc, argv, "zinf-nvmebench", common, [&] { return run(o); });
}
