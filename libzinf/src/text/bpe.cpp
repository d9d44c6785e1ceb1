// The BPE model of a tokenizer.json, as Hugging Face's tokenizers runs it:
// a piece's units (bytes or characters) to ids, unknown units through byte
// fallback or the unknown token, then the merges, lowest rank first and the
// leftmost of equal ranks, until none applies.
#include "hf.hpp"

#include <algorithm>
#include <cstring>
#include <queue>

namespace zinf::text::hf {

BpeCache::BpeCache(std::size_t max_bytes) : max_bytes_(max_bytes) {
    // At most a slot per 64 bytes of the budget (about half full when the
    // arenas are), but grown as words come: a table sized for the budget
    // (6 MiB of slots at 16 MiB) was probed at random by every lookup, and two
    // threads' tables crowded each other out of the shared cache (a second
    // thread cost 39% more time in the lookups; the words of a text are
    // usually far fewer than the budget holds).
    max_slots_ = 1024;
    while (max_slots_ * 64 < max_bytes_) max_slots_ <<= 1;
    slots_.resize(std::min<std::size_t>(max_slots_, 4096));
}

void BpeCache::grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const std::size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key_len == 0) continue;
        std::size_t i = s.hash & mask;
        while (slots_[i].key_len != 0) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

std::uint64_t BpeCache::hash(std::string_view word) {
    return xxh3(std::as_bytes(std::span(word.data(), word.size())));
}

void BpeCache::clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
}

std::span<const Id> BpeCache::get(std::string_view word, std::uint64_t h) const {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (s.key_len == 0) return {};
        if (s.hash == h && s.key_len == word.size() && std::memcmp(keys_.data() + s.key, word.data(), word.size()) == 0)
            return {ids_.data() + s.ids, s.ids_len};
    }
}

void BpeCache::put(std::string_view word, std::uint64_t h, std::span<const Id> ids) {
    if (word.empty() || word.size() > max_bytes_ / 64) return;  // (a huge piece is not worth keeping)
    while ((used_ + 1) * 2 > slots_.size() && slots_.size() < max_slots_) grow();
    if ((used_ + 1) * 2 > slots_.size() || keys_.size() + word.size() + (ids_.size() + ids.size()) * sizeof(Id) > max_bytes_)
        clear();
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = h & mask;
    while (slots_[i].key_len != 0) i = (i + 1) & mask;
    slots_[i] = {h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(word.size()),
                 static_cast<std::uint32_t>(ids_.size()), static_cast<std::uint32_t>(ids.size())};
    keys_.append(word);
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    ++used_;
}

// --- the shared cache ---------------------------------------------------------
// A slot: the hash's high 32 bits, and the entry's offset in the arena in
// 8-byte units plus one (0: empty), so an arena of up to 32 GiB.
namespace {
constexpr std::size_t kEntryAlign = 8;
std::uint64_t slot_of(std::uint64_t hash, std::size_t offset) {
    return (hash & 0xffffffff00000000ull) | (offset / kEntryAlign + 1);
}
}  // namespace

SharedBpeCache::SharedBpeCache(std::size_t max_bytes) {
    // A quarter of the budget for the table at its largest (half full at
    // 48 bytes of entries a word: an entry takes 24 or more), three for the
    // arena. The table grows as words come, from one that stays in a core's
    // cache while the words are few (BpeCache's constructor says why); the
    // arena's pages are taken as entries are written into them (new[] of
    // bytes leaves them untouched).
    max_bytes = std::clamp<std::size_t>(max_bytes, 256 * KiB, 32 * GiB);
    max_slots_ = 4096;
    while (max_slots_ * 2 * 8 <= max_bytes / 4) max_slots_ <<= 1;
    arena_bytes_ = max_bytes - max_bytes / 4;
    arena_.reset(new std::byte[arena_bytes_]);
    auto t = std::make_unique<Table>(Table{4095, std::make_unique<std::atomic<std::uint64_t>[]>(4096)});
    table_.store(t.get(), std::memory_order_release);
    tables_.push_back(std::move(t));
}

SharedBpeCache::~SharedBpeCache() = default;

const SharedBpeCache::Entry* SharedBpeCache::entry(std::uint64_t slot) const {
    return reinterpret_cast<const Entry*>(arena_.get() + ((slot & 0xffffffffu) - 1) * kEntryAlign);
}

std::span<const Id> SharedBpeCache::get(std::string_view word, std::uint64_t h) const {
    const Table& t = *table_.load(std::memory_order_acquire);
    for (std::size_t i = h & t.mask;; i = (i + 1) & t.mask) {
        const std::uint64_t s = t.slots[i].load(std::memory_order_acquire);
        if (s == 0) return {};
        if ((s ^ h) >> 32 != 0) continue;
        const Entry* e = entry(s);
        if (e->hash != h || e->key_len != word.size()) continue;
        const auto* ids = reinterpret_cast<const Id*>(e + 1);
        if (std::memcmp(ids + e->ids_len, word.data(), word.size()) == 0) return {ids, e->ids_len};
    }
}

