// PinnedPool: a fixed set of page-locked buffers, allocated once, leased with RAII.
#include <zinf/mem.hpp>

#include "gpu.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <utility>

namespace zinf::mem {

using Clock = std::chrono::steady_clock;

// A holder's name is kept in room reserved at start-up (longer names are cut),
// so that a lease never allocates.
constexpr std::size_t kWhoMax = 63;

// ---------------------------------------------------------------------------
// Configuration

void PoolConfig::validate() const {
    if (buffer == 0 || buffer % kPoolAlignment != 0)
        throw UsageError("--pinned-buffer " + format_size(buffer) + " is not a positive multiple of " +
                         format_size(kPoolAlignment) + " (buffers must suit O_DIRECT)");
    if (bytes < buffer)
        throw UsageError("--pinned " + format_size(bytes) + " is smaller than one buffer (--pinned-buffer " +
                         format_size(buffer) + ")");
    if (lease_timeout.count() <= 0) throw UsageError("the pool's lease timeout must be positive");
    if (allocator != "auto" && allocator != "host")
        throw UsageError("pinned allocator '" + allocator + "' is not one of: auto, host");
}

static std::uint64_t size_value(const json::Json& v, const std::string& key, const std::string& where) {
    try {
        if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::uint64_t>();
        if (v.is_string()) return parse_size(v.get<std::string>());
    } catch (const UsageError& e) {
        throw DataError(where + ": key \"" + key + "\": " + e.message());
    }
    throw DataError(where + ": key \"" + key + "\" must be a size (\"64MiB\" or a number of bytes)");
}

PoolConfig PoolConfig::from_json(const json::Json& obj, const std::string& where) {
    if (!obj.is_object()) throw DataError(where + ": the pool configuration must be a JSON object");
    PoolConfig c;
    for (const auto& [key, v] : obj.items()) {
        if (key == "pinned") {
            c.bytes = size_value(v, key, where);
        } else if (key == "pinned_buffer") {
            c.buffer = size_value(v, key, where);
        } else if (key == "lease_timeout") {
            if (!v.is_string()) throw DataError(where + ": key \"lease_timeout\" must be a duration (\"60s\")");
            try {
                c.lease_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                    parse_duration(v.get<std::string>()));
            } catch (const UsageError& e) {
                throw DataError(where + ": key \"lease_timeout\": " + e.message());
            }
        } else if (key == "pinned_allocator") {
            c.allocator = json::get_string(obj, key, where);
        } else if (key != "schema") {
            throw DataError(where + ": unknown key \"" + key +
                            "\" (the pool reads pinned, pinned_buffer, lease_timeout, pinned_allocator)");
        }
    }
    try {
        c.validate();
    } catch (const UsageError& e) {
        throw DataError(where + ": " + e.message());
    }
    return c;
}

json::Json PoolConfig::to_json() const {
    // A size format_size would round ("4.0GiB" for 4GiB + 1) is written in bytes, so from_json reads back the same.
    auto size = [](std::uint64_t v) {
        const std::string text = format_size(v);
        return text.find('.') == std::string::npos ? json::Json(text) : json::Json(v);
    };
    return {{"pinned", size(bytes)},
            {"pinned_buffer", size(buffer)},
            {"lease_timeout", std::to_string(lease_timeout.count()) + "ms"},
            {"pinned_allocator", allocator}};
}

std::string PoolConfig::describe() const {
    return format_size(buffers() * buffer) + " = " + std::to_string(buffers()) + " x " + format_size(buffer);
}

json::Json PoolStats::to_json() const {
    return {{"buffers", buffers},     {"buffer_bytes", buffer_bytes}, {"in_use", in_use},
            {"high_water", high_water}, {"leases", leases},           {"waits", waits},
            {"wait_seconds", wait_seconds}, {"bytes_moved", bytes_moved}, {"locked", locked},
            {"registered", registered}, {"allocator", allocator},     {"pinned", pinned},
            {"pinned_bytes", pinned_bytes}};
}

