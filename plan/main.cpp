// zinf-plan: what fits where and how fast it will go, from the paper's memory
// and bandwidth model (§3-4), a model spec, the machine's capacities and the
// bandwidths the bench programs measured (--bench). See man/zinf-plan.1.
#include <zinf/cli.hpp>
#include <zinf/family.hpp>
#include <zinf/mem.hpp>
#include <zinf/plan.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sys/statvfs.h>
#include <unistd.h>

using namespace zinf;
using plan::Tier;

namespace {

struct Options {
    std::string model;
    plan::Workload w;
    std::string param_dtype = "bf16", grad_dtype = "bf16";
    double target = 0.9, peak_tflops = 70;
    std::string gpu_mem, gpu_max_block, cpu_mem, nvme;
    std::string readahead = "auto";
    std::optional<double> bw_gpu_gpu, bw_cpu_gpu, bw_nvme_read, bw_nvme_write, bw_cpu_update, bw_cpu_hash;  // GB/s
    std::vector<std::string> bench;
    bool json = false;
    bool peak_given = false;
};

std::uint64_t size_of(const std::string& text, const std::string& option) {
    return cli::parse_sizes({text}, option)[0];
}

// --nvme: a size ("28TiB"), or else a folder whose file system's free space
// is the capacity.
std::uint64_t nvme_capacity(const std::string& text, std::string& source) {
    if (!text.empty()) {
        try {
            const std::uint64_t bytes = parse_size(text);
            source = "--nvme";
            return bytes;
        } catch (const UsageError&) {
        }  // not a size: a folder
    }
    struct statvfs st {};
    const std::string path = text.empty() ? (::getenv("TMPDIR") && *::getenv("TMPDIR") ? ::getenv("TMPDIR") : "/var/tmp")
                                          : text;
    if (::statvfs(path.c_str(), &st) != 0) {
        if (!text.empty() && text.find('/') == std::string::npos && std::isdigit(static_cast<unsigned char>(text[0])))
            throw UsageError("--nvme " + text + ": neither a size (4TiB, 800GB) nor a folder");
        throw_errno("statvfs", errno, path);
    }
    source = "free space of " + path;
    return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

// Every JSON line of a bench file ('-': stdin); '#' lines and blank lines skipped.
void read_bench_file(const std::string& name, plan::Hardware& h) {
    std::unique_ptr<std::istream> file;
    std::istream* in = &std::cin;
    const std::string label = name == "-" ? "<stdin>" : name;
    if (name != "-") {
        file = input_stream(name);  // a FIFO (--bench <(zinf-nvmebench --json)) too
        in = file.get();
    }
    const std::size_t used = plan::read_bench_lines(*in, label, h);
    if (!used) log::warn(label + ": no zinf-nvmebench, -pinstress, -commbench or -optbench record in it, nor a zinf-train --profile step");
}

std::string gb(double bps) {
    if (std::isinf(bps)) return "in device memory";
    char buf[64];
    std::snprintf(buf, sizeof buf, bps >= 1e12 ? "%.2f TB/s" : "%.2f GB/s", bps >= 1e12 ? bps / 1e12 : bps / 1e9);
    return buf;
}

std::string pct(double e) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", e * 100);
    return buf;
}

void human(const plan::Report& r, const plan::Hardware& h) {
    const auto& w = r.w;
    std::printf("# zinf-plan: %s, dp %u over %u node%s, batch %llu x seq %llu per device, ci %u, params %s, grads %s\n",
                w.spec.to_string().c_str(), w.dp, w.nodes, w.nodes == 1 ? "" : "s",
                static_cast<unsigned long long>(w.batch), static_cast<unsigned long long>(w.sequence()), w.ci,
                shard::dtype_name(w.param_dtype), shard::dtype_name(w.grad_dtype));
    std::printf("# peak %.1f TFLOP/s per device (%s); target efficiency %.2f\n", h.peak_flops / 1e12,
                h.source_peak.c_str(), r.target);
    std::printf("#\n# memory (§3)\n");
    auto row = [](const char* key, const std::string& value, const std::string& note) {
        if (note.empty())
            std::printf("%-30s %s\n", key, value.c_str());
        else
            std::printf("%-30s %-22s # %s\n", key, value.c_str(), note.c_str());
    };
    auto at = [](double bps) { return std::isinf(bps) ? std::string("in device memory") : "at " + gb(bps); };
    row("params", std::to_string(r.states.params), "exact, from the layout");
    row("paper_params", std::to_string(r.paper_params), "12 nl hd^2");
    row("model_state_bytes", format_size(r.model_state_bytes),
        "params, grads, master, moments in these dtypes");
    row("model_state_bytes_per_rank", format_size(r.model_state_bytes_per_rank), "over dp ranks");
    row("paper_model_state_bytes", format_size(r.paper_model_state_bytes), "20 bytes a parameter (240 nl hd^2)");
    row("activation_checkpoint_bytes", format_size(r.activation_checkpoint_bytes), "2 bsz seq hd nl / ci, per device");
    const shard::Family& family = shard::family(r.w.spec.arch);
    row("mswm_bytes", format_size(r.mswm_bytes), family.mswm_formula);
    row("awm_bytes", format_size(r.awm_bytes), family.awm_formula);
    row("flat_bytes", format_size(r.flat_bytes), "NCCL's flat bucket area at dp > 1: the largest bucket");
    std::printf("#\n# bandwidth (§4): arithmetic intensity, and the bandwidth each needs for the target\n");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f", r.ait_param);
    row("ait_param", buf, "seq bsz; needs " + gb(r.need_param_bps));
    std::snprintf(buf, sizeof buf, "%.0f", r.ait_optimizer);
    row("ait_optimizer", buf, "seq bsz / 4; needs " + gb(r.need_optimizer_bps));
    std::snprintf(buf, sizeof buf, "%.0f", r.ait_activation);
    row("ait_activation", buf,
        std::string(family.ait_activation_formula) + "; needs " + gb(r.need_activation_bps));
    std::printf("#\n# hardware: gpu %s per device, cpu %s and nvme %s per node\n", format_size(h.gpu_bytes).c_str(),
                format_size(h.cpu_bytes).c_str(), format_size(h.nvme_bytes).c_str());
    auto src = [](double bps, const std::string& s) { return bps > 0 ? gb(bps) + " (" + s + ")" : "unknown"; };
    std::printf("#   gpu-gpu %s; cpu-gpu %s; nvme read %s, write %s; cpu update %s; cpu xxh3 %s\n",
                src(h.gpu_gpu_bps, h.source_gpu_gpu).c_str(), src(h.cpu_gpu_bps, h.source_cpu_gpu).c_str(),
                src(h.nvme_read_bps, h.source_nvme_read).c_str(), src(h.nvme_write_bps, h.source_nvme_write).c_str(),
                src(h.cpu_update_bps, h.source_cpu_update).c_str(),
                h.cpu_hash_bps > 0 ? src(h.cpu_hash_bps, h.source_cpu_hash).c_str() : "not measured, not counted");
    std::printf("#\n# %-6s %-6s %-5s %4s %12s %12s %12s %10s %10s %10s %9s\n", "param", "optim", "acts", "fits", "gpu_need",
                "cpu_need", "nvme_need", "eff_param", "eff_optim", "eff_acts", "step_s");
    for (const auto& p : r.all) {
        char step[32] = "unknown";
        if (p.step.known) std::snprintf(step, sizeof step, "%.3f", p.step.total());
        std::printf("  %-6s %-6s %-5s %4s %12s %12s %12s %10s %10s %10s %9s\n", shard::tier_name(p.param),
                    shard::tier_name(p.optim), shard::tier_name(p.activations), p.fits ? "yes" : "no",
                    format_size(p.gpu.need).c_str(), format_size(p.cpu.need).c_str(),
                    format_size(p.nvme.need).c_str(), pct(p.efficiency_param).c_str(),
                    pct(p.efficiency_optimizer).c_str(), pct(p.efficiency_activation).c_str(), step);
    }
    std::printf("#\n# recommendation\n");
    if (!r.placement) {
        row("placement", "none", "nothing fits these capacities");
    } else {
        row("placement", r.placement->name(),
            r.meets_target ? "the cheapest that fits and meets the target"
                           : "fits, but no placement meets the target: the best least efficiency");
        row("efficiency_param", pct(r.placement->efficiency_param), at(r.placement->param_bps));
        row("efficiency_optimizer", pct(r.placement->efficiency_optimizer), at(r.placement->optim_bps));
        row("efficiency_activation", pct(r.placement->efficiency_activation),
            std::string("checkpoints on ") + shard::tier_name(r.placement->activations));
        if (const plan::StepTime& st = r.placement->step; st.known) {
            char v[256];
            std::snprintf(v, sizeof v,
                          "forward %.3f, backward %.3f (stall %.3f), optimizer after it %.3f (beside the next "
                          "%s), disk %.3f; %s read ahead, %s of gradients in memory; --no-overlap %.3f",
                          st.forward, st.backward, st.stall, st.optimizer,
                          st.under_backward ? "forward, its tail beside the backward" : "forward", st.disk,
                          format_size(st.readahead_bytes).c_str(), format_size(st.grad_memory_bytes).c_str(),
                          st.sequential());
            char t[32];
            std::snprintf(t, sizeof t, "%.3f", st.total());
            row("step_s", t, v);
        } else {
            row("step_s", "unknown", "a bandwidth this placement uses was not measured");
        }
        row("batch_for_target", r.batch_for_target ? std::to_string(r.batch_for_target) : "none",
            "per device, for both parameter and optimizer efficiency");
        char v[160] = "the step's time is unknown";
        if (r.placement->offload_ratio > 0)
            std::snprintf(v, sizeof v, "per device: its step within %.0f%% of all on the GPU's (now %.2fx at batch %llu)",
                          plan::kOffloadOverhead * 100, r.placement->offload_ratio,
                          static_cast<unsigned long long>(w.batch));
        row("offload_batch", r.placement->offload_batch ? std::to_string(r.placement->offload_batch) : "none", v);
    }
    row("tile", r.tile ? std::to_string(r.tile) : "none",
        h.gpu_bytes ? "the smallest factor whose MSWM fits the largest device block" : "no GPU memory given");
    row("fits", r.placement ? "yes" : "no", r.placement ? "" : "no placement fits");
    std::fflush(stdout);
}

int run(Options& o) {
    plan::Workload& w = o.w;
    w.spec = shard::ModelSpec::parse(o.model);
    w.param_dtype = shard::parse_dtype(o.param_dtype);
    w.grad_dtype = shard::parse_dtype(o.grad_dtype);
    if (o.readahead != "auto") w.readahead = size_of(o.readahead, "--optimizer-readahead");
    w.validate();
    if (!(o.peak_tflops > 0)) throw UsageError("--peak-tflops must be positive");

    plan::Hardware h;
    h.peak_flops = o.peak_tflops * 1e12;
    h.source_peak = "default: the paper's V100 figure";
    for (const auto& f : o.bench) read_bench_file(f, h);
    // Flags win over the bench files.
    if (o.peak_given) {
        h.peak_flops = o.peak_tflops * 1e12;
        h.source_peak = "--peak-tflops";
    }
    auto flag = [](const std::optional<double>& given, double& dst, std::string& src, const char* name) {
        if (!given) return;
        const double v = *given;
        if (!(v >= 0) || !std::isfinite(v))
            throw UsageError(std::string(name) + " " + std::to_string(v) + ": a bandwidth is a finite number of GB/s, 0 or more");
        {
            dst = v * 1e9;
            src = name;
        }
    };
    flag(o.bw_gpu_gpu, h.gpu_gpu_bps, h.source_gpu_gpu, "--bw-gpu-gpu");
    flag(o.bw_cpu_gpu, h.cpu_gpu_bps, h.source_cpu_gpu, "--bw-cpu-gpu");
    flag(o.bw_nvme_read, h.nvme_read_bps, h.source_nvme_read, "--bw-nvme-read");
    flag(o.bw_nvme_write, h.nvme_write_bps, h.source_nvme_write, "--bw-nvme-write");
    flag(o.bw_cpu_update, h.cpu_update_bps, h.source_cpu_update, "--bw-cpu-update");
    flag(o.bw_cpu_hash, h.cpu_hash_bps, h.source_cpu_hash, "--bw-cpu-hash");

    if (!o.gpu_mem.empty()) {
        h.gpu_bytes = size_of(o.gpu_mem, "--gpu-mem");
    } else {
        const auto g = mem::gpu_info();
        h.gpu_bytes = g.bytes;
        if (!g.count) log::warn("no GPU (" + g.why_not + "): GPU memory taken as 0; give --gpu-mem to plan for one");
    }
    if (!o.gpu_max_block.empty()) h.gpu_max_block = size_of(o.gpu_max_block, "--gpu-max-block");
    h.cpu_bytes = o.cpu_mem.empty() ? meminfo_bytes("MemTotal") : size_of(o.cpu_mem, "--cpu-mem");
    std::string nvme_source;
    h.nvme_bytes = nvme_capacity(o.nvme, nvme_source);
    log::info("nvme capacity: " + format_size(h.nvme_bytes) + " (" + nvme_source + ")");

    // A bandwidth nobody measured counts as 0: say which, and where to get it.
    auto unknown = [](double bps, const char* what, const char* how) {
        if (bps <= 0) log::warn(std::string("no ") + what + " bandwidth: placements that use it get efficiency 0 (" + how + ")");
    };
    if (w.dp > 1) unknown(h.gpu_gpu_bps, "allgather", "--bench from zinf-commbench --json, or --bw-gpu-gpu");
    unknown(h.cpu_gpu_bps, "host-device", "--bench from zinf-pinstress --json on a GPU machine, or --bw-cpu-gpu");
    unknown(h.nvme_read_bps, "NVMe read", "--bench from zinf-nvmebench --json, or --bw-nvme-read");
    unknown(h.nvme_write_bps, "NVMe write", "--bench from zinf-nvmebench --json, or --bw-nvme-write");
    unknown(h.cpu_update_bps, "CPU optimizer", "--bench from zinf-optbench --json, or --bw-cpu-update");

    const plan::Report r = plan::plan(w, h, o.target);
    if (o.json) {
        std::cout << plan::to_json(r).dump() << '\n';
        std::cout.flush();
    } else {
        human(r, h);
    }
    if (!std::cout || std::ferror(stdout)) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-plan")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-plan: what fits where and how fast it will go, from the ZeRO-Infinity paper's memory and\n"
                 "bandwidth model (§3-4), fed by the bandwidths zinf-nvmebench and the other benches measured."};
    app.name("zinf-plan");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("--model", o.model, "Model spec or preset, as zinf-shard takes it (gpt2-124m, paper-1t, gpt:...)")
        ->required();
    app.add_option("--dp", o.w.dp, "Data-parallel ranks, one device each")->capture_default_str();
    app.add_option("--nodes", o.w.nodes, "Nodes the ranks are spread over")->capture_default_str();
    app.add_option("--tile", o.w.tile, "Tiling factor of the linear weights (for MSWM)")->capture_default_str();
    app.add_option("--batch,-B", o.w.batch, "Batch size per device (bsz)")->capture_default_str();
    app.add_option("--seq,-T", o.w.seq, "Sequence length (default: the model's)");
    app.add_option("--ci", o.w.ci, "Transformer blocks between activation checkpoints")->capture_default_str();
    app.add_option("--param-dtype", o.param_dtype, "Working parameters: bf16 or fp32")
        ->capture_default_str()
        ->check(CLI::IsMember({"bf16", "fp32"}));
    app.add_option("--grad-dtype", o.grad_dtype, "Gradients: bf16 or fp32")
        ->capture_default_str()
        ->check(CLI::IsMember({"bf16", "fp32"}));
    app.add_option("--target", o.target, "Efficiency each state must keep (0-1)")->capture_default_str();
    auto* peak = app.add_option("--peak-tflops", o.peak_tflops, "Achievable peak per device, TFLOP/s")->capture_default_str();
    app.add_option("--gpu-mem", o.gpu_mem, "Device memory per device (default: the first CUDA device's)");
    app.add_option("--gpu-max-block", o.gpu_max_block, "Largest contiguous device allocation (default: --gpu-mem)");
    app.add_option("--cpu-mem", o.cpu_mem, "CPU memory per node (default: this machine's)");
    app.add_option("--nvme", o.nvme, "NVMe capacity per node: a size, or a folder (its free space; default $TMPDIR or /var/tmp)");
    app.add_option("--bench", o.bench, "Bench JSON Lines (zinf-nvmebench, -pinstress, -commbench, -optbench --json); '-' stdin; repeatable");
    app.add_option("--bw-gpu-gpu", o.bw_gpu_gpu, "Allgather bus bandwidth per device, GB/s (over --bench)");
    app.add_option("--bw-cpu-gpu", o.bw_cpu_gpu, "Pinned host-device bandwidth per device, GB/s");
    app.add_option("--bw-nvme-read", o.bw_nvme_read, "NVMe read bandwidth per node, GB/s");
    app.add_option("--bw-nvme-write", o.bw_nvme_write, "NVMe write bandwidth per node, GB/s");
    app.add_option("--bw-cpu-update", o.bw_cpu_update, "CPU optimizer memory traffic per node, GB/s");
    app.add_option("--bw-cpu-hash", o.bw_cpu_hash,
                   "xxh3 of the NVMe optimizer's state per node, GB/s (0: not counted)");
    app.add_option("--optimizer-readahead", o.readahead,
                   "Optimizer state read during backward per rank, as zinf-train takes it (SIZE or auto)")
        ->capture_default_str();
    app.add_flag("--json", o.json, "One JSON record (zinf.plan/1) instead of the report");
    return cli::run(app, argc, argv, "zinf-plan", common, [&] {
        o.peak_given = peak->count() > 0;
        return run(o);
    });
}