// Puts `slot` into the first empty slot from the hash's (false: the table
// is more than half full, or `slot` is there already).
bool SharedBpeCache::place(Table& t, std::uint64_t h, std::uint64_t slot) {
    for (std::size_t i = h & t.mask, probes = 0; probes <= t.mask / 2; i = (i + 1) & t.mask, ++probes) {
        std::uint64_t seen = 0;
        if (t.slots[i].compare_exchange_strong(seen, slot, std::memory_order_release, std::memory_order_acquire))
            return true;
        if (seen == slot) return false;
    }
    return false;
}

void SharedBpeCache::grow(Table* from) {
    std::lock_guard lk(grow_mu_);
    if (table_.load(std::memory_order_acquire) != from) return;  // another thread grew it
    const std::size_t n = (from->mask + 1) * 2;
    auto t = std::make_unique<Table>(Table{n - 1, std::make_unique<std::atomic<std::uint64_t>[]>(n)});
    for (std::size_t i = 0; i <= from->mask; ++i)
        if (const std::uint64_t s = from->slots[i].load(std::memory_order_acquire))
            place(*t, entry(s)->hash, s);
    table_.store(t.get(), std::memory_order_release);
    tables_.push_back(std::move(t));
}

bool SharedBpeCache::put(std::string_view word, std::uint64_t h, std::span<const Id> ids) {
    if (word.empty() || word.size() > arena_bytes_ / 64 || full()) return false;
    const std::size_t need =
        (sizeof(Entry) + ids.size() * sizeof(Id) + word.size() + kEntryAlign - 1) / kEntryAlign * kEntryAlign;
    const std::size_t at = arena_used_.fetch_add(need, std::memory_order_relaxed);
    if (at + need > arena_bytes_) {
        full_.store(true, std::memory_order_relaxed);
        return false;
    }
    auto* e = reinterpret_cast<Entry*>(arena_.get() + at);
    e->hash = h;
    e->key_len = static_cast<std::uint32_t>(word.size());
    e->ids_len = static_cast<std::uint32_t>(ids.size());
    auto* id = reinterpret_cast<Id*>(e + 1);
    std::copy(ids.begin(), ids.end(), id);
    std::memcpy(id + ids.size(), word.data(), word.size());
    const std::uint64_t slot = slot_of(h, at);
    for (;;) {
        Table* t = table_.load(std::memory_order_acquire);
        if ((words_.load(std::memory_order_relaxed) + 1) * 2 > t->mask + 1) {
            if (t->mask + 1 >= max_slots_) {
                full_.store(true, std::memory_order_relaxed);
                return false;
            }
            grow(t);
            continue;
        }
        if (!place(*t, h, slot)) return false;  // (another thread's word filled the probe run)
        words_.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
}

namespace {

constexpr std::uint32_t kNoMerge = ~std::uint32_t{0};

struct Merge {
    std::uint32_t rank = kNoMerge;
    Id merged = kNone;
};

Merge find_merge(const Bpe& m, Id a, Id b) {
    const std::uint64_t* v = m.merges.get(std::uint64_t{a} << 32 | b);
    if (!v) return {};
    return {static_cast<std::uint32_t>(*v >> 32), static_cast<Id>(*v)};
}

// Short words: the lowest-ranked pair found by looking at each, merged, and
// again. Quadratic in the length, fastest for the words text is made of.
void merge_short(const Bpe& m, std::vector<Id>& sym) {
    std::uint32_t ranks[128];
    Id merged[128];
    std::size_t n = sym.size();
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const Merge g = find_merge(m, sym[i], sym[i + 1]);
        ranks[i] = g.rank;
        merged[i] = g.merged;
    }
    while (n > 1) {
        std::size_t best = 0;
        for (std::size_t i = 1; i + 1 < n; ++i)
            if (ranks[i] < ranks[best]) best = i;
        if (ranks[best] == kNoMerge) break;
        sym[best] = merged[best];
        for (std::size_t i = best + 1; i + 1 < n; ++i) {
            sym[i] = sym[i + 1];
            if (i + 1 < n - 1) {
                ranks[i] = ranks[i + 1];
                merged[i] = merged[i + 1];
            }
        }
        --n;
        if (best > 0) {
            const Merge g = find_merge(m, sym[best - 1], sym[best]);
            ranks[best - 1] = g.rank;
            merged[best - 1] = g.merged;
        }
        if (best + 1 < n) {
            const Merge g = find_merge(m, sym[best], sym[best + 1]);
            ranks[best] = g.rank;
            merged[best] = g.merged;
        }
    }
    sym.resize(n);
}

// Long words (a run of a thousand spaces or digits): a heap of candidate
// merges by (rank, position) over a linked list, as Hugging Face's
// merge_all; n log n.
void merge_long(const Bpe& m, std::vector<Id>& sym) {
    const std::size_t n = sym.size();
    std::vector<std::int64_t> prev(n), next(n);
    std::vector<std::uint8_t> alive(n, 1);
    for (std::size_t i = 0; i < n; ++i) {
        prev[i] = static_cast<std::int64_t>(i) - 1;
        next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
    }
    struct Cand {
        std::uint32_t rank;
        std::size_t pos;
        Id merged;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
    auto offer = [&](std::size_t i) {
        if (next[i] < 0) return;
        const Merge g = find_merge(m, sym[i], sym[static_cast<std::size_t>(next[i])]);
        if (g.rank != kNoMerge) heap.push({g.rank, i, g.merged});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) offer(i);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        if (!alive[c.pos] || next[c.pos] < 0) continue;
        const auto j = static_cast<std::size_t>(next[c.pos]);
        const Merge g = find_merge(m, sym[c.pos], sym[j]);
        if (g.rank != c.rank || g.merged != c.merged) continue;  // a stale candidate
        sym[c.pos] = c.merged;
        alive[j] = 0;
        next[c.pos] = next[j];
        if (next[j] >= 0) prev[static_cast<std::size_t>(next[j])] = static_cast<std::int64_t>(c.pos);
        if (prev[c.pos] >= 0) offer(static_cast<std::size_t>(prev[c.pos]));
        offer(c.pos);
    }
    std::size_t k = 0;
    for (std::size_t i = 0; i < n; ++i)
        if (alive[i]) sym[k++] = sym[i];
    sym.resize(k);
}

}  // namespace

