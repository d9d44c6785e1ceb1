// zinf device profile: every kernel a Device runs (kernels.def's public
// calls) and every copy, timed where the work runs and summed per name, with
// the FLOPs and bytes each call moves and the floor the device's measured
// peaks put under it (zinf-train --profile).
//
//   device::Profile prof(*dev);
//   dev->set_profile(&prof);            // from here every call is timed
//   ... the step ...; dev->synchronize(s);
//   prof.collect(step_seconds);        // read the stamps: the step is done
//   dev->set_profile(nullptr);
//   prof.rows();                       // per name: calls, seconds, FLOPs, bytes
//
// Timing: the public call (checks.cpp, the one place every kernel passes)
// puts a stamp on the call's stream before and after the backend's body:
// on cpu a job that reads the steady clock on the stream's worker thread
// (where the body runs: the stamps time the body, not its enqueueing), on
// cuda a timing event recorded on the call's stream. Nothing waits when a
// stamp is made; collect() reads them after the step's own synchronize.
// Profiling off is one pointer test per call.
//
// Each kernel's cost (FLOPs and bytes a call moves) is a formula of its
// arguments, one per kernels.def entry, in device/cost.cpp (the declarations
// below are made from kernels.def: a kernel without its formula does not
// link). FLOPs are the arithmetic the kernel's definition asks for, a
// multiply-add two; a GEMM 2 m n k per matrix; attention its two products
// (4 hd per query-key pair forward, 8 backward: the model's count,
// model.hpp), the softmax's exponentials not counted; norms and element-wise
// ops the handful of operations per element their definition makes. Bytes
// are what the call must read and write at the least: each input once, each
// output once (twice where it accumulates, read and written), at its stored
// width.
#pragma once

#include <zinf/device.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::device {

// What one call of a kernel costs at the least. `detail` names a finer row
// within the kernel's where the cost depends on more than the kernel (a
// GEMM's shape and element types: gemm_detail); empty for the rest.
struct Cost {
    double flops = 0;
    double bytes = 0;
    std::string detail;
};

// A GEMM as a profile row names it, and back: "MxNxK TA TB xBATCH INPUTS
// A-DTYPE B-DTYPE" ("4096x2304x768 N T x1 fp32 fp32 fp32": m, n, k, op(A)
// and op(B) transposed or not, the batch, Gemm::inputs, A's and B's
// storage). gemm_of_detail gives nullopt for any other text.
struct GemmShape {
    Gemm g;
    DType a = DType::f32, b = DType::f32;
};
std::string gemm_detail(const Gemm& g, DType a, DType b);
std::optional<GemmShape> gemm_of_detail(std::string_view detail);
// FLOP/s of `reps` GEMMs of that shape on compute (packed operands of
// random values, beta 0), timed by stamps after a warm-up: the device's own
// rate at a step's shape (cuBLASLt's on cuda, the device's sgemm on cpu).
double measure_gemm(Device& dev, const GemmShape& shape, unsigned reps);

namespace cost {
#define ZINF_KERNEL(name, ...) Cost name(ZINF_KERNEL_PARAMS(__VA_ARGS__));
#include <zinf/kernels.def>
}  // namespace cost

// The device's peaks, measured in the same run (measure_peaks): what a row's
// floor is held against.
struct Peaks {
    double flops = 0;       // FLOP/s: the GEMM of the step's arithmetic (sgemm; the bf16 GEMM on cuda under bf16)
    double bytes = 0;       // bytes/s: a device-to-device copy, read and write counted
    std::string flops_peer;  // "sgemm", "bf16_gemm"
};
// A timed n x n GEMM (measure_gemm_flops, or measure_gemm_bf16_flops for a
// bf16 step on a device that has it) and a timed copy of copy_bytes within
// device memory (best of `reps`; 2 * copy_bytes moved each).
Peaks measure_peaks(Device& dev, Precision precision, std::uint64_t gemm_n, std::uint64_t copy_bytes, unsigned reps);

class Profile {
public:
    // One name's sum over the collected steps.
    struct Row {
        std::string name;    // the kernel ("gemm"), or "copy"; "@<stream>" appended off compute
        std::string stream;  // the stream it ran on
        std::uint64_t calls = 0;
        double seconds = 0, flops = 0, bytes = 0;
    };

    explicit Profile(Device& dev);
    Profile(const Profile&) = delete;
    Profile& operator=(const Profile&) = delete;
    ~Profile();

    // Called by the device around each call (checks.cpp): the stamp before
    // the body, and after it with the call's cost. Any thread.
    Stamp begin(Stream& s);
    void end(Stream& s, std::string_view name, const Cost& c, Stamp before);

    // An engine stage: the time between two stamps of one stream (the
    // trainer's forward, backward and optimizer on compute), or seconds the
    // engine measured itself (compute's wait for its fetches, the
    // optimizer's). Summed per name like the kernels, in stages().
    void stage(std::string_view name, Stamp a, Stamp b);
    void stage(std::string_view name, double seconds);

    // Reads the stamps of every call since the last collect into the rows,
    // and counts one step of `step_seconds` (wall time, from its start to
    // its synchronize). Reads, never waits: a call whose stream has not
    // passed its stamps yet (a copy the engine left running into the next
    // step) stays for the next collect; the step's own synchronize has
    // passed every stamp of compute.
    void collect(double step_seconds);

    // Rows by seconds, most first. Compute's rows are the step's serial
    // work; the other streams' overlap it.
    std::vector<Row> rows() const;
    std::vector<Row> stages() const;  // by seconds, most first
    // The kernels' finer rows (Cost::detail), named "<kernel> <detail>", by
    // seconds; their kernel's row holds them too.
    std::vector<Row> details() const;
    std::size_t uncollected() const;  // calls whose stamps were never passed
    std::uint64_t steps() const { return steps_; }
    double step_seconds() const { return step_seconds_; }  // summed over the collected steps
    // The compute stream's rows' seconds; step_seconds() less it is the time
    // compute ran none of them (waits, host jobs, launch gaps: "other").
    double compute_seconds() const;
    const Stream& compute() const { return *compute_; }

private:
    struct Pending {
        const Stream* stream;
        std::string name;
        Cost cost;
        Stamp a, b;
        bool stage = false;
    };
    Device& dev_;
    const Stream* compute_;
    mutable std::mutex mu_;
    std::vector<Pending> pending_;
    std::map<std::string, Row> rows_, stages_, details_;
    std::uint64_t steps_ = 0;
    double step_seconds_ = 0;
};

// Seconds the row would take at the peaks: its FLOPs at peaks.flops or its
// bytes at peaks.bytes, whichever is longer (0 where the peak is unknown).
double floor_seconds(const Profile::Row& r, const Peaks& peaks);

}  // namespace zinf::device
