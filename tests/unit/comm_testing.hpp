// For the comm tests (mpi_comm.cpp, test_comm.cpp) and the engine's
// (test_engine.cpp): elements of any comm::DType from integers and back
// (small integers, which every dtype holds exactly, so that their sums over
// ranks are exact too), and a backend that lays buckets flat as NCCL does.
#pragma once

#include "../../libzinf/src/comm/internal.hpp"  // comm::detail::Engine

#include <zinf/comm.hpp>
#include <zinf/util.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zinf::testing {

inline void put_int(comm::DType t, std::byte* p, std::int64_t v) {
    switch (t) {
    case comm::DType::u8: *reinterpret_cast<std::uint8_t*>(p) = static_cast<std::uint8_t>(v); return;
    case comm::DType::i32: {
        const auto x = static_cast<std::int32_t>(v);
        std::memcpy(p, &x, 4);
        return;
    }
    case comm::DType::i64: std::memcpy(p, &v, 8); return;
    case comm::DType::f32: {
        const auto x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        return;
    }
    case comm::DType::f64: {
        const auto x = static_cast<double>(v);
        std::memcpy(p, &x, 8);
        return;
    }
    case comm::DType::bf16: {
        const std::uint16_t x = to_bf16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        return;
    }
    }
}

inline std::int64_t get_int(comm::DType t, const std::byte* p) {
    switch (t) {
    case comm::DType::u8: return std::to_integer<std::int64_t>(*p);
    case comm::DType::i32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        return x;
    }
    case comm::DType::i64: {
        std::int64_t x;
        std::memcpy(&x, p, 8);
        return x;
    }
    case comm::DType::f32: {
        float x;
        std::memcpy(&x, p, 4);
        return static_cast<std::int64_t>(x);
    }
    case comm::DType::f64: {
        double x;
        std::memcpy(&x, p, 8);
        return static_cast<std::int64_t>(x);
    }
    case comm::DType::bf16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return static_cast<std::int64_t>(from_bf16(x));
    }
    }
    return 0;
}

// Rank 0 of `size`, standing for NCCL where the collectives' device memory
// is concerned: it lays buckets flat (or, with lays_flat false, is a host
// backend that lays nothing flat) and records every flat area it is given
// (`areas`, which outlives it); it runs no collective.
class FlatBackend final : public comm::detail::Engine {
public:
    explicit FlatBackend(int size, bool lays_flat = true) : size_(size), lays_flat_(lays_flat) {}
    int rank() const override { return 0; }
    int size() const override { return size_; }
    int local_rank() const override { return 0; }
    int local_size() const override { return 1; }
    comm::Backend kind() const override { return comm::Backend::nccl; }
    std::string describe() const override { return "a fake of " + std::to_string(size_) + " ranks"; }
    void execute(comm::detail::Op& op, const comm::detail::Deadline&) override {
        throw InternalError("no collective here: " + op.what());
    }
    void bare(comm::detail::Op& op) override { throw InternalError("no collective here: " + op.what()); }
    bool lays_flat() const override { return lays_flat_; }
    void set_flat_area(std::span<std::byte> area) override {
        if (!lays_flat_) comm::detail::Engine::set_flat_area(area);
        areas->push_back(area);
    }
    std::shared_ptr<std::vector<std::span<std::byte>>> areas = std::make_shared<std::vector<std::span<std::byte>>>();

private:
    int size_;
    bool lays_flat_;
};

// A communicator over a FlatBackend, and the areas it was given.
struct FlatComm {
    std::shared_ptr<std::vector<std::span<std::byte>>> areas;
    comm::Communicator c;
    explicit FlatComm(int size, bool lays_flat = true) : FlatComm(std::make_unique<FlatBackend>(size, lays_flat)) {}

private:
    explicit FlatComm(std::unique_ptr<FlatBackend> b) : areas(b->areas), c(std::move(b), comm::Memory::device) {}
};

}  // namespace zinf::testing
