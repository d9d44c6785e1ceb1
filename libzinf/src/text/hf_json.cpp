// Reading a tokenizer.json: every component checked against what zinf runs,
// anything else refused with its name and where it is in the file.
#include "hf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <deque>
#include <initializer_list>
#include <set>

namespace zinf::text::hf {

namespace {

using json::Json;

// The largest id taken: the trainer's tokens are int32.
constexpr std::uint64_t kMaxId = INT32_MAX;

// Checks and reads one JSON value; every failure names the file and the
// value's place in it ("model.merges[12]").
class Reader {
public:
    explicit Reader(std::string source) : source_(std::move(source)) {}

    [[noreturn]] void fail(const std::string& at, const std::string& what) const {
        throw DataError((at.empty() ? std::string() : at + ": ") + what, {0, source_, {}, -1});
    }
    [[noreturn]] void unsupported(const std::string& at, const std::string& what) const {
        fail(at, what + " is not supported (zinf would tokenize differently from Hugging Face's tokenizers; "
                        "see zinf-tokenize(1) for what is)");
    }
    const Json& object(const Json& j, const std::string& at) const {
        if (!j.is_object()) fail(at, std::string("is ") + j.type_name() + ", not an object");
        return j;
    }
    const Json& array(const Json& j, const std::string& at) const {
        if (!j.is_array()) fail(at, std::string("is ") + j.type_name() + ", not an array");
        return j;
    }
    // Only the keys zinf knows: one it does not may change the tokens.
    void keys(const Json& obj, const std::string& at, std::initializer_list<std::string_view> known) const {
        for (const auto& [k, v] : obj.items())
            if (std::find(known.begin(), known.end(), k) == known.end())
                unsupported(at, "the key \"" + k + "\"");
    }
    const Json* find(const Json& obj, const std::string& key) const {
        const auto it = obj.find(key);
        return it == obj.end() ? nullptr : &*it;
    }
    std::string string(const Json& obj, const std::string& key, const std::string& at) const {
        const Json* v = find(obj, key);
        if (!v) fail(at, "has no \"" + key + "\"");
        if (!v->is_string()) fail(at + "." + key, std::string("is ") + v->type_name() + ", not a string");
        return v->get<std::string>();
    }
    std::optional<std::string> maybe_string(const Json& obj, const std::string& key, const std::string& at) const {
        const Json* v = find(obj, key);
        if (!v || v->is_null()) return std::nullopt;
        if (!v->is_string()) fail(at + "." + key, std::string("is ") + v->type_name() + ", not a string");
        return v->get<std::string>();
    }
    bool flag(const Json& obj, const std::string& key, const std::string& at, bool otherwise) const {
        const Json* v = find(obj, key);
        if (!v || v->is_null()) return otherwise;
        if (!v->is_boolean()) fail(at + "." + key, std::string("is ") + v->type_name() + ", not true or false");
        return v->get<bool>();
    }
    std::uint64_t number(const Json& v, const std::string& at, std::uint64_t max) const {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
            fail(at, "is " + v.dump().substr(0, 40) + ", not a count or an id");
        const auto n = v.get<std::uint64_t>();
        if (n > max) fail(at, std::to_string(n) + " is past " + std::to_string(max));
        return n;
    }
    std::string type(const Json& obj, const std::string& at) const { return string(object(obj, at), "type", at); }

private:
    std::string source_;
};

std::string ordinal(std::size_t i) { return "[" + std::to_string(i) + "]"; }

// A key's value, or null when the object has none: a reference that outlives
// the expression (what a conditional with a temporary would not).
const Json& member(const Json& obj, const std::string& key) {
    static const Json none;
    const auto it = obj.find(key);
    return it == obj.end() ? none : *it;
}

// A Split's or Replace's pattern: {"String": ...} or {"Regex": ...}, as PCRE2.
std::string pattern_of(const Reader& r, const Json& j, const std::string& at, bool* is_regex = nullptr,
                       std::string* literal = nullptr) {
    r.object(j, at);
    r.keys(j, at, {"String", "Regex"});
    if (const Json* s = r.find(j, "String")) {
        if (!s->is_string()) r.fail(at + ".String", std::string("is ") + s->type_name() + ", not a string");
        if (is_regex) *is_regex = false;
        if (literal) *literal = s->get<std::string>();
        return Regex::quote(s->get<std::string>());
    }
    if (const Json* s = r.find(j, "Regex")) {
        if (!s->is_string()) r.fail(at + ".Regex", std::string("is ") + s->type_name() + ", not a string");
        if (is_regex) *is_regex = true;
        try {
            return oniguruma_to_pcre2(s->get<std::string>());
        } catch (const DataError& e) {
            r.fail(at + ".Regex", e.message());
        }
    }
    r.fail(at, "names neither a String nor a Regex");
}

std::shared_ptr<const Regex> compile(const Reader& r, const std::string& pattern, const std::string& at) {
    std::shared_ptr<const Regex> re;
    try {
        re = Regex::compile(pattern, at);
    } catch (const DataError& e) {
        r.fail("", e.message());
    }
    return re;
}

// The file read in one pass: a DOM of everything but the model's vocabulary
// and merges (a million values in Llama 3's), which come straight into
// vectors; json::parse_untrusted's limits (depth, values, a key twice) as
// it keeps them. A tenth of the time and memory of the whole DOM.
class Reading final : public nlohmann::json_sax<Json> {
public:
    explicit Reading(const json::ParseLimits& lim) : lim_(lim) {}

