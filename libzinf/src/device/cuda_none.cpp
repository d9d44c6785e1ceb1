// Built without the CUDA toolkit: the cuda backend says so when asked for.
#include "backends.hpp"

namespace zinf::device {

std::string cuda_unavailable() {
    return "this zinf was built without CUDA (NO_CUDA=1, or no CUDA toolkit found at build time)";
}

std::unique_ptr<Device> open_cuda(const Options&) {
    throw UsageError("device backend 'cuda' cannot run: " + cuda_unavailable());
}

double cuda_gemm_flops(Device&, std::uint64_t, unsigned, bool) {
    throw InternalError("cuda_gemm_flops called in a build without CUDA");
}

}  // namespace zinf::device
