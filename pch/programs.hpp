// What the programs' and benchmarks' files compile, precompiled once per
// build folder ($(BUILD)/pch/programs.hpp.gch, Makefile) and put before each
// with -include: CLI11, nlohmann/json, the public headers and the standard
// library. Nothing here may depend on the file that follows: GCC falls back
// to reading this text when the .gch does not fit (-Winvalid-pch says so).
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <zinf/cli.hpp>
#include <zinf/comm.hpp>
#include <zinf/data.hpp>
#include <zinf/device.hpp>
#include <zinf/io.hpp>
#include <zinf/mem.hpp>
#include <zinf/model.hpp>
#include <zinf/optim.hpp>
#include <zinf/options.hpp>
#include <zinf/plan.hpp>
#include <zinf/sample.hpp>
#include <zinf/shard.hpp>
#include <zinf/train.hpp>
#include <zinf/util.hpp>
#include <zinf/zero.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
