#include <zinf/io.hpp>

#include <nlohmann/json.hpp>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <set>

namespace zinf::io {

void EngineConfig::validate() const {
    if (engine != "auto" && engine != "uring" && engine != "threads")
        throw UsageError("engine '" + engine + "' is not one of: auto, uring, threads");
    if (block_size < 512 || block_size % 512 != 0)
        throw UsageError("block_size " + std::to_string(block_size) +
                         " must be a positive multiple of 512 bytes");
    if (block_size > GiB)
        throw UsageError("block_size " + format_size(block_size) + " exceeds the 1GiB maximum");
    if (queue_depth < 1 || queue_depth > kMaxQueueDepth)
        throw UsageError("queue_depth " + std::to_string(queue_depth) + " must be in 1.." +
                         std::to_string(kMaxQueueDepth));
    if (queues < 1 || queues > kMaxQueues)
        throw UsageError("queues " + std::to_string(queues) + " must be in 1.." +
                         std::to_string(kMaxQueues));
}

EngineConfig EngineConfig::from_json(const json::Json& obj, const std::string& where) {
    if (!obj.is_object()) throw DataError(where + ": an engine configuration must be a JSON object");
    static const std::set<std::string> known = {"schema", "engine",      "block_size", "queue_depth",
                                                "queues", "read_gibps", "write_gibps"};
    for (const auto& [key, value] : obj.items()) {
        if (!known.count(key))
            throw DataError(where + ": unknown engine configuration key '" + key +
                            "' (known: engine, block_size, queue_depth, queues, read_gibps, write_gibps)");
    }
    if (obj.contains("schema") && obj["schema"] != kEngineSchema)
        throw DataError(where + ": schema " + obj["schema"].dump() + " is not " + kEngineSchema);
    EngineConfig c;
    // Counts are range-checked before narrowing, so 2^32+1 is not read as 1.
    auto count = [&](const char* key, unsigned max) -> unsigned {
        std::uint64_t v = json::get_u64(obj, key, where);
        if (v < 1 || v > max)
            throw DataError(where + ": " + key + " " + std::to_string(v) + " must be in 1.." +
                            std::to_string(max));
        return static_cast<unsigned>(v);
    };
    try {
        if (obj.contains("engine")) c.engine = json::get_string(obj, "engine", where);
        if (obj.contains("block_size")) {
            // Accept both a byte count and a size string ("1MiB").
            const auto& v = obj["block_size"];
            c.block_size = v.is_string() ? parse_size(v.get<std::string>())
                                         : json::get_u64(obj, "block_size", where);
        }
        if (obj.contains("queue_depth")) c.queue_depth = count("queue_depth", kMaxQueueDepth);
        if (obj.contains("queues")) c.queues = count("queues", kMaxQueues);
        for (auto [key, out] : {std::pair{"read_gibps", &c.read_gibps}, std::pair{"write_gibps", &c.write_gibps}}) {
            if (!obj.contains(key)) continue;
            const auto& v = obj[key];
            if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
                throw DataError(where + ": " + key + " " + v.dump() + " must be a positive number (GiB/s)");
            *out = v.get<double>();
        }
        c.validate();
    } catch (const UsageError& e) {
        throw DataError(where + ": " + e.message());
    }
    return c;
}

EngineConfig EngineConfig::load(const std::string& path) {
    const auto in = input_stream(path);
    auto recs = json::read_lines(*in, path);
    if (recs.size() != 1)
        throw DataError(path + ": want one engine configuration record, found " +
                        std::to_string(recs.size()));
    return from_json(recs[0], path);
}

json::Json EngineConfig::to_json() const {
    json::Json j{{"schema", kEngineSchema},
                 {"engine", engine},
                 {"block_size", block_size},
                 {"queue_depth", queue_depth},
                 {"queues", queues}};
    if (read_gibps > 0) j["read_gibps"] = read_gibps;
    if (write_gibps > 0) j["write_gibps"] = write_gibps;
    return j;
}

std::string EngineConfig::describe() const {
    return engine + " bs=" + format_size(block_size) + " qd=" + std::to_string(queue_depth) +
           " queues=" + std::to_string(queues);
}

}  // namespace zinf::io
