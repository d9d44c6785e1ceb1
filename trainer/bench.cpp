// zinf-train --bench: the achieved FLOP/s of a whole training step (forward,
// backward with recomputation, AdamW) of a GPT held in device memory,
// against the sgemm rate of the same device measured in the same run.
#include "bench.hpp"
#include "profile.hpp"

#include <zinf/device.hpp>
#include <zinf/family.hpp>
#include <zinf/model.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

namespace zinf::trainer {

void BenchOptions::add(CLI::App& app) {
    app.add_flag("--bench", enabled, "Benchmark: a training step's FLOP/s against OpenBLAS sgemm (no manifest)");
    options = {app.add_option("--bench-model", model, "The model --bench times")->capture_default_str(),
               app.add_option("--bench-against", against,
                              "A second model timed alternately with --bench-model, step by step, each step beside "
                              "an sgemm of its own; adds the first's ratio over the second's"),
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

std::uint64_t profile_copy_bytes(device::Device& dev) {
    // Past every cache: 256 MiB on a GPU (an H200's L2 is 60 MiB), 64 MiB on
    // cpu; a quarter of what the budget has free at most (source and
    // destination), so that a small budget is not refused for it.
    const std::uint64_t want = dev.backend() == "cuda" ? 256 * MiB : 64 * MiB;
    return std::max<std::uint64_t>(1 * MiB, std::min(want, dev.arena().stats().largest_free / 4));
}

namespace {

// One model's training step on the resident engine, on random tokens: what
// --bench times, for --bench-model and for --bench-against.
struct BenchModel {
    BenchModel(device::Device& dev, const std::string& text, std::uint64_t batch, std::uint64_t seq,
               device::Precision precision, train::Checkpointing mode, bool flash)
        : dev(dev), spec(shard::ModelSpec::parse(text)), model(model::make_model(model::Config::from(spec))),
          eng(dev, model::numels(model->params_table()), kept_bf16(spec, precision)),
          choice(choose(dev, *model, eng, {.batch = batch, .seq = seq, .checkpoint = false, .checkpoints = precision,
                                           .activations = precision,
                                           .attention = flash ? model::Attention::flash : model::Attention::gemm},
                        mode)),
          acts(model->plan(dev, {.batch = batch, .seq = seq, .checkpoint = choice.recompute,
                                 .checkpoints = precision, .activations = precision,
                                 .attention = flash ? model::Attention::flash : model::Attention::gemm})),
          m1(dev.alloc<float>(eng.all_gradients().size(), "exp_avg")),
          m2(dev.alloc<float>(eng.all_gradients().size(), "exp_avg_sq")), ctx{dev, dev.compute(), eng, precision} {
        auto& s = dev.compute();
        const auto tensors = shard::tensors(spec);
        // Working parameters kept bf16 (--precision bf16, as the trainer's
        // engines keep them): their fp32 master beside them, as the
        // optimizer's, laid out as the gradients.
        for (std::size_t t = 0; t < tensors.size(); ++t) bf16_working = bf16_working || eng.kept_bf16(t);
        if (bf16_working) master = dev.alloc<float>(eng.all_gradients().size(), "master parameters");
        {  // filled on the host, copied in: device memory is not the host's on every backend
            std::vector<float> host;
            std::vector<std::uint16_t> half;
            auto in = [&](auto dst, const auto& src) {
                dev.copy(s, std::as_writable_bytes(dst), std::as_bytes(std::span(src)));
                dev.synchronize(s);
            };
            for (std::size_t t = 0; t < tensors.size(); ++t) {
                host.resize(tensors[t].numel);
                shard::fill_fp32(tensors[t], spec, 0x5eed, 0, host);
                if (bf16_working) in(master.span().subspan(eng.offset(t), host.size()), host);
                if (eng.kept_bf16(t)) {
                    half.resize(host.size());
                    to_bf16(std::span<const float>(host), std::span(half));
                    in(eng.values_bf16(t), half);
                } else {
                    in(eng.values(t), host);
                }
            }
            if (bf16_working) updates(tensors.size());
        }
        std::mt19937 rng(1234);
        std::vector<std::int32_t> tokens(batch * seq);
        for (auto& v : tokens) v = static_cast<std::int32_t>(rng() % spec.vocab);
        std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
        targets.push_back(tokens.front());
        dev.copy(s, std::as_writable_bytes(acts.inputs.span()), std::as_bytes(std::span(tokens)));
        dev.copy(s, std::as_writable_bytes(acts.targets.span()), std::as_bytes(std::span(targets)));
        dev.synchronize(s);

        model_flops = model->flops_per_step(batch, seq);
        // The blocks' forward runs twice with checkpointing: the work done, not the model's.
        const double C = static_cast<double>(spec.hidden), L = static_cast<double>(spec.layers);
        const double N = static_cast<double>(batch * seq), T = static_cast<double>(seq);
        // A block's GEMM weights, less those the recompute skips (shard::BlockWeights).
        const shard::BlockWeights block = shard::family(spec.arch).block(spec);
        const double recomputed = static_cast<double>(block.weights - block.not_recomputed);
        recompute_flops = choice.recompute ? L * (2.0 * recomputed * N + 2.0 * C * T * (T + 1) * static_cast<double>(batch))
                                     : 0.0;
    }

    // Step i (0 the warm-up), timed, the device waited for. With a profile,
    // its kernels are timed into it (the device's set_profile) and its
    // stages by stamps on compute between them.
    double step(unsigned i, device::Profile* prof = nullptr) {
        auto& s = dev.compute();
        auto mark = [&] { return prof ? dev.stamp(s) : device::Stamp{}; };
        Timer t;
        device::Stamp t0 = mark();
        eng.zero_grad(s);
        device::Stamp t1 = mark();
        model->forward(ctx, acts);
        device::Stamp t2 = mark();
        model->backward(ctx, acts);
        device::Stamp t3 = mark();
        if (bf16_working) {  // a launch per parameter: the working copy bf16 or fp32 as it is kept
            for (const optim::Update& u : per_param) dev.adamw(s, u, optim::Scalars::make(kAdamW, i + 1));
        } else {
            optim::Update u{.master = eng.all_values(), .exp_avg = m1.span(), .exp_avg_sq = m2.span(),
                            .grad_f32 = eng.all_gradients()};
            dev.adamw(s, u, optim::Scalars::make(kAdamW, i + 1));
        }
        device::Stamp t4 = mark();
        dev.synchronize(s);
        const double seconds = t.seconds();
        if (prof) {
            prof->stage("zero_grad", t0, t1);
            prof->stage("forward", t1, t2);
            prof->stage("backward", t2, t3);
            prof->stage("optimizer", t3, t4);
            prof->collect(seconds);
        }
        return seconds;
    }

    // --checkpoint for this model: every block's activations (`keep`)
    // against what the device has left once the parameters and gradients
    // are in, less the AdamW moments still to come (as many bytes again).
    static train::CheckpointChoice choose(device::Device& dev, const model::LanguageModel& m,
                                          model::ResidentEngine& e, const model::Shape& keep,
                                          train::Checkpointing mode) {
        const mem::ArenaStats a = dev.arena().stats();
        return train::choose_checkpointing(mode, model::Offload::none, m.plan_bytes(keep),
                                           2 * e.all_gradients().size_bytes(), a.bytes > a.used ? a.bytes - a.used : 0);
    }

    // The parameters the engine keeps bf16 under `p`: the trainer's rule
    // (zero.hpp's InfinityOptions::bf16_weights), the matrices and tables.
    static std::vector<bool> kept_bf16(const shard::ModelSpec& spec, device::Precision p) {
        std::vector<bool> keep;
        for (const auto& t : shard::tensors(spec)) keep.push_back(p == device::Precision::bf16 && t.shape.size() >= 2);
        return keep;
    }

    // One AdamW update per parameter over the master copy, the moments and
    // the gradient at its offset, writing its working copy as kept.
    void updates(std::size_t count) {
        for (std::size_t t = 0; t < count; ++t) {
            const std::uint64_t at = eng.offset(t);
            const std::size_t n = eng.gradient(t).size();
            optim::Update u{.master = master.span().subspan(at, n), .exp_avg = m1.span().subspan(at, n),
                            .exp_avg_sq = m2.span().subspan(at, n), .grad_f32 = eng.gradient(t)};
            if (eng.kept_bf16(t))
                u.param_bf16 = eng.values_bf16(t);
            else
                u.param_f32 = eng.values(t);
            per_param.push_back(u);
        }
    }

    static constexpr optim::AdamW kAdamW{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    device::Device& dev;
    shard::ModelSpec spec;
    std::unique_ptr<model::LanguageModel> model;
    model::ResidentEngine eng;
    train::CheckpointChoice choice;
    model::Activations acts;
    device::Array<float> m1, m2;
    model::Context ctx;
    bool bf16_working = false;
    device::Array<float> master;            // (bf16_working) every parameter's fp32 master
    std::vector<optim::Update> per_param;  // (bf16_working) AdamW's launches
    double model_flops = 0, recompute_flops = 0;

    // Results: the median step, the peer it is held to and the ratio.
    std::vector<double> times, ratios, peers;
    double step_s = 0, peer = 0, ratio = 0;
};

}  // namespace

int run_bench(const BenchOptions& o, std::uint64_t batch, std::uint64_t seq, device::Options device,
              device::Precision precision, bool json, train::Checkpointing checkpoint, bool profile,
              const std::atomic<bool>& stop) {
    if (profile && !o.against.empty()) throw UsageError("--profile profiles one model: not with --bench-against");
    if (!device.threads) device.threads = affinity_cpus();
    auto dev = device::open(device);
    // The peaks a profile's rows are held to, measured first, while the
    // arena is empty.
    std::optional<device::Peaks> peaks;
    std::optional<device::Profile> prof;
    if (profile) {
        log::info("--profile: the device's GEMM and copy peaks");
        peaks = device::measure_peaks(*dev, precision, o.gemm_n, profile_copy_bytes(*dev), 3);
        prof.emplace(*dev);
    }

    std::vector<std::unique_ptr<BenchModel>> models;
    models.push_back(std::make_unique<BenchModel>(*dev, o.model, batch, seq, precision, checkpoint, o.flash_attention));
    if (!o.against.empty())
        models.push_back(
            std::make_unique<BenchModel>(*dev, o.against, batch, seq, precision, checkpoint, o.flash_attention));
    const bool paired = models.size() > 1;
    for (const auto& b : models)
        log::info(b->spec.to_string() + ", " + device::precision_name(precision) +
                  (o.flash_attention ? ", flash attention" : "") + ", batch " + std::to_string(batch) +
                  " x " + std::to_string(seq) + ", " + std::to_string(dev->threads()) +
                  (dev->backend() == "cuda" ? " SMs: " : " threads: ") + std::to_string(o.steps) +
                  " steps after a warm-up; activations " + format_size(b->acts.bytes) + " (" +
                  (b->choice.recompute ? "checkpointed" : "every block's kept") + ", " + b->choice.why + ")");
    // On a GPU, the rate a bf16 step is held to (fp32 is the step's own).
    const double gemm_bf16 = device::measure_gemm_bf16_flops(*dev, o.gemm_n, 3);
    const bool against_bf16 = precision == device::Precision::bf16 && gemm_bf16 > 0;
    auto peer_rate = [&] {
        return against_bf16 ? device::measure_gemm_bf16_flops(*dev, o.gemm_n, 3)
                            : device::measure_gemm_flops(*dev, o.gemm_n, 3);
    };
    const char* peer_name = against_bf16 ? "the bf16 GEMM" : "sgemm";

    double gemm = 0;
    std::vector<double> quotients;  // paired: per round, the first model's ratio over the second's
    if (!paired) {
        BenchModel& b = *models[0];
        for (unsigned i = 0; i <= o.steps; ++i) {
            if (stop.load()) throw Interrupted("interrupted after " + std::to_string(b.times.size()) + " timed steps");
            // The warm-up is not profiled: its first calls plan GEMMs and fault pages in.
            device::Profile* p = prof && i ? &*prof : nullptr;
            dev->set_profile(p);
            const double t = b.step(i, p);
            dev->set_profile(nullptr);
            if (i) b.times.push_back(t);
        }
        log::info("sgemm " + std::to_string(o.gemm_n) + " x " + std::to_string(o.gemm_n));
        for (int r = 0; r < 3 && !stop.load(); ++r) gemm = std::max(gemm, device::measure_gemm_flops(*dev, o.gemm_n, 3));
        if (stop.load()) throw Interrupted("interrupted while timing sgemm");
        b.step_s = median(b.times);
        b.peer = against_bf16 ? gemm_bf16 : gemm;
        b.ratio = b.model_flops / b.step_s / b.peer;
    } else {
        // Round i times each model's step once, in an order that flips every
        // round, with the peer timed before and after each step: a step's
        // ratio is its rate over the mean of the two, the machine's rate
        // beside it; a round's quotient is the first model's ratio over the
        // second's. On a shared machine whose speed moves from second to
        // second, the pairs keep both models under the same conditions.
        log::info(std::string(peer_name) + " " + std::to_string(o.gemm_n) + " x " + std::to_string(o.gemm_n) +
                  " before and after every step");
        double before = peer_rate();
        for (unsigned i = 0; i <= o.steps; ++i) {
            std::array<double, 2> r{};
            for (std::size_t k = 0; k < 2; ++k) {
                const std::size_t which = (i % 2 == 0) ? k : 1 - k;
                BenchModel& b = *models[which];
                if (stop.load()) throw Interrupted("interrupted after " + std::to_string(b.times.size()) + " timed rounds");
                const double t = b.step(i);
                const double after = peer_rate();
                const double at = (before + after) / 2;
                before = after;
                if (i == 0) continue;  // the warm-up
                b.times.push_back(t);
                b.ratios.push_back(b.model_flops / t / at);
                b.peers.push_back(at);
                r[which] = b.ratios.back();
            }
            if (i) quotients.push_back(r[0] / r[1]);
        }
        for (const auto& b : models) {
            b->step_s = median(b->times);
            b->ratio = median(b->ratios);
            b->peer = median(b->peers);
        }
    }
    const double quotient = paired ? median(quotients) : 0.0;

    for (std::size_t k = 0; k < models.size(); ++k) {
        const BenchModel& b = *models[k];
        const double rate = b.model_flops / b.step_s, executed = (b.model_flops + b.recompute_flops) / b.step_s;
        if (json) {
            json::Json j;
            j["schema"] = "zinf.train-bench/1";
            j["model"] = b.spec.to_string();
            j["precision"] = device::precision_name(precision);
            j["batch"] = batch;
            j["seq"] = seq;
            j["threads"] = dev->threads();
            j["checkpoint"] = b.choice.recompute;
            j["checkpoint_mode"] = train::checkpointing_name(checkpoint);
            j["steps"] = o.steps;
            j["step_s"] = b.step_s;
            j["flops_per_step"] = b.model_flops;
            j["flops_per_s"] = rate;
            j["executed_flops_per_s"] = executed;
            j["sgemm_n"] = o.gemm_n;
            if (!paired)
                j["sgemm_flops_per_s"] = gemm;
            else if (!against_bf16)
                j["sgemm_flops_per_s"] = b.peer;  // the median of those timed beside its steps
            j["device"] = dev->backend();
            if (gemm_bf16 > 0) j["bf16_gemm_flops_per_s"] = paired && against_bf16 ? b.peer : gemm_bf16;
            j["ratio"] = b.ratio;
            j["ratio_peer"] = against_bf16 ? "bf16_gemm" : "sgemm";
            j["activation_bytes"] = b.acts.bytes;
            j["device_peak_bytes"] = dev->arena().stats().peak;
            if (paired) {
                j["paired"] = true;
                j["role"] = k == 0 ? "model" : "against";
                if (k == 0) j["ratio_over_against"] = quotient;
            }
            std::cout << j.dump() << '\n';
        } else {
            if (k == 0 || !paired)
                std::printf("# zinf-train --bench: %s, %s, batch %llu x %llu, %s, %u %s\n", b.spec.to_string().c_str(),
                            device::precision_name(precision), static_cast<unsigned long long>(batch),
                            static_cast<unsigned long long>(seq), dev->backend().c_str(), dev->threads(),
                            dev->backend() == "cuda" ? "SMs" : "threads");
            else
                std::printf("# against: %s\n", b.spec.to_string().c_str());
            if (k == 0 && gemm_bf16 > 0)
                std::printf("# cuBLASLt bf16 GEMM (fp32 accumulation): %.2f GFLOP/s\n", gemm_bf16 / 1e9);
            if (k == 0) {
                std::printf("# ratio: the step's model FLOP/s over %s's%s\n", peer_name,
                            paired ? " timed beside it (medians over the steps)" : "");
                std::printf("# step_s  model_GFLOP/s  executed_GFLOP/s  sgemm_GFLOP/s  ratio\n");
            }
            std::printf("%.4f  %.2f  %.2f  %.2f  %.3f\n", b.step_s, rate / 1e9, executed / 1e9,
                        (paired ? b.peer : gemm) / 1e9, b.ratio);
        }
    }
    if (paired && !json) std::printf("# ratio over the against model's: %.3f (median of %zu rounds)\n", quotient,
                                     quotients.size());
    std::cout.flush();
    if (prof)
        report_profile(*prof, *peaks, *dev,
                       {.model = models[0]->spec.to_string(),
                        .precision = device::precision_name(precision),
                        .batch = batch,
                        .seq = seq,
                        .rank = 0,
                        .model_flops = models[0]->model_flops},
                       json);
    const double ratio = models[0]->ratio;
    if (o.min_ratio > 0 && ratio < o.min_ratio) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "the step ran at %.3f of %s's rate, below --min-ratio %.3f", ratio, peer_name,
                      o.min_ratio);
        throw ThresholdError(buf);
    }
    return 0;
}

}  // namespace zinf::trainer
