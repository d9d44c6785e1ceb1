// zinf family: a model family, declared once. What zinf-shard, zinf-plan and
// the trainer's bench ask of a spec beyond its sizes (how its explicit form
// reads and prints, its parameters, its tensors, how finely it tiles, its
// block in the paper's terms, its checkpoints' layout, its presets) they ask
// of its family here, never of its architecture by name. A new family is its
// entry in the table (shard/model.cpp), its spec's reader and tensors, its
// modules (zinf/llama.hpp's are Llama's and Qwen2's; model::make_model
// builds the set its entry names) and its tests.
//
//   const auto& f = zinf::shard::family(spec.arch);
//   auto b = f.block(spec);   // 12 hd^2 weights for a GPT
#pragma once

#include <zinf/shard.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::shard {

// A block in the paper's terms (§3-4): its GEMMs' weights, its largest
// operator's, the activation elements a token keeps in it, and the weights
// of the GEMMs the backward's recompute (activation checkpointing) skips.
struct BlockWeights {
    std::uint64_t weights = 0, largest = 0, activations = 0, not_recomputed = 0;
};

// The modules a family is built of (model::make_model): gpt.hpp's GPT, or
// llama.hpp's Llama (RMSNorm, rotary, grouped-query attention, SwiGLU).
enum class Modules { gpt, llama };

struct Family {
    Arch arch;
    const char* name;  // the explicit spec's prefix ("llama" for "llama:..."), arch_name's
    const char* keys;  // its keys, as the usage message shows them: "layers=L,hidden=C,..."
    // Its named models: ModelSpec::parse reads a preset's name as its spec
    // (`--model gpt2-124m` is gpt:layers=12,hidden=768,heads=12).
    std::span<const Preset> presets;
    // The explicit form read (`text` starts "<name>:"; UsageError) as this
    // family's (`f`: this entry; a reader several families share takes its
    // architecture and prefix from it) and written, the exact parameter
    // count, the tensors in execution order and how many (shard::tensors,
    // shard::tensor_count).
    ModelSpec (*parse)(const Family& f, std::string_view text);
    std::string (*to_string)(const ModelSpec& s);
    std::uint64_t (*parameters)(const ModelSpec& s);
    std::uint64_t (*tensor_count)(const ModelSpec& s, unsigned tile);
    std::vector<Tensor> (*tensors)(const ModelSpec& s, unsigned tile);
    // The largest tile factor its layout takes, and what sets it.
    std::uint64_t (*max_tile)(const ModelSpec& s);
    const char* max_tile_is;  // "the hidden size"
    BlockWeights (*block)(const ModelSpec& s);
    // zinf-plan's formulas for its block, as its rows print them: the
    // model-state working memory, the activation working memory and the
    // activation checkpoints' arithmetic intensity.
    const char* mswm_formula;
    const char* awm_formula;
    const char* ait_activation_formula;
    // Its checkpoints: Hugging Face's (safetensors, one file or shards with
    // an index, names as its tensors') or else GPT-2's (one safetensors
    // file, or llm.c's).
    bool hugging_face;
    Modules modules;
    bool qkv_bias;  // q, k and v projections with biases (a Qwen2's)
};

// Every family, in Arch's order; family(a) is families()[a].
std::span<const Family> families();
const Family& family(Arch a);

}  // namespace zinf::shard
