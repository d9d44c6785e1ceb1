// The ZeRO-Infinity engine's options (options.hpp's ZeroOptions), which
// zinf-train and zinf-sample spell alike.
#include <zinf/options.hpp>
#include <zinf/zero.hpp>

#include <CLI/CLI.hpp>

namespace zinf::cli {

void ZeroOptions::add(CLI::App& app, bool sampling_) {
    sampling = sampling_;
    if (sampling) persist_below = "auto";
    app.add_option("--prefetch-bytes", prefetch_bytes,
                   "Device bytes the engine fetches ahead of compute along the recorded trace (0: on demand)")
        ->capture_default_str();
    app.add_option("--persist-below", persist_below,
                   sampling ? "Parameters of fewer elements stay on the device after their first fetch; auto: all of "
                              "them when they fit the budget beside the cache, else none"
                            : "Parameters of fewer elements stay gathered for the whole step (0: none)")
        ->capture_default_str();
}

zero::EngineOptions ZeroOptions::resolve() const {
    zero::EngineOptions o;
    o.infinity.prefetch_bytes = parse_sizes({prefetch_bytes}, "--prefetch-bytes")[0];
    o.persist_if_fits = sampling && persist_below == "auto";
    if (!o.persist_if_fits) o.infinity.persist_below = parse_sizes({persist_below}, "--persist-below")[0];
    return o;
}

}  // namespace zinf::cli
