// zinf zero, first part: partitioned tensors over the data-parallel ranks
// (bandwidth-centric partitioning, paper §6.1). Every tensor is split over
// all ranks by shard::owned, the rule zinf-shard lays partitions out with; a
// rank holds its partition as stored: per = ceil(numel/dp) elements, the
// tail past the tensor's end being padding.
//
//   gather:         own partition (per elements)   -> the full tensor (numel) on every rank
//   reduce_scatter: the full gradient (numel) on every rank -> own partition of the average
//
// Only real elements travel: gather reads the first `count` elements of each
// partition, reduce_scatter writes them and leaves the padding as it was, so
// padding never reaches a caller's full tensor. A list of tensors is one
// collective (a bucket). Buffers live where the communicator's memory says.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/shard.hpp>

#include <cstdint>
#include <span>

namespace zinf::zero {

using shard::owned;
using shard::Owned;

struct Gather {
    std::span<const std::byte> own;  // this rank's partition: per elements
    std::span<std::byte> full;       // numel elements
    std::uint64_t numel = 0;
};

struct Scatter {
    std::span<const std::byte> full;  // numel elements: this rank's whole gradient
    std::span<std::byte> own;         // per elements: the real ones get the result
    std::uint64_t numel = 0;
};

comm::Handle start_gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype);
void gather(comm::Communicator& comm, std::span<const Gather> tensors, comm::DType dtype);
void gather(comm::Communicator& comm, const Gather& tensor, comm::DType dtype);

// reduce defaults to the average, as gradients want.
comm::Handle start_reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                                  comm::Reduce reduce = comm::Reduce::avg);
void reduce_scatter(comm::Communicator& comm, std::span<const Scatter> tensors, comm::DType dtype,
                    comm::Reduce reduce = comm::Reduce::avg);
void reduce_scatter(comm::Communicator& comm, const Scatter& tensor, comm::DType dtype,
                    comm::Reduce reduce = comm::Reduce::avg);

}  // namespace zinf::zero
