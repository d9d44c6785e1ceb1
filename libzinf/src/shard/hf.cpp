// Hugging Face checkpoints of Llama-family models, in and out. A Llama's
// tensors in zinf have the checkpoint's names and shapes (linear weights
// (out, in), tiles runs of consecutive elements), so every tensor moves as
// a run of bytes, converted between F32, F16 and BF16, a pool buffer at a
// time: memory does not grow with the model.
//   import: a .safetensors file, a model.safetensors.index.json with its
//           shards beside it, or the folder of either; every tensor checked
//           against the layout before anything is written.
//   export: one file, or shards of a size the user sets into a folder with
//           model.safetensors.index.json, Hugging Face's names and layout.
#include "formats.hpp"
#include "llama.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zinf::shard::detail {

namespace {

namespace fs = std::filesystem;

float load_elem(const std::byte* p, Elem e) {
    if (e == Elem::f32) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
    }
    std::uint16_t u;
    std::memcpy(&u, p, 2);
    if (e == Elem::bf16) return from_bf16(u);
    // IEEE half: exact in fp32.
    const std::uint32_t sign = static_cast<std::uint32_t>(u >> 15) << 31, exp = (u >> 10) & 0x1f, mant = u & 0x3ff;
    if (exp == 0) {
        const float v = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -v : v;
    }
    const std::uint32_t bits =
        exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

// n elements from `src` (se) into `dst` (de); de is F32 or BF16.
void convert(const std::byte* src, Elem se, std::byte* dst, Elem de, std::size_t n) {
    if (se == de) {
        std::memcpy(dst, src, n * elem_bytes(se));
        return;
    }
    for (std::size_t i = 0; i < n; ++i) {
        const float v = load_elem(src + i * elem_bytes(se), se);
        if (de == Elem::f32) {
            std::memcpy(dst + 4 * i, &v, 4);
        } else {
            const std::uint16_t u = to_bf16(v);
            std::memcpy(dst + 2 * i, &u, 2);
        }
    }
}

// ---------------------------------------------------------------------------
// The checkpoint's tensors, by name, wherever they lie.
struct HfTensor {
    std::size_t file = 0;  // into Checkpoint::files
    StTensor st;
    std::uint64_t data_start = 0;
    Elem elem = Elem::f32;
};
struct Checkpoint {
    std::vector<io::File> files;
    std::map<std::string, HfTensor> tensors;
    std::string source;  // what the user gave, for messages
};

bool has_suffix(const std::string& s, const std::string& x) {
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

Checkpoint open_checkpoint(const std::string& from, io::Engine& engine) {
    Checkpoint c;
    c.source = from;
    std::string path = from;
    std::error_code ec;
    if (fs::is_directory(from, ec)) {
        const fs::path d(from);
        if (fs::exists(d / "model.safetensors.index.json", ec)) path = (d / "model.safetensors.index.json").string();
        else if (fs::exists(d / "model.safetensors", ec)) path = (d / "model.safetensors").string();
        else
            throw MissingInputError("no model.safetensors or model.safetensors.index.json in the folder",
                                    {ENOENT, from, {}, -1});
    }
    // The shards: an index's weight_map, or the one file.
    std::vector<std::string> shards;
    std::map<std::string, std::string> weight_map;  // tensor -> shard
    std::string folder = fs::path(path).parent_path().string();
    if (folder.empty()) folder = ".";
    if (has_suffix(path, ".json")) {
        // Read whole (a FIFO refused at once), then parsed under limits.
        StIndex index = parse_st_index(read_regular(path, kMaxStHeader, "an index"), path);
        shards = std::move(index.shards);
        weight_map = std::move(index.weight_map);
        for (auto& s : shards) s = folder + "/" + s;
    } else {
        shards.push_back(path);
    }
    for (const std::string& shard : shards) {
        const std::string rel = fs::path(shard).filename().string();
        // A folder where a shard should be is bad input, as an index that is
        // a folder is (65), not a failed read (74).
        if (struct stat st {}; ::stat(shard.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
            throw DataError("is a folder, not a safetensors shard" +
                                (weight_map.empty() ? std::string() : " (the index " + path + " names it)"),
                            {0, shard, {}, -1});
        c.files.push_back(io::File::open(shard, {.access = io::Access::read, .direct = io::Direct::buffered}));
        const StFile f = read_safetensors(c.files.back(), engine);
        for (const auto& st : f.tensors) {
            HfTensor t{c.files.size() - 1, st, f.data_start, Elem::f32};
            if (!weight_map.empty()) {
                const auto it = weight_map.find(st.name);
                if (it == weight_map.end() || it->second != rel)
                    throw DataError("tensor '" + st.name + "' is in " + rel + ", but the index " +
                                        (it == weight_map.end() ? "does not name it" : "puts it in " + it->second),
                                    {0, path, {}, -1});
            }
            const auto [it, fresh] = c.tensors.emplace(st.name, std::move(t));
            if (!fresh)
                throw DataError("tensor '" + st.name + "' is in two shards (" +
                                    c.files[it->second.file].path() + " and " + shard + ")",
                                {0, path, {}, -1});
        }
    }
    for (const auto& [name, file] : weight_map)
        if (!c.tensors.count(name))
            throw DataError("the index puts tensor '" + name + "' in " + file + ", which does not hold it",
                            {0, path, {}, -1});
    return c;
}

// Buffers a checkpoint may hold that are no weights.
bool ignorable(const std::string& name) { return has_suffix(name, ".rotary_emb.inv_freq"); }

}  // namespace

// ---------------------------------------------------------------------------
Written import_hf(Manifest& m, const std::string& from, const std::string& dir, io::Engine& engine,
                  mem::PinnedPool& pool, const RunOptions& opts) {
    Checkpoint c = open_checkpoint(from, engine);
    const auto keys = tensors(m.spec);
    const std::string model = m.spec.to_string();
    auto bad = [&](const std::string& why, const HfTensor* t = nullptr) {
        return DataError(why, {0, t ? c.files[t->file].path() : from,
                               t ? std::optional<std::uint64_t>(t->data_start + t->st.begin) : std::nullopt, -1});
    };
    // Every model tensor, in the model's order: the first named is the first that differs.
    std::map<std::string, const HfTensor*> place;
    for (const auto& k : keys) {
        const auto it = c.tensors.find(k.name);
        if (it == c.tensors.end())
            throw bad("no tensor '" + k.name + "' for the manifest's model (" + model + ")");
        HfTensor& t = it->second;
        if (t.st.shape != k.shape)
            throw bad("tensor '" + k.name + "' has shape " + shape_text(t.st.shape) + ", the manifest's model (" +
                          model + ") has " + shape_text(k.shape),
                      &t);
        if (!st_elem(t.st.dtype, t.elem))
            throw bad("tensor '" + k.name + "' is " + t.st.dtype + "; import converts F32, F16 and BF16", &t);
        place[k.name] = &t;
    }
    for (const auto& [name, t] : c.tensors) {
        if (place.count(name)) continue;
        if (ignorable(name)) continue;
        if (name == "lm_head.weight" && m.spec.tied) {
            log::info(c.files[t.file].path() + ": lm_head.weight left out: the model's output head is "
                      "model.embed_tokens.weight (tied)");
            continue;
        }
        throw bad("tensor '" + name + "' " + shape_text(t.st.shape) + " has no place in the manifest's model (" +
                      model + ")",
                  &t);
    }

    ValueSource values;
    values.scratch = true;
    values.fill = [&](const Tensor& t, std::uint64_t first, std::span<float> out, std::span<std::byte> scratch) {
        const std::uint64_t n = first < t.numel ? std::min<std::uint64_t>(out.size(), t.numel - first) : 0;
        std::fill(out.begin() + static_cast<std::ptrdiff_t>(n), out.end(), 0.0f);  // padding
        const HfTensor& h = *place.at(t.key);
        const std::size_t eb = elem_bytes(h.elem);
        const std::uint64_t cap = scratch.size() / eb;
        if (cap == 0) throw InternalError("import: no scratch");
        // A tile is the key's elements [col0, col0 + numel): one run of the file.
        for (std::uint64_t done = 0; done < n;) {
            const std::uint64_t k = std::min(cap, n - done);
            const std::uint64_t at = h.data_start + h.st.begin + (t.col0 + first + done) * eb;
            engine.wait(engine.read(c.files[h.file], at, scratch.first(k * eb)));
            convert(scratch.data(), h.elem, reinterpret_cast<std::byte*>(out.data() + done), Elem::f32, k);
            done += k;
        }
        if (!opts.allow_nonfinite)
            refuse_nonfinite(out.first(n), m.opts.param_dtype == DType::bf16, c.files[h.file].path(),
                             [&](std::uint64_t i) {
                                 return "tensor '" + t.key + "' element " + std::to_string(t.col0 + first + i);
                             });
    };
    return init(m, dir, engine, pool, opts, values);
}

// ---------------------------------------------------------------------------
namespace {

std::string shard_name(std::size_t k, std::size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
    return buf;
}

// A name an export writes into its folder: a shard, the index, or a
// temporary ("<name>.tmp.<16 hex>").
bool export_name(const std::string& n) {
    if (n == "model.safetensors" || n == "model.safetensors.index.json") return true;
    unsigned k = 0, of = 0;
    int used = 0;
    if (n.size() == shard_name(0, 1).size() &&
        std::sscanf(n.c_str(), "model-%5u-of-%5u.safetensors%n", &k, &of, &used) == 2 &&
        static_cast<std::size_t>(used) == n.size())
        return true;
    const auto t = n.rfind(".tmp.");
    return t != std::string::npos && n.size() == t + 5 + 16 &&
           n.find_first_not_of("0123456789abcdef", t + 5) == std::string::npos;
}

// --force over an existing --to folder replaces the whole folder, so it
// may hold only files (an export's, and others that are carried over).
void check_replaceable(const std::string& to) {
    struct stat st {};
    if (::lstat(to.c_str(), &st) != 0) return;  // absent: made new
    if (S_ISLNK(st.st_mode))
        throw CreateError("--to is a symbolic link: export replaces no folder through a link", {0, to, {}, -1});
    if (!S_ISDIR(st.st_mode)) return;  // a file: replaced by the folder
    DIR* d = ::opendir(to.c_str());
    if (!d) throw_errno("opendir", errno, to);
    std::string bad;
    while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        struct stat es {};
        if (::fstatat(::dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(es.st_mode)) bad = n;
    }
    ::closedir(d);
    if (!bad.empty())
        throw CreateError(to + " holds " + bad + ", which is not a regular file: export --force replaces a folder "
                          "of files whole (move it out, or export to a new folder)", {0, to, {}, -1});
}

// The files of an existing --to folder that are not an export's (a
// config.json, a tokenizer) carried into the new one, as hard links.
void carry_other_files(const std::string& to, const std::string& tmp) {
    struct stat st {};
    if (::lstat(to.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
    DIR* d = ::opendir(to.c_str());
    if (!d) throw_errno("opendir", errno, to);
    std::vector<std::string> carry;
    while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        struct stat es {};
        if (n == "." || n == ".." || export_name(n)) continue;
        if (::fstatat(::dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(es.st_mode)) carry.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : carry)
        if (::link((to + "/" + n).c_str(), (tmp + "/" + n).c_str()) != 0) throw_errno("link", errno, to + "/" + n);
}

}  // namespace

ExportResult export_hf(const Manifest& m, const std::string& to, io::Engine& engine, mem::PinnedPool& pool,
                       const RunOptions& opts) {
    ExportResult res;
    res.state = std::find(m.states.begin(), m.states.end(), "master") != m.states.end() ? "master" : "param";
    const Elem se = state_dtype(m.opts, res.state) == DType::fp32 ? Elem::f32 : Elem::bf16;
    const Elem oe = opts.dtype ? (*opts.dtype == DType::fp32 ? Elem::f32 : Elem::bf16) : se;
    verify_state(m, res.state, engine, pool, opts);  // before a byte is written
    const auto keys = tensors(m.spec);
    std::map<std::string, std::vector<std::size_t>> tiles;  // key -> its tensors in the manifest, by col0
    for (std::size_t i = 0; i < m.tensors.size(); ++i) tiles[m.tensors[i].key].push_back(i);
    for (auto& [k, v] : tiles)
        std::sort(v.begin(), v.end(), [&](std::size_t a, std::size_t b) { return m.tensors[a].col0 < m.tensors[b].col0; });

    // Tensors to shards, in model order: a new shard where the next tensor would pass shard_bytes.
    std::vector<std::vector<std::size_t>> groups(1);
    std::uint64_t in_group = 0, total = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const std::uint64_t b = keys[i].numel * elem_bytes(oe);
        if (opts.shard_bytes && in_group > 0 && in_group + b > opts.shard_bytes) {
            groups.emplace_back();
            in_group = 0;
        }
        groups.back().push_back(i);
        in_group += b;
        total += b;
    }
    // The output is written under a temporary name beside `to` and put in
    // place once complete: one file renamed over it, or (--shard-size) a
    // folder of the shards and their index, renamed to `to` or swapped with
    // the old one. A kill leaves the old output or the new one, whole, and a
    // temporary that the next export removes.
    const bool folder = opts.shard_bytes > 0;
    const std::string dir_of = fs::path(to).parent_path().string();
    std::vector<std::string> names;  // each shard's file name
    for (std::size_t g = 0; g < groups.size(); ++g)
        names.push_back(!folder ? fs::path(to).filename().string()
                        : groups.size() == 1 ? std::string("model.safetensors") : shard_name(g, groups.size()));
    if (folder) {
        check_replaceable(to);
        // Through zinf::sys, so the fault walk sees every folder it makes.
        std::vector<std::string> missing;
        std::error_code ec;
        for (fs::path p = fs::path(to).parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path())
            missing.push_back(p.string());
        for (auto it = missing.rbegin(); it != missing.rend(); ++it)
            if (sys::mkdir(*it, 0777) != 0 && errno != EEXIST) throw_errno("mkdir", errno, *it, {}, true);
    }
    remove_stale_exports(to);
    const std::string tmp = temp_name(to, ".tmp.");
    Fd tmp_dir;  // the temporary folder, flocked while it is written
    bool made = false;
    json::Json weight_map = json::Json::object();
    try {
        if (folder) {
            if (sys::mkdir(tmp, 0777) != 0) throw_errno("mkdir", errno, tmp, {}, true);
            made = true;
            tmp_dir = Fd::open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
            hold_export_temp(tmp_dir.get(), tmp);
            carry_other_files(to, tmp);
        }
        mem::Stream stream(engine, pool, {.buffers = 2, .who = "zinf-shard export"});
        mem::Lease scratch_lease = pool.lease("zinf-shard export scratch");
        const std::span<std::byte> scratch = scratch_lease.bytes();
        StateReader state(m, res.state);
        const std::size_t sb = elem_bytes(se), ob = elem_bytes(oe);
        for (std::size_t g = 0; g < groups.size(); ++g) {
            std::vector<StTensor> st;
            std::uint64_t at = 0;
            for (std::size_t i : groups[g]) {
                const std::uint64_t bytes = keys[i].numel * ob;
                st.push_back({keys[i].name, st_dtype(oe), keys[i].shape, at, at + bytes});
                at += bytes;
                weight_map[keys[i].name] = names[g];
            }
            const json::Json meta = {{"format", "pt"}, {"zinf_model", m.spec.to_string()}, {"zinf_state", res.state}};
            const std::string head = safetensors_header(st, meta);
            const std::string path = folder ? tmp + "/" + names[g] : tmp;
            io::File file = io::File::open(path, {.access = io::Access::write, .create = true, .exclusive = true});
            made = true;
            if (!folder) hold_export_temp(file.fd(), tmp);
            file.preallocate(head.size() + at);
            stream.write(file, 0, std::as_bytes(std::span(head)));
            for (std::size_t j = 0; j < groups[g].size(); ++j) {
                const Tensor& k = keys[groups[g][j]];
                const auto& parts = tiles.at(k.name);
                stream.write(file, head.size() + st[j].begin, k.numel * ob, [&](std::uint64_t off, std::span<std::byte> piece) {
                    if (opts.stop && opts.stop->load()) throw Interrupted("interrupted");
                    if (off % ob || piece.size() % ob) throw InternalError("export: a piece that splits an element");
                    std::uint64_t e = off / ob;
                    const std::uint64_t end = e + piece.size() / ob;
                    const std::uint64_t cap = scratch.size() / sb;
                    while (e < end) {  // key element e lies in the tile whose run holds it
                        std::size_t ti = parts.front();
                        for (std::size_t p : parts)
                            if (m.tensors[p].col0 <= e) ti = p;
                        const Tensor& t = m.tensors[ti];
                        const std::uint64_t n = std::min({end - e, t.col0 + t.numel - e, cap});
                        Reads reads(engine);
                        state.read(reads, ti, e - t.col0, n, scratch.first(n * sb));
                        reads.wait();
                        convert(scratch.data(), se, piece.data() + (e - off / ob) * ob, oe, n);
                        e += n;
                    }
                });
            }
            engine.sync(file);
            file.close();
            res.bytes += head.size() + at;
            res.files.push_back(folder ? to + "/" + names[g] : to);
        }
        if (folder && groups.size() > 1) {
            const json::Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
            const std::string text = index.dump(2) + "\n";
            const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(text))};
            write_file_atomic(tmp + "/model.safetensors.index.json", pieces);
            res.files.push_back(to + "/model.safetensors.index.json");
            res.bytes += text.size();
        }
        if (folder) fsync_dir(tmp);
        // The bytes just written came from partitions checked before the
        // first was read; checked again now, as the GPT export does, a state
        // that changed while it was read is never exported.
        try {
            verify_state(m, res.state, engine, pool, opts);
        } catch (const DataError& e) {
            throw DataError("the state changed while it was exported (" + e.message() +
                            "); nothing was written: export again once no program writes it");
        }
        if (folder) install_export_folder(tmp, to);
        else if (sys::rename(tmp, to) != 0) throw_errno("rename", errno, to, {}, true);
        made = false;
    } catch (...) {
        if (made) remove_export_folder(tmp);
        throw;
    }
    fsync_dir(dir_of.empty() ? "." : dir_of);
    res.tensors = keys.size();
    return res;
}

}  // namespace zinf::shard::detail
