// The paper's memory and bandwidth model: §3's bytes, §4's arithmetic
// intensities and efficiency, evaluated for every placement of the
// parameters and the optimizer state, and the cheapest one that meets a target.
#include <zinf/plan.hpp>
#include <zinf/family.hpp>
#include <zinf/model.hpp>
#include <zinf/zero.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <istream>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>

namespace zinf::plan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return b ? (a + b - 1) / b : 0; }

// What memory a tier is worth per byte, for "cheapest": NVMe < CPU < GPU.
int cost(Tier t) { return t == Tier::nvme ? 0 : t == Tier::cpu ? 1 : 2; }

double harmonic(double a, double b, double wa, double wb) {  // bytes wa at a and wb at b: the mean rate
    if (a <= 0 || b <= 0) return 0;
    return (wa + wb) / (wa / a + wb / b);
}

// `schema` is the record's: j may be an element of it (a pinstress copy), and
// need not be an object. The value is a rate in GiB/s or GB/s: it must stay
// finite in bytes/s too (1e300 GiB/s would read as infinite, "in device memory").
double positive(const json::Json& j, const char* key, const std::string& source, const std::string& schema) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number() || !(j[key].get<double>() >= 0) ||
        !std::isfinite(j[key].get<double>() * kGiB))
        throw DataError(source + ": a " + schema + " record without a finite number " + key + " (at least 0)");
    return j[key].get<double>();
}

}  // namespace

void Workload::validate() const {
    if (!dp || dp > (1u << 20)) throw UsageError("--dp must be between 1 and 1048576");
    if (!nodes || nodes > dp) throw UsageError("--nodes must be between 1 and --dp");
    if (!batch) throw UsageError("--batch must be at least 1");
    if (!ci || ci > spec.layers) throw UsageError("--ci must be between 1 and the layers (" +
                                                  std::to_string(spec.layers) + ")");
    if (!tile || tile > max_tile(spec))
        throw UsageError("--tile must be between 1 and " + std::to_string(max_tile(spec)) +
                         " (" + shard::family(spec.arch).max_tile_is + ")");
    if (sequence() > spec.seq)
        throw UsageError("--seq " + std::to_string(seq) + " is longer than the model's " + std::to_string(spec.seq));
    // The byte counts below must fit 64 bits (the spec's own sizes are checked by its parser).
    using u128 = unsigned __int128;
    const u128 T = sequence(), C = spec.hidden;
    const u128 ckpt = 2 * u128{batch} * T * C * spec.layers,
               awm = u128{batch} * T * ci * (2 * u128{block_shape(spec).activations} + 2 * u128{spec.heads} * T);
    if (ckpt >= (u128{1} << 63) || awm >= (u128{1} << 63))
        throw UsageError("--batch " + std::to_string(batch) + ": too large (the activation bytes pass 2^63)");
    // And the state bytes: 20 bytes a parameter at most, by either count.
    if (std::max(spec.parameters(), spec.paper_estimate()) >= (std::uint64_t{1} << 59))
        throw UsageError("model " + spec.to_string() + ": too large to count its bytes (2^59 parameters or more)");
}

std::size_t read_bench_lines(std::istream& in, const std::string& label, Hardware& h) {
    std::string line;
    std::size_t n = 0, used = 0;
    while (std::getline(in, line)) {
        ++n;
        const auto first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos || line[first] == '#') continue;
        json::Json j;
        try {
            j = json::Json::parse(line);
        } catch (const std::exception& e) {
            throw DataError(label + ":" + std::to_string(n) + ": not JSON (" + e.what() + ")");
        }
        if (read_bench(j, label + ":" + std::to_string(n), h)) ++used;
    }
    if (in.bad()) throw IoError("reading " + label + " failed", {errno, label, {}, -1});
    return used;
}

namespace {
bool read_bench_record(const json::Json& j, const std::string& source, Hardware& h);
}

bool read_bench(const json::Json& j, const std::string& source, Hardware& h) {
    // A key of the wrong JSON type (an op that is a number) is bad data too.
    try {
        return read_bench_record(j, source, h);
    } catch (const json::Json::exception& e) {
        throw DataError(source + ": a bench record with a key of the wrong type (" + e.what() + ")");
    }
}

