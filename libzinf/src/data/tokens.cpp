// Token files in llm.c's format, text files as byte tokens, the vocabulary
// check, the held-out split and the unigram entropy.
#include <zinf/data.hpp>

#include <algorithm>
#include <array>
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
std::uint64_t regular_size(const Fd& fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", errno, path);
    if (!S_ISREG(st.st_mode)) throw DataError("not a regular file", {0, path, {}, -1});
    return static_cast<std::uint64_t>(st.st_size);
}

template <class T>
std::uint32_t max_of(std::span<const T> t) {
    T m = 0;
    for (T v : t) m = std::max(m, v);
    return m;
}

}  // namespace

Tokens Tokens::open(const std::string& path) {
    Fd fd = open_input(path, Input::regular);  // a FIFO is refused, never waited for
    const std::uint64_t bytes = regular_size(fd, path);
    auto bad = [&](const std::string& what, std::optional<std::uint64_t> at = {}) {
        return DataError(what, {0, path, at, -1});
    };
    if (bytes < kHeaderBytes)
        throw bad("file is " + std::to_string(bytes) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                  "-byte header of a token file");
    Tokens t;
    t.path_ = path;
    t.map_ = Mmap::file_readonly(fd, bytes, path);
    std::array<std::int32_t, 3> h{};
    std::memcpy(h.data(), t.map_.data(), sizeof h);
    if (h[0] != kMagic)
        throw bad("magic " + std::to_string(h[0]) + " is not a token file's " + std::to_string(kMagic), 0);
    if (h[1] != kVersion && h[1] != kVersionWide)
        throw bad("token file version " + std::to_string(h[1]) + " is not supported (" + std::to_string(kVersion) +
                      ", uint16 tokens, or " + std::to_string(kVersionWide) + ", uint32 tokens)",
                  4);
    if (h[2] <= 0) throw bad("token count " + std::to_string(h[2]) + " in the header is not positive", 8);
    const auto n = static_cast<std::uint64_t>(h[2]);
    const std::uint64_t width = h[1] == kVersionWide ? 4 : 2;
    const std::uint64_t want = kHeaderBytes + width * n;
    if (bytes != want)
        throw bad("file is " + std::to_string(bytes) + " bytes, but its header's " + std::to_string(n) +
                  " tokens need " + std::to_string(kHeaderBytes) + " + " + std::to_string(width) + "*" +
                  std::to_string(n) + " = " + std::to_string(want) + " bytes" + (bytes < want ? " (truncated?)" : ""));
    const std::byte* first = t.map_.data() + kHeaderBytes;
    if (width == 4) {
        const std::span<const std::uint32_t> w{reinterpret_cast<const std::uint32_t*>(first), static_cast<std::size_t>(n)};
        t.tokens_ = w;
        t.max_token_ = max_of(w);
    } else {
        const std::span<const std::uint16_t> w{reinterpret_cast<const std::uint16_t*>(first), static_cast<std::size_t>(n)};
        t.tokens_ = w;
        t.max_token_ = max_of(w);
    }
    return t;
}

Tokens Tokens::text(const std::string& path) {
    Fd fd = open_input(path, Input::regular);  // a FIFO is refused, never waited for
    const std::uint64_t bytes = regular_size(fd, path);
    if (bytes == 0) throw DataError("text file is empty: byte-level tokens need at least one byte", {0, path, {}, -1});
    // Mapped only to be widened: the vector is what the tokens live in.
    const Mmap map = Mmap::file_readonly(fd, bytes, path);
    Tokens t;
    t.path_ = path;
    t.text_.resize(bytes);
    const auto* src = reinterpret_cast<const unsigned char*>(map.data());
    std::copy(src, src + bytes, t.text_.begin());
    t.tokens_ = t.text_;
    t.max_token_ = max_of(std::span<const std::uint16_t>(t.text_));
    return t;
}

namespace {
constexpr std::size_t kWriteBuffer = 1 << 20;  // bytes gathered per write

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
    while (i < t.size() && t[i] < vocab) ++i;
    throw DataError("token " + std::to_string(t[i]) + " at token offset " + std::to_string(i) +
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
    for (std::uint32_t v : tokens) top = std::max(top, v);
    // One count per id up to the largest; a sparse id space past 2^24 sorted instead.
    std::vector<std::uint64_t> count;
    if (top < (1u << 24)) {
        count.assign(std::size_t{top} + 1, 0);
        for (std::uint32_t v : tokens) ++count[v];
    } else {
        std::vector<std::uint32_t> all(tokens.begin(), tokens.end());
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
