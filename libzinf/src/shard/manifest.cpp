// The layout of partitions over ranks and files, and the manifest that
// records it: JSON Lines, a header and one record per (tensor, rank, state).
// The reader trusts nothing: every key is typed, every record is checked
// against the layout its header implies, and file paths must stay inside the
// data directory.
#include <zinf/shard.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <istream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <unistd.h>

namespace zinf::shard {

namespace {

std::vector<std::string> states_for(const LayoutOptions& o) {
    std::vector<std::string> s = {"param"};
    if (o.train) {
        // With fp32 parameters the param state is the master copy.
        if (o.param_dtype != DType::fp32) s.push_back("master");
        s.push_back("exp_avg");
        s.push_back("exp_avg_sq");
    }
    return s;
}

Tier tier_of(const LayoutOptions& o, const std::string& state) {
    return state == "param" ? o.param_tier : o.optim_tier;
}

std::string file_name(unsigned rank, const std::string& state) {
    return "rank" + std::to_string(rank) + "/" + state + ".bin";
}

// A path inside the data directory: relative, no "..", nothing odd.
void check_path(const std::string& file, const std::string& where) {
    if (file.empty()) throw DataError(where + ": empty file path");
    if (file.front() == '/') throw DataError(where + ": absolute file path '" + file + "' refused");
    if (file.find('\0') != std::string::npos) throw DataError(where + ": file path holds a NUL byte");
    std::size_t start = 0;
    while (start <= file.size()) {
        std::size_t slash = file.find('/', start);
        std::string_view part(file.data() + start, (slash == std::string::npos ? file.size() : slash) - start);
        if (part == "..")
            throw DataError(where + ": file path '" + file + "' leaves the data directory ('..' refused)");
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    if (file.back() == '/') throw DataError(where + ": file path '" + file + "' names a folder");
}

// The one spelling of a checked path ("rank0//master.bin" and
// "./rank0/master.bin" are "rank0/master.bin"), so that comparing names
// compares files: the overlap check below, the optimizer's file per state.
std::string normal_path(const std::string& file, const std::string& where) {
    check_path(file, where);
    const std::string n = std::filesystem::path(file).lexically_normal().string();
    if (n.empty() || n == "." || n.back() == '/')
        throw DataError(where + ": file path '" + file + "' names a folder");
    return n;
}

bool get_bool(const json::Json& o, const std::string& key, const std::string& where) {
    auto it = o.find(key);
    if (it == o.end()) throw DataError(where + ": missing key '" + key + "'");
    if (!it->is_boolean()) throw DataError(where + ": key '" + key + "' must be true or false, got " + it->dump());
    return it->get<bool>();
}

// Throws DataError where a UsageError would come from parsing a value.
template <class F>
auto as_data(const std::string& where, F f) {
    try {
        return f();
    } catch (const UsageError& e) {
        throw DataError(where + ": " + e.message());
    }
}

const std::set<std::string> kHeaderKeys = {"schema", "model", "preset", "tile", "dp", "param_dtype", "param_tier",
                                           "optim_tier", "grad_tier", "train", "states", "alignment", "seed",
                                           "tensors", "records", "parameters", "dir", "rank_dirs", "created_by"};
const std::set<std::string> kRecordKeys = {"tensor", "shape", "dtype", "state", "tier", "rank",
                                           "elements", "file", "offset", "bytes", "xxh3", "step"};

constexpr std::uint64_t kMaxRecords = 1ull << 28;
// The tensor list is made from the header alone, before any record is read:
// bounded, so that a short header cannot make a reader allocate gigabytes.
constexpr std::uint64_t kMaxTensors = 1ull << 20;
// A partition's end must be a file offset (off_t: below 2^63), and the
// alignment one that rounding it up cannot carry past that.
constexpr std::uint64_t kMaxAlignment = 1ull << 30;
constexpr std::uint64_t kMaxEnd = (1ull << 63) - 1 - kMaxAlignment;
bool past_max_end(std::uint64_t offset, std::uint64_t bytes) { return offset > kMaxEnd || bytes > kMaxEnd - offset; }

json::Json unknown_keys(const json::Json& o, const std::set<std::string>& known) {
    json::Json extra = json::Json::object();
    for (auto it = o.begin(); it != o.end(); ++it)
        if (!known.count(it.key())) extra[it.key()] = it.value();
    return extra;
}

}  // namespace

DType state_dtype(const LayoutOptions& o, const std::string& state) {
    return state == "param" ? o.param_dtype : DType::fp32;
}

// ---------------------------------------------------------------------------
Owned owned(std::uint64_t numel, unsigned dp, unsigned rank) {
    if (dp == 0) throw InternalError("shard::owned: dp is 0");
    Owned o;
    o.per = numel / dp + (numel % dp != 0);
    o.first = std::min(numel, o.per * rank);
    o.count = std::min(o.per, numel - o.first);
    return o;
}

Manifest layout(const ModelSpec& spec, const LayoutOptions& opts) {
    if (opts.dp == 0) throw UsageError("--dp must be at least 1");
    if (!is_pow2(opts.alignment) || opts.alignment < 512 || opts.alignment > kMaxAlignment)
        throw UsageError("--align " + std::to_string(opts.alignment) + ": must be a power of two from 512 to 1GiB");
    Manifest m;
    m.spec = spec;
    m.opts = opts;
    m.states = states_for(opts);
    m.created_by = std::string("zinf-shard ") + version();
    if (opts.tile >= 1 && opts.tile <= spec.hidden && tensor_count(spec, opts.tile) > kMaxTensors)
        throw UsageError("--tile " + std::to_string(opts.tile) + ": " + std::to_string(tensor_count(spec, opts.tile)) +
                         " tensors, more than a manifest holds (" + std::to_string(kMaxTensors) + ")");
    m.tensors = tensors(spec, opts.tile);
    // What the manifest reader would refuse is not laid out either, and the
    // count is checked before the records are made, so that a dp the model
    // cannot be split over is a usage error, never an allocation failure.
    const std::uint64_t records = std::uint64_t{m.tensors.size()} * opts.dp * m.states.size();
    if (records > kMaxRecords)
        throw UsageError("--dp " + std::to_string(opts.dp) + ": " + std::to_string(m.tensors.size()) + " tensors x " +
                         std::to_string(opts.dp) + " ranks x " + std::to_string(m.states.size()) +
                         " states make " + std::to_string(records) + " records, more than a manifest holds (" +
                         std::to_string(kMaxRecords) + "); at most dp " +
                         std::to_string(kMaxRecords / (m.tensors.size() * m.states.size())) + " for this model");
    // Each record is a Partition and its file name on the heap: more than
    // the memory there is would end in an allocation failure or the OOM
    // killer half-way, so say it now.
    const std::uint64_t need = records * (sizeof(Partition) + 64), avail = meminfo_bytes("MemAvailable");
    if (avail && need > avail)
        throw UsageError("--dp " + std::to_string(opts.dp) + ": the " + std::to_string(records) +
                         " records of this layout need about " + format_size(need) + " of memory, " +
                         format_size(avail) + " is available; use a smaller --dp");
    std::map<std::string, std::uint64_t> cursor;  // next free offset per file
    m.parts.reserve(records);
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        for (unsigned r = 0; r < opts.dp; ++r)
            for (const auto& s : m.states) {
                const Owned own = owned(m.tensors[t].numel, opts.dp, r);
                Partition p;
                p.tensor = t;
                p.rank = r;
                p.state = s;
                p.dtype = state_dtype(opts, s);
                p.tier = tier_of(opts, s);
                p.first = own.first;
                p.last = own.last();
                p.file = file_name(r, s);
                p.bytes = own.per * dtype_bytes(p.dtype);
                auto& c = cursor[p.file];
                p.offset = c;
                if (past_max_end(c, p.bytes))
                    throw UsageError("this layout puts more than 2^63 bytes (the largest file) in " + p.file +
                                     ": use a larger --dp or a smaller model");
                c = align_up(c + p.bytes, opts.alignment);
                m.parts.push_back(std::move(p));
            }
    }
    return m;
}

std::vector<std::string> Manifest::files() const {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto& p : parts)
        if (seen.insert(p.file).second) out.push_back(p.file);
    return out;
}

