// text-corpus: the text tests/e2e/tokenize.sh tokenizes with zinf and with
// the reference tokenizers, drawn from a seed (printed):
//   DIR/corpus.jsonl   {"kind": ..., "text": ...} documents of valid UTF-8:
//     scripts     every script this PCRE2 knows (Unicode's, as of its
//                 tables), a block of words each, mixed with Latin and digits
//     digits      runs of every length from 1 to 80 and some longer, in
//                 every context, with other scripts' digits and numerals
//     whitespace  runs of spaces, tabs and Unicode's other spaces
//     newlines    \n, \r\n, \r, \v, \f, U+2028, U+2029, runs and mixes
//     emoji       sequences (ZWJ, skin tones, flags, keycaps, tags) and
//                 combining marks (stacked, Hangul jamo, viramas)
//     code        C++, Python, JavaScript, JSON, shell, contractions
//     specials    special tokens of several families inside text, and
//                 near misses
//     random      code points drawn from every script
//   DIR/nel.jsonl      the same kinds with U+0085 (NEL) and U+FEFF: JavaScript's
//                 \s excludes the one and includes the other, where Unicode's
//                 White_Space (Oniguruma's, Hugging Face's, zinf's) does the
//                 opposite; only references that follow Oniguruma read these
//   DIR/invalid.txt    text with bytes that are not UTF-8 of every kind
// Characters are drawn only from those this PCRE2 knows as assigned, so that
// a newer Unicode in the reference cannot disagree on a letter zinf has never
// heard of. "'" is never followed by U+017F (long s): PCRE2 and Oniguruma
// fold it to s in (?i:'s), JavaScript's ports do not.
#include "../../libzinf/src/text/internal.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

using namespace zinf;
using namespace zinf::text;

namespace {

// Unicode 15.1's scripts by their ISO 15924 codes; a code this PCRE2 does not
// know is said and left out.
constexpr const char* kScripts[] = {
    "Adlm", "Aghb", "Ahom", "Arab", "Armi", "Armn", "Avst", "Bali", "Bamu", "Bass", "Batk", "Beng", "Bhks", "Bopo",
    "Brah", "Brai", "Bugi", "Buhd", "Cakm", "Cans", "Cari", "Cham", "Cher", "Chrs", "Copt", "Cpmn", "Cprt", "Cyrl",
    "Deva", "Diak", "Dogr", "Dsrt", "Dupl", "Egyp", "Elba", "Elym", "Ethi", "Geor", "Glag", "Gong", "Gonm", "Goth",
    "Gran", "Grek", "Gujr", "Guru", "Hang", "Hani", "Hano", "Hatr", "Hebr", "Hira", "Hluw", "Hmng", "Hmnp", "Hung",
    "Ital", "Java", "Kali", "Kana", "Kawi", "Khar", "Khmr", "Khoj", "Kits", "Knda", "Kthi", "Lana", "Laoo", "Latn",
    "Lepc", "Limb", "Lina", "Linb", "Lisu", "Lyci", "Lydi", "Mahj", "Maka", "Mand", "Mani", "Marc", "Medf", "Mend",
    "Merc", "Mero", "Mlym", "Modi", "Mong", "Mroo", "Mtei", "Mult", "Mymr", "Nagm", "Nand", "Narb", "Nbat", "Newa",
    "Nkoo", "Nshu", "Ogam", "Olck", "Orkh", "Orya", "Osge", "Osma", "Ougr", "Palm", "Pauc", "Perm", "Phag", "Phli",
    "Phlp", "Phnx", "Plrd", "Prti", "Rjng", "Rohg", "Runr", "Samr", "Sarb", "Saur", "Sgnw", "Shaw", "Shrd", "Sidd",
    "Sind", "Sinh", "Sogd", "Sogo", "Sora", "Soyo", "Sund", "Sylo", "Syrc", "Tagb", "Takr", "Tale", "Talu", "Taml",
    "Tang", "Tavt", "Telu", "Tfng", "Tglg", "Thaa", "Thai", "Tibt", "Tirh", "Tnsa", "Toto", "Ugar", "Vaii", "Vith",
    "Wara", "Wcho", "Xpeo", "Xsux", "Yezi", "Yiii", "Zanb", "Zinh", "Zyyy"};

struct Gen {
    std::mt19937_64 rng;
    std::vector<std::vector<char32_t>> by_script;  // assigned code points of each known script
    std::vector<std::string> names;
    std::vector<char32_t> latin, all;

