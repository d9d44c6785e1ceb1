// What the library benchmarks (zinf-iobench, zinf-streambench) share: the
// input file, and the median of their rounds.
#pragma once

#include <zinf/options.hpp>

#include <algorithm>
#include <cerrno>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace zinf::bench {

using cli::EngineOptions;

// Opens an existing regular file for reading: 66 when missing, 64 when not a file.
inline io::File open_input(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat", errno, path);
    if (!S_ISREG(st.st_mode)) throw UsageError(path + ": not a regular file");
    return io::File::open(path, {});
}

inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace zinf::bench
