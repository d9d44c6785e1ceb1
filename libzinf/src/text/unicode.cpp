// UTF-8, the byte-level alphabet and Unicode normalization (utf8proc).
#include "internal.hpp"

#include <utf8proc.h>

#include <cstdlib>
#include <mutex>

namespace zinf::text {

std::size_t utf8_char(std::string_view s, std::size_t i) noexcept {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
    const std::size_t left = s.size() - i;
    const unsigned c = b(0);
    if (c < 0x80) return 1;
    auto cont = [&](std::size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (!cont(1) || !cont(2)) return 0;
        if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
        if (c == 0xED && b(1) >= 0xA0) return 0; // a surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (!cont(1) || !cont(2) || !cont(3)) return 0;
        if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
        if (c == 0xF4 && b(1) >= 0x90) return 0; // past U+10FFFF
        return 4;
    }
    return 0;
}

std::size_t utf8_invalid(std::string_view s) noexcept {
    for (std::size_t i = 0; i < s.size();) {
        if (static_cast<unsigned char>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const std::size_t n = utf8_char(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

std::size_t utf8_incomplete_tail(std::string_view s) noexcept {
    // A character is at most 4 bytes: look at the last 3 for a lead byte
    // whose character runs past the end.
    for (std::size_t back = 1; back <= 3 && back <= s.size(); ++back) {
        const auto c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        const std::size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > back ? back : 0;
    }
    return 0;
}

void append_utf8(std::string& out, char32_t c) {
    if (c < 0x80) {
        out += static_cast<char>(c);
    } else if (c < 0x800) {
        out += static_cast<char>(0xC0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        out += static_cast<char>(0xE0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
    }
}

char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t n) noexcept {
    const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
    switch (n) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    }
}

bool is_white_space(char32_t c) noexcept {
    // Unicode's White_Space property (PropList.txt; unchanged since 6.3).
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_alphanumeric(char32_t c) noexcept {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    // Alphabetic is not among utf8proc's properties; PCRE2 knows it.
    static const auto re = Regex::compile("[\\p{Alphabetic}\\p{N}]", "is_alphanumeric");
    static thread_local Regex::Scratch scratch;
    std::string one;
    append_utf8(one, c);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> m;
    re->find_all(one, false, scratch, m);
    return !m.empty();
}

namespace {
struct ByteAlphabet {
    std::array<char32_t, 256> to_char{};
    ByteAlphabet() {
        // GPT-2's bytes_to_unicode: '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF
        // stand for themselves; the other 68 bytes, in order, for U+0100 on.
        char32_t next = 0x100;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            to_char[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
        }
    }
};
const ByteAlphabet& alphabet() {
    static const ByteAlphabet a;
    return a;
}
}  // namespace

char32_t byte_char(std::uint8_t b) noexcept { return alphabet().to_char[b]; }

int char_byte(char32_t c) noexcept {
    if (c < 0x100) {
        const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        return printable ? static_cast<int>(c) : -1;
    }
    if (c < 0x100 + 68) {
        static const auto from = [] {
            std::array<int, 68> f{};
            for (int b = 0; b < 256; ++b)
                if (const char32_t ch = byte_char(static_cast<std::uint8_t>(b)); ch >= 0x100) f[ch - 0x100] = b;
            return f;
        }();
        return from[c - 0x100];
    }
    return -1;
}

std::optional<std::string> from_byte_chars(std::string_view token) {
    std::string out;
    out.reserve(token.size());
    for (std::size_t i = 0; i < token.size();) {
        const std::size_t n = utf8_char(token, i);
        if (n == 0) return std::nullopt;
        const int b = char_byte(utf8_decode(token, i, n));
        if (b < 0) return std::nullopt;
        out += static_cast<char>(b);
        i += n;
    }
    return out;
}

namespace {
void normalize_utf8(std::string_view text, NormalForm form, std::string& out) {
    int options = UTF8PROC_STABLE;
    switch (form) {
    case NormalForm::nfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &dst,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) {
        std::free(dst);
        throw DataError(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
    }
    out.append(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
    std::free(dst);
}
}  // namespace

void normalize(std::string_view text, NormalForm form, std::string& out) {
    // Stretches are cut before every ASCII byte: no composition has an ASCII
    // second character and an ASCII starter ends every reordering, so no
    // form joins or reorders across such a cut. ASCII stretches are copied
    // (every form leaves them alone) but their last byte, which may compose
    // with the marks after it; bytes that are not UTF-8 are kept as they are.
    std::size_t from = 0;  // start of the stretch being gathered
    bool plain = true;     // the stretch is ASCII so far
    auto flush = [&](std::size_t to) {
        if (to == from) return;
        if (plain) out.append(text.substr(from, to - from));
        else normalize_utf8(text.substr(from, to - from), form, out);
        from = to;
    };
    for (std::size_t i = 0; i < text.size();) {
        if (static_cast<unsigned char>(text[i]) < 0x80) {
            if (!plain) {
                flush(i);
                plain = true;
            }
            ++i;
            continue;
        }
        const std::size_t n = utf8_char(text, i);
        if (n == 0) {
            flush(i);
            out += text[i];
            from = ++i;
            plain = true;
            continue;
        }
        if (plain) {
            if (i > from + 1) flush(i - 1);
            plain = false;
        }
        i += n;
    }
    flush(text.size());
}

}  // namespace zinf::text