    std::uint64_t pick(std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng); }
    bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
    template <class T>
    const T& one(const std::vector<T>& v) { return v[pick(v.size())]; }
    std::string chars(const std::vector<char32_t>& pool, std::size_t n) {
        std::string s;
        for (std::size_t i = 0; i < n; ++i) append_utf8(s, one(pool));
        return s;
    }
};

bool matches(const Regex& re, char32_t c, Regex::Scratch& scratch) {
    std::string one;
    append_utf8(one, c);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> m;
    re.find_all(one, false, scratch, m);
    return !m.empty();
}

void scan(Gen& g) {
    Regex::Scratch scratch;
    std::vector<std::shared_ptr<const Regex>> each;
    for (const char* s : kScripts) {
        try {
            each.push_back(Regex::compile(std::string("\\p{sc:") + s + "}", s));
            g.names.push_back(s);
        } catch (const DataError&) {
            std::cerr << "text-corpus: script " << s << " is not in this PCRE2's tables: left out\n";
        }
    }
    const auto assigned = Regex::compile("[^\\p{Cn}\\p{Co}\\p{Cs}\\p{Cc}]", "assigned");
    g.by_script.assign(g.names.size(), {});
    // Planes 0 to 3 and the tags and variation selectors of plane 14: where
    // every script's characters are.
    for (char32_t c = 0x20; c < 0xE0200; ++c) {
        if (c == 0x40000) c = 0xE0000;
        if (c >= 0xD800 && c < 0xE000) continue;
        if (c == 0x85 || c == 0xFEFF || c == 0x17F) continue;  // the nel documents' (and the long s, see the top)
        if (!matches(*assigned, c, scratch)) continue;
        for (std::size_t i = 0; i < each.size(); ++i) {
            if (!matches(*each[i], c, scratch)) continue;
            g.by_script[i].push_back(c);
            if (g.names[i] == "Latn" && c < 0x250) g.latin.push_back(c);
            g.all.push_back(c);
            break;
        }
    }
    for (std::size_t i = 0; i < g.names.size(); ++i)
        if (g.by_script[i].empty()) std::cerr << "text-corpus: no assigned character of script " << g.names[i] << "\n";
}

std::string latin_word(Gen& g) {
    static const std::vector<std::string> words = {"the", "and", "Llama", "model", "token", "ZeRO", "offload", "GPU",
                                                   "zinf", "naïve", "café", "straße", "Œuvre", "über", "I", "a"};
    return g.one(words);
}

std::string separator(Gen& g) {
    static const std::vector<std::string> seps = {" ", " ", " ", ", ", ". ", "! ", "? ", "; ", ": ", " — ", " (",
                                                  ") ", "\n", " \"", "\" ", "' ", " '", "…", "-", "/", "  "};
    return g.one(seps);
}

std::string scripts_doc(Gen& g, std::size_t first, std::size_t count) {
    std::string s;
    for (std::size_t k = first; k < first + count && k < g.names.size(); ++k) {
        const auto& pool = g.by_script[k];
        if (pool.empty()) continue;
        for (int w = 0; w < 24; ++w) {
            if (g.chance(0.1)) s += latin_word(g);
            else if (g.chance(0.05)) s += std::to_string(g.pick(100000));
            else s += g.chars(pool, 1 + g.pick(8));
            s += separator(g);
        }
        s += "\n";
    }
    return s;
}

std::string digits_doc(Gen& g) {
    std::string s;
    static const std::vector<std::string> before = {" ", "", "x", "$", "#", "(", "v", "\n", "-", "+", "é", "中", "\t"};
    static const std::vector<std::string> after = {" ", "", "x", ".", ",", ")", "%", "\n", "th", "px", "中", "'s"};
    std::vector<int> lengths;
    for (int n = 1; n <= 80; ++n) lengths.push_back(n);
    for (int n : {100, 127, 128, 129, 255, 256, 1000, 2049}) lengths.push_back(n);
    for (int n : lengths) {
        s += g.one(before);
        for (int i = 0; i < n; ++i) s += static_cast<char>('0' + g.pick(10));
        s += g.one(after);
    }
    s += " 3.14159 2024-05-20 1,234,567.89 0x1F 1e-9 -42 +7 12:30 v1.2.3 ";
    // Other scripts' decimal digits, superscripts, fractions, Roman numerals.
    for (char32_t zero : {0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0xFF10, 0x1D7CE}) {
        s += ' ';
        for (int i = 0; i < 7; ++i) append_utf8(s, zero + static_cast<char32_t>(g.pick(10)));
    }
    s += " x² 10³ ½ ¾ Ⅻ ⅷ ① ⑳ 𝟘𝟙 ";
    return s;
}

