// zinf shard: the model's tensors, their partitions over data-parallel ranks
// and tiers, the manifest that describes them (JSON Lines, man/zinf-manifest.5)
// and the partitioned state on disk: initialised, verified, gathered, resharded.
//
//   auto spec = zinf::shard::ModelSpec::parse("gpt2-124m");
//   auto m = zinf::shard::layout(spec, {.dp = 4});              // no I/O
//   zinf::shard::init(m, "/mnt/nvme/run1", engine, pool, {});   // writes every partition
//   zinf::shard::verify(m, engine, pool, {});                   // DataError on a mismatch
//
// Every tensor is split over all dp ranks (bandwidth-centric partitioning,
// paper §6.1): ceil(numel/dp) elements each, the last partition padded with
// zeros. Values come from Philox keyed by (seed, tensor, element), so any rank
// makes its own partition alone and a tensor's values do not depend on dp.
#pragma once

#include <zinf/io.hpp>
#include <zinf/mem.hpp>
#include <zinf/util.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::comm {
class Communicator;
}

namespace zinf::shard {

// ---------------------------------------------------------------------------
// Model spec: "gpt:layers=12,hidden=768,heads=12,vocab=50257,seq=1024" or a
// preset name (gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-13b, paper-*); or a
// Llama-family decoder, "llama:layers=30,hidden=576,heads=9,kv_heads=3,
// ffn=1536,vocab=49152,seq=2048,rope_theta=10000,tied=1" (keys as Hugging
// Face's config.json: kv_heads num_key_value_heads, ffn intermediate_size,
// tied tie_word_embeddings; eps rms_norm_eps; Llama 3's rope_scaling as
// rope_scale, rope_low, rope_high, rope_orig) or a preset (smollm-135m,
// tinyllama-1.1b, llama-3.2-1b, llama-3.1-8b); or a Qwen2, a Llama whose q,
// k and v projections have biases: "qwen2:" with the Llama's keys, or the
// preset qwen2.5-0.5b.
enum class Arch { gpt, llama, qwen2 };
const char* arch_name(Arch a);  // the spec's prefix: "gpt", "llama", "qwen2"

// Llama 3's rotary frequency scaling (config.json's rope_scaling with
// rope_type "llama3"); factor 0 is none.
struct RopeScaling {
    double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
    std::uint64_t original_max_positions = 8192;
    bool operator==(const RopeScaling&) const = default;
};

struct ModelSpec {
    std::uint64_t layers = 0, hidden = 0, heads = 0, vocab = 50257, seq = 1024;
    std::string preset;  // the preset it came from, "" for an explicit spec
    Arch arch = Arch::gpt;
    // The Llama family's own (zero for a GPT):
    std::uint64_t kv_heads = 0, ffn = 0;  // key-value heads (grouped-query attention), the MLP's width
    double rope_theta = 10000, norm_eps = 1e-5;
    bool tied = true;                     // the output head is the embedding (a GPT's always is)
    RopeScaling rope_scaling;

