// The Llama-shaped families' side of the model spec (their entries in
// model.cpp's table name these): their explicit form ("llama:...",
// "qwen2:..."), parameter count and tensors.
#pragma once

#include <zinf/family.hpp>
#include <zinf/shard.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace zinf::shard::detail {

// The Llama-shaped families' reader (Family::parse): `text` starts with
// "<entry.name>:", and the spec is that entry's architecture.
ModelSpec parse_llama(const Family& entry, std::string_view text);
std::string llama_to_string(const ModelSpec& s);
std::uint64_t llama_parameters(const ModelSpec& s);
std::uint64_t llama_tensor_count(const ModelSpec& s, unsigned tile);
std::vector<Tensor> llama_tensors(const ModelSpec& s, unsigned tile);
std::uint64_t llama_max_tile(const ModelSpec& s);  // the smallest linear layer's outputs
BlockWeights llama_block(const ModelSpec& s);

// Hugging Face checkpoints in and out (hf.cpp): import_weights and
// export_weights for a Llama-family manifest.
Written import_hf(Manifest& m, const std::string& from, const std::string& dir, io::Engine& engine,
                  mem::PinnedPool& pool, const RunOptions& opts);
ExportResult export_hf(const Manifest& m, const std::string& to, io::Engine& engine, mem::PinnedPool& pool,
                       const RunOptions& opts);

// An export's output is written under a temporary name beside `to`
// ("<to>.tmp.<16 hex>", temp_name): a file, or for a sharded Hugging Face
// export a folder of the shards and their index. remove_stale_exports
// removes what exports killed before their rename left there (a file, or a
// folder's files and the folder), unless a live export holds it: each holds
// a flock on its temporary while it writes (hold_export_temp, which also
// checks that the name still leads to it).
void remove_stale_exports(const std::string& to);
void hold_export_temp(int fd, const std::string& tmp);
// Puts the complete folder `tmp` in place of `to`, atomically: renamed when
// `to` is absent, else swapped with it (renameat2 RENAME_EXCHANGE) and the
// old output removed; `to` is always the old output whole or the new one.
// (Where the file system cannot swap, the old one is moved aside first: a
// kill in between leaves `to` absent.)
void install_export_folder(const std::string& tmp, const std::string& to);
// Removes the file `path`, or the files in the folder `path` and then the
// folder (one holding a folder stays); errors ignored: it is garbage.
void remove_export_folder(const std::string& path) noexcept;

}  // namespace zinf::shard::detail
