// Replays fuzz corpora through the g++ build of every target, for `make test`:
//
//   fuzz-replay --list                 the targets, one a line
//   fuzz-replay TARGET PATH...         every file under each PATH (a file or a
//                                      folder, recursively) through TARGET
//
// Prints "# TARGET: N inputs, A accepted, 0 findings" and exits 0, or names the input a
// target aborted on (fuzz::finding, a crash, an escaped exception) and dies
// of it; 64 on a bad command line, 66 for a PATH that is not there.
#include "fuzz.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace {

// The input in hand, for the message of a crash (written from a signal handler).
char g_current[4096];

void on_fatal(int sig) {
    const char head[] = "fuzz-replay: died on input ";
    (void)!::write(2, head, sizeof head - 1);
    (void)!::write(2, g_current, std::strlen(g_current));
    (void)!::write(2, "\n", 1);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

std::vector<std::filesystem::path> inputs_under(const std::filesystem::path& p) {
    namespace fs = std::filesystem;
    std::vector<fs::path> out;
    if (fs::is_directory(p)) {
        for (const auto& e : fs::recursive_directory_iterator(p))
            if (e.is_regular_file() && e.path().filename().string()[0] != '.') out.push_back(e.path());
        std::sort(out.begin(), out.end());
    } else if (fs::is_regular_file(p)) {
        out.push_back(p);
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace zinf::fuzz;
    if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
        for (const auto& [name, fn] : targets()) std::printf("%s\n", name.c_str());
        return 0;
    }
    if (argc < 3 || !targets().count(argv[1])) {
        std::fprintf(stderr, "usage: fuzz-replay --list | fuzz-replay TARGET PATH...\n");
        return zinf::exit_code::usage;
    }
    const Target fn = targets().at(argv[1]);
    for (int s : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(s, on_fatal);
    std::set_terminate([] {
        std::string what = "not a std::exception";
        try {
            if (auto e = std::current_exception()) std::rethrow_exception(e);
        } catch (const std::exception& e) {
            what = std::string(typeid(e).name()) + ": " + e.what();
        } catch (...) {
        }
        std::fprintf(stderr, "fuzz finding: an exception escaped the target (%s)\n", what.c_str());
        on_fatal(SIGABRT);
    });
    std::size_t n = 0;
    for (int i = 2; i < argc; ++i) {
        if (!std::filesystem::exists(argv[i])) {
            std::fprintf(stderr, "fuzz-replay: %s: no such file or folder\n", argv[i]);
            return zinf::exit_code::no_input;
        }
        for (const auto& path : inputs_under(argv[i])) {
            std::ifstream in(path, std::ios::binary);
            const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
            if (!in.good() && !in.eof()) {
                std::fprintf(stderr, "fuzz-replay: %s: read failed\n", path.c_str());
                return zinf::exit_code::io;
            }
            std::snprintf(g_current, sizeof g_current, "%s", path.c_str());
            fn(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
            ++n;
        }
    }
    std::printf("# %s: %zu inputs, %zu accepted, 0 findings\n", argv[1], n, accepted_count());
    return 0;
}
