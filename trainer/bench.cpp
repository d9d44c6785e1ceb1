// zinf-train --bench: the achieved FLOP/s of a whole training step (forward,
// backward with recomputation, AdamW) of a GPT held in device memory,
// against the sgemm rate of the same device measured in the same run.
#include "bench.hpp"

#include <zinf/device.hpp>
#include <zinf/model.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

namespace zinf::trainer {

void BenchOptions::add(CLI::App& app) {
    app.add_flag("--bench", enabled, "Benchmark: a training step's FLOP/s against OpenBLAS sgemm (no manifest)");
    options = {app.add_option("--bench-model", model, "The model --bench times")->capture_default_str(),
               app.add_option("--bench-steps", steps, "Timed steps after one warm-up (the median is reported)")
                   ->capture_default_str()
                   ->check(CLI::Range(1u, 10000u)),
               app.add_option("--bench-gemm", gemm_n, "Size n of the n x n sgemm the step is compared with")
                   ->capture_default_str()
                   ->check(CLI::Range(64, 16384)),
               app.add_option("--min-ratio", min_ratio,
                              "--bench: exit 75 when the step's FLOP/s is below this times sgemm's")};
}

void BenchOptions::check() const {
    if (enabled) return;
    for (const CLI::Option* opt : options)
        if (opt->count() > 0) throw UsageError(opt->get_name() + " needs --bench");
}

unsigned cores_per_rank(const comm::Communicator& comm, unsigned threads) {
    if (threads) return threads;
    // What the launcher bound this rank to, but never more than its share of
    // the node: Open MPI binds to a core for 2 ranks and to a whole socket
    // past that, where every rank on the socket would take all of it.
    const unsigned all = std::max(1u, std::thread::hardware_concurrency());
    const unsigned share = std::max(1u, all / static_cast<unsigned>(std::max(1, comm.local_size())));
    return std::min(affinity_cpus(), share);
}

int run_bench(const BenchOptions& o, std::uint64_t batch, std::uint64_t seq, device::Options device,
              device::Precision precision, bool json, bool checkpoint, const std::atomic<bool>& stop) {
    const shard::ModelSpec spec = shard::ModelSpec::parse(o.model);
    if (!device.threads) device.threads = affinity_cpus();
    auto dev = device::open(device);
    auto& s = dev->compute();

    const auto model = model::make_model(model::Config::from(spec));
    model::LanguageModel& gpt = *model;
    model::ResidentEngine eng(*dev, model::numels(gpt.params_table()));
    auto acts = gpt.plan(*dev, {.batch = batch, .seq = seq, .checkpoint = checkpoint, .checkpoints = precision,
                               .activations = precision});
    const auto tensors = shard::tensors(spec);
    {  // filled on the host, copied in: device memory is not the host's on every backend
        std::vector<float> host;
        for (std::size_t t = 0; t < tensors.size(); ++t) {
            host.resize(eng.values(t).size());
            shard::fill_fp32(tensors[t], spec, 0x5eed, 0, host);
            dev->copy(s, std::as_writable_bytes(eng.values(t)), std::as_bytes(std::span<const float>(host)));
            dev->synchronize(s);
        }
    }
    std::mt19937 rng(1234);
    std::vector<std::int32_t> tokens(batch * seq);
    for (auto& v : tokens) v = static_cast<std::int32_t>(rng() % spec.vocab);
    std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
    targets.push_back(tokens.front());
    dev->copy(s, std::as_writable_bytes(acts.inputs.span()), std::as_bytes(std::span(tokens)));
    dev->copy(s, std::as_writable_bytes(acts.targets.span()), std::as_bytes(std::span(targets)));
    dev->synchronize(s);
    auto m1 = dev->alloc<float>(eng.all_values().size(), "exp_avg");
    auto m2 = dev->alloc<float>(eng.all_values().size(), "exp_avg_sq");
    const optim::AdamW h{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

    model::Context ctx{*dev, s, eng, precision};
    log::info(spec.to_string() + ", " + device::precision_name(precision) + ", batch " + std::to_string(batch) +
              " x " + std::to_string(seq) + ", " +
              std::to_string(dev->threads()) + (dev->backend() == "cuda" ? " SMs: " : " threads: ") +
              std::to_string(o.steps) + " steps after a warm-up");
    std::vector<double> times;
    for (unsigned i = 0; i <= o.steps; ++i) {
        if (stop.load()) throw Interrupted("interrupted after " + std::to_string(times.size()) + " timed steps");
        Timer t;
        eng.zero_grad(s);
        gpt.forward(ctx, acts);
        gpt.backward(ctx, acts);
        optim::Update u{.master = eng.all_values(), .exp_avg = m1.span(), .exp_avg_sq = m2.span(),
                        .grad_f32 = eng.all_gradients()};
        dev->adamw(s, u, optim::Scalars::make(h, i + 1));
        dev->synchronize(s);
        if (i) times.push_back(t.seconds());
    }
    const double step_s = median(times);
    const double model_flops = gpt.flops_per_step(batch, seq);
    // The blocks' forward runs twice with checkpointing: the work done, not the model's.
    const double C = static_cast<double>(spec.hidden), L = static_cast<double>(spec.layers);
    const double N = static_cast<double>(batch * seq), T = static_cast<double>(seq);
    // A block's weights: 12 C^2 for a GPT; a Llama's q, k, v, o and three MLP matrices.
    const double hd = static_cast<double>(spec.head_dim()), H = static_cast<double>(spec.heads);
    const double block = spec.llama() ? C * (H + 2.0 * static_cast<double>(spec.kv_heads)) * hd + H * hd * C +
                                            3.0 * C * static_cast<double>(spec.ffn)
                                      : 12.0 * C * C;
    // A Llama's recompute stops before down_proj, whose output its backward does not read.
    const double recomputed = spec.llama() ? block - C * static_cast<double>(spec.ffn) : block;
    const double recompute = checkpoint ? L * (2.0 * recomputed * N + 2.0 * C * T * (T + 1) * batch) : 0.0;

    log::info("sgemm " + std::to_string(o.gemm_n) + " x " + std::to_string(o.gemm_n));
    double gemm = 0;
    for (int r = 0; r < 3 && !stop.load(); ++r) gemm = std::max(gemm, device::measure_gemm_flops(*dev, o.gemm_n, 3));
    if (stop.load()) throw Interrupted("interrupted while timing sgemm");
    // On a GPU, the rate a bf16 step is held to (fp32 is the step's own).
    const double gemm_bf16 = device::measure_gemm_bf16_flops(*dev, o.gemm_n, 3);
    const bool against_bf16 = precision == device::Precision::bf16 && gemm_bf16 > 0;

    const double rate = model_flops / step_s, ratio = rate / (against_bf16 ? gemm_bf16 : gemm);
    if (json) {
        json::Json j;
        j["schema"] = "zinf.train-bench/1";
        j["model"] = spec.to_string();
        j["precision"] = device::precision_name(precision);
        j["batch"] = batch;
        j["seq"] = seq;
        j["threads"] = dev->threads();
        j["checkpoint"] = checkpoint;
        j["steps"] = o.steps;
        j["step_s"] = step_s;
        j["flops_per_step"] = model_flops;
        j["flops_per_s"] = rate;
        j["executed_flops_per_s"] = (model_flops + recompute) / step_s;
        j["sgemm_n"] = o.gemm_n;
        j["sgemm_flops_per_s"] = gemm;
        j["device"] = dev->backend();
        if (gemm_bf16 > 0) j["bf16_gemm_flops_per_s"] = gemm_bf16;
        j["ratio"] = ratio;
        j["ratio_peer"] = against_bf16 ? "bf16_gemm" : "sgemm";
        j["activation_bytes"] = acts.bytes;
        j["device_peak_bytes"] = dev->arena().stats().peak;
        std::cout << j.dump() << '\n';
    } else {
        std::printf("# zinf-train --bench: %s, %s, batch %llu x %llu, %s, %u %s\n", spec.to_string().c_str(),
                    device::precision_name(precision), static_cast<unsigned long long>(batch),
                    static_cast<unsigned long long>(seq),
                    dev->backend().c_str(), dev->threads(), dev->backend() == "cuda" ? "SMs" : "threads");
        if (gemm_bf16 > 0) std::printf("# cuBLASLt bf16 GEMM (fp32 accumulation): %.2f GFLOP/s\n", gemm_bf16 / 1e9);
        std::printf("# ratio: the step's model FLOP/s over %s's\n", against_bf16 ? "the bf16 GEMM" : "sgemm");
        std::printf("# step_s  model_GFLOP/s  executed_GFLOP/s  sgemm_GFLOP/s  ratio\n");
        std::printf("%.4f  %.2f  %.2f  %.2f  %.3f\n", step_s, rate / 1e9, (model_flops + recompute) / step_s / 1e9,
                    gemm / 1e9, ratio);
    }
    std::cout.flush();
    if (o.min_ratio > 0 && ratio < o.min_ratio) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "the step ran at %.3f of %s's rate, below --min-ratio %.3f", ratio,
                      against_bf16 ? "the bf16 GEMM" : "sgemm", o.min_ratio);
        throw ThresholdError(buf);
    }
    return 0;
}

}  // namespace zinf::trainer
