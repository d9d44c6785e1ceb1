// Partitioned tensors: the partition rule turned into per-rank block counts,
// so one allgather(v) or reduce-scatter(v) moves the real elements only.
#include <zinf/zero.hpp>

#include <type_traits>
#include <vector>

namespace zinf::zero {
namespace {

// Elements each rank really holds of a tensor of `numel`.
std::vector<std::uint64_t> counts(std::uint64_t numel, int dp) {
    std::vector<std::uint64_t> c(static_cast<std::size_t>(dp));
    for (int r = 0; r < dp; ++r) c[static_cast<std::size_t>(r)] = owned(numel, static_cast<unsigned>(dp), static_cast<unsigned>(r)).count;
    return c;
}

void expect(std::size_t got, std::uint64_t elements, std::size_t es, std::size_t i, const char* what, const char* op) {
    if (got != elements * es)
        throw InternalError(std::string("zero::") + op + ", tensor " + std::to_string(i) + ": " + what + " has " +
                            std::to_string(got) + " bytes, want " + std::to_string(elements * es));
}

// One comm::Buffer per tensor: the real elements of this rank's partition on
// one side (send for gather, recv for reduce-scatter), the full tensor on the
// other, and every rank's count.
template <class T>
std::vector<comm::Buffer> buffers(const comm::Communicator& comm, std::span<const T> tensors, comm::DType dtype,
                                  const char* op) {
    const std::size_t es = comm::dtype_bytes(dtype);
    const auto dp = static_cast<unsigned>(comm.size()), me = static_cast<unsigned>(comm.rank());
    std::vector<comm::Buffer> bufs;
    bufs.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const T& t = tensors[i];
        const Owned o = owned(t.numel, dp, me);
        expect(t.own.size(), o.per, es, i, "the partition", op);
        expect(t.full.size(), t.numel, es, i, "the full tensor", op);
        if constexpr (std::is_same_v<T, Gather>)
            bufs.push_back({t.own.first(o.count * es), t.full, counts(t.numel, comm.size())});
        else
            bufs.push_back({t.full, t.own.first(o.count * es), counts(t.numel, comm.size())});
    }
    return bufs;
}

// Every tensor's counts, one vector each.
std::vector<std::vector<std::uint64_t>> all_counts(std::span<const std::uint64_t> numels, int dp) {
    std::vector<std::vector<std::uint64_t>> all;
    all.reserve(numels.size());
    for (const std::uint64_t n : numels) all.push_back(counts(n, dp));
    return all;
}

}  // namespace

comm::Handle start_gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype) {
    const auto bufs = buffers(comm, tensors, dtype, "gather");
    return comm.start(comm::Kind::allgather, bufs, dtype);
}

void gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype) {
    const auto bufs = buffers(comm, tensors, dtype, "gather");
    comm.run(comm::Kind::allgather, bufs, dtype);
}

void gather(comm::Communicator& comm, const Gather& tensor, comm::DType dtype) {
    gather(comm, std::span(&tensor, 1), dtype);
}

comm::Handle start_reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                                  comm::Reduce reduce) {
    const auto bufs = buffers(comm, tensors, dtype, "reduce_scatter");
    return comm.start(comm::Kind::reduce_scatter, bufs, dtype, reduce);
}

void reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                    comm::Reduce reduce) {
    const auto bufs = buffers(comm, tensors, dtype, "reduce_scatter");
    comm.run(comm::Kind::reduce_scatter, bufs, dtype, reduce);
}

void reduce_scatter(comm::Communicator& comm, const Scatter& tensor, comm::DType dtype, comm::Reduce reduce) {
    reduce_scatter(comm, std::span(&tensor, 1), dtype, reduce);
}

std::uint64_t flat_bytes(const comm::Communicator& comm, comm::Kind kind, std::span<const std::uint64_t> numels,
                         comm::DType dtype) {
    return comm.flat_bytes(kind, all_counts(numels, comm.size()), dtype);
}

std::uint64_t laid_flat_bytes(comm::Kind kind, std::span<const std::uint64_t> numels, comm::DType dtype, unsigned dp) {
    const int size = static_cast<int>(dp);
    return comm::laid_flat_bytes(kind, all_counts(numels, size), dtype, size);
}

void enqueue_gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype, void* stream,
                    void* after) {
    const auto bufs = buffers(comm, tensors, dtype, "gather");
    comm.enqueue(comm::Kind::allgather, bufs, dtype, stream, after);
}

void enqueue_reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                            void* stream, void* after, comm::Reduce reduce) {
    const auto bufs = buffers(comm, tensors, dtype, "reduce_scatter");
    comm.enqueue(comm::Kind::reduce_scatter, bufs, dtype, stream, after, reduce);
}

}  // namespace zinf::zero