    Json root;
    struct Merge {
        std::string a, b;
        bool joined;  // "a b" in a: split when read
    };
    bool vocab_seen = false, merges_seen = false;
    std::vector<std::pair<std::string, std::uint64_t>> vocab;
    std::deque<Merge> merges;  // (never moved as it grows: 280,000 in Llama 3's)
    std::string vocab_bad, merges_bad;  // the first entry of the wrong type, said

    bool null() override { return scalar(Json(nullptr)); }
    bool boolean(bool v) override { return scalar(Json(v)); }
    bool number_integer(number_integer_t v) override { return scalar(Json(v)); }
    bool number_unsigned(number_unsigned_t v) override { return scalar(Json(v)); }
    bool number_float(number_float_t v, const string_t&) override { return scalar(Json(v)); }
    bool string(string_t& v) override { return scalar(Json(std::move(v))); }
    bool binary(binary_t&) override { return scalar(Json(nullptr)); }

    bool start_object(std::size_t) override { return open(true); }
    bool start_array(std::size_t) override { return open(false); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        if (mode_ == Mode::vocab && skip_ == 0) {
            key_ = std::move(k);
            return true;
        }
        if (mode_ == Mode::dom) {
            if (!keys_.back().insert(k).second) throw DataError("the key \"" + k + "\" appears twice in one object");
            key_ = std::move(k);
        }
        return true;
    }
    bool parse_error(std::size_t at, const std::string&, const nlohmann::detail::exception& e) override {
        throw DataError("not JSON (" + std::string(e.what()) + ")", {0, {}, at ? at - 1 : 0, -1});
    }

private:
    enum class Mode { dom, vocab, merges, pair };

    void count(bool container) {
        if (++values_ > lim_.values) throw DataError("JSON of more than " + std::to_string(lim_.values) + " values");
        if (container && ++depth_ > lim_.depth)
            throw DataError("JSON nested deeper than " + std::to_string(lim_.depth) + " levels");
    }
    static std::string shown(const Json& v) { return v.dump().substr(0, 40); }
    std::string merge_at() const { return "model.merges[" + std::to_string(merges_index_) + "]"; }

    // Where a new value goes in the DOM.
    Json* place(Json v) {
        if (stack_.empty()) {
            root = std::move(v);
            return &root;
        }
        Json& top = *stack_.back();
        if (top.is_array()) {
            top.push_back(std::move(v));
            return &top.back();
        }
        return &(top[key_] = std::move(v));
    }

    bool scalar(Json v) {
        count(false);
        if (skip_) return true;
        switch (mode_) {
        case Mode::dom: place(std::move(v)); break;
        case Mode::vocab:
            if (v.is_number_unsigned()) vocab.emplace_back(std::move(key_), v.get<std::uint64_t>());
            else if (vocab_bad.empty())
                vocab_bad = "model.vocab[\"" + key_ + "\"]: is " + shown(v) + ", not a count or an id";
            break;
        case Mode::merges:
            if (v.is_string()) merges.push_back({v.get<std::string>(), {}, true});
            else if (merges_bad.empty())
                merges_bad = merge_at() + ": is " + v.type_name() + ", not \"a b\" nor [\"a\", \"b\"]";
            ++merges_index_;
            break;
        case Mode::pair:
            if (v.is_string()) pair_.push_back(v.get<std::string>());
            else pair_ok_ = false;
            break;
        }
        return true;
    }