namespace {
bool read_bench_record(const json::Json& j, const std::string& source, Hardware& h) {
    if (!j.is_object() || !j.contains("schema") || !j["schema"].is_string())
        throw DataError(source + ": not a bench record (no \"schema\")");
    const std::string schema = j["schema"].get<std::string>();
    if (schema == "zinf.nvmebench/1") {
        const double bps = positive(j, "gibps", source, schema) * kGiB;
        const std::string op = j.value("op", std::string());
        double* best = op == "read" ? &h.nvme_read_bps : op == "write" ? &h.nvme_write_bps : nullptr;
        if (!best) throw DataError(source + ": a zinf.nvmebench/1 record whose op is neither read nor write");
        if (bps > *best) {
            *best = bps;
            (op == "read" ? h.source_nvme_read : h.source_nvme_write) = source;
        }
        return true;
    }
    if (schema == "zinf.pinstress/1") {
        if (!j.contains("copies") || !j["copies"].is_array())
            throw DataError(source + ": a zinf.pinstress/1 record without its copies");
        double h2d = 0, d2h = 0;
        for (const auto& c : j["copies"]) {
            const double bps = positive(c, "pinned_gibps", source, schema) * kGiB;
            const std::string what = c.value("copy", std::string());
            if (what.find("h2d") != std::string::npos) h2d = std::max(h2d, bps);
            if (what.find("d2h") != std::string::npos) d2h = std::max(d2h, bps);
        }
        const double both = h2d > 0 && d2h > 0 ? std::min(h2d, d2h) : std::max(h2d, d2h);
        if (both > h.cpu_gpu_bps) {
            h.cpu_gpu_bps = both;
            h.source_cpu_gpu = source;
        }
        return true;
    }
    if (schema == "zinf.commbench/1") {
        if (j.value("op", std::string()) != "allgather") return true;  // the parameters' path is the allgather
        const double bps = positive(j, "busbw_gbps", source, schema) * 1e9;
        if (bps > h.gpu_gpu_bps) {
            h.gpu_gpu_bps = bps;
            h.source_gpu_gpu = source;
        }
        return true;
    }
    if (schema == "zinf.profile/1") {
        // zinf-train --profile --json: the step record holds the GEMM rate
        // measured on the device in the same run, at the run's precision
        // (what the step's FLOPs can reach); the other records are its rows.
        if (j.value("kind", std::string()) != "step") return true;
        const double f = positive(j, "peak_flops_per_s", source, schema);
        if (!(f > 0)) throw DataError(source + ": a zinf.profile/1 step record whose peak_flops_per_s is 0");
        if (!h.peak_measured || f > h.peak_flops) {
            h.peak_flops = f;
            h.peak_measured = true;
            h.source_peak = source + " (" + j.value("peak_flops_peer", std::string("GEMM")) + ", zinf-train --profile)";
        }
        return true;
    }
    if (schema == "zinf.optbench/1") {
        if (j.value("kind", std::string()) != "update") return true;
        const double bps = positive(j, "traffic_gibps", source, schema) * kGiB;
        if (bps > h.cpu_update_bps) {
            h.cpu_update_bps = bps;
            h.source_cpu_update = source;
        }
        if (j.contains("xxh3_gibps")) {
            const double hash = positive(j, "xxh3_gibps", source, schema) * kGiB;
            if (hash > h.cpu_hash_bps) {
                h.cpu_hash_bps = hash;
                h.source_cpu_hash = source;
            }
        }
        return true;
    }
    return false;
}

}  // namespace

std::uint64_t paper_parameters(const shard::ModelSpec& s) { return s.paper_estimate(); }

// A block's shape in the paper's terms, as its family declares it.
BlockShape block_shape(const shard::ModelSpec& s) {
    const shard::BlockWeights b = shard::family(s.arch).block(s);
    return {b.weights, b.largest, b.activations};
}

std::uint64_t max_tile(const shard::ModelSpec& s) { return shard::family(s.arch).max_tile(s); }

StateBytes state_bytes(const Workload& w) {
    StateBytes b;
    b.params = w.spec.parameters();
    b.param = b.params * shard::dtype_bytes(w.param_dtype);
    b.grad = b.params * shard::dtype_bytes(w.grad_dtype);
    b.master = w.param_dtype == DType::fp32 ? 0 : 4 * b.params;  // fp32 params are their own master
    b.moments = 8 * b.params;
    return b;
}

