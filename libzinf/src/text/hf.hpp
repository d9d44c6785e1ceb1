// Hugging Face's tokenizer.json, as zinf holds it once read (hf_json.cpp)
// and runs it (hf.cpp, bpe.cpp): the pipeline of normalizers,
// added tokens, pre-tokenizer steps, the BPE model, the decoders and the
// post-processor's tokens.
#pragma once

#include "internal.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <variant>

namespace zinf::text::hf {

inline constexpr Id kNone = ~Id{0};

// A transparent string hash, so that maps of std::string keys are looked up
// by string_view without a copy.
struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, Id, StringHash, std::equal_to<>>;

// --- normalizers -------------------------------------------------------------
struct Normalize {
    NormalForm form;
};
struct Prepend {
    std::string text;  // put before a text that does not start with it... always (as Hugging Face does)
};
// Replace, the normalizer and the decoder alike.
struct Replace {
    std::string literal;                  // a String pattern
    std::shared_ptr<const Regex> regex;   // or a Regex one
    std::string content;
    // Appends `in` with every match replaced by `content` (an empty String
    // pattern matches nothing).
    void apply(std::string_view in, std::string& out, Regex::Scratch& scratch) const;
};
using Normalizer = std::variant<Normalize, Prepend, Replace>;

// --- pre-tokenizer steps -----------------------------------------------------
// Split: Split itself, Digits, ByteLevel's regex and Metaspace's split.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
struct Split {
    std::shared_ptr<const Regex> regex;
    Behavior behavior = Behavior::isolated;
    bool invert = false;
    std::string name;  // where it came from, for messages
};
// A prefix put before each piece that does not start with it (ByteLevel's
// add_prefix_space; Metaspace's prepend_scheme, which also counts a space
// as its replacement, as it sees the text after replacing spaces).
struct Prefix {
    std::string text;
    bool first_only = false;   // only at the document's first byte ("first")
    bool or_space = false;     // a piece starting with a space has it already
};
using Step = std::variant<Split, Prefix>;

// --- decoders ----------------------------------------------------------------
struct ByteLevelDecode {};
struct ByteFallbackDecode {};
struct FuseDecode {};
struct StripDecode {
    std::string content;
    std::size_t start = 0, stop = 0;
};
struct MetaspaceDecode {
    std::string replacement;
    bool strip_first = true;  // the first token's leading space (the prepended one) is dropped
};
using Decode = std::variant<ByteLevelDecode, Replace, ByteFallbackDecode, FuseDecode, StripDecode, MetaspaceDecode>;

// --- added tokens ------------------------------------------------------------
struct Added {
    Id id;
    std::string content;
    bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Leftmost-longest matching of added tokens in a text.
class AddedMatcher {
public:
    void build(const std::vector<const Added*>& tokens);
    bool empty() const noexcept { return tokens_.empty(); }
    // Where each token occurs in `text`, in order, after single_word,
    // lstrip and rstrip as Hugging Face applies them: (start, stop, token).
    struct Match {
        std::size_t start, stop;
        const Added* token;
    };
    void find(std::string_view text, std::vector<Match>& out) const;

private:
    std::vector<const Added*> tokens_;
    std::array<std::vector<std::uint32_t>, 256> by_first_;  // token indices by first byte, longest first
};

// --- the BPE model -----------------------------------------------------------
struct Bpe {
    // Byte-level: the model's units are bytes (its vocabulary's byte-level
    // characters read back as the bytes they stand for); else UTF-8 characters.
    bool byte_level = false;
    bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
    Id unk = kNone;
    std::array<Id, 256> byte_ids{};      // byte-level: each byte's id (kNone: not in the vocabulary)
    std::array<Id, 256> fallback_ids{};  // byte_fallback: <0xXX>'s id
    StringMap units;                     // the vocabulary by the model's units
    FlatMap<std::uint64_t> merges;       // (left << 32 | right) -> (rank << 32 | merged)
    std::size_t merge_count = 0;
};

// One thread's BPE state: the words seen and their ids, in one open
// addressing table over two arenas (the words' bytes, their ids), emptied
// whole when full: what it holds changes no result.
class BpeCache {
public:
    explicit BpeCache(std::size_t max_bytes = 16 * MiB);
    // The ids of `word`, or an empty span when it is not held.
    std::span<const Id> get(std::string_view word, std::uint64_t hash) const;
    void put(std::string_view word, std::uint64_t hash, std::span<const Id> ids);
    static std::uint64_t hash(std::string_view word);

private:
    struct Slot {
        std::uint64_t hash = 0;
        std::uint32_t key = 0, key_len = 0, ids = 0, ids_len = 0;  // into the arenas; key_len 0: empty
    };
    void clear();
    void grow();  // twice the slots, every word held again
    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<Id> ids_;
    std::size_t used_ = 0, max_bytes_, max_slots_ = 0;
};

// The words seen by every thread of one job and their ids: one open
// addressing table of 64-bit slots (a tag of the word's hash and where its
// entry lies) over one arena of entries (the hash, the lengths, the word's
// bytes and its ids), written by any thread and read by all without a lock.
// An entry is written whole before a compare-and-swap publishes its slot
// (release), and read only after its slot was loaded (acquire); entries are
// never changed or removed. The table doubles while the arena has room (a
// new table published whole; a word put into the old one meanwhile may be
// missed, which only costs its merges again); when the arena is full, the
// cache takes no more words and says so (full()), and each thread keeps the
// later ones in its own BpeCache. What it holds changes no id.
class SharedBpeCache final : public SharedCache {
public:
    explicit SharedBpeCache(std::size_t max_bytes);
    ~SharedBpeCache() override;
    std::span<const Id> get(std::string_view word, std::uint64_t hash) const;
    // False when the word was not kept (the arena or table full, or too long).
    bool put(std::string_view word, std::uint64_t hash, std::span<const Id> ids);
    bool full() const { return full_.load(std::memory_order_relaxed); }
    std::size_t words() const { return words_.load(std::memory_order_relaxed); }

private:
    struct Table {
        std::size_t mask;
        std::unique_ptr<std::atomic<std::uint64_t>[]> slots;
    };
    struct Entry {
        std::uint64_t hash;
        std::uint32_t key_len, ids_len;  // then the ids, then the word's bytes
    };
    const Entry* entry(std::uint64_t slot) const;
    static bool place(Table& t, std::uint64_t hash, std::uint64_t slot);
    void grow(Table* from);
    // What every lookup reads, on a cache line of its own: the counters
    // that every new word writes shared its line once, and each write took
    // the line from the other cores' lookups (two threads on a 10 MB text
    // spent 9% more time encoding than one, against 3% for two processes).
    alignas(64) std::unique_ptr<std::byte[]> arena_;
    std::size_t arena_bytes_, max_slots_;
    std::atomic<Table*> table_;
    std::atomic<bool> full_{false};
    alignas(64) std::atomic<std::size_t> arena_used_{0}, words_{0};
    alignas(64) std::mutex grow_mu_;
    std::vector<std::unique_ptr<Table>> tables_;  // every table made (readers may hold an old one)
};

// Appends the ids of one piece (a pre-tokenizer's output) to `out`.
// DataError (message only) when a unit is not in the vocabulary and there is
// neither byte fallback nor an unknown token, in a byte-level model or for a
// byte that is not UTF-8.
// `shared`, where given, is looked in first and kept in while it has room;
// `cache` after it is full.
void bpe_encode(const Bpe& m, std::string_view piece, BpeCache& cache, SharedBpeCache* shared, std::vector<Id>& out,
                std::vector<Id>& scratch);

// --- the whole ----------------------------------------------------------------
struct Pipeline {
    std::string path;
    std::vector<Normalizer> normalizers;
    std::vector<Step> steps;
    bool byte_level = false;         // a ByteLevel pre-tokenizer maps the pieces to bytes
    std::string metaspace;           // a Metaspace pre-tokenizer replaces spaces with this in each piece
    std::vector<Added> added;
    AddedMatcher raw_added, normalized_added;  // matched before and after the normalizers
    Bpe bpe;
    std::vector<Decode> decoders;
    bool has_decoder = false;
    std::vector<Id> begin_ids, end_ids;
    std::vector<std::string> id_text;       // every id's token, as the file spells it ("" for a hole)
    std::vector<std::string> id_bytes;      // ByteLevel-decoded, when the decoders are ByteLevel alone
    std::vector<std::uint8_t> id_special;   // an added token marked special
    std::uint64_t vocab = 0;
    std::optional<Id> end_of_text;
    bool cuts_lines = false;
    RoundTrip round_trip = RoundTrip::none;
    std::string description;
};

// Reads a tokenizer.json (DataError naming `source` and what is wrong).
std::shared_ptr<const Pipeline> load(std::string_view json, const std::string& source);

}  // namespace zinf::text::hf