void bpe_encode(const Bpe& m, std::string_view piece, BpeCache& cache, SharedBpeCache* shared, std::vector<Id>& out,
                std::vector<Id>& sym) {
    if (piece.empty()) return;
    if (m.ignore_merges) {
        if (const auto it = m.units.find(piece); it != m.units.end()) {
            out.push_back(it->second);
            return;
        }
    }
    const std::uint64_t h = BpeCache::hash(piece);
    if (shared) {
        if (const auto hit = shared->get(piece, h); !hit.empty()) {
            out.insert(out.end(), hit.begin(), hit.end());
            return;
        }
    }
    if (!shared || shared->full()) {
        if (const auto hit = cache.get(piece, h); !hit.empty()) {
            out.insert(out.end(), hit.begin(), hit.end());
            return;
        }
    }
    sym.clear();
    // Units not in the vocabulary, as Hugging Face's merge_word: their bytes'
    // <0xXX> tokens, else the unknown token (one for a run when fuse_unk),
    // else nothing.
    Id unk_pending = kNone;
    for (std::size_t i = 0; i < piece.size();) {
        std::size_t len = 1;
        Id id = kNone;
        if (m.byte_level) {
            id = m.byte_ids[static_cast<unsigned char>(piece[i])];
        } else {
            len = utf8_char(piece, i);
            if (len == 0) {
                // Bytes that are not UTF-8 reach only zinf (Hugging Face's take
                // text): each is a unit of its own, mapped only if its <0xXX> is.
                len = 1;
            } else if (const auto it = m.units.find(piece.substr(i, len)); it != m.units.end()) {
                id = it->second;
            }
        }
        if (id != kNone) {
            if (unk_pending != kNone) {
                sym.push_back(unk_pending);
                unk_pending = kNone;
            }
            sym.push_back(id);
        } else {
            bool fell_back = false;
            if (m.byte_fallback) {
                fell_back = true;
                for (std::size_t k = 0; k < len; ++k)
                    if (m.fallback_ids[static_cast<unsigned char>(piece[i + k])] == kNone) fell_back = false;
                if (fell_back)
                    for (std::size_t k = 0; k < len; ++k)
                        sym.push_back(m.fallback_ids[static_cast<unsigned char>(piece[i + k])]);
            }
            if (!fell_back) {
                if (m.unk != kNone) {
                    if (unk_pending != kNone && !m.fuse_unk) sym.push_back(unk_pending);
                    unk_pending = m.unk;
                } else if (!m.byte_level && utf8_char(piece, i) == 0) {
                    throw DataError("byte " + std::to_string(static_cast<unsigned char>(piece[i])) +
                                    " is not UTF-8, and the tokenizer has neither byte fallback for it nor an "
                                    "unknown token");
                }
                // (a character the vocabulary lacks, with no unknown token:
                // dropped, as Hugging Face drops it)
            }
        }
        i += len;
    }
    if (unk_pending != kNone) sym.push_back(unk_pending);
    if (sym.size() <= 128) merge_short(m, sym);
    else merge_long(m, sym);
    out.insert(out.end(), sym.begin(), sym.end());
    if (!shared || !shared->put(piece, h, sym)) cache.put(piece, h, sym);
}

}  // namespace zinf::text::hf