// ---------------------------------------------------------------------------
// Every live region a pool owns (its buffers, pin()'s regions), for
// from_pool(): start -> end.
namespace {
std::mutex regions_mu;
std::map<std::uintptr_t, std::uintptr_t>& regions() {
    static std::map<std::uintptr_t, std::uintptr_t> r;
    return r;
}
void note_region(const std::byte* p, std::uint64_t bytes) {
    if (!p) return;
    std::lock_guard lk(regions_mu);
    regions()[reinterpret_cast<std::uintptr_t>(p)] = reinterpret_cast<std::uintptr_t>(p) + bytes;
}
void forget_region(const std::byte* p) noexcept {
    if (!p) return;
    std::lock_guard lk(regions_mu);
    regions().erase(reinterpret_cast<std::uintptr_t>(p));
}
}  // namespace

bool from_pool(const void* p) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(regions_mu);
    auto it = regions().upper_bound(a);
    if (it == regions().begin()) return false;
    --it;
    return a < it->second;
}

// ---------------------------------------------------------------------------
// Shared state: the memory and the book-keeping. Leases hold it too, so a
// lease that outlives its pool never points at freed memory.

struct Lease::State {
    PoolConfig cfg;
    Mmap map;                  // the memory, on the mmap path
    void* cuda_mem = nullptr;  // the memory, on the cudaHostAlloc path
    std::byte* base = nullptr;
    std::size_t count = 0;
    std::uint64_t buf = 0;
    bool locked = false;
    std::string allocator;
    std::vector<io::Registration> regs;
    bool registered = false;
    io::Engine* engine = nullptr;  // pin()'s regions are registered with it too
    std::atomic<std::size_t> pinned{0};
    std::atomic<std::uint64_t> pinned_bytes{0};

    struct Slot {
        bool held = false;
        std::string who;
        std::thread::id thread;
        int tid = 0;
        Clock::time_point since;
    };

    mutable std::mutex mu;
    std::condition_variable cv;
    std::vector<std::size_t> free_list;  // a stack: the buffer used last is warm
    std::vector<Slot> slots;
    // Leases waiting, first come first served: a lease_many(8) is not starved
    // by single leases that keep taking buffers as they come back.
    std::deque<std::uint64_t> queue;
    std::uint64_t next_ticket = 0;
    std::size_t high_water = 0;
    std::uint64_t leases = 0, waits = 0;
    double wait_seconds = 0;
    std::atomic<std::uint64_t> moved{0};

    ~State() {
        forget_region(base);
        if (cuda_mem) gpu::host_free(cuda_mem);  // regs were dropped by ~PinnedPool
    }

    std::span<std::byte> bytes_of(std::size_t i) const { return {base + i * buf, buf}; }

    // Under mu.
    Lease take(const std::shared_ptr<State>& self, std::string_view who) {
        const std::size_t i = free_list.back();
        free_list.pop_back();
        Slot& s = slots[i];
        s.held = true;
        s.who.assign(who.substr(0, kWhoMax));
        s.thread = std::this_thread::get_id();
        static thread_local const int tid = static_cast<int>(::syscall(SYS_gettid));
        s.tid = tid;
        s.since = Clock::now();
        ++leases;
        high_water = std::max(high_water, count - free_list.size());
        return Lease(self, i, bytes_of(i));
    }

    void give_back(std::size_t i) noexcept {
        bool wake;
        {
            std::lock_guard lk(mu);
            slots[i].held = false;
            free_list.push_back(i);
            wake = !queue.empty();
        }
        // All waiters: only the first in the queue may take, and it may want several.
        if (wake) cv.notify_all();
    }

    // Under mu.
    std::vector<Holder> holders_locked() const {
        std::vector<Holder> out;
        const auto now = Clock::now();
        for (std::size_t i = 0; i < slots.size(); ++i) {
            const Slot& s = slots[i];
            if (!s.held) continue;
            out.push_back({i, s.who, s.thread, s.tid, std::chrono::duration<double>(now - s.since).count()});
        }
        return out;
    }
};

