// The configuration JSON the engine and the pool read: any bytes as the
// --config file (zinf-nvmebench --best's output, read by io::EngineConfig::load),
// and each of its lines as the pool's configuration object
// (mem::PoolConfig::from_json). Bad input is a DataError (65); a configuration
// either accepts is valid and survives its own to_json.
#include "fuzz.hpp"

#include <zinf/io.hpp>
#include <zinf/mem.hpp>

#include <nlohmann/json.hpp>

using namespace zinf;

ZINF_FUZZ_TARGET(config) {
    const auto& file = fuzz::MemFile::with(data, size);
    io::EngineConfig c;
    bool any = false;
    if (fuzz::documented<DataError>([&] { c = io::EngineConfig::load(file.path()); })) {
        any = true;
        fuzz::documented<>([&] { c.validate(); });
        const io::EngineConfig back = io::EngineConfig::from_json(c.to_json(), "round trip");
        if (back.engine != c.engine || back.block_size != c.block_size || back.queue_depth != c.queue_depth ||
            back.queues != c.queues)
            fuzz::finding("engine configuration " + c.describe() + " reads back as " + back.describe());
    }

    const std::string_view text = fuzz::text_of(data, size);
    std::size_t line_no = 0;
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        const std::string_view line = text.substr(at, end - at);
        at = end + 1;
        ++line_no;
        json::Json j;
        if (!fuzz::documented<DataError>([&] { j = json::parse_line(line, "pool.json", line_no); })) continue;
        mem::PoolConfig p;
        if (!fuzz::documented<DataError>([&] { p = mem::PoolConfig::from_json(j, "pool.json"); })) continue;
        any = true;
        fuzz::documented<>([&] { p.validate(); });
        const mem::PoolConfig back = mem::PoolConfig::from_json(p.to_json(), "round trip");
        if (back.bytes != p.bytes || back.buffer != p.buffer || back.lease_timeout != p.lease_timeout ||
            back.allocator != p.allocator)
            fuzz::finding("pool configuration " + p.describe() + " reads back as " + back.describe());
    }
    if (any) fuzz::accepted();
    return 0;
}
