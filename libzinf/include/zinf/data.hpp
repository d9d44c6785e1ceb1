// zinf data: the trainer's tokens — llm.c's token files (read a batch at a
// time, never held whole in memory) or a text file's bytes — their held-out
// split, and batches cut from them by batch index alone, so a resumed run
// needs no saved position.
//
// A token file is read with pread(2), not mapped: a file truncated or
// rewritten under a run (a data script writing it in place) would make a
// mapping's reader die of SIGBUS. Every read checks that the file is still
// the one the run opened (its size and modification time, and that its name
// still leads to it), so a change is a DataError naming the file and the
// offset (65), a failed read an IoError (74); the trainer commits the steps
// taken, as an interrupt does (train.hpp).
//
//   auto toks = zinf::data::Tokens::open("fineweb_train_000001.bin");  // or Tokens::text("book.txt")
//   zinf::data::check_vocab(toks, 50257);                   // DataError naming the first bad token
//   auto [train, val] = zinf::data::split(toks.tokens(), 0.01);
//   zinf::data::Loader loader(train, toks.path(), {.batch = 4, .seq = 1024, .rank = r, .ranks = n});
//   std::vector<std::int32_t> x(4 * 1024), y(4 * 1024);
//   loader.batch(step, x, y);                                 // (B, T) inputs, targets shifted by one
//
// Token file (llm.c's): 256 little-endian int32 of header — magic 20240520,
// version, token count n, the rest zero — then n tokens: version 1 uint16
// (GPT-2's vocabulary), the file exactly 1024 + 2n bytes; version 2 uint32
// (vocabularies past 65,535, as llm.c writes them for Llama 3), 1024 + 4n.
//
// In order, rank r of N reads batch i at token offset
//   (r + (i mod W) * N) * B*T,   W = floor((n - 1) / (N*B*T))
// (B*T+1 consecutive tokens, the last one only as a target), so N ranks of
// batch B read together exactly what one rank of batch N*B reads, rank 0's
// rows first, and every W batches the data starts again from the top. Shuffled,
// batch i of rank r starts at a Philox draw from (seed, i, r), uniform over
// every offset where a window fits.
#pragma once

#include <zinf/util.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace zinf::data {

inline constexpr std::int32_t kMagic = 20240520;       // header[0]
inline constexpr std::int32_t kVersion = 1;            // header[1]: uint16 tokens
inline constexpr std::int32_t kVersionWide = 2;        // header[1]: uint32 tokens
inline constexpr std::size_t kHeaderInts = 256;        // int32 words
inline constexpr std::size_t kHeaderBytes = kHeaderInts * 4;
inline constexpr std::uint32_t kTextVocab = 256;       // byte-level tokens

// ---------------------------------------------------------------------------
namespace detail {
struct TokenFile;  // an open token file and what it was when opened (tokens.cpp)
}

// Tokens, uint16 or uint32, seen alike: a view of tokens in memory (the
// tokens must outlive it) or of a range of a token file (Tokens::open; the
// Tokens must outlive it), indexed and iterated as uint32 values. A file's
// tokens are read when asked for: read() a range at a time (the loader's
// batches), operator[] one token (tests, a short prompt); either throws
// DataError (65) when the file has changed since it was opened and IoError
// (74) when the read fails, naming the file and the byte offset.
class TokenSpan {
public:
    TokenSpan() = default;
    template <class T>
        requires std::is_same_v<std::remove_const_t<T>, std::uint16_t> ||
                 std::is_same_v<std::remove_const_t<T>, std::uint32_t>
    TokenSpan(std::span<T> t) noexcept
        : p_(t.data()), n_(t.size()), wide_(std::is_same_v<std::remove_const_t<T>, std::uint32_t>) {}
    template <class T>
        requires std::is_same_v<T, std::uint16_t> || std::is_same_v<T, std::uint32_t>
    TokenSpan(const std::vector<T>& t) noexcept : TokenSpan(std::span<const T>(t)) {}
    // Tokens [first, first + count) of an open token file.
    TokenSpan(const detail::TokenFile* file, std::size_t first, std::size_t count, bool wide) noexcept
        : file_(file), first_(first), n_(count), wide_(wide) {}

