// Weights in and out. import fills init's values from a safetensors or llm.c
// file; export writes the committed state into one. Both move elements
// between zinf's tensors (row-major (rows, cols); linear weights (in, out),
// perhaps in column tiles, each split over the ranks) and the file's tensors
// (row-major too, or llm.c's (out, in): zinf's matrix column-major), a block
// at a time through a pool buffer, so memory does not grow with the model.
#include "formats.hpp"
#include "llama.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <dirent.h>
#include <filesystem>
#include <fcntl.h>
#include <map>
#include <optional>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zinf::shard {

using detail::Elem;
using detail::elem_bytes;
using detail::Placed;
using detail::shape_text;
using detail::Reads;
using detail::StateReader;
using detail::verify_state;
using detail::refuse_nonfinite;

void detail::refuse_nonfinite(std::span<const float> v, bool bf16, const std::string& from,
                              const std::function<std::string(std::uint64_t i)>& name) {
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (std::isfinite(v[i]) && (!bf16 || std::isfinite(from_bf16(to_bf16(v[i]))))) continue;
        char value[32];
        std::snprintf(value, sizeof value, "%g", static_cast<double>(v[i]));
        throw DataError(name(i) + " is " + value + (std::isfinite(v[i]) ? " (infinite in the bf16 parameters)" : "") +
                            ": not a finite weight; nothing was imported (--allow-nonfinite imports it)",
                        {0, from, {}, -1});
    }
}

void detail::verify_state(const Manifest& m, const std::string& state, io::Engine& engine,
                          mem::PinnedPool& pool, const RunOptions& opts) {
    Manifest mine = m;
    mine.parts.clear();
    for (const auto& p : m.parts)
        if (p.state == state) mine.parts.push_back(p);
    RunOptions vo;
    vo.jobs = opts.jobs;
    vo.stop = opts.stop;
    verify(mine, engine, pool, vo);
}

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Element conversions.
float from_f16(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    std::uint32_t bits;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
        const float v = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -v : v;
    }
    if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);  // infinity, NaN
    else bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

float load(const std::byte* p, Elem e) {
    if (e == Elem::f32) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
    }
    std::uint16_t u;
    std::memcpy(&u, p, 2);
    return e == Elem::bf16 ? from_bf16(u) : from_f16(u);
}

void store(std::byte* p, Elem e, float v) {
    if (e == Elem::f32) {
        std::memcpy(p, &v, 4);
    } else if (e == Elem::bf16) {
        const std::uint16_t u = to_bf16(v);
        std::memcpy(p, &u, 2);
    } else {
        throw InternalError("weights: no conversion to fp16");
    }
}

// n consecutive elements.
void convert(const std::byte* src, Elem se, std::byte* dst, Elem de, std::size_t n) {
    if (se == de) {
        std::memcpy(dst, src, n * elem_bytes(se));
        return;
    }
    const std::size_t sb = elem_bytes(se), db = elem_bytes(de);
    for (std::size_t i = 0; i < n; ++i) store(dst + i * db, de, load(src + i * sb, se));
}


// Columns [c0, c0 + w) of a model tensor's (rows, cols) matrix, laid out in a
// flat element space row-major or column-major.
struct Region {
    bool row_major = true;
    std::uint64_t rows = 1, c0 = 0, w = 0;
    Elem elem = Elem::f32;
    std::uint64_t index(std::uint64_t r, std::uint64_t k) const {
        return row_major ? r * w + (k - c0) : (k - c0) * rows + r;
    }
};

// A region that can be read: `read` queues elements [first, first + count)
// of its flat space into dst.
struct Source : Region {
    std::function<void(Reads&, std::uint64_t first, std::uint64_t count, std::span<std::byte> dst)> read;
};

