// zinf cli: what every program's main shares. Options parsed by
// CLI11, errors turned into a message on stderr and the documented exit code.
// CLI11 itself is only declared here: a program that builds its options
// includes <CLI/CLI.hpp>, and the library's other users never compile it.
//
//   #include <CLI/CLI.hpp>
//   int main(int argc, char** argv) {
//       CLI::App app{"what it does"};
//       zinf::cli::Common common;
//       zinf::cli::add_common(app, common);
//       ... app.add_option(...) ...
//       return zinf::cli::run(app, argc, argv, "zinf-foo", common, [&] { ...; return 0; });
//   }
#pragma once

#include <zinf/util.hpp>

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace zinf::cli {

struct Common {
    bool quiet = false;
    int verbose = 0;
};

// --quiet, --verbose (repeatable), --version.
void add_common(CLI::App& app, Common& common);

// Parses the command line (64 on a usage error, 0 after --help/--version), sets
// up logging, runs `body` and maps what it throws to exit codes: zinf::Error by
// its kind, anything else 70. Messages go to stderr as "program: message".
int run(CLI::App& app, int argc, char** argv, const std::string& program, const Common& common,
        const std::function<int()>& body);

// A check for a number of 0 or more whose refusal is one short line
// (CLI::NonNegativeNumber's names the largest double, some 300 digits).
CLI::Validator non_negative();

// "1M,4M" given as a list of strings -> sizes; UsageError naming the option.
std::vector<std::uint64_t> parse_sizes(const std::vector<std::string>& items, const std::string& option);

}  // namespace zinf::cli
