// Token files in llm.c's format, text files as byte tokens, the vocabulary
// check, the held-out split and the unigram entropy.
#include <zinf/data.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace zinf::data {

// The header's int32 words and the uint16 tokens are used as they lie on disk.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

// The size of a regular file open on `fd`; DataError for anything else.
struct stat regular_stat(const Fd& fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", errno, path);
    if (!S_ISREG(st.st_mode)) throw DataError("not a regular file", {0, path, {}, -1});
    return st;
}

bool same_time(const struct timespec& a, const struct timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

}  // namespace

namespace detail {

// An open token file and what it was when opened: every read is checked
// against it, so that a file changed under a run is an error, never a
// signal or a batch of another file's tokens.
struct TokenFile {
    Fd fd;
    std::string path;
    std::uint64_t width = 2;  // bytes per token
    struct stat at_open {};

    // Bytes [offset, offset + n) of the file into `out`.
    void pread(std::uint64_t offset, std::byte* out, std::uint64_t n) const {
        for (std::uint64_t done = 0; done < n;) {
            const long got = sys::pread(fd.get(), out + done, n - done, offset + done, path);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) throw_errno("pread", errno, path, offset + done);
            if (got == 0) {
                changed(offset + done);
                throw DataError("the token file ends at byte " + std::to_string(offset + done) +
                                    ", before the tokens its header counts",
                                {0, path, offset + done, -1});
            }
            done += static_cast<std::uint64_t>(got);
        }
        changed(offset);
    }

    // DataError when the file is no longer what was opened: another size or
    // modification time (truncated or rewritten in place), or its name
    // leading to another file or none (replaced, removed).
    void changed(std::uint64_t offset) const {
        struct stat now {};
        if (::fstat(fd.get(), &now) != 0) throw_errno("fstat", errno, path, offset);
        std::string what;
        if (now.st_size != at_open.st_size)
            what = "is " + std::to_string(now.st_size) + " bytes now, " + std::to_string(at_open.st_size) +
                   " when it was opened (" + (now.st_size < at_open.st_size ? "truncated" : "written to") + ")";
        else if (!same_time(now.st_mtim, at_open.st_mtim))
            what = "was written to (its modification time changed)";
        else if (struct stat named {}; ::stat(path.c_str(), &named) != 0)
            what = "is no longer there under its name (removed or being replaced)";
        else if (named.st_dev != at_open.st_dev || named.st_ino != at_open.st_ino)
            what = "was replaced: its name leads to another file";
        if (what.empty()) return;
        throw DataError("the token file changed during the run: it " + what +
                            " (a data script rewriting it in place? write a new file, and give it to the next run)",
                        {0, path, offset, -1});
    }
};

}  // namespace detail

void TokenSpan::read(std::size_t first, std::span<std::uint32_t> out) const {
    if (out.empty()) return;
    if (!file_) {
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = (*this)[first + i];
        return;
    }
    const std::uint64_t w = file_->width, at = kHeaderBytes + (first_ + first) * w;
    // Read where the widest tokens land, then widened in place from the back.
    auto* bytes = reinterpret_cast<std::byte*>(out.data());
    file_->pread(at, bytes, out.size() * w);
    if (w == 2) {
        const auto* narrow = reinterpret_cast<const std::uint16_t*>(bytes);
        for (std::size_t i = out.size(); i-- > 0;) {
            std::uint16_t v;
            std::memcpy(&v, narrow + i, 2);
            out[i] = v;
        }
    }
}

void TokenSpan::scan(const std::function<void(std::span<const std::uint32_t>)>& fn, std::size_t piece) const {
    std::vector<std::uint32_t> buf(std::min(n_, std::max<std::size_t>(piece, 1)));
    for (std::size_t i = 0; i < n_;) {
        const std::size_t k = std::min(buf.size(), n_ - i);
        read(i, std::span(buf).first(k));
        fn(std::span<const std::uint32_t>(buf).first(k));
        i += k;
    }
}

Tokens::Tokens() = default;
Tokens::~Tokens() = default;
Tokens::Tokens(Tokens&&) noexcept = default;
Tokens& Tokens::operator=(Tokens&&) noexcept = default;

