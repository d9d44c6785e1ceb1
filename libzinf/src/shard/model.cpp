// Model specs and presets, read, printed and listed through their family's
// declaration (zinf/family.hpp): the families' table with their presets,
// and GPT-2's family.
#include <zinf/family.hpp>
#include <zinf/shard.hpp>

#include "llama.hpp"
#include "spec.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

namespace zinf::shard {

ModelSpec ModelSpec::parse(std::string_view text) {
    for (const Family& f : families())
        for (const Preset& p : f.presets)
            if (text == p.name) {
                ModelSpec s = f.parse(f, p.spec);
                s.preset = p.name;
                return s;
            }
    for (const Family& f : families())
        if (text.starts_with(f.name) && text.substr(std::string_view(f.name).size()).starts_with(":"))
            return f.parse(f, text);
    std::string forms, names;
    for (const Family& f : families()) {
        forms += std::string(f.name) + ":" + f.keys + ", ";
        for (const Preset& p : f.presets) names += (names.empty() ? "" : ", ") + std::string(p.name);
    }
    throw UsageError("model spec '" + std::string(text) + "': expected " + forms + "or a preset (" + names + ")");
}

std::string ModelSpec::to_string() const { return family(arch).to_string(*this); }
std::uint64_t ModelSpec::parameters() const { return family(arch).parameters(*this); }
std::uint64_t tensor_count(const ModelSpec& spec, unsigned tile) { return family(spec.arch).tensor_count(spec, tile); }
std::vector<Tensor> tensors(const ModelSpec& spec, unsigned tile) { return family(spec.arch).tensors(spec, tile); }

const char* arch_name(Arch a) { return family(a).name; }
bool ModelSpec::llama() const { return family(arch).modules == Modules::llama; }
bool ModelSpec::qkv_bias() const { return family(arch).qkv_bias; }

std::string tile_name(const std::string& weight, unsigned k) { return weight + ".tile" + std::to_string(k); }

// ---------------------------------------------------------------------------
// GPT-2's family.
namespace {

ModelSpec parse_gpt(const Family& f, std::string_view text) {
    ModelSpec s;
    s.arch = f.arch;
    s.heads = 0;
    detail::spec_items(text, text.substr(std::string_view(f.name).size() + 1), [&](std::string_view key,
                                                                                  std::string_view val) {
        const std::uint64_t v = detail::spec_count(val, key, text);
        if (key == "layers") s.layers = v;
        else if (key == "hidden") s.hidden = v;
        else if (key == "heads") s.heads = v;
        else if (key == "vocab") s.vocab = v;
        else if (key == "seq") s.seq = v;
        else detail::spec_error(text, "unknown key '" + std::string(key) + "' (layers, hidden, heads, vocab, seq)");
    });
    if (!s.layers || !s.hidden)
        throw UsageError("model spec '" + std::string(text) + "': layers and hidden are required");
    if (!s.heads) s.heads = s.hidden % 64 == 0 ? s.hidden / 64 : 1;
    if (s.hidden % s.heads != 0)
        throw UsageError("model spec '" + std::string(text) + "': hidden " + std::to_string(s.hidden) +
                         " is not a multiple of heads " + std::to_string(s.heads));
    // Guard the arithmetic below: 4*C*C and V*C must fit 64 bits with room.
    if (s.hidden > (1ull << 24) || s.vocab > (1ull << 32) || s.seq > (1ull << 32) || s.layers > (1ull << 20))
        throw UsageError("model spec '" + std::string(text) + "': too large");
    // And the counts themselves must fit 64 bits with room (the estimate is
    // the larger of the two only for tiny vocabularies; check both).
    using u128 = unsigned __int128;
    const u128 C = s.hidden;
    const u128 exact = u128{s.vocab} * C + u128{s.seq} * C + u128{s.layers} * (12 * C * C + 13 * C) + 2 * C;
    if (exact >= (u128{1} << 62) || u128{12} * s.layers * C * C >= (u128{1} << 62))
        throw UsageError("model spec '" + std::string(text) + "': too large (more than 2^62 parameters)");
    return s;
}

std::string gpt_to_string(const ModelSpec& s) {
    return "gpt:layers=" + std::to_string(s.layers) + ",hidden=" + std::to_string(s.hidden) +
           ",heads=" + std::to_string(s.heads) + ",vocab=" + std::to_string(s.vocab) + ",seq=" + std::to_string(s.seq);
}

std::uint64_t gpt_parameters(const ModelSpec& s) {
    const std::uint64_t C = s.hidden;
    return s.vocab * C + s.seq * C + s.layers * (12 * C * C + 13 * C) + 2 * C;
}

std::uint64_t gpt_tensor_count(const ModelSpec& spec, unsigned tile) {
    // wte, wpe, ln_f's two; per layer 8 plain tensors and 4 linear weights of `tile` pieces each.
    return 4 + spec.layers * (8 + 4 * std::uint64_t{tile});
}

std::uint64_t gpt_max_tile(const ModelSpec& s) { return s.hidden; }

// 12 hd^2 weights, the largest operator hd x 4hd, 8 hd activation elements a
// token (qkv 3hd, attention output hd, fc 4hd); the recompute runs it all.
BlockWeights gpt_block(const ModelSpec& s) {
    const std::uint64_t C = s.hidden;
    return {12 * C * C, 4 * C * C, 8 * C, 0};
}

std::vector<Tensor> gpt_tensors(const ModelSpec& spec, unsigned tile) {
    const std::uint64_t C = spec.hidden;
    if (tile == 0 || tile > gpt_max_tile(spec))
        throw UsageError("--tile " + std::to_string(tile) + ": must be between 1 and the hidden size " +
                         std::to_string(C));
    detail::TensorList out(tile, gpt_tensor_count(spec, tile));
    auto plain = [&](std::string name, std::vector<std::uint64_t> shape, InitKind init) {
        out.plain(std::move(name), std::move(shape), init);
    };
    auto linear = [&](const std::string& name, std::uint64_t in, std::uint64_t outc, InitKind init) {
        out.linear(name, in, outc, init, detail::TensorList::Layout::in_out);
    };
    plain("wte.weight", {spec.vocab, C}, InitKind::normal);
    plain("wpe.weight", {spec.seq, C}, InitKind::normal);
    for (std::uint64_t l = 0; l < spec.layers; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        plain(h + "ln_1.weight", {C}, InitKind::ones);
        plain(h + "ln_1.bias", {C}, InitKind::zeros);
        linear(h + "attn.c_attn.weight", C, 3 * C, InitKind::normal);
        plain(h + "attn.c_attn.bias", {3 * C}, InitKind::zeros);
        linear(h + "attn.c_proj.weight", C, C, InitKind::residual);
        plain(h + "attn.c_proj.bias", {C}, InitKind::zeros);
        plain(h + "ln_2.weight", {C}, InitKind::ones);
        plain(h + "ln_2.bias", {C}, InitKind::zeros);
        linear(h + "mlp.c_fc.weight", C, 4 * C, InitKind::normal);
        plain(h + "mlp.c_fc.bias", {4 * C}, InitKind::zeros);
        linear(h + "mlp.c_proj.weight", 4 * C, C, InitKind::residual);
        plain(h + "mlp.c_proj.bias", {C}, InitKind::zeros);
    }
    plain("ln_f.weight", {C}, InitKind::ones);
    plain("ln_f.bias", {C}, InitKind::zeros);
    return out.take();
}

// GPT-2 (Radford et al.), a 13B GPT, and the configurations of the paper's
// appendix tables (Fig. 6a-6e). The paper gives no vocabulary or sequence
// length; these use GPT-2's (50257, 1024). Where a label disagrees with the
// paper's own estimate 12*L*h^2 by more than a few percent, the layers and
// hidden size are kept as the table prints them (see man/zinf-shard.1).
constexpr Preset kGptPresets[] = {
    {"gpt2-124m", "gpt:layers=12,hidden=768,heads=12", "124M", "GPT-2"},
    {"gpt2-350m", "gpt:layers=24,hidden=1024,heads=16", "350M", "GPT-2"},
    {"gpt2-1.5b", "gpt:layers=48,hidden=1600,heads=25", "1.5B", "GPT-2"},
    {"gpt-13b", "gpt:layers=40,hidden=5120,heads=40", "13B", "GPT-3 13B shape"},
    {"paper-1.4b", "gpt:layers=40,hidden=1536,heads=16", "1.4B", "paper Fig. 6a"},
    {"paper-10b", "gpt:layers=50,hidden=4096,heads=16", "10B", "paper Fig. 6a"},
    {"paper-13b", "gpt:layers=64,hidden=4096,heads=16", "13B", "paper Fig. 6a"},
    {"paper-20b", "gpt:layers=98,hidden=4096,heads=32", "20B", "paper Fig. 6a"},
    {"paper-70b", "gpt:layers=125,hidden=8192,heads=32", "70B", "paper Fig. 6a"},
    {"paper-1t", "gpt:layers=128,hidden=25600,heads=256", "1000B", "paper Fig. 6a"},
    {"paper-h8k", "gpt:layers=1,hidden=8192,heads=16", "900M", "paper Fig. 6b"},
    {"paper-h16k", "gpt:layers=1,hidden=16384,heads=16", "3B", "paper Fig. 6b"},
    {"paper-h32k", "gpt:layers=1,hidden=32768,heads=16", "13B", "paper Fig. 6b"},
    {"paper-h64k", "gpt:layers=1,hidden=65536,heads=32", "50B", "paper Fig. 6b"},
    {"paper-8b", "gpt:layers=10,hidden=8192,heads=16", "8B", "paper Fig. 6c/6d"},
    {"paper-275m", "gpt:layers=5,hidden=2048,heads=16", "275M", "paper Fig. 6e"},
    {"paper-4b", "gpt:layers=5,hidden=8192,heads=16", "4B", "paper Fig. 6e"},
    {"paper-16b", "gpt:layers=5,hidden=16384,heads=16", "16B", "paper Fig. 6e"},
    {"paper-64b", "gpt:layers=5,hidden=32768,heads=16", "64B", "paper Fig. 6e"},
    {"paper-260b", "gpt:layers=5,hidden=65536,heads=16", "260B", "paper Fig. 6e"},
};

// The Llama-shaped families' presets, from each repository's config.json
// (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
// intermediate_size, vocab_size, max_position_embeddings, rope_theta,
// tie_word_embeddings, rms_norm_eps, rope_scaling).
constexpr Preset kLlamaPresets[] = {
    {"smollm-135m",
     "llama:layers=30,hidden=576,heads=9,kv_heads=3,ffn=1536,vocab=49152,seq=2048,rope_theta=10000,tied=1", "135M",
     "HuggingFaceTB/SmolLM-135M"},
    {"tinyllama-1.1b",
     "llama:layers=22,hidden=2048,heads=32,kv_heads=4,ffn=5632,vocab=32000,seq=2048,rope_theta=10000,tied=0", "1.1B",
     "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"},
    {"llama-3.2-1b",
     "llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=131072,rope_theta=500000,tied=1,"
     "rope_scale=32,rope_low=1,rope_high=4,rope_orig=8192",
     "1.2B", "meta-llama/Llama-3.2-1B"},
    {"llama-3.1-8b",
     "llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=131072,rope_theta=500000,tied=0,"
     "rope_scale=8,rope_low=1,rope_high=4,rope_orig=8192",
     "8.0B", "meta-llama/Llama-3.1-8B"},
};
constexpr Preset kQwen2Presets[] = {
    {"qwen2.5-0.5b",
     "qwen2:layers=24,hidden=896,heads=14,kv_heads=2,ffn=4864,vocab=151936,seq=32768,rope_theta=1000000,tied=1,"
     "eps=0.000001",
     "494M", "Qwen/Qwen2.5-0.5B"},
};

// Llama's and Qwen2's: one reader, tensors and modules (a Qwen2's q, k and v have biases).
constexpr const char* kLlamaKeys =
    "layers=L,hidden=C,heads=H,kv_heads=K,ffn=F[,vocab=V,seq=T,rope_theta=R,tied=0|1]";
constexpr Family llama_shaped(Arch arch, const char* name, std::span<const Preset> presets, bool qkv_bias) {
    return {arch, name, kLlamaKeys, presets, detail::parse_llama, detail::llama_to_string, detail::llama_parameters,
            detail::llama_tensor_count, detail::llama_tensors, detail::llama_max_tile,
            "the smallest linear layer's outputs", detail::llama_block, "4 hd ffn / tile",
            "bsz seq ci (2 (2q + 2kv + 3 ffn) + 2 heads seq)", "2 block-weights ci / hd", true, Modules::llama, qkv_bias};
}

constexpr Family kFamilies[] = {
    {Arch::gpt, "gpt", "layers=L,hidden=C,heads=H[,vocab=V,seq=T]", kGptPresets, parse_gpt, gpt_to_string,
     gpt_parameters, gpt_tensor_count, gpt_tensors, gpt_max_tile, "the hidden size", gpt_block, "4 hd 4hd / tile",
     "bsz seq ci (16 hd + 2 heads seq)", "24 hd ci", false, Modules::gpt, false},
    llama_shaped(Arch::llama, "llama", kLlamaPresets, false),
    llama_shaped(Arch::qwen2, "qwen2", kQwen2Presets, true),
};

}  // namespace

std::span<const Family> families() { return kFamilies; }

const Family& family(Arch a) {
    for (const Family& f : kFamilies)
        if (f.arch == a) return f;
    throw InternalError("no family declared for architecture " + std::to_string(static_cast<int>(a)));
}

namespace detail {

void spec_error(std::string_view spec, const std::string& why) {
    throw UsageError("model spec '" + std::string(spec) + "': " + why);
}

std::uint64_t spec_count(std::string_view value, std::string_view key, std::string_view spec) {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size() || v == 0)
        spec_error(spec, std::string(key) + "=" + std::string(value) + " is not a positive integer");
    return v;
}

std::vector<std::string_view> spec_items(std::string_view spec, std::string_view items,
                                         const std::function<void(std::string_view, std::string_view)>& take) {
    std::vector<std::string_view> seen;
    for (bool more = !items.empty(); more;) {
        const auto comma = items.find(',');
        const std::string_view item = items.substr(0, comma);
        more = comma != std::string_view::npos;
        items = more ? items.substr(comma + 1) : std::string_view{};
        if (item.empty()) spec_error(spec, "an empty item (a stray comma)");
        const auto eq = item.find('=');
        if (eq == std::string_view::npos) spec_error(spec, "'" + std::string(item) + "' is not key=value");
        const std::string_view key = item.substr(0, eq);
        if (std::find(seen.begin(), seen.end(), key) != seen.end()) spec_error(spec, std::string(key) + " given twice");
        seen.push_back(key);
        take(key, item.substr(eq + 1));
    }
    return seen;
}

void TensorList::plain(std::string name, std::vector<std::uint64_t> shape, InitKind init) {
    Tensor t;
    t.numel = 1;
    for (auto d : shape) t.numel *= d;
    t.name = t.key = std::move(name);
    t.shape = std::move(shape);
    t.init = init;
    t.cols = t.key_cols = t.numel;
    out_.push_back(std::move(t));
}

void TensorList::linear(const std::string& name, std::uint64_t in, std::uint64_t out, InitKind init, Layout layout) {
    const bool rows = layout == Layout::out_in;
    if (tile_ == 1) return plain(name, rows ? std::vector{out, in} : std::vector{in, out}, init);
    for (unsigned k = 0; k < tile_; ++k) {
        const std::uint64_t f0 = tile_first(out, k, tile_), f1 = tile_first(out, k + 1, tile_);
        Tensor t;
        t.name = tile_name(name, k);
        t.key = name;
        t.numel = (f1 - f0) * in;
        t.init = init;
        if (rows) {  // elements [f0*in, f1*in) of the weight, as one row
            t.shape = {f1 - f0, in};
            t.cols = t.numel;
            t.key_cols = out * in;
            t.col0 = f0 * in;
        } else {
            t.shape = {in, f1 - f0};
            t.cols = f1 - f0;
            t.key_cols = out;
            t.col0 = f0;
        }
        out_.push_back(std::move(t));
    }
}

}  // namespace detail

std::size_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : 4; }
const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }
DType parse_dtype(std::string_view s) {
    if (s == "bf16") return DType::bf16;
    if (s == "fp32") return DType::fp32;
    throw UsageError("dtype '" + std::string(s) + "': expected bf16 or fp32");
}

const char* tier_name(Tier t) { return t == Tier::gpu ? "gpu" : t == Tier::cpu ? "cpu" : "nvme"; }
Tier parse_tier(std::string_view s) {
    if (s == "gpu") return Tier::gpu;
    if (s == "cpu") return Tier::cpu;
    if (s == "nvme") return Tier::nvme;
    throw UsageError("tier '" + std::string(s) + "': expected gpu, cpu or nvme");
}

}  // namespace zinf::shard
