// zinf-tokenize: text (files, or JSON Lines with --field) into an llm.c token
// file through any tokenizer zinf reads (Hugging Face's tokenizer.json, a
// SentencePiece model, bytes), on N threads with the same bytes out for any
// N, in bounded memory whatever the corpus; --decode turns a token file back
// into text. A summary on stderr, or a zinf.tokenize/1 record with --json.
// See man/zinf-tokenize.1.
#include <zinf/cli.hpp>
#include <zinf/data.hpp>
#include <zinf/text.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sys/stat.h>

using namespace zinf;

namespace {

struct Options {
    std::vector<std::string> inputs;
    std::string tokenizer, output, field, val_output, sep, memory = "256MiB";
    double val = 0;
    unsigned threads = 0;
    bool no_special = false, decode = false, json = false;
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// The validation file's default name: beside the output, ".val" before its extension.
std::string val_path(const std::string& output) {
    const std::size_t slash = output.rfind('/');
    const std::size_t dot = output.rfind('.');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1))
        return output.substr(0, dot) + ".val" + output.substr(dot);
    return output + ".val";
}

// --sep: a token's text (<|endoftext|>), an id, or none.
std::optional<text::Id> separator(const Options& o, const text::Tokenizer& t) {
    if (o.sep.empty()) {
        if (!t.end_of_text())
            log::info(t.path() + " has no end-of-text token: documents follow each other with nothing between "
                                 "(--sep names a token)");
        return t.end_of_text();
    }
    if (o.sep == "none") return std::nullopt;
    if (o.sep.find_first_not_of("0123456789") == std::string::npos && o.sep.size() < 11) {
        const std::uint64_t id = std::stoull(o.sep);
        if (id >= t.vocab())
            throw UsageError("--sep " + o.sep + " is past the tokenizer's vocabulary of " + std::to_string(t.vocab()));
        return static_cast<text::Id>(id);
    }
    if (const auto id = t.token_id(o.sep)) return id;
    throw UsageError("--sep " + o.sep + ": no such token in " + t.path() + " (give a token's text, an id, or none)");
}

