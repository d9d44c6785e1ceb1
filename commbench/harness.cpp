#include "harness.hpp"

#include <zinf/mem.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace zinf::commbench {

using comm::DType;
using comm::Kind;
using comm::Reduce;

std::uint64_t rounded(const Spec& s, int ranks, std::uint64_t bytes) {
    const std::uint64_t unit = comm::dtype_bytes(s.dtype) * static_cast<std::uint64_t>(ranks);
    return bytes / unit * unit;
}

std::vector<std::uint64_t> sizes(const Spec& s, int ranks) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t b = s.min_bytes; b <= s.max_bytes;) {
        const std::uint64_t size = rounded(s, ranks, b);  // whole elements on every rank
        if (size > 0 && (out.empty() || out.back() != size)) out.push_back(size);
        const std::uint64_t next = s.step_bytes ? b + s.step_bytes
                                                : static_cast<std::uint64_t>(std::ceil(static_cast<double>(b) * s.factor));
        if (next <= b) break;
        b = next;
    }
    return out;
}

double bus_factor(Kind op, int n) {
    const double r = static_cast<double>(n);
    switch (op) {
    case Kind::allgather:
    case Kind::reduce_scatter: return (r - 1) / r;
    case Kind::allreduce: return 2 * (r - 1) / r;
    case Kind::broadcast:
    case Kind::barrier: return 1;
    }
    return 1;
}

namespace {

// The data: small integers, so that every sum of them is exact even in bf16
// (at most 255), and every (rank, iteration, element) differs in pattern.
std::uint64_t modulus(const Spec& s, int ranks) {
    if (s.op == Kind::allgather) return 251;
    return std::max<std::uint64_t>(2, 256 / static_cast<std::uint64_t>(ranks));
}
double value(int rank, std::uint64_t iter, std::uint64_t i, std::uint64_t mod) {
    return static_cast<double>((static_cast<std::uint64_t>(rank) * 131 + iter * 17 + i) % mod);
}

void store(std::byte* p, DType t, double v) {
    switch (t) {
    case DType::f32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        return;
    }
    case DType::f64: std::memcpy(p, &v, 8); return;
    case DType::bf16: {
        const std::uint16_t b = to_bf16(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        return;
    }
    default: throw InternalError("commbench: dtype " + std::string(comm::name(t)));
    }
}
double load(const std::byte* p, DType t) {
    switch (t) {
    case DType::f32: {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    case DType::f64: {
        double d;
        std::memcpy(&d, p, 8);
        return d;
    }
    case DType::bf16: {
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        return from_bf16(b);
    }
    default: return 0;
    }
}
// What the reduction of n ranks' values gives, rounded as the backends round.
double reduced(const std::vector<double>& v, Reduce r, DType t) {
    double acc = r == Reduce::max ? v[0] : 0;
    for (double x : v) acc = r == Reduce::max ? std::max(acc, x) : acc + x;
    if (r != Reduce::avg) return acc;
    const double n = static_cast<double>(v.size());
    switch (t) {
    case DType::f32: return static_cast<float>(acc) / static_cast<float>(n);
    case DType::bf16: return from_bf16(to_bf16(static_cast<float>(acc) / static_cast<float>(n)));
    default: return acc / n;
    }
}
// avg may be computed as sum * (1/n) by a backend: one rounding step apart.
bool same(double got, double want, Reduce r, DType t) {
    if (got == want) return true;
    if (r != Reduce::avg) return false;
    const double tol = t == DType::bf16 ? 1.0 / 128 : t == DType::f32 ? 2e-7 : 1e-15;
    return std::abs(got - want) <= tol * std::abs(want);
}

}  // namespace

// Send and receive buffers on the communicator's memory, plus host copies
// for filling and checking device buffers.
struct Bench::Buffers {
    bool device = false;
    AlignedBuffer send_host, recv_host;  // the buffers themselves (host), or staging (device)
    std::unique_ptr<mem::DeviceArena> arena;
    mem::Block send_dev, recv_dev;

