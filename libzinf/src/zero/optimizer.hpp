// The optimizer's insides, shared by optimizer.cpp (state, chunks, the
// streaming pipeline) and step.cpp (gradients, the step, commits).
#pragma once

#include <zinf/zero.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace zinf::zero {
namespace detail {

// What a state is to the update (optim::Update's names): the master weights
// ("param" itself when the parameters are fp32), the moments, the gradient,
// and the bf16 working parameters written from the master weights (only
// beside a master copy).
enum Role { master, exp_avg, exp_avg_sq, grad, param, count };

struct RoleState {
    bool present = false;
    bool file = false;      // streamed from its file (nvme); else held in memory
    std::string state;      // the manifest's state name
    shard::DType dtype = shard::DType::fp32;
    std::size_t dt = 4;     // bytes per element
    std::vector<std::uint64_t> offset;          // per tensor: this rank's partition in the file
    std::vector<shard::Partition*> part;        // per tensor: its record (none for grad)
    std::uint64_t end = 0;  // bytes of the file this rank's partitions reach, aligned
    // The file in two generations, base + shard::kGenerations[g]:
    // `committed` is the one the manifest names, `cur` holds the current
    // values, `next` is where a step writes.
    std::string base;
    int cur = 0, committed = 0, next = 0;
    io::File gen_f[3];      // opened when first used
    std::string name(int g) const;
    mem::Pinned image;      // memory roles: the file's first `end` bytes
    // Device roles (Optimizer::Impl::on_device): the same bytes in the
    // device's arena instead of `image`; for the gradients, the device's
    // copy of `image`, which put_gradient fills on the host.
    mem::Block dev;
    std::vector<std::unique_ptr<Xxh3Stream>> hash;  // per tensor, while a step writes it
    std::vector<std::uint64_t> new_hash;            // per tensor, when written whole
    // Streamed roles read back: the xxh3 the `cur` generation must have (the
    // manifest's, or what the step that wrote it computed), and the running
    // hash of what a step has read of each tensor so far.
    std::vector<std::uint64_t> cur_hash;
    std::vector<std::unique_ptr<Xxh3Stream>> read_hash;
};

// A rank's partition of each tensor in turn, each at an aligned offset, in
// `dtype`: how zinf-shard packs a state file, and how the optimizer keeps
// the gradients a step hands over (with the optimizer state on NVMe, the
// gradient scratch file). Every rank's is the same size.
struct PackedLayout {
    std::vector<std::uint64_t> offset;  // per tensor, bytes
    std::uint64_t bytes = 0;            // the end of the last, aligned
};
PackedLayout packed_layout(std::span<const shard::Tensor> tensors, const shard::LayoutOptions& lo, shard::DType dtype);

// Piece: elements [e0, e1) of a tensor's partition (per elements, padding included).
struct Piece {
    std::size_t tensor;
    std::uint64_t e0, e1;
};

// One chunk: its pieces, in file order, and each file role's byte range.
struct Chunk {
    std::vector<Piece> pieces;
    std::uint64_t lo[Role::count] = {}, hi[Role::count] = {};
};

}  // namespace detail

struct Optimizer::Impl {
    using Role = detail::Role;
    using Chunk = detail::Chunk;

    Impl(shard::Manifest& m, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p, const OptimizerOptions& o);
    ~Impl();

