// zinf-train's helpers beside main: how many cores a rank takes and --bench (a training step's FLOP/s against OpenBLAS's sgemm).
#pragma once

#include <zinf/cli.hpp>
#include <zinf/comm.hpp>
#include <zinf/device.hpp>
#include <zinf/shard.hpp>
#include <zinf/train.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace zinf::trainer {

struct BenchOptions {
    bool enabled = false;
    std::string model = "gpt2-124m";
    std::string against;       // a second model timed step by step beside `model` (none when empty)
    unsigned steps = 5;        // timed, after one warm-up; the median is reported
    std::uint64_t gemm_n = 2048;
    double min_ratio = 0;      // exit 75 below it
    bool flash_attention = false;  // --attention flash: the step's blocks on the flash kernels
    std::vector<CLI::Option*> options;  // all but --bench itself
    void add(CLI::App& app);
    void check() const;  // UsageError: a --bench-* option without --bench
};

// The kernel threads of one rank: `threads` when given; else the CPUs this
// process may run on, shared out over the node's ranks unless mpirun bound
// each rank to its own set already.
unsigned cores_per_rank(const comm::Communicator& comm, unsigned threads);


// Stops (Interrupted) between steps once `stop` is set. `precision` is the
// step's GEMM inputs (--precision); a bf16 step is held to the bf16 GEMM rate
// where the device has one (cuda), else to sgemm's.
// `profile`: the timed steps under a device::Profile, reported after the
// result (profile.hpp). `checkpoint`: --checkpoint; auto weighs every
// block's activations against the device memory the model, its gradients
// and AdamW moments leave (train::choose_checkpointing).
int run_bench(const BenchOptions& o, std::uint64_t batch, std::uint64_t seq, device::Options device,
              device::Precision precision, bool json, train::Checkpointing checkpoint, bool profile,
              const std::atomic<bool>& stop);

// The bytes of the copy a profile's byte peak is measured with.
std::uint64_t profile_copy_bytes(device::Device& dev);

}  // namespace zinf::trainer