    // UsageError naming the text and the bad key.
    static ModelSpec parse(std::string_view text);
    // The canonical explicit form, what the manifest header stores.
    std::string to_string() const;
    // Exact parameter count. GPT: V*C + T*C + L*(12C^2 + 13C) + 2C (the
    // output projection is tied to wte, so it adds nothing). Llama:
    // V*C + L*(2C + C*(H + 2*KV)*hd + H*hd*C + 3*C*F) + C, plus V*C untied;
    // a Qwen2's L*(H + 2*KV)*hd biases more.
    std::uint64_t parameters() const;
    // The paper's estimate, 12 * layers * hidden^2 (§3).
    std::uint64_t paper_estimate() const { return 12 * layers * hidden * hidden; }
    // As its family declares (zinf/family.hpp): Llama-shaped (RMSNorm,
    // rotary, grouped-query attention, SwiGLU: zinf/llama.hpp's modules,
    // Hugging Face's names), Llama's and Qwen2's; q, k and v projections
    // with biases, Qwen2's.
    bool llama() const;
    bool qkv_bias() const;
    std::uint64_t head_dim() const { return heads ? hidden / heads : 0; }
    bool operator==(const ModelSpec& o) const {
        return arch == o.arch && layers == o.layers && hidden == o.hidden && heads == o.heads && vocab == o.vocab &&
               seq == o.seq && kv_heads == o.kv_heads && ffn == o.ffn && rope_theta == o.rope_theta &&
               norm_eps == o.norm_eps && tied == o.tied && rope_scaling == o.rope_scaling;
    }
};

// A named model of a family (its entry's presets, family.hpp): the explicit
// spec of the shape its source publishes.
struct Preset {
    const char* name;    // "gpt2-124m", "llama-3.2-1b"
    const char* spec;    // the explicit form ("gpt:layers=12,hidden=768,heads=12")
    const char* label;   // the size its source gives it ("1.5B", "1T")
    const char* source;  // "GPT-2", "paper Fig. 6a", the Hugging Face repository its config.json is from
};

// ---------------------------------------------------------------------------
// Tensors in execution order, GPT-2 names and shapes (Conv1D weights are
// (in, out)). With tile > 1 every linear weight is split along its output
// columns into `tile` tensors "<name>.tile<k>" (memory-centric tiling,
// §5.1.3); a tile's values are the same columns of the untiled weight.
// A Llama's tensors have Hugging Face's names and shapes (linear weights
// (out, in), as torch's nn.Linear keeps them): model.embed_tokens.weight,
// model.layers.<l>.input_layernorm.weight, ...self_attn.{q,k,v,o}_proj.weight,
// ...post_attention_layernorm.weight, ...mlp.{gate,up,down}_proj.weight,
// model.norm.weight, and lm_head.weight when untied; tiled, a linear weight
// splits along its output rows (its tile is consecutive elements of it). A
// Qwen2's ...self_attn.{q,k,v}_proj.bias follow their weights, whole.
enum class InitKind { normal, residual, zeros, ones };

struct Tensor {
    std::string name;                 // "h.0.attn.c_attn.weight.tile1"
    std::vector<std::uint64_t> shape;
    std::uint64_t numel = 0;
    InitKind init = InitKind::zeros;
    // Where its elements sit in the untiled tensor that keys the generator:
    // element (i, j) of the tile is (i, col0 + j) of `key` with rows of
    // `key_cols` elements. Untiled: key == name, key_cols = cols = numel.
    std::string key;
    std::uint64_t cols = 0, key_cols = 0, col0 = 0;
};
std::vector<Tensor> tensors(const ModelSpec& spec, unsigned tile = 1);
// How many tensors tensors(spec, tile) lists, without listing them:
// 4 + layers * (8 + 4 * tile) for a GPT, 2 + !tied + layers * (2 + 7 * tile)
// for a Llama, 3 more a layer for a Qwen2. Callers check a size before they allocate it.
std::uint64_t tensor_count(const ModelSpec& spec, unsigned tile = 1);
// The name of tile k of a linear weight, for every model: "<weight>.tile<k>".
std::string tile_name(const std::string& weight, unsigned k);
// The output features [first, last) tile k of `tiles` holds of `out`.
inline std::uint64_t tile_first(std::uint64_t out, unsigned k, unsigned tiles) { return out * k / tiles; }

// ---------------------------------------------------------------------------
enum class DType { bf16, fp32 };
std::size_t dtype_bytes(DType t);
const char* dtype_name(DType t);
DType parse_dtype(std::string_view s);  // UsageError

enum class Tier { gpu, cpu, nvme };
const char* tier_name(Tier t);
Tier parse_tier(std::string_view s);    // UsageError

inline constexpr const char* kManifestSchema = "zinf.manifest/1";

struct LayoutOptions {
    unsigned dp = 1;
    unsigned tile = 1;
    DType param_dtype = DType::bf16;
    Tier param_tier = Tier::nvme;
    Tier optim_tier = Tier::nvme;  // master, exp_avg, exp_avg_sq; gradients follow it
    bool train = true;             // false: the param state only (inference)
    std::uint64_t alignment = 4096;
    std::uint64_t seed = 0x5eed;
};

// The partition rule, one definition for every module (zinf-shard's layout,
// the ZeRO engine's gather and reduce-scatter): a tensor of `numel` elements
// over `dp` ranks gives each rank a partition of per = ceil(numel/dp)
// elements; rank r holds elements [first, first + count) of the tensor and
// per - count elements of zero padding (count is 0 past the end).
struct Owned {
    std::uint64_t first = 0, count = 0, per = 0;
    std::uint64_t last() const { return first + count; }
};
Owned owned(std::uint64_t numel, unsigned dp, unsigned rank);

// The dtype a state is stored in: param's own, fp32 for the optimizer's.
DType state_dtype(const LayoutOptions& o, const std::string& state);

// One (tensor, rank, state) partition.
struct Partition {
    std::size_t tensor = 0;          // index into Manifest::tensors (execution order)
    unsigned rank = 0;
    std::string state;               // "param", "master", ...
    DType dtype = DType::fp32;
    Tier tier = Tier::nvme;
    std::uint64_t first = 0, last = 0;  // elements [first, last) of the tensor; last <= numel
    std::string file;                // relative to the data directory
    std::uint64_t offset = 0;        // bytes into the file, aligned
    std::uint64_t bytes = 0;         // ceil(numel/dp) * dtype bytes, padding included
    std::optional<std::uint64_t> xxh3;  // of those bytes, after init
    std::uint64_t step = 0;          // optimizer steps applied to these values (0: as initialised)
    std::size_t line = 0;            // where it was read from (0: made here)
    json::Value extra;  // keys this version does not know, kept
};

struct Manifest {
    ModelSpec spec;
    LayoutOptions opts;
    std::vector<std::string> states;  // present, in file order
    std::string dir;                  // data directory; "" before init
    // Node-local disks (zinf-manifest(5), "rank_dirs"): rank r's files,
    // "rank<r>/<name>", lie in rank_dirs[r] (absolute) instead of beneath
    // dir, which keeps the manifest. Empty: every file lies beneath dir.
    std::vector<std::string> rank_dirs;
    std::string created_by;           // "zinf-shard 0.1.0"
    std::vector<Tensor> tensors;
    std::vector<Partition> parts;
    json::Value extra;  // unknown header keys, kept