// Rows [r0, r1) x columns [k0, k1) of the model tensor, all inside source s
// and fitting `scratch`, from s into `out` (dst's elements from `first`).
void copy_chunk(const Region& dst, std::uint64_t first, std::span<std::byte> out, const Source& s, std::uint64_t r0,
                std::uint64_t r1, std::uint64_t k0, std::uint64_t k1, std::span<std::byte> scratch, Reads& reads) {
    const std::size_t eb = elem_bytes(s.elem), ob = elem_bytes(dst.elem);
    const std::uint64_t cap = scratch.size() / eb;
    // The chunk in s: `lines` runs of `len` elements, `pitch` apart.
    const std::uint64_t lines = s.row_major ? r1 - r0 : k1 - k0, len = s.row_major ? k1 - k0 : r1 - r0;
    const std::uint64_t pitch = s.row_major ? s.w : s.rows, start = s.index(r0, k0);
    std::uint64_t stride;  // elements from one line to the next in scratch
    if ((lines - 1) * pitch + len <= cap) {  // one read, the gaps between the lines included
        stride = pitch;
        s.read(reads, start, (lines - 1) * pitch + len, scratch);
    } else {
        stride = len;
        for (std::uint64_t i = 0; i < lines; ++i)
            s.read(reads, start + i * pitch, len, scratch.subspan(i * len * eb, len * eb));
    }
    reads.wait();
    auto at = [&](std::uint64_t i, std::uint64_t j) {  // (r, k) of scratch line i, element j
        return s.row_major ? std::pair{r0 + i, k0 + j} : std::pair{r0 + j, k0 + i};
    };
    if (s.row_major == dst.row_major) {  // the lines are consecutive elements in both
        for (std::uint64_t i = 0; i < lines; ++i) {
            const auto [r, k] = at(i, 0);
            convert(scratch.data() + i * stride * eb, s.elem, out.data() + (dst.index(r, k) - first) * ob, dst.elem, len);
        }
        return;
    }
    for (std::uint64_t j = 0; j < len; ++j)  // transposed: dst is consecutive along i
        for (std::uint64_t i = 0; i < lines; ++i) {
            const auto [r, k] = at(i, j);
            store(out.data() + (dst.index(r, k) - first) * ob, dst.elem, load(scratch.data() + (i * stride + j) * eb, s.elem));
        }
}

// A rectangle inside source s, cut into chunks that fit `scratch`, whole
// lines of s where a line fits.
void copy_rect(const Region& dst, std::uint64_t first, std::span<std::byte> out, const Source& s, std::uint64_t r0,
               std::uint64_t r1, std::uint64_t k0, std::uint64_t k1, std::span<std::byte> scratch, Reads& reads) {
    const std::uint64_t cap = scratch.size() / elem_bytes(s.elem);
    if (cap == 0) throw InternalError("weights: no scratch");
    const std::uint64_t nr = r1 - r0, nk = k1 - k0;
    if (nr * nk <= cap) return copy_chunk(dst, first, out, s, r0, r1, k0, k1, scratch, reads);
    if (s.row_major) {  // lines along k
        if (nk <= cap)
            for (std::uint64_t a = r0; a < r1; a += cap / nk)
                copy_chunk(dst, first, out, s, a, std::min(r1, a + cap / nk), k0, k1, scratch, reads);
        else
            for (std::uint64_t r = r0; r < r1; ++r)
                for (std::uint64_t a = k0; a < k1; a += cap)
                    copy_chunk(dst, first, out, s, r, r + 1, a, std::min(k1, a + cap), scratch, reads);
    } else {  // lines along r
        if (nr <= cap)
            for (std::uint64_t a = k0; a < k1; a += cap / nr)
                copy_chunk(dst, first, out, s, r0, r1, a, std::min(k1, a + cap / nr), scratch, reads);
        else
            for (std::uint64_t k = k0; k < k1; ++k)
                for (std::uint64_t a = r0; a < r1; a += cap)
                    copy_chunk(dst, first, out, s, a, std::min(r1, a + cap), k, k + 1, scratch, reads);
    }
}

