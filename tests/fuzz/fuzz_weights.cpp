// The weight importers' headers (zinf-shard import --from, zinf-sample
// --tokenizer): any bytes as a file, read as its first bytes say, as import
// and zinf-sample do: llm.c's checkpoint header (magic 20240326), llm.c's
// tokenizer (magic 20240328), Hugging Face's model.safetensors.index.json
// (text that starts with '{'), else a safetensors header. Bad input is a
// DataError (65); what is accepted must hold together: a safetensors file's
// tensors cover its data exactly, each as long as its shape and dtype make
// it; an llm.c checkpoint is as long as its header's parameters; a
// tokenizer's tokens all decode to bytes of the file. (Issue 29: a nested
// header took 3.9 GB, a key twice in an entry was accepted, a vocabulary of
// 0xFFFFFFFF was "out of memory".)
#include "fuzz.hpp"

#include "../../libzinf/src/shard/formats.hpp"

#include <zinf/io.hpp>
#include <zinf/text.hpp>
#include <zinf/shard.hpp>

#include <algorithm>
#include <cstring>

using namespace zinf;

namespace {

io::Engine& engine() {
    static io::Engine e{io::EngineConfig{}};
    return e;
}

}  // namespace

ZINF_FUZZ_TARGET(weights) {
    const auto& mem = fuzz::MemFile::with(data, size);
    std::uint32_t magic = 0;
    if (size >= 4) std::memcpy(&magic, data, 4);
    if (magic == text::kLlmcTokenizerMagic) {
        std::unique_ptr<text::Tokenizer> t;
        if (!fuzz::documented<DataError>([&] { t = text::open(mem.path()); })) return 0;
        fuzz::accepted();
        std::uint64_t bytes = 0;
        for (std::uint32_t i = 0; i < t->vocab(); ++i) {
            const text::Id id = i;
            bytes += 1 + t->decode(std::span(&id, 1)).size();
        }
        if (1024 + bytes != size) fuzz::finding("the tokens do not cover the file after its header");
        if (t->end_of_text() && *t->end_of_text() >= t->vocab()) fuzz::finding("an end-of-text token past the vocabulary");
        return 0;
    }
    if (size && data[0] == '{') {
        shard::detail::StIndex index;
        const std::string_view text(reinterpret_cast<const char*>(data), size);
        if (!fuzz::documented<DataError>([&] { index = shard::detail::parse_st_index(text, "index.json"); })) return 0;
        fuzz::accepted();
        for (const auto& [name, file] : index.weight_map) {
            if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
                fuzz::finding("a shard that is no file beside the index: " + file);
            if (std::find(index.shards.begin(), index.shards.end(), file) == index.shards.end())
                fuzz::finding("tensor " + name + "'s shard is not among the shards");
        }
        if (index.shards.empty()) fuzz::finding("an index with no shard accepted");
        return 0;
    }
    io::File file;
    if (!fuzz::documented<DataError>([&] {
            file = io::File::open(mem.path(), {.access = io::Access::read, .direct = io::Direct::buffered});
        }))
        return 0;
    if (static_cast<std::int32_t>(magic) == shard::kLlmcMagic) {
        shard::detail::LlmcHeader h;
        if (!fuzz::documented<DataError>([&] { h = shard::detail::read_llmc_header(file, engine()); })) return 0;
        fuzz::accepted();
        const std::uint64_t eb = h.elem() == shard::detail::Elem::f32 ? 4 : 2;
        if (shard::detail::kLlmcHeaderBytes + h.parameters() * eb != size)
            fuzz::finding("an llm.c checkpoint whose size is not its header's parameters");
        return 0;
    }
    shard::detail::StFile f;
    if (!fuzz::documented<DataError>([&] { f = shard::detail::read_safetensors(file, engine()); })) return 0;
    fuzz::accepted();
    std::uint64_t covered = 0;
    for (const auto& t : f.tensors) {
        if (t.end < t.begin || f.data_start + t.end > size) fuzz::finding("tensor " + t.name + " outside the file");
        covered += t.end - t.begin;
    }
    if (f.data_start + covered != size) fuzz::finding("the tensors do not cover the data exactly");
    return 0;
}
