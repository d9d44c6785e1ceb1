// Tokenizing corpora into llm.c token files (text.hpp): documents read in
// order, packed into units of text, encoded by a pool of threads, written in
// order. A document larger than a unit is cut after a newline that a
// non-space follows, where the tokenizer allows (cuts_lines); a part whose cut
// the tokenizer would not have made is encoded again with what follows it,
// so the tokens are those of the whole document, and the same for any number
// of threads (the units do not depend on it).
#include "internal.hpp"

#include <zinf/data.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>

namespace zinf::text {

namespace {

// How far past a cut the encoder may look (a regex's look-ahead, the rest of
// a match): a part whose pieces need more is encoded again with what follows.
constexpr std::size_t kLookahead = 4 * KiB;
constexpr std::size_t kReadBlock = 1 * MiB;

// One document's stretch in a unit: its text, then what follows it in the
// document (looked at, not encoded).
struct DocPart {
    std::size_t offset = 0, size = 0, look = 0;  // into Unit::text
    bool starts = true, ends = true;
    std::string source;        // "file", "file line 12": for messages
    std::uint64_t doc_offset;  // of the part in its document, bytes
};

struct Unit {
    std::string text;
    std::vector<DocPart> parts;
    std::uint64_t input_bytes = 0;
    // Filled by a worker:
    std::vector<Id> ids;
    std::vector<std::size_t> part_end;  // ids of parts [0, i] end at part_end[i]
    bool last_unclean = false;          // the last part's cut is not the tokenizer's: encode again
    std::exception_ptr error;
    bool done = false;
};

std::size_t unit_cost(const Unit& u) {
    // The text, and at worst four bytes of id per byte of it (byte
    // fallback), with the specials of each document.
    return u.text.size() * 5 + u.parts.size() * 64;
}

// The ids of one document part, with the separator and the post-processor's
// ids where the document starts and ends. False when the part's cut is not
// one the tokenizer would make (nothing appended then).
bool encode_part(Encoder& e, const Tokenizer& t, const TokenizeOptions& o, std::string_view text, std::size_t end,
                 const DocPart& p, std::vector<Id>& ids) {
    const std::size_t mark = ids.size();
    if (p.starts) {
        if (o.separator) ids.push_back(*o.separator);
        if (o.specials)
            for (Id b : t.begin_ids()) ids.push_back(b);
    }
    try {
        if (e.encode(text, end, Part{p.starts, p.ends}, ids) != end) {
            ids.resize(mark);
            return false;
        }
    } catch (const Error& err) {
        if (err.exit_code() != exit_code::data) throw;
        // Where in the corpus: the file (and line), and the byte of the document.
        const std::uint64_t at = p.doc_offset + err.offset().value_or(0);
        throw DataError(p.source + ": document byte " + std::to_string(at) + ": " + err.message(),
                        {0, err.path().empty() ? t.path() : err.path(), {}, -1});
    }
    if (p.ends && o.specials)
        for (Id b : t.end_ids()) ids.push_back(b);
    return true;
}

// The open document's text not yet in a unit: read into at the end (never
// zero-filled first), taken from the front, moved back to the start only
// when the front has passed half of it.
class Pending {
public:
    std::string_view view() const { return {buf_.get() + begin_, end_ - begin_}; }
    std::size_t size() const { return end_ - begin_; }
    void clear() { begin_ = end_ = 0; }
    void drop(std::size_t n) {
        begin_ += n;
        if (begin_ == end_) clear();
    }
    void assign(std::string_view s) {
        clear();
        std::memcpy(room(s.size()), s.data(), s.size());
        end_ += s.size();
    }
    // Where `n` more bytes go; grow(n) once they are there.
    char* room(std::size_t n) {
        if (begin_ > 0 && (begin_ * 2 >= cap_ || end_ + n > cap_)) {
            std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
            end_ -= begin_;
            begin_ = 0;
        }
        if (end_ + n > cap_) {
            const std::size_t cap = std::max(cap_ * 2, end_ + n);
            std::unique_ptr<char[]> b(new char[cap]);
            std::memcpy(b.get(), buf_.get() + begin_, end_ - begin_);
            end_ -= begin_;
            begin_ = 0;
            buf_ = std::move(b);
            cap_ = cap;
        }
        return buf_.get() + end_;
    }
    void grow(std::size_t n) { end_ += n; }

private:
    std::unique_ptr<char[]> buf_;
    std::size_t cap_ = 0, begin_ = 0, end_ = 0;
};

// Reads the inputs and cuts them into units.
class Reader {
public:
    Reader(const Tokenizer& t, const TokenizeOptions& o, std::size_t unit_bytes)
        : t_(t), o_(o), unit_bytes_(unit_bytes), doc_limit_(std::max<std::uint64_t>(o.memory_bytes / 4, 64 * KiB)) {}

