// zinf-optbench: the optimizer step, timed. First the AdamW update alone on
// arrays in memory (parameters per second, and the memory traffic it must do
// against a copy bandwidth measured in the same run), then the whole tiered
// step (zero::Optimizer) with the state in CPU memory and on NVMe, the NVMe
// step beside its ideal: max(I/O time at the bandwidth the same files give,
// update time). scripts/bench-adam-vs-torch.sh sets it against PyTorch.
#include "common.hpp"
#include "optbench/loops.hpp"

#include <zinf/optim.hpp>
#include <zinf/zero.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>

using namespace zinf;

namespace {

using bench::Bandwidth;
using bench::fill;
using bench::memory_gibps;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
void check_stop() {
    if (g_stop.load()) throw Interrupted("interrupted");
}

struct Options {
    bool params_given = false;
    std::string params = "50M", model, state = "both", dir;
    unsigned steps = 5, threads = 0;
    std::string isa = "auto", param_dtype = "fp32", grad_dtype = "fp32";
    cli::EngineOptions engine;
    cli::PoolOptions pool;
    double max_ideal_ratio = 0;
    bool json = false, keep = false;
};

// "50M" = 50 000 000: parameter counts are decimal, like the papers'.
std::uint64_t parse_count(const std::string& text) {
    std::size_t pos = 0;
    double v = 0;
    try {
        v = std::stod(text, &pos);
    } catch (...) {
        pos = 0;
    }
    const std::string suffix = text.substr(pos);
    const double mult = suffix.empty() ? 1 : suffix == "k" || suffix == "K" ? 1e3 : suffix == "M" ? 1e6
                                         : suffix == "G" || suffix == "B" ? 1e9 : 0;
    if (pos == 0 || mult == 0 || !(v * mult >= 1) || v * mult > 1e13)
        throw UsageError("--params '" + text + "': a count such as 50000000, 50M or 1.5G");
    return static_cast<std::uint64_t>(std::llround(v * mult));
}

// A GPT of about n parameters: the widest of a few shapes whose embeddings
// take at most a quarter of n, with as many layers as the rest pays for.
shard::ModelSpec shape_for(std::uint64_t n) {
    struct S {
        std::uint64_t hidden, vocab, seq;
    };
    const S shapes[] = {{64, 256, 64},       {256, 4096, 256},    {768, 50257, 1024},
                        {1024, 50257, 1024}, {2048, 50257, 1024}, {4096, 50257, 2048}};
    S pick = shapes[0];
    for (const S& s : shapes)
        if ((s.vocab + s.seq) * s.hidden * 4 <= n) pick = s;
    shard::ModelSpec m;
    m.hidden = pick.hidden;
    m.heads = std::max<std::uint64_t>(1, pick.hidden / 64);
    m.vocab = pick.vocab;
    m.seq = pick.seq;
    const std::uint64_t embed = (pick.vocab + pick.seq) * pick.hidden + 2 * pick.hidden,
                        layer = 12 * pick.hidden * pick.hidden + 13 * pick.hidden;
    m.layers = n > embed ? std::max<std::uint64_t>(1, (n - embed + layer / 2) / layer) : 1;
    return m;
}

struct UpdateResult {
    double seconds, bytes_per_param;
    // The xxh3 of the updated state (master, moments, bf16 parameters): what
    // the NVMe step hashes of every byte it writes (and checks of what it
    // reads), one array a thread as the step hashes its files; bytes a second.
    double hash_bps;
};

UpdateResult time_update(std::uint64_t n, const Options& o, const optim::Kernel& k, bool bf16_param, bool bf16_grad) {
    std::vector<float> w(n), m(n), v(n), g(bf16_grad ? 0 : n);
    std::vector<std::uint16_t> g16(bf16_grad ? n : 0), p16(bf16_param ? n : 0);
    fill(w, 1, 1);
    fill(m, 2, 1e-2f);
    fill(v, 3, 1e-4f, true);
    if (bf16_grad) {
        std::vector<float> tmp(n);
        fill(tmp, 4, 1e-2f);
        to_bf16(tmp, g16);
    } else {
        fill(g, 4, 1e-2f);
    }
    optim::Update u{.master = w, .exp_avg = m, .exp_avg_sq = v, .grad_f32 = g, .grad_bf16 = g16, .param_bf16 = p16};
    std::vector<double> t, th;
    std::vector<std::span<const std::byte>> state{std::as_bytes(std::span(w)), std::as_bytes(std::span(m)),
                                                  std::as_bytes(std::span(v))};
    if (bf16_param) state.push_back(std::as_bytes(std::span(p16)));
    std::uint64_t state_bytes = 0;
    for (const auto& s : state) state_bytes += s.size();
    std::vector<std::uint64_t> digests(state.size());
    for (unsigned s = 0; s <= o.steps; ++s) {
        check_stop();  // an interrupt ends the run between steps (130), not after all of them
        const auto sc = optim::Scalars::make({}, s + 1);
        Timer tm;
        optim::adamw(u, sc, k);
        if (s) t.push_back(tm.seconds());  // the first is a warm-up
        tm.reset();
#pragma omp parallel for schedule(dynamic) num_threads(static_cast<int>(state.size()))
        for (std::size_t j = 0; j < state.size(); ++j) digests[j] = xxh3(state[j]);
        if (s) th.push_back(tm.seconds());
    }
    return {median(t), 24.0 + (bf16_grad ? 2 : 4) + (bf16_param ? 2 : 0),
            static_cast<double>(state_bytes) / median(th)};
}

// A scratch folder for the state, removed at the end unless --keep.
struct Scratch {
    std::string path;
    bool keep = false;
    Scratch(const std::string& parent, bool k) : keep(k) {
        std::string base = parent;
        if (base.empty()) {
            const char* t = std::getenv("TMPDIR");
            base = t && *t ? t : "/var/tmp";
        }
        std::string tmpl = base + "/zinf-optbench.XXXXXX";
        if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp", errno, tmpl, {}, true);
        path = tmpl;
    }
    ~Scratch() {
        std::error_code ec;
        if (keep) log::info("kept the state in " + path);
        else std::filesystem::remove_all(path, ec);
    }
};

struct StepResult {
    std::string state;
    double seconds = 0, best = 0, update_seconds = 0, wait_seconds = 0, commit_seconds = 0;
    std::uint64_t bytes_read = 0, bytes_written = 0, chunk_bytes = 0;
    std::size_t read_depth = 0, write_depth = 0;
    double read_gibps = 0, write_gibps = 0, io_seconds = 0, ideal_seconds = 0;
};

StepResult time_step(const shard::ModelSpec& spec, shard::Tier tier, const std::string& root, const Options& o,
                     const optim::Kernel& k, io::Engine& eng, mem::PinnedPool& pool, double update_seconds) {
    shard::LayoutOptions lo;
    lo.param_dtype = shard::parse_dtype(o.param_dtype);
    lo.param_tier = lo.optim_tier = tier;
    shard::Manifest m = shard::layout(spec, lo);
    const std::string dir = root + "/" + shard::tier_name(tier);
    log::info(std::string("writing the initial ") + shard::tier_name(tier) + " state: " + format_size(m.total_bytes()));
    shard::RunOptions ro;
    ro.stop = &g_stop;
    shard::init(m, dir, eng, pool, ro).commit();
    shard::save_manifest(m, m.dir + "/manifest.jsonl");

    comm::Communicator c(comm::Options{.backend = comm::Backend::self});
    StepResult r;
    zero::OptimizerOptions oo;
    oo.kernel = k;
    oo.grad_dtype = shard::parse_dtype(o.grad_dtype);
    // Bandwidths in the engine configuration (--config from zinf-nvmebench
    // --best) set the update's read and write depths, as zinf-train's do.
    oo.disk = {eng.config().read_gibps * GiB, eng.config().write_gibps * GiB};
    zero::Optimizer opt(m, c, eng, pool, oo);
    r.read_depth = opt.read_depth();
    r.write_depth = opt.write_depth();

    std::uint64_t most = 0;
    for (const auto& t : m.tensors) most = std::max(most, t.numel);
    std::vector<float> g(most);
    std::vector<double> secs;
    r.state = shard::tier_name(tier);
    for (unsigned s = 0; s <= o.steps; ++s) {
        check_stop();
        fill(g, 100 + s, 1e-2f);
        for (std::size_t t = 0; t < m.tensors.size(); ++t)
            opt.put_gradient(t, std::span<const float>(g).first(m.tensors[t].numel));
        const zero::StepReport rep = opt.step();
        log::info(std::string(shard::tier_name(tier)) + " step " + std::to_string(s + 1) + "/" +
                  std::to_string(o.steps + 1) + (s ? "" : " (warm-up)") + ": " + std::to_string(rep.seconds) + " s");
        if (!s) continue;
        secs.push_back(rep.seconds);
        r.update_seconds += rep.update_seconds / o.steps;
        r.wait_seconds += rep.wait_seconds / o.steps;
        r.commit_seconds += rep.commit_seconds / o.steps;
        r.bytes_read = rep.bytes_read;
        r.bytes_written = rep.bytes_written;
        r.chunk_bytes = rep.chunk_bytes;
    }
    r.seconds = median(secs);
    r.best = *std::min_element(secs.begin(), secs.end());
    // A kept folder holds whole states: what memory held goes to disk too.
    if (o.keep) opt.save();
    check_stop();
    if (tier != shard::Tier::nvme) return r;

    // The ideal: the same bytes read from the files the step reads, and
    // written to the files it writes next (free space until its commit).
    mem::Stream st(eng, pool, {.who = "optbench"});
    std::vector<std::string> reads, writes;
    for (const std::string& f : m.files()) {
        reads.push_back(f);
        writes.push_back(shard::other_generation(f));
    }
    std::uint64_t rb = 0, wb = 0;
    Timer tr;
    for (const std::string& f : reads) {
        io::File file = io::File::open(m.dir + "/" + f, {});
        st.read(file, 0, file.size(), [](std::uint64_t, std::span<const std::byte>) {});
        rb += file.size();
        check_stop();
    }
    const std::string grad = std::filesystem::path(m.files().front()).parent_path().string() + "/grad.bin";
    {
        io::File file = io::File::open(m.dir + "/" + grad, {});
        st.read(file, 0, file.size(), [](std::uint64_t, std::span<const std::byte>) {});
        rb += file.size();
    }
    const double read_s = tr.seconds();
    Timer tw;
    for (const std::string& f : writes) {
        io::File file = io::File::open(m.dir + "/" + f, {.access = io::Access::read_write});
        const std::uint64_t size = file.size();
        st.write(file, 0, size, [](std::uint64_t, std::span<std::byte>) {});
        eng.sync(file);
        wb += size;
        check_stop();
    }
    const double write_s = tw.seconds();
    r.read_gibps = static_cast<double>(rb) / GiB / read_s;
    r.write_gibps = static_cast<double>(wb) / GiB / write_s;
    r.io_seconds = static_cast<double>(r.bytes_read) / GiB / r.read_gibps +
                   static_cast<double>(r.bytes_written) / GiB / r.write_gibps;
    r.ideal_seconds = std::max(r.io_seconds, update_seconds);
    return r;
}

int run(const Options& o) {
    if (!o.model.empty() && o.params_given) throw UsageError("--params and --model exclude each other");
    const shard::ModelSpec spec = o.model.empty() ? shape_for(parse_count(o.params)) : shard::ModelSpec::parse(o.model);
    const std::uint64_t n = spec.parameters();
    optim::Kernel k;
    k.isa = o.isa == "auto" ? optim::default_isa() : optim::parse_isa(o.isa);
    if (!optim::isa_supported(k.isa)) throw UsageError(std::string("--isa ") + optim::isa_name(k.isa) + ": not on this CPU");
    check_thread_count(o.threads, "--threads");
    k.threads = o.threads;
    const unsigned threads = o.threads ? o.threads : bench::max_threads();
    const bool bf16_param = o.param_dtype == "bf16", bf16_grad = o.grad_dtype == "bf16";
    shard::parse_dtype(o.param_dtype);
    shard::parse_dtype(o.grad_dtype);

    // Everything that can be refused is, before minutes of timing.
    std::optional<io::Engine> eng;
    std::optional<mem::PinnedPool> pool;
    std::optional<Scratch> scratch;
    if (o.state != "update") {
        eng.emplace(o.engine.resolve());
        pool.emplace(o.pool.resolve(), &*eng);
        scratch.emplace(o.dir, o.keep);
    }

    log::info("memory bandwidth");
    const Bandwidth bw = memory_gibps(n, o.threads);
    check_stop();
    log::info("AdamW update of " + std::to_string(n) + " parameters in memory");
    const UpdateResult up = time_update(n, o, k, bf16_param, bf16_grad);
    check_stop();
    const double traffic = up.bytes_per_param * static_cast<double>(n) / GiB / up.seconds;

    std::vector<StepResult> steps;
    for (shard::Tier t : {shard::Tier::cpu, shard::Tier::nvme})
        if (o.state == "both" || o.state == shard::tier_name(t))
            steps.push_back(time_step(spec, t, scratch->path, o, k, *eng, *pool, up.seconds));

    json::Json base;
    base["schema"] = "zinf.optbench/1";
    base["params"] = n;
    base["model"] = spec.to_string();
    base["isa"] = optim::isa_name(k.isa);
    base["threads"] = threads;
    base["param_dtype"] = o.param_dtype;
    base["grad_dtype"] = o.grad_dtype;
    if (o.json) {
        json::Json u = base;
        u["kind"] = "update";
        u["state"] = "cpu";
        u["seconds"] = up.seconds;
        u["params_per_s"] = static_cast<double>(n) / up.seconds;
        u["bytes_per_param"] = static_cast<int>(up.bytes_per_param);
        u["traffic_gibps"] = traffic;
        u["xxh3_gibps"] = up.hash_bps / GiB;
        u["copy_gibps"] = bw.copy;
        u["streams_gibps"] = bw.streams;
        u["bound_fraction"] = traffic / bw.bound();
        std::fputs(json::line(u).c_str(), stdout);
        for (const StepResult& s : steps) {
            json::Json r = base;
            r["kind"] = "step";
            r["state"] = s.state;
            r["seconds"] = s.seconds;
            r["best_seconds"] = s.best;
            r["params_per_s"] = static_cast<double>(n) / s.seconds;
            r["update_seconds"] = s.update_seconds;
            r["wait_seconds"] = s.wait_seconds;
            r["commit_seconds"] = s.commit_seconds;
            r["bytes_read"] = s.bytes_read;
            r["bytes_written"] = s.bytes_written;
            if (s.state == "nvme") {
                r["chunk_bytes"] = s.chunk_bytes;
                r["read_depth"] = s.read_depth;
                r["write_depth"] = s.write_depth;
                r["read_gibps"] = s.read_gibps;
                r["write_gibps"] = s.write_gibps;
                r["io_seconds"] = s.io_seconds;
                r["ideal_seconds"] = s.ideal_seconds;
                r["ratio_to_ideal"] = s.seconds / s.ideal_seconds;
            }
            std::fputs(json::line(r).c_str(), stdout);
        }
    } else {
        std::printf("# zinf-optbench %s: %s = %llu parameters, isa %s, %u threads, %s params, %s grads\n", version(),
                    spec.to_string().c_str(), static_cast<unsigned long long>(n), optim::isa_name(k.isa), threads,
                    o.param_dtype.c_str(), o.grad_dtype.c_str());
        std::printf("# memory bandwidth (read + write): copy %.2f GiB/s, the update's streams %.2f GiB/s; the update "
                    "moves %.0f bytes per parameter\n",
                    bw.copy, bw.streams, up.bytes_per_param);
        std::printf("# %-6s %-5s %12s %10s %11s %8s  %s\n", "kind", "state", "params", "seconds", "Mparams/s", "GiB/s",
                    "note");
        std::printf("%-8s %-5s %12llu %10.4f %11.1f %8.2f  %.0f%% of the memory bound; xxh3 of the state %.2f GiB/s\n",
                    "update", "cpu", static_cast<unsigned long long>(n), up.seconds,
                    static_cast<double>(n) / up.seconds / 1e6, traffic, 100 * traffic / bw.bound(), up.hash_bps / GiB);
        for (const StepResult& s : steps) {
            std::printf("%-8s %-5s %12llu %10.4f %11.1f %8.2f", "step", s.state.c_str(),
                        static_cast<unsigned long long>(n), s.seconds, static_cast<double>(n) / s.seconds / 1e6,
                        s.state == "nvme" ? static_cast<double>(s.bytes_read + s.bytes_written) / GiB / s.seconds
                                          : up.bytes_per_param * static_cast<double>(n) / GiB / s.seconds);
            if (s.state == "nvme")
                std::printf("  ideal %.4f s = max(I/O %.4f at %.2f read, %.2f write GiB/s; update %.4f): x%.2f",
                            s.ideal_seconds, s.io_seconds, s.read_gibps, s.write_gibps, up.seconds,
                            s.seconds / s.ideal_seconds);
            std::printf("\n");
        }
    }
    flush_stdout();
    for (const StepResult& s : steps)
        if (o.max_ideal_ratio > 0 && s.state == "nvme" && s.seconds / s.ideal_seconds > o.max_ideal_ratio)
            throw ThresholdError("the NVMe step took " + std::to_string(s.seconds / s.ideal_seconds) +
                                 "x its ideal, above --max-ideal-ratio " + std::to_string(o.max_ideal_ratio));
    return exit_code::ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-optbench")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-optbench: the optimizer step, timed: the CPU AdamW update alone against the memory\n"
                 "bandwidth, then the tiered step with the state in CPU memory and on NVMe against its ideal."};
    app.name("zinf-optbench");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    auto* params = app.add_option("--params", o.params, "Parameters, as a GPT of about that size (50M, 1.5G)")
                       ->capture_default_str();
    app.add_option("--model", o.model, "A model spec or preset instead of --params (gpt2-124m)");
    app.add_option("--state", o.state, "Where the tiered step's state lives: cpu, nvme, both, or update (none)")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "nvme", "both", "update"}));
    app.add_option("--dir", o.dir, "Folder for the state (a scratch folder is made inside; default $TMPDIR or /var/tmp)");
    app.add_option("--steps", o.steps, "Timed steps after one warm-up (the median is reported)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 100000u));
    app.add_option("--threads", o.threads, "OpenMP threads (0: every core)")->capture_default_str();
    app.add_option("--isa", o.isa, "Instruction set: auto, portable, avx2, avx512")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "portable", "avx2", "avx512"}));
    app.add_option("--param-dtype", o.param_dtype, "Working parameters: fp32 (the master copy) or bf16")
        ->capture_default_str()
        ->check(CLI::IsMember({"fp32", "bf16"}));
    app.add_option("--grad-dtype", o.grad_dtype, "Gradients: fp32 or bf16")
        ->capture_default_str()
        ->check(CLI::IsMember({"fp32", "bf16"}));
    o.engine.add(app);
    o.pool.add(app);
    app.add_option("--max-ideal-ratio", o.max_ideal_ratio, "Exit 75 when the NVMe step takes more than this times its ideal");
    app.add_flag("--keep", o.keep, "Keep the scratch folder with the state");
    app.add_flag("--json", o.json, "JSON Lines (zinf.optbench/1) instead of the table");
    return cli::run(app, argc, argv, "zinf-optbench", common, [&] {
        o.params_given = params->count() > 0;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::signal(SIGHUP, on_signal);
        return run(o);
    });
}
