// The bench records zinf-plan reads (--bench FILE: the JSON Lines of
// zinf-nvmebench, -pinstress, -commbench and -optbench): any bytes as such a
// file, through plan::read_bench_lines as zinf-plan reads it. Bad input is a
// DataError (65); what it accepts is a bandwidth that is finite and not
// negative, and the plan made from it is a plan.
#include "fuzz.hpp"

#include <zinf/plan.hpp>

#include <nlohmann/json.hpp>
#include <cmath>
#include <sstream>

using namespace zinf;

ZINF_FUZZ_TARGET(bench) {
    std::istringstream in{std::string(fuzz::text_of(data, size))};
    plan::Hardware h;
    h.gpu_bytes = 16 * GiB;
    h.cpu_bytes = 64 * GiB;
    h.nvme_bytes = 1024 * GiB;
    if (!fuzz::documented<DataError>([&] { plan::read_bench_lines(in, "fuzz.jsonl", h); })) return 0;
    fuzz::accepted();

    for (const double bps : {h.gpu_gpu_bps, h.cpu_gpu_bps, h.nvme_read_bps, h.nvme_write_bps, h.cpu_update_bps})
        if (!(bps >= 0) || !std::isfinite(bps))
            fuzz::finding("a bench file gave the bandwidth " + std::to_string(bps) + " B/s");

    plan::Workload w{.spec = shard::ModelSpec::parse("gpt2-124m"), .dp = 4, .nodes = 2, .batch = 8};
    const plan::Report r = plan::plan(w, h, 0.9);
    for (const auto& p : r.all)
        for (const double e : {p.efficiency_param, p.efficiency_optimizer, p.efficiency_activation})
            if (!(e >= 0 && e <= 1)) fuzz::finding("placement " + p.name() + " has efficiency " + std::to_string(e));
    (void)plan::to_json(r).dump();
    return 0;
}
