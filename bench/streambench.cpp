// zinf-streambench: a whole file moved through the pinned pool with the
// mem::Stream helper, as zinf moves a tensor partition larger than the pool,
// every piece hashed with xxh3 on the way. Prints GiB/s per round and the peak
// resident memory; compare with zinf-nvmebench's best read on the same file
// (scripts/bench-stream.sh does both in one run).
#include "common.hpp"

#include <zinf/mem.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>

using namespace zinf;

namespace {

struct Options {
    std::string file;
    bench::EngineOptions engine;
    std::string pinned = "256MiB", buffer = "16MiB";
    std::size_t buffers = 0;
    unsigned rounds = 3;
    bool no_hash = false;
    bool json = false;
};

int run(const Options& o) {
    const io::EngineConfig cfg = o.engine.resolve();
    mem::PoolConfig pc;
    pc.bytes = cli::parse_sizes({o.pinned}, "--pinned")[0];
    pc.buffer = cli::parse_sizes({o.buffer}, "--pinned-buffer")[0];
    pc.validate();

    io::File f = bench::open_input(o.file);
    const std::uint64_t size = f.size();
    if (size == 0) throw UsageError(o.file + " is empty");

    io::Engine eng(cfg);
    mem::PinnedPool pool(pc, &eng);
    io::Registration freg = eng.register_file(f);
    mem::Stream stream(eng, pool, {.buffers = o.buffers, .who = "streambench"});
    const std::uint64_t rss0 = resident_bytes();

    std::vector<double> gibps;
    std::uint64_t digest = 0;
    for (unsigned r = 0; r < o.rounds; ++r) {
        Xxh3Stream h;
        Timer t;
        stream.read(f, 0, size, [&](std::uint64_t, std::span<const std::byte> piece) {
            if (!o.no_hash) h.update(piece);
        });
        gibps.push_back(double(size) / double(GiB) / t.seconds());
        // Every round reads the same bytes: a different hash is corruption.
        if (r > 0 && !o.no_hash && h.digest() != digest)
            throw DataError("round " + std::to_string(r + 1) + " read different bytes (xxh3 " + hex64(h.digest()) +
                                ") than round 1 (" + hex64(digest) + ")",
                            {0, o.file, {}, -1});
        digest = h.digest();
        log::info("round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds) + ": " +
                  std::to_string(gibps.back()) + " GiB/s");
    }
    const double median = zinf::median(gibps);
    const mem::PoolStats ps = pool.stats();
    const std::uint64_t peak = peak_resident_bytes();
    if (o.json) {
        json::Json rec = eng.config().to_json();
        rec["schema"] = "zinf.streambench/1";
        rec["file"] = o.file;
        rec["bytes"] = size;
        rec["direct"] = f.direct();
        rec["pool"] = ps.to_json();
        rec["stream_buffers"] = stream.buffers();
        rec["xxh3"] = o.no_hash ? json::Json(nullptr) : json::Json(hex64(digest));
        rec["rounds_gibps"] = gibps;
        rec["median_gibps"] = median;
        rec["rss_start_bytes"] = rss0;
        rec["rss_peak_bytes"] = peak;
        rec["version"] = version();
        std::fputs(json::line(rec).c_str(), stdout);
        flush_stdout();
    } else {
        std::printf("# zinf-streambench %s: %s of %s through a %s pinned pool (%s, %s)\n", version(),
                    format_size(size).c_str(), o.file.c_str(), pc.describe().c_str(),
                    ps.locked ? "locked" : "NOT locked", ps.registered ? "registered" : "not registered");
        std::printf("# engine %s, direct I/O %s%s\n", eng.config().describe().c_str(), f.direct() ? "on" : "off",
                    o.no_hash ? "" : (", xxh3 " + hex64(digest)).c_str());
        std::printf("# %5s %8s\n", "round", "GiB/s");
        for (std::size_t i = 0; i < gibps.size(); ++i) std::printf("%7zu %8.3f\n", i + 1, gibps[i]);
        std::printf("# median %.3f GiB/s; resident at start %s, peak %s\n", median, format_size(rss0).c_str(),
                    format_size(peak).c_str());
        flush_stdout();
    }
    return exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-streambench")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-streambench: move a whole file through the pinned pool with mem::Stream,\n"
                 "hashing every piece, as zinf moves a partition larger than the pool; GiB/s per round."};
    app.name("zinf-streambench");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("--file", o.file, "File to read (never written)")->required();
    o.engine.add(app);
    app.add_option("--pinned", o.pinned, "Page-locked memory in the pool");
    app.add_option("--pinned-buffer", o.buffer, "Bytes per pool buffer (a multiple of 4KiB)");
    app.add_option("--buffers", o.buffers, "Buffers the stream leases at once (0: half the pool, at least 2)");
    app.add_option("--rounds", o.rounds, "Timed passes over the file")->check(CLI::Range(1u, 100000u));
    app.add_flag("--no-hash", o.no_hash, "Do not hash the pieces (measure the transfer alone)");
    app.add_flag("--json", o.json, "One JSON record (zinf.streambench/1) instead of the table");
    return cli::run(app, argc, argv, "zinf-streambench", common, [&] { return run(o); });
}