// Elements [first, first + n) of dst, in dst's order, into `out`, from the
// sources that hold their columns (a tensor's tiles, or the whole tensor).
void gather(const Region& dst, std::uint64_t first, std::uint64_t n, std::span<std::byte> out,
            std::span<const Source> sources, std::span<std::byte> scratch, Reads& reads) {
    const std::uint64_t line = dst.row_major ? dst.w : dst.rows, end = first + n;
    for (std::uint64_t d = first; d < end;) {
        // A partial line, or a run of whole ones.
        const std::uint64_t o = d / line, i = d % line;
        std::uint64_t lines = 1, j = std::min(line, i + (end - d));
        if (i == 0 && end - d >= line) {
            lines = (end - d) / line;
            j = line;
        }
        const std::uint64_t r0 = dst.row_major ? o : i, r1 = dst.row_major ? o + lines : j;
        const std::uint64_t k0 = dst.c0 + (dst.row_major ? i : o), k1 = dst.c0 + (dst.row_major ? j : o + lines);
        for (const auto& s : sources) {
            const std::uint64_t a = std::max(k0, s.c0), b = std::min(k1, s.c0 + s.w);
            if (a < b) copy_rect(dst, first, out, s, r0, r1, a, b, scratch, reads);
        }
        d += lines * (j - i);
    }
}

// The model tensor's (rows, cols): a linear weight (in, out), else one row.
std::pair<std::uint64_t, std::uint64_t> matrix(const Tensor& t) {
    const std::uint64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
    return {rows, t.numel / rows};
}

void check_stop(const RunOptions& opts) {
    if (opts.stop && opts.stop->load()) throw Interrupted("interrupted");
}

// ---------------------------------------------------------------------------
// Where the manifest's model tensors are in an llm.c file, after its header
// is checked against the model.
std::map<std::string, Placed> llmc_places(const Manifest& m, io::File& file, io::Engine& engine) {
    const auto h = detail::read_llmc_header(file, engine);
    const ModelSpec theirs{h.layers, h.channels, h.heads, h.vocab, h.max_seq, ""};
    const auto mine = tensors(m.spec), file_tensors = tensors(theirs);
    auto bad = [&](const std::string& why) {
        return DataError("llm.c checkpoint (" + theirs.to_string() + "): " + why + "; the manifest's model is " +
                             m.spec.to_string(),
                         {0, file.path(), {}, -1});
    };
    if (h.layers != m.spec.layers)
        throw bad("num_layers (header[4]) is " + std::to_string(h.layers) + ", the model has " +
                  std::to_string(m.spec.layers));
    for (std::size_t i = 0; i < mine.size(); ++i)  // the same names, in the same order
        if (mine[i].shape != file_tensors[i].shape)
            throw bad("tensor " + mine[i].name + " has shape " + shape_text(file_tensors[i].shape) +
                      " in the file (as zinf keeps it), " + shape_text(mine[i].shape) + " in the model");
    if (h.heads != m.spec.heads)
        throw bad("num_heads (header[5]) is " + std::to_string(h.heads) + ", the model has " +
                  std::to_string(m.spec.heads));
    std::map<std::string, Placed> out;
    for (auto& p : detail::llmc_places(h)) out.emplace(p.key, std::move(p));
    return out;
}

bool is_attention_mask(const std::string& name) {  // h.<l>.attn.bias, h.<l>.attn.masked_bias: buffers, not weights
    if (!name.starts_with("h.")) return false;
    std::size_t i = 2;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    const std::string rest = name.substr(i);
    return i > 2 && (rest == ".attn.bias" || rest == ".attn.masked_bias");
}

