// The device options (options.hpp's DeviceOptions): a file of their own, so
// that a program that parses only the io engine's, the pool's or a
// communicator's options (zinf-shard, the disk benchmarks) links no device
// backend, and so neither the CUDA runtime nor OpenBLAS, whose loading each
// start would pay.
#include <zinf/options.hpp>

#include <CLI/CLI.hpp>

namespace zinf::cli {

std::uint64_t device_memory(const std::string& text, std::uint64_t gpu_bytes) {
    if (text != "auto") {
        const std::uint64_t bytes = parse_sizes({text}, "--device-memory")[0];
        if (bytes == 0) throw UsageError("--device-memory " + text + ": the device needs a budget (a size, or auto)");
        return bytes;
    }
    if (gpu_bytes) return gpu_bytes / 4 * 3;
    const std::uint64_t available = meminfo_bytes("MemAvailable");
    return available ? available / 4 * 3 : 4 * GiB;  // what the kernel lets one mapping take
}

void DeviceOptions::add(CLI::App& app) {
    app.add_option("--device", device, "Device backend: auto (cuda when a GPU is present, else cpu), cpu, cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--gpu", gpu, "The GPU (cuda); default: the local rank modulo the GPUs, else 0")
        ->default_str("local rank")
        ->check(cli::non_negative());
    app.add_option("--device-memory", memory,
                   "Device memory budget (4GiB); auto: 3/4 of the memory available (the cpu backend takes pages as used)")
        ->capture_default_str();
    app.add_option("--attention", attention,
                   "Attention kernels of a training step: gemm (GEMMs around a softmax, the (B,heads,T,T) "
                   "probabilities kept for backward), flash (an online softmax over tiles of keys: a log-sum-exp "
                   "per row kept, the probabilities recomputed in backward), auto (gemm, until flash wins the "
                   "profile); decoding is the same for all")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "gemm", "flash"}));
}

std::string DeviceOptions::backend() const {
    if (device != "auto") return device;
    return device::cuda_unavailable().empty() ? "cuda" : "cpu";
}

device::Options DeviceOptions::resolve(unsigned threads) const {
    check_thread_count(threads, "--threads");
    device::Options d{.backend = backend(), .threads = threads, .gpu = gpu};
    if (d.backend != "cuda" && gpu >= 0) throw UsageError("--gpu is for --device cuda (or auto on a GPU host)");
    d.memory_bytes = device_memory(memory, d.backend == "cuda" && memory == "auto" ? mem::gpu_info().bytes : 0);
    // The cpu backend's budget is host memory, mapped up front: one past
    // what the machine has (its memory and swap) cannot be mapped, and is
    // the command line's fault (64), not an I/O error (the mmap's ENOMEM).
    if (d.backend == "cpu" && memory != "auto") {
        const std::uint64_t have = meminfo_bytes("MemTotal") + meminfo_bytes("SwapTotal");
        if (have && d.memory_bytes > have)
            throw UsageError("--device-memory " + memory + " is more than this machine's memory and swap (" +
                             format_size(have) + "), which the cpu device's budget is");
    }
    return d;
}

}  // namespace zinf::cli
