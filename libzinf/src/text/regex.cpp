// Tokenizer regexes: Oniguruma's syntax translated to PCRE2's, and matching
// with PCRE2's JIT (partial matching where the text goes on past the subject).
#include "internal.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace zinf::text {

namespace {

// Oniguruma's word characters, as its Unicode tables have them (letters,
// marks, decimal digits, connector punctuation, and the Latin-1 superscripts
// and fractions it counts).
constexpr std::string_view kWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr std::string_view kHex = "0-9A-Fa-f";

std::string word_class() { return "[" + std::string(kWord) + "]"; }
std::string non_word_class() { return "[^" + std::string(kWord) + "]"; }

[[noreturn]] void untranslatable(const std::string& what, std::size_t at) {
    throw DataError(what + " (at offset " + std::to_string(at) + " of the pattern) has no PCRE2 equivalent here");
}

// [:name:] inside a class, by Unicode property as Oniguruma reads them.
std::string posix_class(std::string_view name, bool negated, std::size_t at) {
    struct Entry {
        std::string_view name, members;
        std::string_view single;  // the one property, for [:^name:]
    };
    static constexpr Entry table[] = {
        {"alpha", "\\p{Alphabetic}", "Alphabetic"},
        {"alnum", "\\p{Alphabetic}\\p{Nd}", ""},
        {"digit", "\\p{Nd}", "Nd"},
        {"lower", "\\p{Lowercase}", "Lowercase"},
        {"upper", "\\p{Uppercase}", "Uppercase"},
        {"space", "\\p{White_Space}", "White_Space"},
        {"blank", "\\t\\p{Zs}", ""},
        {"punct", "\\p{P}\\p{S}", ""},
        {"cntrl", "\\p{Cc}", "Cc"},
        {"word", kWord, ""},
        {"xdigit", kHex, ""},
    };
    for (const Entry& e : table) {
        if (e.name != name) continue;
        if (!negated) return std::string(e.members);
        if (e.single.empty()) untranslatable("[:^" + std::string(name) + ":] inside a class", at);
        return "\\P{" + std::string(e.single) + "}";
    }
    untranslatable("the POSIX class [:" + std::string(name) + ":]", at);
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
    std::string out;
    out.reserve(p.size() * 2);
    bool in_class = false;
    for (std::size_t i = 0; i < p.size();) {
        const char c = p[i];
        if (c == '\\') {
            if (i + 1 >= p.size()) {
                out += c;  // PCRE2 says what is wrong with it
                ++i;
                continue;
            }
            const char e = p[i + 1];
            switch (e) {
            case 's': out += "\\p{White_Space}"; break;
            case 'S': out += "\\P{White_Space}"; break;
            case 'w': out += in_class ? std::string(kWord) : word_class(); break;
            case 'W':
                if (in_class) untranslatable("\\W inside a class", i);
                out += non_word_class();
                break;
            case 'h': out += in_class ? std::string(kHex) : "[" + std::string(kHex) + "]"; break;
            case 'H':
                if (in_class) untranslatable("\\H inside a class", i);
                out += "[^" + std::string(kHex) + "]";
                break;
            case 'b':
                if (in_class) {
                    out += "\\x08";  // a backspace, in both
                } else {
                    const std::string w = word_class();
                    out += "(?:(?<!" + w + ")(?=" + w + ")|(?<=" + w + ")(?!" + w + "))";
                }
                break;
            case 'B': {
                if (in_class) untranslatable("\\B inside a class", i);
                const std::string w = word_class();
                out += "(?:(?<!" + w + ")(?!" + w + ")|(?<=" + w + ")(?=" + w + "))";
                break;
            }
            case 'G': untranslatable("\\G", i);
            case 'u': {
                if (i + 6 > p.size() || p.substr(i + 2, 4).find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos)
                    untranslatable("\\u without four hex digits", i);
                out += "\\x{" + std::string(p.substr(i + 2, 4)) + "}";
                i += 6;
                continue;
            }
            default: out += c; out += e; break;
            }
            i += 2;
            continue;
        }
        if (c == '[') {
            if (in_class) {
                if (i + 1 < p.size() && p[i + 1] == ':') {
                    const std::size_t close = p.find(":]", i + 2);
                    if (close == std::string_view::npos) untranslatable("a [: without :]", i);
                    std::string_view name = p.substr(i + 2, close - i - 2);
                    const bool negated = !name.empty() && name[0] == '^';
                    if (negated) name.remove_prefix(1);
                    out += posix_class(name, negated, i);
                    i = close + 2;
                    continue;
                }
                untranslatable("a character class inside a character class", i);
            }
            in_class = true;
            out += c;
            ++i;
            if (i < p.size() && p[i] == '^') out += p[i++];
            if (i < p.size() && p[i] == ']') out += p[i++];  // a ] first is itself
            continue;
        }
        if (in_class && c == ']') in_class = false;
        if (in_class && c == '&' && i + 1 < p.size() && p[i + 1] == '&') untranslatable("a class intersection (&&)", i);
        out += c;
        ++i;
    }
    return out;
}

std::string Regex::quote(std::string_view text) {
    std::string out;
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        const bool plain = u >= 0x80 || (u >= '0' && u <= '9') || ((u | 0x20) >= 'a' && (u | 0x20) <= 'z') || u == '_';
        if (!plain) {
            if (u < 0x20 || u == 0x7F) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x{%02x}", u);
                out += buf;
                continue;
            }
            out += '\\';
        }
        out += c;
    }
    return out;
}

