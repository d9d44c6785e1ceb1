// The Llama family's side of the model spec (model.cpp dispatches here):
// its presets, its "llama:..." form, its parameter count and its tensors.
#pragma once

#include <zinf/shard.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::shard::detail {

std::optional<ModelSpec> llama_preset(std::string_view name);
ModelSpec parse_llama(std::string_view text);  // text starts with "llama:"
std::string llama_to_string(const ModelSpec& s);
std::uint64_t llama_parameters(const ModelSpec& s);
std::uint64_t llama_tensor_count(const ModelSpec& s, unsigned tile);
std::vector<Tensor> llama_tensors(const ModelSpec& s, unsigned tile);

// Hugging Face checkpoints in and out (hf.cpp): import_weights and
// export_weights for a Llama-family manifest.
Written import_hf(Manifest& m, const std::string& from, const std::string& dir, io::Engine& engine,
                  mem::PinnedPool& pool, const RunOptions& opts);
ExportResult export_hf(const Manifest& m, const std::string& to, io::Engine& engine, mem::PinnedPool& pool,
                       const RunOptions& opts);

}  // namespace zinf::shard::detail