    shard::Manifest& m;
    comm::Communicator& comm;
    io::Engine& engine;
    mem::PinnedPool& pool;
    OptimizerOptions opts;
    ParamListener* listener = nullptr;  // told of every piece updated (Optimizer::listen)
    // The update on the device (OptimizerOptions::device, gpu tier): every
    // state the update reads or writes is held in the device's arena, no
    // file role; the update is Device::adamw on its h2d stream.
    device::Device* dev = nullptr;
    bool on_device = false;
    double lr = 0;
    unsigned rank = 0;
    std::string path;            // the manifest commits go to
    std::uint64_t alignment = 4096;  // the manifest's
    std::size_t tensor_count = 0;
    std::uint64_t step = 0;      // committed steps
    bool broken = false;         // a step failed half-way: the memory state is not a step's
    bool commit_steps = true;    // every written state streams from NVMe: each step commits
    bool in_place = false;       // this step updates the current generation (prepare_step)
    // Overlap: each tensor is updated as its gradient arrives, with the
    // scalars of a step that is neither clipped nor rescaled differently
    // from the last (`spec_sc`, fixed by the step's first gradient). Only
    // when every state the update reads is streamed from a file: the
    // previous generation stays on disk, so a step that must be clipped or
    // skipped after all is redone from it (or left) exactly.
    bool speculative = false;
    double spec_loss_scale = 1;   // the loss scale the speculation assumes: the last step's
    optim::Scalars spec_sc[2];
    bool spec_off = false;        // this step: no more speculation (clipping is certain, or a gradient is not finite)
    bool last_clipped = false;    // the last step was clipped or skipped: this one does not speculate
    std::vector<bool> speculated; // per tensor, this step
    mem::Pinned p_undo;           // memory-held bf16 parameters a speculative update overwrote

    detail::RoleState roles[Role::count];
    std::vector<shard::Partition*> by_key;  // every record by (tensor, rank, state)

    // Chunks (file roles only): the bytes of one role's piece, and the unit
    // (elements) a partition is cut at.
    std::vector<Role> file_roles;
    std::size_t slots = 3, per_buffer = 1, leases = 0;
    // Chunks read ahead of the update, and written behind it: ahead +
    // behind + 1 = slots (plan_depths).
    std::size_t ahead = 1, behind = 1;
    std::uint64_t piece_bytes = 0, cut_unit = 2048;
    std::vector<Chunk> all_chunks;

    // Read-ahead (OptimizerOptions::readahead): the first ra_chunks chunks
    // of all_chunks have room in ra_mem for their pieces of the roles the
    // update reads from files before it writes them (ra_roles: the master
    // weights and moments), piece j of chunk i at ra_at[i][j]. A step that
    // does not speculate has the overlap thread read them during backward
    // (under mu: ra_on once started, ra_stop once step() wants them;
    // ra_issued chunks read or being read, ra_done of them read and checked).
    std::vector<Role> ra_roles;
    mem::Pinned ra_mem;           // ra_bytes, pinned by the first step that reads ahead
    std::uint64_t ra_bytes = 0;
    std::size_t ra_chunks = 0;
    std::vector<std::vector<std::uint64_t>> ra_at;
    std::uint64_t ra_state_bytes = 0;  // what a step's update reads of ra_roles, every chunk
    bool ra_on = false, ra_stop = false;
    std::size_t ra_issued = 0, ra_done = 0;
    std::vector<std::vector<io::Ticket>> ra_tickets;  // per chunk, while in flight
    bool is_ra_role(Role r) const { return std::find(ra_roles.begin(), ra_roles.end(), r) != ra_roles.end(); }
    // The read-ahead of a step whose hand-over began while the last step's
    // pipelined update still ran (ra_after_pend, fixed by start_readahead)
    // reads what that update writes: the generation `ra_gen[r]` (its
    // `next`), checked against the xxh3 it computes (`new_hash`), each chunk
    // only once every tensor it touches is written (pend_ready) -- and so
    // once that update's own use of the chunk's read-ahead memory is over.
    // Both stay right after the commit, which makes that generation the
    // current one with the same hashes.
    bool ra_after_pend = false;
    int ra_gen[Role::count] = {};
    std::vector<std::vector<std::size_t>> chunk_tensors;  // per chunk of all_chunks: the tensors it touches
    bool chunk_written(std::size_t c) const;  // under pend_mu
    // The overlap thread, under mu: until chunk ra_issued may be read (true)
    // or the update before failed and nothing more will be (false).
    bool wait_written(std::unique_lock<std::mutex>& lk);
    void plan_readahead();
    void start_readahead();  // under mu
    void read_ahead(std::unique_lock<std::mutex>& lk);  // the overlap thread: one chunk on
    std::size_t stop_readahead();  // chunks read ahead and checked