Tokens Tokens::open(const std::string& path) {
    Fd fd = open_input(path, Input::regular);  // a FIFO is refused, never waited for
    const struct stat st = regular_stat(fd, path);
    const auto bytes = static_cast<std::uint64_t>(st.st_size);
    auto bad = [&](const std::string& what, std::optional<std::uint64_t> at = {}) {
        return DataError(what, {0, path, at, -1});
    };
    if (bytes < kHeaderBytes)
        throw bad("file is " + std::to_string(bytes) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                  "-byte header of a token file");
    Tokens t;
    t.path_ = path;
    t.file_ = std::make_unique<detail::TokenFile>();
    detail::TokenFile& f = *t.file_;
    f.fd = std::move(fd);
    f.path = path;
    f.at_open = st;
    std::array<std::int32_t, 3> h{};
    f.pread(0, reinterpret_cast<std::byte*>(h.data()), sizeof h);
    if (h[0] != kMagic)
        throw bad("magic " + std::to_string(h[0]) + " is not a token file's " + std::to_string(kMagic), 0);
    if (h[1] != kVersion && h[1] != kVersionWide)
        throw bad("token file version " + std::to_string(h[1]) + " is not supported (" + std::to_string(kVersion) +
                      ", uint16 tokens, or " + std::to_string(kVersionWide) + ", uint32 tokens)",
                  4);
    if (h[2] <= 0) throw bad("token count " + std::to_string(h[2]) + " in the header is not positive", 8);
    const auto n = static_cast<std::uint64_t>(h[2]);
    f.width = h[1] == kVersionWide ? 4 : 2;
    const std::uint64_t want = kHeaderBytes + f.width * n;
    if (bytes != want)
        throw bad("file is " + std::to_string(bytes) + " bytes, but its header's " + std::to_string(n) +
                  " tokens need " + std::to_string(kHeaderBytes) + " + " + std::to_string(f.width) + "*" +
                  std::to_string(n) + " = " + std::to_string(want) + " bytes" + (bytes < want ? " (truncated?)" : ""));
    t.tokens_ = TokenSpan(t.file_.get(), 0, static_cast<std::size_t>(n), f.width == 4);
    t.tokens_.scan([&](std::span<const std::uint32_t> piece) {
        for (std::uint32_t v : piece) t.max_token_ = std::max(t.max_token_, v);
    });
    return t;
}

Tokens Tokens::text(const std::string& path) {
    Fd fd = open_input(path, Input::regular);  // a FIFO is refused, never waited for
    const auto bytes = static_cast<std::uint64_t>(regular_stat(fd, path).st_size);
    if (bytes == 0) throw DataError("text file is empty: byte-level tokens need at least one byte", {0, path, {}, -1});
    // Read whole (a text is small): what was read is what trains.
    std::vector<unsigned char> raw(bytes);
    for (std::uint64_t done = 0; done < bytes;) {
        const long got = sys::pread(fd.get(), raw.data() + done, bytes - done, done, path);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw_errno("pread", errno, path, done);
        if (got == 0)
            throw DataError("the text file ends at byte " + std::to_string(done) + " of the " + std::to_string(bytes) +
                                " it had when opened: it changed while it was read",
                            {0, path, done, -1});
        done += static_cast<std::uint64_t>(got);
    }
    Tokens t;
    t.path_ = path;
    t.text_.assign(raw.begin(), raw.end());
    t.tokens_ = t.text_;
    for (std::uint16_t v : t.text_) t.max_token_ = std::max<std::uint32_t>(t.max_token_, v);
    return t;
}

namespace {
constexpr std::size_t kWriteBuffer = 1 << 20;  // bytes gathered per write
constexpr std::uint64_t kSyncStretch = 16 << 20;  // bytes written between syncs behind the writer

void check_count(std::uint64_t n, const std::string& path) {
    if (n == 0) throw DataError("no tokens to write: a token file holds at least one", {0, path, {}, -1});
    if (n > static_cast<std::uint64_t>(INT32_MAX))
        throw DataError(std::to_string(n) + " tokens are more than a token file's header can count (" +
                            std::to_string(INT32_MAX) + ")",
                        {0, path, {}, -1});
}
}  // namespace

TokenFileWriter::TokenFileWriter(const std::string& path, bool wide)
    : file_(AtomicFile::create(path)), wide_(wide) {
    // The header's place, written for real at commit().
    const std::array<std::byte, kHeaderBytes> zero{};
    file_.write(zero);
    buffer_.reserve(kWriteBuffer);
}

void TokenFileWriter::append(std::span<const std::uint32_t> tokens) {
    const std::size_t width = wide_ ? 4 : 2;
    for (std::size_t i = 0; i < tokens.size();) {
        const std::size_t room = (kWriteBuffer - buffer_.size()) / width;
        const std::size_t n = std::min(room, tokens.size() - i);
        const std::size_t at = buffer_.size();
        buffer_.resize(at + n * width);
        if (wide_) {
            std::memcpy(buffer_.data() + at, tokens.data() + i, n * 4);
        } else {
            for (std::size_t k = 0; k < n; ++k) {
                const std::uint32_t t = tokens[i + k];
                if (t > 0xFFFF)
                    throw InternalError("token " + std::to_string(t) + " in a version 1 (uint16) token file " + path());
                const auto v = static_cast<std::uint16_t>(t);
                std::memcpy(buffer_.data() + at + 2 * k, &v, 2);
            }
        }
        i += n;
        count_ += n;
        if (buffer_.size() + width > kWriteBuffer) flush();
    }
}