std::string whitespace_doc(Gen& g) {
    static const std::vector<char32_t> spaces = {' ', '\t', 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                                 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x202F, 0x205F, 0x3000};
    std::string s = "   leading spaces";
    for (int n = 1; n <= 33; ++n) {
        s += "word";
        for (int i = 0; i < n; ++i) s += ' ';
        s += "w";
        for (int i = 0; i < n % 5 + 1; ++i) s += '\t';
        s += ".";
        for (int i = 0; i < n % 7 + 1; ++i) append_utf8(s, g.one(spaces));
        if (n % 4 == 0) s += "  \n";
    }
    s += "trailing   ";
    return s;
}

std::string newlines_doc(Gen& g, bool nel) {
    static const std::vector<std::string> kinds = {"\n", "\r\n", "\r", "\v", "\f", "\u2028", "\u2029", "\n\n",
                                                   "\n\n\n", "\r\n\r\n", " \n", "\n ", "\t\n", " \r\n ", "\n\t\t"};
    std::string s = "\n\nstart";
    for (int i = 0; i < 120; ++i) {
        s += g.chance(0.5) ? latin_word(g) : g.chars(g.latin, 1 + g.pick(6));
        s += g.one(kinds);
        if (nel && g.chance(0.3)) s += g.chance(0.5) ? "\u0085" : "\xEF\xBB\xBF";
        if (g.chance(0.2)) s += "!";
    }
    return s + "end\n";
}

std::string emoji_doc(Gen& g) {
    static const std::vector<std::string> pieces = {
        "😀", "👍🏽", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🇫🇷", "🇯🇵🇺🇸", "1️⃣", "#️⃣", "❤️", "☃", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🤦🏼‍♀️", "e\u0301",
        "a\u0300\u0301\u0302\u0303", "Z\u0336\u0337\u0338\u0489", "\u1100\u1161\u11A8", "क्ष", "ि", "ก่", "بِسْمِ",
        "葛\U000E0100", "ﬁ", "Å", "Å", "ℌ", "①", "ｶﾞ", "\u200D", "\u200C", "\u0300", "x\u034F\u0301", "🏳️‍🌈"};
    std::string s;
    for (int i = 0; i < 300; ++i) {
        s += g.one(pieces);
        if (g.chance(0.4)) s += separator(g);
        if (g.chance(0.2)) s += latin_word(g);
    }
    return s;
}

std::string code_doc(Gen& g) {
    static const std::vector<std::string> snippets = {
        "#include <vector>\nint main(int argc, char** argv) {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;  // doubled\n    return v.size() > 2 ? 0 : 1;\n}\n",
        "def f(x: int) -> str:\n    \"\"\"Doc's string.\"\"\"\n    if x >= 10 and x != 42:\n        return f'{x:08d}'\n\treturn None\n",
        "const o = {a: [1, 2.5, -3e10], 'b': \"it's\", c: null};\nconsole.log(`${o.a?.[0] ?? 0}`); // => 1\n",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\\u00e9\": 1}}, \"merges\": [[\"a\", \"b\"]]}\n",
        "for f in *.txt; do\n  zinf-tokenize \"$f\" -o \"${f%.txt}.bin\" || exit 65\ndone 2>&1 | tee log\n",
        "SELECT name, COUNT(*) FROM t WHERE x <> 'y' GROUP BY name HAVING COUNT(*) > 1;\n",
        "<div class=\"x\">&amp; &lt;b&gt;</div>\n<!-- comment -->\n",
        "I don't think it's what they're saying: we'll see, you've won, I'd go, I'm done. DON'T SHOUT, I'M HERE, WE'LL, "
        "THEY'RE, YOU'VE, IT'S, HE'D. O'Reilly's rock'n'roll '90s 'quoted' ''double'' it''s''\n",
        "    indented\n        deeper\n\t\ttabs\n  \t mixed \t \n",
        "a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2; m&&n||!o; p->q; r::s; t=>u; v===w; x!==y; z**2;\n",
    };
    std::string s;
    for (int i = 0; i < 8; ++i) s += g.one(snippets);
    return s;
}