// "'optimizer' (thread 1234): 4 buffers, held up to 5.1s; 'stream' (thread 1240): 2 buffers, ..."
static std::string describe_holders(const std::vector<Holder>& hs) {
    struct Group {
        std::size_t n = 0;
        double longest = 0;
    };
    std::map<std::pair<std::string, int>, Group> groups;
    for (const auto& h : hs) {
        Group& g = groups[{h.who.empty() ? "(unnamed)" : h.who, h.tid}];
        ++g.n;
        g.longest = std::max(g.longest, h.held_seconds);
    }
    std::ostringstream os;
    os.precision(3);
    bool first = true;
    for (const auto& [key, g] : groups) {
        os << (first ? "" : "; ") << "'" << key.first << "' (thread " << key.second << "): " << g.n
           << (g.n == 1 ? " buffer" : " buffers") << ", held up to " << g.longest << "s";
        first = false;
    }
    return os.str();
}

// ---------------------------------------------------------------------------
// Lease

Lease::Lease(Lease&& o) noexcept
    : state_(std::move(o.state_)), index_(o.index_), bytes_(o.bytes_) {
    o.bytes_ = {};
}

Lease& Lease::operator=(Lease&& o) noexcept {
    if (this != &o) {
        release();
        state_ = std::move(o.state_);
        index_ = o.index_;
        bytes_ = o.bytes_;
        o.bytes_ = {};
    }
    return *this;
}

Lease::~Lease() { release(); }

void Lease::release() noexcept {
    if (!state_) return;
    state_->give_back(index_);
    state_.reset();
    bytes_ = {};
}

// ---------------------------------------------------------------------------
// PinnedPool

static void warn_unlocked(std::uint64_t bytes, int err) {
    rlimit rl{};
    ::getrlimit(RLIMIT_MEMLOCK, &rl);
    const std::string limit = rl.rlim_cur == RLIM_INFINITY ? "unlimited" : format_size(rl.rlim_cur);
    log::warn_once("pool-mlock",
                   "cannot page-lock the " + format_size(bytes) + " pinned pool (mlock: " + std::strerror(err) +
                       "; RLIMIT_MEMLOCK is " + limit +
                       "); running unlocked, so the kernel may swap it out and pins pages per transfer. "
                       "Raise the limit with `ulimit -l unlimited` (or memlock in "
                       "/etc/security/limits.conf, LimitMEMLOCK= for systemd) or grant CAP_IPC_LOCK");
}

PinnedPool::PinnedPool(const PoolConfig& cfg, io::Engine* engine) : state_(std::make_shared<Lease::State>()) {
    cfg.validate();
    Lease::State& s = *state_;
    s.cfg = cfg;
    s.count = cfg.buffers();
    s.buf = cfg.buffer;
    const std::uint64_t total = s.count * s.buf;

    if (cfg.allocator == "auto" && gpu::device_count(nullptr) > 0) {
        // Page-locked by the driver and known to it, so host<->device copies
        // from these buffers run at full PCIe speed.
        s.cuda_mem = gpu::host_alloc(total);
        s.base = static_cast<std::byte*>(s.cuda_mem);
        s.locked = true;
        s.allocator = "cudaHostAlloc";
    } else {
        // Populated now (no page faults inside a transfer), on huge pages where
        // the kernel gives them (fewer pages to lock and to map for DMA).
        s.map = Mmap::anonymous(total, true, total >= Mmap::kHugePage ? Mmap::Pages::huge : Mmap::Pages::any);
        s.base = s.map.data();
        if (int err = s.map.lock(); err != 0) warn_unlocked(total, err);
        s.locked = s.map.locked();
        s.allocator = "mmap";
    }

    note_region(s.base, total);
    s.slots.resize(s.count);
    for (auto& slot : s.slots) slot.who.reserve(kWhoMax);
    s.free_list.reserve(s.count);
    for (std::size_t i = s.count; i-- > 0;) s.free_list.push_back(i);  // buffer 0 leased first

    s.engine = engine;
    if (engine) {
        // Few registrations of up to 1GiB each (io_uring's limit per buffer)
        // cover every buffer: the engine has a few hundred slots, not thousands.
        const std::size_t per = std::max<std::uint64_t>(1, GiB / s.buf);
        s.registered = s.buf <= GiB;
        for (std::size_t i = 0; s.registered && i < s.count; i += per) {
            const std::size_t n = std::min(per, s.count - i);
            auto reg = engine->register_buffer({s.base + i * s.buf, n * s.buf});
            s.registered = reg.active();
            s.regs.push_back(std::move(reg));
        }
        if (!s.registered) s.regs.clear();
    }
    log::debug("pinned pool: " + cfg.describe() + " via " + s.allocator + (s.locked ? ", locked" : ", NOT locked") +
               (s.registered ? ", registered with the io engine" : ""));
}

