// zinf-iobench: what the library API delivers to the rest of zinf. One
// Engine::read of a whole file into page-locked, registered memory per round:
// the way a partition or a chunk of optimizer state is fetched. Compare its
// median with zinf-nvmebench's best read on the same file (scripts/bench-api.sh).
#include "common.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <sys/stat.h>

using namespace zinf;

namespace {

struct Options {
    std::string file;
    std::string size;
    bench::EngineOptions engine;
    unsigned rounds = 5;
    bool json = false;
    bool no_fixed = false;
    bool small_pages = false;
};

int run(const Options& o) {
    const io::EngineConfig cfg = o.engine.resolve();
    io::File f = bench::open_input(o.file);
    std::uint64_t size = o.size.empty() ? f.size() : parse_size(o.size);
    if (size > f.size())
        throw UsageError(o.file + " has " + std::to_string(f.size()) + " bytes, fewer than --size " +
                         std::to_string(size));
    // Direct I/O moves whole alignment units; a tail shorter than one is not read.
    const std::uint64_t aligned = align_down(size, f.alignment());
    if (aligned == 0)
        throw UsageError(o.file + ": " + std::to_string(size) + " bytes is less than one " +
                         std::to_string(f.alignment()) + "-byte direct-I/O unit");
    if (aligned != size)
        log::info("reading " + std::to_string(aligned) + " bytes: --size rounded down to the " +
                  std::to_string(f.alignment()) + "-byte direct-I/O alignment");
    size = aligned;

    // Pinned memory: allocated and locked once, then registered with the rings,
    // as the pinned pool will do.
    const Mmap::Pages pages = o.small_pages ? Mmap::Pages::small : Mmap::Pages::huge;
    Mmap mem = Mmap::anonymous(align_up(size, 4096), true, pages);
    if (int err = mem.lock())
        log::warn("mlock of " + format_size(mem.size()) + " refused (" + std::strerror(err) +
                  "); measuring with unlocked memory (raise `ulimit -l`)");
    io::Engine eng(cfg);
    std::vector<io::Registration> regs;
    for (std::uint64_t at = 0; !o.no_fixed && at < mem.size(); at += GiB)
        regs.push_back(eng.register_buffer(mem.bytes().subspan(at, std::min<std::uint64_t>(GiB, mem.size() - at))));
    io::Registration freg = eng.register_file(f);
    auto dst = mem.bytes().first(size);
    const auto fixed = std::count_if(regs.begin(), regs.end(), [](auto& r) { return r.active(); });
    const bool all_fixed = !regs.empty() && fixed == static_cast<long>(regs.size());

    std::vector<double> gibps;
    for (unsigned r = 0; r < o.rounds; ++r) {
        if (!f.direct()) {  // dirty pages cannot be dropped: write them first
            f.sync();
            ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
        }
        Timer t;
        eng.wait(eng.read(f, 0, dst));
        const double s = t.seconds();
        gibps.push_back(double(size) / double(GiB) / s);
        log::info("round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds) + ": " +
                  std::to_string(gibps.back()) + " GiB/s");
    }
    const double median = zinf::median(gibps);
    if (o.json) {
        json::Json rec = eng.config().to_json();
        rec["schema"] = "zinf.iobench/1";
        rec["op"] = "read";
        rec["file"] = o.file;
        rec["bytes"] = size;
        rec["direct"] = f.direct();
        rec["locked"] = mem.locked();
        rec["fixed_buffers"] = all_fixed;  // every byte read lands in registered memory
        rec["version"] = version();
        rec["huge_pages"] = !o.small_pages;  // asked for; the kernel may give small ones
        rec["rounds_gibps"] = gibps;
        rec["median_gibps"] = median;
        std::fputs(json::line(rec).c_str(), stdout);
        flush_stdout();
    } else {
        std::printf("# zinf-iobench %s: one Engine::read of %s from %s into %s memory\n", version(),
                    format_size(size).c_str(), o.file.c_str(), mem.locked() ? "locked" : "unlocked");
        std::printf("# engine %s, direct I/O %s, %s pages, fixed buffers %s\n",
                    eng.config().describe().c_str(), f.direct() ? "on" : "off",
                    o.small_pages ? "4KiB" : "huge",
                    all_fixed ? "on" : fixed ? "partly (a registration was refused)" : "off");
        std::printf("# %5s %8s\n", "round", "GiB/s");
        for (std::size_t i = 0; i < gibps.size(); ++i) std::printf("%7zu %8.3f\n", i + 1, gibps[i]);
        std::printf("# median %.3f GiB/s\n", median);
        flush_stdout();
    }
    return exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-iobench")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-iobench: read a whole file with one io::Engine request into locked,\n"
                 "registered memory, as zinf fetches model state; prints GiB/s per round."};
    app.name("zinf-iobench");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("--file", o.file, "File to read (never written)")->required();
    app.add_option("--size", o.size, "Bytes to read (default: the whole file)");
    o.engine.add(app);
    app.add_option("--rounds", o.rounds, "Timed reads of the file")->check(CLI::Range(1u, 100000u));
    app.add_flag("--no-huge-pages", o.small_pages,
                 "Use 4KiB pages instead of transparent huge pages (MADV_HUGEPAGE)");
    app.add_flag("--no-fixed-buffers", o.no_fixed, "Do not register the memory with io_uring");
    app.add_flag("--json", o.json, "One JSON record (zinf.iobench/1) instead of the table");
    return cli::run(app, argc, argv, "zinf-iobench", common, [&] { return run(o); });
}
