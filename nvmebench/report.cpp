#include "report.hpp"

#include <nlohmann/json.hpp>
#include <map>
#include <tuple>

namespace zinf::nvmebench {

namespace {
const char* op_name(io::Op op) { return op == io::Op::read ? "read" : "write"; }

auto key_of(const io::EngineConfig& c) {
    return std::make_tuple(c.engine, c.block_size, c.queue_depth, c.queues);
}
}  // namespace

json::Json record(const Result& r, const RunInfo& info) {
    return json::Json{
        {"schema", kSchema},        {"op", op_name(r.op)},
        {"engine", r.cfg.engine},   {"block_size", r.cfg.block_size},
        {"queue_depth", r.cfg.queue_depth}, {"queues", r.cfg.queues},
        {"bytes", r.bytes},         {"seconds", r.seconds},
        {"gibps", r.gibps()},       {"iops", r.iops()},
        {"direct", info.direct},    {"alignment_bytes", info.alignment},
        {"file", info.file},        {"size_bytes", info.size},
        {"loops", info.loops},      {"verify", info.verify},
        {"version", version()},
    };
}

Best find_best(const std::vector<Result>& results) {
    Best b;
    std::map<decltype(key_of(io::EngineConfig{})), std::pair<double, double>> both;
    for (std::size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        auto& slot = r.op == io::Op::read ? b.read : b.write;
        if (!slot || r.gibps() > results[*slot].gibps()) slot = i;
        auto& rw = both[key_of(r.cfg)];
        (r.op == io::Op::read ? rw.first : rw.second) = r.gibps();
    }
    if (!b.read || !b.write) {
        b.overall = b.read ? b.read : b.write;
        return b;
    }
    double best_h = -1;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (results[i].op != io::Op::read) continue;
        auto [rd, wr] = both[key_of(results[i].cfg)];
        double h = rd > 0 && wr > 0 ? 2 / (1 / rd + 1 / wr) : 0;
        if (h > best_h) best_h = h, b.overall = i;
    }
    return b;
}

io::EngineConfig best_config(const std::vector<Result>& results, std::size_t overall) {
    io::EngineConfig c = results[overall].cfg;
    for (const Result& r : results)
        if (key_of(r.cfg) == key_of(c)) (r.op == io::Op::read ? c.read_gibps : c.write_gibps) = r.gibps();
    return c;
}

void print_table(std::FILE* out, const std::vector<Result>& results, const Best& best,
                 const RunInfo& info) {
    std::fprintf(out, "# zinf-nvmebench %s\n", version());
    std::fprintf(out, "# file %s (%s), %s per pass, %u loop%s%s\n", info.file.c_str(),
                 info.created ? (info.kept ? "created, kept" : "created, removed at the end")
                              : "existing",
                 format_size(info.size).c_str(), info.loops, info.loops == 1 ? "" : "s",
                 info.verify ? ", verified with xxh3" : "");
    std::fprintf(out, "# direct I/O %s, alignment %zu bytes%s%s\n", info.direct ? "on" : "off",
                 info.alignment, info.engine_notes.empty() ? "" : "; ",
                 info.engine_notes.c_str());
    std::fprintf(out, "# GiB/s = bytes / seconds / 2^30; IOPS = block requests / seconds;"
                      " writes include the closing fdatasync\n");
    std::fprintf(out, "#%5s %8s %8s %5s %6s %12s %9s %8s %9s\n", "op", "engine", "block", "qd",
                 "queues", "bytes", "seconds", "GiB/s", "IOPS");
    for (std::size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        const char* mark = best.read == i ? "  <- best read" : best.write == i ? "  <- best write" : "";
        std::fprintf(out, "%6s %8s %8s %5u %6u %12llu %9.3f %8.3f %9.0f%s\n", op_name(r.op),
                     r.cfg.engine.c_str(), format_size(r.cfg.block_size).c_str(), r.cfg.queue_depth,
                     r.cfg.queues, static_cast<unsigned long long>(r.bytes), r.seconds, r.gibps(),
                     r.iops(), mark);
    }
    for (auto [name, idx] : {std::pair{"read", best.read}, std::pair{"write", best.write}}) {
        if (!idx) continue;
        const Result& r = results[*idx];
        std::fprintf(out, "# best %-5s %s: %.3f GiB/s\n", name, r.cfg.describe().c_str(), r.gibps());
    }
    if (best.overall)
        std::fprintf(out, "# engine config (--best): %s\n",
                     best_config(results, *best.overall).to_json().dump().c_str());
}

}  // namespace zinf::nvmebench
