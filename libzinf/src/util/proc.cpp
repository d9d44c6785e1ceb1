#include <zinf/util.hpp>

#include <fstream>
#include <string>

namespace zinf {

// "VmRSS:     1234 kB" -> bytes.
static std::uint64_t status_kib(const char* key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    const std::string prefix = std::string(key) + ":";
    while (std::getline(in, line))
        if (line.compare(0, prefix.size(), prefix) == 0) return std::stoull(line.substr(prefix.size())) * KiB;
    return 0;
}

std::uint64_t resident_bytes() { return status_kib("VmRSS"); }
std::uint64_t peak_resident_bytes() { return status_kib("VmHWM"); }

}  // namespace zinf
