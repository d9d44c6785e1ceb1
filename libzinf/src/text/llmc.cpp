// llm.c's tokenizer file (sample.hpp), read whole and checked against its
// size: every length must fit, and nothing may be left after the last token.
#include <zinf/sample.hpp>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>

namespace zinf::sample {

static_assert(std::endian::native == std::endian::little, "tokenizer files are little-endian");

namespace {
constexpr std::uint64_t kHeaderWords = 256, kHeaderBytes = kHeaderWords * 4;
}

Tokenizer Tokenizer::open(const std::string& path) {
    // Never blocks in open(2): a FIFO (or a folder) is refused at once (65).
    Fd fd = open_input(path, Input::regular);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", errno, path);
    if (!S_ISREG(st.st_mode)) throw DataError("not a regular file", {0, path, {}, -1});
    const auto size = static_cast<std::uint64_t>(st.st_size);
    auto bad = [&](const std::string& what, std::uint64_t at) { return DataError(what, {0, path, at, -1}); };
    if (size < kHeaderBytes)
        throw bad("file is " + std::to_string(size) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                      "-byte header of an llm.c tokenizer file",
                  0);
    Tokenizer t;
    t.path_ = path;
    t.bytes_.resize(size);
    if (size) {
        const Mmap map = Mmap::file_readonly(fd, size, path);
        std::memcpy(t.bytes_.data(), map.data(), size);
    }
    std::uint32_t h[4];
    std::memcpy(h, t.bytes_.data(), sizeof h);
    if (h[0] != kTokenizerMagic)
        throw bad("magic " + std::to_string(h[0]) + " is not an llm.c tokenizer file's " +
                      std::to_string(kTokenizerMagic),
                  0);
    if (h[1] != 1 && h[1] != 2) throw bad("tokenizer version " + std::to_string(h[1]) + " is not 1 or 2", 4);
    if (h[2] == 0) throw bad("the vocabulary size is 0", 8);
    if (h[1] == 2) {
        if (h[3] >= h[2])
            throw bad("the end-of-text token " + std::to_string(h[3]) + " is past the vocabulary of " +
                          std::to_string(h[2]),
                      12);
        t.eot_ = h[3];
    }
    // Every token takes a byte at least: a vocabulary the file cannot hold
    // is refused before room is made for it (0xFFFFFFFF tokens would have
    // asked for 32 GiB, and been "out of memory").
    if (h[2] > size - kHeaderBytes)
        throw bad("the vocabulary size " + std::to_string(h[2]) + " does not fit the file's " + std::to_string(size) +
                      " bytes",
                  8);
    std::uint64_t at = kHeaderBytes;
    t.offsets_.reserve(h[2]);
    for (std::uint32_t i = 0; i < h[2]; ++i) {
        if (at >= size)
            throw bad("the file ends after " + std::to_string(i) + " of its " + std::to_string(h[2]) + " tokens", at);
        const auto len = static_cast<std::uint8_t>(t.bytes_[at]);
        if (len == 0) throw bad("token " + std::to_string(i) + " has length 0", at);
        if (at + 1 + len > size)
            throw bad("token " + std::to_string(i) + " of " + std::to_string(len) + " bytes runs past the end", at);
        t.offsets_.emplace_back(static_cast<std::uint32_t>(at + 1), len);
        at += 1 + len;
    }
    if (at != size)
        throw bad(std::to_string(size - at) + " bytes follow the last of the " + std::to_string(h[2]) + " tokens", at);
    return t;
}

void Tokenizer::check_model(std::uint64_t model_vocab) const {
    if (eot_ && *eot_ >= model_vocab)
        throw DataError("the tokenizer's end-of-text token " + std::to_string(*eot_) +
                            " is past the model's vocabulary of " + std::to_string(model_vocab) +
                            ": this tokenizer is not the model's",
                        {0, path_, 12, -1});
}

std::string_view Tokenizer::decode(std::uint32_t token) const {
    if (token >= offsets_.size())
        throw DataError("token " + std::to_string(token) + " is past the vocabulary of " + std::to_string(offsets_.size()) +
                        " in " + path_);
    const auto [off, len] = offsets_[token];
    return std::string_view(bytes_).substr(off, len);
}

}  // namespace zinf::sample
