// The options every program that runs the io engine, the pinned pool or a
// communicator spells alike (options.hpp). Here, not inline in the header, so
// that the header needs only CLI11's declarations.
#include <zinf/options.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>

namespace zinf::cli {

void EngineOptions::add(CLI::App& app) {
    app.add_option("--config", config, "Engine configuration JSON, e.g. from zinf-nvmebench --best");
    flags.insert(flags.end(),
                 {app.add_option("-e,--engine", engine.engine, "Engine: uring, threads, auto")
                      ->check(CLI::IsMember({"uring", "threads", "auto"})),
                  app.add_option("-b,--block-size", block_size, "Bytes per piece"),
                  app.add_option("-d,--queue-depth", engine.queue_depth, "Pieces in flight per queue"),
                  app.add_option("-Q,--queues", engine.queues, "io_uring rings (thread groups for threads)")});
}

io::EngineConfig EngineOptions::resolve() const {
    io::EngineConfig cfg = engine;
    if (!config.empty()) {
        if (std::any_of(flags.begin(), flags.end(), [](CLI::Option* o) { return o->count() > 0; }))
            throw UsageError("--config and the engine flags (--engine, --block-size, --queue-depth, --queues) "
                             "exclude each other");
        cfg = io::EngineConfig::load(config);
    } else {
        cfg.block_size = parse_sizes({block_size}, "--block-size")[0];
    }
    cfg.validate();
    return cfg;
}

void PoolOptions::add(CLI::App& app) {
    app.add_option("--pinned", pinned, "Page-locked memory for all transfers (the memory bound)");
    app.add_option("--pinned-buffer", buffer, "Bytes per pool buffer (a multiple of 4KiB)");
}

mem::PoolConfig PoolOptions::resolve() const {
    mem::PoolConfig pc;
    pc.bytes = parse_sizes({pinned}, "--pinned")[0];
    pc.buffer = parse_sizes({buffer}, "--pinned-buffer")[0];
    pc.validate();
    return pc;
}

void CommOptions::add(CLI::App& app) {
    app.add_option("--backend", backend, "Communicator: auto, mpi, nccl, self")
        ->check(CLI::IsMember({"auto", "mpi", "nccl", "self"}));
    app.add_option("--comm-timeout", timeout,
                   "Longest wait for one collective before it fails (30s, 5m; 0 = forever); "
                   "default ZINF_COMM_TIMEOUT or 300s");
}

comm::Options CommOptions::resolve(comm::Memory memory) const {
    comm::Options o;
    o.backend = comm::parse_backend(backend);
    o.memory = memory;
    if (!timeout.empty()) {
        try {
            o.timeout = comm::to_timeout(parse_duration(timeout));
        } catch (const UsageError& e) {
            throw UsageError("--comm-timeout: " + e.message());
        }
    }
    return o;
}

}  // namespace zinf::cli