std::uint64_t activation_checkpoint_bytes(const Workload& w) {
    return 2 * w.batch * w.sequence() * w.spec.hidden * w.spec.layers / w.ci;
}

std::uint64_t mswm_bytes(const Workload& w) { return ceil_div(4 * block_shape(w.spec).largest, w.tile); }

std::uint64_t awm_bytes(const Workload& w) {
    const std::uint64_t T = w.sequence();
    return w.batch * T * w.ci * (2 * block_shape(w.spec).activations + 2 * w.spec.heads * T);
}

std::uint64_t flat_bytes(const Workload& w) {
    if (w.dp <= 1) return 0;
    // The model built and its collectives laid out: seconds at paper-1t, and
    // the same for every batch offload_batch tries (720 plans of one
    // workload), so each model, tiling, dp and dtype is counted once.
    static std::mutex mu;
    static std::map<std::string, std::uint64_t> known;
    const std::string key = w.spec.to_string() + " tile " + std::to_string(w.tile) + " dp " + std::to_string(w.dp) +
                            " " + std::to_string(static_cast<int>(w.param_dtype));
    {
        std::lock_guard lk(mu);
        if (const auto it = known.find(key); it != known.end()) return it->second;
    }
    const auto model = model::make_model(model::Config::from(w.spec, w.tile));
    const std::uint64_t bytes = zero::InfinityEngine::nccl_flat_bytes(
        model->modules(), model::numels(model->params_table()), w.dp, w.param_dtype);
    std::lock_guard lk(mu);
    known.emplace(key, bytes);
    return bytes;
}

double ait_param(const Workload& w) { return static_cast<double>(w.sequence()) * static_cast<double>(w.batch); }
double ait_optimizer(const Workload& w) { return ait_param(w) / 4.0; }
// A block's 2 FLOPs per weight per token, four passes (forward, recompute,
// backward's two), over the 2 hd bytes of its fp16 checkpoint: 24 hd ci
// for a GPT's 12 hd^2.
double ait_activation(const Workload& w) {
    return 2.0 * static_cast<double>(block_shape(w.spec).weights) * static_cast<double>(w.ci) /
           static_cast<double>(w.spec.hidden);
}

double efficiency(double ait, double bw_bps, double peak_flops) {
    if (std::isinf(bw_bps)) return 1.0;
    if (bw_bps <= 0) return 0.0;
    return ait * bw_bps / (ait * bw_bps + peak_flops);
}

double bandwidth_for(double eff, double ait, double peak_flops) {
    if (eff <= 0) return 0;
    if (eff >= 1) return kInf;
    return eff / (1 - eff) * peak_flops / ait;
}

double TierUse::headroom() const { return need ? static_cast<double>(capacity) / static_cast<double>(need) - 1 : kInf; }

double Placement::min_efficiency() const {
    return std::min({efficiency_param, efficiency_optimizer, efficiency_activation});
}

std::string Placement::name() const {
    return std::string("param=") + shard::tier_name(param) + ",optim=" + shard::tier_name(optim);
}