    // The next unit, or false at the end of the inputs (its buffers kept).
    bool next(Unit& u) {
        u.text.clear();
        u.parts.clear();
        u.ids.clear();
        u.part_end.clear();
        u.input_bytes = 0;
        u.last_unclean = false;
        u.error = nullptr;
        u.done = false;
        while (u.text.size() < unit_bytes_) {
            if (!doc_open_ && !open_document()) break;
            if (!fill(u)) continue;  // the document ended, more may fit
            break;                   // a part was cut: the unit is full
        }
        return !u.parts.empty();
    }
    std::uint64_t documents() const { return documents_; }
    std::uint64_t cut_documents() const { return cut_documents_; }

private:
    // Starts the next document: the rest of a text file, or a JSON Lines
    // record's field. False at the end of the inputs.
    bool open_document() {
        for (;;) {
            if (!fd_) {
                if (next_input_ >= o_.inputs.size()) return false;
                path_ = o_.inputs[next_input_++];
                fd_ = open_input(path_ == "-" ? "/dev/stdin" : path_, Input::stream);
                eof_ = false;
                line_ = 0;
                buf_.clear();
                buf_at_ = 0;
                if (o_.field.empty()) {
                    start_document(path_);
                    return true;
                }
            }
            if (o_.field.empty()) {  // a text file is one document: it has ended
                fd_ = Fd();
                continue;
            }
            std::string line;
            if (!read_line(line)) {
                fd_ = Fd();
                continue;
            }
            ++line_;
            input_bytes_ += line.size() + 1;
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line
            const std::string where = path_ + " line " + std::to_string(line_);
            const json::Json rec = json::parse_line(line, path_, line_);
            const auto it = rec.find(o_.field);
            if (it == rec.end()) throw DataError("line " + std::to_string(line_) + ": no \"" + o_.field + "\" field",
                                                 {0, path_, {}, -1});
            if (!it->is_string())
                throw DataError("line " + std::to_string(line_) + ": \"" + o_.field + "\" is " + it->type_name() +
                                    ", not a string",
                                {0, path_, {}, -1});
            start_document(where);
            pending_.assign(it->get_ref<const std::string&>());
            doc_done_reading_ = true;
            return true;
        }
    }

    void start_document(const std::string& source) {
        doc_open_ = true;
        doc_source_ = source;
        doc_offset_ = 0;
        doc_started_ = false;
        doc_done_reading_ = false;
        pending_.clear();
        ++documents_;
    }

    // Reads more of a text file's document into pending_; false at its end.
    bool read_more() {
        char* to = pending_.room(kReadBlock);
        long n;
        do {
            n = sys::read(fd_.get(), to, kReadBlock, path_);
        } while (n < 0 && errno == EINTR);
        if (n < 0) throw_errno("read", errno, path_);
        pending_.grow(static_cast<std::size_t>(n));
        input_bytes_ += static_cast<std::uint64_t>(n);
        return n > 0;
    }

    bool read_line(std::string& line) {
        line.clear();
        for (;;) {
            const std::size_t nl = buf_.find('\n', buf_at_);
            if (nl != std::string::npos) {
                line.append(buf_, buf_at_, nl - buf_at_);
                buf_at_ = nl + 1;
                return true;
            }
            line.append(buf_, buf_at_);
            buf_.clear();
            buf_at_ = 0;
            if (line.size() > doc_limit_)
                throw UsageError(path_ + " line " + std::to_string(line_ + 1) + " is longer than " +
                                 format_size(doc_limit_) + ", a quarter of --memory: give more --memory");
            if (eof_) return !line.empty();
            buf_.resize(kReadBlock);
            long n;
            do {
                n = sys::read(fd_.get(), buf_.data(), kReadBlock, path_);
            } while (n < 0 && errno == EINTR);
            if (n < 0) throw_errno("read", errno, path_);
            buf_.resize(static_cast<std::size_t>(n));
            if (n == 0) eof_ = true;
        }
    }

