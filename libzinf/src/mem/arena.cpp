// DeviceArena: all device memory taken once, carved best-fit with coalescing.
#include <zinf/mem.hpp>

#include "gpu.hpp"

#include <nlohmann/json.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

namespace zinf::mem {

void ArenaConfig::validate() const {
    if (bytes == 0) throw UsageError("--device-memory must be positive");
    if (backend != "auto" && backend != "host" && backend != "cuda")
        throw UsageError("arena backend '" + backend + "' is not one of: auto, host, cuda");
}

json::Json ArenaStats::to_json() const {
    return {{"bytes", bytes},         {"used", used},
            {"peak", peak},           {"free", free},
            {"largest_free", largest_free}, {"allocations", allocations},
            {"fragmentation", fragmentation}};
}

struct DeviceArena::Impl {
    ArenaConfig cfg;
    std::string backend;
    bool gpu = false;
    std::byte* base = nullptr;
    Mmap host;  // the memory on the host backend

    mutable std::mutex mu;
    std::map<std::uint64_t, std::uint64_t> free_at;                 // offset -> size
    std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size;  // (size, offset): best fit
    std::unordered_map<std::uint64_t, std::uint64_t> used_at;       // offset -> rounded size
    std::uint64_t used = 0, peak = 0;

    void add_free(std::uint64_t off, std::uint64_t size) {
        free_at.emplace(off, size);
        free_by_size.emplace(size, off);
    }
    void drop_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
        free_by_size.erase({it->second, it->first});
        free_at.erase(it);
    }
    std::uint64_t largest_free() const { return free_by_size.empty() ? 0 : free_by_size.rbegin()->first; }
};

DeviceArena::DeviceArena(const ArenaConfig& cfg) : impl_(std::make_unique<Impl>()) {
    cfg.validate();
    Impl& m = *impl_;
    m.cfg = cfg;
    std::string why;
    const bool have_gpu = cfg.backend != "host" && gpu::device_count(&why) > 0;
    if (cfg.backend == "cuda" && !have_gpu)
        throw UsageError("the device arena was asked for CUDA memory, but there is " + why);
    // A budget is a limit: rounded down to whole allocation units (a run
    // refused at one byte under its need must not get that byte back here).
    const std::uint64_t bytes = std::max<std::uint64_t>(align_down(cfg.bytes, kArenaAlignment), kArenaAlignment);
    if (have_gpu) {
        if (cfg.gpu >= 0) gpu::set_device(cfg.gpu);
        m.base = static_cast<std::byte*>(gpu::device_alloc(bytes));
        m.gpu = true;
        m.backend = "cuda";
    } else {
        // Not populated: the CPU backend's "device memory" is a budget; pages
        // arrive as they are first used, like any host allocation.
        m.host = Mmap::anonymous(bytes, false, bytes >= Mmap::kHugePage ? Mmap::Pages::huge : Mmap::Pages::any);
        m.base = m.host.data();
        m.backend = "host";
    }
    m.cfg.bytes = bytes;
    m.add_free(0, bytes);
}

DeviceArena::~DeviceArena() {
    Impl& m = *impl_;
    if (!m.used_at.empty())
        log::warn("device arena destroyed with " + std::to_string(m.used_at.size()) + " allocation(s) (" +
                  format_size(m.used) + ") still live");
    if (m.gpu) gpu::device_free(m.base);
}

Block DeviceArena::allocate(std::size_t bytes, std::string_view what) {
    Impl& m = *impl_;
    const std::string who = what.empty() ? "" : " for " + std::string(what);
    std::lock_guard lk(m.mu);
    auto fail = [&](const std::string& why) -> OutOfMemory {
        const std::uint64_t free = m.cfg.bytes - m.used;
        return OutOfMemory("device arena: cannot allocate " + format_size(bytes) + who + ": " + why +
                           " (largest free block " + format_size(m.largest_free()) + ", free " +
                           format_size(free) + " of " + format_size(m.cfg.bytes) + ", " +
                           std::to_string(m.used_at.size()) + " allocations live)");
    };
    if (m.cfg.max_block && bytes > m.cfg.max_block)
        throw fail("larger than --max-block " + format_size(m.cfg.max_block));
    if (bytes > m.cfg.bytes) throw fail("larger than the whole arena");
    // Rounded only once known to fit the arena, so a huge ask cannot wrap.
    const std::uint64_t need = align_up(std::max<std::size_t>(bytes, 1), kArenaAlignment);
    auto it = m.free_by_size.lower_bound({need, 0});
    if (it == m.free_by_size.end())
        throw fail(m.cfg.bytes - m.used >= need ? "no free block is large enough (fragmented)"
                                                : "out of device memory");
    const auto [size, off] = *it;
    m.drop_free(m.free_at.find(off));
    if (size > need) m.add_free(off + need, size - need);
    if (!m.used_at.emplace(off, need).second) throw InternalError("device arena: offset " + std::to_string(off) + " handed out twice");
    m.used += need;
    m.peak = std::max(m.peak, m.used);

    Block b;
    b.arena_ = this;
    b.data_ = m.base + off;
    b.size_ = bytes;
    b.offset_ = off;
    return b;
}

