// zinf plan: the paper's memory and bandwidth model (ZeRO-Infinity §3-4), fed
// by measured bandwidths. Every formula is defined once here and in
// plan.cpp, and written out in man/zinf-plan.1.
//
//   zinf::plan::Workload w{.spec = ModelSpec::parse("paper-1t"), .dp = 512, .batch = 1};
//   zinf::plan::Hardware h;                  // peak 70 TFLOP/s, bandwidths from bench JSON
//   zinf::plan::read_bench(json_line, h);    // zinf-nvmebench / pinstress / commbench / optbench
//   auto report = zinf::plan::plan(w, h, 0.9);
//
// Units: bytes, FLOP/s and bytes/s throughout; bandwidths are printed in GB/s
// (10^9 bytes/s) as the paper gives them.
#pragma once

#include <zinf/shard.hpp>

#include <algorithm>
#include <zinf/util.hpp>

#include <array>
#include <iosfwd>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::plan {

using shard::DType;
using shard::Tier;

struct Workload {
    shard::ModelSpec spec;
    unsigned dp = 1;                 // data-parallel ranks (one device each)
    unsigned nodes = 1;              // dp ranks spread evenly over this many nodes
    unsigned tile = 1;               // memory-centric tiling factor of the linear weights
    std::uint64_t batch = 1;         // per device (bsz)
    std::uint64_t seq = 0;           // 0: the model's
    unsigned ci = 1;                 // transformer blocks between activation checkpoints
    DType param_dtype = DType::bf16, grad_dtype = DType::bf16;
    // zinf-train's --optimizer-readahead, per rank: the optimizer state read
    // during backward (step_s); none: "auto", what the node's memory spares.
    std::optional<std::uint64_t> readahead;
    void validate() const;           // UsageError
    std::uint64_t sequence() const { return seq ? seq : spec.seq; }
    unsigned ranks_per_node() const { return (dp + nodes - 1) / nodes; }
};

// Capacities per device (gpu) or per node (cpu, nvme), and bandwidths, each
// with where it came from ("flag", "bench FILE", "machine", "default").
struct Hardware {
    // Achievable per device: the paper's V100 figure, or the GEMM rate a
    // zinf-train --profile run measured on the device (its zinf.profile/1
    // step record's peak_flops_per_s, the best of them; peak_measured).
    double peak_flops = 70e12;
    bool peak_measured = false;
    std::uint64_t gpu_bytes = 0;         // per device
    std::uint64_t gpu_max_block = 0;     // largest contiguous allocation; 0: gpu_bytes
    std::uint64_t cpu_bytes = 0;         // per node
    std::uint64_t nvme_bytes = 0;        // per node
    double gpu_gpu_bps = 0;              // per device, allgather bus bandwidth
    double cpu_gpu_bps = 0;              // per device, pinned host <-> device
    double nvme_read_bps = 0, nvme_write_bps = 0;  // per node
    double cpu_update_bps = 0;           // per node: the CPU optimizer's memory traffic (zinf-optbench)
    // Per node: the xxh3 the NVMe optimizer computes of every byte it reads
    // from and writes to its files (zinf-optbench's xxh3_gibps); 0: not
    // measured, and not counted.
    double cpu_hash_bps = 0;
    // Where each figure came from: the record (file:line) or flag that set the value in force.
    std::string source_peak = "default", source_gpu_gpu, source_cpu_gpu, source_nvme_read, source_nvme_write,
                source_cpu_update, source_cpu_hash;
};

// A bench program's JSON record (one line of zinf-nvmebench, -pinstress,
// -commbench or -optbench --json, or zinf-train --profile --json's step
// record, for the device's GEMM rate) folded into `h`: the best figure of each
// kind wins. Returns false for a record of another schema (ignored);
// DataError naming `source` for a record that is not what its schema says.
bool read_bench(const json::Json& record, const std::string& source, Hardware& h);
// Every line of a bench file (zinf-plan --bench) through read_bench: blank
// lines and '#' lines skipped; `label` names the file in messages, with the
// line ("nvme.jsonl:3"). DataError for a line that is not JSON, IoError when
// reading fails. Returns the records of a known schema.
std::size_t read_bench_lines(std::istream& in, const std::string& label, Hardware& h);

// ---------------------------------------------------------------------------
// §3, memory.
std::uint64_t paper_parameters(const shard::ModelSpec& s);  // 12 nl hd^2

