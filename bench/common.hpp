// What the library benchmarks (zinf-iobench, zinf-streambench) share: the
// engine options (a --config file or the four engine flags, never both), the
// input file, and the median of their rounds.
#pragma once

#include <zinf/cli.hpp>
#include <zinf/io.hpp>

#include <algorithm>
#include <cerrno>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace zinf::bench {

struct EngineOptions {
    std::string config;  // engine configuration JSON (zinf-nvmebench --best)
    io::EngineConfig engine;
    std::string block_size = "1MiB";
    std::vector<CLI::Option*> flags;

    void add(CLI::App& app) {
        app.add_option("--config", config, "Engine configuration JSON, e.g. from zinf-nvmebench --best");
        flags = {app.add_option("-e,--engine", engine.engine, "Engine: uring, threads, auto")
                     ->check(CLI::IsMember({"uring", "threads", "auto"})),
                 app.add_option("-b,--block-size", block_size, "Bytes per piece"),
                 app.add_option("-d,--queue-depth", engine.queue_depth, "Pieces in flight per queue"),
                 app.add_option("-Q,--queues", engine.queues, "io_uring rings (thread groups for threads)")};
    }

    // After parsing: the configuration to run, validated.
    io::EngineConfig resolve() const {
        io::EngineConfig cfg = engine;
        if (!config.empty()) {
            if (std::any_of(flags.begin(), flags.end(), [](CLI::Option* o) { return o->count() > 0; }))
                throw UsageError("--config and the engine flags (--engine, --block-size, --queue-depth, --queues) "
                                 "exclude each other");
            cfg = io::EngineConfig::load(config);
        } else {
            cfg.block_size = cli::parse_sizes({block_size}, "--block-size")[0];
        }
        cfg.validate();
        return cfg;
    }
};

// Opens an existing regular file for reading: 66 when missing, 64 when not a file.
inline io::File open_input(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat", errno, path);
    if (!S_ISREG(st.st_mode)) throw UsageError(path + ": not a regular file");
    return io::File::open(path, {});
}

inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace zinf::bench