// Where the manifest's model tensors are in a safetensors file with Hugging
// Face GPT-2 names, after every tensor is checked against the model.
std::map<std::string, Placed> safetensors_places(const Manifest& m, io::File& file, io::Engine& engine) {
    const auto f = detail::read_safetensors(file, engine);
    const auto keys = tensors(m.spec);
    std::map<std::string, const Tensor*> by_name;
    for (const auto& t : keys) by_name[t.name] = &t;
    auto bad = [&](const std::string& why, std::optional<std::uint64_t> at = {}) {
        return DataError(why, {0, file.path(), at, -1});
    };
    // The file's tensors by model name, the prefix taken off.
    std::map<std::string, const detail::StTensor*> named;
    for (const auto& st : f.tensors) {
        const std::string name = st.name.starts_with("transformer.") ? st.name.substr(12) : st.name;
        if (name == "lm_head.weight") {
            log::info(file.path() + ": " + st.name + " left out: zinf's output projection is wte.weight (tied)");
            continue;
        }
        if (is_attention_mask(name)) continue;
        if (!named.emplace(name, &st).second)
            throw bad("tensors '" + named.at(name)->name + "' and '" + st.name + "' are both the model's " + name);
    }
    // In the model's order, so that the first tensor named is the first that differs.
    std::map<std::string, Placed> out;
    for (const auto& t : keys) {
        auto it = named.find(t.name);
        if (it == named.end())
            throw bad("no tensor '" + t.name + "' (nor 'transformer." + t.name + "') for the manifest's model (" +
                      m.spec.to_string() + ")");
        const detail::StTensor& st = *it->second;
        if (st.shape != t.shape)
            throw bad("tensor '" + st.name + "' has shape " + shape_text(st.shape) + ", the manifest's model (" +
                          m.spec.to_string() + ") has " + shape_text(t.shape),
                      f.data_start + st.begin);
        Placed p;
        if (!detail::st_elem(st.dtype, p.elem))
            throw bad("tensor '" + st.name + "' is " + st.dtype + "; import converts F32, F16 and BF16",
                      f.data_start + st.begin);
        p.key = t.name;
        p.what = st.name;
        p.offset = f.data_start + st.begin;
        p.row_major = true;  // Conv1D (in, out), as zinf keeps it
        out.emplace(t.name, std::move(p));
    }
    for (const auto& [name, st] : named)
        if (!by_name.count(name))
            throw bad("tensor '" + st->name + "' " + shape_text(st->shape) + " has no place in the manifest's model (" +
                      m.spec.to_string() + ")");
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------
const char* weight_format_name(WeightFormat f) { return f == WeightFormat::llmc ? "llmc" : "safetensors"; }

WeightFormat parse_weight_format(std::string_view s) {
    if (s == "safetensors") return WeightFormat::safetensors;
    if (s == "llmc") return WeightFormat::llmc;
    throw UsageError("format '" + std::string(s) + "': expected safetensors or llmc");
}

WeightFormat detect_weight_format(const std::string& path) {
    // Never blocks in open(2) on a FIFO; a folder or anything but a regular
    // file is refused (65), before the import opens it for reading.
    Fd fd = open_input(path, Input::regular);
    std::int32_t magic = 0;
    long n;
    std::size_t got = 0;  // through short reads: a cut magic is not another format
    do {
        n = sys::pread(fd.get(), reinterpret_cast<char*>(&magic) + got, 4 - got, got, path);
        if (n > 0) got += static_cast<std::size_t>(n);
    } while ((n > 0 && got < 4) || (n < 0 && errno == EINTR));
    if (n < 0) throw_errno("pread", errno, path, got);
    n = static_cast<long>(got);
    return n == 4 && magic == kLlmcMagic ? WeightFormat::llmc : WeightFormat::safetensors;
}

Written import_weights(Manifest& m, const std::string& from, const std::string& dir, io::Engine& engine,
                       mem::PinnedPool& pool, const RunOptions& opts) {
    if (family(m.spec.arch).hugging_face) return detail::import_hf(m, from, dir, engine, pool, opts);  // (a folder is fine there)
    const WeightFormat format = detect_weight_format(from);  // first: it refuses a FIFO or a folder at once
    io::File file = io::File::open(from, {.access = io::Access::read, .direct = io::Direct::buffered});
    // A safetensors file starts with its header's length; a Hugging Face
    // index of shards is JSON from its first byte. A length's low byte may
    // be '{' too (123), so JSON is a '{' whose 8 bytes, read as that length,
    // do not fit in the file.
    if (format == WeightFormat::safetensors) {
        unsigned char head[8] = {};
        const long n = sys::pread(file.fd(), head, sizeof head, 0, from);
        std::uint64_t len = 0;
        for (int i = 7; i >= 0; --i) len = len << 8 | head[i];
        if (n >= 1 && head[0] == '{' && (n < 8 || len > file.size() - std::min<std::uint64_t>(file.size(), 8)))
            throw DataError("is JSON (a Hugging Face index of sharded safetensors?), not a safetensors file: the "
                            "sharded import is for Llama-family models; for a GPT-2 give one model.safetensors",
                            {0, from, {}, -1});
    }
    const auto places = format == WeightFormat::llmc ? llmc_places(m, file, engine) : safetensors_places(m, file, engine);
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> matrices;  // by model tensor
    for (const auto& t : tensors(m.spec)) matrices[t.name] = matrix(t);

    ValueSource values;
    values.scratch = true;
    values.fill = [&](const Tensor& t, std::uint64_t first, std::span<float> out, std::span<std::byte> scratch) {
        const std::uint64_t n = first < t.numel ? std::min<std::uint64_t>(out.size(), t.numel - first) : 0;
        std::fill(out.begin() + static_cast<std::ptrdiff_t>(n), out.end(), 0.0f);  // padding
        if (n == 0) return;
        const Placed& p = places.at(t.key);
        const auto& shape = matrices.at(t.key);  // (no structured binding: clang 14 cannot capture one)
        const std::uint64_t rows = shape.first, cols = shape.second;
        const Region dst{true, rows, t.col0, t.numel / rows, Elem::f32};  // the tile, or the whole tensor
        Source src;
        src.row_major = p.row_major;
        src.rows = rows;
        src.w = cols;
        src.elem = p.elem;
        src.read = [&file, at = p.offset, eb = elem_bytes(p.elem)](Reads& r, std::uint64_t e, std::uint64_t count,
                                                                     std::span<std::byte> to) {
            r.add(file, at + e * eb, to.first(count * eb));
        };
        Reads reads(engine);
        gather(dst, first, n, std::as_writable_bytes(out.first(n)), std::span(&src, 1), scratch, reads);
        if (opts.allow_nonfinite) return;
        refuse_nonfinite(out.first(n), m.opts.param_dtype == DType::bf16, from, [&](std::uint64_t i) {
            const std::uint64_t e = first + i, w = t.numel / rows, r = e / w, k = t.col0 + e % w;
            return "tensor '" + p.what + "' element " + std::to_string(p.row_major ? r * cols + k : k * rows + r);
        });
    };
    return init(m, dir, engine, pool, opts, values);
}

// ---------------------------------------------------------------------------
namespace {

// One model tensor of the output: where it goes and how it is laid out there.
struct Out {
    std::size_t key = 0;  // into tensors(spec)
    std::uint64_t offset = 0;
    bool row_major = true;
    Elem elem = Elem::f32;
};



// The layout of the output file: its header's bytes, where each model tensor
// goes, and a run of zero bytes (llm.c's padded vocabulary rows).
struct OutLayout {
    std::vector<std::byte> head;
    std::vector<Out> outs;
    std::uint64_t pad_at = 0, pad_bytes = 0;
    std::uint64_t bytes = 0;  // the file's size
};

// safetensors: every tensor in the state's element type, in model order.
OutLayout safetensors_layout(const Manifest& m, const std::vector<Tensor>& keys, Elem se, const std::string& state) {
    OutLayout l;
    std::vector<detail::StTensor> st;
    std::uint64_t at = 0;
    for (const auto& k : keys) {
        const std::uint64_t bytes = k.numel * elem_bytes(se);
        st.push_back({k.name, detail::st_dtype(se), k.shape, at, at + bytes});
        at += bytes;
    }
    const json::Json meta = {{"format", "pt"}, {"zinf_model", m.spec.to_string()}, {"zinf_state", state}};
    const std::string h = detail::safetensors_header(st, meta);
    l.head.resize(h.size());
    std::memcpy(l.head.data(), h.data(), h.size());
    for (std::size_t i = 0; i < keys.size(); ++i) l.outs.push_back({i, l.head.size() + st[i].begin, true, se});
    l.bytes = l.head.size() + at;
    return l;
}

// llm.c's version 3: fp32, the vocabulary padded to a multiple of 128.
OutLayout llmc_layout(const Manifest& m, const std::vector<Tensor>& keys) {
    OutLayout l;
    detail::LlmcHeader h;
    h.version = detail::kLlmcVersionFp32;
    h.max_seq = m.spec.seq;
    h.vocab = m.spec.vocab;
    h.layers = m.spec.layers;
    h.heads = m.spec.heads;
    h.channels = m.spec.hidden;
    h.padded_vocab = align_up(m.spec.vocab, 128);  // llm.c's own padding
    if (h.padded_vocab > INT32_MAX || h.max_seq > INT32_MAX || h.layers > INT32_MAX || h.heads > INT32_MAX)
        throw UsageError("the model " + m.spec.to_string() + " does not fit llm.c's int32 header");
    l.head = detail::llmc_header_bytes(h);
    const auto places = detail::llmc_places(h);
    for (std::size_t i = 0; i < keys.size(); ++i) l.outs.push_back({i, places[i].offset, places[i].row_major, Elem::f32});
    l.pad_at = places[0].offset + keys[0].numel * 4;
    l.pad_bytes = (h.padded_vocab - h.vocab) * h.channels * 4;
    l.bytes = detail::kLlmcHeaderBytes + h.parameters() * 4;
    return l;
}

// One model tensor gathered from its tiles' partitions of the state into
// its place in `file`.
void write_tensor(const Manifest& m, const Tensor& k, const Out& o, const std::vector<std::size_t>& tiles, Elem se,
                  StateReader& state, Reads& reads, mem::Stream& stream, io::File& file, std::span<std::byte> scratch,
                  const RunOptions& opts) {
    const auto [rows, cols] = matrix(k);
    const Region dst{o.row_major, rows, 0, cols, o.elem};
    std::vector<Source> sources;
    for (std::size_t ti : tiles) {
        const Tensor& t = m.tensors[ti];
        Source s;
        s.row_major = true;
        s.rows = rows;
        s.c0 = t.col0;
        s.w = t.numel / rows;
        s.elem = se;
        s.read = [&state, ti](Reads& r, std::uint64_t e, std::uint64_t count, std::span<std::byte> into) {
            state.read(r, ti, e, count, into);
        };
        sources.push_back(std::move(s));
    }
    const std::size_t eb = elem_bytes(o.elem);
    stream.write(file, o.offset, k.numel * eb, [&](std::uint64_t at, std::span<std::byte> piece) {
        check_stop(opts);
        if (at % eb || piece.size() % eb) throw InternalError("export: a piece that splits an element");
        gather(dst, at / eb, piece.size() / eb, piece, sources, scratch, reads);
        if (opts.progress) opts.progress(piece.size());
    });
}

// The folders zinf keeps state in: the data directory, its node-local rank
// folders, and any folder beneath one that holds a lock file (another data
// directory). An export written there could replace the state it reads.
void check_export_target(const Manifest& m, const std::string& to) {
    if (to.empty()) throw UsageError("--to is empty: name the file to write");
    const fs::path target = fs::absolute(to);
    if (target.filename().empty() || target.filename() == "." || target.filename() == "..")
        throw UsageError("--to " + to + " names a folder: name the file to write");
    std::error_code ec;
    const fs::path parent = fs::weakly_canonical(target.parent_path(), ec);
    if (ec) return;  // the open that follows says what is wrong with it
    auto inside = [&](const std::string& folder) {
        if (folder.empty()) return false;
        std::error_code e;
        const fs::path f = fs::weakly_canonical(fs::absolute(folder), e);
        if (e) return false;
        auto [a, b] = std::mismatch(f.begin(), f.end(), parent.begin(), parent.end());
        return a == f.end();
    };
    std::vector<std::string> state = {m.dir};
    state.insert(state.end(), m.rank_dirs.begin(), m.rank_dirs.end());
    for (const auto& folder : state)
        if (inside(folder))
            throw UsageError("--to " + to + " lies in " + folder +
                             ", where the state it exports is kept: export writes outside the data directory "
                             "and its rank folders, so that it can never replace what it reads");
    for (fs::path p = parent;; p = p.parent_path()) {
        struct stat st {};
        if (::lstat((p / kLockFile).c_str(), &st) == 0)
            throw UsageError("--to " + to + " lies in " + p.string() + ", a data directory (it holds " + kLockFile +
                             "): export writes outside every data directory");
        if (p == p.parent_path()) break;
    }
}

}  // namespace

namespace detail {

void remove_export_folder(const std::string& path) noexcept {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        ::unlink(path.c_str());
        return;
    }
    if (DIR* d = ::opendir(path.c_str())) {
        std::vector<std::string> names;
        while (const dirent* e = ::readdir(d))
            if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
        ::closedir(d);
        for (const auto& n : names) ::unlink((path + "/" + n).c_str());  // files only: a folder stays
    }
    ::rmdir(path.c_str());
}

void remove_stale_exports(const std::string& to) {
    const fs::path target = fs::absolute(to);
    const std::string prefix = target.filename().string() + ".tmp.";
    const std::string folder = target.parent_path().string();
    DIR* d = ::opendir(folder.c_str());
    if (!d) return;
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d)) {
        const std::string_view n = e->d_name;
        if (!n.starts_with(prefix) || n.size() != prefix.size() + 16) continue;
        if (n.substr(prefix.size()).find_first_not_of("0123456789abcdef") != std::string_view::npos) continue;
        stale.emplace_back(n);
    }
    ::closedir(d);
    for (const auto& n : stale) {
        const std::string path = folder + "/" + n;
        const int fd = sys::open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st {};
        if (::fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) &&
            ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
            remove_export_folder(path);
            if (::access(path.c_str(), F_OK) != 0)
                log::info(path + ": removed, left by an export that did not finish");
        }
        ::close(fd);
    }
}