std::uint64_t regular_bytes(const std::vector<std::string>& paths) {
    std::uint64_t total = 0;
    for (const std::string& p : paths) {
        struct stat st {};
        if (p == "-" || ::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;  // a pipe: no total
        total += static_cast<std::uint64_t>(st.st_size);
    }
    return total;
}

void print_json(const json::Json& j) {
    std::cout << json::line(j);
    std::cout.flush();
    if (!std::cout) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
}

int encode(const Options& o, const text::Tokenizer& t) {
    if (o.output.empty()) throw UsageError("-o FILE is required: where the tokens go");
    if (!t.can_encode()) (void)t.encoder();  // says why it cannot
    text::TokenizeOptions to;
    to.inputs = o.inputs;
    to.field = o.field;
    to.output = o.output;
    to.val_fraction = o.val;
    if (o.val > 0) to.val_output = o.val_output.empty() ? val_path(o.output) : o.val_output;
    else if (!o.val_output.empty()) throw UsageError("--val-output without --val");
    to.separator = separator(o, t);
    to.specials = !o.no_special;
    to.threads = o.threads ? o.threads : affinity_cpus();
    to.memory_bytes = parse_size(o.memory);
    to.stop = &g_stop;
    Progress bar("zinf-tokenize", regular_bytes(o.inputs), "tokens");
    to.progress = [&](std::uint64_t bytes, std::uint64_t tokens) { bar.update(bytes, tokens); };
    log::debug("tokenizer: " + t.kind());
    const text::TokenizeSummary s = text::tokenize_files(t, to);
    bar.finish();
    const double mbps = s.seconds > 0 ? static_cast<double>(s.input_bytes) / 1e6 / s.seconds : 0;
    const double tps = s.seconds > 0 ? static_cast<double>(s.tokens + s.val_tokens) / s.seconds : 0;
    if (o.json) {
        json::Json j;
        j["schema"] = "zinf.tokenize/1";
        j["mode"] = "encode";
        j["tokenizer"] = t.path();
        j["tokenizer_kind"] = t.kind();
        j["vocab"] = t.vocab();
        j["round_trip"] = text::round_trip_name(t.round_trip());
        j["inputs"] = o.inputs;
        j["documents"] = s.documents;
        j["input_bytes"] = s.input_bytes;
        j["output"] = o.output;
        j["version"] = s.wide ? data::kVersionWide : data::kVersion;
        j["tokens"] = s.tokens;
        j["val_output"] = to.val_output.empty() ? json::Json(nullptr) : json::Json(to.val_output);
        j["val_tokens"] = s.val_tokens;
        j["separator"] = to.separator ? json::Json(*to.separator) : json::Json(nullptr);
        j["threads"] = to.threads;
        j["memory_bytes"] = to.memory_bytes;
        j["cut_documents"] = s.cut_documents;
        j["redone_parts"] = s.redone_parts;
        j["elapsed_s"] = s.seconds;
        j["input_mb_per_s"] = mbps;
        j["tokens_per_s"] = tps;
        j["peak_rss_bytes"] = peak_resident_bytes();
        print_json(j);
    } else {
        char rate[96];
        std::snprintf(rate, sizeof rate, "%.2f s, %.1f MB/s, %.0f tokens/s", s.seconds, mbps, tps);
        log::info(std::to_string(s.documents) + " documents, " + format_size(s.input_bytes) + " -> " + o.output + " (" +
                  std::to_string(s.tokens) + " tokens, version " + (s.wide ? "2" : "1") + ")" +
                  (s.val_tokens ? " and " + to.val_output + " (" + std::to_string(s.val_tokens) + " tokens)" : "") +
                  " in " + rate + " on " + std::to_string(to.threads) + " thread(s)");
    }
    return 0;
}

int decode(const Options& o, const text::Tokenizer& t) {
    if (!o.field.empty() || o.val > 0 || !o.sep.empty() || o.no_special)
        throw UsageError("--decode takes token files and writes their text: --field, --val, --sep and --no-special "
                         "are for encoding");
    Timer timer;
    AtomicFile file;
    const bool to_file = !o.output.empty() && o.output != "-";
    if (to_file) file = AtomicFile::create(o.output);
    std::uint64_t tokens = 0, bytes = 0;
    Progress bar("zinf-tokenize --decode", 0, "tokens");
    for (const std::string& in : o.inputs) {
        if (g_stop.load()) throw Interrupted("interrupted: nothing was written", {0, o.output, {}, -1});
        tokens += text::decode_file(t, in, [&](std::string_view piece) {
            if (g_stop.load()) throw Interrupted("interrupted", {0, o.output, {}, -1});
            bytes += piece.size();
            if (to_file) {
                file.write(std::as_bytes(std::span(piece.data(), piece.size())));
            } else if (std::fwrite(piece.data(), 1, piece.size(), stdout) != piece.size()) {
                throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
            }
            bar.update(bytes, tokens);
        });
    }
    if (to_file) file.commit();
    else if (std::fflush(stdout) != 0) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
    bar.finish();
    const double s = timer.seconds();
    if (o.json) {
        json::Json j;
        j["schema"] = "zinf.tokenize/1";
        j["mode"] = "decode";
        j["tokenizer"] = t.path();
        j["inputs"] = o.inputs;
        j["tokens"] = tokens;
        j["output_bytes"] = bytes;
        j["output"] = to_file ? json::Json(o.output) : json::Json(nullptr);
        j["elapsed_s"] = s;
        j["peak_rss_bytes"] = peak_resident_bytes();
        // The text went to a file: stdout carries the record alone.
        if (!to_file) throw UsageError("--json with --decode needs -o FILE: stdout carries the text");
        print_json(j);
    } else {
        log::info(std::to_string(tokens) + " tokens -> " + format_size(bytes) + " of text" +
                  (to_file ? " in " + o.output : std::string()));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-tokenize")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-tokenize: text files, or JSON Lines with --field, into an llm.c token file through a model's\n"
                 "tokenizer (Hugging Face tokenizer.json, SentencePiece tokenizer.model, or bytes), on N threads,\n"
                 "in bounded memory; --decode turns token files back into text."};
    app.name("zinf-tokenize");
    Options o;
    cli::Common common;
    cli::add_common(app, common);
    app.add_option("inputs", o.inputs,
                   "Text files, each a document (- is standard input); with --field, JSON Lines files whose every "
                   "record is a document; with --decode, token files")
        ->required();
    app.add_option("-t,--tokenizer", o.tokenizer,
                   "tokenizer.json (Hugging Face), tokenizer.model (SentencePiece), gpt2_tokenizer.bin (llm.c: "
                   "--decode only), or bytes (one token per byte)")
        ->required();
    app.add_option("-o,--output", o.output,
                   "The token file (llm.c's: version 1, uint16, for vocabularies up to 65,536 ids, else version 2, "
                   "uint32), written whole or not at all; with --decode the text (default: stdout)");
    app.add_option("--field", o.field, "The inputs are JSON Lines: each record's FIELD (a string) is a document");
    app.add_option("--val", o.val,
                   "The last FRACTION of the tokens go to a validation token file instead (the split zinf-train's "
                   "--val-fraction makes)")
        ->check(CLI::Range(0.0, 0.5));
    app.add_option("--val-output", o.val_output, "The validation file (default: the output's name with .val before "
                                                 "its extension)");
    app.add_option("--sep", o.sep,
                   "The token put before every document: its text (<|endoftext|>) or id, or none (default: the "
                   "tokenizer's end-of-text token, as llm.c's data scripts put it)");
    app.add_flag("--no-special", o.no_special,
                 "Leave out the tokens the tokenizer's post-processor puts around each document (Llama 3's "
                 "<|begin_of_text|>, SentencePiece's <s>)");
    app.add_option("--threads", o.threads, "Threads that encode (0: the CPUs this process may use); the output is "
                                           "the same bytes for any number")
        ->capture_default_str();
    app.add_option("--memory", o.memory,
                   "What the text in flight and the threads' results and caches may take, beside the tokenizer; a "
                   "document larger than a quarter of it is cut at a line, where the tokenizer allows")
        ->capture_default_str();
    app.add_flag("--decode", o.decode, "Token files in, their text out");
    app.add_flag("--json", o.json, "A zinf.tokenize/1 record on stdout when done, instead of the summary on stderr");
    return cli::run(app, argc, argv, "zinf-tokenize", common, [&] {
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::signal(SIGHUP, on_signal);
        watch_stop_flag(&g_stop);
        std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error to report
        const auto t = text::open(o.tokenizer);
        return o.decode ? decode(o, *t) : encode(o, *t);
    });
}