std::string specials_doc(Gen& g) {
    static const std::vector<std::string> specials = {
        "<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
        "<|end_header_id|>", "<|reserved_special_token_7|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>",
        "<|endoftext|", "<|endoftext", "|endoftext|>", "<|endoftext|>>", "<<|endoftext|>", "<|END_OF_TEXT|>",
        "<|endoftext|><|endoftext|>", "<|eot_id|>\n\n", " <|eot_id|> ", "<0x0A>"};
    std::string s = g.one(specials);
    for (int i = 0; i < 80; ++i) {
        s += g.chance(0.5) ? latin_word(g) : g.chars(g.all, 1 + g.pick(3));
        s += separator(g);
        if (g.chance(0.4)) s += g.one(specials);
    }
    return s + g.one(specials);
}

std::string random_doc(Gen& g) {
    std::string s;
    for (int i = 0; i < 400; ++i) {
        s += g.chars(g.all, 1 + g.pick(5));
        if (g.chance(0.5)) s += separator(g);
    }
    return s;
}

std::string invalid_text(Gen& g) {
    // Every kind of byte that is not UTF-8, between valid text.
    static const std::vector<std::string> bad = {
        "\x80", "\xBF", "\x80\x80\x80", "\xC3", "\xE2\x82", "\xF0\x9F\x98", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80",
        "\xED\xA0\x80", "\xED\xBF\xBF", "\xF4\x90\x80\x80", "\xF5", "\xF8\x88\x80\x80\x80", "\xFE", "\xFF",
        "\xC3\x28", "\xE2\x28\xA1", "\xF0\x28\x8C\xBC"};
    std::string s = "\xFF\xFE start";
    for (int i = 0; i < 200; ++i) {
        s += g.chance(0.5) ? latin_word(g) : g.chars(g.all, 1 + g.pick(4));
        s += g.one(bad);
        if (g.chance(0.5)) s += separator(g);
    }
    return s + "end \xE2\x82";  // ends inside a character
}

// No "'" before a long s (see the top).
std::string tidy(std::string s) {
    for (std::size_t at; (at = s.find("'\xC5\xBF")) != std::string::npos;) s[at + 1] = 's', s.erase(at + 2, 1);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t seed = 46;
    std::string out;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seed" && i + 1 < argc) seed = std::stoull(argv[++i]);
        else if (a == "--out" && i + 1 < argc) out = argv[++i];
        else {
            std::cerr << "usage: text-corpus [--seed N] --out DIR\n";
            return 64;
        }
    }
    if (out.empty()) {
        std::cerr << "usage: text-corpus [--seed N] --out DIR\n";
        return 64;
    }
    try {
        Gen g{std::mt19937_64(seed), {}, {}, {}, {}};
        scan(g);
        std::cerr << "text-corpus: seed " << seed << ", " << g.names.size() << " scripts, " << g.all.size()
                  << " assigned characters\n";
        std::ofstream corpus(out + "/corpus.jsonl", std::ios::binary), nel(out + "/nel.jsonl", std::ios::binary);
        auto doc = [](std::ofstream& f, const std::string& kind, const std::string& text) {
            f << json::line({{"kind", kind}, {"text", tidy(text)}});
        };
        for (std::size_t k = 0; k < g.names.size(); k += 6) doc(corpus, "scripts", scripts_doc(g, k, 6));
        doc(corpus, "digits", digits_doc(g));
        doc(corpus, "whitespace", whitespace_doc(g));
        doc(corpus, "newlines", newlines_doc(g, false));
        doc(corpus, "emoji", emoji_doc(g));
        doc(corpus, "code", code_doc(g));
        for (int i = 0; i < 3; ++i) doc(corpus, "specials", specials_doc(g));
        for (int i = 0; i < 3; ++i) doc(corpus, "random", random_doc(g));
        doc(nel, "nel", newlines_doc(g, true));
        doc(nel, "nel", "\xEF\xBB\xBF" + whitespace_doc(g) + "\u0085");
        std::ofstream(out + "/invalid.txt", std::ios::binary) << invalid_text(g);
        if (!corpus || !nel) throw IoError("writing the corpus failed", {0, out, {}, -1});
    } catch (const Error& e) {
        std::cerr << "text-corpus: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
