// The backends' factories, for device::open (cpu.cpp). The cuda ones are in
// cuda/device.cpp and cuda/gemm.cpp with the toolkit, cuda_none.cpp without
// (the Makefile builds one or the other).
#pragma once

#include <zinf/device.hpp>

#include <cstdint>
#include <memory>

namespace zinf::device {

std::unique_ptr<Device> open_cuda(const Options& opts);
// measure_gemm_flops on a cuda device: cuBLASLt's fp32 GEMM (TF32 off), or
// its bf16 GEMM with fp32 accumulation, timed with events on compute.
double cuda_gemm_flops(Device& dev, std::uint64_t n, unsigned reps, bool bf16);

}  // namespace zinf::device
