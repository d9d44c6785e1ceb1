// Our own reader and writer of the safetensors container (the format of
// huggingface/safetensors: a header length, a JSON header, raw data). The
// reader trusts nothing: every offset and size is checked against the file
// before a byte of data is read, and the data must be covered exactly once.
#include "formats.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <set>

namespace zinf::shard::detail {

namespace {

struct DtypeInfo {
    const char* name;
    std::size_t bytes;
};
// Every dtype the format defines, so that tensors import does not use still
// have their sizes checked.
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};

std::size_t dtype_size(const std::string& d) {
    for (const auto& x : kDtypes)
        if (d == x.name) return x.bytes;
    return 0;
}

std::string range_text(std::uint64_t b, std::uint64_t e) {
    return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
}

void read_exact(io::Engine& engine, io::File& file, std::uint64_t offset, std::span<std::byte> dst) {
    engine.wait(engine.read(file, offset, dst));
}

StTensor parse_entry(const std::string& name, const json::Json& v, const std::string& path) {
    auto bad = [&](const std::string& why) {
        return DataError("safetensors header: tensor '" + name + "': " + why, {0, path, {}, -1});
    };
    if (!v.is_object()) throw bad("its entry is not an object");
    StTensor t;
    t.name = name;
    auto it = v.find("dtype");
    if (it == v.end() || !it->is_string()) throw bad("no \"dtype\" string");
    t.dtype = it->get<std::string>();
    it = v.find("shape");
    if (it == v.end() || !it->is_array()) throw bad("no \"shape\" array");
    for (const auto& d : *it) {
        if (!d.is_number_unsigned()) throw bad("\"shape\" holds " + d.dump() + ", not a non-negative integer");
        t.shape.push_back(d.get<std::uint64_t>());
    }
    it = v.find("data_offsets");
    if (it == v.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned())
        throw bad("no \"data_offsets\" pair of non-negative integers");
    t.begin = (*it)[0].get<std::uint64_t>();
    t.end = (*it)[1].get<std::uint64_t>();
    if (t.end < t.begin) throw bad("data_offsets " + range_text(t.begin, t.end) + " end before they begin");
    for (auto k = v.begin(); k != v.end(); ++k)
        if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
            throw bad("unknown key \"" + k.key() + "\"");
    const std::size_t size = dtype_size(t.dtype);
    if (!size) throw bad("unknown dtype \"" + t.dtype + "\"");
    unsigned __int128 bytes = size;
    // A dimension of 0 makes the tensor empty, however large the others.
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) bytes = 0;
    for (auto d : t.shape) {
        if (bytes == 0) break;
        bytes *= d;
        if (bytes >= (unsigned __int128){1} << 64) throw bad("shape " + shape_text(t.shape) + " is too large");
    }
    if (bytes != t.end - t.begin)
        throw bad("data_offsets " + range_text(t.begin, t.end) + " hold " + std::to_string(t.end - t.begin) +
                  " bytes, but " + t.dtype + " " + shape_text(t.shape) + " needs " +
                  std::to_string(static_cast<std::uint64_t>(bytes)));
    return t;
}

}  // namespace

std::size_t elem_bytes(Elem e) { return e == Elem::f32 ? 4 : 2; }