void TokenFileWriter::flush() {
    file_.write(buffer_);
    buffer_.clear();
    // A corpus's tokens reach the disk while the rest are made, not all at
    // commit (at 100 MB of text, 48 MB of tokens: commit's fsync 35 ms
    // before, the last stretch's few ms after).
    if (file_.size() >= synced_ + kSyncStretch && file_.sync_behind()) synced_ = file_.size();
}

void TokenFileWriter::move_tail(std::uint64_t n, TokenFileWriter& to) {
    if (n > count_) throw InternalError("moving " + std::to_string(n) + " of " + std::to_string(count_) + " tokens");
    if (to.wide_ != wide_) throw InternalError("moving tokens between token files of two widths");
    flush();
    const std::uint64_t width = wide_ ? 4 : 2;
    const std::uint64_t first = kHeaderBytes + (count_ - n) * width;
    std::vector<std::byte> piece;
    for (std::uint64_t at = first; at < file_.size();) {
        piece.resize(std::min<std::uint64_t>(kWriteBuffer, file_.size() - at));
        file_.pread(piece, at);
        to.flush();
        to.file_.write(piece);
        to.count_ += piece.size() / width;
        at += piece.size();
    }
    file_.truncate(first);
    count_ -= n;
}

void TokenFileWriter::commit() {
    check_count(count_, path());
    flush();
    std::array<std::int32_t, kHeaderInts> header{};
    header[0] = kMagic;
    header[1] = wide_ ? kVersionWide : kVersion;
    header[2] = static_cast<std::int32_t>(count_);
    file_.pwrite(std::as_bytes(std::span(header)), 0);
    file_.commit();
}

void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens) {
    check_count(tokens.size(), path);
    TokenFileWriter w(path, false);
    std::vector<std::uint32_t> wide(tokens.begin(), tokens.end());
    w.append(wide);
    w.commit();
}
void write_wide_token_file(const std::string& path, std::span<const std::uint32_t> tokens) {
    check_count(tokens.size(), path);
    TokenFileWriter w(path, true);
    w.append(tokens);
    w.commit();
}

void check_vocab(const Tokens& tokens, std::uint64_t vocab) {
    if (tokens.max_token() < vocab) return;
    const TokenSpan t = tokens.tokens();
    std::size_t i = 0;
    std::uint32_t v = 0;
    bool found = false;
    t.scan([&](std::span<const std::uint32_t> piece) {
        for (std::size_t k = 0; k < piece.size() && !found; ++k)
            if (piece[k] >= vocab) {
                v = piece[k];
                i += k;
                found = true;
            }
        if (!found) i += piece.size();
    });
    throw DataError("token " + std::to_string(v) + " at token offset " + std::to_string(i) +
                        " (byte " + std::to_string(kHeaderBytes + i * (t.wide() ? 4 : 2)) +
                        ") is not below the model's vocabulary " + std::to_string(vocab),
                    {0, tokens.path(), {}, -1});
}

std::uint64_t val_count(std::uint64_t n, double val_fraction) {
    if (!(val_fraction >= 0.0 && val_fraction <= 0.5))
        throw UsageError("validation fraction " + std::to_string(val_fraction) + " is outside [0, 0.5]");
    const double want = static_cast<double>(n) * val_fraction;
    const double whole = std::nearbyint(want);
    const double val = std::abs(want - whole) <= 1e-9 * std::max(1.0, want) ? whole : std::ceil(want);
    return std::min(n, static_cast<std::uint64_t>(val));
}

std::pair<TokenSpan, TokenSpan> split(TokenSpan tokens, double val_fraction) {
    const auto n_val = static_cast<std::size_t>(val_count(tokens.size(), val_fraction));
    return {tokens.first(tokens.size() - n_val), tokens.last(n_val)};
}

double unigram_entropy_nats(TokenSpan tokens) {
    if (tokens.empty()) return 0.0;
    std::uint32_t top = 0;
    tokens.scan([&](std::span<const std::uint32_t> piece) {
        for (std::uint32_t v : piece) top = std::max(top, v);
    });
    // One count per id up to the largest; a sparse id space past 2^24 sorted instead.
    std::vector<std::uint64_t> count;
    if (top < (1u << 24)) {
        count.assign(std::size_t{top} + 1, 0);
        tokens.scan([&](std::span<const std::uint32_t> piece) {
            for (std::uint32_t v : piece) ++count[v];
        });
    } else {
        std::vector<std::uint32_t> all;
        all.reserve(tokens.size());
        tokens.scan([&](std::span<const std::uint32_t> piece) { all.insert(all.end(), piece.begin(), piece.end()); });
        std::sort(all.begin(), all.end());
        for (std::size_t i = 0; i < all.size();) {
            std::size_t j = i;
            while (j < all.size() && all[j] == all[i]) ++j;
            count.push_back(j - i);
            i = j;
        }
    }
    const double n = static_cast<double>(tokens.size());
    double h = 0.0;
    for (std::uint64_t c : count)
        if (c) {
            const double p = static_cast<double>(c) / n;
            h -= p * std::log(p);
        }
    return h;
}

}  // namespace zinf::data