std::uint64_t Manifest::file_bytes(const std::string& file) const {
    std::uint64_t end = 0;
    for (const auto& p : parts)
        if (p.file == file) end = std::max(end, align_up(p.offset + p.bytes, opts.alignment));
    return end;
}

std::uint64_t Manifest::total_bytes() const {
    std::uint64_t n = 0;
    for (const auto& p : parts) n += p.bytes;
    return n;
}

bool Manifest::initialised() const {
    return !parts.empty() && std::all_of(parts.begin(), parts.end(), [](const Partition& p) { return p.xxh3.has_value(); });
}

std::size_t Manifest::find_tensor(std::string_view name) const {
    for (std::size_t i = 0; i < tensors.size(); ++i)
        if (tensors[i].name == name) return i;
    std::string near;
    std::size_t shown = 0;
    // Names sharing the longest prefix help most ("h.0.attn.c_attn.weight" when tiled).
    for (std::size_t len = name.size(); len > 0 && !shown; --len)
        for (const auto& t : tensors)
            if (t.name.compare(0, len, name.substr(0, len)) == 0 && shown < 4) {
                near += (shown++ ? ", " : "") + t.name;
            }
    throw DataError("no tensor named '" + std::string(name) + "' in this model" +
                    (shown ? " (near: " + near + ")" : ""));
}