    std::uint64_t elements_per_rank(const Tensor& t) const { return owned(t.numel, opts.dp, 0).per; }
    const Tensor& tensor_of(const Partition& p) const { return tensors[p.tensor]; }
    // The files, each once, in order of first appearance.
    std::vector<std::string> files() const;
    // Bytes every file needs (its last partition's end, aligned).
    std::uint64_t file_bytes(const std::string& file) const;
    std::uint64_t total_bytes() const;  // all partitions, padding included
    bool initialised() const;           // every partition has its xxh3
    // Index of the tensor named `name`; DataError listing near names if absent.
    std::size_t find_tensor(std::string_view name) const;
    // Where a file the manifest names lies: `rel` resolved beneath `root`,
    // the data directory (or `in_dir`, one the run is writing), or with
    // rank_dirs the rank's own folder. Every opener resolves `rel` beneath
    // `root` (open_beneath): no path a manifest names leaves it.
    struct Place {
        std::string root, rel;
        std::string path() const { return root + "/" + rel; }
    };
    Place place(const std::string& file) const;  // UsageError before init (no dir)
    Place place(const std::string& file, const std::string& in_dir) const;
    std::string path_of(const Partition& p) const { return place(p.file).path(); }
    std::string path_of(const std::string& file) const { return place(file).path(); }
    // The folder rank r's files lie in: rank_dirs[r], or dir/rank<r>.
    std::string rank_folder(unsigned rank) const;
};

// The file in each node-local rank folder that says which rank's it is and
// which state it belongs to ({"zinf":"rank folder","rank":R,"dir":D}, D the
// owning data directory, absolute): written by init, import and reshard,
// checked before any program reads or writes there, so that a manifest's
// rank_dirs cannot aim a write at a folder zinf did not make, and one run's
// rank folders are not taken by another (--rank-dir /local/nvme/run/rank%r
// given to two experiments) without --force.
inline constexpr const char* kRankMarker = ".zinf-rank";
std::string rank_marker_text(unsigned rank, const std::string& owner);
struct RankMarker {
    unsigned rank = 0;
    std::string owner;  // "" in a marker written before owners were recorded
};
// The marker in `folder`: nullopt when there is none; DataError (65, naming
// the file and `rank_for_errors`) when it is not a marker.
std::optional<RankMarker> read_rank_marker(const std::string& folder, int rank_for_errors = -1);
// --rank-dir's folders for dp ranks: one template, "/local/nvme/run/rank%r"
// (%r: the rank, %%: a per cent sign), or one folder per rank; absolute,
// and no two ranks alike. UsageError naming the one at fault.
std::vector<std::string> expand_rank_dirs(const std::vector<std::string>& given, unsigned dp);
// For the rank folders of `ranks` (every rank when empty) of a manifest with
// rank_dirs: MissingInputError (66) naming the rank and folder when it does
// not exist, DataError (65) when it is not a folder, its marker is absent
// or names another rank, or it belongs to another state than `owner`'s
// (m.dir when ""). Without rank_dirs: nothing to check.
void check_rank_folders(const Manifest& m, const std::vector<unsigned>& ranks = {}, const std::string& owner = {});

// ---------------------------------------------------------------------------
// A folder's identity (zinf-manifest(5), MOVED AND COPIED FOLDERS). A
// committed manifest's header names the directory it belongs to (dir,
// absolute), and a copy (cp -r) or a move (mv) of the folder keeps it: a
// committed manifest that names another folder than the one it lies in is a
// state copied or moved there. Writing through it would write the other
// folder's files, and reading it would read them, so every program that
// reads or writes a state refuses it (DataError, 65) before it opens
// anything of either folder for writing, until it is adopted (adopt()).
//
// Two names of one existing folder (the same device and inode).
bool same_folder(const std::string& a, const std::string& b);
// `m` was read from `path`. `found`: `path` is the committed manifest of a
// directory a manifest or --data-dir named (D/manifest.jsonl): DataError
// unless m.dir is D. Else (a file given by the user): the same when it is
// named manifest.jsonl and its folder holds a state (the lock file or the
// state's first file); a copy of a manifest kept elsewhere only leads to
// its directory. The message says how to adopt the folder.
void check_home(const Manifest& m, const std::string& path, bool found);


// spec -> every partition laid out, files rank<R>/<state>.bin, tensors packed
// in execution order at aligned offsets.
Manifest layout(const ModelSpec& spec, const LayoutOptions& opts);

// JSON Lines in and out. read() checks everything a later program relies on
// and throws DataError naming `source` and the line: malformed JSON, a missing
// or mistyped key, a header that disagrees with its records (dp, counts,
// missing or overlapping ranges), and unsafe file paths (absolute or "..").
Manifest read_manifest(std::istream& in, const std::string& source);
Manifest read_manifest_file(const std::string& path);  // MissingInputError when absent
// The same, "-" reading stdin (UsageError when it is a terminal): how every
// program reads the manifest --manifest names.
Manifest read_manifest_input(const std::string& path);
void write_manifest(std::ostream& out, const Manifest& m);
json::Json header_json(const Manifest& m);
json::Json record_json(const Manifest& m, const Partition& p);
// Atomically: temp name in the same folder, fsync, rename, fsync the folder.
void save_manifest(const Manifest& m, const std::string& path);

// ---------------------------------------------------------------------------
// One writer at a time (zinf(7), LOCKS). A data directory and every node-local
// rank folder hold a lock file, kLockFile, and every program that touches
// them holds a flock(2) on it for as long as it does: exclusive to write
// (init, import, reshard's new directory, zinf-train), shared to read
// (verify, cat, export, reshard's source, zinf-sample). A second writer, or
// a reader beside a writer, is refused at once with LockedError (exit 75)
// naming the holder the file records: its program and command, pid, host
// and since when. The kernel releases a flock when its holder dies, so a
// killed run never blocks the next. Locks are per process: a lock this
// process already holds is shared, not taken again (a writer reading its
// own state).
inline constexpr const char* kLockFile = ".zinf-lock";
enum class LockMode { shared, exclusive };

namespace detail {
struct LockHold;
}

class Lock {
public:
    Lock();
    ~Lock();  // release()
    Lock(Lock&& o) noexcept;
    Lock& operator=(Lock&& o) noexcept;
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

