// Drawing the next token (Chooser), and the loop that feeds a prompt and
// draws tokens over every rank (generate).
#include <zinf/sample.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace zinf::sample {

std::int32_t Chooser::operator()(std::span<const float> logits, const Choice& c) {
    if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
        throw UsageError("the temperature must be finite and at least 0, not " + std::to_string(c.temperature));
    const std::size_t n = c.limit ? std::min<std::size_t>(c.limit, logits.size()) : logits.size();
    // The candidates: ids whose logit is a number, the k largest when asked
    // (ties broken by the lower id, so the set never depends on the sort).
    std::vector<std::uint32_t> ids;
    ids.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i)
        if (!std::isnan(logits[i])) ids.push_back(i);
    if (ids.empty()) throw DataError("the model's logits are all NaN: there is no token to draw");
    auto before = [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    if (c.temperature == 0) return static_cast<std::int32_t>(*std::min_element(ids.begin(), ids.end(), before));
    if (c.top_k && c.top_k < ids.size()) {
        std::nth_element(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(c.top_k) - 1, ids.end(), before);
        ids.resize(c.top_k);
        std::sort(ids.begin(), ids.end());
    }
    const float top = logits[*std::min_element(ids.begin(), ids.end(), before)];
    std::vector<double> w(ids.size());
    double total = 0;
    for (std::size_t j = 0; j < ids.size(); ++j) {  // in id order: one summation order
        w[j] = std::exp((static_cast<double>(logits[ids[j]]) - top) / c.temperature);
        total += w[j];
    }
    // 53 random bits as a double in [0, 1): the same on every library.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double acc = 0;
    for (std::size_t j = 0; j < ids.size(); ++j) {
        acc += w[j];
        if (u < acc) return static_cast<std::int32_t>(ids[j]);
    }
    return static_cast<std::int32_t>(ids.back());  // u rounded up to the total
}

std::uint64_t generate(Decoder& dec, device::Device& dev, const Passes& passes, comm::Communicator& comm,
                       std::span<const std::int32_t> prompt, const GenerateOptions& o,
                       const std::function<void(std::int32_t)>& emit) {
    if (prompt.empty()) throw UsageError("the prompt has no tokens");
    // The last token drawn is not fed back: n tokens take n - 1 positions.
    const std::uint64_t need = dec.position() + prompt.size() + std::max<std::uint64_t>(o.tokens, 1) - 1;
    if (need > dec.positions())
        throw UsageError("the prompt's " + std::to_string(prompt.size()) + " tokens and " + std::to_string(o.tokens) +
                         " more need " + std::to_string(need) + " positions; the decoder has " +
                         std::to_string(dec.positions()));
    auto& s = dev.compute();
    std::vector<float> logits(dec.vocab());
    // One pass: the token in at the next position, the next logits out. A
    // rank that fails takes the others with it.
    auto pass = [&](std::int32_t token) {
        std::exception_ptr failed;
        try {
            if (passes.begin) passes.begin();
            dec.step(s, passes.engine, token, logits);
            if (passes.end) passes.end();
            dev.synchronize(s);
        } catch (...) {
            failed = std::current_exception();
            if (passes.reset) passes.reset();
        }
        comm::agree(comm, failed, "sampling stopped at position " + std::to_string(dec.position()));
    };
    for (std::int32_t t : prompt) pass(t);
    Chooser pick(o.seed);
    std::uint64_t drawn = 0;
    while (drawn < o.tokens) {
        std::int32_t next = 0;
        std::exception_ptr failed;
        try {
            if (comm.rank() == 0) next = pick(logits, o.choice);
        } catch (...) {
            failed = std::current_exception();
        }
        comm::agree(comm, failed, "no token was drawn");
        if (comm.size() > 1) comm.broadcast(std::as_writable_bytes(std::span(&next, 1)), comm::DType::i32, 0);
        ++drawn;
        try {
            emit(next);
        } catch (...) {
            failed = std::current_exception();
        }
        comm::agree(comm, failed, "sampling stopped after " + std::to_string(drawn) + " tokens");
        if ((o.stop && next == *o.stop) || drawn == o.tokens) break;
        pass(next);
    }
    return drawn;
}

std::uint64_t generate(Decoder& dec, device::Device& dev, zero::Engine& engine, comm::Communicator& comm,
                       std::span<const std::int32_t> prompt, const GenerateOptions& o,
                       const std::function<void(std::int32_t)>& emit) {
    const Passes passes{engine.hooks(), [&] { engine.begin_forward(); }, [&] { engine.end(); },
                        [&] { engine.reset(); }};
    return generate(dec, dev, passes, comm, prompt, o, emit);
}

}  // namespace zinf::sample
