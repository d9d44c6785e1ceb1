#include "inspect.hpp"

#include <nlohmann/json.hpp>
#include <cstdio>
#include <map>
#include <ostream>

namespace zinf::shard {

namespace {

std::string shape_text(const std::vector<std::uint64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + ")";
}

std::string billions(std::uint64_t n) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3fB", static_cast<double>(n) / 1e9);
    return b;
}

// Bytes per tier over all ranks, and on the rank that holds the most.
struct TierTotals {
    std::map<std::string, std::uint64_t> all;
    std::map<std::string, std::uint64_t> max_rank;
};

TierTotals tier_totals(const Manifest& m) {
    std::map<std::pair<std::string, unsigned>, std::uint64_t> per;
    TierTotals t;
    for (const auto& p : m.parts) {
        t.all[tier_name(p.tier)] += p.bytes;
        per[{tier_name(p.tier), p.rank}] += p.bytes;
    }
    for (const auto& [k, v] : per) t.max_rank[k.first] = std::max(t.max_rank[k.first], v);
    return t;
}

}  // namespace

json::Json inspect_json(const Manifest& m) {
    json::Json j = {{"schema", "zinf.shard-inspect/1"},
                    {"model", m.spec.to_string()},
                    {"parameters", m.spec.parameters()},
                    {"paper_estimate", m.spec.paper_estimate()},
                    {"dp", m.opts.dp},
                    {"tile", m.opts.tile},
                    {"param_dtype", dtype_name(m.opts.param_dtype)},
                    {"states", m.states},
                    {"initialised", m.initialised()},
                    {"dir", m.dir.empty() ? json::Json(nullptr) : json::Json(m.dir)},
                    {"total_bytes", m.total_bytes()}};
    if (!m.spec.preset.empty()) j["preset"] = m.spec.preset;
    if (!m.rank_dirs.empty()) j["rank_dirs"] = m.rank_dirs;
    json::Json ts = json::Json::array();
    for (const auto& t : m.tensors) {
        json::Json per = json::Json::object();
        for (const auto& s : m.states)
            per[s] = m.elements_per_rank(t) * dtype_bytes(state_dtype(m.opts, s));
        ts.push_back({{"name", t.name}, {"shape", t.shape}, {"numel", t.numel}, {"bytes_per_rank", per}});
    }
    j["tensors"] = ts;
    const TierTotals tt = tier_totals(m);
    json::Json tiers = json::Json::object();
    for (const auto& [tier, bytes] : tt.all) tiers[tier] = {{"bytes", bytes}, {"max_rank_bytes", tt.max_rank.at(tier)}};
    j["tiers"] = tiers;
    return j;
}

void print_inspect(std::ostream& out, const Manifest& m) {
    char line[512];
    out << "# model " << m.spec.to_string() << (m.spec.preset.empty() ? "" : " (" + m.spec.preset + ")") << "\n";
    out << "# parameters " << m.spec.parameters() << " (" << billions(m.spec.parameters()) << "; 12*L*h^2 gives "
        << billions(m.spec.paper_estimate()) << ")\n";
    out << "# dp " << m.opts.dp << ", tile " << m.opts.tile << ", param " << dtype_name(m.opts.param_dtype) << " on "
        << tier_name(m.opts.param_tier) << ", optimizer " << (m.opts.train ? tier_name(m.opts.optim_tier) : "none")
        << ", alignment " << format_size(m.opts.alignment) << ", seed " << m.opts.seed << "\n";
    out << "# data " << (m.dir.empty() ? "not written yet (layout only)" : m.dir)
        << (m.initialised() ? ", every partition hashed" : "") << "\n";
    if (!m.rank_dirs.empty())
        out << "# rank folders (node-local): " << m.rank_dirs.front() << (m.rank_dirs.size() > 1 ? " ... " : "")
            << (m.rank_dirs.size() > 1 ? m.rank_dirs.back() : "") << "\n";
    std::snprintf(line, sizeof line, "# %-36s %-18s %14s", "tensor", "shape", "numel");
    out << line;
    for (const auto& s : m.states) {
        std::snprintf(line, sizeof line, " %12s", (s + "/rank").c_str());
        out << line;
    }
    out << "\n";
    for (const auto& t : m.tensors) {
        std::snprintf(line, sizeof line, "  %-36s %-18s %14llu", t.name.c_str(), shape_text(t.shape).c_str(),
                      static_cast<unsigned long long>(t.numel));
        out << line;
        for (const auto& s : m.states) {
            const std::uint64_t b = m.elements_per_rank(t) * dtype_bytes(state_dtype(m.opts, s));
            std::snprintf(line, sizeof line, " %12s", format_size(b).c_str());
            out << line;
        }
        out << "\n";
    }
    const TierTotals tt = tier_totals(m);
    for (const auto& [tier, bytes] : tt.all)
        out << "# tier " << tier << ": " << format_size(bytes) << " in all, " << format_size(tt.max_rank.at(tier))
            << " on the fullest rank\n";
    out << "# total " << format_size(m.total_bytes()) << " in " << m.parts.size() << " partitions, "
        << m.files().size() << " files\n";
}

}  // namespace zinf::shard
