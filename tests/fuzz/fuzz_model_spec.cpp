// The model spec parser (shard): any bytes as --model. Bad input is a
// UsageError (64); a spec it accepts prints as an explicit spec that parses
// to the same model, and a small one lays out.
#include "fuzz.hpp"

#include <zinf/shard.hpp>

using namespace zinf;

ZINF_FUZZ_TARGET(model_spec) {
    shard::ModelSpec s;
    if (!fuzz::documented<UsageError>([&] { s = shard::ModelSpec::parse(fuzz::text_of(data, size)); })) return 0;
    fuzz::accepted();

    const std::string text = s.to_string();
    shard::ModelSpec back;
    try {
        back = shard::ModelSpec::parse(text);
    } catch (const Error& e) {
        fuzz::finding("accepted spec prints as '" + text + "', which is refused: " + e.what());
    }
    if (!(back == s)) fuzz::finding("'" + text + "' parses to another model");
    if (s.parameters() == 0 || s.parameters() < s.hidden) fuzz::finding("'" + text + "' counts no parameters");

    // What zinf-shard layout does next, for models small enough to lay out
    // many times a second (the reader's own limits are the manifest target's).
    if (s.layers > 16 || s.hidden > 4096 || s.vocab * s.hidden > (1u << 26) || s.seq * s.hidden > (1u << 26))
        return 0;
    const unsigned tile = s.hidden % 2 == 0 ? 2 : 1;
    shard::Manifest m;
    fuzz::documented<UsageError>([&] { m = shard::layout(s, {.dp = 3, .tile = tile}); });
    std::uint64_t numel = 0;
    for (const auto& t : shard::tensors(s, 1)) numel += t.numel;
    if (numel != s.parameters())
        fuzz::finding("'" + text + "': the tensors hold " + std::to_string(numel) + " elements, parameters() says " +
                      std::to_string(s.parameters()));
    return 0;
}
