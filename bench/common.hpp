// What the library benchmarks (zinf-iobench, zinf-streambench) share: the
// input file (the median of their rounds is zinf::median, util.hpp).
#pragma once

#include <zinf/options.hpp>

#include <cerrno>
#include <string>
#include <sys/stat.h>

namespace zinf::bench {

using cli::EngineOptions;

// Opens an existing regular file for reading: 66 when missing, 64 when not a file.
inline io::File open_input(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat", errno, path);
    if (!S_ISREG(st.st_mode)) throw UsageError(path + ": not a regular file");
    return io::File::open(path, {});
}

}  // namespace zinf::bench