    bool open(bool object) {
        count(true);
        if (skip_) {
            ++skip_;
            return true;
        }
        if (mode_ == Mode::dom) {
            // The model's vocabulary and merges, of the right type, go to the vectors.
            const bool in_model = stack_.size() == 2 && stack_.front() == &root && model_ == stack_.back();
            if (in_model && object && key_ == "vocab") {
                place(Json::object());
                vocab_seen = true;
                mode_ = Mode::vocab;
                return true;
            }
            if (in_model && !object && key_ == "merges") {
                place(Json::array());
                merges_seen = true;
                mode_ = Mode::merges;
                return true;
            }
            const bool is_model = stack_.size() == 1 && object && key_ == "model" && stack_.front()->is_object();
            Json* v = place(object ? Json::object() : Json::array());
            if (is_model) model_ = v;
            stack_.push_back(v);
            keys_.emplace_back();
            return true;
        }
        if (mode_ == Mode::merges && !object) {
            mode_ = Mode::pair;
            pair_.clear();
            pair_ok_ = true;
            return true;
        }
        // A container where a number or a string belongs.
        if (mode_ == Mode::vocab && vocab_bad.empty())
            vocab_bad = "model.vocab[\"" + key_ + "\"]: is " + (object ? "an object" : "an array") + ", not a count or an id";
        if (mode_ == Mode::merges && merges_bad.empty())
            merges_bad = merge_at() + ": is object, not \"a b\" nor [\"a\", \"b\"]";
        if (mode_ == Mode::pair) pair_ok_ = false;
        skip_ = 1;
        return true;
    }

    bool close() {
        --depth_;
        if (skip_) {
            --skip_;
            if (skip_ == 0 && mode_ == Mode::merges) ++merges_index_;
            return true;
        }
        switch (mode_) {
        case Mode::dom:
            stack_.pop_back();
            keys_.pop_back();
            break;
        case Mode::vocab:
        case Mode::merges: mode_ = Mode::dom; break;
        case Mode::pair:
            if (pair_ok_ && pair_.size() == 2) merges.push_back({std::move(pair_[0]), std::move(pair_[1]), false});
            else if (merges_bad.empty())
                merges_bad = merge_at() + ": is array, not \"a b\" nor [\"a\", \"b\"]";
            ++merges_index_;
            mode_ = Mode::merges;
            break;
        }
        return true;
    }

    json::ParseLimits lim_;
    Mode mode_ = Mode::dom;
    std::vector<Json*> stack_;
    std::vector<std::set<std::string>> keys_;
    std::string key_;
    Json* model_ = nullptr;
    std::vector<std::string> pair_;
    bool pair_ok_ = true;
    std::uint64_t values_ = 0, merges_index_ = 0;
    unsigned depth_ = 0, skip_ = 0;
};

struct Loader {
    Reader r;
    std::string source;
    Pipeline& p;
    Reading& read;
    StringMap vocab;         // the model's vocabulary, by the file's spelling
    bool transformed = false;  // a ByteLevel or Metaspace pre-tokenizer was seen: nothing may follow
    bool split_seen = false;   // a step that splits was seen
    bool piece_prefix_after_split = false;

    // A Sequence's members, each read by `each` with its place in the file.
    template <class F>
    void sequence(const Json& j, const std::string& at, const std::string& key, F each) {
        r.keys(j, at, {"type", key});
        const Json& list = r.array(member(j, key), at + "." + key);
        for (std::size_t i = 0; i < list.size(); ++i) each(list[i], at + "." + key + ordinal(i));
    }

    // A Replace, normalizer or decoder.
    Replace replace(const Json& j, const std::string& at) {
        r.keys(j, at, {"type", "pattern", "content"});
        Replace rep;
        bool is_regex = false;
        const std::string pat = pattern_of(r, member(j, "pattern"), at + ".pattern", &is_regex, &rep.literal);
        if (is_regex) rep.regex = compile(r, pat, at + ".pattern");
        rep.content = r.string(j, "content", at);
        return rep;
    }

    void normalizer(const Json& j, const std::string& at) {
        const std::string t = r.type(j, at);
        if (t == "Sequence") {
            sequence(j, at, "normalizers", [&](const Json& e, const std::string& e_at) { normalizer(e, e_at); });
        } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
            r.keys(j, at, {"type"});
            p.normalizers.push_back(Normalize{t == "NFC" ? NormalForm::nfc : t == "NFD" ? NormalForm::nfd
                                              : t == "NFKC" ? NormalForm::nfkc : NormalForm::nfkd});
        } else if (t == "Prepend") {
            r.keys(j, at, {"type", "prepend"});
            p.normalizers.push_back(Prepend{r.string(j, "prepend", at)});
        } else if (t == "Replace") {
            p.normalizers.push_back(replace(j, at));
        } else {
            r.unsupported(at, "the normalizer " + t);
        }
    }

