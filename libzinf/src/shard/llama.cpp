// The Llama-shaped families' model specs (Llama's, and Qwen2's: a Llama with
// q, k and v biases; their presets are their entries' in model.cpp's table):
// the explicit "llama:" and "qwen2:" forms, the exact parameter
// count, and the tensors in execution order with Hugging Face's names and
// (out, in) linear weights, tiled along their output rows.
#include "llama.hpp"
#include "spec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace zinf::shard {

namespace {

constexpr const char* kKeys = "layers, hidden, heads, kv_heads, ffn, vocab, seq, rope_theta, tied, eps, rope_scale, "
                              "rope_low, rope_high, rope_orig";

double real(std::string_view v, std::string_view key, std::string_view spec) {
    double d = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(d) || d <= 0)
        detail::spec_error(spec, std::string(key) + "=" + std::string(v) + " is not a positive number");
    return d;
}

// The shortest plain decimal that reads back as the same double (500000, 0.00001).
std::string shortest(double d) {
    char buf[64];
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
    return std::string(buf, ec == std::errc() ? p : buf);
}

}  // namespace

namespace detail {

ModelSpec parse_llama(const Family& entry, std::string_view text) {
    ModelSpec s;
    s.arch = entry.arch;
    s.vocab = 32000;
    s.seq = 2048;
    s.tied = false;
    const std::string_view items = text.substr(std::string_view(entry.name).size() + 1);
    const std::vector<std::string_view> seen = spec_items(text, items, [&](std::string_view key,
                                                                                     std::string_view val) {
        if (key == "layers") s.layers = spec_count(val, key, text);
        else if (key == "hidden") s.hidden = spec_count(val, key, text);
        else if (key == "heads") s.heads = spec_count(val, key, text);
        else if (key == "kv_heads") s.kv_heads = spec_count(val, key, text);
        else if (key == "ffn") s.ffn = spec_count(val, key, text);
        else if (key == "vocab") s.vocab = spec_count(val, key, text);
        else if (key == "seq") s.seq = spec_count(val, key, text);
        else if (key == "rope_theta") s.rope_theta = real(val, key, text);
        else if (key == "eps") s.norm_eps = real(val, key, text);
        else if (key == "rope_scale") s.rope_scaling.factor = real(val, key, text);
        else if (key == "rope_low") s.rope_scaling.low_freq_factor = real(val, key, text);
        else if (key == "rope_high") s.rope_scaling.high_freq_factor = real(val, key, text);
        else if (key == "rope_orig") s.rope_scaling.original_max_positions = spec_count(val, key, text);
        else if (key == "tied") {
            if (val != "0" && val != "1") spec_error(text, "tied=" + std::string(val) + " is not 0 or 1");
            s.tied = val == "1";
        } else
            spec_error(text, "unknown key '" + std::string(key) + "' (" + kKeys + ")");
    });
    if (!s.layers || !s.hidden || !s.heads) spec_error(text, "layers, hidden and heads are required");
    if (!s.kv_heads) s.kv_heads = s.heads;
    if (s.hidden > (1ull << 24) || s.vocab > (1ull << 32) || s.seq > (1ull << 32) || s.layers > (1ull << 20) ||
        s.heads > s.hidden)
        spec_error(text, "too large");
    if (s.hidden % s.heads != 0)
        spec_error(text,
                   "hidden " + std::to_string(s.hidden) + " is not a multiple of heads " + std::to_string(s.heads));
    if (s.head_dim() % 2 != 0)
        spec_error(text, "the head size hidden/heads = " + std::to_string(s.head_dim()) +
                             " is odd (rotary embeddings pair its two halves)");
    if (s.kv_heads > s.heads || s.heads % s.kv_heads != 0)
        spec_error(text, "heads " + std::to_string(s.heads) + " is not a multiple of kv_heads " +
                             std::to_string(s.kv_heads));
    if (!s.ffn) {  // Meta's rule: 2/3 of 4C, up to a multiple of 256
        const std::uint64_t f = 8 * s.hidden / 3;
        s.ffn = (f + 255) / 256 * 256;
    }
    if (s.ffn > (1ull << 26)) spec_error(text, "too large");
    const bool scaled = std::find(seen.begin(), seen.end(), "rope_scale") != seen.end();
    for (const char* k : {"rope_low", "rope_high", "rope_orig"})
        if (!scaled && std::find(seen.begin(), seen.end(), k) != seen.end())
            spec_error(text, std::string(k) + " without rope_scale (Llama 3's frequency scaling)");
    if (scaled && s.rope_scaling.high_freq_factor <= s.rope_scaling.low_freq_factor)
        spec_error(text, "rope_high must be above rope_low");
    using u128 = unsigned __int128;
    const u128 C = s.hidden, hd = s.head_dim(),
               per = 2 * C + C * (s.heads + 2 * s.kv_heads) * hd + s.heads * hd * C + 3 * C * u128{s.ffn} +
                     (s.qkv_bias() ? (s.heads + 2 * s.kv_heads) * hd : 0);
    const u128 exact = u128{s.vocab} * C * (s.tied ? 1 : 2) + u128{s.layers} * per + C;
    if (exact >= (u128{1} << 62) || u128{12} * s.layers * C * C >= (u128{1} << 62))
        spec_error(text, "too large (more than 2^62 parameters)");
    return s;
}

std::string llama_to_string(const ModelSpec& s) {
    std::string t = std::string(arch_name(s.arch)) + ":layers=" + std::to_string(s.layers) + ",hidden=" + std::to_string(s.hidden) +
                    ",heads=" + std::to_string(s.heads) + ",kv_heads=" + std::to_string(s.kv_heads) +
                    ",ffn=" + std::to_string(s.ffn) + ",vocab=" + std::to_string(s.vocab) +
                    ",seq=" + std::to_string(s.seq) + ",rope_theta=" + shortest(s.rope_theta) +
                    ",tied=" + (s.tied ? "1" : "0");
    if (s.norm_eps != 1e-5) t += ",eps=" + shortest(s.norm_eps);
    if (s.rope_scaling.factor > 0)
        t += ",rope_scale=" + shortest(s.rope_scaling.factor) + ",rope_low=" + shortest(s.rope_scaling.low_freq_factor) +
             ",rope_high=" + shortest(s.rope_scaling.high_freq_factor) +
             ",rope_orig=" + std::to_string(s.rope_scaling.original_max_positions);
    return t;
}

std::uint64_t llama_parameters(const ModelSpec& s) {
    const std::uint64_t C = s.hidden, hd = s.head_dim();
    const std::uint64_t per = 2 * C + C * (s.heads + 2 * s.kv_heads) * hd + s.heads * hd * C + 3 * C * s.ffn +
                              (s.qkv_bias() ? (s.heads + 2 * s.kv_heads) * hd : 0);
    return s.vocab * C * (s.tied ? 1 : 2) + s.layers * per + C;
}

std::uint64_t llama_max_tile(const ModelSpec& s) { return std::min(s.hidden, s.kv_heads * s.head_dim()); }

// q, k, v, o and the MLP's three matrices, the largest the MLP's hd x ffn;
// q, k, v (grouped: kv_heads' width), the attention output and the MLP's
// gate, up and product a token; the recompute stops before down_proj, whose
// output the backward does not read.
BlockWeights llama_block(const ModelSpec& s) {
    const std::uint64_t C = s.hidden, q = s.heads * s.head_dim(), kv = s.kv_heads * s.head_dim(), F = s.ffn;
    return {C * (q + 2 * kv) + q * C + 3 * C * F, C * std::max({F, q, C}), 2 * q + 2 * kv + 3 * F, C * F};
}

std::uint64_t llama_tensor_count(const ModelSpec& s, unsigned tile) {
    // embed, norm, the head when untied; per layer 2 norms and 7 linear weights of `tile` pieces,
    // and a Qwen2's 3 biases.
    return 2 + (s.tied ? 0 : 1) + s.layers * (2 + (s.qkv_bias() ? 3 : 0) + 7 * std::uint64_t{tile});
}

std::vector<Tensor> llama_tensors(const ModelSpec& s, unsigned tile) {
    const std::uint64_t C = s.hidden, hd = s.head_dim(), F = s.ffn;
    if (tile == 0 || tile > llama_max_tile(s))
        throw UsageError("--tile " + std::to_string(tile) + ": must be between 1 and the smallest linear layer's " +
                         std::to_string(llama_max_tile(s)) + " outputs");
    TensorList out(tile, llama_tensor_count(s, tile));
    auto plain = [&](std::string name, std::vector<std::uint64_t> shape, InitKind init) {
        out.plain(std::move(name), std::move(shape), init);
    };
    auto linear = [&](const std::string& name, std::uint64_t outf, std::uint64_t in, InitKind init) {
        out.linear(name, in, outf, init, TensorList::Layout::out_in);
    };
    // q, k and v: a Qwen2's bias after each weight (the module's order).
    auto projection = [&](const std::string& name, std::uint64_t outf) {
        linear(name + ".weight", outf, C, InitKind::normal);
        if (s.qkv_bias()) plain(name + ".bias", {outf}, InitKind::zeros);
    };
    plain("model.embed_tokens.weight", {s.vocab, C}, InitKind::normal);
    for (std::uint64_t l = 0; l < s.layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        plain(p + "input_layernorm.weight", {C}, InitKind::ones);
        projection(p + "self_attn.q_proj", s.heads * hd);
        projection(p + "self_attn.k_proj", s.kv_heads * hd);
        projection(p + "self_attn.v_proj", s.kv_heads * hd);
        linear(p + "self_attn.o_proj.weight", C, s.heads * hd, InitKind::residual);
        plain(p + "post_attention_layernorm.weight", {C}, InitKind::ones);
        linear(p + "mlp.gate_proj.weight", F, C, InitKind::normal);
        linear(p + "mlp.up_proj.weight", F, C, InitKind::normal);
        linear(p + "mlp.down_proj.weight", C, F, InitKind::residual);
    }
    plain("model.norm.weight", {C}, InitKind::ones);
    if (!s.tied) plain("lm_head.weight", {s.vocab, C}, InitKind::normal);
    return out.take();
}

}  // namespace detail

}  // namespace zinf::shard