    // Whether the document may be cut at p: after a newline that a
    // non-space follows (a byte that is not UTF-8 is no space).
    bool cut_at(std::size_t p) const {
        const std::string_view s = pending_.view();
        if (p == 0 || p >= s.size() || s[p - 1] != '\n') return false;
        const std::size_t n = utf8_char(s, p);
        return n == 0 || !is_white_space(utf8_decode(s, p, n));
    }
    // The last such place at or before `max`, the first after `from`; npos when none.
    std::size_t last_cut(std::size_t max) const {
        for (std::size_t p = std::min(max, pending_.size()); p > 0; --p)
            if (cut_at(p)) return p;
        return std::string::npos;
    }
    std::size_t first_cut(std::size_t from) const {
        const std::string_view s = pending_.view();
        for (std::size_t nl = s.find('\n', from); nl != std::string::npos; nl = s.find('\n', nl + 1))
            if (cut_at(nl + 1)) return nl + 1;
        return std::string::npos;
    }

    void add_part(Unit& u, std::size_t size, std::size_t look, bool ends) {
        DocPart p;
        p.offset = u.text.size();
        p.size = size;
        p.look = look;
        p.starts = !doc_started_;
        p.ends = ends;
        p.source = doc_source_;
        p.doc_offset = doc_offset_;
        if (p.starts && !ends) ++cut_documents_;
        u.text.append(pending_.view().substr(0, size + look));
        u.parts.push_back(std::move(p));
        pending_.drop(size);
        doc_offset_ += size;
        doc_started_ = true;
        if (ends) {
            doc_open_ = false;
            pending_.clear();
        }
    }

    [[noreturn]] void too_long(const std::string& what) const {
        throw UsageError(doc_source_ + ": from document byte " + std::to_string(doc_offset_) + ", " + what +
                         " of more than " + format_size(doc_limit_) + " (a quarter of --memory): give more --memory");
    }

