// The text module's own parts: UTF-8 helpers, Unicode normalization
// (utf8proc), the byte-level alphabet, regexes (PCRE2) and a flat hash map.
#pragma once

#include <zinf/text.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zinf::text {

// --- UTF-8 ------------------------------------------------------------------
// The length of the well-formed UTF-8 character at s[i], or 0 when the bytes
// there are not one (overlong, surrogate, past U+10FFFF, truncated).
std::size_t utf8_char(std::string_view s, std::size_t i) noexcept;
// The offset of the first byte of s that is not well-formed UTF-8, or npos.
std::size_t utf8_invalid(std::string_view s) noexcept;
// How many bytes at the end of s begin a character that has not ended.
std::size_t utf8_incomplete_tail(std::string_view s) noexcept;
void append_utf8(std::string& out, char32_t c);
// The code point at s[i] (well-formed, length n).
char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t n) noexcept;
// Unicode's White_Space and alphanumeric (Alphabetic or Numeric), as
// Hugging Face's added tokens test the characters around them.
bool is_white_space(char32_t c) noexcept;
bool is_alphanumeric(char32_t c) noexcept;

// --- the byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------
// Byte b is written as the character byte_char(b): the printable bytes as
// themselves, the others as U+0100 onwards.
char32_t byte_char(std::uint8_t b) noexcept;
// The byte a character stands for, or -1 when it is not one of the 256.
int char_byte(char32_t c) noexcept;
// A token's text in that alphabet as the bytes it stands for; nullopt when
// one of its characters is not in the alphabet.
std::optional<std::string> from_byte_chars(std::string_view token);

// --- normalization -----------------------------------------------------------
enum class NormalForm { nfc, nfd, nfkc, nfkd };
// Appends `text` in that form to `out`: well-formed stretches through
// utf8proc, bytes that are not UTF-8 as they are; stretches of ASCII,
// which every form leaves alone, copied.
void normalize(std::string_view text, NormalForm form, std::string& out);

// --- regexes -----------------------------------------------------------------
// Oniguruma's syntax, as Hugging Face's tokenizers compile a tokenizer.json's
// patterns, in PCRE2's: \s \S as White_Space, \w \W \b \B as Oniguruma's word
// characters, \h \H as hex digits, \uHHHH, POSIX brackets by Unicode
// property. DataError (message only) for what has no translation (a class
// inside a class, &&, \G, \W or \H inside a class, an unknown POSIX class).
std::string oniguruma_to_pcre2(std::string_view pattern);

class Regex {
public:
    // Compiles `pattern` (PCRE2 syntax) with UTF, Unicode properties,
    // matching of invalid UTF-8 (never matched, as if a character of its
    // own), ^ and $ at newlines, and JIT. DataError naming `where`, PCRE2's
    // message and the offset in the pattern.
    static std::shared_ptr<const Regex> compile(const std::string& pattern, const std::string& where);
    // A pattern that matches `text` literally.
    static std::string quote(std::string_view text);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // One thread's scratch for matching (PCRE2's match data and JIT stack).
    class Scratch {
    public:
        Scratch();
        ~Scratch();
        Scratch(const Scratch&) = delete;
        Scratch& operator=(const Scratch&) = delete;
        struct Impl;
        std::unique_ptr<Impl> impl;
    };

    // The matches in `subject`, as (start, end) offsets, in order, as
    // find_iter makes them (after an empty match the next search starts a
    // character later). `open_end`: the subject's end is not the text's
    // (more may follow): a match that would look past it is not taken, and
    // the scan stops before it. Returns where the matches are final up to:
    // subject.size() unless open_end, else the end of the last match taken
    // (everything from there on may change with what follows). DataError
    // (message only, with the offset) when the match runs out of room.
    std::size_t find_all(std::string_view subject, bool open_end, Scratch& scratch,
                         std::vector<std::pair<std::uint32_t, std::uint32_t>>& matches) const;

    // One step of find_all: the first match at or after `from`, as (start,
    // end) in `match`. Returns found, none, or (open_end) partial: a match
    // there might need what follows the subject, and the scan stops.
    enum class Next { found, none, partial };
    Next next(std::string_view subject, std::size_t from, bool open_end, Scratch& scratch,
              std::pair<std::size_t, std::size_t>& match) const;
    // Where the scan goes after `match`: its end, or a character on after an empty one.
    static std::size_t after(std::string_view subject, std::pair<std::size_t, std::size_t> match);

private:
    Regex() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// --- a flat hash map from 64-bit keys ---------------------------------------
// Open addressing, linear probing; the key ~0 is reserved (never a key).
template <class V>
class FlatMap {
public:
    static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
    void reserve(std::size_t n) {
        std::size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        keys_.assign(cap, kEmpty);
        values_.assign(cap, V{});
        mask_ = cap - 1;
        size_ = 0;
    }
    // Inserts or overwrites.
    void put(std::uint64_t key, const V& v) {
        if (keys_.empty() || (size_ + 1) * 2 > keys_.size()) grow();
        std::size_t i = slot(key);
        while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
        if (keys_[i] == kEmpty) ++size_;
        keys_[i] = key;
        values_[i] = v;
    }
    const V* get(std::uint64_t key) const noexcept {
        if (keys_.empty()) return nullptr;
        for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
            if (keys_[i] == key) return &values_[i];
            if (keys_[i] == kEmpty) return nullptr;
        }
    }
    std::size_t size() const noexcept { return size_; }

private:
    std::size_t slot(std::uint64_t key) const noexcept {
        key ^= key >> 33;
        key *= 0xff51afd7ed558ccdULL;
        key ^= key >> 33;
        return static_cast<std::size_t>(key) & mask_;
    }
    void grow() {
        std::vector<std::uint64_t> keys = std::move(keys_);
        std::vector<V> values = std::move(values_);
        reserve(std::max<std::size_t>(16, keys.size()));
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] != kEmpty) put(keys[i], values[i]);
    }
    std::vector<std::uint64_t> keys_;
    std::vector<V> values_;
    std::size_t mask_ = 0, size_ = 0;
};

// The tokenizers open() knows besides tokenizer.json.
std::unique_ptr<Tokenizer> open_llmc(const std::string& path);
std::unique_ptr<Tokenizer> open_sentencepiece(const std::string& path);
std::unique_ptr<Tokenizer> open_hf(const std::string& path);

}  // namespace zinf::text
