// Size and duration parsing (util, and the option lists of cli): any bytes as
// the text of --block-size, --pinned, --comm-timeout. Bad input is a
// UsageError (64); a size that prints exactly reads back the same, and a
// duration is finite and not negative.
#include "fuzz.hpp"

#include <zinf/cli.hpp>

using namespace zinf;

ZINF_FUZZ_TARGET(size) {
    const std::string_view text = fuzz::text_of(data, size);
    std::uint64_t bytes = 0;
    bool any = false;
    if (fuzz::documented<UsageError>([&] { bytes = parse_size(text); })) {
        any = true;
        const std::string printed = format_size(bytes);
        if (printed.find('.') == std::string::npos) {
            std::uint64_t back = 0;
            try {
                back = parse_size(printed);
            } catch (const Error& e) {
                fuzz::finding("size " + std::to_string(bytes) + " prints as '" + printed + "', refused: " + e.what());
            }
            if (back != bytes)
                fuzz::finding("size " + std::to_string(bytes) + " prints as '" + printed + "', which reads " +
                              std::to_string(back));
        }
    }
    std::chrono::nanoseconds d{};
    if (fuzz::documented<UsageError>([&] { d = parse_duration(text); })) {
        any = true;
        if (d.count() < 0) fuzz::finding("duration '" + std::string(text) + "' is negative");
    }

    // The same text as a comma-separated option list ("1M,4M").
    std::vector<std::string> items;
    for (std::size_t at = 0; at <= text.size();) {
        const std::size_t comma = std::min(text.find(',', at), text.size());
        items.emplace_back(text.substr(at, comma - at));
        at = comma + 1;
    }
    std::vector<std::uint64_t> sizes;
    if (fuzz::documented<UsageError>([&] { sizes = cli::parse_sizes(items, "--fuzz"); })) {
        any = true;
        if (sizes.size() != items.size())
            fuzz::finding("parse_sizes returned " + std::to_string(sizes.size()) + " sizes for " +
                          std::to_string(items.size()) + " items");
    }
    if (any) fuzz::accepted();
    return 0;
}
