// What the library's own files compile, precompiled once per build folder
// by clang ($(BUILD)/pch/library.hpp.pch and, for the -O1 files,
// library-o1.hpp.pch: clang refuses a header built at another -O) and put
// before each library file that clang builds (Makefile: LIB_FAST_OBJS):
// nlohmann/json, the public headers and the standard headers the files use
// most. Parsing them was about half of each such compile (shard/manifest.cpp
// at -O1: 4.0 of 7.2 CPU-s), and clang's header loads what a file uses, not
// all of it, so one header serves every file. Nothing here may depend on the
// file that follows, and each file still includes what it uses (GCC builds
// it without this header: FAST_CXX=g++, or no clang).
#pragma once
#include <nlohmann/json.hpp>

#include <zinf/comm.hpp>
#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>
#include <zinf/model.hpp>
#include <zinf/optim.hpp>
#include <zinf/plan.hpp>
#include <zinf/sample.hpp>
#include <zinf/shard.hpp>
#include <zinf/train.hpp>
#include <zinf/util.hpp>
#include <zinf/zero.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
