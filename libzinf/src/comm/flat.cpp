// A bucket laid flat (internal.hpp's FlatPlan): what lets a device library
// that has only equal-block collectives (NCCL: no allgatherv, no
// reduce-scatter-v) move a whole bucket of uneven buffers in one call.
#include "internal.hpp"

#include <algorithm>

namespace zinf::comm::detail {

bool uneven(const std::vector<std::uint64_t>& counts) {
    return std::any_of(counts.begin(), counts.end(), [&](std::uint64_t c) { return c != counts[0]; });
}

bool needs_flat(const Op& op) {
    if (op.kind != Kind::allgather && op.kind != Kind::reduce_scatter) return false;
    return op.bufs.size() > 1 || (op.bufs.size() == 1 && uneven(op.bufs[0].counts));
}

FlatPlan plan_flat(const Op& op, int size) {
    const std::uint64_t es = dtype_bytes(op.dtype);
    const std::uint64_t align = kFlatAlignBytes / es;  // elements; every dtype's size divides 256
    FlatPlan plan;
    plan.es = es;
    plan.at.reserve(op.bufs.size());
    for (const Buffer& b : op.bufs) {
        std::uint64_t widest = 0;
        for (int r = 0; r < size; ++r) widest = std::max(widest, block_count(op, b, r, size));
        plan.at.push_back(plan.block);
        plan.block += align_up(widest, align);
        // Runs of ranks with the same count: their blocks lie back to back in
        // the buffer, `count` apart, and `block` apart in the flat area.
        for (int r = 0; r < size;) {
            const std::uint64_t n = block_count(op, b, r, size);
            int end = r + 1;
            while (end < size && block_count(op, b, end, size) == n) ++end;
            if (n)
                plan.rows.push_back({.buffer = plan.at.size() - 1,
                                     .rank = r,
                                     .ranks = end - r,
                                     .count = n,
                                     .flat = plan.at.back(),
                                     .first = block_first(op, b, r, size)});
            r = end;
        }
    }
    // A run's flat offset is the buffer's place in rank `rank`'s block.
    for (FlatRun& run : plan.rows) run.flat += static_cast<std::uint64_t>(run.rank) * plan.block;
    return plan;
}

void flat_pack(const Op& op, const FlatPlan& plan, std::byte* all, std::byte* mine, const Copy2d& copy) {
    const std::uint64_t es = plan.es, B = plan.area();
    if (op.kind == Kind::allgather) {
        for (std::size_t b = 0; b < op.bufs.size(); ++b) {
            const auto& send = op.bufs[b].send;
            if (!send.empty()) copy(mine + plan.at[b] * es, send.size(), send.data(), send.size(), send.size(), 1);
        }
        return;
    }
    for (const FlatRun& run : plan.rows) {
        const auto& send = op.bufs[run.buffer].send;
        copy(all + run.flat * es, B, send.data() + run.first * es, run.count * es, run.count * es,
             static_cast<std::uint64_t>(run.ranks));
    }
}

void flat_unpack(const Op& op, const FlatPlan& plan, const std::byte* all, const std::byte* mine,
                 const Copy2d& copy) {
    const std::uint64_t es = plan.es, B = plan.area();
    if (op.kind == Kind::allgather) {
        for (const FlatRun& run : plan.rows) {
            const auto& recv = op.bufs[run.buffer].recv;
            copy(recv.data() + run.first * es, run.count * es, all + run.flat * es, B, run.count * es,
                 static_cast<std::uint64_t>(run.ranks));
        }
        return;
    }
    for (std::size_t b = 0; b < op.bufs.size(); ++b) {
        const auto& recv = op.bufs[b].recv;
        if (!recv.empty()) copy(recv.data(), recv.size(), mine + plan.at[b] * es, recv.size(), recv.size(), 1);
    }
}

}  // namespace zinf::comm::detail
