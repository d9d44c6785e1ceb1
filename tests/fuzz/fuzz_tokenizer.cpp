// Hugging Face's tokenizer.json (zinf-tokenize -t, zinf-train and
// zinf-sample --tokenizer): any bytes as the file's text, read as text::open
// reads a file that starts with '{'. Bad input is a DataError (65); a
// tokenizer it accepts encodes a text of every kind (letters, digits,
// spaces, a special token, bytes that are not UTF-8) into ids below its
// vocabulary or refuses it with a DataError, decodes its own ids, and where
// it promises bytes back gives them.
#include "fuzz.hpp"

#include <zinf/text.hpp>

using namespace zinf;

ZINF_FUZZ_TARGET(tokenizer) {
    std::unique_ptr<text::Tokenizer> t;
    if (!fuzz::documented<DataError>([&] { t = text::from_json(fuzz::text_of(data, size), "tokenizer.json"); }))
        return 0;
    fuzz::accepted();
    if (t->vocab() == 0 || t->vocab() > (std::uint64_t{1} << 31)) fuzz::finding("a vocabulary of " + std::to_string(t->vocab()));
    const std::string sample = "Hello, world! it's 12345 na\xC3\xAFve\n\n\t  <|endoftext|> \xF0\x9F\x98\x80 \xFF\xC3";
    std::vector<text::Id> ids;
    if (!fuzz::documented<DataError>([&] { ids = t->encode(sample); })) return 0;
    for (text::Id id : ids)
        if (id >= t->vocab()) fuzz::finding("id " + std::to_string(id) + " past the vocabulary of " + std::to_string(t->vocab()));
    std::string back;
    fuzz::documented<DataError>([&] { back = t->decode(ids); });
    if (t->round_trip() == text::RoundTrip::bytes && back != sample) fuzz::finding("bytes promised back, not given");
    return 0;
}
