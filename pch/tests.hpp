// What every unit and MPI test compiles, precompiled once per build folder
// ($(BUILD)/pch/tests.hpp.gch, Makefile) and put before each test file with
// -include: Boost.Test, nlohmann/json, the public headers and the standard
// library they use. About 5 s of a 7-15 s test compile was these headers.
//
// Boost.Test's main: a test file defines BOOST_TEST_MODULE before its first
// include, which -include puts after this header; so main and the test
// tree's setup come from BOOST_TEST_MAIN here, and tests/unit/testing.hpp names the
// master suite from BOOST_TEST_MODULE (ZINF_TEST_PCH). Every test binary is
// one file, so each gets one main. Nothing here may depend on the file that
// follows: GCC falls back to reading this text when the .gch does not fit
// (-Winvalid-pch says so), with the same meaning.
#pragma once
#define ZINF_TEST_PCH 1
#define BOOST_TEST_MAIN
#include <boost/test/unit_test.hpp>

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
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
