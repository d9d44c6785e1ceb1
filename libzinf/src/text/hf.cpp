// Running a tokenizer.json: added tokens, normalizers, pre-tokenizer steps and
// the BPE model to encode; the decoders to decode. The order and each rule
// follow Hugging Face's tokenizers (the Rust crate), which the tests check
// against its JavaScript port token for token.
#include "hf.hpp"

#include <algorithm>
#include <cctype>

namespace zinf::text::hf {

void Replace::apply(std::string_view in, std::string& out, Regex::Scratch& scratch) const {
    std::size_t at = 0;
    auto replaced = [&](std::size_t a, std::size_t b) {
        out.append(in.substr(at, a - at));
        out += content;
        at = b;
    };
    if (regex) {
        std::vector<std::pair<std::uint32_t, std::uint32_t>> m;
        regex->find_all(in, false, scratch, m);
        for (const auto& [a, b] : m) replaced(a, b);
    } else if (!literal.empty()) {
        for (std::size_t hit; (hit = in.find(literal, at)) != std::string_view::npos;)
            replaced(hit, hit + literal.size());
    }
    out.append(in.substr(at));
}

// --- added tokens ------------------------------------------------------------

void AddedMatcher::build(const std::vector<const Added*>& tokens) {
    tokens_ = tokens;
    for (auto& v : by_first_) v.clear();
    for (std::uint32_t i = 0; i < tokens_.size(); ++i)
        by_first_[static_cast<unsigned char>(tokens_[i]->content[0])].push_back(i);
    for (auto& v : by_first_)
        std::stable_sort(v.begin(), v.end(), [&](std::uint32_t a, std::uint32_t b) {
            return tokens_[a]->content.size() > tokens_[b]->content.size();
        });
}

namespace {
// The character before `at` / at `at`, as a code point (invalid UTF-8: none).
std::optional<char32_t> char_before(std::string_view s, std::size_t at) {
    if (at == 0) return std::nullopt;
    std::size_t i = at - 1;
    while (i > 0 && at - i < 4 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    const std::size_t n = utf8_char(s, i);
    if (n == 0 || i + n != at) return std::nullopt;
    return utf8_decode(s, i, n);
}
std::optional<char32_t> char_at(std::string_view s, std::size_t at) {
    if (at >= s.size()) return std::nullopt;
    const std::size_t n = utf8_char(s, at);
    if (n == 0) return std::nullopt;
    return utf8_decode(s, at, n);
}
}  // namespace

void AddedMatcher::find(std::string_view text, std::vector<Match>& out) const {
    out.clear();
    if (tokens_.empty()) return;
    std::size_t start_offset = 0;  // where the text not yet taken starts
    for (std::size_t i = 0; i < text.size();) {
        const auto& cands = by_first_[static_cast<unsigned char>(text[i])];
        const Added* hit = nullptr;
        for (std::uint32_t k : cands) {
            const std::string& c = tokens_[k]->content;
            if (text.size() - i >= c.size() && text.compare(i, c.size(), c) == 0) {
                hit = tokens_[k];
                break;  // the longest at the leftmost place
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        std::size_t start = i, stop = i + hit->content.size();
        i = stop;
        if (hit->single_word) {
            const auto before = char_before(text, start), after = char_at(text, stop);
            if ((before && is_alphanumeric(*before)) || (after && is_alphanumeric(*after))) continue;
        }
        if (hit->lstrip) {
            std::size_t s = start;
            while (const auto c = char_before(text, s)) {
                if (!is_white_space(*c)) break;
                std::size_t k = s - 1;
                while ((static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
                s = k;
            }
            start = std::max(s, start_offset);
        }
        if (hit->rstrip) {
            while (const auto c = char_at(text, stop)) {
                if (!is_white_space(*c)) break;
                stop += utf8_char(text, stop);
            }
            i = std::max(i, stop);
        }
        out.push_back({start, stop, hit});
        start_offset = stop;
    }
}

namespace {

// --- the tokenizer ---------------------------------------------------------------

class HfTokenizer final : public Tokenizer {
public:
    explicit HfTokenizer(std::shared_ptr<const Pipeline> p) : p_(std::move(p)) {
        path_ = p_->path;
        byte_fallback_decode_ = std::any_of(p_->decoders.begin(), p_->decoders.end(), [](const Decode& d) {
            return std::holds_alternative<ByteFallbackDecode>(d);
        });
        for (const Added& a : p_->added) by_text_.emplace(a.content, a.id);
    }
    std::string kind() const override { return p_->description; }
    std::uint64_t vocab() const override { return p_->vocab; }
    RoundTrip round_trip() const override { return p_->round_trip; }
    bool cuts_lines() const override { return p_->cuts_lines; }
    std::unique_ptr<Encoder> encoder(std::uint64_t cache_bytes, std::shared_ptr<SharedCache> shared) const override;
    std::shared_ptr<SharedCache> shared_cache(std::uint64_t bytes) const override {
        return std::make_shared<SharedBpeCache>(bytes);
    }
    void decode(std::span<const Id> ids, Part part, std::string& out) const override;
    std::size_t decode_cut(std::span<const Id> ids) const override;
    std::optional<Id> end_of_text() const override { return p_->end_of_text; }
    std::vector<Id> begin_ids() const override { return p_->begin_ids; }
    std::vector<Id> end_ids() const override { return p_->end_ids; }
    std::optional<Id> token_id(std::string_view token) const override {
        if (const auto it = by_text_.find(token); it != by_text_.end()) return it->second;
        for (std::size_t id = 0; id < p_->id_text.size(); ++id)  // (rare: --sep)
            if (!p_->id_text[id].empty() && p_->id_text[id] == token) return static_cast<Id>(id);
        return std::nullopt;
    }

private:
    bool is_byte_token(Id id) const {
        const std::string& t = p_->id_text[id];
        return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
               std::isxdigit(static_cast<unsigned char>(t[4]));
    }
    void check_id(Id id) const {
        if (id >= p_->vocab || p_->id_text[id].empty())
            throw DataError("token " + std::to_string(id) + (id >= p_->vocab ? " is past the vocabulary of " +
                                                                                   std::to_string(p_->vocab)
                                                                             : " is an id no token has"),
                            {0, path_, {}, -1});
    }
    std::shared_ptr<const Pipeline> p_;
    bool byte_fallback_decode_ = false;
    StringMap by_text_;
};

// One thread's encoding state: the BPE caches (its own, and the one it
// shares where given) and the buffers each call reuses.
class HfEncoder final : public Encoder {
public:
    HfEncoder(const Pipeline& p, std::uint64_t cache_bytes, std::shared_ptr<SharedBpeCache> shared)
        : p_(p), cache_(cache_bytes), shared_(std::move(shared)) {
        // One Split that isolates (GPT-2's ByteLevel, Llama 3's and Qwen2's
        // Split): its pieces go to the model as the regex finds them.
        if (p_.steps.size() == 1)
            if (const auto* sp = std::get_if<Split>(&p_.steps[0]); sp && sp->behavior == Behavior::isolated) one_split_ = sp;
    }
    std::size_t encode(std::string_view text, std::size_t end, Part part, std::vector<Id>& ids) override;

private:
    // Where a piece lies against the cut (only the last piece may hold it).
    struct Piece {
        std::uint32_t start, end;  // in work_
        bool first;                // at the document's first byte
        bool split_start;          // begins a piece as Hugging Face's split sees it
        std::uint32_t cut;         // offset of the cut inside it; kNoCut when before it
    };
    static constexpr std::uint32_t kNoCut = ~std::uint32_t{0};

    bool text_segment(std::string_view seg, std::size_t cut, bool open_end, bool split_start, bool first,
                      std::vector<Id>& ids);
    void normalize_into(std::string_view text, bool segment_start);
    bool pre_tokenize(std::size_t begin, std::size_t end, std::size_t cut, bool open_end, bool split_start, bool first);
    bool split_step(const Split& s, bool open_end);
    void model(std::vector<Id>& ids);
    void piece(std::string_view piece, std::vector<Id>& ids);
    bool split_and_encode(std::string_view subject, std::size_t cut, bool open_end, std::vector<Id>& ids);

    struct El {
        std::uint32_t a, b;
        bool match;
    };
    const Pipeline& p_;
    BpeCache cache_;
    std::shared_ptr<SharedBpeCache> shared_;
    std::vector<El> els_, out_;  // a split's elements, kept or joined
    const Split* one_split_ = nullptr;
    Regex::Scratch scratch_;
    std::string work_, scratch_text_, piece_text_;
    std::vector<Piece> pieces_, next_;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> matches_;
    std::vector<AddedMatcher::Match> added_, nadded_;
    std::vector<Id> sym_;
};

std::unique_ptr<Encoder> HfTokenizer::encoder(std::uint64_t cache_bytes, std::shared_ptr<SharedCache> shared) const {
    auto bpe_shared = std::dynamic_pointer_cast<SharedBpeCache>(std::move(shared));
    return std::make_unique<HfEncoder>(*p_, cache_bytes, std::move(bpe_shared));
}

void HfEncoder::normalize_into(std::string_view text, bool segment_start) {
    if (p_.normalizers.empty()) {
        work_ += text;
        return;
    }
    // Each normalizer over the whole of what the last made.
    std::string& cur = scratch_text_;
    cur.assign(text);
    std::string next;
    for (const Normalizer& n : p_.normalizers) {
        next.clear();
        if (const auto* f = std::get_if<Normalize>(&n)) {
            normalize(cur, f->form, next);
        } else if (const auto* pre = std::get_if<Prepend>(&n)) {
            // Hugging Face prepends to every non-empty text between added tokens.
            if (!segment_start || cur.empty()) continue;
            next = pre->text + cur;
        } else {
            std::get<Replace>(n).apply(cur, next, scratch_);
        }
        cur.swap(next);
    }
    work_ += cur;
}

// The elements Hugging Face's split makes of a piece (its matches and the
// gaps between), kept or merged by the behavior.
bool HfEncoder::split_step(const Split& s, bool open_end) {
    next_.clear();
    for (const Piece& pc : pieces_) {
        const std::string_view subject(work_.data() + pc.start, pc.end - pc.start);
        const bool open = open_end && pc.cut != kNoCut;
        matches_.clear();
        const std::size_t frontier = s.regex->find_all(subject, open, scratch_, matches_);
        // The elements: (start, end, is_match), before `frontier`.
        std::vector<El>& els = els_;
        els.clear();
        std::uint32_t prev = 0;
        for (const auto& [a, b] : matches_) {
            if (a > prev) els.push_back({prev, a, false});
            els.push_back({a, b, true});
            prev = b;
        }
        const auto len = static_cast<std::uint32_t>(subject.size());
        bool unknown = false;  // [frontier, len) is not decided: more text may change it
        if (open && frontier < len) {
            unknown = true;
        } else if (prev < len) {
            els.push_back({prev, len, false});
        }
        if (pc.cut != kNoCut) {
            // The cut must fall between decided elements, and (for the
            // behaviors that join neighbours) not next to the undecided rest.
            for (const El& e : els)
                if (e.a < pc.cut && pc.cut < e.b) return false;
            if (unknown && frontier < pc.cut) return false;
            if (unknown && frontier == pc.cut && s.behavior != Behavior::isolated && s.behavior != Behavior::removed)
                return false;
        }
        if (s.invert)
            for (El& e : els) e.match = !e.match;
        // Hugging Face's behaviors, over the decided elements (Isolated: as they are).
        std::vector<El>& out = s.behavior == Behavior::isolated ? els_ : out_;
        out_.clear();
        switch (s.behavior) {
        case Behavior::removed:
            for (const El& e : els)
                if (!e.match) out.push_back(e);
            break;
        case Behavior::isolated: break;
        case Behavior::merged_with_previous: {
            bool prev_match = false;
            for (const El& e : els) {
                if (e.match && !prev_match && !out.empty()) out.back().b = e.b;
                else out.push_back(e);
                prev_match = e.match;
            }
            break;
        }
        case Behavior::merged_with_next: {
            bool prev_match = false;
            for (auto it = els.rbegin(); it != els.rend(); ++it) {
                if (it->match && !prev_match && !out.empty()) out.back().a = it->a;
                else out.push_back(*it);
                prev_match = it->match;
            }
            std::reverse(out.begin(), out.end());
            break;
        }
        case Behavior::contiguous: {
            bool prev_match = false;
            for (const El& e : els) {
                if (e.match == prev_match && !out.empty()) out.back().b = e.b;
                else out.push_back(e);
                prev_match = e.match;
            }
            break;
        }
        }
        bool first_out = true;
        for (const El& e : out) {
            if (e.b == e.a) continue;  // Hugging Face drops empty pieces
            Piece q{pc.start + e.a, pc.start + e.b, pc.first && e.a == 0, first_out ? pc.split_start : true, kNoCut};
            first_out = false;
            if (pc.cut != kNoCut) {
                if (e.a >= pc.cut) break;  // past the cut: the next part's
                if (e.b > pc.cut) return false;
            }
            next_.push_back(q);
        }
    }
    pieces_.swap(next_);
    return true;
}

bool HfEncoder::pre_tokenize(std::size_t begin, std::size_t end, std::size_t cut, bool open_end, bool split_start,
                             bool first) {
    pieces_.clear();
    if (end == begin) return true;
    pieces_.push_back({static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end), first, split_start,
                       cut == std::string::npos ? kNoCut : static_cast<std::uint32_t>(cut - begin)});
    bool straddling = cut != std::string::npos;
    for (const Step& step : p_.steps) {
        if (const auto* s = std::get_if<Split>(&step)) {
            const bool had_cut = !pieces_.empty() && pieces_.back().cut != kNoCut;
            if (!split_step(*s, open_end)) return false;
            // After a split the cut is a boundary between pieces: every piece
            // left lies before it.
            if (had_cut) straddling = false;
        } else {
            const auto& pre = std::get<Prefix>(step);
            for (Piece& pc : pieces_) {
                if (!(pre.first_only ? pc.first : pc.split_start)) continue;
                const std::string_view t(work_.data() + pc.start, pc.end - pc.start);
                if (t.empty() || t.starts_with(pre.text) || (pre.or_space && t.starts_with(' '))) continue;
                // The piece with its prefix, at the end of the buffer.
                const auto at = static_cast<std::uint32_t>(work_.size());
                work_ += pre.text;
                work_.append(t);
                if (pc.cut != kNoCut) pc.cut += static_cast<std::uint32_t>(pre.text.size());
                pc.start = at;
                pc.end = static_cast<std::uint32_t>(work_.size());
            }
        }
    }
    return !straddling;
}

void HfEncoder::piece(std::string_view piece, std::vector<Id>& ids) {
    if (!p_.metaspace.empty()) {
        // Metaspace's spaces, replaced in the pieces it split on them.
        piece_text_.clear();
        for (char c : piece) {
            if (c == ' ') piece_text_ += p_.metaspace;
            else piece_text_ += c;
        }
        piece = piece_text_;
    }
    bpe_encode(p_.bpe, piece, cache_, shared_.get(), ids, sym_);
}

void HfEncoder::model(std::vector<Id>& ids) {
    for (const Piece& pc : pieces_) piece(std::string_view(work_.data() + pc.start, pc.end - pc.start), ids);
}

// The one isolating Split, streamed: each match and each gap between is a
// piece, encoded as found. With a cut, the pieces before it; false when one
// runs across it or the scan stopped undecided before it (split_step's rule).
bool HfEncoder::split_and_encode(std::string_view subject, std::size_t cut, bool open_end, std::vector<Id>& ids) {
    const Regex& re = *one_split_->regex;
    const std::size_t n = subject.size();
    enum { go, stop, unclean };
    auto emit = [&](std::size_t a, std::size_t b) {
        if (a == b) return go;
        if (cut != std::string::npos) {
            if (a >= cut) return stop;  // the next part's
            if (b > cut) return unclean;
        }
        piece(subject.substr(a, b - a), ids);
        return go;
    };
    std::size_t pos = 0, prev = 0;
    std::pair<std::size_t, std::size_t> m;
    while (pos <= n) {
        const Regex::Next r = re.next(subject, pos, open_end, scratch_, m);
        if (r == Regex::Next::none) break;
        if (r == Regex::Next::partial) return cut != std::string::npos && prev >= cut;  // (open_end: a cut)
        for (const auto e : {emit(prev, m.first), emit(m.first, m.second)}) {
            if (e == unclean) return false;
            if (e == stop) return true;
        }
        prev = m.second;
        pos = Regex::after(subject, m);
    }
    // No match starts after prev: under open_end, the gap from there runs past the subject.
    if (open_end) return prev >= cut;
    return emit(prev, n) != unclean;
}

bool HfEncoder::text_segment(std::string_view seg, std::size_t cut, bool open_end, bool split_start, bool first,
                             std::vector<Id>& ids) {
    // Nothing to normalize, one split: straight from the text.
    if (one_split_ && p_.normalizers.empty() && p_.normalized_added.empty())
        return split_and_encode(seg, cut, open_end, ids);
    work_.clear();
    std::size_t wcut = std::string::npos;
    if (cut == std::string::npos) {
        normalize_into(seg, split_start);
    } else {
        // The two sides apart: every normalizer is local to the cut (cuts_lines).
        normalize_into(seg.substr(0, cut), split_start);
        wcut = work_.size();
        normalize_into(seg.substr(cut), false);
    }
    const std::size_t text_end = work_.size();
    if (p_.normalized_added.empty()) {
        if (one_split_) return split_and_encode(std::string_view(work_.data(), text_end), wcut, open_end, ids);
        if (!pre_tokenize(0, text_end, wcut, open_end, split_start, first)) return false;
        model(ids);
        return true;
    }
    // Added tokens that match the normalized text (no cut: cuts_lines is false).
    p_.normalized_added.find(std::string_view(work_.data(), text_end), nadded_);
    std::size_t at = 0;
    for (std::size_t k = 0; k <= nadded_.size(); ++k) {
        const std::size_t stop = k < nadded_.size() ? nadded_[k].start : text_end;
        if (stop > at) {
            if (!pre_tokenize(at, stop, std::string::npos, false, at > 0 || split_start, first && at == 0)) return false;
            model(ids);
        }
        if (k < nadded_.size()) {
            ids.push_back(nadded_[k].token->id);
            at = nadded_[k].stop;
        }
    }
    return true;
}

std::size_t HfEncoder::encode(std::string_view text, std::size_t end, Part part, std::vector<Id>& ids) {
    const std::size_t mark = ids.size();
    const bool open = !part.ends;
    if (open && !p_.cuts_lines) throw InternalError("a part of a document for a tokenizer that cannot cut one");
    const std::size_t limit = open ? text.size() : end;
    p_.raw_added.find(text.substr(0, limit), added_);
    // Segments: the text between added tokens, each encoded on its own.
    std::size_t at = 0;
    for (std::size_t k = 0; k <= added_.size(); ++k) {
        const std::size_t stop = k < added_.size() ? added_[k].start : limit;
        if (at >= end) break;
        if (stop > at) {
            const std::string_view seg = text.substr(at, stop - at);
            const bool seg_start = at > 0 || part.starts;
            const bool first = at == 0 && part.starts;
            if (stop <= end) {
                if (!text_segment(seg, std::string::npos, false, seg_start, first, ids)) {
                    ids.resize(mark);
                    return 0;
                }
            } else {
                // The segment runs past the cut: encoded up to it, looking
                // past it; its end is the text's only when nothing follows.
                const bool open_end = stop == text.size() && open;
                if (!text_segment(seg, end - at, open_end, seg_start, first, ids)) {
                    ids.resize(mark);
                    return 0;
                }
                break;
            }
        }
        if (k < added_.size()) {
            if (added_[k].start >= end) break;
            if (added_[k].stop > end) {  // a token across the cut
                ids.resize(mark);
                return 0;
            }
            ids.push_back(added_[k].token->id);
            at = added_[k].stop;
        }
    }
    return end;
}

// --- decoding --------------------------------------------------------------------

void HfTokenizer::decode(std::span<const Id> ids, Part part, std::string& out) const {
    for (Id id : ids) check_id(id);
    const Pipeline& p = *p_;
    if (!p.id_bytes.empty()) {
        for (Id id : ids) out += p.id_bytes[id];
        return;
    }
    if (!p.has_decoder) {
        // Hugging Face joins the tokens with spaces.
        for (std::size_t i = 0; i < ids.size(); ++i) {
            if (i > 0 || !part.starts) out += ' ';
            out += p.id_text[ids[i]];
        }
        return;
    }
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (Id id : ids) toks.push_back(p.id_text[id]);
    bool fused = false;  // one token now stands for the whole text
    for (const Decode& d : p.decoders) {
        if (std::holds_alternative<ByteLevelDecode>(d)) {
            std::string all;
            for (const std::string& t : toks) {
                const auto b = from_byte_chars(t);
                all += b ? *b : t;
            }
            toks.assign(1, std::move(all));
            fused = true;
        } else if (const auto* r = std::get_if<Replace>(&d)) {
            Regex::Scratch scratch;
            std::string n;
            for (std::string& t : toks) {
                n.clear();
                r->apply(t, n, scratch);
                t.swap(n);
            }
        } else if (std::holds_alternative<ByteFallbackDecode>(d)) {
            std::vector<std::string> n;
            std::string bytes;
            std::size_t count = 0;
            auto flush = [&] {
                if (!count) return;
                if (utf8_invalid(bytes) == std::string::npos) {
                    n.push_back(bytes);
                } else {
                    for (std::size_t i = 0; i < count; ++i) n.push_back("\xEF\xBF\xBD");  // U+FFFD, as Hugging Face
                }
                bytes.clear();
                count = 0;
            };
            for (std::string& t : toks) {
                if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                    std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
                    bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
                    ++count;
                } else {
                    flush();
                    n.push_back(std::move(t));
                }
            }
            flush();
            toks.swap(n);
        } else if (std::holds_alternative<FuseDecode>(d)) {
            std::string all;
            for (const std::string& t : toks) all += t;
            toks.assign(1, std::move(all));
            fused = true;
        } else if (const auto* s = std::get_if<StripDecode>(&d)) {
            // After a Fuse the one token is the whole text: its ends are the
            // text's only where this part starts or ends it.
            const std::size_t start = fused && !part.starts ? 0 : s->start;
            const std::size_t stop = fused && !part.ends ? 0 : s->stop;
            for (std::string& t : toks) {
                std::size_t a = 0, b = t.size();
                for (std::size_t k = 0; k < start && t.compare(a, s->content.size(), s->content) == 0; ++k)
                    a += s->content.size();
                for (std::size_t k = 0; k < stop && b >= a + s->content.size() &&
                                        t.compare(b - s->content.size(), s->content.size(), s->content) == 0;
                     ++k)
                    b -= s->content.size();
                t = t.substr(a, b - a);
            }
        } else {
            const auto& m = std::get<MetaspaceDecode>(d);
            for (std::size_t i = 0; i < toks.size(); ++i) {
                // The first token's replacements are all dropped, as
                // Hugging Face's decoder drops them.
                const bool drop = i == 0 && part.starts && m.strip_first;
                std::string n;
                const std::string& t = toks[i];
                for (std::size_t at = 0; at < t.size();) {
                    if (t.compare(at, m.replacement.size(), m.replacement) == 0) {
                        if (!drop) n += ' ';
                        at += m.replacement.size();
                    } else {
                        n += t[at++];
                    }
                }
                toks[i] = std::move(n);
            }
        }
    }
    for (const std::string& t : toks) out += t;
}

std::size_t HfTokenizer::decode_cut(std::span<const Id> ids) const {
    if (!byte_fallback_decode_) return ids.size();
    // Not inside a run of <0xXX> tokens: they join into characters.
    std::size_t n = ids.size();
    while (n > 0 && ids[n - 1] < p_->vocab && is_byte_token(ids[n - 1])) --n;
    return n > 0 ? n : ids.size();
}

}  // namespace

}  // namespace zinf::text::hf

namespace zinf::text {

std::unique_ptr<Tokenizer> open_hf(const std::string& path) {
    const std::string text = read_regular(path, kMaxTokenizerBytes, "a tokenizer.json");
    return std::make_unique<hf::HfTokenizer>(hf::load(text, path));
}

std::unique_ptr<Tokenizer> from_json(std::string_view json, const std::string& source) {
    return std::make_unique<hf::HfTokenizer>(hf::load(json, source));
}

}  // namespace zinf::text