    std::size_t size() const noexcept { return n_; }
    bool empty() const noexcept { return n_ == 0; }
    bool wide() const noexcept { return wide_; }  // uint32 tokens
    // The tokens in memory; nullptr for a file's.
    const void* data() const noexcept { return p_; }
    std::uint32_t operator[](std::size_t i) const {
        if (!file_) return wide_ ? static_cast<const std::uint32_t*>(p_)[i] : static_cast<const std::uint16_t*>(p_)[i];
        std::uint32_t v = 0;
        read(i, std::span(&v, 1));
        return v;
    }
    // Tokens [first, first + out.size()) into `out`.
    void read(std::size_t first, std::span<std::uint32_t> out) const;
    // Every token, in order, in pieces of at most `piece` tokens: a file's
    // read a piece at a time.
    void scan(const std::function<void(std::span<const std::uint32_t>)>& fn, std::size_t piece = 1 << 20) const;
    TokenSpan subspan(std::size_t offset, std::size_t count) const noexcept {
        TokenSpan t = *this;
        if (file_) t.first_ += offset;
        else t.p_ = static_cast<const char*>(p_) + offset * (wide_ ? 4 : 2);
        t.n_ = count;
        return t;
    }
    TokenSpan first(std::size_t n) const noexcept { return subspan(0, n); }
    TokenSpan last(std::size_t n) const noexcept { return subspan(n_ - n, n); }

    class iterator {
    public:
        using value_type = std::uint32_t;
        using difference_type = std::ptrdiff_t;
        iterator() = default;
        iterator(const TokenSpan* s, std::size_t i) : s_(s), i_(i) {}
        std::uint32_t operator*() const { return (*s_)[i_]; }
        iterator& operator++() { ++i_; return *this; }
        iterator operator++(int) { iterator t = *this; ++i_; return t; }
        difference_type operator-(const iterator& o) const { return static_cast<difference_type>(i_ - o.i_); }
        bool operator==(const iterator& o) const { return i_ == o.i_; }
    private:
        const TokenSpan* s_ = nullptr;
        std::size_t i_ = 0;
    };
    iterator begin() const { return {this, 0}; }
    iterator end() const { return {this, n_}; }

private:
    const void* p_ = nullptr;
    const detail::TokenFile* file_ = nullptr;
    std::size_t first_ = 0;  // a file's: the index of the view's first token
    std::size_t n_ = 0;
    bool wide_ = false;
};

// A run's tokens: an open llm.c token file, or a text file's bytes widened
// to tokens 0..255. Move-only; tokens() stays valid across moves.
class Tokens {
public:
    Tokens();
    ~Tokens();
    Tokens(Tokens&&) noexcept;
    Tokens& operator=(Tokens&&) noexcept;

    // Opens an llm.c token file, version 1 or 2, and reads it through once
    // (its largest token). MissingInputError when absent; DataError naming
    // the file and what is wrong (with the byte offset of a bad header
    // field) when it is shorter than the header, has another magic or
    // version, holds zero (or a negative number of) tokens, or is not
    // 1024 + 2n (version 2: 4n) bytes long.
    static Tokens open(const std::string& path);
    // Every byte of the file is a token (vocabulary 256), read into memory.
    // DataError when empty.
    static Tokens text(const std::string& path);

    TokenSpan tokens() const noexcept { return tokens_; }
    int version() const noexcept { return tokens_.wide() ? kVersionWide : kVersion; }
    const std::string& path() const noexcept { return path_; }
    // The largest token, found once when the tokens were opened.
    std::uint32_t max_token() const noexcept { return max_token_; }

private:
    std::string path_;
    std::unique_ptr<detail::TokenFile> file_;  // a token file
    std::vector<std::uint16_t> text_;          // a text file's bytes, as tokens
    TokenSpan tokens_;
    std::uint32_t max_token_ = 0;
};

// Writes an llm.c token file (version 1) atomically: a temporary name in the
// same folder, fsync, rename, fsync of the folder. DataError when `tokens` is
// empty or holds more than INT32_MAX tokens (the header could not say so);
// CreateError/IoError naming the file when the system refuses.
void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens);
// The same in version 2 (uint32 tokens).
void write_wide_token_file(const std::string& path, std::span<const std::uint32_t> tokens);