    bool held() const noexcept { return !holds_.empty(); }
    std::vector<std::string> paths() const;  // the lock files held
    void add(Lock&& o);                      // holds o's locks too, until this one goes
    void release() noexcept;
    // A writer that made the folders it locks (a new data directory) and
    // then failed: the lock files and folders it made are removed (each
    // folder only when empty), so that the directory is as it was. The
    // files first (remove_made_files), so that the writer's own clean-up
    // of folders inside finds them empty.
    void remove_made_files() noexcept;
    void abandon() noexcept;
    // The writer committed: what it made stays.
    void keep() noexcept;

private:
    friend Lock lock_folder(const std::string& folder, LockMode mode, bool make);
    std::vector<std::shared_ptr<detail::LockHold>> holds_;
    std::vector<std::string> made_dirs_;
};

// `mode` on `folder`'s kLockFile, created when absent. `make`: the folder
// (and its parents) made when absent, remembered for abandon(); else a
// reader finds no folder (or one it cannot write, on a read-only file
// system) and gets no lock: nothing can write there either, and the read
// that follows says what is missing. LockedError (75) when another process
// holds it; DataError (65) when the lock file is a link or not a file.
Lock lock_folder(const std::string& folder, LockMode mode, bool make = false);
// The locks on a manifest's state that a process doing `ranks` (every rank
// when empty) takes: the data directory `dir` (m.dir when "") when it does
// rank 0, which commits the manifest, and with node-local rank folders
// (rank_dirs) the folder of each of its ranks. Under mpirun every process
// takes its own; the ranks of one data directory on one disk are kept
// apart by rank 0's lock.
Lock lock_state(const Manifest& m, LockMode mode, const std::vector<unsigned>& ranks = {}, const std::string& dir = {},
                bool make = false);

// A directory that holds a committed manifest is replaced only when asked
// (--force): it may be a run's only copy of its weights. CreateError (73).
void check_target(const std::string& dir, bool force);

// The committed state a manifest file leads to, for every program that reads
// or commits a checkpoint (zinf-train, zinf-sample): always the data
// directory's own manifest.jsonl (zinf-manifest(5)), which every commit
// rewrites; a copy elsewhere (what init printed) goes stale with the first
// step and serves only to find the directory. DataError (65) when the
// manifest has no data directory or the directory holds no manifest.jsonl:
// a reader trusts only committed state.
struct Committed {
    Manifest manifest;    // read from `path`
    std::string path;     // dir/manifest.jsonl, where commits go
    std::string copy_of;  // the file given, when it is a copy ("" when it is `path`)
    Lock lock;            // with a LockMode: held while the committed state is used
};
Committed read_committed(const std::string& given);
// One rule for every reader of a data directory (zinf-manifest(5), READING
// THE COMMITTED STATE): the state is what dir/manifest.jsonl commits. Given
// another manifest (a copy, init's stdout through a pipe) that names the
// directory and differs from the committed one in what it commits (a file,
// an xxh3 or a step): with `follow`, the committed one is returned and
// log::info says so (export, as zinf-train and zinf-sample do); without, a
// warning says the given one is not what is committed and it is returned
// (verify and cat examine the manifest they are given). Without a data
// directory or a committed manifest there, `given` as it is.
// `data_dir` (--data-dir), when given, is the directory instead of the
// header's. DataError (check_home) when the file given, or the manifest
// found in the directory, belongs to another folder (copied or moved).
Manifest committed_state(const Manifest& given, const std::string& source, bool follow,
                         const std::string& data_dir = {});
// The same under the data directory's lock, taken before the committed
// manifest is read (so no commit slips between the read and the lock) by a
// process doing `ranks` (lock_state). LockedError (75) when in use.
Committed read_committed(const std::string& given, LockMode mode, const std::vector<unsigned>& ranks = {});

// ---------------------------------------------------------------------------
// Values. fill_fp32 writes the tensor's elements [first, first + out.size())
// as fp32 (padding past numel is zero). bf16 is fp32 rounded to nearest even.
void fill_fp32(const Tensor& t, const ModelSpec& spec, std::uint64_t seed, std::uint64_t first,
               std::span<float> out);
using zinf::from_bf16;  // util.hpp: one rounding for every module
using zinf::to_bf16;
// One Philox4x32-10 block, as Random123 computes it (exposed for tests).
std::array<std::uint32_t, 4> philox(std::uint64_t seed, std::uint64_t counter_lo, std::uint64_t counter_hi);

// ---------------------------------------------------------------------------
// Running the manifest against the disk. Every call streams through `pool`,
// so memory stays bounded whatever the model size; `jobs` threads share it.
struct RunOptions {
    unsigned jobs = 0;  // worker threads; 0 = the CPUs there are (at most 8)
    std::vector<unsigned> ranks;  // the ranks this process does; empty = all
    std::function<void(std::uint64_t bytes)> progress;  // called as bytes are done
    // Set (by a signal handler) to stop: the run throws Interrupted (130)
    // and, for writers, removes its temporaries.
    const std::atomic<bool>* stop = nullptr;
    // reshard: node-local folders for the new layout's ranks (Manifest::
    // rank_dirs; empty: beneath the new directory).
    std::vector<std::string> rank_dirs;
    // export of a Llama-family model in Hugging Face's layout (safetensors):
    // shards of at most `shard_bytes` of tensors into the folder --to, with
    // model.safetensors.index.json (0: one file), elements in `dtype`
    // (unset: the state's, F32 for the master copy).
    std::uint64_t shard_bytes = 0;
    std::optional<DType> dtype;
    // Writers: replace a directory that holds a committed manifest
    // (check_target, made again under the lock); false refuses it (73).
    bool force = true;
    // Readers (verify, find_nonfinite): take the state's shared lock; false
    // when the caller holds the state's lock (a trainer's rank reading its
    // own files while rank 0 holds the directory's).
    bool lock = true;
    // import: non-finite values (NaN, ±inf) are imported instead of refused.
    bool allow_nonfinite = false;
};

// Writes every partition of `ranks` into `dir` (created when absent) and sets
// m.dir and every written partition's xxh3. Files are written under temporary
// names and fsynced; commit() renames them into place. Out of space (statvfs
// up front, ENOSPC later) is an IoError (74) and the directory is left as it
// was: temporaries are removed.
//
// Beside a committed state (`dir` holds a manifest: init --force, reshard
// --force) every file goes under a name that manifest does not name
// (place_beside), so that the old state stays whole until the new manifest
// replaces it: commit() then save_manifest() then retire().
struct Written {
    // The writer's locks (lock_state, exclusive): held until the new manifest
    // is committed (shard::commit releases them, before the caller prints
    // it, so that the next program of a pipeline finds the directory free).
    Lock lock;
    std::vector<std::string> temps, finals;  // paths, pairwise
    std::vector<std::string> folders;        // the run made them (deepest first)
    std::vector<std::string> placed;         // finals renamed by commit(), not yet named by a manifest
    std::vector<std::string> superseded;     // files of the manifest this run replaces
    // Rename each temp over its final name, fsync the folders. A failed
    // rename removes what was renamed and the rest of the temporaries.
    void commit();
    void discard() noexcept;  // remove the temporaries, and the run's folders when empty
    // After commit(), when the manifest could not be committed: remove the
    // placed files, which no committed manifest names.
    void unplace() noexcept;
    // After the manifest is committed: remove the files of the one it
    // replaced that it does not name (a warning for any that stays).
    void retire() noexcept;