    // Gradients of the current step.
    // Two scratches by step parity (OptimizerOptions::pipeline, where the
    // budget holds them): step N+1's backward hands its gradients over into
    // one while step N's pipelined update reads the other, so the update
    // runs on under the next backward (update_under_backward) and is settled
    // after it. Slot 0 is roles[grad]'s `image` or gen_f[0], slot 1
    // `grad_alt` or gen_f[1]: both in memory, or both files. One slot: the
    // update is settled before the next step's first gradient.
    int grad_slots = 1;
    int put_slot = 0;  // where this step's gradients are handed over
    int upd_slot = 0;  // where the update under way reads them (set while none runs)
    mem::Pinned grad_alt;
    std::string slot_refused;  // why there is one slot
    void agree_grad_slots();   // every rank as many slots as the one with fewest
    std::byte* grad_mem(int slot) { return slot ? grad_alt.data() : roles[Role::grad].image.data(); }
    bool under_backward() const { return grad_slots == 2; }
    std::vector<double> grad_sq;  // per tensor, sum of squares as handed over
    std::vector<bool> have_grad;
    std::uint64_t grad_written = 0;  // bytes of the step's gradients written to their scratch file (under mu)
    std::uint64_t grad_held = 0;     // ... or put in the scratch held in memory (under mu)
    bool grad_scratch = false;       // the gradients are scratch (optimizer state on NVMe), file or memory
    // What is left of the optimizer's memory budget (OptimizerOptions::
    // readahead, resolved once at open) after the gradients' scratch.
    std::uint64_t mem_budget = 0;
    std::uint64_t memory_budget() const;

    // Overlap: the worker updates tensors as their gradients arrive.
    std::thread worker;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::size_t> queue;
    std::size_t done_tensors = 0;
    bool quit = false;
    std::exception_ptr worker_error;

    // Early flushes: the files a step writes are fdatasynced by a thread of
    // their own after every kFlushEvery bytes written, and what is left when
    // the backward ends at once, while the step goes on streaming; the
    // drive's write cache drains beside the compute and the update instead
    // of all in the commit's sync. A flush that fails fails the step (its
    // error is reported once; a later sync would not see it).
    static constexpr std::uint64_t kFlushEvery = 128ull << 20;
    std::thread flusher;
    std::mutex flush_mu;
    std::condition_variable flush_cv;
    std::uint64_t unflushed = 0;            // bytes written since the last flush began
    std::vector<io::File*> flush_files;     // the files they went to
    bool flush_now = false, flushing = false, flush_quit = false;
    std::exception_ptr flush_error;
    void note_written(io::File& f, std::uint64_t bytes);
    void flush_written();  // flush what is written so far, now
    void flush_loop();
    void stop_flushing();  // waits for a flush under way; rethrows its error

    struct Totals {
        std::uint64_t read = 0, written = 0, chunks = 0;
        std::uint64_t grad_read = 0;  // of `read`, from the gradients' scratch file
        double update = 0, wait = 0, hash = 0;
        double speculative = 0;       // seconds the overlap thread streamed
        std::uint64_t readahead = 0, readahead_used = 0;  // bytes read ahead, and of them taken by the update
    } totals;  // of the step under way

    void index_records();
    shard::Partition* record(std::size_t t, unsigned r, const std::string& state) const;
    io::File open_file(const std::string& rel, bool create, std::uint64_t bytes,
                       io::Direct direct = io::Direct::prefer);
    io::File& gen_file(detail::RoleState& rs, int g, bool create);
    void check_entry(const char* what, const std::exception_ptr& local);
    void setup_role(Role r, const std::string& state);
    void setup_grad();
    std::uint64_t per(std::size_t t) const;
    bool decays(std::size_t t) const;

