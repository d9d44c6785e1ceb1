// zinf text: tokenizers behind one interface, and the tokenizing of whole
// corpora into llm.c token files (zinf-tokenize, zinf-train --tokenizer).
//
//   auto tok = zinf::text::open("tokenizer.json");   // or tokenizer.model, gpt2_tokenizer.bin, "bytes"
//   std::vector<zinf::text::Id> ids = tok->encode("Hello world");
//   std::string back = tok->decode(ids);             // == the text, where round_trip() promises it
//
// What open() reads, by the file's first bytes:
//   - Hugging Face's tokenizer.json: a BPE model (vocab, merges, byte_fallback,
//     ignore_merges, unk_token, fuse_unk), the normalizers NFC, NFD, NFKC,
//     NFKD, Prepend and Replace, the pre-tokenizers ByteLevel, Split, Digits
//     and Metaspace, added and special tokens (matched before the
//     pre-tokenizer, never split), the decoders ByteLevel, ByteFallback, Fuse,
//     Strip, Replace and Metaspace, and the post-processors TemplateProcessing,
//     ByteLevel, RobertaProcessing and BertProcessing (their tokens around a
//     text: begin_ids(), end_ids()), each in a Sequence. Anything else the
//     file asks for is refused with its name (DataError, 65), never ignored.
//     Regexes are Oniguruma's, as Hugging Face's tokenizers compile them,
//     translated to PCRE2 (Unicode properties, JIT): \s is Unicode's
//     White_Space, \w its word characters, \h a hex digit.
//   - SentencePiece models (tokenizer.model), through libsentencepiece.
//   - llm.c's tokenizer file (magic 20240328): decode only.
//   - "bytes": every byte its own id (vocabulary 256), the byte-level models'.
//
// Encoding is split from the tokenizer: an Encoder holds one thread's caches,
// so one Tokenizer serves any number of threads, each with its own Encoder.
#pragma once

#include <zinf/util.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::text {

using Id = std::uint32_t;

// Where a stretch of text lies in its document: the rules of a text's start
// (a prefix space, Prepend, Metaspace's "first") apply only where it starts,
// and only where it ends does nothing follow it.
struct Part {
    bool starts = true;
    bool ends = true;
};

class Encoder {
public:
    virtual ~Encoder() = default;
    // Appends to `ids` the ids of text[0, end); text[end, size) is what
    // follows, looked at (a regex's look-ahead) but not encoded. Returns the
    // bytes encoded: `end`, or 0 when part.ends is false and the cut at `end`
    // is not one the tokenizer would make itself (a pre-tokenizer's piece
    // runs across it, or its match looked past the text): then nothing was
    // appended, and the caller encodes the text again with what follows. A
    // text the tokenizer cannot encode is a DataError with the byte offset in
    // `text` (invalid UTF-8 where there is no byte fallback).
    virtual std::size_t encode(std::string_view text, std::size_t end, Part part, std::vector<Id>& ids) = 0;
};

// What decode(encode(text)) gives back: the same bytes whatever they are, the
// same text for valid UTF-8 only, or nothing promised (a normalizer, an
// unknown token, a prefix space the decoder keeps).
enum class RoundTrip { bytes, utf8, none };

// What the encoders of one job share (words seen and their ids, written by
// every thread, read by all), where the tokenizer keeps such a thing: the
// second thread then does not work out again what the first already did.
class SharedCache {
public:
    virtual ~SharedCache() = default;
};
const char* round_trip_name(RoundTrip r);

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    const std::string& path() const noexcept { return path_; }
    // What it is, for messages: "Hugging Face tokenizer.json (BPE, byte-level)".
    virtual std::string kind() const = 0;
    // Every id is below this.
    virtual std::uint64_t vocab() const = 0;
    virtual bool can_encode() const { return true; }
    virtual RoundTrip round_trip() const = 0;
    // Whether a document may be cut after a newline that a non-space follows,
    // each part encoded on its own (Encoder::encode with part.ends false),
    // so that a document larger than memory streams. False where the
    // tokenizer's own rules span such cuts (SentencePiece's dummy prefix, a
    // normalizer's regex, a special token holding a newline).
    virtual bool cuts_lines() const { return false; }
    // A new encoder (one per thread), whose own caches take at most about
    // `cache_bytes`, beside `shared` when given (from shared_cache(), for
    // encoders on several threads). UsageError when !can_encode().
    virtual std::unique_ptr<Encoder> encoder(std::uint64_t cache_bytes = 16 * MiB,
                                             std::shared_ptr<SharedCache> shared = {}) const = 0;
    // A cache for encoders on several threads to share, of about `bytes`,
    // or nullptr where the tokenizer keeps none (what it holds changes no id).
    virtual std::shared_ptr<SharedCache> shared_cache(std::uint64_t /*bytes*/) const { return nullptr; }
    // Appends the text of `ids`; DataError for an id past the vocabulary.
    // part.starts: the ids begin the text (a decoder's first-token rules).
    virtual void decode(std::span<const Id> ids, Part part, std::string& out) const = 0;
    // How many of `ids`, from the front, decode to the same text on their own
    // as before the rest (a decoder that joins byte tokens into a character
    // is not cut inside such a run): where a long decode may be cut.
    virtual std::size_t decode_cut(std::span<const Id> ids) const { return ids.size(); }

    // The end-of-text token that separates documents (<|endoftext|>,
    // <|end_of_text|>, </s>, <eos>, or an llm.c file's), if there is one.
    virtual std::optional<Id> end_of_text() const { return std::nullopt; }
    // The ids the tokenizer's post-processor puts before and after a text
    // (Llama 3's <|begin_of_text|>; SentencePiece's <s>).
    virtual std::vector<Id> begin_ids() const { return {}; }
    virtual std::vector<Id> end_ids() const { return {}; }
    // The id of a token given by its text (a special token, "<|endoftext|>").
    virtual std::optional<Id> token_id(std::string_view token) const;

    // The ids of a whole text (no begin_ids or end_ids), and a whole decode.
    std::vector<Id> encode(std::string_view text) const;
    std::string decode(std::span<const Id> ids) const;
    // DataError naming the tokenizer, its vocabulary and the model's when the
    // tokenizer's ids do not all fit the model's `model_vocab`.
    void check_model(std::uint64_t model_vocab) const;