// The step as zinf-train runs it (plan.hpp, StepTime; man/zinf-plan.1).
// Compute: 8 FLOPs per parameter and token (forward 2; backward 4 and the
// checkpointed forward again, 2). Each pass fetches the parameters once
// (the tied embedding's second use is not counted), prefetched beside the
// compute: a pass takes the longer of the two. A clipped step's update
// waits for the norm, so the optimizer's NVMe reads overlap the backward
// only as far as the read-ahead budget and the disk's time left beside the
// backward's fetch; the rest is read after it, beside every write (the
// update streams; the disk's time is the reads' and the writes' together,
// as the disk floor counts it), or the CPU bounds it: chunk by chunk the update, then the xxh3 of the chunk's
// new state (written) and of what it read after backward (what the
// read-ahead read was checked as it landed, during backward). The
// gradients' scratch costs no disk time: held
// in memory where the read-ahead budget holds it (taken from the budget
// first), else a file taken to stay in the page cache.
StepTime step_time(const Workload& w, const Hardware& h, const Placement& p) {
    StepTime st;
    const StateBytes b = state_bytes(w);
    const double dp = w.dp, nodes = w.nodes, rpn = w.ranks_per_node();
    const double flops = 8.0 * static_cast<double>(w.batch) * static_cast<double>(w.sequence()) *
                         static_cast<double>(b.params);
    st.compute = flops / h.peak_flops;
    bool known = h.peak_flops > 0;
    auto time = [&](double bytes, double bps) {  // 0 bytes take no time, at any rate
        if (bytes <= 0 || std::isinf(bps)) return 0.0;
        if (bps <= 0) known = false;
        return bps > 0 ? bytes / bps : 0.0;
    };
    // One fetch of the parameters on every rank: its 1/dp share from its
    // tier (the node's disk shared by its ranks), over its link, gathered.
    const double param = static_cast<double>(b.param);
    double disk_fetch = 0, fetch = 0;
    if (w.dp > 1) fetch = time(param, h.gpu_gpu_bps);
    if (p.param != Tier::gpu) fetch = std::max(fetch, time(param, h.cpu_gpu_bps * dp));
    if (p.param == Tier::nvme) {
        disk_fetch = time(param, h.nvme_read_bps * nodes);
        fetch = std::max(fetch, disk_fetch);
    }
    const double fwd = st.compute / 4, bwd = st.compute - fwd;
    st.forward = std::max(fwd, fetch);
    st.backward = std::max(bwd, fetch);

    // The optimizer's bytes on this node: it reads the master weights and
    // moments and writes them back, and writes the working parameters
    // where they live on NVMe (from the master weights; fp32 parameters are
    // their own master). The update's memory traffic: those, the gradients
    // and the working parameters.
    auto node = [&](std::uint64_t bytes) { return static_cast<double>(bytes) / dp * rpn; };
    const double state = node(b.master + b.moments);
    double read = 0, written = 0;
    if (p.optim == Tier::nvme) read = written = state;
    if (p.param == Tier::nvme) {
        written += node(b.param);
        if (b.master == 0) read += node(b.param);  // fp32 parameters: the master weights themselves
    }
    double update = 0, ahead_read = 0;
    if (p.optim != Tier::gpu)
        update = time(2 * state + node(b.grad) + node(b.master > 0 ? b.param : 0), h.cpu_update_bps);
    // The optimizer's memory budget (auto: the node's memory less its
    // margin and what the placement keeps in CPU memory) holds the
    // gradients' scratches first, as the trainer's optimizer takes them:
    // with the state on NVMe the first in memory where it fits (else a
    // file), and pipelined a second beside it (where the first is in
    // memory and the second does not fit, none: the update is settled
    // before the next backward; beside a file, a second file); with the
    // state on the gpu or cpu tier the gradients are in memory regardless,
    // and the second takes the budget. The read-ahead has the rest.
    double budget;
    const std::uint64_t scratch = static_cast<std::uint64_t>(node(b.grad));
    if (w.readahead) {
        budget = static_cast<double>(*w.readahead) * rpn;
    } else {
        const std::uint64_t used = p.cpu.need;
        budget = static_cast<double>(
            zero::readahead_spare(h.cpu_bytes > used ? h.cpu_bytes - used : 0, h.cpu_bytes, 1));
    }
    const double sc = static_cast<double>(scratch);
    st.under_backward = true;
    // The first scratch: in memory beside the budget where the optimizer's
    // state is not on nvme; from the budget where it is, if it fits (else
    // both are files). A second in memory beside a first, from the budget.
    bool first_in_memory = p.optim != Tier::nvme;
    if (!first_in_memory && sc <= budget) {
        budget -= sc;
        first_in_memory = true;
    }
    if (first_in_memory) {
        st.grad_memory_bytes = scratch;
        if (sc <= budget) {
            budget -= sc;
            st.grad_memory_bytes += scratch;
        } else {
            st.under_backward = false;
        }
    }
    if (p.optim == Tier::nvme) {
        // The read-ahead: what the budget has left, and what the disk can
        // read beside the backward's fetch.
        const double spare_s = std::max(0.0, st.backward - disk_fetch);
        const double ahead = std::min({budget, read, h.nvme_read_bps > 0 ? spare_s * h.nvme_read_bps : 0.0});
        st.readahead_bytes = static_cast<std::uint64_t>(ahead);
        read -= ahead;
        ahead_read = ahead;
        if (h.cpu_hash_bps > 0) update += time(read + written, h.cpu_hash_bps);
    }
    // The disk one direction after the other, as the disk floor counts it
    // (train's disk_floor_s): on the disks measured (BENCHMARKS.md, issue
    // 28) reads in flight beside writes moved no more than the two in turn.
    st.optimizer = std::max(time(read, h.nvme_read_bps) + time(written, h.nvme_write_bps), update);
    st.disk = 2 * disk_fetch + time(read + ahead_read, h.nvme_read_bps) + time(written, h.nvme_write_bps);
    st.stall = st.forward + st.backward - st.compute;
    st.known = known;
    return st;
}