std::string shape_text(const std::vector<std::uint64_t>& s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

bool st_elem(const std::string& dtype, Elem& out) {
    if (dtype == "F32") out = Elem::f32;
    else if (dtype == "F16") out = Elem::f16;
    else if (dtype == "BF16") out = Elem::bf16;
    else return false;
    return true;
}

const char* st_dtype(Elem e) { return e == Elem::f32 ? "F32" : e == Elem::f16 ? "F16" : "BF16"; }

StFile read_safetensors(io::File& file, io::Engine& engine) {
    const std::string& path = file.path();
    const std::uint64_t size = file.size();
    if (size < 8)
        throw DataError("not a safetensors file: " + std::to_string(size) +
                            " bytes, fewer than the 8 of the header length",
                        {0, path, 0, -1});
    std::array<std::byte, 8> len_bytes;
    read_exact(engine, file, 0, len_bytes);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint8_t>(len_bytes[static_cast<std::size_t>(i)]);
    if (n > kMaxStHeader)
        throw DataError("safetensors header length " + std::to_string(n) + " is more than the " +
                            format_size(kMaxStHeader) + " the format allows",
                        {0, path, 0, -1});
    if (n > size - 8)
        throw DataError("safetensors header length " + std::to_string(n) + " runs past the end of the file (" +
                            std::to_string(size) + " bytes)",
                        {0, path, 0, -1});
    std::string text(n, '\0');
    read_exact(engine, file, 8, std::as_writable_bytes(std::span(text.data(), text.size())));
    if (text.empty() || text[0] != '{')
        throw DataError("safetensors header does not start with '{'", {0, path, 8, -1});

    // nlohmann keeps the last of two equal keys; the format forbids them, in
    // the header and inside an entry alike. An entry is {"dtype", "shape",
    // "data_offsets"}: nothing nests deeper than 3, and the values are
    // capped, so a hostile header cannot make the parse take gigabytes.
    json::Json header;
    try {
        header = json::parse_untrusted(text, {.depth = 3, .values = std::uint64_t{1} << 20});
    } catch (const DataError& e) {
        throw DataError("safetensors header: " + e.message(), {0, path, 8, -1});
    } catch (const json::Json::parse_error& e) {
        throw DataError("safetensors header is not JSON: " + std::string(e.what()), {0, path, 8 + e.byte, -1});
    } catch (const json::Json::exception& e) {  // out_of_range: a number past a double ("1e999")
        throw DataError("safetensors header is not JSON: " + std::string(e.what()), {0, path, 8, -1});
    }
    if (!header.is_object()) throw DataError("safetensors header is not a JSON object", {0, path, 8, -1});

    StFile f;
    f.data_start = 8 + n;
    const std::uint64_t data = size - f.data_start;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__") {
            if (!it->is_object()) throw DataError("safetensors header: __metadata__ is not an object", {0, path, 8, -1});
            for (auto m = it->begin(); m != it->end(); ++m)
                if (!m->is_string())
                    throw DataError("safetensors header: __metadata__ \"" + m.key() + "\" is not a string",
                                    {0, path, 8, -1});
            f.metadata = *it;
            continue;
        }
        f.tensors.push_back(parse_entry(it.key(), *it, path));
    }
    // Every data byte belongs to exactly one tensor: in offset order, each
    // begins where the one before ended, and the last ends at the file's end.
    std::vector<const StTensor*> order;
    for (const auto& t : f.tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const StTensor* a, const StTensor* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    std::uint64_t covered = 0;
    const StTensor* prev = nullptr;
    for (const StTensor* t : order) {
        if (t->end > data)
            throw DataError("safetensors: tensor '" + t->name + "' data_offsets " + range_text(t->begin, t->end) +
                                " run past the data's " + std::to_string(data) + " bytes (the file is " +
                                std::to_string(size) + " bytes, the data starts at " + std::to_string(f.data_start) +
                                ")",
                            {0, path, f.data_start + t->begin, -1});
        if (t->begin < covered)
            throw DataError("safetensors: tensor '" + t->name + "' data_offsets " + range_text(t->begin, t->end) +
                                " overlap tensor '" + prev->name + "' " + range_text(prev->begin, prev->end),
                            {0, path, f.data_start + t->begin, -1});
        if (t->begin > covered)
            throw DataError("safetensors: data bytes " + range_text(covered, t->begin) +
                                " belong to no tensor (a gap before tensor '" + t->name + "')",
                            {0, path, f.data_start + covered, -1});
        covered = t->end;
        prev = t;
    }
    if (covered != data)
        throw DataError("safetensors: data bytes " + range_text(covered, data) +
                            " at the end of the file belong to no tensor",
                        {0, path, f.data_start + covered, -1});
    return f;
}

std::string safetensors_header(const std::vector<StTensor>& tensors, const json::Json& metadata) {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    for (const auto& t : tensors)
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(text.size() >> (8 * i) & 0xff);
    return out + text;
}

StIndex parse_st_index(std::string_view text, const std::string& path) {
    json::Json j;
    try {
        j = json::parse_untrusted(text, {.depth = 8, .values = std::uint64_t{1} << 20});
    } catch (const DataError& e) {
        throw DataError("index: " + e.message(), {0, path, {}, -1});
    } catch (const json::Json::exception& e) {  // parse_error, out_of_range ("1e999")
        throw DataError(std::string("index is not JSON: ") + e.what(), {0, path, {}, -1});
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        throw DataError("no \"weight_map\" object (Hugging Face's model.safetensors.index.json)", {0, path, {}, -1});
    StIndex index;
    for (const auto& [name, file] : j["weight_map"].items()) {
        // A NUL would cut the name where C strings and messages meet it: no
        // shard's header can name such a tensor.
        if (name.empty() || name.find('\0') != std::string::npos)
            throw DataError("weight_map names a tensor " + json::Json(name).dump() +
                                (name.empty() ? " with no name" : " whose name holds a NUL byte") +
                                ": no safetensors shard holds one",
                            {0, path, {}, -1});
        if (!file.is_string()) throw DataError("weight_map[\"" + name + "\"] is not a file name", {0, path, {}, -1});
        const std::string f = file.get<std::string>();
        if (f.find('\0') != std::string::npos)
            throw DataError("weight_map[\"" + name + "\"] names a file whose name holds a NUL byte", {0, path, {}, -1});
        // A file beside the index, nothing that leads elsewhere.
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
            throw DataError("weight_map names '" + f + "': a shard must be a file beside the index", {0, path, {}, -1});
        index.weight_map[name] = f;
        if (std::find(index.shards.begin(), index.shards.end(), f) == index.shards.end()) index.shards.push_back(f);
    }
    if (index.shards.empty()) throw DataError("the weight_map is empty", {0, path, {}, -1});
    return index;
}

}  // namespace zinf::shard::detail