void hold_export_temp(int fd, const std::string& tmp) {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) throw_errno("flock", errno, tmp);
    struct stat mine {}, named {};
    if (::fstat(fd, &mine) != 0 || ::lstat(tmp.c_str(), &named) != 0 || mine.st_ino != named.st_ino ||
        mine.st_dev != named.st_dev)
        throw IoError("the export's temporary was removed as it was made (another export's clean-up?); try again",
                      {ENOENT, tmp, {}, -1});
}

void install_export_folder(const std::string& tmp, const std::string& to) {
    struct stat st {};
    if (::lstat(to.c_str(), &st) != 0) {
        if (errno != ENOENT) throw_errno("stat", errno, to);
        if (sys::rename(tmp, to) != 0) throw_errno("rename", errno, to, {}, true);
        return;
    }
    if (sys::exchange(tmp, to) == 0) {
        remove_export_folder(tmp);  // now the old output
        return;
    }
    if (errno != EINVAL && errno != ENOSYS) throw_errno("rename", errno, to, {}, true);
    // A file system without RENAME_EXCHANGE: the old output moved aside
    // first (a kill in between leaves none, and the next export removes it).
    const std::string aside = temp_name(to, ".tmp.");
    if (sys::rename(to, aside) != 0) throw_errno("rename", errno, to, {}, true);
    if (sys::rename(tmp, to) != 0) {
        const int err = errno;
        (void)sys::rename(aside, to);
        throw_errno("rename", err, to, {}, true);
    }
    remove_export_folder(aside);
}

}  // namespace detail