    void add_split(Split s) {
        if (transformed)
            r.unsupported("pre_tokenizer", "a splitting pre-tokenizer (" + s.name +
                                               ") after ByteLevel or Metaspace, which would see their replaced characters,");
        split_seen = true;
        p.steps.push_back(std::move(s));
    }
    void add_prefix(Prefix f) {
        if (split_seen && !f.first_only) piece_prefix_after_split = true;
        p.steps.push_back(std::move(f));
    }

    void pre_tokenizer(const Json& j, const std::string& at) {
        const std::string t = r.type(j, at);
        if (t == "Sequence") {
            sequence(j, at, "pretokenizers", [&](const Json& e, const std::string& e_at) { pre_tokenizer(e, e_at); });
        } else if (t == "ByteLevel") {
            r.keys(j, at, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
            if (transformed) r.unsupported(at, "ByteLevel after ByteLevel or Metaspace");
            if (r.flag(j, "add_prefix_space", at, false)) add_prefix(Prefix{" ", false, false});
            if (r.flag(j, "use_regex", at, true)) {
                // GPT-2's split, as the ByteLevel pre-tokenizer has it built in.
                static const std::string gpt2 = oniguruma_to_pcre2(
                    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
                add_split(Split{compile(r, gpt2, at), Behavior::isolated, false, at + " (GPT-2's regex)"});
            }
            p.byte_level = true;
            transformed = true;
        } else if (t == "Split") {
            r.keys(j, at, {"type", "pattern", "behavior", "invert"});
            Split s;
            s.name = at;
            s.regex = compile(r, pattern_of(r, member(j, "pattern"), at + ".pattern"),
                              at + ".pattern");
            const std::string b = r.string(j, "behavior", at);
            if (b == "Removed") s.behavior = Behavior::removed;
            else if (b == "Isolated") s.behavior = Behavior::isolated;
            else if (b == "MergedWithPrevious") s.behavior = Behavior::merged_with_previous;
            else if (b == "MergedWithNext") s.behavior = Behavior::merged_with_next;
            else if (b == "Contiguous") s.behavior = Behavior::contiguous;
            else r.unsupported(at + ".behavior", "\"" + b + "\"");
            s.invert = r.flag(j, "invert", at, false);
            add_split(std::move(s));
        } else if (t == "Digits") {
            r.keys(j, at, {"type", "individual_digits"});
            const bool each = r.flag(j, "individual_digits", at, false);
            // Rust's char::is_numeric is Unicode's N: each such character
            // isolated, or runs of them (Contiguous over single matches).
            add_split(Split{compile(r, each ? "\\p{N}" : "\\p{N}+", at), Behavior::isolated, false, at});
        } else if (t == "Metaspace") {
            r.keys(j, at, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
            if (transformed) r.unsupported(at, "Metaspace after ByteLevel or Metaspace");
            const std::string rep = r.string(j, "replacement", at);
            if (rep.empty() || utf8_char(rep, 0) != rep.size()) r.fail(at + ".replacement", "is not one character");
            std::string scheme = "always";
            if (const auto s = r.maybe_string(j, "prepend_scheme", at)) scheme = *s;
            else if (j.contains("add_prefix_space")) scheme = r.flag(j, "add_prefix_space", at, true) ? "always" : "never";
            if (scheme == "always" || scheme == "first") add_prefix(Prefix{rep, scheme == "first", true});
            else if (scheme != "never") r.unsupported(at + ".prepend_scheme", "\"" + scheme + "\"");
            if (r.flag(j, "split", at, true)) {
                // On the replaced text: every replacement, which a space becomes.
                add_split(Split{compile(r, " |" + Regex::quote(rep), at), Behavior::merged_with_next, false,
                                at + " (split)"});
            }
            p.metaspace = rep;
            transformed = true;
        } else {
            r.unsupported(at, "the pre-tokenizer " + t);
        }
    }

    // The ids of a special token of a TemplateProcessing, by its name.
    std::vector<Id> template_ids(const Json& tp, const std::string& name, const std::string& at) {
        const Json* specials = r.find(tp, "special_tokens");
        if (!specials) r.fail(at, "has no \"special_tokens\"");
        r.object(*specials, at + ".special_tokens");
        const Json* t = r.find(*specials, name);
        if (!t) r.fail(at + ".special_tokens", "has no \"" + name + "\", which single names");
        r.object(*t, at + ".special_tokens." + name);
        const Json* ids = r.find(*t, "ids");
        if (!ids) r.fail(at + ".special_tokens." + name, "has no \"ids\"");
        r.array(*ids, at + ".special_tokens." + name + ".ids");
        std::vector<Id> out;
        for (std::size_t i = 0; i < ids->size(); ++i)
            out.push_back(static_cast<Id>(r.number((*ids)[i], at + ".special_tokens." + name + ".ids" + ordinal(i), kMaxId)));
        return out;
    }

    // A post-processor's ids before and after one text.
    std::pair<std::vector<Id>, std::vector<Id>> post_processor(const Json& j, const std::string& at) {
        const std::string t = r.type(j, at);
        std::vector<Id> begin, end;
        if (t == "Sequence") {
            r.keys(j, at, {"type", "processors"});
            const Json& list = r.array(member(j, "processors"), at + ".processors");
            // Each wraps what the ones before it made.
            for (std::size_t i = 0; i < list.size(); ++i) {
                auto [b, e] = post_processor(list[i], at + ".processors" + ordinal(i));
                b.insert(b.end(), begin.begin(), begin.end());
                begin = std::move(b);
                end.insert(end.end(), e.begin(), e.end());
            }
        } else if (t == "ByteLevel") {
            // Offsets only (trim_offsets): no ids.
            r.keys(j, at, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
        } else if (t == "TemplateProcessing") {
            r.keys(j, at, {"type", "single", "pair", "special_tokens"});
            const Json& single = r.array(member(j, "single"), at + ".single");
            bool after = false;
            for (std::size_t i = 0; i < single.size(); ++i) {
                const std::string ai = at + ".single" + ordinal(i);
                r.object(single[i], ai);
                if (const Json* s = r.find(single[i], "SpecialToken")) {
                    const auto ids = template_ids(j, r.string(r.object(*s, ai + ".SpecialToken"), "id", ai + ".SpecialToken"),
                                                  at);
                    (after ? end : begin).insert((after ? end : begin).end(), ids.begin(), ids.end());
                } else if (const Json* q = r.find(single[i], "Sequence")) {
                    const std::string id = r.string(r.object(*q, ai + ".Sequence"), "id", ai + ".Sequence");
                    if (id != "A" || after) r.unsupported(ai, "a single template with sequence " + id);
                    after = true;
                } else {
                    r.fail(ai, "is neither a SpecialToken nor a Sequence");
                }
            }
            if (!after) r.fail(at + ".single", "has no sequence A");
        } else if (t == "RobertaProcessing" || t == "BertProcessing") {
            r.keys(j, at, {"type", "sep", "cls", "trim_offsets", "add_prefix_space"});
            auto token = [&](const std::string& key) {
                const Json* v = r.find(j, key);
                if (!v || !v->is_array() || v->size() != 2 || !(*v)[0].is_string())
                    r.fail(at + "." + key, "is not a [token, id] pair");
                return static_cast<Id>(r.number((*v)[1], at + "." + key + "[1]", kMaxId));
            };
            begin.push_back(token("cls"));
            end.push_back(token("sep"));
        } else {
            r.unsupported(at, "the post-processor " + t);
        }
        return {begin, end};
    }

    void decoder(const Json& j, const std::string& at) {
        const std::string t = r.type(j, at);
        if (t == "Sequence") {
            sequence(j, at, "decoders", [&](const Json& e, const std::string& e_at) { decoder(e, e_at); });
        } else if (t == "ByteLevel") {
            r.keys(j, at, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
            p.decoders.push_back(ByteLevelDecode{});
        } else if (t == "Replace") {
            p.decoders.push_back(replace(j, at));
        } else if (t == "ByteFallback") {
            r.keys(j, at, {"type"});
            p.decoders.push_back(ByteFallbackDecode{});
        } else if (t == "Fuse") {
            r.keys(j, at, {"type"});
            p.decoders.push_back(FuseDecode{});
        } else if (t == "Strip") {
            r.keys(j, at, {"type", "content", "start", "stop"});
            StripDecode d;
            d.content = r.string(j, "content", at);
            if (d.content.empty() || utf8_char(d.content, 0) != d.content.size())
                r.fail(at + ".content", "is not one character");
            d.start = (j.contains("start") ? r.number(j["start"], at + ".start", 1 << 20) : 0);
            d.stop = (j.contains("stop") ? r.number(j["stop"], at + ".stop", 1 << 20) : 0);
            p.decoders.push_back(std::move(d));
        } else if (t == "Metaspace") {
            r.keys(j, at, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
            MetaspaceDecode d;
            d.replacement = r.string(j, "replacement", at);
            std::string scheme = "always";
            if (const auto s = r.maybe_string(j, "prepend_scheme", at)) scheme = *s;
            else if (j.contains("add_prefix_space")) scheme = r.flag(j, "add_prefix_space", at, true) ? "always" : "never";
            if (scheme != "always" && scheme != "first" && scheme != "never")
                r.unsupported(at + ".prepend_scheme", "\"" + scheme + "\"");
            d.strip_first = scheme != "never";
            p.decoders.push_back(std::move(d));
        } else {
            r.unsupported(at, "the decoder " + t);
        }
    }

    void added_tokens(const Json& list) {
        r.array(list, "added_tokens");
        for (std::size_t i = 0; i < list.size(); ++i) {
            const std::string at = "added_tokens" + ordinal(i);
            const Json& t = r.object(list[i], at);
            r.keys(t, at, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
            Added a;
            if (!t.contains("id")) r.fail(at, "has no \"id\"");
            a.id = static_cast<Id>(r.number(t["id"], at + ".id", kMaxId));
            a.content = r.string(t, "content", at);
            if (a.content.empty()) r.fail(at + ".content", "is empty");
            a.single_word = r.flag(t, "single_word", at, false);
            a.lstrip = r.flag(t, "lstrip", at, false);
            a.rstrip = r.flag(t, "rstrip", at, false);
            a.special = r.flag(t, "special", at, false);
            a.normalized = r.flag(t, "normalized", at, !a.special);
            p.added.push_back(std::move(a));
        }
    }

    void model(const Json& j) {
        r.object(j, "model");
        const auto type = r.maybe_string(j, "type", "model");
        if (type && *type != "BPE") r.unsupported("model", "the model " + *type + " (BPE only)");
        r.keys(j, "model", {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                            "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
        if (const Json* d = r.find(j, "dropout"); d && !d->is_null()) {
            if (!d->is_number()) r.fail("model.dropout", std::string("is ") + d->type_name() + ", not a number");
            if (d->get<double>() != 0) r.unsupported("model.dropout", "BPE dropout (random merges)");
        }
        for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
            if (const auto s = r.maybe_string(j, k, "model"); s && !s->empty())
                r.unsupported(std::string("model.") + k, "a non-empty " + std::string(k));
        Bpe& m = p.bpe;
        m.fuse_unk = r.flag(j, "fuse_unk", "model", false);
        m.byte_fallback = r.flag(j, "byte_fallback", "model", false);
        m.ignore_merges = r.flag(j, "ignore_merges", "model", false);
        m.byte_level = p.byte_level;

        const Json* v = r.find(j, "vocab");
        if (!v) r.fail("model", "has no \"vocab\"");
        r.object(*v, "model.vocab");
        if (!read.vocab_bad.empty()) r.fail("", read.vocab_bad);
        vocab.reserve(read.vocab.size());
        std::uint64_t max_id = 0;
        for (auto& [token, id64] : read.vocab) {
            if (id64 > kMaxId)
                r.fail("model.vocab[\"" + token + "\"]", std::to_string(id64) + " is past " + std::to_string(kMaxId));
            const auto id = static_cast<Id>(id64);
            if (!vocab.emplace(std::move(token), id).second)
                r.fail("model.vocab", "the key \"" + token + "\" appears twice");
            max_id = std::max<std::uint64_t>(max_id, id);
        }
        read.vocab = {};
        if (vocab.empty()) r.fail("model.vocab", "is empty");
        for (const Added& a : p.added) max_id = std::max<std::uint64_t>(max_id, a.id);
        const std::uint64_t tokens = vocab.size() + p.added.size();
        // Tables are indexed by id: ids far past the number of tokens would
        // make them huge for nothing (2^31 of them: 64 GiB of strings).
        if (max_id + 1 > 4 * tokens + 65536)
            r.fail("model.vocab", "ids reach " + std::to_string(max_id) + " for " + std::to_string(tokens) +
                                      " tokens: a vocabulary this sparse is refused");
        p.vocab = max_id + 1;
        p.id_text.assign(p.vocab, std::string());
        std::vector<std::uint8_t> taken(p.vocab, 0);
        for (const auto& [token, id] : vocab) {
            if (taken[id]) r.fail("model.vocab", "id " + std::to_string(id) + " is given to two tokens: \"" +
                                                     p.id_text[id] + "\" and \"" + token + "\"");
            taken[id] = 1;
            p.id_text[id] = token;
        }
        // The model's units: bytes for a byte-level model (its characters
        // read back), else the tokens as they are.
        m.units.reserve(vocab.size());
        std::vector<std::uint8_t> unit(p.vocab, 0);  // a token the model's units can make
        for (const auto& [token, id] : vocab) {
            if (m.byte_level) {
                if (auto b = from_byte_chars(token)) {
                    m.units.emplace(std::move(*b), id);
                    unit[id] = 1;
                }
            } else {
                m.units.emplace(token, id);
                unit[id] = 1;
            }
        }
        m.byte_ids.fill(kNone);
        m.fallback_ids.fill(kNone);
        for (int b = 0; b < 256; ++b) {
            if (m.byte_level)
                if (const auto it = m.units.find(std::string(1, static_cast<char>(b))); it != m.units.end())
                    m.byte_ids[static_cast<std::size_t>(b)] = it->second;
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            if (const auto it = vocab.find(std::string_view(name)); it != vocab.end())
                m.fallback_ids[static_cast<std::size_t>(b)] = it->second;
        }
        if (const auto unk = r.maybe_string(j, "unk_token", "model")) {
            const auto it = vocab.find(*unk);
            if (it == vocab.end()) r.fail("model.unk_token", "\"" + *unk + "\" is not in the vocabulary");
            m.unk = it->second;
        }

        const Json* merges = r.find(j, "merges");
        if (!merges) r.fail("model", "has no \"merges\"");
        r.array(*merges, "model.merges");
        if (!read.merges_bad.empty()) r.fail("", read.merges_bad);
        m.merges.reserve(read.merges.size());
        m.merge_count = read.merges.size();
        std::string joined;
        for (std::size_t i = 0; i < read.merges.size(); ++i) {
            auto at = [&] { return "model.merges" + ordinal(i); };
            const Reading::Merge& e = read.merges[i];
            std::string_view a = e.a, b = e.b;
            if (e.joined) {
                // "a b": exactly one space, as Hugging Face reads it.
                const std::size_t sp = a.find(' ');
                if (sp == std::string::npos || a.find(' ', sp + 1) != std::string::npos)
                    r.fail(at(), "\"" + e.a + "\" is not two tokens with one space between");
                b = a.substr(sp + 1);
                a = a.substr(0, sp);
            }
            joined.assign(a).append(b);
            const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(joined);
            if (ia == vocab.end()) r.fail(at(), "names \"" + std::string(a) + "\", which is not in the vocabulary");
            if (ib == vocab.end()) r.fail(at(), "names \"" + std::string(b) + "\", which is not in the vocabulary");
            if (iab == vocab.end()) r.fail(at(), "merges into \"" + joined + "\", which is not in the vocabulary");
            // A byte-level merge of tokens that are not byte-level text can
            // never apply (the units are bytes); a later duplicate wins, as in
            // Hugging Face's map.
            if (!unit[ia->second] || !unit[ib->second]) continue;
            m.merges.put(std::uint64_t{ia->second} << 32 | ib->second,
                         std::uint64_t{static_cast<std::uint32_t>(i)} << 32 | iab->second);
        }
    }
};

}  // namespace

std::shared_ptr<const Pipeline> load(std::string_view text, const std::string& source) {
    auto owned = std::make_shared<Pipeline>();
    Pipeline& p = *owned;
    p.path = source;
    // Qwen2's file is 0.7 M values; room for ten times that.
    Reading read({.depth = 32, .values = std::uint64_t{1} << 23});
    try {
        Json::sax_parse(text, &read);
    } catch (const DataError& e) {
        throw DataError("not a tokenizer.json: " + e.message(), {0, source, e.offset(), -1});
    } catch (const Json::exception& e) {
        throw DataError("not a tokenizer.json: " + std::string(e.what()), {0, source, {}, -1});
    }
    Loader l{Reader(source), source, p, read, {}};
    const Json& j = read.root;
    const Reader& r = l.r;
    r.object(j, "the file");
    r.keys(j, "", {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
                   "decoder", "model"});
    if (!j.contains("model")) r.fail("", "has no \"model\"");
    for (const char* k : {"truncation", "padding"})
        if (const Json* v = r.find(j, k); v && !v->is_null())
            log::warn(source + ": its " + k + " setting is for a call's batches, not for the tokens; zinf ignores it");
    if (const Json* a = r.find(j, "added_tokens"); a && !a->is_null()) l.added_tokens(*a);
    if (const Json* n = r.find(j, "normalizer"); n && !n->is_null()) l.normalizer(*n, "normalizer");
    if (const Json* t = r.find(j, "pre_tokenizer"); t && !t->is_null()) l.pre_tokenizer(*t, "pre_tokenizer");
    l.model(j["model"]);
    if (const Json* t = r.find(j, "post_processor"); t && !t->is_null())
        std::tie(p.begin_ids, p.end_ids) = l.post_processor(*t, "post_processor");
    if (const Json* d = r.find(j, "decoder"); d && !d->is_null()) {
        l.decoder(*d, "decoder");
        p.has_decoder = true;
    }

    // Added tokens over the model's: their text, their specialness.
    p.id_special.assign(p.vocab, 0);
    for (const Added& a : p.added) {
        p.id_text[a.id] = a.content;
        if (a.special) p.id_special[a.id] = 1;
    }
    for (Id id : p.begin_ids)
        if (id >= p.vocab || p.id_text[id].empty())
            r.fail("post_processor", "names id " + std::to_string(id) + ", which no token has");
    for (Id id : p.end_ids)
        if (id >= p.vocab || p.id_text[id].empty())
            r.fail("post_processor", "names id " + std::to_string(id) + ", which no token has");
    // Matched before the normalizers when they are "normalized": false (or
    // there is no normalizer), else in the normalized text.
    std::vector<const Added*> raw, normalized;
    for (const Added& a : p.added) (a.normalized && !p.normalizers.empty() ? normalized : raw).push_back(&a);
    p.raw_added.build(raw);
    p.normalized_added.build(normalized);

    // ByteLevel alone decodes each id to fixed bytes: kept per id.
    const bool byte_decode = p.decoders.size() == 1 && std::holds_alternative<ByteLevelDecode>(p.decoders[0]);
    if (byte_decode) {
        p.id_bytes.resize(p.vocab);
        for (std::size_t id = 0; id < p.vocab; ++id) {
            // A token not all byte-level characters keeps its own bytes, as the decoder does.
            auto b = from_byte_chars(p.id_text[id]);
            p.id_bytes[id] = b ? std::move(*b) : p.id_text[id];
        }
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
        if (p.end_of_text) break;
        for (const Added& a : p.added)
            if (a.content == name) {
                p.end_of_text = a.id;
                break;
            }
        if (!p.end_of_text)
            if (const auto it = l.vocab.find(std::string_view(name)); it != l.vocab.end()) p.end_of_text = it->second;
    }

    // Where a document may be cut and each part encoded alone (text.hpp):
    // every rule of the pipeline must be local to a line.
    bool cuts = l.split_seen && !l.piece_prefix_after_split && normalized.empty();
    for (const Normalizer& n : p.normalizers)
        if (const auto* rep = std::get_if<Replace>(&n))
            if (rep->regex || rep->literal.find('\n') != std::string::npos || rep->content.find('\n') != std::string::npos)
                cuts = false;
    for (const Added& a : p.added)
        if (a.content.find('\n') != std::string::npos) cuts = false;
    p.cuts_lines = cuts;

    // Bytes in, the same bytes out: byte-level all through, nothing added or removed.
    bool exact = p.byte_level && byte_decode && p.normalizers.empty() && p.metaspace.empty();
    for (const Step& s : p.steps) {
        if (std::holds_alternative<Prefix>(s)) exact = false;
        if (const auto* sp = std::get_if<Split>(&s); sp && sp->behavior == Behavior::removed) exact = false;
    }
    for (Id id : p.bpe.byte_ids)
        if (id == kNone) exact = false;
    for (const Added& a : p.added)
        if (a.lstrip || a.rstrip) exact = false;
    p.round_trip = exact ? RoundTrip::bytes : RoundTrip::none;

    p.description = "Hugging Face tokenizer.json: BPE, " + std::to_string(p.vocab) + " ids (" +
                    std::to_string(l.vocab.size()) + " in the model, " + std::to_string(p.added.size()) + " added), " +
                    std::to_string(p.bpe.merge_count) + " merges" + (p.byte_level ? ", byte-level" : "") +
                    (p.bpe.byte_fallback ? ", byte fallback" : "") + (p.normalizers.empty() ? "" : ", normalized");
    return owned;
}

}  // namespace zinf::text::hf