namespace {
// One (param, optim) placement evaluated; `disk` false leaves
// nvme_bytes_needed 0 (the disk's need takes the whole layout: offload_ratio
// needs only the steps).
Placement evaluate(const Workload& w, const Hardware& h, Tier pt, Tier ot, bool disk);
}  // namespace

std::vector<Placement> placements(const Workload& w, const Hardware& h) {
    std::vector<Placement> out;
    for (Tier pt : {Tier::gpu, Tier::cpu, Tier::nvme})
        for (Tier ot : {Tier::gpu, Tier::cpu, Tier::nvme}) out.push_back(evaluate(w, h, pt, ot, true));
    return out;
}

namespace {
Placement evaluate(const Workload& w, const Hardware& h, Tier pt, Tier ot, bool disk) {
    const StateBytes b = state_bytes(w);
    const std::uint64_t rpn = w.ranks_per_node();
    // Every state is partitioned over all dp ranks; a node holds its ranks' share.
    auto per_rank = [&](std::uint64_t bytes) { return ceil_div(bytes, w.dp); };
    auto per_node = [&](std::uint64_t bytes) { return per_rank(bytes) * rpn; };
    const std::uint64_t ckpt = activation_checkpoint_bytes(w), working = mswm_bytes(w) + awm_bytes(w) + flat_bytes(w);
    const double dp = w.dp, nodes = w.nodes;
    // The parameters reach every device by allgather once there is more than one rank.
    const double gather = w.dp > 1 ? h.gpu_gpu_bps : kInf;

    {
        {
            Placement p;
            p.param = pt;
            p.optim = ot;
            p.gpu.capacity = h.gpu_bytes;
            p.cpu.capacity = h.cpu_bytes;
            p.nvme.capacity = h.nvme_bytes;
            auto put = [&](Tier t, std::uint64_t bytes) {
                if (t == Tier::gpu) p.gpu.need += per_rank(bytes);
                else if (t == Tier::cpu) p.cpu.need += per_node(bytes);
                else p.nvme.need += per_node(bytes);
            };
            put(pt, b.param);
            put(ot, b.optimizer());
            // What zinf-train checks before step 1, for this node's ranks.
            shard::LayoutOptions lo;
            lo.dp = w.dp;
            lo.tile = w.tile;
            lo.param_dtype = w.param_dtype;
            lo.param_tier = pt;
            lo.optim_tier = ot;
            // (pipelined, as zinf-train runs by default: two gradient scratches)
            if (disk) p.nvme_bytes_needed = zero::disk_need(w.spec, lo, {.pipeline = true}).total() * rpn;
            p.gpu.need += working;
            // Checkpoints stay on the device when they fit beside the rest, else go to CPU memory.
            if (p.gpu.need + ckpt <= p.gpu.capacity) {
                p.gpu.need += ckpt;
                p.activations = Tier::gpu;
            } else {
                p.cpu.need += ckpt * rpn;
                p.activations = Tier::cpu;
            }
            p.fits = p.gpu.fits() && p.cpu.fits() && p.nvme.fits();

            // Effective bandwidth per device: each rank moves its 1/dp share over
            // its own link, so the ranks' links add up (bandwidth-centric partitioning).
            const double cpu_links = h.cpu_gpu_bps * dp;
            const double nvme_param = harmonic(h.nvme_read_bps, h.nvme_write_bps, 3, 1) * nodes;  // 3 reads, 1 write
            if (pt == Tier::gpu) p.param_bps = gather;
            else if (pt == Tier::cpu) p.param_bps = std::min(cpu_links, gather);
            else p.param_bps = std::min({nvme_param, cpu_links, gather});
            const double update = h.cpu_update_bps * nodes;
            const double nvme_optim = harmonic(h.nvme_read_bps, h.nvme_write_bps, 1, 1) * nodes;  // read once, write once
            if (ot == Tier::gpu) p.optim_bps = kInf;
            else if (ot == Tier::cpu) p.optim_bps = update;
            else p.optim_bps = std::min(nvme_optim, update);
            p.activation_bps = p.activations == Tier::gpu ? kInf : h.cpu_gpu_bps;

            p.efficiency_param = efficiency(ait_param(w), p.param_bps, h.peak_flops);
            p.efficiency_optimizer = efficiency(ait_optimizer(w), p.optim_bps, h.peak_flops);
            p.efficiency_activation = efficiency(ait_activation(w), p.activation_bps, h.peak_flops);
            p.step = step_time(w, h, p);
            return p;
        }
    }
}
}  // namespace

