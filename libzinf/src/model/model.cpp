// What every family's model shares (model.hpp): its config, its parameter
// table and how a module declares its parameters, and make_model, which
// builds the modules a config's family names.
#include <zinf/family.hpp>
#include <zinf/gpt.hpp>
#include <zinf/llama.hpp>

#include <algorithm>

namespace zinf::model {

std::unique_ptr<LanguageModel> make_model(const Config& cfg) {
    if (shard::family(cfg.arch).modules == shard::Modules::llama) return std::make_unique<Llama>(cfg);
    return std::make_unique<GPT>(cfg);
}

// ---------------------------------------------------------------------------
Config Config::from(const shard::ModelSpec& spec, unsigned tile) {
    Config c;
    c.layers = spec.layers;
    c.hidden = spec.hidden;
    c.heads = spec.heads;
    c.vocab = spec.vocab;
    c.max_seq = spec.seq;
    c.tile = tile;
    c.arch = spec.arch;
    c.kv_heads = spec.kv_heads;
    c.ffn = spec.ffn;
    c.rope_theta = spec.rope_theta;
    c.norm_eps = spec.norm_eps;
    c.tied = spec.tied;
    c.rope_scaling = spec.rope_scaling;
    return c;
}

bool Config::qkv_bias() const { return shard::family(arch).qkv_bias; }

shard::ModelSpec Config::spec() const {
    shard::ModelSpec s;
    s.layers = layers;
    s.hidden = hidden;
    s.heads = heads;
    s.vocab = vocab;
    s.seq = max_seq;
    s.arch = arch;
    s.kv_heads = kv_heads;
    s.ffn = ffn;
    s.rope_theta = rope_theta;
    s.norm_eps = norm_eps;
    s.tied = tied;
    s.rope_scaling = rope_scaling;
    return s;
}

// ---------------------------------------------------------------------------
ParamTable::ParamTable(const Config& c) {
    for (const auto& t : shard::tensors(c.spec(), c.tile)) params_.push_back(Param{t.name, t.shape, t.numel, nullptr});
}

// The model is made from the manifest's spec and tile, as its tensors are
// (shard::tensors): another count is this code's error, not the file's.
void ParamTable::check(const shard::Manifest& m, const std::string& source) const {
    if (params_.size() != m.tensors.size())
        throw InternalError("the model's parameters and the manifest's tensors differ");
    for (std::size_t t = 0; t < params_.size(); ++t)
        if (params_[t].name != m.tensors[t].name || params_[t].shape != m.tensors[t].shape)
            throw DataError("manifest " + source + ": tensor " + std::to_string(t) + " is " + m.tensors[t].name +
                            ", the model expects " + params_[t].name);
}

std::uint64_t ParamTable::numel() const {
    std::uint64_t n = 0;
    for (const auto& p : params_) n += p.numel;
    return n;
}

std::size_t ParamTable::claim(const std::string& name, const std::vector<std::uint64_t>& shape, const Module* owner) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].name != name) continue;
        if (params_[i].shape != shape)
            throw InternalError("parameter " + name + ": declared with another shape than zinf-shard lays out");
        if (params_[i].owner) throw InternalError("parameter " + name + " declared twice");
        params_[i].owner = owner;
        return i;
    }
    throw InternalError("parameter " + name + " is not in zinf-shard's layout");
}

void ParamTable::add_user(const Module* m) {
    if (std::find(users_.begin(), users_.end(), m) == users_.end()) users_.push_back(m);
}

std::size_t Module::declare(ParamTable& t, const std::string& param_name, std::vector<std::uint64_t> shape) {
    const std::size_t i = t.claim(param_name, shape, this);
    add_param(i);
    t.add_user(this);
    return i;
}

std::vector<std::uint64_t> numels(const ParamTable& t) {
    std::vector<std::uint64_t> n;
    for (const auto& p : t.all()) n.push_back(p.numel);
    return n;
}

}  // namespace zinf::model