namespace {
// "rank<r>/<name>" -> r and name; nullopt for any other spelling.
std::optional<std::pair<unsigned, std::string>> rank_file(const std::string& file) {
    if (!file.starts_with("rank")) return std::nullopt;
    std::size_t i = 4;
    unsigned long long r = 0;
    while (i < file.size() && i < 12 && file[i] >= '0' && file[i] <= '9') r = r * 10 + unsigned(file[i++] - '0');
    if (i == 4 || i >= file.size() || file[i] != '/' || (file[4] == '0' && i > 5)) return std::nullopt;
    std::string name = file.substr(i + 1);
    if (name.empty() || name.find('/') != std::string::npos || r > UINT32_MAX) return std::nullopt;
    return std::pair{static_cast<unsigned>(r), std::move(name)};
}
}  // namespace

Manifest::Place Manifest::place(const std::string& file, const std::string& in_dir) const {
    if (!rank_dirs.empty())
        if (auto rf = rank_file(file); rf && rf->first < rank_dirs.size()) return {rank_dirs[rf->first], rf->second};
    return {in_dir, file};
}

Manifest::Place Manifest::place(const std::string& file) const {
    if (dir.empty())
        throw UsageError("the manifest names no data directory: it comes from 'layout'; run 'zinf-shard init --dir D' first");
    return place(file, dir);
}

std::string Manifest::rank_folder(unsigned rank) const {
    if (rank < rank_dirs.size()) return rank_dirs[rank];
    return dir + "/rank" + std::to_string(rank);
}


std::vector<std::string> expand_rank_dirs(const std::vector<std::string>& given, unsigned dp) {
    const bool each = given.size() == dp && dp > 1;
    if (given.size() != 1 && !each)
        throw UsageError("--rank-dir: give one folder with %r for the rank (/local/nvme/run/rank%r), or one folder "
                         "per rank (" + std::to_string(dp) + "), not " + std::to_string(given.size()));
    std::vector<std::string> dirs;
    std::set<std::string> distinct;
    for (unsigned r = 0; r < dp; ++r) {
        const std::string& pattern = given[each ? r : 0];
        const std::string opt = "--rank-dir '" + pattern + "'";
        if (pattern.empty() || pattern.front() != '/')
            throw UsageError(opt + ": a rank folder must be an absolute path (each node resolves it on its own disk)");
        std::string d;
        for (std::size_t i = 0; i < pattern.size(); ++i) {
            if (pattern[i] != '%') {
                d += pattern[i];
                continue;
            }
            const char c = i + 1 < pattern.size() ? pattern[++i] : '\0';
            if (c == 'r') d += std::to_string(r);
            else if (c == '%') d += '%';
            else throw UsageError(opt + ": '%" + std::string(c ? 1 : 0, c) + "' is neither %r (the rank) nor %%");
        }
        std::string n = std::filesystem::path(d).lexically_normal().string();
        if (n.size() > 1 && n.back() == '/') n.pop_back();
        for (const auto& part : std::filesystem::path(d))
            if (part == "..") throw UsageError(opt + ": '..' is refused in a rank folder");
        if (!distinct.insert(n).second)
            throw UsageError(opt + ": rank " + std::to_string(r) + " would share " + n +
                             " with another rank; put %r where the rank goes (/local/nvme/run/rank%r)");
        dirs.push_back(n);
    }
    return dirs;
}