double offload_ratio(const Workload& w, const Hardware& h, Tier param, Tier optim) {
    const Placement p = evaluate(w, h, param, optim, false), g = evaluate(w, h, Tier::gpu, Tier::gpu, false);
    if (!p.step.known || !g.step.known || !(g.step.total() > 0)) return 0;
    return p.step.total() / g.step.total();
}

// The offloaded step's part that does not grow with the batch (fetches,
// the update, the disk) shrinks against the compute, which does: the ratio
// falls with the batch, so the first batch within the bound is found by
// doubling, then halving the interval.
std::uint64_t offload_batch(const Workload& w, const Hardware& h, Tier param, Tier optim, double overhead) {
    constexpr std::uint64_t kMost = std::uint64_t{1} << 20;
    auto within = [&](std::uint64_t b, bool& valid) {
        Workload wb = w;
        wb.batch = b;
        try {
            wb.validate();
        } catch (const UsageError&) {
            valid = false;
            return false;
        }
        const double r = offload_ratio(wb, h, param, optim);
        valid = r > 0;
        return valid && r <= 1 + overhead;
    };
    std::uint64_t hi = 1;
    bool valid = true;
    while (!within(hi, valid)) {
        if (!valid || hi >= kMost) return 0;
        hi *= 2;
    }
    std::uint64_t lo = hi / 2;  // not within (or 0)
    while (hi - lo > 1) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        (within(mid, valid) ? hi : lo) = mid;
    }
    return hi;
}

Report plan(const Workload& w, const Hardware& h, double target) {
    w.validate();
    if (!(target > 0 && target < 1)) throw UsageError("--target must be between 0 and 1 (exclusive)");
    Report r;
    r.w = w;
    r.h = h;
    r.target = target;
    r.paper_params = paper_parameters(w.spec);
    r.states = state_bytes(w);
    r.model_state_bytes = r.states.total();
    r.model_state_bytes_per_rank = ceil_div(r.model_state_bytes, w.dp);
    r.paper_model_state_bytes = kPaperBytesPerParam * r.paper_params;
    r.activation_checkpoint_bytes = activation_checkpoint_bytes(w);
    r.mswm_bytes = mswm_bytes(w);
    r.awm_bytes = awm_bytes(w);
    r.flat_bytes = flat_bytes(w);
    r.ait_param = ait_param(w);
    r.ait_optimizer = ait_optimizer(w);
    r.ait_activation = ait_activation(w);
    r.need_param_bps = bandwidth_for(target, r.ait_param, h.peak_flops);
    r.need_optimizer_bps = bandwidth_for(target, r.ait_optimizer, h.peak_flops);
    r.need_activation_bps = bandwidth_for(target, r.ait_activation, h.peak_flops);
    r.all = placements(w, h);
    for (auto& p : r.all) {
        p.offload_ratio = offload_ratio(w, h, p.param, p.optim);
        p.offload_batch = offload_batch(w, h, p.param, p.optim, kOffloadOverhead);
    }

    // Cheapest: the fewest bytes on expensive memory (GPU 2, CPU 1, NVMe 0 a byte).
    const StateBytes& b = r.states;
    auto price = [&](const Placement& p) {
        return static_cast<double>(cost(p.param)) * static_cast<double>(b.param) +
               static_cast<double>(cost(p.optim)) * static_cast<double>(b.optimizer());
    };
    const Placement* best = nullptr;
    for (const auto& p : r.all) {
        if (!p.fits || p.min_efficiency() < target) continue;
        if (!best || price(p) < price(*best) || (price(p) == price(*best) && p.min_efficiency() > best->min_efficiency()))
            best = &p;
    }
    r.meets_target = best != nullptr;
    if (!best)  // the best least efficiency; among equals, the cheapest
        for (const auto& p : r.all)
            if (p.fits && (!best || p.min_efficiency() > best->min_efficiency() ||
                           (p.min_efficiency() == best->min_efficiency() && price(p) < price(*best))))
                best = &p;
    if (best) r.placement = *best;

    // The smallest tile factor whose working memory fits the largest block.
    const std::uint64_t block = h.gpu_max_block ? h.gpu_max_block : h.gpu_bytes;
    r.tile = 0;
    if (block) {
        const std::uint64_t whole = 4 * block_shape(w.spec).largest;
        const std::uint64_t t = std::max<std::uint64_t>(1, ceil_div(whole, block));
        if (t <= max_tile(w.spec)) r.tile = static_cast<unsigned>(t);
    }

    // The batch per device that brings the placement's parameter and optimizer
    // efficiencies to the target (activations' do not depend on it).
    if (r.placement) {
        const auto& p = *r.placement;
        const double T = static_cast<double>(w.sequence());
        auto batch_for = [&](double bw, double per_batch_ait) -> double {
            if (std::isinf(bw)) return 1;
            if (bw <= 0) return 0;
            return std::max(1.0, std::ceil(target / (1 - target) * h.peak_flops / bw / per_batch_ait - 1e-9));
        };
        const double bp = batch_for(p.param_bps, T), bo = batch_for(p.optim_bps, T / 4);
        const double need = std::max(bp, bo);
        // 0 (none) when a bandwidth is unknown or the batch is past any sense.
        r.batch_for_target = bp > 0 && bo > 0 && need < 0x1p53 ? static_cast<std::uint64_t>(need) : 0;
    }
    return r;
}