PinnedPool::~PinnedPool() {
    Lease::State& s = *state_;
    std::vector<Holder> held;
    {
        std::lock_guard lk(s.mu);
        held = s.holders_locked();
    }
    if (!held.empty())
        log::warn("pinned pool destroyed with " + std::to_string(held.size()) +
                  " buffer(s) still leased, kept until returned: " + describe_holders(held));
    // The engine may go away after the pool: drop the registrations now (this
    // waits for pieces in flight that use them).
    s.regs.clear();
}

const PoolConfig& PinnedPool::config() const { return state_->cfg; }
std::size_t PinnedPool::buffers() const { return state_->count; }
std::uint64_t PinnedPool::buffer_bytes() const { return state_->buf; }

Lease PinnedPool::lease(std::string_view who) { return lease(who, state_->cfg.lease_timeout); }

// Waits, under `lk`, until `n` buffers are free; after `timeout` throws,
// naming who asked and who holds what.
static void wait_free(Lease::State& s, std::unique_lock<std::mutex>& lk, std::size_t n, std::string_view who,
                      std::chrono::milliseconds timeout) {
    if (n > s.count)
        throw UsageError("'" + std::string(who) + "' asked for " + std::to_string(n) +
                         " pinned buffers at once; the pool has " + std::to_string(s.count) + " (" +
                         s.cfg.describe() + "): raise --pinned or --pinned-buffer");
    if (s.queue.empty() && s.free_list.size() >= n) return;  // nobody ahead, enough free
    const auto t0 = Clock::now();
    const std::uint64_t me = s.next_ticket++;
    s.queue.push_back(me);
    ++s.waits;
    const bool got =
        s.cv.wait_until(lk, t0 + timeout, [&] { return s.queue.front() == me && s.free_list.size() >= n; });
    const auto pos = std::find(s.queue.begin(), s.queue.end(), me);
    const auto ahead = static_cast<std::size_t>(pos - s.queue.begin());
    s.queue.erase(pos);
    if (!s.queue.empty()) s.cv.notify_all();  // the queue's head may have changed
    s.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    if (got) return;
    std::ostringstream os;
    os.precision(3);
    os << "pinned pool exhausted: '" << (who.empty() ? "(unnamed)" : std::string(who)) << "' waited "
       << std::chrono::duration<double>(timeout).count() << "s for " << n << " of " << s.count << " buffers ("
       << format_size(s.buf) << " each); " << s.free_list.size() << " free when it gave up";
    if (ahead) os << ", " << ahead << " lease(s) queued ahead of it";
    // (Nobody may hold any: the holders returned theirs as the wait ran out,
    // and the leases queued ahead had not taken them yet.)
    const std::string holders = describe_holders(s.holders_locked());
    os << "; held by " << (holders.empty() ? "none at that moment" : holders)
       << " (a lease not returned, or --pinned too small for this many users at once)";
    throw InternalError(os.str());
}

Lease PinnedPool::lease(std::string_view who, std::chrono::milliseconds timeout) {
    Lease::State& s = *state_;
    std::unique_lock lk(s.mu);
    wait_free(s, lk, 1, who, timeout);
    return s.take(state_, who);
}

std::vector<Lease> PinnedPool::lease_many(std::size_t n, std::string_view who) {
    return lease_many(n, who, state_->cfg.lease_timeout);
}

std::vector<Lease> PinnedPool::lease_many(std::size_t n, std::string_view who, std::chrono::milliseconds timeout) {
    Lease::State& s = *state_;
    std::vector<Lease> out;
    out.reserve(n);
    std::unique_lock lk(s.mu);
    wait_free(s, lk, n, who, timeout);
    for (std::size_t i = 0; i < n; ++i) out.push_back(s.take(state_, who));
    return out;
}