protected:
    std::string path_;
};

// Opens a tokenizer by what the file holds (see the top of this file), or
// "bytes". MissingInputError when absent; DataError naming the file and
// what is wrong; UsageError for a SentencePiece model in a build without
// SentencePiece.
std::unique_ptr<Tokenizer> open(const std::string& path);
// The byte-level tokenizer: id = byte.
std::unique_ptr<Tokenizer> bytes();
// A tokenizer.json given as text; `source` names it in messages.
std::unique_ptr<Tokenizer> from_json(std::string_view json, const std::string& source);
bool sentencepiece_available();

inline constexpr std::uint32_t kLlmcTokenizerMagic = 20240328;
// The most bytes of a tokenizer file read (Qwen2's tokenizer.json is 7 MiB).
inline constexpr std::uint64_t kMaxTokenizerBytes = 1 * GiB;

// The text a stream of ids adds as each comes (zinf-sample): what decoding
// all the ids so far gives, less what was already returned. Bytes of a
// character not yet complete are held back until it is.
class TextStream {
public:
    explicit TextStream(const Tokenizer& t) : t_(t) {}
    std::string next(Id id);

private:
    const Tokenizer& t_;
    std::vector<Id> ids_;
    std::string written_;
};

// ---------------------------------------------------------------------------
// Tokenizing files into an llm.c token file.
struct TokenizeOptions {
    // Text files, each one document ("-" is standard input), or with `field`
    // JSON Lines whose records' `field` (a string) is each a document.
    std::vector<std::string> inputs;
    std::string field;
    std::string output;
    // The last val_fraction of the tokens go to val_output instead (data::split's rule).
    double val_fraction = 0;
    std::string val_output;
    // Put before every document; none: documents follow each other directly.
    std::optional<Id> separator;
    // The post-processor's begin_ids() and end_ids() around every document.
    bool specials = true;
    unsigned threads = 1;
    // What the text in flight and the threads' results may take: the
    // pipeline's memory beside the tokenizer's own tables.
    std::uint64_t memory_bytes = 256 * MiB;
    // Called from the thread that writes, as the output grows.
    std::function<void(std::uint64_t input_bytes, std::uint64_t tokens)> progress;
    // Set (by a signal handler) to stop: Interrupted, nothing committed.
    const std::atomic<bool>* stop = nullptr;
};

struct TokenizeSummary {
    std::uint64_t documents = 0, input_bytes = 0, tokens = 0, val_tokens = 0;
    bool wide = false;               // version 2 (uint32) token files
    std::uint64_t cut_documents = 0; // documents encoded in parts (larger than a part)
    std::uint64_t redone_parts = 0;  // parts encoded again with what followed them
    double seconds = 0;
};

// Tokenizes `o.inputs` into `o.output` (and `o.val_output`): both complete
// or absent, never a part. Memory stays within o.memory_bytes beside the
// tokenizer whatever the corpus size; the output is the same bytes for any
// o.threads. DataError naming the file and line (JSON Lines) or byte offset
// of what cannot be read; UsageError for options that do not fit.
TokenizeSummary tokenize_files(const Tokenizer& t, const TokenizeOptions& o);

// The token file's text, written to `write` in pieces of at most about
// `chunk_tokens` tokens' text. Returns the tokens decoded.
std::uint64_t decode_file(const Tokenizer& t, const std::string& token_file,
                          const std::function<void(std::string_view)>& write, std::size_t chunk_tokens = 1 << 16);

// zinf-train --text FILE --tokenizer T: the token file of `text_path`
// beside it, named for an xxh3 of the tokenizer's bytes, the text's bytes and
// the options of `how` that change the tokens (separator, specials), made
// with tokenize_files when it is not there yet and reused when it is (a
// damaged one is made again).
struct Cached {
    std::string path;
    bool made = false;        // tokenized now (else reused)
    TokenizeSummary summary;  // when made
};
Cached cached_token_file(const Tokenizer& t, const std::string& text_path, const TokenizeOptions& how);
// The path cached_token_file would use, without making it.
std::string cache_path(const Tokenizer& t, const std::string& text_path, const TokenizeOptions& how);

}  // namespace zinf::text
