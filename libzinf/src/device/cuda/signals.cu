// The cuda backend's stream plumbing (kernels.hpp): the check of token and
// target ids before a kernel reads them, and the wait on a host job's flag.
#include "common.cuh"

namespace zinf::device::cuda {

namespace {

__global__ void check_ids_kernel(const std::int32_t* ids, u64 n, u64 V, IdScratch* scratch) {
    for (u64 i = global_id(); i < n; i += grid_threads()) {
        const long long v = ids[i];
        if (v < 0 || static_cast<u64>(v) >= V) atomicMin(&scratch->first_bad, static_cast<unsigned long long>(i));
    }
}

// One thread: moves the first bad index into the record (unless it holds an
// earlier launch's) and resets the scratch for the next check.
__global__ void record_ids_kernel(const std::int32_t* ids, u64 T, u64 V, int kind, u64 ticket, IdScratch* scratch,
                                  IdRecord* rec) {
    const unsigned long long bad = scratch->first_bad;
    if (bad == ~0ull) return;
    if (!rec->set) {
        rec->kind = kind;
        rec->value = ids[bad];
        rec->index = bad;
        rec->ticket = ticket;
        rec->T = T;
        rec->V = V;
        __threadfence_system();
        rec->set = 1;
        __threadfence_system();
    }
    scratch->first_bad = ~0ull;
}

__global__ void reset_scratch_kernel(IdScratch* scratch) { scratch->first_bad = ~0ull; }

__global__ void wait_flag_kernel(const volatile unsigned* flag, unsigned value) {
    while (static_cast<int>(*flag - value) < 0) __nanosleep(1000);
}

}  // namespace

cudaError_t preload_signals() {
    return load_kernels(check_ids_kernel, record_ids_kernel, reset_scratch_kernel, wait_flag_kernel);
}

void find_bad_ids(cudaStream_t s, const std::int32_t* ids, u64 n, u64 T, u64 V, int kind, u64 ticket,
                  IdScratch* scratch, IdRecord* rec) {
    if (n == 0) return;
    check_ids_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, n, V, scratch);
    record_ids_kernel<<<1, 1, 0, s>>>(ids, T, V, kind, ticket, scratch, rec);
}

void reset_scratch(cudaStream_t s, IdScratch* scratch) { reset_scratch_kernel<<<1, 1, 0, s>>>(scratch); }

void wait_flag(cudaStream_t s, const unsigned* flag, unsigned value) {
    wait_flag_kernel<<<1, 1, 0, s>>>(flag, value);
}

}  // namespace zinf::device::cuda