// ---------------------------------------------------------------------------
json::Json header_json(const Manifest& m) {
    json::Json h = *m.extra;
    h["schema"] = kManifestSchema;
    h["model"] = m.spec.to_string();
    if (!m.spec.preset.empty()) h["preset"] = m.spec.preset;
    h["parameters"] = m.spec.parameters();
    h["tile"] = m.opts.tile;
    h["dp"] = m.opts.dp;
    h["param_dtype"] = dtype_name(m.opts.param_dtype);
    h["param_tier"] = tier_name(m.opts.param_tier);
    h["optim_tier"] = tier_name(m.opts.optim_tier);
    h["grad_tier"] = tier_name(m.opts.optim_tier);
    h["train"] = m.opts.train;
    h["states"] = m.states;
    h["alignment"] = m.opts.alignment;
    h["seed"] = m.opts.seed;
    h["tensors"] = m.tensors.size();
    h["records"] = m.parts.size();
    if (!m.dir.empty()) h["dir"] = m.dir;
    if (!m.rank_dirs.empty()) h["rank_dirs"] = m.rank_dirs;
    else h.erase("rank_dirs");
    h["created_by"] = m.created_by;
    return h;
}

json::Json record_json(const Manifest& m, const Partition& p) {
    json::Json r = *p.extra;
    const Tensor& t = m.tensor_of(p);
    r["tensor"] = t.name;
    r["shape"] = t.shape;
    r["dtype"] = dtype_name(p.dtype);
    r["state"] = p.state;
    r["tier"] = tier_name(p.tier);
    r["rank"] = p.rank;
    r["elements"] = {p.first, p.last};
    r["file"] = p.file;
    r["offset"] = p.offset;
    r["bytes"] = p.bytes;
    if (p.xxh3) r["xxh3"] = hex64(*p.xxh3);
    else r.erase("xxh3");
    if (p.step) r["step"] = p.step;
    else r.erase("step");
    return r;
}

void write_manifest(std::ostream& out, const Manifest& m) {
    out << json::line(header_json(m));
    for (const auto& p : m.parts) out << json::line(record_json(m, p));
    out.flush();
}

void save_manifest(const Manifest& m, const std::string& path) {
    std::ostringstream text;
    write_manifest(text, m);
    const std::string s = text.str();
    const std::span<const std::byte> piece = std::as_bytes(std::span(s));
    write_file_atomic(path, {&piece, 1});
}

