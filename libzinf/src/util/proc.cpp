// This process as the system sees it (memory, CPUs), and the median its
// benchmarks report.
#include <zinf/util.hpp>

#include <algorithm>
#include <fstream>
#include <sched.h>
#include <string>
#include <thread>

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

unsigned affinity_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
    return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
}

void check_thread_count(unsigned threads, std::string_view option) {
    const unsigned cpus = std::max(affinity_cpus(), std::thread::hardware_concurrency());
    if (threads > kThreadsPerCpu * cpus)
        throw UsageError(std::string(option) + " " + std::to_string(threads) + ": more than " +
                         std::to_string(kThreadsPerCpu) + " threads per CPU of this machine (" + std::to_string(cpus) +
                         " CPUs: at most " + std::to_string(kThreadsPerCpu * cpus) + "; 0 picks the count)");
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace zinf