namespace {

json::Json bps_json(double bps) {  // GB/s (10^9), null when infinite (the state is in device memory)
    return std::isinf(bps) ? json::Json(nullptr) : json::Json(bps / 1e9);
}

json::Json seconds_json(bool known, double s) {  // null when a bandwidth it needs is unknown
    return known ? json::Json(s) : json::Json(nullptr);
}

json::Json placement_json(const Placement& p) {
    auto use = [](const TierUse& u) {
        return json::Json{{"need_bytes", u.need},
                          {"capacity_bytes", u.capacity},
                          {"fits", u.fits()},
                          {"headroom", std::isinf(u.headroom()) ? json::Json(nullptr) : json::Json(u.headroom())}};
    };
    return json::Json{{"placement", p.name()},
                      {"param", shard::tier_name(p.param)},
                      {"optim", shard::tier_name(p.optim)},
                      {"activations", shard::tier_name(p.activations)},
                      {"fits", p.fits},
                      {"gpu", use(p.gpu)},
                      {"cpu", use(p.cpu)},
                      {"nvme", use(p.nvme)},
                      {"nvme_bytes_needed", p.nvme_bytes_needed},
                      {"bw_param_gbps", bps_json(p.param_bps)},
                      {"bw_optimizer_gbps", bps_json(p.optim_bps)},
                      {"bw_activation_gbps", bps_json(p.activation_bps)},
                      {"efficiency_param", p.efficiency_param},
                      {"efficiency_optimizer", p.efficiency_optimizer},
                      {"efficiency_activation", p.efficiency_activation},
                      {"step_s", seconds_json(p.step.known, p.step.total())},
                      {"step_forward_s", seconds_json(p.step.known, p.step.forward)},
                      {"step_backward_s", seconds_json(p.step.known, p.step.backward)},
                      {"step_optimizer_s", seconds_json(p.step.known, p.step.optimizer)},
                      {"step_disk_s", seconds_json(p.step.known, p.step.disk)},
                      {"step_sequential_s", seconds_json(p.step.known, p.step.sequential())},
                      {"step_compute_s", seconds_json(p.step.known, p.step.compute)},
                      {"step_stall_s", seconds_json(p.step.known, p.step.stall)},
                      {"step_readahead_bytes", p.step.readahead_bytes},
                      {"step_grad_memory_bytes", p.step.grad_memory_bytes},
                      {"step_under_backward", p.step.under_backward},
                      {"offload_ratio", p.offload_ratio > 0 ? json::Json(p.offload_ratio) : json::Json(nullptr)},
                      {"offload_batch", p.offload_batch ? json::Json(p.offload_batch) : json::Json(nullptr)}};
}

}  // namespace

