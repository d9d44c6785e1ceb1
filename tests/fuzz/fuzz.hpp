// zinf fuzz targets: what every target shares (tests/fuzz/README.md).
//
// A target is written once, as
//
//   ZINF_FUZZ_TARGET(manifest) { ... the real library call on (data, size) ... }
//
// and built two ways: with clang and -DZINF_LIBFUZZER as one libFuzzer binary
// per target (`make fuzz`), where the macro defines LLVMFuzzerTestOneInput;
// and with g++ into one replay binary holding every target (`make test`),
// where the macro registers the target by name for tests/fuzz/replay.cpp.
//
// A target lets the documented errors of the call through (`documented`),
// and calls `finding` for anything that breaks the call's contract; an
// exception of any other type escapes to the harness, which counts it as a
// finding too (libFuzzer: "uncaught exception"; replay: an abort).
#pragma once

#include <zinf/util.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace zinf::fuzz {

using Target = int (*)(const std::uint8_t* data, std::size_t size);

// Builds of every target in one binary (the replay, and make test's
// libFuzzer link): registers `fn` under `name`; targets() is every one so
// registered, by name.
bool add(const char* name, Target fn);
const std::map<std::string, Target>& targets();

// A broken contract: prints "fuzz finding: <what>" on stderr and aborts, so
// that libFuzzer saves the input and the replay names it.
[[noreturn]] void finding(const std::string& what);

// Counts inputs whose main call accepted them (the replay prints the count,
// so that a test can tell a reader that refuses real files from one that reads them).
void accepted();
std::size_t accepted_count();

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// Runs f(); the exception types Ok... (zinf::DataError, zinf::UsageError:
// what the call documents for bad input) are fine and make it return false.
// Returns true when f() returned normally.
template <class... Ok, class F>
bool documented(F&& f) {
    try {
        f();
        return true;
    } catch (const Error& e) {
        if ((dynamic_cast<const Ok*>(&e) || ...)) {
            if (e.message().empty()) finding("a documented error with an empty message");
            return false;
        }
        finding(std::string("undocumented zinf error (exit ") + std::to_string(e.exit_code()) + "): " + e.what());
    }
}

// The bytes as a file that the library can open by name: one memfd per
// process, rewritten for each input; path() is /proc/self/fd/<n>.
class MemFile {
public:
    static const MemFile& with(const std::uint8_t* data, std::size_t size);
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

}  // namespace zinf::fuzz

#ifdef ZINF_LIBFUZZER
#define ZINF_FUZZ_ENTRY(name)                                                               \
    extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
        return zinf_fuzz_##name(data, size);                                              \
    }
#else
#define ZINF_FUZZ_ENTRY(name) [[maybe_unused]] static const bool zinf_fuzz_added_##name = \
    ::zinf::fuzz::add(#name, zinf_fuzz_##name);
#endif

#define ZINF_FUZZ_TARGET(name)                                                   \
    static int zinf_fuzz_##name(const std::uint8_t* data, std::size_t size);   \
    ZINF_FUZZ_ENTRY(name)                                                        \
    static int zinf_fuzz_##name(const std::uint8_t* data, std::size_t size)