    Buffers(std::uint64_t bytes, bool on_device) : device(on_device) {
        send_host = AlignedBuffer::allocate(bytes);
        recv_host = AlignedBuffer::allocate(bytes);
        if (device) {
            mem::ArenaConfig cfg;
            cfg.bytes = 2 * align_up(bytes, mem::kArenaAlignment);
            cfg.backend = "cuda";
            arena = std::make_unique<mem::DeviceArena>(cfg);
            send_dev = arena->allocate(bytes, "commbench send");
            recv_dev = arena->allocate(bytes, "commbench recv");
        }
    }
    std::byte* send() { return device ? send_dev.data() : send_host.data(); }
    std::byte* recv() { return device ? recv_dev.data() : recv_host.data(); }
    void upload(std::uint64_t bytes) {
        if (device) arena->copy_in(send_dev, 0, send_host.bytes().first(bytes));
    }
    void download(std::uint64_t bytes) {
        if (device) arena->copy_out(recv_host.bytes().first(bytes), recv_dev, 0);
    }
};

Bench::Bench(const Spec& spec, comm::Communicator& data, comm::Communicator& meta)
    : spec_(spec), data_(data), meta_(meta),
      bufs_(std::make_unique<Buffers>(std::max<std::uint64_t>(spec.max_bytes, 64), data.memory() == comm::Memory::device)) {}

Bench::~Bench() = default;

double Bench::time_round(bool raw, unsigned iters, std::uint64_t bytes, unsigned round, std::uint64_t* wrong) {
    const int n = data_.size(), me = data_.rank();
    const DType t = spec_.dtype;
    const std::size_t es = comm::dtype_bytes(t);
    const std::uint64_t count = bytes / es, block = count / static_cast<std::uint64_t>(n);
    const std::uint64_t send_count = spec_.op == Kind::allgather ? block : count;
    const std::uint64_t recv_count = spec_.op == Kind::reduce_scatter ? block : count;
    const std::uint64_t mod = modulus(spec_, n);
    const comm::Buffer buf{{bufs_->send(), send_count * es}, {bufs_->recv(), recv_count * es}, {}};

    const auto fill = [&](std::uint64_t iter) {
        std::byte* p = bufs_->send_host.data();
        for (std::uint64_t i = 0; i < send_count; ++i) store(p + i * es, t, value(me, iter, i, mod));
        bufs_->upload(send_count * es);
    };
    const auto verify = [&](std::uint64_t iter) {
        bufs_->download(recv_count * es);
        const std::byte* p = bufs_->recv_host.data();
        std::vector<double> v(static_cast<std::size_t>(n));
        std::uint64_t bad = 0;
        for (std::uint64_t i = 0; i < recv_count; ++i) {
            double want;
            if (spec_.op == Kind::allgather) {
                want = value(static_cast<int>(i / block), iter, i % block, mod);
            } else {
                const std::uint64_t k = spec_.op == Kind::reduce_scatter ? static_cast<std::uint64_t>(me) * block + i : i;
                for (int q = 0; q < n; ++q) v[static_cast<std::size_t>(q)] = value(q, iter, k, mod);
                want = reduced(v, spec_.reduce, t);
            }
            bad += !same(load(p + i * es, t), want, spec_.reduce, t);
        }
        return bad;
    };
    const auto once = [&] {
        if (raw)
            data_.bare(spec_.op, buf, t, spec_.reduce);
        else
            data_.run(spec_.op, std::span(&buf, 1), t, spec_.reduce);
    };

    double seconds = 0;
    if (spec_.check && wrong) {
        for (unsigned it = 0; it < iters; ++it) {
            const std::uint64_t iter = std::uint64_t{round} * iters + it + (raw ? 1u << 20 : 0);
            fill(iter);
            data_.barrier();
            Timer timer;
            once();
            seconds += timer.seconds();
            *wrong += verify(iter);
        }
    } else {
        if (round == 0) fill(0);
        data_.barrier();
        Timer timer;
        for (unsigned it = 0; it < iters; ++it) once();
        seconds = timer.seconds();
    }
    // The slowest rank's time is the collective's time.
    double mean = iters ? seconds / iters : 0, slowest = 0;
    meta_.allreduce(std::as_bytes(std::span(&mean, 1)), std::as_writable_bytes(std::span(&slowest, 1)), DType::f64,
                    Reduce::max);
    return slowest;
}

Row Bench::measure(std::uint64_t bytes) {
    Row row;
    row.bytes = bytes;
    row.count = bytes / comm::dtype_bytes(spec_.dtype);
    std::uint64_t wrong = 0;
    if (spec_.warmup) {
        time_round(false, spec_.warmup, bytes, 0, nullptr);
        if (spec_.raw) time_round(true, spec_.warmup, bytes, 0, nullptr);
    }
    // Rounds alternate between zinf and the bare call, so both meet the
    // same noise; each keeps its best round.
    double best = 0, best_raw = 0;
    for (unsigned r = 0; r < spec_.rounds; ++r) {
        const double t = time_round(false, spec_.iters, bytes, r, &wrong);
        best = r == 0 ? t : std::min(best, t);
        if (spec_.raw) {
            const double tr = time_round(true, spec_.iters, bytes, r, &wrong);
            best_raw = r == 0 ? tr : std::min(best_raw, tr);
        }
    }
    const double factor = bus_factor(spec_.op, data_.size());
    row.time_us = best * 1e6;
    row.algbw_gbps = best > 0 ? static_cast<double>(bytes) / best / 1e9 : 0;
    row.busbw_gbps = row.algbw_gbps * factor;
    if (spec_.raw) {
        row.raw_time_us = best_raw * 1e6;
        row.raw_algbw_gbps = best_raw > 0 ? static_cast<double>(bytes) / best_raw / 1e9 : 0;
        row.raw_busbw_gbps = *row.raw_algbw_gbps * factor;
    }
    if (spec_.check) {
        std::int64_t mine = static_cast<std::int64_t>(wrong), all = 0;
        meta_.allreduce(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(&all, 1)), DType::i64);
        row.wrong = static_cast<std::uint64_t>(all);
    }
    return row;
}

