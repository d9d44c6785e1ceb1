// zinf options: the command-line options of programs that run the io engine
// and the pinned pool, declared once so that every program spells them alike
// (--config or --engine/--block-size/--queue-depth/--queues; --pinned,
// --pinned-buffer; --backend, --comm-timeout; --device, --gpu, --device-memory). Sits on top of cli,
// io, mem, comm and device.
#pragma once

#include <zinf/cli.hpp>
#include <zinf/comm.hpp>
#include <zinf/device.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace zinf::cli {

struct EngineOptions {
    std::string config;  // engine configuration JSON (zinf-nvmebench --best)
    io::EngineConfig engine;
    std::string block_size = "1MiB";
    std::vector<CLI::Option*> flags;

    void add(CLI::App& app) {
        app.add_option("--config", config, "Engine configuration JSON, e.g. from zinf-nvmebench --best");
        // Appended, not replaced: a program may add these to several subcommands.
        flags.insert(flags.end(),
                     {app.add_option("-e,--engine", engine.engine, "Engine: uring, threads, auto")
                          ->check(CLI::IsMember({"uring", "threads", "auto"})),
                      app.add_option("-b,--block-size", block_size, "Bytes per piece"),
                      app.add_option("-d,--queue-depth", engine.queue_depth, "Pieces in flight per queue"),
                      app.add_option("-Q,--queues", engine.queues, "io_uring rings (thread groups for threads)")});
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
            cfg.block_size = parse_sizes({block_size}, "--block-size")[0];
        }
        cfg.validate();
        return cfg;
    }
};

struct PoolOptions {
    std::string pinned = "256MiB", buffer = "16MiB";

    void add(CLI::App& app) {
        app.add_option("--pinned", pinned, "Page-locked memory for all transfers (the memory bound)");
        app.add_option("--pinned-buffer", buffer, "Bytes per pool buffer (a multiple of 4KiB)");
    }

    mem::PoolConfig resolve() const {
        mem::PoolConfig pc;
        pc.bytes = parse_sizes({pinned}, "--pinned")[0];
        pc.buffer = parse_sizes({buffer}, "--pinned-buffer")[0];
        pc.validate();
        return pc;
    }
};

struct CommOptions {
    std::string backend = "auto";
    std::string timeout;  // empty: ZINF_COMM_TIMEOUT or 300 s

    void add(CLI::App& app) {
        app.add_option("--backend", backend, "Communicator: auto, mpi, nccl, self")
            ->check(CLI::IsMember({"auto", "mpi", "nccl", "self"}));
        app.add_option("--comm-timeout", timeout,
                       "Longest wait for one collective before it fails (30s, 5m; 0 = forever); "
                       "default ZINF_COMM_TIMEOUT or 300s");
    }

    comm::Options resolve(comm::Memory memory = comm::Memory::host) const {
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
};

// --device-memory: a size ("4GiB"), or "auto": three quarters of the memory
// available now, as the cpu backend's arena takes pages only as they are used
// (`gpu_bytes`: three quarters of the GPU's memory instead, for cuda).
inline std::uint64_t device_memory(const std::string& text, std::uint64_t gpu_bytes = 0) {
    if (text != "auto") return parse_sizes({text}, "--device-memory")[0];
    if (gpu_bytes) return gpu_bytes / 4 * 3;
    const std::uint64_t available = meminfo_bytes("MemAvailable");
    return available ? available / 4 * 3 : 4 * GiB;  // what the kernel lets one mapping take
}

// --device and --gpu: which backend runs the kernels, and on which GPU. The
// default is cpu, the reference, until the cuda backend has passed its checks
// on a GPU (tests/unit/test_cuda.cpp, tests/e2e/cuda.sh): every suite that
// compares runs' bits or runs data parallel assumes it.
struct DeviceOptions {
    std::string device = "cpu";
    int gpu = -1;

    void add(CLI::App& app) {
        app.add_option("--device", device, "Device backend: auto (cuda when a GPU is present, else cpu), cpu, cuda")
            ->capture_default_str()
            ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
        app.add_option("--gpu", gpu, "The GPU (cuda); default: the local rank modulo the GPUs, else 0")
            ->default_str("local rank")
            ->check(CLI::NonNegativeNumber);
    }

    // The backend auto stands for here: "cuda" or "cpu".
    std::string backend() const {
        if (device != "auto") return device;
        return device::cuda_unavailable().empty() ? "cuda" : "cpu";
    }

    // After parsing: the device to open, its budget from --device-memory's
    // text (auto: of the GPU's memory on cuda), `threads` for the cpu backend.
    device::Options resolve(const std::string& memory, unsigned threads) const {
        device::Options d{.backend = backend(), .threads = threads, .gpu = gpu};
        if (d.backend != "cuda" && gpu >= 0) throw UsageError("--gpu is for --device cuda (or auto on a GPU host)");
        d.memory_bytes = device_memory(memory, d.backend == "cuda" && memory == "auto" ? mem::gpu_info().bytes : 0);
        return d;
    }
};

}  // namespace zinf::cli