json::Json to_json(const Report& r) {
    json::Json j;
    j["schema"] = "zinf.plan/1";
    j["model"] = r.w.spec.to_string();
    j["dp"] = r.w.dp;
    j["nodes"] = r.w.nodes;
    j["batch"] = r.w.batch;
    j["seq"] = r.w.sequence();
    j["ci"] = r.w.ci;
    j["layout_tile"] = r.w.tile;  // --tile, which MSWM is divided by; "tile" is the recommendation
    j["param_dtype"] = shard::dtype_name(r.w.param_dtype);
    j["grad_dtype"] = shard::dtype_name(r.w.grad_dtype);
    j["target"] = r.target;
    j["params"] = r.states.params;
    j["paper_params"] = r.paper_params;
    j["param_bytes"] = r.states.param;
    j["grad_bytes"] = r.states.grad;
    j["master_bytes"] = r.states.master;
    j["moment_bytes"] = r.states.moments;
    j["model_state_bytes"] = r.model_state_bytes;
    j["model_state_bytes_per_rank"] = r.model_state_bytes_per_rank;
    j["paper_model_state_bytes"] = r.paper_model_state_bytes;
    j["activation_checkpoint_bytes"] = r.activation_checkpoint_bytes;
    j["mswm_bytes"] = r.mswm_bytes;
    j["awm_bytes"] = r.awm_bytes;
    j["flat_bytes"] = r.flat_bytes;
    j["ait_param"] = r.ait_param;
    j["ait_optimizer"] = r.ait_optimizer;
    j["ait_activation"] = r.ait_activation;
    j["need_param_gbps"] = bps_json(r.need_param_bps);
    j["need_optimizer_gbps"] = bps_json(r.need_optimizer_bps);
    j["need_activation_gbps"] = bps_json(r.need_activation_bps);
    j["peak_tflops"] = r.h.peak_flops / 1e12;
    json::Json hw;
    hw["gpu_bytes"] = r.h.gpu_bytes;
    hw["gpu_max_block_bytes"] = r.h.gpu_max_block ? r.h.gpu_max_block : r.h.gpu_bytes;
    hw["cpu_bytes"] = r.h.cpu_bytes;
    hw["nvme_bytes"] = r.h.nvme_bytes;
    hw["gpu_gpu_gbps"] = r.h.gpu_gpu_bps / 1e9;
    hw["cpu_gpu_gbps"] = r.h.cpu_gpu_bps / 1e9;
    hw["nvme_read_gbps"] = r.h.nvme_read_bps / 1e9;
    hw["nvme_write_gbps"] = r.h.nvme_write_bps / 1e9;
    hw["cpu_update_gbps"] = r.h.cpu_update_bps / 1e9;
    hw["cpu_hash_gbps"] = r.h.cpu_hash_bps / 1e9;
    j["hardware"] = hw;
    json::Json all = json::Json::array();
    for (const auto& p : r.all) all.push_back(placement_json(p));
    j["placements"] = all;
    j["fits"] = r.placement.has_value();
    j["meets_target"] = r.meets_target;
    if (r.placement) {
        j["placement"] = r.placement->name();
        j["nvme_bytes_needed"] = r.placement->nvme_bytes_needed;
        j["efficiency_param"] = r.placement->efficiency_param;
        j["efficiency_optimizer"] = r.placement->efficiency_optimizer;
        j["efficiency_activation"] = r.placement->efficiency_activation;
        j["offload_batch"] = r.placement->offload_batch ? json::Json(r.placement->offload_batch) : json::Json(nullptr);
    } else {
        j["placement"] = nullptr;
        j["efficiency_param"] = j["efficiency_optimizer"] = j["efficiency_activation"] = nullptr;
        j["offload_batch"] = nullptr;
    }
    j["tile"] = r.tile ? json::Json(r.tile) : json::Json(nullptr);
    j["batch_for_target"] = r.batch_for_target ? json::Json(r.batch_for_target) : json::Json(nullptr);
    return j;
}

}  // namespace zinf::plan
