// zinf-train --profile's report (profile.hpp).
#include "profile.hpp"

#include <zinf/mem.hpp>
#include <zinf/util.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace zinf::trainer {

namespace {

// A row of the report: a kernel, a copy, compute's time in none of them
// ("other"), or an engine stage.
struct Line {
    const char* kind;  // "kernel", "copy", "other", "stage"
    device::Profile::Row row;
};

double per_s(double x, double s) { return s > 0 ? x / s : 0.0; }

const char* kind_of(const std::string& name) { return name.rfind("copy", 0) == 0 ? "copy" : "kernel"; }

}  // namespace

void report_profile(const device::Profile& p, const device::Peaks& peaks, device::Device& dev, const ProfileRun& run,
                    bool json, unsigned gemm_shapes) {
    const double step = p.step_seconds();
    // The costliest GEMM shapes, each beside the device's rate at its shape
    // alone (a few GEMMs of it, timed now: the profile is off).
    struct Shape {
        device::Profile::Row row;
        double alone = 0;  // FLOP/s
    };
    std::vector<Shape> shapes;
    std::string no_memory;  // why a shape could not be timed alone
    for (const auto& r : p.details()) {
        if (shapes.size() >= gemm_shapes || r.name.rfind("gemm ", 0) != 0) continue;
        const auto sh = device::gemm_of_detail(std::string_view(r.name).substr(5));
        if (!sh) continue;
        double alone = 0;
        if (no_memory.empty()) try {
                // Enough GEMMs for 10 GFLOP (a launch's or a stamp's cost
                // small beside them), 3 to 100 on cuda, 1 to 100 on cpu.
                const double per_call = r.flops / static_cast<double>(std::max<std::uint64_t>(1, r.calls));
                const double want = per_call > 0 ? std::ceil(1e10 / per_call) : 1.0;
                const unsigned reps = static_cast<unsigned>(
                    std::clamp(want, dev.backend() == "cuda" ? 3.0 : 1.0, 100.0));
                alone = device::measure_gemm(dev, *sh, reps);
            } catch (const mem::OutOfMemory& e) {
                // The engine of a training run keeps its budget to the end.
                no_memory = e.what();
            }
        shapes.push_back({r, alone});
    }
    const double other = step - p.compute_seconds();
    std::vector<Line> lines;
    for (auto& r : p.rows()) lines.push_back({kind_of(r.name), r});
    lines.push_back({"other", {.name = "other", .stream = p.compute().name(), .calls = 0, .seconds = other}});
    for (auto& r : p.stages()) lines.push_back({"stage", r});

    // The table: people read it on stderr; stdout carries data only.
    {
        std::lock_guard lock(log::stderr_mutex());
        std::FILE* f = stderr;
        std::fprintf(f, "# zinf-train --profile: %s, %s, batch %llu x %llu, %s %u %s, rank %d: %llu steps, %.4f s\n",
                     run.model.c_str(), run.precision.c_str(), static_cast<unsigned long long>(run.batch),
                     static_cast<unsigned long long>(run.seq), dev.backend().c_str(), dev.threads(),
                     dev.backend() == "cuda" ? "SMs" : "threads", run.rank,
                     static_cast<unsigned long long>(p.steps()), step);
        std::fprintf(f, "# peaks in this run: %s %.2f GFLOP/s, device copy %.2f GB/s (read + write)\n",
                     peaks.flops_peer.c_str(), peaks.flops / 1e9, peaks.bytes / 1e9);
        if (run.model_flops > 0 && step > 0)
            std::fprintf(f, "# model FLOP/s %.2f GFLOP/s: %.1f%% of %s\n",
                         run.model_flops * static_cast<double>(p.steps()) / step / 1e9,
                         100.0 * run.model_flops * static_cast<double>(p.steps()) / step / peaks.flops,
                         peaks.flops_peer.c_str());
        std::fprintf(f, "# share: of the steps' time; floor: FLOPs at the GEMM peak or bytes at the copy peak, "
                        "the longer; x: seconds over floor\n");
        std::fprintf(f, "# %-30s %7s %10s %6s %10s %9s %9s %8s %10s %7s\n", "name", "calls", "seconds", "share",
                     "GFLOP", "GB", "GFLOP/s", "GB/s", "floor_s", "x");
        bool stages = false;
        for (const Line& l : lines) {
            const auto& r = l.row;
            if (l.kind == std::string("stage") && !stages) {
                std::fprintf(f, "# engine stages (each overlaps the kernels above)\n");
                stages = true;
            }
            const double share = step > 0 ? 100 * r.seconds / step : 0.0;
            if (l.kind == std::string("stage") || l.kind == std::string("other")) {  // time only
                std::fprintf(f, "  %-30s %7llu %10.6f %5.1f%%\n", r.name.c_str(),
                             static_cast<unsigned long long>(r.calls), r.seconds, share);
                continue;
            }
            const double fl = device::floor_seconds(r, peaks);
            std::fprintf(f, "  %-30s %7llu %10.6f %5.1f%% %10.3f %9.3f %9.2f %8.2f %10.6f %7.1f\n", r.name.c_str(),
                         static_cast<unsigned long long>(r.calls), r.seconds, share, r.flops / 1e9, r.bytes / 1e9,
                         per_s(r.flops, r.seconds) / 1e9, per_s(r.bytes, r.seconds) / 1e9, fl,
                         fl > 0 ? r.seconds / fl : 0.0);
        }
        if (!shapes.empty())
            std::fprintf(f, "# the costliest GEMM shapes (m x n x k, op(A) op(B), batch, inputs, A and B stored), "
                            "each beside the device's GEMM of that shape alone\n"
                            "# %-50s %7s %10s %6s %9s %13s %6s\n",
                         "gemm", "calls", "seconds", "share", "GFLOP/s", "alone_GFLOP/s", "of");
        if (!no_memory.empty())
            std::fprintf(f, "# (not timed alone: %s)\n", no_memory.c_str());
        for (const Shape& sh : shapes) {
            const auto& r = sh.row;
            const double rate = per_s(r.flops, r.seconds);
            std::fprintf(f, "  %-50s %7llu %10.6f %5.1f%% %9.2f %13.2f %5.0f%%\n", r.name.c_str() + 5,
                         static_cast<unsigned long long>(r.calls), r.seconds, step > 0 ? 100 * r.seconds / step : 0.0,
                         rate / 1e9, sh.alone / 1e9, sh.alone > 0 ? 100 * rate / sh.alone : 0.0);
        }
        if (p.uncollected())
            std::fprintf(f, "# %zu calls on other streams had not run when the last step was read: not counted\n",
                         p.uncollected());
    }
    if (!json) return;
    nlohmann::json head;
    head["schema"] = "zinf.profile/1";
    head["kind"] = "step";
    head["name"] = "step";
    head["model"] = run.model;
    head["precision"] = run.precision;
    head["batch"] = run.batch;
    head["seq"] = run.seq;
    head["rank"] = run.rank;
    head["device"] = dev.backend();
    head["threads"] = dev.threads();
    head["steps"] = p.steps();
    head["seconds"] = step;
    head["compute_s"] = p.compute_seconds();
    head["model_flops"] = run.model_flops * static_cast<double>(p.steps());
    head["peak_flops_per_s"] = peaks.flops;
    head["peak_flops_peer"] = peaks.flops_peer;
    head["peak_bytes_per_s"] = peaks.bytes;
    head["uncollected"] = p.uncollected();
    std::cout << head.dump() << '\n';
    // A row's record: its kind ("kernel", "copy", "other", "stage" or "gemm_shape") and its figures.
    auto record = [&](const std::string& kind, const auto& r) {
        nlohmann::json j;
        j["schema"] = "zinf.profile/1";
        j["kind"] = kind;
        j["name"] = r.name;
        j["stream"] = r.stream;
        j["calls"] = r.calls;
        j["seconds"] = r.seconds;
        j["share"] = step > 0 ? r.seconds / step : 0.0;
        j["flops"] = r.flops;
        j["bytes"] = r.bytes;
        j["flops_per_s"] = per_s(r.flops, r.seconds);
        j["bytes_per_s"] = per_s(r.bytes, r.seconds);
        j["floor_s"] = device::floor_seconds(r, peaks);
        return j;
    };
    for (const Line& l : lines) std::cout << record(l.kind, l.row).dump() << '\n';
    for (const Shape& sh : shapes) {
        nlohmann::json j = record("gemm_shape", sh.row);
        if (sh.alone > 0) j["alone_flops_per_s"] = sh.alone;  // absent: not timed (no device memory left)
        std::cout << j.dump() << '\n';
    }
    std::cout.flush();
    if (!std::cout) throw IoError("writing to stdout failed", {errno, "<stdout>", {}, -1});
}

}  // namespace zinf::trainer