// ---------------------------------------------------------------------------
// Reading a manifest: the header, then each record against the layout it
// implies, then what the records say together.
namespace {

// The header's rank_dirs: one absolute folder per rank, no "..", no two alike.
std::vector<std::string> read_rank_dirs(const json::Json& rd, unsigned dp, const std::string& hw) {
    if (!rd.is_array() || rd.size() != dp)
        throw DataError(hw + ": rank_dirs must be an array of " + std::to_string(dp) + " folders, one per rank (dp " +
                        std::to_string(dp) + ")");
    std::vector<std::string> out;
    std::set<std::string> distinct;
    for (std::size_t r = 0; r < rd.size(); ++r) {
        if (!rd[r].is_string()) throw DataError(hw + ": rank_dirs[" + std::to_string(r) + "] is not a string");
        const std::string d = rd[r].get<std::string>();
        const std::string n = std::filesystem::path(d).lexically_normal().string();
        if (d.empty() || d.front() != '/' || d.find('\0') != std::string::npos)
            throw DataError(hw + ": rank_dirs[" + std::to_string(r) + "] '" + d + "' is not an absolute path");
        for (const auto& part : std::filesystem::path(d))
            if (part == "..")
                throw DataError(hw + ": rank_dirs[" + std::to_string(r) + "] '" + d + "': '..' is refused");
        if (!distinct.insert(n).second)
            throw DataError(hw + ": rank_dirs[" + std::to_string(r) + "] '" + d + "' is another rank's folder too");
        out.push_back(n.size() > 1 && n.back() == '/' ? n.substr(0, n.size() - 1) : n);
    }
    return out;
}

// The header's model and layout into `m` (its tensors too), every count
// checked against the model before anything of its size is allocated.
// Returns the number of records the header promises.
std::uint64_t read_header(const json::Json& h, const std::string& hw, Manifest& m) {
    if (!h.contains("schema") || !h["schema"].is_string())
        throw DataError(hw + ": the first record must be the header, with \"schema\": \"" + kManifestSchema + "\"");
    if (h["schema"] != kManifestSchema)
        throw DataError(hw + ": schema " + h["schema"].dump() + " is not " + kManifestSchema);

    m.spec = as_data(hw, [&] { return ModelSpec::parse(json::get_string(h, "model", hw)); });
    if (h.contains("preset")) m.spec.preset = json::get_string(h, "preset", hw);
    auto& o = m.opts;
    const std::uint64_t dp = json::get_u64(h, "dp", hw), tile = json::get_u64(h, "tile", hw);
    if (dp == 0 || dp > (1u << 20)) throw DataError(hw + ": dp " + std::to_string(dp) + " out of range");
    if (tile == 0 || tile > m.spec.hidden) throw DataError(hw + ": tile " + std::to_string(tile) + " out of range");
    o.dp = static_cast<unsigned>(dp);
    o.tile = static_cast<unsigned>(tile);
    o.param_dtype = as_data(hw, [&] { return parse_dtype(json::get_string(h, "param_dtype", hw)); });
    o.param_tier = as_data(hw, [&] { return parse_tier(json::get_string(h, "param_tier", hw)); });
    o.optim_tier = as_data(hw, [&] { return parse_tier(json::get_string(h, "optim_tier", hw)); });
    if (h.contains("grad_tier") && json::get_string(h, "grad_tier", hw) != tier_name(o.optim_tier))
        throw DataError(hw + ": grad_tier must equal optim_tier (gradients follow the optimizer)");
    o.train = get_bool(h, "train", hw);
    o.alignment = json::get_u64(h, "alignment", hw);
    if (!is_pow2(o.alignment) || o.alignment < 512 || o.alignment > kMaxAlignment)
        throw DataError(hw + ": alignment " + std::to_string(o.alignment) + " is not a power of two from 512 to 1GiB");
    o.seed = json::get_u64(h, "seed", hw);
    m.states = states_for(o);
    if (!h.contains("states") || h["states"] != json::Json(m.states))
        throw DataError(hw + ": states must be " + json::Json(m.states).dump() + " for this header");
    if (h.contains("parameters") && json::get_u64(h, "parameters", hw) != m.spec.parameters())
        throw DataError(hw + ": parameters " + h["parameters"].dump() + " disagrees with the model (" +
                        std::to_string(m.spec.parameters()) + ")");
    if (h.contains("dir")) {
        m.dir = json::get_string(h, "dir", hw);
        if (m.dir.empty()) throw DataError(hw + ": dir is empty");
    }
    if (h.contains("rank_dirs")) m.rank_dirs = read_rank_dirs(h["rank_dirs"], o.dp, hw);
    if (h.contains("created_by")) m.created_by = json::get_string(h, "created_by", hw);
    m.extra = unknown_keys(h, kHeaderKeys);

    const std::uint64_t n_model = tensor_count(m.spec, o.tile);
    const std::uint64_t n_tensors = json::get_u64(h, "tensors", hw), n_records = json::get_u64(h, "records", hw);
    if (n_tensors != n_model)
        throw DataError(hw + ": tensors " + std::to_string(n_tensors) + " disagrees with the model (" +
                        std::to_string(n_model) + ")");
    if (n_model > kMaxTensors)
        throw DataError(hw + ": tile " + std::to_string(o.tile) + " makes " + std::to_string(n_model) +
                        " tensors, more than this reader takes (" + std::to_string(kMaxTensors) + ")");
    const std::uint64_t expect = n_model * o.dp * m.states.size();
    // The header alone must not make the reader allocate without bound.
    if (expect > kMaxRecords)
        throw DataError(hw + ": dp " + std::to_string(o.dp) + " x " + std::to_string(n_model) +
                        " tensors makes " + std::to_string(expect) + " records, more than this reader takes (" +
                        std::to_string(kMaxRecords) + ")");
    if (n_records != expect)
        throw DataError(hw + ": records " + std::to_string(n_records) + ", but dp " + std::to_string(o.dp) + " x " +
                        std::to_string(n_model) + " tensors x " + std::to_string(m.states.size()) +
                        " states makes " + std::to_string(expect));
    m.tensors = tensors(m.spec, o.tile);
    return expect;
}

// The manifest's tensors and states by name, for its records.
struct Names {
    std::map<std::string_view, std::size_t> tensors, states;
    explicit Names(const Manifest& m) {
        for (std::size_t i = 0; i < m.tensors.size(); ++i) tensors[m.tensors[i].name] = i;
        for (std::size_t i = 0; i < m.states.size(); ++i) states[m.states[i]] = i;
    }
};

// One record (`w`: where it stands), checked against the layout the header
// implies: its tensor, shape, state, rank, dtype, tier, elements, file,
// offset and size.
Partition read_record(const json::Json& r, const std::string& w, const Manifest& m, const Names& names) {
    const LayoutOptions& o = m.opts;
    if (r.contains("schema")) throw DataError(w + ": a second header");
    Partition p;
    const std::string name = json::get_string(r, "tensor", w);
    auto ti = names.tensors.find(name);
    if (ti == names.tensors.end()) throw DataError(w + ": tensor '" + name + "' is not in " + m.spec.to_string());
    p.tensor = ti->second;
    const Tensor& t = m.tensors[p.tensor];
    if (!r.contains("shape") || r["shape"] != json::Json(t.shape))
        throw DataError(w + ": " + name + ": shape " + (r.contains("shape") ? r["shape"].dump() : "missing") +
                        ", expected " + json::Json(t.shape).dump());
    p.state = json::get_string(r, "state", w);
    if (!names.states.count(p.state))
        throw DataError(w + ": state '" + p.state + "' is not one of " + json::Json(m.states).dump());
    const std::uint64_t rank = json::get_u64(r, "rank", w);
    if (rank >= o.dp) throw DataError(w + ": rank " + std::to_string(rank) + " is not below dp " + std::to_string(o.dp));
    p.rank = static_cast<unsigned>(rank);
    p.dtype = as_data(w, [&] { return parse_dtype(json::get_string(r, "dtype", w)); });
    if (p.dtype != state_dtype(o, p.state))
        throw DataError(w + ": " + name + " " + p.state + ": dtype " + dtype_name(p.dtype) + ", the header says " +
                        dtype_name(state_dtype(o, p.state)));
    p.tier = as_data(w, [&] { return parse_tier(json::get_string(r, "tier", w)); });
    if (p.tier != tier_of(o, p.state))
        throw DataError(w + ": " + name + " " + p.state + ": tier " + tier_name(p.tier) + ", the header says " +
                        tier_name(tier_of(o, p.state)));
    if (!r.contains("elements") || !r["elements"].is_array() || r["elements"].size() != 2 ||
        !r["elements"][0].is_number_unsigned() || !r["elements"][1].is_number_unsigned())
        throw DataError(w + ": elements must be [first, last]");
    p.first = r["elements"][0].get<std::uint64_t>();
    p.last = r["elements"][1].get<std::uint64_t>();
    const Owned own = owned(t.numel, o.dp, p.rank);
    const std::uint64_t f = own.first, l = own.last();
    if (p.first != f || p.last != l)
        throw DataError(w + ": " + name + " rank " + std::to_string(p.rank) + ": elements [" + std::to_string(p.first) +
                        ", " + std::to_string(p.last) + "), but dp " + std::to_string(o.dp) + " gives [" +
                        std::to_string(f) + ", " + std::to_string(l) + ") (overlapping or missing range)");
    p.file = normal_path(json::get_string(r, "file", w), w);
    if (!m.rank_dirs.empty())
        if (auto rf = rank_file(p.file); !rf || rf->first != p.rank)
            throw DataError(w + ": file '" + p.file + "': with rank_dirs, rank " + std::to_string(p.rank) +
                            "'s files are named rank" + std::to_string(p.rank) + "/<name>");
    p.offset = json::get_u64(r, "offset", w);
    if (p.offset % o.alignment)
        throw DataError(w + ": offset " + std::to_string(p.offset) + " is not aligned to " +
                        std::to_string(o.alignment));
    p.bytes = json::get_u64(r, "bytes", w);
    if (p.bytes != own.per * dtype_bytes(p.dtype))
        throw DataError(w + ": bytes " + std::to_string(p.bytes) + ", expected " +
                        std::to_string(own.per * dtype_bytes(p.dtype)));
    // Offset + bytes near 2^64 would wrap in every sum made of them
    // (the overlap check, file sizes): no file reaches 2^63.
    if (past_max_end(p.offset, p.bytes))
        throw DataError(w + ": offset " + std::to_string(p.offset) + " + bytes " + std::to_string(p.bytes) +
                        " runs past the largest file offset (2^63 - 1) of " + p.file);
    if (r.contains("xxh3")) {
        const std::string hx = json::get_string(r, "xxh3", w);
        p.xxh3 = as_data(w, [&] {
            try {
                return parse_hex64(hx);
            } catch (const DataError& e) {
                throw DataError(w + ": xxh3: " + e.message());
            }
        });
    }
    if (r.contains("step")) p.step = json::get_u64(r, "step", w);
    p.extra = unknown_keys(r, kRecordKeys);
    return p;
}

// After the last record (line `last_line`): the first (tensor, rank, state)
// none named, when any is missing.
void check_complete(const Manifest& m, const std::vector<bool>& seen, const std::string& source, std::size_t last_line,
                    std::size_t header_line) {
    if (m.parts.size() == seen.size()) return;
    for (std::size_t s = 0; s < seen.size(); ++s)
        if (!seen[s]) {
            const std::size_t st = s % m.states.size(), rk = s / m.states.size() % m.opts.dp,
                              tn = s / m.states.size() / m.opts.dp;
            throw DataError(source + ": " + std::to_string(seen.size() - m.parts.size()) +
                            " record(s) missing after line " + std::to_string(last_line) + ", the first: " +
                            m.tensors[tn].name + " rank " + std::to_string(rk) + " " + m.states[st] +
                            " (header on line " + std::to_string(header_line) + ")");
        }
}

// No two partitions may share bytes of a file.
void check_overlaps(const Manifest& m, const std::string& source) {
    std::vector<const Partition*> order;
    order.reserve(m.parts.size());
    for (const auto& p : m.parts) order.push_back(&p);
    std::sort(order.begin(), order.end(), [](const Partition* a, const Partition* b) {
        return a->file != b->file ? a->file < b->file : a->offset < b->offset;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
        const Partition &a = *order[i - 1], &b = *order[i];
        if (a.file == b.file && a.offset + a.bytes > b.offset)
            throw DataError(source + ": line " + std::to_string(b.line) + ": bytes [" + std::to_string(b.offset) +
                            ", " + std::to_string(b.offset + b.bytes) + ") of " + b.file + " overlap line " +
                            std::to_string(a.line) + "'s [" + std::to_string(a.offset) + ", " +
                            std::to_string(a.offset + a.bytes) + ")");
    }
}

}  // namespace

Manifest read_manifest(std::istream& in, const std::string& source) {
    std::string text;
    std::size_t line_no = 0;
    auto next = [&](json::Json& out) {
        while (std::getline(in, text)) {
            ++line_no;
            if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
            out = json::parse_line(text, source, line_no);
            return true;
        }
        if (in.bad()) throw IoError("read failed", {errno, source, {}, -1});
        return false;
    };
    auto at = [&](std::size_t line) { return source + ": line " + std::to_string(line); };

    json::Json h;
    if (!next(h)) throw DataError(source + ": empty manifest (no header line)");
    const std::size_t header_line = line_no;
    Manifest m;
    const std::uint64_t expect = read_header(h, at(header_line), m);
    const Names names(m);
    // Which (tensor, rank, state) has been read: duplicates and gaps. One bit
    // each (32MiB at kMaxRecords); nothing else is sized by the header.
    std::vector<bool> seen(expect, false);
    json::Json r;
    while (next(r)) {
        const std::string w = at(line_no);
        Partition p = read_record(r, w, m, names);
        p.line = line_no;
        const std::size_t slot = (p.tensor * m.opts.dp + p.rank) * m.states.size() + names.states.at(p.state);
        if (seen[slot]) {
            const auto first = std::find_if(m.parts.begin(), m.parts.end(), [&](const Partition& q) {
                return q.tensor == p.tensor && q.rank == p.rank && q.state == p.state;
            });
            throw DataError(w + ": " + m.tensors[p.tensor].name + " rank " + std::to_string(p.rank) + " " + p.state +
                            " again (first on line " + std::to_string(first->line) + ")");
        }
        seen[slot] = true;
        m.parts.push_back(std::move(p));
    }
    check_complete(m, seen, source, line_no, header_line);
    check_overlaps(m, source);
    return m;
}

Manifest read_manifest_input(const std::string& path) {
    if (path != "-") return read_manifest_file(path);
    if (::isatty(0))
        throw UsageError("reading the manifest from stdin, which is a terminal: pipe one in or give --manifest FILE");
    return read_manifest(std::cin, "<stdin>");
}

Manifest read_manifest_file(const std::string& path) {
    // A FIFO (-m <(zinf-shard layout ...)) is read as it comes; opening one
    // never blocks, and waiting for its writer ends on a signal.
    const auto in = input_stream(path);
    return read_manifest(*in, path);
}

}  // namespace zinf::shard