    // Moves the open document's text into the unit: all of it when it ends
    // within the room left (false: the unit may take more), else a part cut
    // to fill the unit, or nothing when the document is better started in a
    // unit of its own (true: the unit is done).
    bool fill(Unit& u) {
        const bool cuts = t_.cuts_lines();
        for (;;) {
            const std::size_t room = unit_bytes_ > u.text.size() ? unit_bytes_ - u.text.size() : 0;
            if (doc_done_reading_ && pending_.size() <= room) {
                add_part(u, pending_.size(), 0, true);
                return false;
            }
            if (!cuts) {
                if (doc_done_reading_) {
                    if (!u.parts.empty()) return true;
                    add_part(u, pending_.size(), 0, true);
                    return false;
                }
                if (pending_.size() > doc_limit_) too_long("a document, which " + t_.kind() + " cannot cut,");
            } else if (doc_done_reading_ || pending_.size() >= room + kLookahead) {
                // A cut that fills the unit, with the text after it to look at.
                auto take = [&](std::size_t cut) {
                    if (cut == std::string::npos || (!doc_done_reading_ && cut + kLookahead > pending_.size()))
                        return false;
                    add_part(u, cut, std::min(kLookahead, pending_.size() - cut), false);
                    return true;
                };
                if (take(last_cut(room))) return true;
                if (!u.parts.empty()) return true;
                if (take(first_cut(room))) return true;  // no place within a unit: the first past it
                if (doc_done_reading_) {  // no place at all
                    add_part(u, pending_.size(), 0, true);
                    return false;
                }
                if (pending_.size() > doc_limit_) too_long("a stretch with no place to cut (a newline then a non-space)");
            }
            if (!read_more()) doc_done_reading_ = true;
        }
    }

public:
    std::uint64_t input_bytes() const { return input_bytes_; }

private:
    const Tokenizer& t_;
    const TokenizeOptions& o_;
    std::size_t unit_bytes_;
    std::uint64_t doc_limit_;
    std::size_t next_input_ = 0;
    Fd fd_;
    std::string path_;
    bool eof_ = false;
    std::uint64_t line_ = 0;
    std::string buf_;
    std::size_t buf_at_ = 0;
    // The open document:
    bool doc_open_ = false, doc_started_ = false, doc_done_reading_ = false;
    std::string doc_source_;
    Pending pending_;
    std::uint64_t doc_offset_ = 0;
    std::uint64_t documents_ = 0, cut_documents_ = 0, input_bytes_ = 0;
};

// The bytes of the inputs when all are regular files, else nothing (standard
// input, a pipe, or one that cannot be read: open_input says why later).
std::optional<std::uint64_t> regular_size(const std::vector<std::string>& inputs) {
    std::uint64_t total = 0;
    for (const std::string& path : inputs) {
        struct stat st {};
        if (path == "-" || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
        total += static_cast<std::uint64_t>(st.st_size);
    }
    return total;
}

}  // namespace

TokenizeSummary tokenize_files(const Tokenizer& t, const TokenizeOptions& o) {
    if (o.inputs.empty()) throw UsageError("no input to tokenize");
    if (o.output.empty()) throw UsageError("no output file");
    if (o.threads == 0 || o.threads > 1024) throw UsageError("--threads " + std::to_string(o.threads) + ": 1 to 1024");
    if (o.memory_bytes < 1 * MiB) throw UsageError("--memory " + format_size(o.memory_bytes) + ": at least 1MiB");
    if (o.val_fraction != 0 && (o.val_output.empty() || o.val_output == o.output))
        throw UsageError("the validation tokens need a file of their own");
    (void)data::val_count(0, o.val_fraction);  // the fraction's check
    if (o.separator && *o.separator >= t.vocab())
        throw UsageError("the separator " + std::to_string(*o.separator) + " is past the tokenizer's vocabulary of " +
                         std::to_string(t.vocab()));
    Timer timer;
    TokenizeSummary sum;
    sum.wide = t.vocab() > 65536;
    // Units do not depend on the threads, so neither do the tokens: a
    // hundred-and-twenty-eighth of the memory, and where the inputs are
    // files of a known size, at most a sixty-fourth of them, so that a small
    // corpus still gives every thread units to take; and at most 512KiB, so
    // that a unit's text and ids stay in a core's caches while it is encoded
    // (at 100 MB, 512KiB units against 1.5MB: one thread 15% faster, two 18%).
    std::uint64_t unit_max = o.memory_bytes / 128;
    if (const auto total = regular_size(o.inputs)) unit_max = std::min(unit_max, *total / 64);
    const std::size_t unit_bytes = std::clamp<std::uint64_t>(unit_max, 16 * KiB, 512 * KiB);
    const std::size_t window_bytes = o.memory_bytes / 2;
    const std::size_t window_units = 4 * std::size_t{o.threads} + 4;
    // An eighth of the memory for the encoders' caches: one thread's own;
    // on more, half of it for the cache they share (a word's merges worked
    // out once for all of them, the table in the cores' shared cache once),
    // half for their own, which take the words that come once it is full.
    const std::uint64_t cache_share = o.threads > 1 ? o.memory_bytes / 16 : 0;
    const std::uint64_t cache_bytes =
        std::clamp<std::uint64_t>((o.memory_bytes / 8 - cache_share) / o.threads, 256 * KiB, 16 * MiB);
    const std::shared_ptr<SharedCache> shared_cache =
        cache_share ? t.shared_cache(std::clamp<std::uint64_t>(cache_share, 256 * KiB, 64 * MiB)) : nullptr;

    data::TokenFileWriter out(o.output, sum.wide);
    Reader reader(t, o, unit_bytes);

    std::mutex mu;
    std::condition_variable work_cv, done_cv;
    std::deque<std::shared_ptr<Unit>> todo;
    bool closing = false;
    std::vector<std::thread> pool;
    // A unit's parts into its ids (by whichever thread takes it: the ids do
    // not depend on the encoder or its cache).
    auto encode_unit = [&](Encoder& enc, Unit& u) {
        try {
            u.ids.reserve(u.text.size() / 3 + 4 * u.parts.size());  // (about a token per 4 bytes)
            for (std::size_t i = 0; i < u.parts.size(); ++i) {
                const DocPart& p = u.parts[i];
                const std::string_view text(u.text.data() + p.offset, p.size + p.look);
                if (!encode_part(enc, t, o, text, p.size, p, u.ids)) u.last_unclean = true;
                u.part_end.push_back(u.ids.size());
            }
        } catch (...) {
            u.error = std::current_exception();
        }
        {
            std::lock_guard lk(mu);
            u.done = true;
        }
        done_cv.notify_all();
    };
    auto worker = [&] {
        auto enc = t.encoder(cache_bytes, shared_cache);
        for (;;) {
            std::shared_ptr<Unit> u;
            {
                std::unique_lock lk(mu);
                work_cv.wait(lk, [&] { return closing || !todo.empty(); });
                if (todo.empty()) return;
                u = std::move(todo.front());
                todo.pop_front();
            }
            encode_unit(*enc, *u);
        }
    };
    auto stop_pool = [&] {
        {
            std::lock_guard lk(mu);
            closing = true;
            todo.clear();
        }
        work_cv.notify_all();
        for (auto& th : pool) th.join();
        pool.clear();
    };
    // --threads N encode on N threads: N - 1 workers, and this one, which
    // reads, cuts and writes, and encodes a waiting unit whenever the one it
    // must write next is not done (so N threads are busy on N cores, not N + 1).
    for (unsigned i = 1; i < o.threads; ++i) pool.emplace_back(worker);

    try {
        auto own = t.encoder(cache_bytes, shared_cache);  // for the units this thread takes, and the parts encoded again
        std::deque<std::shared_ptr<Unit>> inflight;
        std::vector<std::shared_ptr<Unit>> spare;
        std::size_t inflight_bytes = 0;
        bool more = true;
        // A part whose cut was not clean, waiting to be joined to what follows.
        std::string carry;
        DocPart carry_part;
        bool carrying = false;
        std::vector<Id> redo;
        std::uint64_t input_done = 0;
        for (;;) {
            if (o.stop && o.stop->load()) throw Interrupted("interrupted: nothing was written", {0, o.output, {}, -1});
            while (more && inflight.size() < window_units && (inflight.empty() || inflight_bytes < window_bytes)) {
                // A unit written already, its buffers grown: no new pages to fault in.
                std::shared_ptr<Unit> u;
                if (!spare.empty()) {
                    u = std::move(spare.back());
                    spare.pop_back();
                } else {
                    u = std::make_shared<Unit>();
                }
                const std::uint64_t before = reader.input_bytes();
                if (!reader.next(*u)) {
                    more = false;
                    break;
                }
                u->input_bytes = reader.input_bytes() - before;
                inflight_bytes += unit_cost(*u);
                inflight.push_back(u);
                {
                    std::lock_guard lk(mu);
                    todo.push_back(u);
                }
                work_cv.notify_one();
            }
            if (inflight.empty()) break;
            std::shared_ptr<Unit> u = inflight.front();
            for (;;) {
                std::unique_lock lk(mu);
                done_cv.wait(lk, [&] { return u->done || !todo.empty(); });
                if (u->done) break;
                std::shared_ptr<Unit> w = std::move(todo.front());
                todo.pop_front();
                lk.unlock();
                encode_unit(*own, *w);
            }
            inflight.pop_front();
            inflight_bytes -= unit_cost(*u);
            if (u->error) std::rethrow_exception(u->error);
            std::size_t from = 0;  // the unit's ids written so far
            for (std::size_t i = 0; i < u->parts.size(); ++i) {
                const DocPart& p = u->parts[i];
                const std::size_t end = u->part_end[i];
                const bool last = i + 1 == u->parts.size();
                if (carrying && i == 0) {
                    // The part before did not end where its tokenizer would
                    // have cut: both again as one, with this one's look-ahead.
                    carry.append(u->text, p.offset, p.size + p.look);
                    const std::size_t size = carry.size() - p.look;
                    DocPart joined = p;
                    joined.starts = carry_part.starts;
                    joined.doc_offset = carry_part.doc_offset;
                    redo.clear();
                    ++sum.redone_parts;
                    if (encode_part(*own, t, o, carry, size, joined, redo)) {
                        out.append(redo);
                        carrying = false;
                        carry.clear();
                    } else {
                        carry.resize(size);
                        carry_part = joined;
                        if (carry.size() > o.memory_bytes / 4)
                            throw UsageError(p.source + ": from document byte " + std::to_string(joined.doc_offset) +
                                             ", more than " + format_size(o.memory_bytes / 4) +
                                             " of text the tokenizer will not split: give more --memory");
                    }
                } else if (last && u->last_unclean) {
                    carry.assign(u->text, p.offset, p.size);
                    carry_part = p;
                    carrying = true;
                } else {
                    out.append(std::span<const Id>(u->ids).subspan(from, end - from));
                }
                from = end;
            }
            input_done += u->input_bytes;
            if (o.progress) o.progress(input_done, out.count());
            spare.push_back(std::move(u));
        }
        if (carrying) throw InternalError("a document's last part was left unencoded");
        stop_pool();
        sum.documents = reader.documents();
        sum.cut_documents = reader.cut_documents();
        sum.input_bytes = reader.input_bytes();
        if (out.count() == 0)
            throw DataError("the inputs hold no text: no tokens to write", {0, o.inputs.front(), {}, -1});
        if (o.val_fraction > 0) {
            const std::uint64_t n_val = data::val_count(out.count(), o.val_fraction);
            if (n_val >= out.count())
                throw DataError(std::to_string(out.count()) + " tokens are too few to hold out " +
                                    std::to_string(o.val_fraction) + " of them and train on the rest",
                                {0, o.inputs.front(), {}, -1});
            data::TokenFileWriter val(o.val_output, sum.wide);
            out.move_tail(n_val, val);
            val.commit();
            sum.val_tokens = n_val;
        }
        sum.tokens = out.count();
        out.commit();
    } catch (...) {
        stop_pool();
        throw;
    }
    sum.seconds = timer.seconds();
    return sum;
}

std::uint64_t decode_file(const Tokenizer& t, const std::string& token_file,
                          const std::function<void(std::string_view)>& write, std::size_t chunk_tokens) {
    const data::Tokens tokens = data::Tokens::open(token_file);
    const data::TokenSpan all = tokens.tokens();
    std::vector<Id> ids;
    std::string text;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    std::uintptr_t released = 0;  // the mapping's pages behind us, given back
    for (std::size_t at = 0; at < all.size();) {
        const std::size_t n = std::min(chunk_tokens, all.size() - at);
        ids.resize(n);
        for (std::size_t i = 0; i < n; ++i) ids[i] = all[at + i];
        const bool last = at + n == all.size();
        const std::size_t take = last ? n : std::max<std::size_t>(1, t.decode_cut(ids));
        text.clear();
        try {
            t.decode(std::span<const Id>(ids).first(take), Part{at == 0, last && take == n}, text);
        } catch (const DataError& e) {
            throw DataError(e.message() + " (token offset " + std::to_string(at) + " of " + token_file + ")",
                            {0, t.path(), {}, -1});
        }
        write(text);
        at += take;
        // The tokens read: a long file's pages need not stay resident.
        const auto upto = reinterpret_cast<std::uintptr_t>(static_cast<const char*>(all.data()) +
                                                           at * (all.wide() ? 4 : 2)) / page * page;
        if (released == 0) released = reinterpret_cast<std::uintptr_t>(all.data()) / page * page;
        if (upto > released + 16 * MiB) {
            ::madvise(reinterpret_cast<void*>(released), upto - released, MADV_DONTNEED);
            released = upto;
        }
    }
    return all.size();
}

namespace {
std::uint64_t hash_file(Xxh3Stream& h, const std::string& path) {
    const Fd fd = open_input(path, Input::regular);
    std::vector<char> buf(kReadBlock);
    std::uint64_t total = 0;
    for (;;) {
        long n;
        do {
            n = sys::read(fd.get(), buf.data(), buf.size(), path);
        } while (n < 0 && errno == EINTR);
        if (n < 0) throw_errno("read", errno, path);
        if (n == 0) break;
        h.update(std::as_bytes(std::span(buf.data(), static_cast<std::size_t>(n))));
        total += static_cast<std::uint64_t>(n);
    }
    return total;
}
}  // namespace

std::string cache_path(const Tokenizer& t, const std::string& text_path, const TokenizeOptions& how) {
    // What changes the tokens: the tokenizer's bytes, the text's, the
    // separator and the specials, and the format this code writes.
    Xxh3Stream h;
    const std::string head = "zinf.tokenize/1 sep=" + (how.separator ? std::to_string(*how.separator) : "none") +
                             " specials=" + (how.specials ? "1" : "0") + " tokenizer=" + t.kind() + "\n";
    h.update(std::as_bytes(std::span(head.data(), head.size())));
    if (t.path() != "bytes") hash_file(h, t.path());
    hash_file(h, text_path);
    return text_path + "." + hex64(h.digest()) + ".tokens.bin";
}

Cached cached_token_file(const Tokenizer& t, const std::string& text_path, const TokenizeOptions& how) {
    Cached c;
    c.path = cache_path(t, text_path, how);
    std::error_code ec;
    if (std::filesystem::exists(c.path, ec)) {
        try {
            (void)data::Tokens::open(c.path);  // a file left damaged is made again
            return c;
        } catch (const DataError& e) {
            log::warn(c.path + " is not a whole token file (" + e.message() + "): tokenizing " + text_path + " again");
        }
    }
    TokenizeOptions o = how;
    o.inputs = {text_path};
    o.field.clear();
    o.output = c.path;
    o.val_fraction = 0;
    o.val_output.clear();
    c.summary = tokenize_files(t, o);
    c.made = true;
    return c;
}

}  // namespace zinf::text
