// zinf options (the cli module): the command-line options programs share,
// declared once so that every program spells them alike (--config or
// --engine/--block-size/--queue-depth/--queues; --pinned, --pinned-buffer;
// --backend, --comm-timeout; --device, --gpu, --device-memory;
// --prefetch-bytes, --persist-below). Sits on top of io, mem, comm, device
// and zero, below the programs.
#pragma once

#include <zinf/cli.hpp>
#include <zinf/comm.hpp>
#include <zinf/device.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>

#include <string>
#include <vector>

namespace zinf::zero {
struct EngineOptions;
}  // namespace zinf::zero

namespace zinf::cli {

struct EngineOptions {
    std::string config;  // engine configuration JSON (zinf-nvmebench --best)
    io::EngineConfig engine;
    std::string block_size = "1MiB";
    std::vector<CLI::Option*> flags;

    // Appended, not replaced: a program may add these to several subcommands.
    void add(CLI::App& app);
    // After parsing: the configuration to run, validated.
    io::EngineConfig resolve() const;
};

struct PoolOptions {
    std::string pinned = "256MiB", buffer = "16MiB";

    void add(CLI::App& app);
    mem::PoolConfig resolve() const;
};

struct CommOptions {
    std::string backend = "auto";
    std::string timeout;  // empty: ZINF_COMM_TIMEOUT or 300 s

    void add(CLI::App& app);
    comm::Options resolve(comm::Memory memory = comm::Memory::host) const;
};

// --device-memory: a size ("4GiB"), or "auto": three quarters of the memory
// available now, as the cpu backend's arena takes pages only as they are used
// (`gpu_bytes`: three quarters of the GPU's memory instead, for cuda).
std::uint64_t device_memory(const std::string& text, std::uint64_t gpu_bytes = 0);

// --device, --gpu and --device-memory: which backend runs the kernels, on
// which GPU, and its memory budget. The default is cpu, the reference, until
// the cuda backend has passed its checks on a GPU (tests/unit/test_cuda.cpp,
// tests/e2e/cuda.sh): every suite that compares runs' bits or runs data
// parallel assumes it.
struct DeviceOptions {
    std::string device = "cpu";
    int gpu = -1;
    std::string memory = "auto";
    // --attention gemm|flash|auto: the attention kernels a training step's
    // blocks run (model::Shape::attention); auto is gemm until flash wins
    // the profile on a GPU (docs/cuda-backend.md). Decoding is the same
    // for all three.
    std::string attention = "auto";

    void add(CLI::App& app);
    // The backend auto stands for here: "cuda" or "cpu".
    std::string backend() const;
    // After parsing: whether --attention asks for the flash kernels.
    bool flash_attention() const { return attention == "flash"; }
    // After parsing: the device to open, its budget from --device-memory
    // (auto: of the GPU's memory on cuda), `threads` for the cpu backend.
    device::Options resolve(unsigned threads) const;
};

// --prefetch-bytes and --persist-below: how far the ZeRO-Infinity engine
// fetches ahead, and which parameters stay on the device. A program that
// only samples takes --persist-below auto (its default): every parameter
// kept when all of them fit (zero::EngineOptions::persist_if_fits).
struct ZeroOptions {
    std::string prefetch_bytes = "64MiB";
    std::string persist_below = "0";
    bool sampling = false;

    void add(CLI::App& app, bool sampling);
    // After parsing: the engine's options these set, the rest defaults.
    zero::EngineOptions resolve() const;
};

}  // namespace zinf::cli
