// zinf-commbench: allgather / reduce-scatter / allreduce bus bandwidth per
// message size through zinf's communicator, like nccl-tests, with the bare
// library call beside it (--raw). Run under mpirun or srun; see
// man/zinf-commbench.1 for the columns and their formulas.
#include "harness.hpp"

#include <zinf/cli.hpp>
#include <zinf/options.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <csignal>
#include <sstream>
#include <iostream>

using namespace zinf;
using namespace zinf::commbench;

namespace {

struct Options {
    // Several of each (-o a,b -d x,y): one table per op, dtype and reduction,
    // in the order given, from one launch (allgather once per dtype).
    std::vector<std::string> ops{"allgather"}, dtypes{"f32"}, reduces{"sum"};
    std::string min_bytes = "1KiB", max_bytes = "32MiB", step_bytes;
    double factor = 2;
    unsigned iters = 20, warmup = 5, rounds = 3;
    bool check = false, raw = false, json = false;
    double min_ratio = 0;
    cli::CommOptions comm;
};

// The sizes and the timing, shared by every table.
Spec make_spec(const Options& o) {
    Spec s;
    s.min_bytes = cli::parse_sizes({o.min_bytes}, "--minbytes")[0];
    s.max_bytes = cli::parse_sizes({o.max_bytes}, "--maxbytes")[0];
    if (!o.step_bytes.empty()) s.step_bytes = cli::parse_sizes({o.step_bytes}, "--stepbytes")[0];
    if (s.min_bytes == 0 || s.min_bytes > s.max_bytes)
        throw UsageError("--minbytes " + o.min_bytes + " must be positive and at most --maxbytes " + o.max_bytes);
    if (!o.step_bytes.empty() && s.step_bytes == 0) throw UsageError("--stepbytes must be positive");
    if (o.step_bytes.empty() && !(o.factor > 1)) {
        std::ostringstream f;
        f << o.factor;
        throw UsageError("--stepfactor " + f.str() + " must be more than 1");
    }
    s.factor = o.factor;
    s.iters = o.iters;
    s.warmup = o.warmup;
    s.rounds = o.rounds;
    s.check = o.check;
    s.raw = o.raw;
    if (o.min_ratio > 0 && !o.raw) throw UsageError("--min-ratio compares with the bare call: add --raw");
    return s;
}

// One Spec per table: every op, dtype and reduction asked for, in that order;
// allgather, which reduces nothing, once per dtype.
std::vector<Spec> make_specs(const Options& o) {
    const Spec base = make_spec(o);
    std::vector<Spec> specs;
    for (const auto& op : o.ops)
        for (const auto& dtype : o.dtypes)
            for (const auto& reduce : o.reduces) {
                Spec s = base;
                s.op = op == "allgather" ? comm::Kind::allgather
                     : op == "reduce-scatter" ? comm::Kind::reduce_scatter
                                              : comm::Kind::allreduce;
                s.dtype = comm::parse_dtype(dtype);
                s.reduce = reduce == "avg" ? comm::Reduce::avg : reduce == "max" ? comm::Reduce::max : comm::Reduce::sum;
                if (s.op == comm::Kind::allgather && reduce != o.reduces.front()) continue;
                specs.push_back(s);
            }
    return specs;
}

// What one table found: the elements that differed (--check) and the lowest
// zinf/raw from 1MiB (--raw).
struct Outcome {
    std::uint64_t wrong = 0;
    double worst_ratio = 0;
    std::uint64_t worst_at = 0;
};

// One table (or its JSON records), printed by rank 0: every size of `list`.
Outcome measure(const Spec& spec, const std::vector<std::uint64_t>& list, std::uint64_t judged, bool json,
                comm::Communicator& data, comm::Communicator& meta) {
    const bool lead = data.rank() == 0;
    Bench bench(spec, data, meta);
    if (lead && !json) print_header(std::cout, spec, data);
    Outcome got;
    double sum_busbw = 0;
    for (std::uint64_t bytes : list) {
        const Row r = bench.measure(bytes);
        sum_busbw += r.busbw_gbps;
        if (r.wrong) got.wrong += *r.wrong;
        if (spec.raw && bytes >= judged && (got.worst_at == 0 || r.ratio() < got.worst_ratio)) {
            got.worst_ratio = r.ratio();
            got.worst_at = bytes;
        }
        if (!lead) continue;
        if (json)
            std::cout << json::line(row_json(spec, data, r));
        else
            print_row(std::cout, spec, r);
        flush_stdout();
    }
    if (lead && !json) {
        std::cout << "# out of bounds values: "
                  << (spec.check ? std::to_string(got.wrong) + (got.wrong ? " FAILED" : " OK") : "n/a")
                  << "\n# avg bus bandwidth: " << sum_busbw / static_cast<double>(list.size()) << " GB/s\n";
        if (got.worst_at)
            std::cout << "# lowest zinf/raw busbw from 1MiB: " << got.worst_ratio << " at " << format_size(got.worst_at)
                      << "\n";
        flush_stdout();
    }
    return got;
}

int run(const Options& o) {
    const std::vector<Spec> specs = make_specs(o);
    // A closed output pipe (`| head`) is an I/O error (74), not a silent death.
    std::signal(SIGPIPE, SIG_IGN);

    comm::Options co = o.comm.resolve();
    if (co.backend == comm::Backend::automatic) {
        // Device buffers through NCCL when there is a GPU to hold them.
        co.backend = comm::usable(comm::Backend::nccl) ? comm::Backend::nccl : comm::Backend::automatic;
    }
    if (co.backend == comm::Backend::nccl) co.memory = comm::Memory::device;
    comm::Communicator data(co);
    // Timings travel between ranks in host memory.
    std::unique_ptr<comm::Communicator> meta_own;
    if (data.memory() == comm::Memory::device) {
        comm::Options mo = co;
        mo.backend = comm::Backend::mpi;
        mo.memory = comm::Memory::host;
        meta_own = std::make_unique<comm::Communicator>(mo);
    }
    comm::Communicator& meta = meta_own ? *meta_own : data;
    const bool lead = data.rank() == 0;
    const bool only_allgather =
        std::all_of(o.ops.begin(), o.ops.end(), [](const std::string& op) { return op == "allgather"; });
    if (lead && only_allgather && o.reduces != std::vector<std::string>{"sum"}) {
        std::string given;
        for (const auto& r : o.reduces) given += (given.empty() ? "" : ",") + r;
        log::warn("--reduce " + given + " has no meaning for allgather; ignored");
    }

    // Every table's sizes before the first is measured: a usage error
    // leaves stdout empty.
    std::vector<std::vector<std::uint64_t>> lists;
    std::vector<std::uint64_t> judged;  // the ratio is judged from 1MiB up, rounded as the sizes are
    for (const Spec& spec : specs) {
        lists.push_back(sizes(spec, data.size()));
        if (lists.back().empty())
            throw UsageError("no message size from --minbytes " + o.min_bytes + " to --maxbytes " + o.max_bytes +
                             " holds one " + std::string(comm::name(spec.dtype)) + " element per rank");
        judged.push_back(rounded(spec, data.size(), MiB));
        if (o.min_ratio > 0 && lists.back().back() < judged.back())
            throw UsageError("--min-ratio judges sizes of 1MiB and up; --maxbytes " + o.max_bytes + " is below");
    }

    std::uint64_t wrong = 0;
    std::string wrong_in;  // the tables that had any
    Outcome worst;
    for (std::size_t i = 0; i < specs.size(); ++i) {
        const Outcome got = measure(specs[i], lists[i], judged[i], o.json, data, meta);
        if (got.wrong)
            wrong_in += (wrong_in.empty() ? "" : ", ") + std::string(comm::name(specs[i].op)) + " " +
                        std::string(comm::name(specs[i].dtype)) +
                        (specs[i].op == comm::Kind::allgather ? "" : " " + std::string(comm::name(specs[i].reduce)));
        wrong += got.wrong;
        if (got.worst_at && (worst.worst_at == 0 || got.worst_ratio < worst.worst_ratio)) worst = got;
    }
    if (wrong)
        throw DataError(std::to_string(wrong) + " elements differed from what the collective should give (--check): " +
                        wrong_in);
    if (o.min_ratio > 0 && worst.worst_at && worst.worst_ratio < o.min_ratio) {
        std::ostringstream msg;
        msg << "zinf/raw busbw " << worst.worst_ratio << " at " << format_size(worst.worst_at) << " is below --min-ratio "
            << o.min_ratio;
        throw ThresholdError(msg.str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (const int rc = open_standard_fds("zinf-commbench")) return rc;  // first: before anything is opened
    CLI::App app{"zinf-commbench: collective bandwidth per message size through zinf's communicator, like "
                 "nccl-tests (size, count, time, algbw, busbw). Run it under mpirun -np N or srun."};
    cli::Common common;
    cli::add_common(app, common);
    Options o;
    app.add_option("-o,--op", o.ops, "Collective: allgather, reduce-scatter, allreduce (several: a table each)")
        ->check(CLI::IsMember({"allgather", "reduce-scatter", "allreduce"}))
        ->delimiter(',');
    app.add_option("-b,--minbytes", o.min_bytes, "Smallest message (all ranks' data, as nccl-tests counts it)");
    app.add_option("-e,--maxbytes", o.max_bytes, "Largest message");
    auto* f = app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this from one row to the next");
    app.add_option("-i,--stepbytes", o.step_bytes, "Or add this many bytes (instead of -f)")->excludes(f);
    app.add_option("-n,--iters", o.iters, "Timed iterations per round")->check(CLI::Range(1u, 1000000u));
    app.add_option("-w,--warmup", o.warmup, "Untimed iterations before each size")->check(CLI::Range(0u, 1000000u));
    app.add_option("--rounds", o.rounds, "Rounds per size; the best is reported")->check(CLI::Range(1u, 1000u));
    app.add_option("-d,--dtype", o.dtypes, "Element type: f32, bf16, f64 (several: a table each)")
        ->check(CLI::IsMember({"f32", "float", "bf16", "f64", "double"}))
        ->delimiter(',');
    app.add_option("-r,--reduce", o.reduces, "Reduction of reduce-scatter and allreduce: sum, avg, max (several: a table each)")
        ->check(CLI::IsMember({"sum", "avg", "max"}))
        ->delimiter(',');
    app.add_flag("-c,--check", o.check, "Fill fresh data before every iteration and check every result");
    app.add_flag("--raw", o.raw, "Time the bare library call (MPI_Allgather, ncclAllGather, ...) beside zinf's");
    app.add_option("--min-ratio", o.min_ratio,
                   "Exit 75 when zinf's busbw falls below this fraction of the bare call's at 1MiB or more (needs --raw)");
    app.add_flag("--json", o.json, "JSON Lines on stdout (zinf.commbench/1), one record per size");
    o.comm.add(app);
    return cli::run(app, argc, argv, "zinf-commbench", common, [&] { return run(o); });
}
