// Private to libzinf's shard module: the weight files of other programs, as
// far as import and export need them. safetensors.cpp reads and writes the
// safetensors container; llmc.cpp knows llm.c's checkpoint header and where
// each GPT-2 tensor sits in it.
#pragma once

#include <zinf/io.hpp>
#include <zinf/shard.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <map>
#include <string>
#include <vector>

namespace zinf::shard::detail {

// The element types weights move in: what import converts from, what export
// writes.
enum class Elem { f32, f16, bf16 };
std::size_t elem_bytes(Elem e);
// "[50257, 768]", as messages show shapes.
std::string shape_text(const std::vector<std::uint64_t>& shape);

// ---------------------------------------------------------------------------
// safetensors: 8 bytes of little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., optionally "__metadata__": {string: string}}), then the data; offsets
// are relative to the data's start, which is 8 + N.
struct StTensor {
    std::string name;
    std::string dtype;                  // as the file spells it: F32, F16, BF16, I64, ...
    std::vector<std::uint64_t> shape;
    std::uint64_t begin = 0, end = 0;   // data_offsets
};
struct StFile {
    std::uint64_t data_start = 0;       // 8 + N: where offset 0 of the data is in the file
    std::vector<StTensor> tensors;      // in the header's order
    json::Json metadata = json::Json::object();
};
inline constexpr std::uint64_t kMaxStHeader = 100 * MiB;  // the reference implementation's limit

// Reads and checks the header against the file: DataError naming the file
// (and the tensor, and the byte offset where it is known) for a header length
// past the file, JSON that is not an object of well-formed entries, a name
// given twice, an unknown dtype, a size that is not shape x dtype, and data
// that runs past the file, overlaps another tensor's, or leaves bytes that
// belong to no tensor.
StFile read_safetensors(io::File& file, io::Engine& engine);
// Hugging Face's model.safetensors.index.json: its weight_map (tensor ->
// shard), and the shards in the order first named. Parsed under limits (an
// index is a map of names, never deep: issue 29's nested header took 3.9 GB)
// with no key twice; a shard is a file beside the index. DataError naming
// `path` for anything else, and for an empty map.
struct StIndex {
    std::map<std::string, std::string> weight_map;
    std::vector<std::string> shards;
};
StIndex parse_st_index(std::string_view text, const std::string& path);
// The bytes before the data: length, JSON with `tensors` in order (their
// offsets as given), padded with spaces to a multiple of 8.
std::string safetensors_header(const std::vector<StTensor>& tensors, const json::Json& metadata);
// "F32" -> Elem::f32 and so on; false for a dtype import does not convert.
bool st_elem(const std::string& dtype, Elem& out);
const char* st_dtype(Elem e);

// ---------------------------------------------------------------------------
// llm.c's checkpoint (train_gpt2.c, gpt2_124M.bin): 256 little-endian int32
// of header, then every parameter in llm.c's order, fp32 (version 3) or bf16
// (version 5). Linear weights are stored (out, in); wte has padded_vocab rows.
inline constexpr std::int32_t kLlmcVersionFp32 = 3, kLlmcVersionBf16 = 5;
inline constexpr std::uint64_t kLlmcHeaderBytes = 256 * 4;
struct LlmcHeader {
    std::int32_t version = kLlmcVersionFp32;
    std::uint64_t max_seq = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
    Elem elem() const { return version == kLlmcVersionBf16 ? Elem::bf16 : Elem::f32; }
    std::uint64_t parameters() const;  // elements after the header
};
// Reads and checks the header and the file's size (DataError naming the file,
// the field and its header offset).
LlmcHeader read_llmc_header(io::File& file, io::Engine& engine);
std::vector<std::byte> llmc_header_bytes(const LlmcHeader& h);

// Where a model tensor (untiled, zinf's name) lies in a file: its first
// element's byte offset, and whether zinf's (rows, cols) matrix is stored
// row-major, as zinf keeps it, or column-major (llm.c's (out, in) weights).
struct Placed {
    std::string key;       // "h.0.attn.c_attn.weight"
    std::string what;      // the file's own name for it, for messages ("qkvw[0]")
    std::uint64_t offset = 0;
    bool row_major = true;
    Elem elem = Elem::f32;
};
// Every model tensor of an llm.c file with this header, in zinf's order.
std::vector<Placed> llmc_places(const LlmcHeader& h);

// ---------------------------------------------------------------------------
// What import and export of every format share (weights.cpp, hf.cpp).
// Reads queued on the io engine, waited together.
class Reads {
public:
    explicit Reads(io::Engine& engine) : engine_(engine) {}
    ~Reads() {
        for (auto t : queued_) try {
                engine_.wait(t);
            } catch (...) {  // already failing: the first error is on its way
            }
    }
    void add(io::File& file, std::uint64_t offset, std::span<std::byte> dst) {
        if (queued_.size() >= kMaxQueued) take();
        queued_.push_back(engine_.read(file, offset, dst));
    }
    void wait() {
        while (!queued_.empty()) take();
    }

private:
    static constexpr std::size_t kMaxQueued = 256;
    void take() {
        const io::Ticket t = queued_.front();
        queued_.pop_front();
        engine_.wait(t);
    }
    io::Engine& engine_;
    std::deque<io::Ticket> queued_;
};

// The partitions of one state, by tensor and rank, read at any element.
class StateReader {
public:
    StateReader(const Manifest& m, const std::string& state) : m_(m), parts_(m.tensors.size()) {
        for (const auto& p : m.parts)
            if (p.state == state) parts_[p.tensor].push_back(&p);
        for (auto& v : parts_) {
            std::sort(v.begin(), v.end(), [](const Partition* a, const Partition* b) { return a->rank < b->rank; });
            if (v.size() != m.opts.dp) throw InternalError("export: a tensor without a partition per rank");
        }
    }
    // Elements [first, first + count) of tensor `t` into dst, across its partitions.
    void read(Reads& r, std::size_t t, std::uint64_t first, std::uint64_t count, std::span<std::byte> dst) {
        const std::uint64_t per = m_.elements_per_rank(m_.tensors[t]);
        while (count > 0) {
            const Partition& p = *parts_[t].at(first / per);
            if (first < p.first || first >= p.last) throw InternalError("export: element outside its partition");
            const std::uint64_t n = std::min(count, p.last - first), eb = dtype_bytes(p.dtype);
            r.add(file(p), p.offset + (first - p.first) * eb, dst.first(n * eb));
            dst = dst.subspan(n * eb);
            first += n;
            count -= n;
        }
    }

private:
    io::File& file(const Partition& p) {
        auto it = files_.find(p.file);
        if (it == files_.end()) {
            if (!m_.rank_dirs.empty()) check_rank_folders(m_, {p.rank});
            const Manifest::Place at = m_.place(p.file);
            it = files_.emplace(p.file, io::File::open(at.path(), {.direct = io::Direct::buffered, .beneath = at.root}))
                     .first;
        }
        return it->second;
    }
    const Manifest& m_;
    std::vector<std::vector<const Partition*>> parts_;
    std::map<std::string, io::File> files_;
};

// Every partition of `state` read against its xxh3 (DataError, 65): before a
// byte of an export is written, and again before its rename.
void verify_state(const Manifest& m, const std::string& state, io::Engine& engine, mem::PinnedPool& pool,
                  const RunOptions& opts);

// An imported value that is not finite (or that the bf16 parameters would
// round to infinity) would train into nothing but NaN: DataError (65) naming
// the file and name(i), the tensor and index of v[i] there.
void refuse_nonfinite(std::span<const float> v, bool bf16, const std::string& from,
                      const std::function<std::string(std::uint64_t i)>& name);

}  // namespace zinf::shard::detail
