// zinf-train: trains the GPT a manifest describes, from the state zinf-shard
// wrote, on llm.c token files or any text (byte-level), alone or under
// mpirun as plain data parallel. One line per step on stdout (JSON Lines
// with --json), progress on stderr, checkpoints committed by the manifest.
// See man/zinf-train.1.
#include "bench.hpp"
#include "profile.hpp"

#include <zinf/data.hpp>
#include <zinf/options.hpp>
#include <zinf/text.hpp>
#include <zinf/train.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <unistd.h>

using namespace zinf;

namespace {

struct Options {
    std::string manifest, data, text, val_data, val_text, tokenizer;
    double val_fraction = 0.1;
    std::uint64_t steps = 0, batch = 4, seq = 64;
    double lr = 3e-4, min_lr_ratio = 0.1, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double grad_clip = 1.0;
    std::uint64_t warmup = 0;
    std::string schedule = "cosine";
    std::uint64_t seed = 0;
    bool shuffle = false, no_checkpoint = false, resume = false, json = false, resident = false;
    bool no_persist_shared = false, no_overlap = false, profile = false;
    std::string disk_probe = "64MiB";
    std::string optimizer_readahead = "auto";
    std::string offload_activations = "none";
    std::string precision = "fp32";
    std::string checkpoint = "auto";  // --checkpoint; --no-checkpoint is "none"
    std::uint64_t eval_every = 0, eval_batches = 4, checkpoint_every = 0;
    unsigned threads = 0;
    cli::DeviceOptions device;
    cli::ZeroOptions zero;
    cli::EngineOptions engine;
    cli::PoolOptions pool;
    cli::CommOptions comm;
    trainer::BenchOptions bench;
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}
std::string sci(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3e", v);
    return buf;
}

void emit(const Options& o, const train::StepLog& s, std::uint64_t total, std::optional<double> val) {
    if (o.json) {
        json::Json j;
        j["schema"] = "zinf.train/1";
        j["step"] = s.step;
        j["loss"] = s.loss;
        j["lr"] = s.lr;
        j["grad_norm"] = std::isfinite(s.grad_norm) ? json::Json(s.grad_norm) : json::Json(nullptr);
        j["overflow"] = s.overflow;
        j["tokens"] = s.tokens;
        j["tokens_per_s"] = s.tokens_per_s;
        j["flops_per_s"] = s.flops_per_s;
        j["step_s"] = s.seconds;
        j["forward_s"] = s.forward_seconds;
        j["backward_s"] = s.backward_seconds;
        j["optimizer_s"] = s.optimizer_seconds;
        j["fetched_gpu_bytes"] = s.fetched_bytes[0];
        j["fetched_cpu_bytes"] = s.fetched_bytes[1];
        j["fetched_nvme_bytes"] = s.fetched_bytes[2];
        j["stall_seconds"] = s.stall_seconds;
        j["h2d_bytes"] = s.h2d_bytes;
        j["d2h_bytes"] = s.d2h_bytes;
        j["h2d_gbps"] = s.seconds > 0 ? static_cast<double>(s.h2d_bytes) / s.seconds / 1e9 : 0.0;
        j["d2h_gbps"] = s.seconds > 0 ? static_cast<double>(s.d2h_bytes) / s.seconds / 1e9 : 0.0;
        j["h2d_stall_s"] = s.stall_seconds;
        j["d2h_stall_s"] = s.d2h_stall_seconds;
        j["optimizer_host_s"] = s.optimizer_host_seconds;
        j["optimizer_hidden_s"] = s.optimizer_hidden_seconds;
        j["collectives"] = s.collectives;
        j["device_peak_bytes"] = s.device_peak_bytes;
        j["peak_rss_bytes"] = s.peak_rss_bytes;
        if (s.trace_diverged) j["trace_diverged"] = true;
        j["optimizer_redo"] = s.optimizer_redo;
        j["optimizer_speculated"] = s.optimizer_speculated;
        j["optimizer_overlap_s"] = s.optimizer_overlap_seconds;
        j["optimizer_read_bytes"] = s.optimizer_read_bytes;
        j["optimizer_written_bytes"] = s.optimizer_written_bytes;
        j["optimizer_update_s"] = s.optimizer_update_seconds;
        j["optimizer_wait_s"] = s.optimizer_wait_seconds;
        j["optimizer_commit_s"] = s.optimizer_commit_seconds;
        j["optimizer_readahead_bytes"] = s.optimizer_readahead_bytes;
        j["optimizer_readahead_used_bytes"] = s.optimizer_readahead_used_bytes;
        j["disk_read_bytes"] = s.disk_read_bytes;
        j["disk_written_bytes"] = s.disk_written_bytes;
        j["grad_scratch_read_bytes"] = s.grad_scratch_read_bytes;
        j["grad_scratch_written_bytes"] = s.grad_scratch_written_bytes;
        j["grad_scratch_memory_bytes"] = s.grad_scratch_memory_bytes;
        j["activation_read_bytes"] = s.activation_read_bytes;
        j["activation_written_bytes"] = s.activation_written_bytes;
        // The floor only where a bandwidth is known (a run with state on NVMe).
        if (s.disk_read_bps > 0) {
            j["disk_read_gbps"] = s.disk_read_bps / 1e9;
            j["disk_write_gbps"] = s.disk_write_bps / 1e9;
            j["disk_floor_s"] = s.disk_floor_seconds;
            j["disk_floor_ratio"] = s.disk_floor_ratio;
        }
        j["compute_floor_s"] = s.compute_floor_seconds;
        j["step_floor_ratio"] = s.step_floor_ratio;
        j["update_overlap_s"] = s.update_overlap_seconds;
        j["update_waited_s"] = s.update_waited_seconds;
        j["update_under_backward"] = s.update_under_backward;
        if (val) j["val_loss"] = *val;
        std::cout << j.dump() << '\n';
        // The JSON goes to a file or a pipe; a person at the terminal sees the
        // step count on stderr, redrawn in place.
        if (::isatty(2) && log::level() >= LogLevel::info) {
            std::lock_guard lock(log::stderr_mutex());
            std::fprintf(stderr, "\rzinf-train: step %llu/%llu  loss %.4f%s", static_cast<unsigned long long>(s.step),
                         static_cast<unsigned long long>(total), s.loss, s.step == total ? "\n" : "");
            std::fflush(stderr);
        }
    } else {
        std::string line = "step " + std::to_string(s.step) + "/" + std::to_string(total) + "  loss " +
                           fixed(s.loss, 4) + "  lr " + sci(s.lr) + "  norm " + fixed(s.grad_norm, 4) + "  " +
                           fixed(s.tokens_per_s, 0) + " tok/s  " + fixed(s.flops_per_s / 1e9, 2) + " GFLOP/s  fwd " +
                           fixed(s.forward_seconds, 3) + " bwd " + fixed(s.backward_seconds, 3) + " opt " +
                           fixed(s.optimizer_seconds, 3) + " s  fetched " +
                           format_size(s.fetched_bytes[0] + s.fetched_bytes[1] + s.fetched_bytes[2]) + " stall " +
                           fixed(s.stall_seconds, 3) + " s  device " + format_size(s.device_peak_bytes) + " rss " +
                           format_size(s.peak_rss_bytes);
        if (s.disk_floor_seconds > 0)
            line += "  disk " + format_size(s.disk_read_bytes) + " in " + format_size(s.disk_written_bytes) +
                    " out, floor " + fixed(s.disk_floor_seconds, 3) + " s (x" + fixed(s.disk_floor_ratio, 2) + ")";
        if (s.step_floor_ratio > 0)
            line += "  compute floor " + fixed(s.compute_floor_seconds, 3) + " s, step x" + fixed(s.step_floor_ratio, 2) +
                    " of the larger";
        if (s.update_overlap_seconds > 0) line += ", update " + fixed(s.update_overlap_seconds, 3) + " s under the next";
        if (s.overflow) line += "  (overflow: skipped)";
        if (s.optimizer_redo) line += "  (optimizer redone: clipped)";
        if (val) line += "  val " + fixed(*val, 4);
        std::cout << line << '\n';
    }
    std::cout.flush();
    if (!std::cout) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
}

// The token streams: the training file, and held-out data from its own file
// or the last --val-fraction of the training tokens.
struct Data {
    std::optional<data::Tokens> train_file, val_file;
    data::TokenSpan train, val;
    std::string train_source, val_source;
};

// A text through --tokenizer: its token file beside it, made by rank 0 the
// first time (every rank waits) and reused while the tokenizer and the text
// stay the same (text::cached_token_file).
std::string tokenized(const std::string& text_path, const text::Tokenizer& t, comm::Communicator& comm,
                      unsigned cores) {
    text::TokenizeOptions how;
    how.separator = t.end_of_text();
    how.threads = cores;
    std::string path;
    std::exception_ptr failed;
    if (comm.rank() == 0) {
        try {
            const text::Cached c = text::cached_token_file(t, text_path, how);
            if (c.made)
                log::info("tokenized " + text_path + " with " + t.path() + " into " + c.path + " (" +
                          std::to_string(c.summary.tokens) + " tokens in " + fixed(c.summary.seconds, 2) + " s)");
            else
                log::info("reusing " + c.path + ", the tokens " + t.path() + " made of " + text_path);
            path = c.path;
        } catch (...) {
            failed = std::current_exception();
        }
    }
    comm::agree(comm, failed, "nothing was trained");
    return comm.rank() == 0 ? path : text::cache_path(t, text_path, how);
}

Data load_data(const Options& o, std::uint64_t vocab, comm::Communicator& comm, unsigned cores) {
    Data d;
    if (!o.data.empty() == !o.text.empty()) throw UsageError("give one of --data FILE (llm.c tokens) or --text FILE");
    if (!o.val_data.empty() && !o.val_text.empty()) throw UsageError("--val-data and --val-text exclude each other");
    std::unique_ptr<text::Tokenizer> tok;
    if (!o.tokenizer.empty()) {
        if (o.text.empty() && o.val_text.empty()) throw UsageError("--tokenizer is for --text (and --val-text)");
        tok = text::open(o.tokenizer);
        tok->check_model(vocab);
    }
    // Text: one token per byte, or through the tokenizer.
    auto text_tokens = [&](const std::string& path) {
        return tok ? data::Tokens::open(tokenized(path, *tok, comm, cores)) : data::Tokens::text(path);
    };
    d.train_file = o.data.empty() ? text_tokens(o.text) : data::Tokens::open(o.data);
    data::check_vocab(*d.train_file, vocab);
    d.train_source = d.train_file->path();
    if (!o.val_data.empty() || !o.val_text.empty()) {
        d.val_file = o.val_data.empty() ? text_tokens(o.val_text) : data::Tokens::open(o.val_data);
        data::check_vocab(*d.val_file, vocab);
        d.train = d.train_file->tokens();
        d.val = d.val_file->tokens();
        d.val_source = d.val_file->path();
    } else {
        std::tie(d.train, d.val) = data::split(d.train_file->tokens(), o.val_fraction);
        d.val_source = d.train_source + " (last " + fixed(o.val_fraction * 100, 0) + "%)";
    }
    return d;
}

// --checkpoint, or --no-checkpoint (its "none" of old).
train::Checkpointing checkpointing(const Options& o) {
    return o.no_checkpoint ? train::Checkpointing::none : train::parse_checkpointing(o.checkpoint);
}

// The trainer's options from the command line's; commits go to `committed`.
train::Options train_options(const Options& o, const std::string& committed, unsigned cores) {
    train::Options to;
    to.batch = o.batch;
    to.seq = o.seq;
    to.checkpoint = checkpointing(o);
    to.schedule = {.lr = o.lr, .min_ratio = o.min_lr_ratio, .warmup = o.warmup, .total = o.steps,
                   .cosine = o.schedule == "cosine"};
    to.adamw = {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
    to.adamw.validate();
    to.grad_clip = o.grad_clip;
    to.manifest_path = committed;
    to.kernel.threads = cores;
    to.resident = o.resident;
    to.overlap = !o.no_overlap;
    to.pipeline = !o.no_overlap;  // the next step beside this one's update (not with --resident)
    to.optimizer_readahead = o.optimizer_readahead == "auto" ? zero::OptimizerOptions::kReadaheadAuto
                                                             : cli::parse_sizes({o.optimizer_readahead}, "--optimizer-readahead")[0];
    to.offload_activations = model::parse_offload(o.offload_activations);
    to.precision = device::parse_precision(o.precision);
    to.attention = o.device.flash_attention() ? model::Attention::flash : model::Attention::gemm;
    to.infinity = o.zero.resolve().infinity;
    to.infinity.persist_shared = !o.no_persist_shared;
    to.gpu = o.device.gpu;
    // zinf-nvmebench --best's figures, when --config brought them.
    const io::EngineConfig ec = o.engine.resolve();
    to.disk = {ec.read_gibps * static_cast<double>(GiB), ec.write_gibps * static_cast<double>(GiB)};
    to.disk_probe_bytes = parse_size(o.disk_probe);
    return to;
}

// Rank 0's account of the run before its first step: the checkpoint, the
// communicator, the model and batch, the engine and its budget, the data;
// then the table's header line.
void describe_run(const Options& o, const shard::Committed& checkpoint, const comm::Communicator& comm,
                  train::Trainer& t, const train::Options& to, device::Device& dev, const Data& d, std::uint64_t at) {
    const shard::Manifest& m = checkpoint.manifest;
    const std::string& committed = checkpoint.path;
    const unsigned ranks = static_cast<unsigned>(comm.size());
    if (!checkpoint.copy_of.empty())
        log::info("the checkpoint is " + committed + " (" + checkpoint.copy_of +
                  " is a copy): reading and committing it");
    log::info(comm.describe());
    log::info(m.spec.to_string() + ": " + std::to_string(t.model().params_table().numel()) + " parameters, batch " +
              std::to_string(o.batch) + " x " + std::to_string(o.seq) + " x " + std::to_string(ranks) +
              " ranks, " + std::to_string(dev.threads()) + " threads per rank, " +
              device::precision_name(to.precision) + " GEMM inputs" +
              (to.attention == model::Attention::flash ? ", flash attention" : "") + "; activations " +
              format_size(t.activations().bytes) + " (" +
              (t.checkpointing().recompute ? "checkpointed" : "every block's kept") + ", " + t.checkpointing().why +
              ")");
    if (o.resident)
        log::info("engine: resident (every parameter on every rank's device, the reference)");
    else
        log::info("engine: ZeRO-Infinity, parameters on " + std::string(shard::tier_name(m.opts.param_tier)) +
                  " and optimizer state on " + shard::tier_name(m.opts.optim_tier) + "; prefetch " +
                  format_size(to.infinity.prefetch_bytes) + ", persistent below " +
                  std::to_string(to.infinity.persist_below) + " elements" +
                  (o.no_persist_shared ? "" : " and the tied embedding") + "; optimizer " +
                  (o.no_overlap ? "after backward" : "overlapped with backward") + "; activation checkpoints on " +
                  (o.offload_activations == "none" ? "the device" : o.offload_activations) +
                  "; the run needs a device budget of " +
                  format_size(t.device_need()) + " of " + format_size(dev.arena().stats().bytes));
    log::info("training on " + d.train_source + " (" + std::to_string(d.train.size()) + " tokens), validation " +
              d.val_source + " (" + std::to_string(d.val.size()) + " tokens); their unigram entropy is " +
              fixed(data::unigram_entropy_nats(d.train), 4) + " nats (the loss of token frequencies alone)");
    if (at) log::info("resuming at step " + std::to_string(at));
    if (!o.json)
        std::cout << "# step/total  loss (mean over the global batch, before the update)  lr  gradient norm  "
                     "tokens/s  model FLOP/s  forward backward optimizer seconds  bytes fetched, compute's "
                     "stall, device peak, peak resident memory; with state on NVMe: the disk's bytes in and out, "
                     "the time they take at its bandwidth (floor) and the step's multiple of it\n";
}

int run(Options& o) {
    if (o.steps == 0) throw UsageError("--steps must be at least 1");
    if (o.schedule != "cosine" && o.schedule != "constant")
        throw UsageError("--schedule " + o.schedule + ": expected cosine or constant");
    // The checkpoint is the data directory's manifest.jsonl, whichever file
    // --manifest names: read and commit that one.
    shard::Committed checkpoint = train::read_checkpoint(o.manifest);
    shard::Manifest& m = checkpoint.manifest;
    const std::string& committed = checkpoint.path;
    // What the options and the files can refuse, before anything is taken:
    // a refused run costs no device memory and no pinned pool.
    const std::uint64_t at = train::resume_step(m, committed, o.resume, o.steps);

    comm::Communicator comm(o.comm.resolve());
    const unsigned cores = trainer::cores_per_rank(comm, o.threads);
    Data d = load_data(o, m.spec.vocab, comm, cores);
    auto dev = device::open(o.device.resolve(cores));
    // --profile: rank 0's device, its peaks measured before anything takes
    // the budget. Validation would run its kernels inside a step's profile.
    const bool lead = comm.rank() == 0;
    if (o.profile && o.eval_every)
        throw UsageError("--profile times the training steps alone: not with --eval-every");
    std::optional<device::Peaks> peaks;
    std::optional<device::Profile> prof;
    if (o.profile && lead) {
        log::info("--profile: the device's GEMM and copy peaks");
        peaks = device::measure_peaks(*dev, device::parse_precision(o.precision), 2048,
                                      trainer::profile_copy_bytes(*dev), 3);
        prof.emplace(*dev);
    }
    io::Engine engine(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &engine);

    const unsigned rank = static_cast<unsigned>(comm.rank()), ranks = static_cast<unsigned>(comm.size());
    data::Loader train_loader(d.train, d.train_source,
                              {.batch = o.batch, .seq = o.seq, .rank = rank, .ranks = ranks, .shuffle = o.shuffle,
                               .seed = o.seed});
    std::optional<data::Loader> val_loader;
    if (o.eval_every)
        val_loader.emplace(d.val, d.val_source,
                           data::LoaderOptions{.batch = o.batch, .seq = o.seq, .rank = rank, .ranks = ranks});

    train::Options to = train_options(o, committed, cores);

    train::Trainer t(m, comm, engine, pool, *dev, to);
    if (lead) describe_run(o, checkpoint, comm, t, to, *dev, d, at);

    const train::Cadence cadence{.steps = o.steps,
                                 .eval_every = o.eval_every,
                                 .eval_batches = o.eval_batches,
                                 .checkpoint_every = o.checkpoint_every,
                                 .stop = &g_stop};
    // The profile reads each step's stamps as its line is written (after the
    // step's synchronize), with the engine's own timings as its stages; the
    // last step's line ends it, before the final commit's check runs a
    // forward pass of its own.
    auto profile_step = [&](const train::StepLog& log) {
        if (!prof) return;
        prof->stage("forward", log.forward_seconds);
        prof->stage("backward", log.backward_seconds);
        prof->stage("optimizer", log.optimizer_seconds);
        prof->stage("fetch wait (compute stalled)", log.stall_seconds);
        prof->stage("optimizer: AdamW", log.optimizer_update_seconds);
        prof->stage("optimizer: read/write wait", log.optimizer_wait_seconds);
        prof->stage("optimizer: commit", log.optimizer_commit_seconds);
        prof->stage("optimizer: during backward", log.optimizer_overlap_seconds);
        prof->collect(log.seconds);
        if (log.step >= o.steps) dev->set_profile(nullptr);
    };
    if (prof) dev->set_profile(&*prof);
    train::run(t, comm, train_loader, val_loader ? &*val_loader : nullptr, cadence,
               [&](const train::StepLog& log, std::optional<double> val) {
                   profile_step(log);
                   emit(o, log, o.steps, val);
               });
    dev->set_profile(nullptr);
    if (prof)
        trainer::report_profile(*prof, *peaks, *dev,
                                {.model = m.spec.to_string(),
                                 .precision = o.precision,
                                 .batch = o.batch,
                                 .seq = o.seq,
                                 .rank = 0,
                                 .model_flops = t.flops_per_step()},
                                o.json);
    if (lead) log::info("done: " + committed + " is committed at step " + std::to_string(t.step_count()));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-train")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-train: trains the GPT a manifest describes (zinf-shard layout | zinf-shard init) on\n"
                 "llm.c token files or any text, alone or under mpirun as data parallel."};
    app.name("zinf-train");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("--manifest", o.manifest, "The manifest zinf-shard init wrote (the checkpoint)");
    app.add_option("--data", o.data, "Training tokens: an llm.c token file (uint16, magic 20240520)");
    app.add_option("--text", o.text,
                   "Training text: any file, through --tokenizer, else one token per byte (vocabulary 256)");
    app.add_option("--tokenizer", o.tokenizer,
                   "The model's tokenizer for --text and --val-text (tokenizer.json, tokenizer.model): the text is "
                   "tokenized once into a token file beside it (FILE.<hash>.tokens.bin, documents after the "
                   "tokenizer's end-of-text, as zinf-tokenize writes them) and reused while the tokenizer and the text "
                   "are unchanged; a vocabulary larger than the model's is refused (65)");
    app.add_option("--val-data", o.val_data, "Validation tokens (llm.c file); default: the last --val-fraction");
    app.add_option("--val-text", o.val_text, "Validation text (through --tokenizer, else byte-level)");
    app.add_option("--val-fraction", o.val_fraction, "Held out from the training tokens without a validation file")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.5));
    app.add_option("--steps", o.steps, "Train until this step (a resumed run counts from its checkpoint)");
    app.add_option("--batch,-B", o.batch, "Rows per rank and step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    app.add_option("--seq,-T", o.seq, "Tokens per row (at most the model's seq)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 24));
    app.add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
    app.add_option("--min-lr-ratio", o.min_lr_ratio, "Cosine decay ends at lr times this")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--warmup", o.warmup, "Steps of linear warm-up")->capture_default_str();
    app.add_option("--schedule", o.schedule, "After warm-up: cosine or constant")->capture_default_str();
    app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights only)")->capture_default_str();
    app.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
    app.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
    app.add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str();
    app.add_option("--grad-clip", o.grad_clip, "Clip the global gradient norm to this (0: no clipping)")
        ->capture_default_str()
        ->check(cli::non_negative());
    app.add_option("--seed", o.seed, "Seed of --shuffle's window offsets")->capture_default_str();
    app.add_flag("--shuffle", o.shuffle, "Draw each batch's window from the seed instead of reading in order");
    CLI::Option* ckpt =
        app.add_option("--checkpoint", o.checkpoint,
                       "Recompute each block's forward in the backward: all (keep the blocks' inputs alone), none "
                       "(keep every block's activations), auto (none when every block's activations fit the device "
                       "budget beside the engine, else all; all with --offload-activations). The same bits either way")
            ->capture_default_str()
            ->check(CLI::IsMember({"auto", "all", "none"}));
    app.add_flag("--no-checkpoint", o.no_checkpoint, "The same as --checkpoint none")->excludes(ckpt);
    app.add_option("--eval-every", o.eval_every, "Validation loss every N steps (0: never)")->capture_default_str();
    app.add_option("--eval-batches", o.eval_batches, "Batches per validation")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--checkpoint-every", o.checkpoint_every, "Commit a checkpoint every N steps (0: at the end only)")
        ->capture_default_str();
    app.add_flag("--resume", o.resume, "Continue the checkpoint the manifest holds");
    app.add_option("--threads", o.threads, "Kernel threads per rank (0: the cores shared out over the node's ranks)")
        ->capture_default_str();
    app.add_flag("--json", o.json, "JSON Lines (zinf.train/1) instead of the human lines");
    app.add_flag("--profile", o.profile,
                 "Time every device kernel and copy (and the engine's stages) over the steps: a table on stderr "
                 "after the run, zinf.profile/1 records with --json (with --bench: its timed steps)");
    app.add_flag("--resident", o.resident,
                 "The reference engine: every parameter resident on every rank (plain data parallel)");
    o.zero.add(app, false);
    app.add_flag("--no-persist-shared", o.no_persist_shared,
                 "Fetch a parameter several modules use (the tied wte) at each use instead of keeping it gathered "
                 "for the step");
    app.add_flag("--no-overlap", o.no_overlap,
                 "Run the optimizer step after backward instead of updating each tensor as its gradient arrives, "
                 "and commit it before the next step starts instead of beside the next step's forward (the "
                 "sequential reference: the overlapped step is the same to the bit)");
    app.add_option("--optimizer-readahead", o.optimizer_readahead,
                   "Page-locked memory for the optimizer state on NVMe: first the gradients' scratch when it fits "
                   "(else a file beside the state), then reading the master weights and moments a step after a "
                   "clipped one updates during backward, before the gradient norm is known (0: neither; auto: what "
                   "the host can spare, MemAvailable less an eighth of its memory, shared over the node's ranks)")
        ->capture_default_str();
    app.add_option("--disk-probe", o.disk_probe,
                   "Bytes each rank writes and reads in its folder at start-up to measure the disk each step's "
                   "floor is held against, when --config (zinf-nvmebench --best) brings no bandwidth (0: no floor)")
        ->capture_default_str();
    app.add_option("--offload-activations", o.offload_activations,
                   "Where each block's activation checkpoint waits for backward: none (device memory), cpu "
                   "(page-locked host memory) or nvme (a scratch file beside the rank's state)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "cpu", "nvme"}));
    app.add_option("--precision", o.precision,
                   "The arithmetic of the model's GEMM inputs: fp32 (the reference) or bf16 (inputs rounded to bf16, "
                   "fp32 accumulation, the activation checkpoints stored bf16; the loss, gradients, master weights "
                   "and optimizer state stay fp32)")
        ->capture_default_str();
    o.engine.add(app);
    o.pool.add(app);
    o.comm.add(app);
    o.bench.add(app);
    o.device.add(app);
    return cli::run(app, argc, argv, "zinf-train", common, [&] {
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::signal(SIGHUP, on_signal);
        watch_stop_flag(&g_stop);
        std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error to report, after a commit
        o.bench.check();
        const device::Precision precision = device::parse_precision(o.precision);
        o.bench.flash_attention = o.device.flash_attention();
        if (o.bench.enabled)
            return trainer::run_bench(o.bench, o.batch, o.seq, o.device.resolve(o.threads),
                                      precision, o.json, checkpointing(o), o.profile, g_stop);
        if (o.manifest.empty()) throw UsageError("--manifest is required (or --bench)");
        return run(o);
    });
}
