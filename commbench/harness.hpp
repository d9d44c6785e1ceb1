// zinf-commbench's harness: for each message size, fill, time and check one
// collective through the communicator (and, with --raw, through the bare
// library call), as nccl-tests' all_gather_perf and reduce_scatter_perf do.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/util.hpp>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace zinf::commbench {

struct Spec {
    comm::Kind op = comm::Kind::allgather;
    comm::DType dtype = comm::DType::f32;
    comm::Reduce reduce = comm::Reduce::sum;
    std::uint64_t min_bytes = 1024, max_bytes = 32 * MiB;
    double factor = 2;             // sizes grow by this factor (-f)
    std::uint64_t step_bytes = 0;  // or by this many bytes (-i), when non-zero
    unsigned iters = 20, warmup = 5, rounds = 3;
    bool check = false, raw = false;
};

// Sizes from min to max, each rounded down to whole elements on every rank;
// sizes that round to nothing are dropped.
std::vector<std::uint64_t> sizes(const Spec& s, int ranks);
// `bytes` rounded down as sizes() rounds (1MiB over 3 ranks of f32: 1048572).
std::uint64_t rounded(const Spec& s, int ranks, std::uint64_t bytes);

// busbw / algbw: (n-1)/n for allgather and reduce-scatter, 2(n-1)/n for
// allreduce (nccl-tests' PERFORMANCE.md).
double bus_factor(comm::Kind op, int ranks);

struct Row {
    std::uint64_t bytes = 0, count = 0;  // the whole message, as nccl-tests counts it
    double time_us = 0, algbw_gbps = 0, busbw_gbps = 0;
    std::optional<std::uint64_t> wrong;  // elements that differed (--check)
    std::optional<double> raw_time_us, raw_algbw_gbps, raw_busbw_gbps;
    // zinf's busbw over the bare call's: the inverse ratio of their times
    // (defined for one rank too, where busbw is 0).
    double ratio() const { return raw_time_us && time_us > 0 ? *raw_time_us / time_us : 0; }
};

class Bench {
public:
    // `data` moves the messages (its memory says host or device); `meta`
    // (host) carries the timings between ranks; they may be the same.
    Bench(const Spec& spec, comm::Communicator& data, comm::Communicator& meta);
    ~Bench();
    Row measure(std::uint64_t bytes);

private:
    struct Buffers;
    double time_round(bool raw, unsigned iters, std::uint64_t bytes, unsigned round, std::uint64_t* wrong);
    Spec spec_;
    comm::Communicator& data_;
    comm::Communicator& meta_;
    std::unique_ptr<Buffers> bufs_;
};

// The table: '#' on every line that is not a row.
void print_header(std::ostream& out, const Spec& s, const comm::Communicator& c);
void print_row(std::ostream& out, const Spec& s, const Row& r);
json::Json row_json(const Spec& s, const comm::Communicator& c, const Row& r);

}  // namespace zinf::commbench
