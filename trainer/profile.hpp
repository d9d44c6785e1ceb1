// zinf-train --profile's report: the device profile (zinf/profile.hpp) as a
// table on stderr and, with --json, zinf.profile/1 records on stdout
// (man/zinf-train.1 has every key).
#pragma once

#include <zinf/profile.hpp>

#include <string>

namespace zinf::trainer {

// What the report says of the run beside the profile.
struct ProfileRun {
    std::string model;      // the model spec
    std::string precision;  // fp32, bf16
    std::uint64_t batch = 0, seq = 0;
    int rank = 0;
    double model_flops = 0;  // LanguageModel::flops_per_step, one step of this rank
};

// The table on stderr; the records on stdout when `json`. With the profile
// off, times the device's own GEMM at each of the step's `gemm_shapes`
// costliest GEMM shapes (device::measure_gemm), so that a GEMM row is held
// to the rate of its own shape as well as to the square GEMM's.
void report_profile(const device::Profile& p, const device::Peaks& peaks, device::Device& dev, const ProfileRun& run,
                    bool json, unsigned gemm_shapes = 6);

}  // namespace zinf::trainer
