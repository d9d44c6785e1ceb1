// Built without the CUDA toolkit: no device, ever; the callers never get past
// device_count().
#include "gpu.hpp"

#include <zinf/util.hpp>

namespace zinf::mem::gpu {

int device_count(std::string* why) {
    if (why) *why = "built without CUDA (NO_CUDA=1 or no toolkit found)";
    return 0;
}

[[noreturn]] static void no_cuda(const char* call) {
    throw InternalError(std::string(call) + " called in a build without CUDA");
}

void set_device(int) { no_cuda("cudaSetDevice"); }
std::string device_name(int) { no_cuda("device_name"); }
std::size_t device_memory(int) { no_cuda("device_memory"); }
void* host_alloc(std::size_t) { no_cuda("cudaHostAlloc"); }
void host_free(void*) noexcept {}
void* device_alloc(std::size_t) { no_cuda("cudaMalloc"); }
void device_free(void*) noexcept {}
void copy(void*, const void*, std::size_t, Dir) { no_cuda("cudaMemcpy"); }

}  // namespace zinf::mem::gpu