    // Neither committed nor discarded when it goes (an error on the way):
    // discarded, so no path leaves temporaries behind.
    Written() = default;
    Written(Written&& o) noexcept;
    Written& operator=(Written&& o) noexcept;
    ~Written() { discard(); }
};
Written init(Manifest& m, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool,
             const RunOptions& opts);

// Commits what a writer (init, import, reshard) wrote for `m`: its files
// move into place beside the old state (Written::commit), then `m` is
// committed over whatever manifest m.dir holds (save_manifest's rename),
// then the old state's files go (Written::retire). A failure or a kill
// before the rename leaves the old state committed and removes what was
// placed; after it, the new state is committed and kept.
void commit(Written& w, const Manifest& m);

// init under mpirun or srun: process p of N writes the dp ranks r with
// r % N == p. Process 0 runs `prepare` (stdin reaches it alone) and hands
// the manifest to the others; when all have written, every partition's
// xxh3 is gathered, each process moves its own files into place beside the
// old state, process 0 commits the manifest into `dir`, and every process
// retires the old state's files it can reach. One process's failure is
// every process's (comm::agree): nothing is committed then, and each
// removes what it wrote.
struct DistributedInit {
    // The I/O of a process with ranks to write, made there (an error in
    // them is every process's, as one in writing).
    std::function<io::EngineConfig()> engine;
    std::function<mem::PoolConfig()> pool;
    RunOptions run;           // jobs and stop (the ranks are set here; process 0 draws the progress)
    // Writing takes as long as the slowest process's share (terabytes, for
    // some): false lifts the communicator's timeout for that wait.
    bool limit_write_wait = false;
};
struct DistributedResult {
    Manifest manifest;        // as committed, on every process
    double write_seconds = 0; // from the manifest's arrival to the commit
};
DistributedResult init_ranks(comm::Communicator& c, const std::function<Manifest()>& prepare, const std::string& dir,
                             const DistributedInit& opts);

// Where init's values come from when they are not the initial ones: `fill`
// writes tensor t's elements [first, first + out.size()) as fp32 (zero past
// numel); init rounds them to bf16 for a bf16 param state and writes the
// master copy as they are. It runs on init's worker threads at once, each
// with a pool buffer of its own as `scratch` when `scratch` is set.
struct ValueSource {
    std::function<void(const Tensor& t, std::uint64_t first, std::span<float> out, std::span<std::byte> scratch)> fill;
    bool scratch = false;
};
Written init(Manifest& m, const std::string& dir, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts,
             const ValueSource& values);

// A state file's generations (zinf-manifest(5)): its base name and ".bin"
// or ".alt.bin" ("rank0/master" + ".bin"); a ".work.bin" a manifest of an
// earlier version names is read, never made.
inline constexpr const char* kGenerations[3] = {".bin", ".alt.bin", ".work.bin"};
// The generation a state file's name ends in (-1: none), and the name without it.
int generation_of(const std::string& file);
std::string generation_base(const std::string& file);
// The other name of a state file: "rank0/param.bin" <-> "rank0/param.alt.bin"
// (the optimizer's generations, zinf-manifest(5)).
std::string other_generation(const std::string& file);
// Renames the files of `m` that the manifest committed in `dir` names to
// their other generation, so that writing `m` leaves that state whole until
// its manifest is replaced; returns the paths of the committed state's files
// `m` no longer names (to remove once `m` is committed). No manifest in
// `dir`: nothing changes. One that cannot be read: the names of files that
// exist are avoided, and nothing is returned to remove.
std::vector<std::string> place_beside(Manifest& m, const std::string& dir);

// Every file `m` names, and every folder they lie in, resolves beneath
// m.dir: DataError (65) naming the first that is a symbolic link (or leads
// through one) outside it. For programs that open the files later through
// other code (the trainer's engine and optimizer).
// With rank_dirs, each of `ranks` (every rank when empty) has its folder
// checked (check_rank_folders) and its files resolved beneath it.
void check_paths(const Manifest& m, const std::vector<unsigned>& ranks = {});

// Recomputes the xxh3 of every partition (of `ranks`); DataError naming
// tensor, rank, state, file and offset at the first mismatch or short file.
struct VerifyResult {
    std::uint64_t partitions = 0, bytes = 0;
};
VerifyResult verify(const Manifest& m, io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts);

// (check_home: a copied or moved folder)
// Adopts `dir`, whose committed manifest names another folder (the origin):
// under dir's exclusive lock, every partition is verified where the state
// lies now and the manifest is committed again naming dir. Node-local rank
// folders go with it only where the origin no longer names them (a move);
// a copy cannot share them with its origin, nor take another state's
// (DataError naming the folder). Returns the adopted manifest, or nullopt
// when dir's manifest names dir already (nothing to adopt).
std::optional<Manifest> adopt(const std::string& dir, io::Engine& engine, mem::PinnedPool& pool,
                              const RunOptions& opts);

// The first value of `states` (of `ranks`) that is not finite, as "<tensor>
// element <i> is nan (rank r state, file)"; nullopt when every one is.
// Streams through the pool; checks nothing against the xxh3s.
std::optional<std::string> find_nonfinite(const Manifest& m, const std::vector<std::string>& states,
                                          io::Engine& engine, mem::PinnedPool& pool, const RunOptions& opts);

// The whole tensor, gathered from its partitions in rank order, padding left
// out: `sink` gets consecutive pieces (raw little-endian, the state's dtype).
using Sink = std::function<void(std::span<const std::byte>)>;
void cat(const Manifest& m, std::size_t tensor, const std::string& state, io::Engine& engine,
         mem::PinnedPool& pool, const Sink& sink);

// The same state for a new dp degree: laid out afresh, every partition copied
// from the old files through the pool into `dir` (temporaries, as init).
// Returns the new manifest with its xxh3s; values are unchanged.
Manifest reshard(const Manifest& m, unsigned dp, const std::string& dir, io::Engine& engine,
                 mem::PinnedPool& pool, const RunOptions& opts, Written& written);

// ---------------------------------------------------------------------------
// Weights in the formats people have on disk (man/zinf-shard.1, IMPORT AND
// EXPORT): Hugging Face safetensors with GPT-2's names (Conv1D weights
// (in, out), as zinf keeps them), and llm.c's checkpoint (magic 20240326,
// version 3 fp32 or 5 bf16; weights (out, in), the vocabulary padded).
enum class WeightFormat { safetensors, llmc };
const char* weight_format_name(WeightFormat f);
WeightFormat parse_weight_format(std::string_view s);  // UsageError
// llm.c's magic in the first four bytes, else safetensors.
WeightFormat detect_weight_format(const std::string& path);
inline constexpr std::int32_t kLlmcMagic = 20240326;

// For a Llama-family model, `from` is a Hugging Face checkpoint: a
// .safetensors file, the model.safetensors.index.json of a sharded one (its
// weight_map's files beside it), or the folder that holds either; names and
// shapes as published (model.layers.N.self_attn.q_proj.weight, (out, in)).
// A tied model's lm_head.weight, when a file has it, and rotary_emb.inv_freq
// buffers are left out.
//
// Every partition of m's param and master states from the file's tensors
// (converted to fp32, then to the param dtype), the moments zero; written and
// hashed as init does, committed by the caller with Written::commit. The whole
// file is checked before anything is written: DataError (65) naming the file
// and the tensor for a shape the model does not have (both shapes), a tensor
// missing, one the model has no place for, a dtype other than F32, F16 or
// BF16, and any header, offset or size that does not fit the file.
Written import_weights(Manifest& m, const std::string& from, const std::string& dir, io::Engine& engine,
                       mem::PinnedPool& pool, const RunOptions& opts);

// The committed state's weights (the master copy when there is one, else the
// param state) written to `to` in `format`, complete or not at all (a
// temporary beside it, fsync, rename). Every partition read is checked against
// its xxh3 first. Tiles are joined into the untiled tensors. safetensors keeps
// the state's dtype (F32 or BF16); llm.c's version 3 is fp32, with the
// vocabulary padded to a multiple of 128 by zero rows.
// A Llama-family model's safetensors keep Hugging Face's names and shapes
// (RunOptions::shard_bytes and dtype: shards with their index, and the
// elements' type).
struct ExportResult {
    std::string state;          // "master" or "param"
    std::uint64_t bytes = 0;    // the file's size
    std::size_t tensors = 0;    // tensors written (safetensors) or model tensors (llm.c)
    std::vector<std::string> files;  // what was written (the shards, then the index)
};
ExportResult export_weights(const Manifest& m, const std::string& to, WeightFormat format, io::Engine& engine,
                            mem::PinnedPool& pool, const RunOptions& opts);

}  // namespace zinf::shard
