// zinf-sample: text from the GPT a committed manifest holds, one token at a
// time through the ZeRO-Infinity engine (each rank fetching its partitions
// from their tier, as zinf-train does) and a key-value cache, alone or under
// mpirun with the manifest's dp ranks. The text on stdout, progress on
// stderr. See man/zinf-sample.1.
#include <zinf/data.hpp>
#include <zinf/options.hpp>
#include <zinf/sample.hpp>
#include <zinf/text.hpp>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <random>
#include <unistd.h>

using namespace zinf;

namespace {

struct Options {
    std::string manifest, prompt, prompt_tokens, tokenizer;
    bool has_prompt = false;
    std::uint64_t tokens = 200, top_k = 0;
    double temperature = 1.0;
    std::optional<std::uint64_t> seed;
    unsigned threads = 0;
    cli::DeviceOptions device;
    cli::ZeroOptions zero;
    cli::EngineOptions engine;
    cli::PoolOptions pool;
    cli::CommOptions comm;
};

// The prompt as tokens: through the tokenizer (after what its
// post-processor puts first: <|begin_of_text|>, <s>), as bytes (byte-level
// models), or an llm.c token file; with no prompt, the start of a text: the
// tokenizer's first ids or its end-of-text, else a newline.
std::vector<std::int32_t> prompt_of(const Options& o, std::uint64_t vocab, const text::Tokenizer* tok) {
    if (o.has_prompt && !o.prompt_tokens.empty()) throw UsageError("--prompt and --prompt-tokens exclude each other");
    if (o.has_prompt && o.prompt.empty()) throw UsageError("--prompt is empty");
    std::vector<std::int32_t> p;
    if (!o.prompt_tokens.empty()) {
        const data::Tokens t = data::Tokens::open(o.prompt_tokens);
        data::check_vocab(t, vocab);
        t.tokens().scan([&](std::span<const std::uint32_t> piece) {
            for (std::uint32_t v : piece) p.push_back(static_cast<std::int32_t>(v));
        });
        return p;
    }
    if (tok && tok->can_encode()) {
        for (text::Id id : tok->begin_ids()) p.push_back(static_cast<std::int32_t>(id));
        if (o.has_prompt)
            for (text::Id id : tok->encode(o.prompt)) p.push_back(static_cast<std::int32_t>(id));
        if (p.empty() && tok->end_of_text()) p.push_back(static_cast<std::int32_t>(*tok->end_of_text()));
        if (p.empty()) throw UsageError("the tokenizer has no token to start an empty prompt: give --prompt");
        return p;
    }
    if (o.has_prompt) {
        if (vocab != 256)
            throw UsageError("--prompt TEXT needs a --tokenizer that encodes (tokenizer.json, tokenizer.model), or a "
                             "byte-level model (vocabulary 256); this model's vocabulary is " + std::to_string(vocab) +
                             (tok ? " and " + tok->path() + " only decodes" : std::string()) +
                             ": give the prompt's tokens with --prompt-tokens FILE (an llm.c token file)");
        for (unsigned char c : o.prompt) p.push_back(c);
    } else if (tok && tok->end_of_text()) {
        p.push_back(static_cast<std::int32_t>(*tok->end_of_text()));
    } else if (vocab == 256) {
        p.push_back('\n');
    } else {
        throw UsageError("the model's vocabulary (" + std::to_string(vocab) +
                         ") has no start token known here: give --prompt-tokens FILE, or a --tokenizer with an "
                         "end-of-text token");
    }
    return p;
}

void write_out(std::string_view bytes) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
        throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
}

