// zinf-shard: lays out a model's state over data-parallel ranks and tiers,
// writes it to disk partition by partition, verifies, gathers and reshards
// it. Manifests (JSON Lines) go from one subcommand to the next through pipes.
// See man/zinf-shard.1 and man/zinf-manifest.5.
#include "inspect.hpp"

#include <zinf/options.hpp>
#include <zinf/shard.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <unistd.h>

using namespace zinf;
using namespace zinf::shard;

namespace {

struct Options {
    // layout
    std::string model;
    unsigned dp = 1, tile = 1;
    std::string param_dtype = "bf16", param_tier = "nvme", optim_tier = "nvme";
    bool inference = false;
    std::string align = "4KiB";
    std::uint64_t seed = 0x5eed;
    // readers
    std::string manifest = "-";
    std::string data_dir;
    // writers
    std::string dir;
    std::vector<std::string> rank_dir;  // node-local rank folders: "/local/nvme/run/rank%r", or one per rank
    bool force = false;
    bool allow_nonfinite = false;  // import
    std::string stats;  // a JSON record of the run, for scripts
    unsigned jobs = 0;
    std::string ranks = "all";
    // inspect, cat
    bool json = false;
    std::vector<std::string> tensors, states;  // cat: one of each; cat --sums: any number (none: all)
    bool sums = false;
    // import, export
    std::string from, to, format;
    std::string shard_size, export_dtype;  // export of a Llama: shards into a folder, the elements' type
    cli::EngineOptions engine;
    cli::PoolOptions pool;
    cli::CommOptions comm;  // init under mpirun / srun
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// The manifest on stdout, checked: a full disk or a closed pipe is an error,
// not a silent success.
void emit(const Manifest& m) {
    write_manifest(std::cout, m);
    std::cout.flush();
    if (!std::cout) throw IoError("writing the manifest to stdout failed", {errno, "<stdout>", {}, -1});
}

Manifest read_input(const Options& o) { return read_manifest_input(o.manifest); }

std::string source_of(const Options& o) { return o.manifest == "-" ? "<stdin>" : o.manifest; }

// The state a reader of a data directory reads (verify, cat, export,
// reshard's source): what the directory commits (committed_state), the
// directory --data-dir's when given, refused when it was copied or moved.
Manifest read_state(const Options& o, bool follow) {
    return committed_state(read_input(o), source_of(o), follow, o.data_dir);
}

std::vector<unsigned> parse_ranks(const std::string& text, unsigned dp) {
    if (text == "all") return {};
    std::vector<unsigned> out;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t comma = text.find(',', start);
        std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        // Digits only, each number read whole: sscanf's %u took "-1" as
        // 4294967295 and wrapped 99999999999999999999 to a rank it named.
        const auto number = [&](std::string_view digits) {
            std::uint64_t v = 0;
            const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
            if (digits.empty() || ec == std::errc::invalid_argument || end != digits.data() + digits.size())
                throw UsageError("--ranks '" + text + "': expected all, or ranks like 0,2-3");
            if (ec == std::errc::result_out_of_range || v >= dp)
                throw UsageError("--ranks: rank " + std::string(digits) + " is not below dp " + std::to_string(dp));
            return static_cast<unsigned>(v);
        };
        const std::size_t dash = item.find('-');
        const unsigned a = number(std::string_view(item).substr(0, dash));
        const unsigned b = dash == std::string::npos ? a : number(std::string_view(item).substr(dash + 1));
        if (b < a) throw UsageError("--ranks '" + text + "': expected all, or ranks like 0,2-3");
        for (unsigned r = a; r <= b; ++r) out.push_back(r);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

// Progress on stderr, drawn only on a terminal.
struct Meter {
    Progress bar;
    Meter(std::string label, std::uint64_t total) : bar(std::move(label), total) {}
    std::function<void(std::uint64_t)> fn() {
        return [this](std::uint64_t n) { bar.advance(n); };
    }
};

// The closing line on stderr and, with --stats FILE, the same as a JSON
// record (zinf.shard-stats/1) for scripts.
void summary(const Options& o, const std::string& op, const std::string& what, std::uint64_t bytes, double seconds,
             const mem::PinnedPool& pool) {
    const double gibps = static_cast<double>(bytes) / GiB / std::max(seconds, 1e-9);
    char line[256];
    std::snprintf(line, sizeof line, "%s %s in %.3f s (%.3f GiB/s), peak resident %s", what.c_str(),
                  format_size(bytes).c_str(), seconds, gibps, format_size(peak_resident_bytes()).c_str());
    log::info(line);
    if (o.stats.empty()) return;
    json::Json j = {{"schema", "zinf.shard-stats/1"}, {"op", op},          {"bytes", bytes},
                    {"seconds", seconds},             {"gibps", gibps},    {"peak_resident_bytes", peak_resident_bytes()},
                    {"pool", pool.stats().to_json()}};
    const std::string text = json::line(j);
    const std::span<const std::byte> piece = std::as_bytes(std::span(text));
    write_file_atomic(o.stats, {&piece, 1});
}

// Writers, once every file is complete: commit the new state over the old
// (shard::commit), then report and print it.
void commit(const Options& o, const std::string& op, const std::string& what, Written& w, const Manifest& m,
            const Timer& t, const mem::PinnedPool& pool) {
    shard::commit(w, m);
    summary(o, op, what, m.total_bytes(), t.seconds(), pool);
    emit(m);
}

// Where a writer puts each rank's files: --rank-dir's folders (node-local
// disks), else beneath --dir. An input manifest's own rank_dirs are never
// reused: writing there would overwrite the state it describes.
void set_rank_dirs(const Options& o, Manifest& m) {
    if (!o.rank_dir.empty()) {
        m.rank_dirs = expand_rank_dirs(o.rank_dir, m.opts.dp);
        return;
    }
    if (!m.rank_dirs.empty())
        log::info("the input manifest's rank folders (rank_dirs, from " + m.rank_dirs.front() +
                  ") are not reused; every rank's files go beneath " + o.dir + " (--rank-dir places them)");
    m.rank_dirs.clear();
}

// The worker threads and the stop flag every subcommand's run takes.
RunOptions run_options(const Options& o) {
    RunOptions ro;
    ro.jobs = o.jobs;
    ro.stop = &g_stop;
    ro.force = o.force;
    return ro;
}

// A subcommand that writes every rank itself refuses to run once per process.
void runs_once(const char* what) {
    if (const auto launch = comm::Launch::from_env(); launch.size > 1)
        throw UsageError(std::string(what) + " runs once, not under " + launch.launcher + " (" +
                         std::to_string(launch.size) + " processes would each write every rank)");
}

int do_layout(const Options& o) {
    LayoutOptions lo;
    lo.dp = o.dp;
    lo.tile = o.tile;
    lo.param_dtype = parse_dtype(o.param_dtype);
    lo.param_tier = parse_tier(o.param_tier);
    lo.optim_tier = parse_tier(o.optim_tier);
    lo.train = !o.inference;
    lo.alignment = cli::parse_sizes({o.align}, "--align")[0];
    lo.seed = o.seed;
    Manifest m = layout(ModelSpec::parse(o.model), lo);
    emit(m);
    return 0;
}

// Under mpirun or srun: process p of N writes the dp ranks r with r % N == p
// (shard::init_ranks); process 0 reads the manifest and prints it committed.
int do_init_ranks(const Options& o, const comm::Launch& launch) {
    if (!o.stats.empty())
        throw UsageError("--stats: not under " + launch.launcher + " (each process does a share; time the job instead)");
    if (o.ranks != "all")
        throw UsageError("--ranks " + o.ranks + ": under " + launch.launcher +
                         " each process writes the ranks r with r % " + std::to_string(launch.size) +
                         " == its own rank; leave --ranks out");
    comm::Communicator c(o.comm.resolve());
    DistributedInit di;
    di.engine = [&] { return o.engine.resolve(); };
    di.pool = [&] { return o.pool.resolve(); };
    di.run = run_options(o);
    di.limit_write_wait = !o.comm.timeout.empty();
    const DistributedResult r = init_ranks(
        c,
        [&] {
            Manifest m = read_input(o);
            check_target(o.dir, o.force);
            set_rank_dirs(o, m);
            return m;
        },
        o.dir, di);
    if (c.rank() != 0) return 0;
    const Manifest& m = r.manifest;
    char line[160];
    std::snprintf(line, sizeof line, "wrote %s with %u processes in %.3f s (%.3f GiB/s)",
                  format_size(m.total_bytes()).c_str(), static_cast<unsigned>(c.size()), r.write_seconds,
                  static_cast<double>(m.total_bytes()) / GiB / std::max(r.write_seconds, 1e-9));
    log::info(line);
    emit(m);
    return 0;
}

int do_init(const Options& o) {
    const comm::Launch launch = comm::Launch::from_env();
    if (launch.size > 1) return do_init_ranks(o, launch);
    Manifest m = read_input(o);
    if (m.initialised() && !m.dir.empty())
        log::info("the manifest was initialised before (in " + m.dir + "); writing it afresh into " + o.dir);
    check_target(o.dir, o.force);
    set_rank_dirs(o, m);
    RunOptions ro = run_options(o);
    if (o.ranks != "all")
        throw UsageError("--ranks " + o.ranks + ": init writes every rank, in one process or, under mpirun or srun, "
                         "spread over the processes (--ranks all)");
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    Timer t;
    Written w;
    {
        Meter meter("init", m.total_bytes());
        ro.progress = meter.fn();
        w = init(m, o.dir, engine, pool, ro);
    }
    commit(o, "init", "wrote", w, m, t, pool);
    return 0;
}

int do_verify(const Options& o) {
    const Manifest given = read_input(o);  // once: it may be a pipe
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    Timer t;
    // --data-dir D whose committed manifest names another folder: D was
    // copied or moved there; verified, it is adopted where it lies.
    if (!o.data_dir.empty()) {
        RunOptions ro = run_options(o);
        ro.ranks = parse_ranks(o.ranks, given.opts.dp);  // adopt() refuses a part
        std::optional<Manifest> adopted;
        {
            Meter meter("verify", given.total_bytes());
            ro.progress = meter.fn();
            adopted = adopt(o.data_dir, engine, pool, ro);
        }
        if (adopted) {
            summary(o, "verify", "adopted " + o.data_dir + ": verified " + std::to_string(adopted->parts.size()) +
                                     " partitions,",
                    adopted->total_bytes(), t.seconds(), pool);
            emit(*adopted);
            return 0;
        }
    }
    Manifest m = committed_state(given, source_of(o), false, o.data_dir);
    RunOptions ro = run_options(o);
    ro.ranks = parse_ranks(o.ranks, m.opts.dp);
    VerifyResult r;
    {
        std::uint64_t total = 0;  // of the ranks checked
        for (const auto& p : m.parts)
            if (ro.ranks.empty() || std::find(ro.ranks.begin(), ro.ranks.end(), p.rank) != ro.ranks.end())
                total += p.bytes;
        Meter meter("verify", total);
        ro.progress = meter.fn();
        r = verify(m, engine, pool, ro);
    }
    summary(o, "verify", "verified " + std::to_string(r.partitions) + " partitions,", r.bytes, t.seconds(), pool);
    emit(m);
    return 0;
}

int do_inspect(const Options& o) {
    Manifest m = read_input(o);
    if (!o.data_dir.empty()) m.dir = o.data_dir;
    if (o.json) std::cout << json::line(inspect_json(m));
    else print_inspect(std::cout, m);
    std::cout.flush();
    if (!std::cout) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
    return 0;
}

// cat: one tensor's state, raw on stdout. cat --sums: a line per tensor and
// state, "NAME STATE BYTES XXH3", of the same gathered bytes (whatever the
// split: two directories hold the same values when their lines agree).
int do_cat(const Options& o) {
    Manifest m = read_state(o, false);
    if (!o.sums) {
        if (o.tensors.size() != 1)
            throw UsageError("cat writes one tensor: give one --tensor (--sums takes any number, or none for all)");
        if (o.states.size() > 1) throw UsageError("cat writes one state: give one --state (--sums takes any number)");
        if (::isatty(1)) throw UsageError("cat writes raw bytes: redirect stdout to a file or a pipe");
    }
    std::vector<std::size_t> tensors;
    for (const auto& name : o.tensors) try {
            tensors.push_back(m.find_tensor(name));
        } catch (const DataError& e) {  // a misspelt --tensor is the command line's fault
            throw UsageError("--tensor: " + e.message());
        }
    if (tensors.empty())
        for (std::size_t t = 0; t < m.tensors.size(); ++t) tensors.push_back(t);
    const std::vector<std::string> states =
        !o.states.empty() ? o.states : o.sums ? m.states : std::vector<std::string>{"param"};
    for (const auto& s : states)
        if (std::find(m.states.begin(), m.states.end(), s) == m.states.end())
            throw UsageError("--state: '" + s + "' is not in this manifest (" + json::Json(m.states).dump() + ")");
    const Lock lock = lock_state(m, LockMode::shared);  // no writer beside
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    const auto out = [](const void* data, std::size_t n) {
        if (std::fwrite(data, 1, n, stdout) != n) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
    };
    for (const std::size_t t : tensors)
        for (const auto& state : states) {
            if (!o.sums) {
                cat(m, t, state, engine, pool, [&](std::span<const std::byte> piece) { out(piece.data(), piece.size()); });
                continue;
            }
            Xxh3Stream hash;
            std::uint64_t bytes = 0;
            cat(m, t, state, engine, pool, [&](std::span<const std::byte> piece) {
                hash.update(piece);
                bytes += piece.size();
            });
            const std::string line = m.tensors[t].name + " " + state + " " + std::to_string(bytes) + " " +
                                     hex64(hash.digest()) + "\n";
            out(line.data(), line.size());
        }
    if (std::fflush(stdout) != 0) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
    return 0;
}

// Weights from another program's file into every partition of the manifest,
// written and committed as init does.
int do_import(const Options& o) {
    runs_once("import");
    Manifest m = read_input(o);
    if (!o.format.empty() && parse_weight_format(o.format) != detect_weight_format(o.from))
        throw DataError(o.from + " is not a " + o.format + " file (" +
                        weight_format_name(detect_weight_format(o.from)) + " by its first bytes)");
    check_target(o.dir, o.force);
    set_rank_dirs(o, m);
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    RunOptions ro = run_options(o);
    ro.allow_nonfinite = o.allow_nonfinite;
    Timer t;
    Written w;
    {
        Meter meter("import", m.total_bytes());
        ro.progress = meter.fn();
        w = import_weights(m, o.from, o.dir, engine, pool, ro);
    }
    commit(o, "import", "imported " + o.from + ":", w, m, t, pool);
    return 0;
}

// The committed weights into another program's file; nothing on stdout.
int do_export(const Options& o) {
    // What the directory commits, whichever manifest names it (a stale copy
    // would export the weights of its step).
    const Manifest m = read_state(o, true);
    if (std::filesystem::exists(o.to) && !o.force)
        throw CreateError(o.to + " exists; give --force to replace it (it stays intact until the new file is complete)");
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    RunOptions ro = run_options(o);
    if (!o.shard_size.empty()) {
        ro.shard_bytes = cli::parse_sizes({o.shard_size}, "--shard-size")[0];
        if (!ro.shard_bytes) throw UsageError("--shard-size must be positive");
    }
    if (!o.export_dtype.empty()) ro.dtype = parse_dtype(o.export_dtype);
    Timer t;
    const auto r = export_weights(m, o.to, parse_weight_format(o.format.empty() ? "safetensors" : o.format), engine,
                                  pool, ro);
    const std::string where = r.files.size() > 1 ? o.to + " (" + std::to_string(r.files.size() - 1) +
                                                       " shards and model.safetensors.index.json)"
                                                 : r.files.empty() ? o.to : r.files[0];
    summary(o, "export", "exported the " + r.state + " state of " + std::to_string(r.tensors) + " tensors to " + where + ":",
            r.bytes, t.seconds(), pool);
    return 0;
}

int do_reshard(const Options& o) {
    runs_once("reshard");
    Manifest m = read_state(o, false);
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!m.dir.empty() && fs::exists(o.dir) && fs::equivalent(m.dir, o.dir, ec))
        throw UsageError("reshard writes a new directory; " + o.dir + " is the source");
    check_target(o.dir, o.force);
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);
    RunOptions ro = run_options(o);
    if (!o.rank_dir.empty()) ro.rank_dirs = expand_rank_dirs(o.rank_dir, o.dp);
    Timer t;
    Written w;
    Manifest n;
    {
        LayoutOptions to = m.opts;  // the new layout's size, for the bar (no I/O)
        to.dp = o.dp;
        Meter meter("reshard", layout(m.spec, to).total_bytes());
        ro.progress = meter.fn();
        n = reshard(m, o.dp, o.dir, engine, pool, ro, w);
    }
    commit(o, "reshard", "resharded", w, n, t, pool);
    return 0;
}

// The options a subcommand that reads a manifest takes.
void add_reader(CLI::App* s, Options& o, bool data_dir = true) {
    s->add_option("-m,--manifest", o.manifest, "Manifest to read ('-': stdin)")->capture_default_str();
    if (data_dir) s->add_option("--data-dir", o.data_dir, "Data directory, instead of the one the manifest's header names");
}

// The options of a subcommand that streams through the io engine and the pool.
void add_io(CLI::App* s, Options& o, bool stats = true) {
    o.engine.add(*s);
    o.pool.add(*s);
    s->add_option("-j,--jobs", o.jobs, "Worker threads (default: one per CPU, at most 8)");
    if (stats) s->add_option("--stats", o.stats, "Write a JSON record of the run (zinf.shard-stats/1) to this file");
}

// The options of a subcommand that writes a data directory.
void add_target(CLI::App* s, Options& o, const char* dir_help) {
    s->add_option("--dir", o.dir, dir_help)->required();
    s->add_flag("--force", o.force, "Replace a directory that already holds a manifest");
    s->add_option("--rank-dir", o.rank_dir,
                  "Each rank's own folder (node-local disks): one with %r for the rank, e.g. "
                  "/local/nvme/run/rank%r, or the option once per rank; default: DIR/rank<r>")
        ->take_all();
}

CLI::App* add_layout(CLI::App& app, Options& o) {
    auto* lay = app.add_subcommand("layout", "Model spec -> manifest on stdout (no I/O)");
    lay->add_option("--model", o.model, "gpt:layers=L,hidden=C,heads=H[,vocab=V,seq=T] or a preset "
                                        "(gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-13b, paper-*)")
        ->required();
    lay->add_option("--dp", o.dp, "Data-parallel ranks every tensor is split over")->check(CLI::Range(1u, 1u << 20))
        ->capture_default_str();
    lay->add_option("--tile", o.tile, "Split every linear weight into K tiles (memory-centric tiling)")
        ->check(CLI::Range(1u, 1u << 24))->capture_default_str();
    lay->add_option("--param-dtype", o.param_dtype, "Working parameters: bf16 or fp32")
        ->check(CLI::IsMember({"bf16", "fp32"}))->capture_default_str();
    lay->add_option("--param", o.param_tier, "Tier of the parameters: gpu, cpu, nvme")
        ->check(CLI::IsMember({"gpu", "cpu", "nvme"}))->capture_default_str();
    lay->add_option("--optim", o.optim_tier, "Tier of the optimizer state (and gradients): gpu, cpu, nvme")
        ->check(CLI::IsMember({"gpu", "cpu", "nvme"}))->capture_default_str();
    lay->add_flag("--inference", o.inference, "Parameters only: no master weights, no AdamW moments");
    lay->add_option("--align", o.align, "Partition offset alignment (the largest direct-I/O alignment to serve)")
        ->capture_default_str();
    lay->add_option("--seed", o.seed, "Seed of the initial values")->capture_default_str();
    return lay;
}

CLI::App* add_init(CLI::App& app, Options& o) {
    auto* ini = app.add_subcommand("init", "Manifest -> every partition written into --dir; the manifest, with xxh3s, on stdout");
    add_reader(ini, o, false);  // init's directory is --dir
    add_target(ini, o, "Data directory (created); its manifest.jsonl is written last");
    ini->add_option("--ranks", o.ranks,
                    "Ranks to write: all (in one process; under mpirun or srun, each process its own share)")
        ->capture_default_str();
    add_io(ini, o);
    o.comm.add(*ini);
    return ini;
}

CLI::App* add_verify(CLI::App& app, Options& o) {
    auto* ver = app.add_subcommand("verify", "Recompute every partition's xxh3; the manifest passes through to stdout");
    add_reader(ver, o);
    ver->add_option("--ranks", o.ranks, "Ranks to check: all, or a list like 0,2-3")->capture_default_str();
    add_io(ver, o);
    return ver;
}

CLI::App* add_inspect(CLI::App& app, Options& o) {
    auto* ins = app.add_subcommand("inspect", "Tensors, shapes, bytes per rank and tier, totals per tier");
    add_reader(ins, o);
    ins->add_flag("--json", o.json, "One JSON record (zinf.shard-inspect/1) instead of the table");
    return ins;
}

CLI::App* add_cat(CLI::App& app, Options& o) {
    auto* ct = app.add_subcommand("cat", "One tensor gathered from all its partitions, raw little-endian on stdout");
    add_reader(ct, o);
    ct->add_option("--tensor", o.tensors, "Tensor name, e.g. h.0.attn.c_attn.weight (with --sums: any number; none: all)")
        ->take_all();
    ct->add_option("--state", o.states, "param (default), master, exp_avg or exp_avg_sq (with --sums: any number; none: all)")
        ->take_all();
    ct->add_flag("--sums", o.sums,
                 "Instead of the bytes, a line per tensor and state: NAME STATE BYTES XXH3 of the gathered values");
    add_io(ct, o, false);
    return ct;
}

CLI::App* add_reshard(CLI::App& app, Options& o) {
    auto* rs = app.add_subcommand("reshard", "Rewrite the partitions for a new dp degree into --dir; new manifest on stdout");
    add_reader(rs, o);
    rs->add_option("--dp", o.dp, "The new data-parallel degree")->required()->check(CLI::Range(1u, 1u << 20));
    add_target(rs, o, "New data directory (not the source)");
    add_io(rs, o);
    return rs;
}

CLI::App* add_import(CLI::App& app, Options& o) {
    auto* imp = app.add_subcommand("import", "Manifest + weights file -> every param and master partition written into "
                                             "--dir, moments zero; the manifest on stdout");
    add_reader(imp, o, false);
    imp->add_option("--from", o.from,
                    "safetensors (Hugging Face GPT-2 names) or llm.c checkpoint (gpt2_124M.bin); for a Llama-family "
                    "model a Hugging Face checkpoint: model.safetensors, model.safetensors.index.json or their folder")
        ->required();
    imp->add_option("--format", o.format, "safetensors or llmc (default: from the file's first bytes)")
        ->check(CLI::IsMember({"safetensors", "llmc"}));
    add_target(imp, o, "Data directory (created); its manifest.jsonl is written last");
    imp->add_flag("--allow-nonfinite", o.allow_nonfinite,
                  "Import weights that are NaN or infinite (or that bf16 would round to infinity); refused otherwise");
    add_io(imp, o);
    return imp;
}

CLI::App* add_export(CLI::App& app, Options& o) {
    auto* exp = app.add_subcommand("export", "The committed weights (master, else param) -> --to, complete or absent");
    add_reader(exp, o);
    exp->add_option("--to", o.to, "Output file, written under a temporary name and renamed")->required();
    exp->add_option("--format", o.format, "safetensors (GPT-2 names, the state's dtype) or llmc (version 3, fp32)")
        ->check(CLI::IsMember({"safetensors", "llmc"}))->default_str("safetensors");
    exp->add_flag("--force", o.force, "Replace an existing --to");
    exp->add_option("--shard-size", o.shard_size,
                    "Llama-family models: --to is a folder of safetensors shards of at most this size (5GiB, as "
                    "Hugging Face cuts them) with model.safetensors.index.json");
    exp->add_option("--dtype", o.export_dtype, "Llama-family models: the elements' type (default: the state's)")
        ->check(CLI::IsMember({"bf16", "fp32"}));
    add_io(exp, o);
    return exp;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-shard")) return rc;  // first: before anything is opened
    // CLI11 reports a misspelt subcommand only as "a subcommand is required".
    static const std::set<std::string> kSubcommands = {"layout", "init",    "verify", "inspect",
                                                       "cat",    "reshard", "import", "export"};
    if (argc > 1 && argv[1][0] != '-' && !kSubcommands.count(argv[1])) {
        std::fprintf(stderr,
                     "zinf-shard: unknown subcommand '%s' (layout, init, verify, inspect, cat, reshard, import, export)\n",
                     argv[1]);
        return exit_code::usage;
    }
    Options o;
    CLI::App app{"zinf-shard: model state laid out over data-parallel ranks and tiers, on disk.\n"
                 "  zinf-shard layout --model gpt2-124m --dp 4 | zinf-shard init --dir D | zinf-shard verify\n"
                 "  zinf-shard layout --model gpt2-124m | zinf-shard import --from model.safetensors --dir D > M\n"
                 "  zinf-shard export -m M --to gpt2_124M.bin --format llmc"};
    cli::Common common;
    cli::add_common(app, common);
    app.require_subcommand(1);
    app.fallthrough();  // --quiet, --verbose after the subcommand too

    CLI::App* lay = add_layout(app, o);
    CLI::App* ini = add_init(app, o);
    CLI::App* ver = add_verify(app, o);
    CLI::App* ins = add_inspect(app, o);
    CLI::App* ct = add_cat(app, o);
    add_reshard(app, o);
    CLI::App* imp = add_import(app, o);
    CLI::App* exp = add_export(app, o);
    return cli::run(app, argc, argv, "zinf-shard", common, [&] {
        // Writers stop at the next piece, remove their temporaries, exit 130.
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::signal(SIGHUP, on_signal);
        watch_stop_flag(&g_stop);  // a signal before a FIFO's wait began still ends it
        if (lay->parsed()) return do_layout(o);
        if (ini->parsed()) return do_init(o);
        if (ver->parsed()) return do_verify(o);
        if (ins->parsed()) return do_inspect(o);
        if (ct->parsed()) return do_cat(o);
        if (imp->parsed()) return do_import(o);
        if (exp->parsed()) return do_export(o);
        return do_reshard(o);
    });
}
