// zinf-nvmebench's measurement: a target file, and one timed pass per
// (op, engine configuration) through the library's io::Engine.
#pragma once

#include <zinf/io.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zinf::nvmebench {

struct SweepSpec {
    std::vector<std::string> engines;
    std::vector<std::uint64_t> block_sizes;
    std::vector<unsigned> queue_depths;
    std::vector<unsigned> queues;
    bool read = true, write = true;
    std::uint64_t size = 0;  // bytes per pass, a multiple of 4KiB
    unsigned loops = 1;      // passes over the file per measurement
    bool verify = false;

    std::vector<io::EngineConfig> configs() const;  // the cross product, in run order
};

struct Result {
    io::Op op;
    io::EngineConfig cfg;  // as run ("auto" resolved)
    std::uint64_t bytes = 0;
    std::uint64_t blocks = 0;  // requests issued
    double seconds = 0;
    std::string notes;  // the engine's setup downgrades, if any
    double gibps() const { return seconds > 0 ? double(bytes) / double(GiB) / seconds : 0; }
    double iops() const { return seconds > 0 ? double(blocks) / seconds : 0; }
};

// The file measured on: created by us (removed at the end unless kept) or
// given by the user (never removed, overwritten only when allowed).
class Target {
public:
    struct Options {
        std::string dir;   // create a fresh file here, or
        std::string file;  // use this path
        std::uint64_t size = 0;
        bool need_write = false;  // the sweep writes (or must prepare) the file
        bool force = false;       // may overwrite a file we did not create
        bool keep = false;
        io::Direct direct = io::Direct::prefer;
    };
    explicit Target(const Options& o);
    ~Target();  // removes a file we created unless keep
    Target(const Target&) = delete;
    Target& operator=(const Target&) = delete;

    io::File& file() { return file_; }
    const std::string& path() const { return path_; }
    bool created() const { return created_; }
    // True when the file already holds `size` bytes we may read without writing first.
    bool has_data() const { return has_data_; }
    void mark_written() { has_data_ = true; }

private:
    std::string path_;
    io::File file_;
    bool created_ = false, keep_ = false, has_data_ = false;
};

// The expected xxh3 of every 4KiB unit of the file after the last write pass.
class Pattern {
public:
    static constexpr std::size_t kUnit = 4096;
    explicit Pattern(std::uint64_t size);
    // Fills `block` (starting at file offset `offset`) with this generation's
    // pattern and records its hashes.
    void fill(std::span<std::byte> block, std::uint64_t offset);
    // Checks `block` against the recorded hashes; DataError naming the offset.
    void check(std::span<const std::byte> block, std::uint64_t offset, const std::string& path) const;
    void next_generation() { ++gen_; }

private:
    std::vector<std::uint64_t> hashes_;
    std::uint64_t gen_ = 1;
};

// Set from a signal handler; measurements stop between blocks when true.
extern std::atomic<bool> g_interrupted;

// Progress callback: bytes just completed.
using OnBytes = std::function<void(std::uint64_t)>;

// One timed pass (times `loops`) of `op` over the target with `cfg`. Writes
// end with fdatasync inside the timing; buffered reads start with the file's
// page cache dropped, so neither reports memory speed as disk speed.
Result measure(Target& t, const io::EngineConfig& cfg, io::Op op, const SweepSpec& spec,
               Pattern* pattern, const OnBytes& on_bytes);

}  // namespace zinf::nvmebench