// A token file written as its tokens come (zinf-tokenize's output, whatever
// the corpus size): version 1 or 2 chosen up front, a header rewritten with
// the count at commit(), complete or absent as write_token_file's. The
// constructor creates the temporary (CreateError naming it).
class TokenFileWriter {
public:
    TokenFileWriter(const std::string& path, bool wide);
    // Appends `tokens`; a token past 65,535 in a version 1 file is an
    // InternalError (the caller chose the width from the vocabulary).
    void append(std::span<const std::uint32_t> tokens);
    std::uint64_t count() const noexcept { return count_; }
    bool wide() const noexcept { return wide_; }
    // Moves the last `n` tokens into `to` (appended there) and drops them
    // here, through a bounded buffer: the held-out split of a file too large
    // to hold.
    void move_tail(std::uint64_t n, TokenFileWriter& to);
    // Writes the header, commits. DataError naming the file when it holds no
    // token, or more than INT32_MAX (its header could not count them).
    void commit();
    const std::string& path() const noexcept { return file_.path(); }

private:
    void flush();
    AtomicFile file_;
    bool wide_;
    std::uint64_t count_ = 0;
    std::uint64_t synced_ = 0;       // bytes of the file the last sync behind covered
    std::vector<std::byte> buffer_;  // tokens not yet written, as they lie on disk
};

// How many of `n` tokens the held-out split takes (split's rule: the last
// ceil(n * val_fraction), a product within rounding of a whole number that
// number). UsageError unless 0 <= val_fraction <= 0.5.
std::uint64_t val_count(std::uint64_t n, double val_fraction);

// DataError "<file>: token <v> at token offset <i> is not below the model's
// vocabulary <V>" for the first such token; returns at once when max_token()
// is below `vocab`.
void check_vocab(const Tokens& tokens, std::uint64_t vocab);

// (train, val): val is the last ceil(n * val_fraction) tokens, train the rest
// before them (a product within rounding of a whole number counts as that
// number: 100 * 0.07 gives 7, not 8). UsageError unless 0 <= val_fraction <= 0.5.
std::pair<TokenSpan, TokenSpan> split(TokenSpan tokens, double val_fraction);

// Entropy of the tokens' frequency distribution, -sum p ln p, in nats: the
// loss of a model that learnt only how often each token occurs. 0 when empty.
double unigram_entropy_nats(TokenSpan tokens);

// ---------------------------------------------------------------------------
struct LoaderOptions {
    std::uint64_t batch = 0, seq = 0;  // B rows of T tokens per rank and batch
    unsigned rank = 0, ranks = 1;      // this rank of the data-parallel ranks
    bool shuffle = false;              // windows at random offsets instead of in order
    std::uint64_t seed = 0;            // for shuffle
};

// Batches of (B, T) inputs and targets by batch index, stateless: batch(i)
// depends only on the tokens, the options and i. The tokens must outlive it.
class Loader {
public:
    // UsageError when batch or seq is 0 or B*T overflows; InternalError when
    // rank >= ranks; DataError "<source>: <n> tokens, fewer than one global
    // batch needs (...)" when the tokens hold fewer than N*B*T + 1 (also when
    // shuffled, so that a run's data does not depend on the flag).
    Loader(TokenSpan tokens, std::string source, LoaderOptions opts);

    // inputs (B, T) = tokens[offset(index) ...], targets (B, T) the same one
    // token later. InternalError unless both spans hold exactly B*T.
    void batch(std::uint64_t index, std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const;
    // W: the global batches that fit in order, before the data wraps.
    std::uint64_t windows() const noexcept { return windows_; }
    // First token of batch `index` on this rank (see the top of this file).
    std::uint64_t offset(std::uint64_t index) const;

    std::uint64_t batch_tokens() const noexcept { return bt_; }  // B*T
    const LoaderOptions& options() const noexcept { return opts_; }
    const std::string& source() const noexcept { return source_; }

private:
    TokenSpan tokens_;
    std::string source_;
    LoaderOptions opts_;
    std::uint64_t bt_ = 0;       // B*T
    std::uint64_t windows_ = 0;  // W
};

}  // namespace zinf::data
