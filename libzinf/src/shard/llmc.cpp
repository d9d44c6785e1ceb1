// llm.c's checkpoint (karpathy/llm.c, train_gpt2.c: gpt2_build_from_checkpoint
// and write_model in train_gpt2.py): the header and where each GPT-2 tensor
// is in the file.
#include "formats.hpp"

#include <array>
#include <cstring>
#include <map>

namespace zinf::shard::detail {

std::uint64_t LlmcHeader::parameters() const {
    const std::uint64_t C = channels, L = layers;
    return padded_vocab * C + max_seq * C + L * (12 * C * C + 13 * C) + 2 * C;
}

LlmcHeader read_llmc_header(io::File& file, io::Engine& engine) {
    const std::string& path = file.path();
    const std::uint64_t size = file.size();
    if (size < kLlmcHeaderBytes)
        throw DataError("llm.c checkpoint: " + std::to_string(size) + " bytes, shorter than its 1024-byte header",
                        {0, path, 0, -1});
    std::array<std::int32_t, 256> h{};
    engine.wait(engine.read(file, 0, std::as_writable_bytes(std::span(h))));
    if (h[0] != kLlmcMagic)
        throw DataError("llm.c checkpoint: magic " + std::to_string(h[0]) + ", not " + std::to_string(kLlmcMagic),
                        {0, path, 0, -1});
    if (h[1] != kLlmcVersionFp32 && h[1] != kLlmcVersionBf16)
        throw DataError("llm.c checkpoint: version " + std::to_string(h[1]) + "; zinf reads version 3 (fp32) and 5 (bf16)",
                        {0, path, 4, -1});
    static const char* kFields[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads", "channels",
                                    "padded_vocab_size"};
    for (int i = 2; i <= 7; ++i)
        if (h[static_cast<std::size_t>(i)] <= 0 || (i == 6 && h[6] > (1 << 24)))
            throw DataError("llm.c checkpoint: header[" + std::to_string(i) + "] (" + kFields[i - 2] + ") is " +
                                std::to_string(h[static_cast<std::size_t>(i)]),
                            {0, path, static_cast<std::uint64_t>(4 * i), -1});
    LlmcHeader r;
    r.version = h[1];
    r.max_seq = static_cast<std::uint64_t>(h[2]);
    r.vocab = static_cast<std::uint64_t>(h[3]);
    r.layers = static_cast<std::uint64_t>(h[4]);
    r.heads = static_cast<std::uint64_t>(h[5]);
    r.channels = static_cast<std::uint64_t>(h[6]);
    r.padded_vocab = static_cast<std::uint64_t>(h[7]);
    if (r.padded_vocab < r.vocab)
        throw DataError("llm.c checkpoint: padded_vocab_size " + std::to_string(r.padded_vocab) + " (header[7]) is below vocab_size " +
                            std::to_string(r.vocab),
                        {0, path, 28, -1});
    // In 128 bits: the header's fields are the file's word, not yet checked against anything.
    using u128 = unsigned __int128;
    const u128 C = r.channels, elements = u128{r.padded_vocab} * C + u128{r.max_seq} * C +
                                          u128{r.layers} * (12 * C * C + 13 * C) + 2 * C;
    const u128 bytes = kLlmcHeaderBytes + elements * elem_bytes(r.elem());
    const std::string want = bytes >> 64 ? "more than 2^64" : std::to_string(static_cast<std::uint64_t>(bytes));
    if (u128{size} != bytes)
        throw DataError("llm.c checkpoint: " + std::to_string(size) + " bytes, but its header (version " +
                            std::to_string(r.version) + ", layers " + std::to_string(r.layers) + ", channels " +
                            std::to_string(r.channels) + ", padded vocab " + std::to_string(r.padded_vocab) +
                            ", max_seq " + std::to_string(r.max_seq) + ") makes it " + want,
                        {0, path, {}, -1});
    return r;
}

std::vector<std::byte> llmc_header_bytes(const LlmcHeader& h) {
    std::array<std::int32_t, 256> w{};
    w[0] = kLlmcMagic;
    w[1] = h.version;
    w[2] = static_cast<std::int32_t>(h.max_seq);
    w[3] = static_cast<std::int32_t>(h.vocab);
    w[4] = static_cast<std::int32_t>(h.layers);
    w[5] = static_cast<std::int32_t>(h.heads);
    w[6] = static_cast<std::int32_t>(h.channels);
    w[7] = static_cast<std::int32_t>(h.padded_vocab);
    std::vector<std::byte> out(kLlmcHeaderBytes);
    std::memcpy(out.data(), w.data(), out.size());
    return out;
}

std::vector<Placed> llmc_places(const LlmcHeader& h) {
    const std::uint64_t C = h.channels, L = h.layers, e = elem_bytes(h.elem());
    // llm.c's arrays in file order: (name, elements per layer or in all, per layer?, stored (out, in)?, zinf suffix)
    struct Array {
        const char* name;
        std::uint64_t numel;  // per layer when `layered`
        bool layered, out_in;
        const char* key;      // zinf's name, after "h.<l>." when layered
    };
    const Array arrays[] = {
        {"wte", h.padded_vocab * C, false, false, "wte.weight"},
        {"wpe", h.max_seq * C, false, false, "wpe.weight"},
        {"ln1w", C, true, false, "ln_1.weight"},
        {"ln1b", C, true, false, "ln_1.bias"},
        {"qkvw", 3 * C * C, true, true, "attn.c_attn.weight"},
        {"qkvb", 3 * C, true, false, "attn.c_attn.bias"},
        {"attprojw", C * C, true, true, "attn.c_proj.weight"},
        {"attprojb", C, true, false, "attn.c_proj.bias"},
        {"ln2w", C, true, false, "ln_2.weight"},
        {"ln2b", C, true, false, "ln_2.bias"},
        {"fcw", 4 * C * C, true, true, "mlp.c_fc.weight"},
        {"fcb", 4 * C, true, false, "mlp.c_fc.bias"},
        {"fcprojw", 4 * C * C, true, true, "mlp.c_proj.weight"},
        {"fcprojb", C, true, false, "mlp.c_proj.bias"},
        {"lnfw", C, false, false, "ln_f.weight"},
        {"lnfb", C, false, false, "ln_f.bias"},
    };
    std::vector<Placed> out;
    std::uint64_t at = kLlmcHeaderBytes;
    for (const auto& a : arrays) {
        const std::uint64_t n = a.layered ? L : 1;
        for (std::uint64_t l = 0; l < n; ++l) {
            Placed p;
            p.key = a.layered ? "h." + std::to_string(l) + "." + a.key : a.key;
            p.what = a.layered ? std::string(a.name) + "[" + std::to_string(l) + "]" : a.name;
            p.offset = at + l * a.numel * e;
            p.row_major = !a.out_in;
            p.elem = h.elem();
            out.push_back(std::move(p));
        }
        at += n * a.numel * e;
    }
    // zinf's order: wte, wpe, each layer's tensors, ln_f.
    const auto order = tensors(ModelSpec{L, C, h.heads, h.vocab, h.max_seq, ""});
    std::map<std::string, const Placed*> by_key;
    for (const auto& p : out) by_key[p.key] = &p;
    std::vector<Placed> sorted;
    for (const auto& t : order) sorted.push_back(*by_key.at(t.name));
    return sorted;
}

}  // namespace zinf::shard::detail