int run(Options& o) {
    if (o.manifest.empty()) throw UsageError("--manifest is required");
    // The committed state: the data directory's manifest.jsonl, as the
    // trainer commits it (a copy elsewhere goes stale with its first commit).
    shard::Committed committed = shard::read_committed(o.manifest, shard::LockMode::shared);
    if (!committed.copy_of.empty())
        log::info("reading the committed " + committed.path + " (" + o.manifest + " is a copy)");
    shard::Manifest& m = committed.manifest;
    const std::uint64_t V = m.spec.vocab;
    std::unique_ptr<text::Tokenizer> tok;
    if (!o.tokenizer.empty()) {
        tok = text::open(o.tokenizer);
        tok->check_model(V);
    }
    const std::vector<std::int32_t> prompt = prompt_of(o, V, tok.get());
    // (-n past the model's positions first: the sum below would wrap)
    const std::uint64_t positions = o.tokens > m.spec.seq ? o.tokens : prompt.size() + std::max<std::uint64_t>(o.tokens, 1) - 1;
    if (positions > m.spec.seq)
        throw UsageError("the prompt's " + std::to_string(prompt.size()) + " tokens and -n " + std::to_string(o.tokens) +
                         " need " + std::to_string(positions) + " positions; the model has " +
                         std::to_string(m.spec.seq));

    comm::Communicator comm(o.comm.resolve());
    if (static_cast<unsigned>(comm.size()) != m.opts.dp)
        throw UsageError("manifest " + o.manifest + " is laid out for dp " + std::to_string(m.opts.dp) + ", but " +
                         std::to_string(comm.size()) + " rank(s) are running: run under mpirun -np " +
                         std::to_string(m.opts.dp) + ", or reshard it (zinf-shard reshard --dp " +
                         std::to_string(comm.size()) + ")");
    const bool lead = comm.rank() == 0;
    auto dev = device::open(o.device.resolve(o.threads));
    io::Engine io(o.engine.resolve());
    mem::PinnedPool pool(o.pool.resolve(), &io);

    const auto model = model::make_model(model::Config::from(m.spec, m.opts.tile));
    model::LanguageModel& gpt = *model;
    gpt.params_table().check(m, o.manifest);
    // The decoder's buffers first: the engine takes what is left.
    sample::Decoder dec(gpt, *dev, positions);
    zero::EngineOptions eo = o.zero.resolve();
    eo.gpu = o.device.gpu;
    const auto engine = zero::Engine::open(m, gpt.modules(), comm, io, pool, *dev, eo);

    sample::GenerateOptions go;
    go.tokens = o.tokens;
    go.choice = {.temperature = o.temperature, .top_k = o.top_k, .limit = tok ? std::min<std::uint64_t>(tok->vocab(), V) : 0};
    go.seed = o.seed ? *o.seed : std::random_device{}();
    if (tok && tok->end_of_text()) go.stop = static_cast<std::int32_t>(*tok->end_of_text());
    std::optional<text::TextStream> stream;
    if (tok) stream.emplace(*tok);
    if (lead) {
        log::info(m.spec.to_string() + ", step " + std::to_string(m.parts.front().step) + ": parameters on " +
                  shard::tier_name(m.opts.param_tier) + " (" + shard::dtype_name(m.opts.param_dtype) + ") over " +
                  std::to_string(comm.size()) + " rank(s); " +
                  (engine->options().infinity.persist_below ? "every parameter kept on the device after its first fetch"
                                    : "every token's pass fetches the parameters from their tier (they do not all "
                                      "fit the device budget at once)") +
                  "; key-value cache for " + std::to_string(positions) + " positions");
        log::info("prompt " + std::to_string(prompt.size()) + " tokens, " + std::to_string(o.tokens) +
                  " to draw, temperature " + std::to_string(o.temperature) +
                  (o.top_k ? ", top-k " + std::to_string(o.top_k) : std::string()) + ", seed " +
                  std::to_string(go.seed) + (o.seed ? "" : " (--seed " + std::to_string(go.seed) + " repeats this text)"));
    }
    auto emit = [&](std::int32_t t) {
        if (!lead || (go.stop && t == *go.stop)) return;
        if (stream) {
            write_out(stream->next(static_cast<text::Id>(t)));
        } else if (V == 256) {
            const char c = static_cast<char>(t);
            write_out({&c, 1});
        } else {
            write_out(std::to_string(t) + "\n");
        }
    };
    Timer timer;
    const std::uint64_t drawn = sample::generate(dec, *dev, *engine, comm, prompt, go, emit);
    if (lead) {
        const double s = timer.seconds();
        log::info(std::to_string(drawn) + " tokens in " + std::to_string(s) + " s (" +
                  std::to_string(static_cast<double>(prompt.size() + drawn) / s) + " positions/s)");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-sample")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-sample: text from the GPT or Llama a committed manifest holds (zinf-shard init, zinf-train), one token\n"
                 "at a time through the ZeRO-Infinity engine and a key-value cache; alone, or under mpirun with the\n"
                 "manifest's dp ranks."};
    app.name("zinf-sample");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("-m,--manifest", o.manifest, "The manifest (its data directory's committed manifest.jsonl is read)");
    app.add_option("--prompt", o.prompt,
                   "Text to continue: through --tokenizer (after the ids its post-processor puts first), or one token "
                   "per byte for byte-level models")
        ->each([&](const std::string&) { o.has_prompt = true; });
    app.add_option("--prompt-tokens", o.prompt_tokens, "The prompt's tokens: an llm.c token file (uint16, magic 20240520)");
    app.add_option("-n,--tokens", o.tokens, "Tokens to draw after the prompt")->capture_default_str();
    app.add_option("--temperature", o.temperature, "Softmax temperature; 0: greedy (the most likely token)")
        ->capture_default_str()
        ->check(cli::non_negative());
    app.add_option("--top-k", o.top_k, "Draw from the k most likely tokens only (0: all)")->capture_default_str();
    app.add_option("--seed", o.seed, "Seed of the draws (default: drawn fresh and printed on stderr)");
    app.add_option("--tokenizer", o.tokenizer,
                   "The model's tokenizer: Hugging Face's tokenizer.json (GPT-2, SmolLM, Llama 3, Qwen2, ...) or a "
                   "SentencePiece tokenizer.model (Llama 2, TinyLlama, Mistral) encode --prompt and decode the "
                   "tokens as they are drawn; llm.c's tokenizer file (gpt2_tokenizer.bin) decodes only. Its "
                   "end-of-text token (<|endoftext|>, <|end_of_text|>, </s>) ends the text. A vocabulary larger "
                   "than the model's is refused (65)");
    app.add_option("--threads", o.threads, "Kernel threads (0: the CPUs this process may use)")->capture_default_str();
    o.zero.add(app, true);
    o.engine.add(app);
    o.pool.add(app);
    o.comm.add(app);
    o.device.add(app);
    return cli::run(app, argc, argv, "zinf-sample", common, [&] {
        std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error to report
        return run(o);
    });
}
