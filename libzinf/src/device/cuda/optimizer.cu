// The cuda backend's optimizer kernel (kernels.hpp): AdamW over one piece,
// optim.hpp's update element for element (util/kernel_math.hpp's, the CPU
// AdamW's too), one thread an element.
#include "common.cuh"

#include "../../optim/kernels.hpp"  // optim::detail::Ptrs, the CPU kernels' view of an Update

#include <zinf/optim.hpp>

namespace zinf::device::cuda {

namespace {

using optim::detail::Ptrs;

__global__ void adamw_kernel(Ptrs p, u64 n, optim::Scalars s) {
    for (u64 i = global_id(); i < n; i += grid_threads()) kernel_math::adamw_update(p, i, s);
}

}  // namespace

cudaError_t preload_optimizer() { return load_kernels(adamw_kernel); }

void adamw(const Launch& l, const optim::Update& u, const optim::Scalars& k) {
    if (const u64 n = u.size()) adamw_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(optim::detail::ptrs(u), n, k);
}

}  // namespace zinf::device::cuda