void DeviceArena::free(Block& b) noexcept {
    Impl& m = *impl_;
    std::lock_guard lk(m.mu);
    auto u = m.used_at.find(b.offset_);
    if (u == m.used_at.end()) return;  // cannot happen: Blocks are move-only
    std::uint64_t off = u->first, size = u->second;
    m.used -= size;
    m.used_at.erase(u);
    // Coalesce with the free neighbours on both sides.
    auto next = m.free_at.lower_bound(off);
    if (next != m.free_at.end() && next->first == off + size) {
        size += next->second;
        m.drop_free(next);
    }
    auto prev = m.free_at.lower_bound(off);
    if (prev != m.free_at.begin()) {
        --prev;
        if (prev->first + prev->second == off) {
            off = prev->first;
            size += prev->second;
            m.drop_free(prev);
        }
    }
    m.add_free(off, size);
}

bool DeviceArena::on_gpu() const { return impl_->gpu; }
const std::string& DeviceArena::backend() const { return impl_->backend; }
bool DeviceArena::contains(const void* p) const noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    return impl_->base && b >= impl_->base && b < impl_->base + impl_->cfg.bytes;
}

ArenaStats DeviceArena::stats() const {
    const Impl& m = *impl_;
    std::lock_guard lk(m.mu);
    ArenaStats s;
    s.bytes = m.cfg.bytes;
    s.used = m.used;
    s.peak = m.peak;
    s.free = m.cfg.bytes - m.used;
    s.largest_free = m.largest_free();
    s.allocations = m.used_at.size();
    s.fragmentation = s.free ? 1.0 - static_cast<double>(s.largest_free) / static_cast<double>(s.free) : 0.0;
    return s;
}

static void check_range(const Block& b, std::uint64_t at, std::size_t n, const char* what) {
    if (at > b.size() || n > b.size() - at)
        throw InternalError(std::string(what) + " of " + std::to_string(n) + " bytes at " + std::to_string(at) +
                            " runs past a block of " + std::to_string(b.size()));
}

void DeviceArena::copy_in(Block& dst, std::uint64_t at, std::span<const std::byte> src) {
    check_range(dst, at, src.size(), "copy_in");
    if (impl_->gpu)
        gpu::copy(dst.data() + at, src.data(), src.size(), gpu::Dir::to_device);
    else
        std::memcpy(dst.data() + at, src.data(), src.size());
}

void DeviceArena::copy_out(std::span<std::byte> dst, const Block& src, std::uint64_t at) {
    check_range(src, at, dst.size(), "copy_out");
    if (impl_->gpu)
        gpu::copy(dst.data(), src.data() + at, dst.size(), gpu::Dir::to_host);
    else
        std::memcpy(dst.data(), src.data() + at, dst.size());
}

// ---------------------------------------------------------------------------
Block::Block(Block&& o) noexcept : arena_(o.arena_), data_(o.data_), size_(o.size_), offset_(o.offset_) {
    o.arena_ = nullptr;
}

Block& Block::operator=(Block&& o) noexcept {
    if (this != &o) {
        reset();
        arena_ = o.arena_;
        data_ = o.data_;
        size_ = o.size_;
        offset_ = o.offset_;
        o.arena_ = nullptr;
    }
    return *this;
}

Block::~Block() { reset(); }

void Block::reset() noexcept {
    if (!arena_) return;
    arena_->free(*this);
    arena_ = nullptr;
    data_ = nullptr;
    size_ = 0;
}

// ---------------------------------------------------------------------------
GpuInfo gpu_info() {
    GpuInfo g;
    g.count = gpu::device_count(&g.why_not);
    if (g.count > 0) {
        g.name = gpu::device_name(0);
        g.bytes = gpu::device_memory(0);
    }
    return g;
}

}  // namespace zinf::mem