struct StateBytes {
    std::uint64_t params = 0;        // exact count from the layout
    std::uint64_t param = 0;         // working parameters, param dtype
    std::uint64_t grad = 0;          // gradients, grad dtype
    std::uint64_t master = 0;        // fp32 master weights (when the params are not fp32)
    std::uint64_t moments = 0;       // fp32 exp_avg and exp_avg_sq
    std::uint64_t total() const { return param + grad + master + moments; }
    std::uint64_t optimizer() const { return grad + master + moments; }  // what the optim tier holds
};
StateBytes state_bytes(const Workload& w);
// The paper's mixed-precision Adam accounting: 20 bytes a parameter (fp16
// parameters and gradients; fp32 parameters, gradients, momentum, variance).
inline constexpr std::uint64_t kPaperBytesPerParam = 20;

// A block of the model in the paper's terms: its weights, its largest
// operator's, and the activation elements a token keeps in it. GPT: 12 hd^2,
// hd 4hd, 8 hd. Llama: hd (q + 2 kv) + q hd + 3 hd ffn, hd max(ffn, q, hd),
// 2q + 2kv + 3 ffn (q = heads x head size, kv = kv_heads x head size).
struct BlockShape {
    std::uint64_t weights = 0, largest = 0, activations = 0;
};
BlockShape block_shape(const shard::ModelSpec& s);
// The largest tile factor the spec's layout takes (shard::tensors).
std::uint64_t max_tile(const shard::ModelSpec& s);

std::uint64_t activation_checkpoint_bytes(const Workload& w);  // 2 bsz seq hd nl / ci, per device
std::uint64_t mswm_bytes(const Workload& w);                   // 4 largest / tile (GPT: 4 hd 4hd / tile)
std::uint64_t awm_bytes(const Workload& w);                    // bsz seq ci (2 activations + 2 heads seq)
// At dp > 1 the device's gathers and reduce-scatters run on NCCL, which
// lays each bucket flat in an area the engine takes from the device arena
// for the run: the largest bucket of the model's modules, by the engine's
// own rule (zero::InfinityEngine::nccl_flat_bytes). 0 at dp 1.
std::uint64_t flat_bytes(const Workload& w);

// ---------------------------------------------------------------------------
// §4, bandwidth.
double ait_param(const Workload& w);       // seq bsz
double ait_optimizer(const Workload& w);   // seq bsz / 4
double ait_activation(const Workload& w);  // 2 weights ci / hd (GPT: 24 hd ci)
// ait bw / (ait bw + peak); 1 when bw is infinite (the state is where it is used).
double efficiency(double ait, double bw_bps, double peak_flops);
// The bandwidth that gives `eff`: eff/(1-eff) peak/ait.
double bandwidth_for(double eff, double ait, double peak_flops);

// ---------------------------------------------------------------------------
// Placements.
struct TierUse {
    std::uint64_t need = 0, capacity = 0;  // bytes per node (gpu: per device)
    bool fits() const { return need <= capacity; }
    double headroom() const;               // capacity/need - 1 (inf when need is 0)
};

// One training step on each rank as the engine runs it (zinf-train's
// default schedule, a step whose gradients are clipped, so the update waits
// for the norm), in seconds; written out in man/zinf-plan.1:
//   forward    max(compute, one fetch of the parameters): prefetch overlaps it
//   backward   max(compute, the second fetch + the read-ahead's share of the disk)
//   optimizer  after backward: the rest of the state read and every write
//              (the disk's time for both, as the disk floor counts it),
//              or the CPU's work, whichever is longer: the update, then the
//              xxh3 of what it writes and of what it reads after backward
//   disk       the step's disk time: both fetches of parameters on nvme and
//              the optimizer's reads (the read-ahead's too) and writes, in turn
// `known` is false when a bandwidth the placement uses was not measured.
struct StepTime {
    bool known = false;
    double forward = 0, backward = 0, optimizer = 0;
    double disk = 0;
    double compute = 0;                  // forward + backward at the peak rate
    double stall = 0;                    // of forward + backward, waiting for parameters
    std::uint64_t readahead_bytes = 0;   // optimizer state read during backward, per node
    // The gradients' scratches the optimizer holds in memory, per node (one
    // or, pipelined, two: the second from the optimizer's budget), and
    // whether there are two (in memory or files), so that the update runs
    // on under the next step's backward (zinf-train's update_under_backward).
    std::uint64_t grad_memory_bytes = 0;
    bool under_backward = false;
    // The step as zinf-train runs it by default (the pipeline): the larger
    // of the compute path and the disk's time for the whole step. The
    // update of a clipped step starts after its backward and gives out the
    // parameters in step with its writes, first module first, so the next
    // forward trails it: the compute path is the forward and backward with
    // what the update takes past the next forward, which cannot overlap.
    // A second gradient scratch (under_backward) lets the rest of the
    // update (its last writes, the sync, the commit) run under the next
    // backward instead of before it; that tail is not modelled, so the
    // formula is the same with one scratch or two.
    double total() const { return std::max(forward + backward + std::max(0.0, optimizer - forward), disk); }
    // --no-overlap: the update after the backward, committed before the next step.
    double sequential() const { return forward + backward + optimizer; }
};

