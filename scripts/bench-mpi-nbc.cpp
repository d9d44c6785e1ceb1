// Why zinf's MPI backend runs one buffer through MPI's blocking collectives:
// the same reduce-scatter and allgather timed three ways, interleaved per
// iteration — blocking (coll/tuned), non-blocking tested in a loop and
// non-blocking waited (coll/libnbc) — median and best of the slowest rank.
// Built and run by scripts/bench-comm.sh.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
    int provided = 0, rank = 0, n = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char* names[] = {"blocking", "nb+test", "nb+wait"};
    if (rank == 0) std::printf("# %-14s %10s %10s %12s %12s\n", "op", "bytes", "mode", "median_us", "best_us");
    for (int op = 0; op < 2; ++op)
        for (size_t bytes : {size_t(1) << 20, size_t(4) << 20, size_t(16) << 20}) {
            const size_t count = bytes / 4 / static_cast<size_t>(n);
            std::vector<float> big(count * static_cast<size_t>(n), 1.0f), small(count, 1.0f);
            std::vector<double> t[3];
            for (int it = 0; it < 45; ++it)
                for (int mode = 0; mode < 3; ++mode) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    const double t0 = MPI_Wtime();
                    MPI_Request q;
                    if (op == 0) {
                        if (mode == 0)
                            MPI_Reduce_scatter_block(big.data(), small.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                        else
                            MPI_Ireduce_scatter_block(big.data(), small.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
                    } else {
                        if (mode == 0)
                            MPI_Allgather(small.data(), int(count), MPI_FLOAT, big.data(), int(count), MPI_FLOAT, MPI_COMM_WORLD);
                        else
                            MPI_Iallgather(small.data(), int(count), MPI_FLOAT, big.data(), int(count), MPI_FLOAT, MPI_COMM_WORLD, &q);
                    }
                    if (mode == 1)
                        for (int done = 0; !done;) MPI_Test(&q, &done, MPI_STATUS_IGNORE);
                    if (mode == 2) MPI_Wait(&q, MPI_STATUS_IGNORE);
                    double d = MPI_Wtime() - t0, slowest = 0;
                    MPI_Allreduce(&d, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                    if (it >= 5) t[mode].push_back(slowest);
                }
            if (rank == 0)
                for (int mode = 0; mode < 3; ++mode) {
                    std::sort(t[mode].begin(), t[mode].end());
                    std::printf("  %-14s %10zu %10s %12.1f %12.1f\n", op == 0 ? "reduce-scatter" : "allgather", bytes,
                                names[mode], t[mode][t[mode].size() / 2] * 1e6, t[mode][0] * 1e6);
                }
        }
    MPI_Finalize();
}