// ---------------------------------------------------------------------------
void print_header(std::ostream& out, const Spec& s, const comm::Communicator& c) {
    out << "# zinf-commbench " << version() << ": " << comm::name(s.op) << " over " << c.size()
        << (c.size() == 1 ? " rank, " : " ranks, ")
        << comm::name(s.dtype) << (s.op == Kind::allgather ? "" : ", " + std::string(comm::name(s.reduce))) << "\n";
    out << "# backend " << c.describe() << "\n";
    out << "# " << s.iters << " iterations after " << s.warmup << " warm-up, "
        << (s.rounds == 1 ? std::string("one round") : "best of " + std::to_string(s.rounds) + " rounds")
        << (s.check ? "; data checked every iteration" : "") << (s.raw ? "; raw = the bare library call" : "") << "\n";
    out << "#\n#" << std::setw(13) << "size" << std::setw(13) << "count" << std::setw(6) << "type" << std::setw(7)
        << "redop" << std::setw(12) << "time(us)" << std::setw(13) << "algbw(GB/s)" << std::setw(13) << "busbw(GB/s)"
        << std::setw(8) << "#wrong";
    if (s.raw) out << std::setw(12) << "raw(us)" << std::setw(13) << "raw_busbw" << std::setw(10) << "zinf/raw";
    out << "\n";
}

void print_row(std::ostream& out, const Spec& s, const Row& r) {
    std::ostringstream line;
    line << std::fixed;
    line << std::setw(14) << r.bytes << std::setw(13) << r.count << std::setw(6) << comm::name(s.dtype) << std::setw(7)
         << (s.op == Kind::allgather ? "none" : comm::name(s.reduce)) << std::setprecision(1) << std::setw(12)
         << r.time_us << std::setprecision(2) << std::setw(13) << r.algbw_gbps << std::setw(13) << r.busbw_gbps
         << std::setw(8) << (r.wrong ? std::to_string(*r.wrong) : "n/a");
    if (r.raw_time_us)
        line << std::setprecision(1) << std::setw(12) << *r.raw_time_us << std::setprecision(2) << std::setw(13)
             << *r.raw_busbw_gbps << std::setprecision(3) << std::setw(10) << r.ratio();
    out << line.str() << "\n";  // (flushed by the caller: flush_stdout says why a write failed)
}

json::Json row_json(const Spec& s, const comm::Communicator& c, const Row& r) {
    json::Json j = {{"schema", "zinf.commbench/1"},
                    {"op", comm::name(s.op)},
                    {"backend", comm::name(c.backend())},
                    {"ranks", c.size()},
                    {"dtype", comm::name(s.dtype)},
                    {"reduce", s.op == Kind::allgather ? "none" : comm::name(s.reduce)},
                    {"bytes", r.bytes},
                    {"count", r.count},
                    {"iters", s.iters},
                    {"time_us", r.time_us},
                    {"algbw_gbps", r.algbw_gbps},
                    {"busbw_gbps", r.busbw_gbps}};
    if (r.wrong) j["wrong"] = *r.wrong;
    if (r.raw_time_us) {
        j["raw_time_us"] = *r.raw_time_us;
        j["raw_algbw_gbps"] = *r.raw_algbw_gbps;
        j["raw_busbw_gbps"] = *r.raw_busbw_gbps;
        j["ratio"] = r.ratio();
    }
    return j;
}

}  // namespace zinf::commbench