Lease PinnedPool::try_lease(std::string_view who) {
    Lease::State& s = *state_;
    std::lock_guard lk(s.mu);
    if (!s.queue.empty() || s.free_list.empty()) return {};  // never ahead of a waiting lease
    return s.take(state_, who);
}

PoolStats PinnedPool::stats() const {
    const Lease::State& s = *state_;
    PoolStats st;
    std::lock_guard lk(s.mu);
    st.buffers = s.count;
    st.buffer_bytes = s.buf;
    st.in_use = s.count - s.free_list.size();
    st.high_water = s.high_water;
    st.leases = s.leases;
    st.waits = s.waits;
    st.wait_seconds = s.wait_seconds;
    st.bytes_moved = s.moved.load(std::memory_order_relaxed);
    st.locked = s.locked;
    st.registered = s.registered;
    st.allocator = s.allocator;
    st.pinned = s.pinned.load();
    st.pinned_bytes = s.pinned_bytes.load();
    return st;
}

// ---------------------------------------------------------------------------
// Pinned

Pinned PinnedPool::pin(std::uint64_t bytes, std::string_view who) {
    Lease::State& s = *state_;
    const std::size_t len = align_up(std::max<std::uint64_t>(bytes, 1), kPoolAlignment);
    Pinned p;
    if (s.cuda_mem) {  // the pool's own allocator: known to the driver, as its buffers are
        p.cuda_ = gpu::host_alloc(len);
        p.data_ = static_cast<std::byte*>(p.cuda_);
        std::memset(p.data_, 0, len);
        p.locked_ = true;
    } else {
        // Populated now, on huge pages from 2MiB (as AlignedBuffer and the
        // pool's own memory), then locked.
        p.map_ = Mmap::anonymous(len, true, len >= Mmap::kHugePage ? Mmap::Pages::huge : Mmap::Pages::any);
        p.data_ = p.map_.data();
        if (int err = p.map_.lock(); err != 0)
            log::warn_once("pinned-mlock", "cannot page-lock the " + std::string(who) + " (" + format_size(len) +
                                               "; mlock: " + std::strerror(err) +
                                               "); it stays pageable, as may other state held in memory");
        p.locked_ = p.map_.locked();
    }
    p.size_ = bytes;
    p.len_ = len;
    if (s.engine && s.registered) {
        // As the pool's buffers: pieces of at most 1GiB, io_uring's limit.
        for (std::size_t at = 0; at < len; at += GiB) {
            auto reg = s.engine->register_buffer({p.data_ + at, std::min<std::size_t>(GiB, len - at)});
            if (!reg.active()) {
                p.regs_.clear();
                break;
            }
            p.regs_.push_back(std::move(reg));
        }
    }
    p.pool_ = state_;
    ++s.pinned;
    s.pinned_bytes += len;
    note_region(p.data_, len);
    return p;
}

Pinned::Pinned(Pinned&& o) noexcept { *this = std::move(o); }

Pinned& Pinned::operator=(Pinned&& o) noexcept {
    if (this == &o) return *this;
    reset();
    pool_ = std::move(o.pool_);
    map_ = std::move(o.map_);
    cuda_ = std::exchange(o.cuda_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    len_ = std::exchange(o.len_, 0);
    locked_ = std::exchange(o.locked_, false);
    regs_ = std::move(o.regs_);
    o.regs_.clear();
    return *this;
}

Pinned::~Pinned() { reset(); }

void Pinned::reset() noexcept {
    regs_.clear();  // before the memory goes
    forget_region(data_);
    if (cuda_) gpu::host_free(cuda_);
    cuda_ = nullptr;
    map_ = Mmap();
    if (pool_) {
        --pool_->pinned;
        pool_->pinned_bytes -= len_;
    }
    pool_.reset();
    data_ = nullptr;
    size_ = len_ = 0;
    locked_ = false;
}

std::vector<Holder> PinnedPool::holders() const {
    std::lock_guard lk(state_->mu);
    return state_->holders_locked();
}

void PinnedPool::count_moved(std::uint64_t bytes) { state_->moved.fetch_add(bytes, std::memory_order_relaxed); }

}  // namespace zinf::mem
