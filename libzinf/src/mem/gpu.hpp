// The few CUDA runtime calls the memory layer makes, behind plain functions so
// that no #if is needed: gpu_cuda.cpp is built when the CUDA toolkit is found,
// gpu_none.cpp otherwise (the Makefile picks one). Each throws zinf::Error
// naming the call and CUDA's message; none is called unless device_count() > 0.
#pragma once

#include <cstddef>
#include <string>

namespace zinf::mem::gpu {

// Visible CUDA devices; 0 with `why` set when there are none or no runtime.
int device_count(std::string* why);
void set_device(int device);  // cudaSetDevice: this thread's current device
std::string device_name(int device);
std::size_t device_memory(int device);  // bytes of global memory

void* host_alloc(std::size_t bytes);   // cudaHostAlloc (portable, page-locked)
void host_free(void* p) noexcept;
void* device_alloc(std::size_t bytes);  // cudaMalloc
void device_free(void* p) noexcept;

enum class Dir { to_device, to_host };
// Synchronous cudaMemcpy.
void copy(void* dst, const void* src, std::size_t bytes, Dir dir);

}  // namespace zinf::mem::gpu