    void plan_chunks();
    void plan_depths(std::size_t k, std::uint64_t B);
    bool adjacent(std::size_t a, std::size_t b) const;
    std::vector<Chunk> cut(const std::vector<std::size_t>& tensors) const;
    // `worker`: run on the overlap thread beside the compute (one thread
    // for the update and the hashes); else every core.
    // `ra`: the first ra chunks' pieces of ra_roles are in ra_mem, read
    // ahead and checked (all_chunks only).
    void stream(const std::vector<Chunk>& chunks, const optim::Scalars (&sc)[2], Totals& tot, bool worker = false,
                std::size_t ra = 0);
    template <class PieceBuf>
    void update(const Chunk& c, std::size_t i, PieceBuf& piece_buf, const optim::Scalars (&sc)[2], Totals& tot,
                bool worker);
    // update() of a chunk on the device (on_device): the gradients of its
    // pieces copied to the device, one Device::adamw per piece, the
    // listener told, and the host waits for the stream to get there.
    void update_on_device(const Chunk& c, const optim::Scalars (&sc)[2], Totals& tot);
    // A device role's bytes [0, end) on the host, in `out` (pinned here).
    std::span<const std::byte> host_copy(detail::RoleState& rs, mem::Pinned& out);
    // The new xxh3 of chunk i's written file partitions (after update()).
    template <class PieceBuf>
    void hash_written(const Chunk& c, std::size_t i, PieceBuf& piece_buf, Totals& tot, bool worker);
    // at(role, piece): where that role's bytes of a piece of chunk i are, in
    // the chunk's buffers (piece_buf) or in memory.
    template <class PieceBuf>
    auto locator(const Chunk& c, std::size_t i, PieceBuf& piece_buf);
    // Against the xxh3s `expect` of generation `gen` (by default the
    // current one's).
    void check_read(const Chunk& c, Role r, const std::byte* base, int gen = -1,
                    const std::vector<std::uint64_t>* expect = nullptr);
    void undo_speculation();

    // Pipeline (OptimizerOptions::pipeline): the update step() started,
    // on pend_thread, until settle(). pend_ready[t]: tensor t's chunks are
    // written (marked by stream() while pend_marking) or were written by
    // the speculation; pend_done once the thread is over, pend_error its
    // failure. The caller's thread alone starts and settles it.
    std::atomic<bool> pend{false};
    std::thread pend_thread;
    std::mutex pend_mu;
    std::condition_variable pend_cv;
    std::vector<bool> pend_ready;
    int pend_gen[Role::count] = {};  // where the update under way writes each role (its `next`)
    std::atomic<std::uint64_t> handover_epoch{0};  // reset_handover()s so far (changed under mu and pend_mu)
    bool pend_done = false, pend_marking = false;
    std::exception_ptr pend_error;
    StepReport pend_rep;
    // The pending step's own figures and speculation, apart from the next
    // step's hand-over, which starts beside it.
    Totals pend_totals;
    std::vector<bool> pend_speculated;
    std::uint64_t pend_grad_written = 0, pend_grad_held = 0;
    double pend_loss_scale = 1;
    double pend_sync = 0;         // the thread's sync of the written files
    double pend_waited = 0;       // the caller waiting for it in param_source
    Timer pend_clock;             // since step() returned
    double pend_elapsed = 0;      // the thread's run, from step()'s return
    void pend_mark(std::size_t t);
    void pend_wait(std::size_t t);  // param_source: until t is written (or the update failed)
    void launch_update(StepReport& rep, double loss_scale, std::size_t ra);
    std::optional<StepReport> settle();
    void finish_report(StepReport& rep, double loss_scale, const Totals& tot, std::uint64_t gw, std::uint64_t gh,
                       bool pipelined);

    void put(std::size_t t, std::span<const float> f32, std::span<const std::uint16_t> b16);
    void scalars(double grad_scale, optim::Scalars (&sc)[2]) const;
    void work();
    void prepare_step();
    StepReport run_step(double loss_scale);
    void check_step(double loss_scale);
    double global_sum_squares();
    void skip_step(const StepReport& rep);
    void update_step(StepReport& rep, double loss_scale, std::size_t ra);
    void update_rest(const optim::Scalars (&sc)[2], StepReport& rep, std::size_t ra, Totals& tot,
                     const std::vector<bool>& spec);
    void next_step(double loss_scale);
    void reset_handover(double loss_scale);  // the next step's hand-over starts afresh
    // The roles a step wrote become the current generations, at step + 1.
    void advance(const std::vector<Role>& written);
    // Each (role, generation) becomes what the manifest names, at new_step.
    void commit(const std::vector<std::pair<Role, int>>& changed, std::uint64_t new_step);
    void save();
};

}  // namespace zinf::zero
