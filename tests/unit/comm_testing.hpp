// Elements of any comm::DType from integers and back, for the comm tests
// (mpi_comm.cpp, test_comm.cpp): small integers, which every dtype holds
// exactly, so that their sums over ranks are exact too.
#pragma once

#include <zinf/comm.hpp>
#include <zinf/util.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

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

}  // namespace zinf::testing