struct Regex::Impl {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Impl() { pcre2_code_free(code); }
};

struct Regex::Scratch::Impl {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mc = nullptr;
    pcre2_jit_stack* stack = nullptr;
    Impl() {
        md = pcre2_match_data_create(1, nullptr);
        mc = pcre2_match_context_create(nullptr);
        // Backtracking over a long run (a megabyte of spaces under \s+(?!\S))
        // outgrows the JIT's default 32 KiB stack; this grows to 64 MiB.
        stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
        if (!md || !mc || !stack) throw std::bad_alloc();
        pcre2_jit_stack_assign(mc, nullptr, stack);
    }
    ~Impl() {
        pcre2_jit_stack_free(stack);
        pcre2_match_context_free(mc);
        pcre2_match_data_free(md);
    }
};

Regex::Scratch::Scratch() : impl(std::make_unique<Impl>()) {}
Regex::Scratch::~Scratch() = default;
Regex::~Regex() = default;

std::shared_ptr<const Regex> Regex::compile(const std::string& pattern, const std::string& where) {
    pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
    if (!cc) throw std::bad_alloc();
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);  // . and ^ $ as Oniguruma's: only \n ends a line
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &err, &at, cc);
    pcre2_compile_context_free(cc);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        throw DataError(where + ": the regex does not compile: " + reinterpret_cast<const char*>(msg) +
                        " at offset " + std::to_string(at) + " of " + pattern);
    }
    std::shared_ptr<Regex> r(new Regex);
    r->impl_ = std::make_unique<Impl>();
    r->impl_->code = code;
    // Without a JIT (a platform PCRE2 has none for) the interpreter runs it.
    r->impl_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
    return r;
}

Regex::Next Regex::next(std::string_view subject, std::size_t from, bool open_end, Scratch& scratch,
                        std::pair<std::size_t, std::size_t>& match) const {
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const std::size_t n = subject.size();
    Scratch::Impl& x = *scratch.impl;
    const std::uint32_t options = open_end ? PCRE2_PARTIAL_HARD : 0;
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, n, from, options, x.md, x.mc)
                        : pcre2_match(impl_->code, s, n, from, options, x.md, x.mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
        rc = pcre2_match(impl_->code, s, n, from, options | PCRE2_NO_JIT, x.md, x.mc);
    if (rc == PCRE2_ERROR_NOMATCH) return Next::none;
    if (rc == PCRE2_ERROR_PARTIAL) return Next::partial;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw DataError(std::string("the pre-tokenizer's regex failed at byte ") + std::to_string(from) + " of a " +
                        std::to_string(n) + "-byte piece: " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(x.md);
    match = {ov[0], ov[1]};
    return Next::found;
}

std::size_t Regex::after(std::string_view subject, std::pair<std::size_t, std::size_t> m) {
    if (m.second > m.first) return m.second;
    if (m.first >= subject.size()) return subject.size() + 1;  // the end: no more
    const std::size_t len = utf8_char(subject, m.first);
    return m.first + (len ? len : 1);
}

std::size_t Regex::find_all(std::string_view subject, bool open_end, Scratch& scratch,
                            std::vector<std::pair<std::uint32_t, std::uint32_t>>& matches) const {
    std::size_t pos = 0, last_end = 0;
    std::pair<std::size_t, std::size_t> m;
    while (pos <= subject.size()) {
        const Next r = next(subject, pos, open_end, scratch, m);
        if (r == Next::none) break;
        if (r == Next::partial) return last_end;
        matches.emplace_back(static_cast<std::uint32_t>(m.first), static_cast<std::uint32_t>(m.second));
        last_end = m.second;
        pos = after(subject, m);
    }
    return open_end ? last_end : subject.size();
}

}  // namespace zinf::text