namespace {

using detail::hold_export_temp;
using detail::remove_stale_exports;

}  // namespace

ExportResult export_weights(const Manifest& m, const std::string& to, WeightFormat format, io::Engine& engine,
                            mem::PinnedPool& pool, const RunOptions& opts) {
    if (m.dir.empty() || !m.initialised())
        throw UsageError("the manifest has no committed state (no data directory, or partitions without an xxh3): "
                         "export reads what init, import or zinf-train committed");
    check_export_target(m, to);
    // No writer beside (zinf-train committing a step, init --force): the
    // export reads one committed state.
    const Lock lock = lock_state(m, LockMode::shared);
    if (family(m.spec.arch).hugging_face) {
        if (format != WeightFormat::safetensors)
            throw UsageError("llm.c's checkpoint holds a GPT-2; a Llama-family model exports as safetensors");
        return detail::export_hf(m, to, engine, pool, opts);
    }
    if (opts.shard_bytes || opts.dtype)
        throw UsageError("--shard-size and --dtype are for Llama-family models (Hugging Face's layout)");
    ExportResult res;
    res.state = std::find(m.states.begin(), m.states.end(), "master") != m.states.end() ? "master" : "param";
    const Elem se = state_dtype(m.opts, res.state) == DType::fp32 ? Elem::f32 : Elem::bf16;
    verify_state(m, res.state, engine, pool, opts);
    const auto keys = tensors(m.spec);
    std::map<std::string, std::vector<std::size_t>> tiles;  // model tensor -> its tensors in the manifest
    for (std::size_t i = 0; i < m.tensors.size(); ++i) tiles[m.tensors[i].key].push_back(i);
    const OutLayout l =
        format == WeightFormat::safetensors ? safetensors_layout(m, keys, se, res.state) : llmc_layout(m, keys);
    res.bytes = l.bytes;
    res.files = {to};
    res.tensors = keys.size();

    // Written under a temporary name beside `to`, then renamed over it.
    // Unpredictable and made with O_EXCL|O_NOFOLLOW: nothing planted there is written through.
    // Each holds a flock on its temporary while it writes, so that the next
    // export removes only what a dead one left.
    remove_stale_exports(to);
    const std::string tmp = temp_name(to, ".tmp.");
    try {
        io::File file = io::File::open(tmp, {.access = io::Access::write, .create = true, .exclusive = true});
        hold_export_temp(file.fd(), tmp);
        file.preallocate(res.bytes);
        {  // (its pool buffers back before the check below takes them)
            mem::Stream stream(engine, pool, {.buffers = 2, .who = "zinf-shard export"});
            mem::Lease scratch = pool.lease("zinf-shard export scratch");
            StateReader state(m, res.state);
            Reads reads(engine);
            stream.write(file, 0, l.head);
            for (const auto& o : l.outs)
                write_tensor(m, keys[o.key], o, tiles.at(keys[o.key].name), se, state, reads, stream, file,
                             scratch.bytes(), opts);
            if (l.pad_bytes)
                stream.write(file, l.pad_at, l.pad_bytes, [](std::uint64_t, std::span<std::byte> piece) {
                    std::memset(piece.data(), 0, piece.size());
                });
        }
        engine.sync(file);
        // The bytes just written came from partitions checked before the
        // first was read; checked again now, a state that changed while it
        // was read (a writer that ignores the lock) is never exported.
        try {
            verify_state(m, res.state, engine, pool, opts);
        } catch (const DataError& e) {
            throw DataError("the state changed while it was exported (" + e.message() +
                            "); nothing was written: export again once no program writes it");
        }
        file.close();
        if (sys::rename(tmp, to) != 0) throw_errno("rename", errno, to, {}, true);
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    fsync_dir(fs::path(to).parent_path().string());
    return res;
}

}  // namespace zinf::shard
