// Which GPU a process takes: the --gpu it was given, else its local rank on
// the node as the launcher tells it, so that the ranks of one node spread
// over its GPUs as NCCL expects (comm/nccl.cpp picks by local rank alike).
#include <zinf/device.hpp>

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

namespace zinf::device {

int select_gpu(int requested, int count, const std::function<const char*(const char*)>& env) {
    if (count <= 0) throw UsageError("no CUDA GPU to select from");
    if (requested >= 0) {
        if (requested >= count)
            throw UsageError("--gpu " + std::to_string(requested) + ": there " +
                             (count == 1 ? "is 1 GPU (0)" : "are " + std::to_string(count) + " GPUs (0 to " +
                                                                std::to_string(count - 1) + ")"));
        return requested;
    }
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
        const char* value = env(name);
        if (!value || !*value) continue;
        const std::string_view text(value);
        int rank = -1;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
        if (ec != std::errc() || end != text.data() + text.size() || rank < 0)
            throw UsageError(std::string(name) + "='" + value + "' is not a local rank (a number >= 0)");
        return rank % count;
    }
    return 0;
}

int select_gpu(int requested, int count) {
    return select_gpu(requested, count, [](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace zinf::device
