// zinf-sample: text from the GPT a committed manifest holds, one token at a
// time through the ZeRO-Infinity engine (each rank fetching its partitions
// from their tier, as zinf-train does) and a key-value cache, alone or under
// mpirun with the manifest's dp ranks. The text on stdout, progress on
// stderr. See man/zinf-sample.1.
#include <zinf/data.hpp>
#include <zinf/options.hpp>
#include <zinf/sample.hpp>

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

// The prompt as tokens: text as bytes (byte-level models) or through a
// SentencePiece model (after its <s>), an llm.c token file, or the start of
// a text: the tokenizer's end-of-text or <s>, else a newline.
std::vector<std::int32_t> prompt_of(const Options& o, std::uint64_t vocab, const sample::Tokenizer* tok,
                                    const sample::SentencePiece* sp = nullptr) {
    if (o.has_prompt && !o.prompt_tokens.empty()) throw UsageError("--prompt and --prompt-tokens exclude each other");
    std::vector<std::int32_t> p;
    if (sp && o.prompt_tokens.empty()) {  // (a token file is read as below)
        if (sp->bos()) p.push_back(*sp->bos());
        if (o.has_prompt) {
            if (o.prompt.empty()) throw UsageError("--prompt is empty");
            for (std::int32_t t : sp->encode(o.prompt)) p.push_back(t);
        }
        if (p.empty()) throw UsageError("the tokenizer has no <s> to start an empty prompt: give --prompt");
        for (std::int32_t t : p)
            if (t < 0 || static_cast<std::uint64_t>(t) >= vocab)
                throw UsageError("the tokenizer gives token " + std::to_string(t) + ", past the model's vocabulary " +
                                 std::to_string(vocab) + ": is it the model's tokenizer?");
        return p;
    }
    if (o.has_prompt) {
        if (vocab != 256)
            throw UsageError("--prompt TEXT is one token per byte, for byte-level models (vocabulary 256); this "
                             "model's vocabulary is " + std::to_string(vocab) +
                             ": give the prompt's tokens with --prompt-tokens FILE (an llm.c token file)");
        if (o.prompt.empty()) throw UsageError("--prompt is empty");
        for (unsigned char c : o.prompt) p.push_back(c);
    } else if (!o.prompt_tokens.empty()) {
        const data::Tokens t = data::Tokens::open(o.prompt_tokens);
        data::check_vocab(t, vocab);
        for (std::uint32_t v : t.tokens()) p.push_back(static_cast<std::int32_t>(v));
    } else if (tok && tok->eot()) {
        p.push_back(static_cast<std::int32_t>(*tok->eot()));
    } else if (vocab == 256) {
        p.push_back('\n');
    } else {
        throw UsageError("the model's vocabulary (" + std::to_string(vocab) +
                         ") has no start token known here: give --prompt-tokens FILE, or a version 2 --tokenizer "
                         "(its end-of-text token starts the text)");
    }
    return p;
}

// llm.c's tokenizer file begins with its magic; anything else is taken for
// a SentencePiece model.
bool is_llmc_tokenizer(const std::string& path) {
    const Fd fd = open_input(path, Input::regular);
    std::uint32_t magic = 0;
    const long n = sys::pread(fd.get(), &magic, sizeof magic, 0, path);
    return n == static_cast<long>(sizeof magic) && magic == sample::kTokenizerMagic;
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
    std::optional<sample::Tokenizer> tok;
    std::optional<sample::SentencePiece> sp;
    const std::uint64_t V = m.spec.vocab;
    if (!o.tokenizer.empty()) {
        if (is_llmc_tokenizer(o.tokenizer)) {
            tok = sample::Tokenizer::open(o.tokenizer);
            tok->check_model(V);
        } else {
            sp = sample::SentencePiece::open(o.tokenizer);
        }
    }
    const std::vector<std::int32_t> prompt = prompt_of(o, V, tok ? &*tok : nullptr, sp ? &*sp : nullptr);
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
    go.choice = {.temperature = o.temperature, .top_k = o.top_k,
                 .limit = tok ? std::min<std::uint64_t>(tok->vocab(), V) : sp ? std::min<std::uint64_t>(sp->vocab(), V) : 0};
    go.seed = o.seed ? *o.seed : std::random_device{}();
    if (tok && tok->eot()) go.stop = static_cast<std::int32_t>(*tok->eot());
    if (sp && sp->eos()) go.stop = *sp->eos();
    std::optional<sample::TextStream> text;
    if (sp) text.emplace(*sp);
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
        if (tok) {
            write_out(tok->decode(static_cast<std::uint32_t>(t)));
        } else if (text) {
            write_out(text->next(t));
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
    CLI::App app{"zinf-sample: text from the GPT or Llama a committed manifest holds (zinf-shard init, zinf-train), one token\n"
                 "at a time through the ZeRO-Infinity engine and a key-value cache; alone, or under mpirun with the\n"
                 "manifest's dp ranks."};
    app.name("zinf-sample");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("-m,--manifest", o.manifest, "The manifest (its data directory's committed manifest.jsonl is read)");
    app.add_option("--prompt", o.prompt,
                   "Text to continue: one token per byte (byte-level models), or through --tokenizer's SentencePiece "
                   "model")
        ->each([&](const std::string&) { o.has_prompt = true; });
    app.add_option("--prompt-tokens", o.prompt_tokens, "The prompt's tokens: an llm.c token file (uint16, magic 20240520)");
    app.add_option("-n,--tokens", o.tokens, "Tokens to draw after the prompt")->capture_default_str();
    app.add_option("--temperature", o.temperature, "Softmax temperature; 0: greedy (the most likely token)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-k", o.top_k, "Draw from the k most likely tokens only (0: all)")->capture_default_str();
    app.add_option("--seed", o.seed, "Seed of the draws (default: drawn fresh and printed on stderr)");
    app.add_option("--tokenizer", o.tokenizer,
                   "llm.c tokenizer file (gpt2_tokenizer.bin, magic 20240328): decodes the tokens to text; a version 2 "
                   "file's end-of-text token starts an empty prompt and ends the text. Or a SentencePiece model "
                   "(tokenizer.model: Llama 2, TinyLlama, Mistral): encodes --prompt after <s>, decodes the tokens, "
                   "</s> ends the text");
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
