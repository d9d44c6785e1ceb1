// The manifest reader (shard): any bytes as a manifest. Bad input is a
// DataError (65); a manifest it accepts must write back out and read back
// the same, and say how many bytes its files need.
#include "fuzz.hpp"

#include <zinf/shard.hpp>

#include <sstream>

using namespace zinf;

ZINF_FUZZ_TARGET(manifest) {
    std::istringstream in{std::string(fuzz::text_of(data, size))};
    shard::Manifest m;
    if (!fuzz::documented<DataError>([&] { m = shard::read_manifest(in, "fuzz.manifest"); })) return 0;
    fuzz::accepted();

    std::ostringstream once;
    shard::write_manifest(once, m);
    std::istringstream again_in(once.str());
    shard::Manifest again;
    try {
        again = shard::read_manifest(again_in, "rewritten");
    } catch (const Error& e) {
        fuzz::finding(std::string("an accepted manifest, written out, is refused: ") + e.what());
    }
    std::ostringstream twice;
    shard::write_manifest(twice, again);
    if (twice.str() != once.str()) fuzz::finding("an accepted manifest does not read back the same");

    std::uint64_t sum = 0;
    for (const auto& f : m.files()) sum += m.file_bytes(f);
    if (sum < m.total_bytes()) fuzz::finding("the files are smaller than the partitions they hold");
    return 0;
}
