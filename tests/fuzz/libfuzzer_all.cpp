// Every fuzz target behind one libFuzzer entry point, for `make test`: linked
// with clang's libFuzzer driver against the tests' build of the library, it
// shows that each target's code (tests/fuzz/targets.o, the replay build's one
// translation unit of them all) links as `make fuzz` links it, at the cost of
// one link instead of eight compiles and links. The first byte of an input
// picks the target; `make fuzz` still builds one binary a target.
#include "fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto& all = zinf::fuzz::targets();
    if (size == 0 || all.empty()) return 0;
    auto it = all.begin();
    for (std::size_t pick = data[0] % all.size(); pick > 0; --pick) ++it;
    return it->second(data + 1, size - 1);
}
