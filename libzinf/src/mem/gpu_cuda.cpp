// The CUDA runtime calls of the memory layer (built when the toolkit is found).
// Linked with the static runtime, so a binary runs on machines without CUDA:
// there cudaGetDeviceCount fails and device_count() says why.
#include "gpu.hpp"

#include <zinf/util.hpp>

#include <cuda_runtime_api.h>

#include <mutex>

namespace zinf::mem::gpu {

static std::string describe(cudaError_t e) {
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

static void check(cudaError_t e, const std::string& call) {
    if (e != cudaSuccess) throw IoError(call + " failed (" + describe(e) + ")");
}

int device_count(std::string* why) {
    // Asked once: the first call initialises the runtime, which is slow.
    static std::once_flag once;
    static int count = 0;
    static std::string reason;
    std::call_once(once, [] {
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) {
            count = 0;
            reason = "no usable CUDA device (" + describe(e) + ")";
            (void)cudaGetLastError();  // clear the sticky error
        } else if (count == 0) {
            reason = "no CUDA device";
        }
    });
    if (why) *why = reason;
    return count;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"); }

std::string device_name(int device) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return prop.name;
}

std::size_t device_memory(int device) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return prop.totalGlobalMem;
}

void* host_alloc(std::size_t bytes) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc of " + format_size(bytes));
    return p;
}

void host_free(void* p) noexcept {
    if (p) (void)cudaFreeHost(p);
}

void* device_alloc(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc of " + format_size(bytes));
    return p;
}

void device_free(void* p) noexcept {
    if (p) (void)cudaFree(p);
}

void copy(void* dst, const void* src, std::size_t bytes, Dir dir) {
    check(cudaMemcpy(dst, src, bytes, dir == Dir::to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
          std::string("cudaMemcpy ") + (dir == Dir::to_device ? "host to device" : "device to host") +
              " of " + format_size(bytes));
}

}  // namespace zinf::mem::gpu
