// zinf-nvmebench's output: the human table, JSON Lines records, and the best
// configurations.
#pragma once

#include "sweep.hpp"

#include <cstdio>
#include <optional>

namespace zinf::nvmebench {

inline constexpr const char* kSchema = "zinf.nvmebench/1";

struct RunInfo {
    std::string file;
    bool created = false, kept = false;
    bool direct = false;
    std::size_t alignment = 1;
    std::uint64_t size = 0;
    unsigned loops = 1;
    bool verify = false;
    std::string engine_notes;
};

json::Json record(const Result& r, const RunInfo& info);

struct Best {
    std::optional<std::size_t> read, write;  // indexes into the results
    std::optional<std::size_t> overall;      // what --best prints
};
// The fastest read and write, and the configuration --best prints: the fastest
// read (or write) when only one was measured, else the configuration with the
// highest harmonic mean of its read and write GiB/s.
Best find_best(const std::vector<Result>& results);
// What --best prints: the configuration of results[overall] with the read
// and write bandwidth measured with it (the trainer's disk floor uses them).
io::EngineConfig best_config(const std::vector<Result>& results, std::size_t overall);

void print_table(std::FILE* out, const std::vector<Result>& results, const Best& best,
                 const RunInfo& info);

}  // namespace zinf::nvmebench