struct Placement {
    Tier param = Tier::gpu, optim = Tier::gpu;
    Tier activations = Tier::gpu;          // where the checkpoints go: gpu when they fit beside the rest, else cpu
    TierUse gpu, cpu, nvme;
    // The disk zinf-train needs on a node for this placement before it
    // starts (zero::disk_need: every state file in two generations, the
    // gradient scratch with the optimizer on NVMe), per node.
    std::uint64_t nvme_bytes_needed = 0;
    bool fits = false;
    double param_bps = 0, optim_bps = 0, activation_bps = 0;  // effective per device (inf: in device memory)
    double efficiency_param = 1, efficiency_optimizer = 1, efficiency_activation = 1;
    StepTime step;                         // predicted, per rank
    // Against all on the GPU (param=gpu,optim=gpu) at the same batch:
    // offload_ratio = step.total() / its step.total() (0: a step unknown),
    // and offload_batch the smallest batch per device at which the ratio is
    // at most 1 + kOffloadOverhead (0: none up to 2^20, or unknown).
    double offload_ratio = 0;
    std::uint64_t offload_batch = 0;
    double min_efficiency() const;
    std::string name() const;              // "param=nvme,optim=cpu"
};

// The step's time for a placement whose tiers and needs are filled in.
StepTime step_time(const Workload& w, const Hardware& h, const Placement& p);

// Every (param, optim) tier pair, evaluated.
std::vector<Placement> placements(const Workload& w, const Hardware& h);

// What offloading may cost: a step at most 10% longer than all on the GPU's.
inline constexpr double kOffloadOverhead = 0.10;
// The (param, optim) placement's step over all on the GPU's at w's batch
// (0 when either is unknown), and the smallest batch at which it is within
// 1 + overhead (0: none up to 2^20 per device, or unknown). The ratio falls
// with the batch: the fetches, the update and the disk do not grow with it.
double offload_ratio(const Workload& w, const Hardware& h, Tier param, Tier optim);
std::uint64_t offload_batch(const Workload& w, const Hardware& h, Tier param, Tier optim, double overhead);

struct Report {
    Workload w;
    Hardware h;
    double target = 0.9;
    std::uint64_t paper_params = 0;
    StateBytes states;
    std::uint64_t model_state_bytes = 0, model_state_bytes_per_rank = 0, paper_model_state_bytes = 0;
    std::uint64_t activation_checkpoint_bytes = 0, mswm_bytes = 0, awm_bytes = 0, flat_bytes = 0;
    double ait_param = 0, ait_optimizer = 0, ait_activation = 0;
    // Bandwidth each state needs per device for `target` (bytes/s).
    double need_param_bps = 0, need_optimizer_bps = 0, need_activation_bps = 0;
    std::vector<Placement> all;
    // The cheapest placement that fits and keeps every efficiency at or above
    // the target; else the one that fits with the best least efficiency, the
    // cheapest among equals (meets_target false); none when nothing fits.
    std::optional<Placement> placement;
    bool meets_target = false;
    unsigned tile = 1;                    // smallest tile factor whose MSWM fits the largest block
    std::uint64_t batch_for_target = 0;   // per device, for the recommended placement (0: none reaches it)
};
Report plan(const Workload& w, const Hardware& h, double target);

json::Json to_json(const Report& r);  // zinf.plan/1

}  // namespace zinf::plan
