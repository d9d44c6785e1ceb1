#include <zinf/util.hpp>

#include <fstream>
#include <string>

namespace zinf {

// "VmRSS:     1234 kB" in `file` -> bytes.
static std::uint64_t kib_line(const char* file, std::string_view key) {
    std::ifstream in(file);  // fault-site: none (/proc)
    std::string line;
    const std::string prefix = std::string(key) + ":";
    while (std::getline(in, line))
        if (line.compare(0, prefix.size(), prefix) == 0) return std::stoull(line.substr(prefix.size())) * KiB;
    return 0;
}

std::uint64_t resident_bytes() { return kib_line("/proc/self/status", "VmRSS"); }
std::uint64_t peak_resident_bytes() { return kib_line("/proc/self/status", "VmHWM"); }
std::uint64_t meminfo_bytes(std::string_view key) { return kib_line("/proc/meminfo", key); }

}  // namespace zinf
