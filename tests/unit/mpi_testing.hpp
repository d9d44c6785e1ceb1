// What the MPI unit tests (mpi_optim, mpi_train) share: one communicator
// for the whole binary, who this rank is, a seed and strings every rank
// agrees on, collective checks, and a temporary folder rank 0 makes for all.
#pragma once

#include "testing.hpp"

#include <zinf/comm.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace zinf::testing {

using namespace std::chrono_literals;

// ---------------------------------------------------------------------------
// One MPI communicator for the whole binary (MPI starts once per process),
// with a timeout so that a bug fails a case instead of hanging the job.
inline comm::Options world_options() {
    comm::Options o;
    o.backend = comm::Backend::mpi;
    o.memory = comm::Memory::host;
    const char* env = std::getenv("ZINF_COMM_TIMEOUT");
    o.timeout = env && *env ? comm::default_timeout() : std::chrono::milliseconds(60s);
    return o;
}

inline comm::Communicator& world() {
    static comm::Communicator c(world_options());
    return c;
}

inline unsigned dp() { return static_cast<unsigned>(world().size()); }
inline unsigned me() { return static_cast<unsigned>(world().rank()); }
inline std::string where() { return "rank " + std::to_string(me()) + " of " + std::to_string(dp()); }
inline bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)); }

inline std::uint64_t shared_seed(const char* what) {
    std::uint64_t s = me() == 0 ? seed(what) : 0;
    world().broadcast(std::as_writable_bytes(std::span(&s, 1)), comm::DType::i64, 0);
    return s;
}

inline std::string broadcast_string(std::string s, int root) {
    std::int64_t n = static_cast<std::int64_t>(s.size());
    world().broadcast(std::as_writable_bytes(std::span(&n, 1)), comm::DType::i64, root);
    s.resize(static_cast<std::size_t>(n));
    world().broadcast(std::as_writable_bytes(std::span(s.data(), s.size())), comm::DType::u8, root);
    return s;
}

// Whether `ok` holds on every rank (a collective: every rank must call it).
inline bool all_ranks(bool ok) {
    std::int32_t v = ok ? 1 : 0, all = 0;
    world().allreduce(std::as_bytes(std::span(&v, 1)), std::as_writable_bytes(std::span(&all, 1)),
                      comm::DType::i32, comm::Reduce::sum);
    return all == world().size();
}

// Every rank's value of `v`, in rank order.
inline std::vector<double> gather_all(double v) {
    std::vector<double> all(dp());
    world().allgather(std::as_bytes(std::span(&v, 1)), std::as_writable_bytes(std::span(all)), comm::DType::f64);
    return all;
}

// A folder under /var/tmp that rank 0 makes (and removes), its path on every rank.
struct SharedDir {
    std::optional<TempDir> tmp;
    std::string root;
    SharedDir() {
        if (me() == 0) {
            try {
                tmp.emplace("/var/tmp");
                root = tmp->path.string();
            } catch (const std::exception& e) {
                BOOST_ERROR("temporary directory: " << e.what());
            }
        }
        root = broadcast_string(root, 0);
    }
};

}  // namespace zinf::testing
