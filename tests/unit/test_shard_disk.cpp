// Unit tests of libzinf shard's state on disk: init, verify, cat, reshard,
// corruption, short files, faults.
#define BOOST_TEST_MODULE shard_disk
#include "shard_testing.hpp"

#include <sys/file.h>
#include <sys/wait.h>

using namespace zinf;
using namespace zinf::shard;
using namespace zinf::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ===========================================================================
BOOST_AUTO_TEST_SUITE(disk)

mem::PoolConfig disk_pool() {
    mem::PoolConfig c;
    c.bytes = 8 * MiB;
    c.buffer = 256 * KiB;  // 32 buffers; the larger partitions take several
    c.allocator = "host";
    c.lease_timeout = 30s;
    return c;
}

// The io engine and the pool every disk test streams through (the pool is
// destroyed first, as it must be).
struct Rig {
    io::Engine engine{io::EngineConfig{}};
    mem::PinnedPool pool{disk_pool(), &engine};
};

// wte is 262,336 elements: 1MiB of fp32 at dp 1, several pool buffers.
constexpr const char* kDiskModel = "gpt:layers=2,hidden=64,heads=2,vocab=4099,seq=16";

std::vector<std::byte> slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "cannot open " << path);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(c.size());
    std::memcpy(out.data(), c.data(), c.size());
    return out;
}

void write_file(const std::string& path, std::span<const std::byte> bytes) {
    std::ofstream o(path, std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    BOOST_REQUIRE_MESSAGE(o.good(), "cannot write " << path);
}

// Elements [first, first+n) of the tensor as the state stores them.
std::vector<std::byte> encoded(const Manifest& m, const Tensor& t, DType dt, std::uint64_t first, std::uint64_t n) {
    const auto v = values(t, m.spec, m.opts.seed, first, n);
    std::vector<std::byte> out(n * dtype_bytes(dt));
    if (dt == DType::fp32) {
        std::memcpy(out.data(), v.data(), out.size());
    } else {
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t b = to_bf16(v[i]);
            std::memcpy(out.data() + 2 * i, &b, 2);
        }
    }
    return out;
}

std::vector<std::byte> cat_bytes(const Manifest& m, std::size_t t, const std::string& state, Rig& rig) {
    std::vector<std::byte> out;
    cat(m, t, state, rig.engine, rig.pool, [&](std::span<const std::byte> piece) {
        out.insert(out.end(), piece.begin(), piece.end());
    });
    return out;
}

std::vector<std::string> temporaries(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.path().filename().string().find(".zinf-tmp") != std::string::npos) out.push_back(e.path().string());
    return out;
}

// Laid out, initialised and committed into `dir`.
Manifest make(Rig& rig, const std::string& dir, const LayoutOptions& o, const char* spec = kDiskModel) {
    Manifest m = layout(ModelSpec::parse(spec), o);
    Written w = init(m, dir, rig.engine, rig.pool, {});
    w.commit();
    return m;
}

// Every partition's bytes in its file: the values it should hold, zero
// padding to `bytes` and to the aligned end, and the xxh3 the manifest has.
void check_files(const Manifest& m) {
    std::map<std::string, std::vector<std::byte>> files;
    for (const auto& f : m.files()) {
        files[f] = slurp(m.dir + "/" + f);
        BOOST_TEST(files[f].size() == m.file_bytes(f), f);
    }
    std::size_t bad = 0;
    for (const Partition& p : m.parts) {
        const auto& bytes = files.at(p.file);
        BOOST_REQUIRE(p.offset + p.bytes <= bytes.size());
        const std::span<const std::byte> got(bytes.data() + p.offset, p.bytes);
        BOOST_REQUIRE(p.xxh3.has_value());
        if (xxh3(got) != *p.xxh3 && bad++ < 5) BOOST_ERROR(p.file << " " << m.tensor_of(p).name << ": xxh3");
        std::vector<std::byte> want;
        if (p.state == "param" || p.state == "master")
            want = encoded(m, m.tensor_of(p), p.dtype, p.first, p.bytes / dtype_bytes(p.dtype));
        else
            want.assign(p.bytes, std::byte{0});
        if (!std::equal(want.begin(), want.end(), got.begin()) && bad++ < 5)
            BOOST_ERROR(p.file << " " << m.tensor_of(p).name << " rank " << p.rank << " " << p.state << ": values");
        const std::uint64_t end = align_up(p.offset + p.bytes, m.opts.alignment);
        if (!std::all_of(bytes.begin() + p.offset + p.bytes, bytes.begin() + end, [](std::byte b) { return b == std::byte{0}; }) &&
            bad++ < 5)
            BOOST_ERROR(p.file << " " << m.tensor_of(p).name << ": alignment gap not zero");
    }
    BOOST_TEST(bad == 0u);
}

// Byte `at` of `path`, xor `mask`, written in place.
void flip(const std::string& path, std::uint64_t at, unsigned char mask = 0x5a) {
    Fd fd = Fd::open(path, O_RDWR);
    unsigned char b = 0;
    BOOST_REQUIRE(::pread(fd.get(), &b, 1, static_cast<off_t>(at)) == 1);
    b ^= mask;
    BOOST_REQUIRE(::pwrite(fd.get(), &b, 1, static_cast<off_t>(at)) == 1);
    BOOST_REQUIRE(::fsync(fd.get()) == 0);
}

BOOST_AUTO_TEST_CASE(init_commit_verify_cat_for_dp_1_2_3) {
    Rig rig;
    TempDir root;
    const std::uint64_t s = seed("disk init");
    std::map<unsigned, std::vector<std::uint64_t>> param_hashes, master_hashes;
    for (unsigned dp : {1u, 2u, 3u}) {
        BOOST_TEST_CONTEXT("dp " << dp) {
            const std::string dir = root.file("dp" + std::to_string(dp));
            Manifest m = layout(ModelSpec::parse(kDiskModel), {.dp = dp, .seed = s});
            std::atomic<std::uint64_t> progress{0};
            Written w = init(m, dir, rig.engine, rig.pool, {.progress = [&](std::uint64_t b) { progress += b; }});
            BOOST_TEST(progress.load() == m.total_bytes());
            // Nothing under the final names until commit.
            BOOST_TEST(w.temps.size() == m.files().size());
            BOOST_TEST(w.finals.size() == w.temps.size());
            for (std::size_t i = 0; i < w.temps.size(); ++i) {
                // "<final>.zinf-tmp.<16 hex digits>": unpredictable, so nothing can be planted there.
                BOOST_TEST(w.temps[i].starts_with(w.finals[i] + ".zinf-tmp."));
                BOOST_TEST(w.temps[i].size() == w.finals[i].size() + 10 + 16);
                BOOST_TEST(fs::exists(w.temps[i]));
                BOOST_TEST(!fs::exists(w.finals[i]));
            }
            w.commit();
            BOOST_TEST(w.temps.empty());
            BOOST_TEST(temporaries(dir).empty());
            BOOST_TEST(m.dir == fs::weakly_canonical(dir).string());
            BOOST_TEST(m.initialised());
            check_files(m);

            // Through the manifest file, as the programs use it.
            save_manifest(m, dir + "/manifest.jsonl");
            const Manifest back = read_manifest_file(dir + "/manifest.jsonl");
            BOOST_TEST(back.dir == m.dir);
            for (std::size_t i = 0; i < m.parts.size(); ++i) BOOST_TEST((back.parts[i].xxh3 == m.parts[i].xxh3));
            progress = 0;
            const VerifyResult r = verify(back, rig.engine, rig.pool, {.progress = [&](std::uint64_t b) { progress += b; }});
            BOOST_TEST(r.partitions == m.parts.size());
            BOOST_TEST(r.bytes == m.total_bytes());
            BOOST_TEST(progress.load() == m.total_bytes());

            for (std::size_t t = 0; t < m.tensors.size(); ++t) {
                const Tensor& ten = m.tensors[t];
                const auto param = cat_bytes(back, t, "param", rig), master = cat_bytes(back, t, "master", rig);
                BOOST_TEST((param == encoded(m, ten, DType::bf16, 0, ten.numel)), ten.name << " param");
                BOOST_TEST((master == encoded(m, ten, DType::fp32, 0, ten.numel)), ten.name << " master");
                const auto moment = cat_bytes(back, t, "exp_avg_sq", rig);
                BOOST_TEST(moment.size() == ten.numel * 4);
                BOOST_TEST(std::all_of(moment.begin(), moment.end(), [](std::byte b) { return b == std::byte{0}; }));
                param_hashes[dp].push_back(xxh3(param));
                master_hashes[dp].push_back(xxh3(master));
            }
            BOOST_TEST(contains(what_of<UsageError>([&] { cat_bytes(back, 0, "grad", rig); }, "cat grad"), "'grad'"));
        }
    }
    BOOST_TEST(param_hashes[1] == param_hashes[2], boost::test_tools::per_element());
    BOOST_TEST(param_hashes[1] == param_hashes[3], boost::test_tools::per_element());
    BOOST_TEST(master_hashes[1] == master_hashes[3], boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(other_dtypes_inference_and_rank_subsets) {
    Rig rig;
    TempDir root;
    const std::uint64_t s = seed("disk dtypes");
    {  // fp32 parameters: the param state is the master copy
        const Manifest m = make(rig, root.file("fp32"), {.dp = 2, .param_dtype = DType::fp32, .seed = s});
        BOOST_TEST(m.states == (std::vector<std::string>{"param", "exp_avg", "exp_avg_sq"}), boost::test_tools::per_element());
        check_files(m);
        BOOST_TEST(verify(m, rig.engine, rig.pool, {}).partitions == m.parts.size());
        BOOST_TEST((cat_bytes(m, 0, "param", rig) == encoded(m, m.tensors[0], DType::fp32, 0, m.tensors[0].numel)));
    }
    {  // inference: bf16 values without a master copy
        const Manifest m = make(rig, root.file("inf"), {.dp = 3, .train = false, .seed = s});
        BOOST_TEST(m.files().size() == 3u);
        check_files(m);
        BOOST_TEST(verify(m, rig.engine, rig.pool, {.jobs = 1}).bytes == m.total_bytes());
        BOOST_TEST((cat_bytes(m, 0, "param", rig) == encoded(m, m.tensors[0], DType::bf16, 0, m.tensors[0].numel)));
    }
    {  // one rank of three: only its files, only its hashes
        Manifest m = layout(ModelSpec::parse(kDiskModel), {.dp = 3, .seed = s});
        const std::string dir = root.file("rank1");
        init(m, dir, rig.engine, rig.pool, {.jobs = 1, .ranks = {1}}).commit();
        std::set<std::string> files;
        for (const auto& e : fs::recursive_directory_iterator(dir))
            if (e.is_regular_file()) files.insert(fs::relative(e.path(), dir).string());
        BOOST_TEST(files == (std::set<std::string>{"rank1/param.bin", "rank1/master.bin", "rank1/exp_avg.bin",
                                                   "rank1/exp_avg_sq.bin"}),
                   boost::test_tools::per_element());
        for (const Partition& p : m.parts) BOOST_TEST(p.xxh3.has_value() == (p.rank == 1));
        BOOST_TEST(verify(m, rig.engine, rig.pool, {.ranks = {1}}).partitions == m.parts.size() / 3);
        const std::string msg = what_of<DataError>([&] { verify(m, rig.engine, rig.pool, {}); }, "verify all ranks");
        BOOST_TEST(contains(msg, "has no xxh3"), msg);
        BOOST_TEST(contains(what_of<UsageError>([&] { verify(m, rig.engine, rig.pool, {.ranks = {3}}); }, "rank 3"),
                            "rank 3 is not below dp 3"));
    }
}

BOOST_AUTO_TEST_CASE(reshard_3_to_2_keeps_every_value) {
    Rig rig;
    TempDir a, b, c;
    const std::uint64_t s = seed("reshard");
    Manifest m3 = make(rig, a.path.string(), {.dp = 3, .seed = s});
    // A record key this version does not know moves along when every old
    // partition of that tensor and state agrees on it, and only then.
    for (auto& p : m3.parts) {
        if (m3.tensor_of(p).name == "wpe.weight" && p.state == "master") (*p.extra)["note"] = "kept";
        if (m3.tensor_of(p).name == "wpe.weight" && p.state == "param" && p.rank == 0) (*p.extra)["note"] = "dropped";
    }
    Written w;
    const Manifest m2 = reshard(m3, 2, b.path.string(), rig.engine, rig.pool, {}, w);
    BOOST_TEST(!w.temps.empty());
    for (const auto& f : w.finals) BOOST_TEST(!fs::exists(f));
    w.commit();
    BOOST_TEST(temporaries(b.path.string()).empty());
    BOOST_TEST(m2.opts.dp == 2u);
    BOOST_TEST(m2.dir == fs::weakly_canonical(b.path).string());
    BOOST_TEST(m2.initialised());
    BOOST_TEST(verify(m2, rig.engine, rig.pool, {}).partitions == m2.parts.size());
    check_files(m2);
    // The same bytes as a fresh init at dp 2.
    const Manifest fresh = make(rig, c.path.string(), {.dp = 2, .seed = s});
    BOOST_REQUIRE(fresh.parts.size() == m2.parts.size());
    for (std::size_t i = 0; i < m2.parts.size(); ++i) BOOST_TEST((m2.parts[i].xxh3 == fresh.parts[i].xxh3), i);
    for (std::size_t t = 0; t < m2.tensors.size(); ++t)
        for (const char* st : {"param", "master", "exp_avg"})
            BOOST_TEST(xxh3(cat_bytes(m2, t, st, rig)) == xxh3(cat_bytes(m3, t, st, rig)), m2.tensors[t].name << " " << st);
    // A source partition that no longer matches its xxh3: nothing is resharded.
    const Partition& src = *std::find_if(m3.parts.begin(), m3.parts.end(), [&](const Partition& p) {
        return m3.tensor_of(p).name == "h.1.attn.c_attn.weight" && p.rank == 2 && p.state == "exp_avg";
    });
    flip(m3.path_of(src), src.offset + 5);
    TempDir d;
    Written w_bad;
    const std::string msg = what_of<DataError>(
        [&] { (void)reshard(m3, 2, d.path.string(), rig.engine, rig.pool, {}, w_bad); }, "corrupt source");
    BOOST_TEST(contains(msg, "xxh3 mismatch in the source: h.1.attn.c_attn.weight rank 2 exp_avg"), msg);
    BOOST_TEST(contains(msg, m3.path_of(src)), msg);
    BOOST_TEST(w_bad.temps.empty());
    BOOST_TEST(temporaries(d.path.string()).empty());
    for (const Partition& p : m2.parts) {
        const bool wpe_master = m2.tensor_of(p).name == "wpe.weight" && p.state == "master";
        BOOST_TEST((*p.extra == (wpe_master ? json::Json{{"note", "kept"}} : json::Json::object())),
                   m2.tensor_of(p).name << " " << p.state);
    }
}

// More ranks than elements: the last ranks hold only padding, and reshard
// moves across such empty partitions in both directions.
BOOST_AUTO_TEST_CASE(more_ranks_than_elements) {
    Rig rig;
    TempDir a, b, c, fresh5, fresh1;
    const std::uint64_t s = seed("tiny reshard");
    constexpr const char* tiny = "gpt:layers=1,hidden=4,heads=1,vocab=7,seq=3";
    Manifest m2 = make(rig, a.path.string(), {.dp = 2, .seed = s}, tiny);
    Written w5, w1;
    const Manifest m5 = reshard(m2, 5, b.path.string(), rig.engine, rig.pool, {}, w5);
    w5.commit();
    const Manifest m1 = reshard(m5, 1, c.path.string(), rig.engine, rig.pool, {}, w1);
    w1.commit();
    const Manifest f5 = make(rig, fresh5.path.string(), {.dp = 5, .seed = s}, tiny);
    const Manifest f1 = make(rig, fresh1.path.string(), {.dp = 1, .seed = s}, tiny);
    BOOST_TEST(std::any_of(m5.parts.begin(), m5.parts.end(), [](const Partition& p) { return p.first == p.last; }));
    for (const Manifest* m : {&m5, &m1, &f5, &f1}) {
        BOOST_TEST(verify(*m, rig.engine, rig.pool, {}).partitions == m->parts.size());
        check_files(*m);
    }
    for (std::size_t i = 0; i < m5.parts.size(); ++i) BOOST_TEST((m5.parts[i].xxh3 == f5.parts[i].xxh3), i);
    for (std::size_t i = 0; i < m1.parts.size(); ++i) BOOST_TEST((m1.parts[i].xxh3 == f1.parts[i].xxh3), i);
}

// The smallest pool init, verify, cat and reshard accept: one worker each.
BOOST_AUTO_TEST_CASE(the_smallest_pool_is_enough) {
    io::Engine engine{io::EngineConfig{}};
    mem::PoolConfig pc = disk_pool();
    pc.bytes = 5 * pc.buffer;
    pc.lease_timeout = 10s;
    mem::PinnedPool pool(pc, &engine);
    TempDir a, b;
    const std::uint64_t s = seed("small pool");
    Manifest m = layout(ModelSpec::parse(kDiskModel), {.dp = 2, .seed = s});
    init(m, a.path.string(), engine, pool, {.jobs = 4}).commit();
    BOOST_TEST(verify(m, engine, pool, {.jobs = 4}).partitions == m.parts.size());
    check_files(m);
    Written w;
    const Manifest n = reshard(m, 3, b.path.string(), engine, pool, {.jobs = 4}, w);
    w.commit();
    BOOST_TEST(verify(n, engine, pool, {}).partitions == n.parts.size());
    std::vector<std::byte> got;
    cat(n, 0, "master", engine, pool, [&](std::span<const std::byte> p) { got.insert(got.end(), p.begin(), p.end()); });
    BOOST_TEST((got == encoded(n, n.tensors[0], DType::fp32, 0, n.tensors[0].numel)));
    mem::PinnedPool four({.bytes = 4 * pc.buffer, .buffer = pc.buffer, .allocator = "host"}, &engine);
    Manifest again = layout(ModelSpec::parse(kDiskModel), {.dp = 2, .seed = s});
    const std::string msg = what_of<UsageError>([&] { (void)init(again, b.path.string() + "/x", engine, four, {}); }, "4 buffers");
    BOOST_TEST(contains(msg, "needs at least 5 buffers"), msg);
}

BOOST_AUTO_TEST_CASE(verify_finds_a_flipped_byte_and_a_short_file) {
    Rig rig;
    TempDir dir;
    std::mt19937_64 rng(seed("corruption"));
    Manifest m = make(rig, dir.path.string(), {.dp = 3, .seed = rng()});
    auto part = [&](const std::string& tensor, unsigned rank, const std::string& state) -> const Partition& {
        const std::size_t t = m.find_tensor(tensor);
        for (const Partition& p : m.parts)
            if (p.tensor == t && p.rank == rank && p.state == state) return p;
        BOOST_FAIL("no partition");
        return m.parts.front();
    };
    {  // a byte inside a partition's data
        const Partition& p = part("h.1.mlp.c_fc.weight", 1, "master");
        const std::string path = m.path_of(p);
        const std::uint64_t at = p.offset + rng() % ((p.last - p.first) * 4);
        flip(path, at);
        try {
            verify(m, rig.engine, rig.pool, {});
            BOOST_ERROR("verify passed over a flipped byte");
        } catch (const DataError& e) {
            const std::string msg = e.what();
            BOOST_TEST_MESSAGE(msg);
            BOOST_TEST(contains(msg, "xxh3 mismatch: h.1.mlp.c_fc.weight rank 1 master"), msg);
            BOOST_TEST(contains(msg, path), msg);
            BOOST_TEST(contains(msg, "at offset " + std::to_string(p.offset)), msg);
            BOOST_TEST(e.path() == path);
            BOOST_TEST(e.rank() == 1);
        }
        flip(path, at);  // back as it was: that byte was the whole difference
        BOOST_TEST(verify(m, rig.engine, rig.pool, {}).partitions == m.parts.size());
    }
    {  // the zero padding past numel is inside `bytes`, so it counts
        const Partition& p = part("wte.weight", 2, "param");
        BOOST_REQUIRE(p.last - p.first < p.bytes / 2);
        flip(m.path_of(p), p.offset + p.bytes - 1);
        const std::string msg = what_of<DataError>([&] { verify(m, rig.engine, rig.pool, {}); }, "padding");
        BOOST_TEST(contains(msg, "wte.weight rank 2 param"), msg);
        flip(m.path_of(p), p.offset + p.bytes - 1);
    }
    {  // the alignment gap after `bytes` is no partition's: not hashed
        const Partition& p = part("h.0.ln_1.weight", 0, "exp_avg");
        BOOST_REQUIRE(align_up(p.offset + p.bytes, 4096) > p.offset + p.bytes);
        flip(m.path_of(p), p.offset + p.bytes + 7);
        BOOST_TEST(verify(m, rig.engine, rig.pool, {}).partitions == m.parts.size());
    }
    {  // a truncated file
        const Partition& last = part("ln_f.bias", 2, "exp_avg_sq");
        const std::string path = m.path_of(last);
        fs::resize_file(path, last.offset + 1);
        const std::string msg = what_of<DataError>([&] { verify(m, rig.engine, rig.pool, {}); }, "short file");
        BOOST_TEST(contains(msg, "short file: ln_f.bias rank 2 exp_avg_sq"), msg);
        BOOST_TEST(contains(msg, path), msg);
        fs::remove(path);
        BOOST_TEST(!what_of<MissingInputError>([&] { verify(m, rig.engine, rig.pool, {}); }, "missing file").empty());
    }
}

struct EnvVar {
    const char* name;
    EnvVar(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~EnvVar() { ::unsetenv(name); }
};

// ZINF_FAULTS is read by every File::open, so it reaches init's files.
BOOST_AUTO_TEST_CASE(a_failed_write_leaves_the_directory_as_it_was) {
    BOOST_REQUIRE(!std::getenv("ZINF_FAULTS"));
    Rig rig;
    TempDir dir;
    const std::uint64_t s = seed("write fault");
    const Manifest m = make(rig, dir.path.string(), {.dp = 2, .seed = s});
    std::map<std::string, std::uint64_t> before;
    for (const auto& f : m.files()) before[f] = xxh3(slurp(m.dir + "/" + f));
    Manifest again = layout(ModelSpec::parse(kDiskModel), {.dp = 2, .seed = s + 1});
    {
        EnvVar faults("ZINF_FAULTS", "write:2:EIO");
        try {
            init(again, dir.path.string(), rig.engine, rig.pool, {}).commit();
            BOOST_ERROR("init passed over a write error");
        } catch (const IoError& e) {
            BOOST_TEST_MESSAGE(e.what());
            BOOST_TEST(e.err() == EIO);
            BOOST_TEST(contains(e.what(), ".zinf-tmp"), e.what());
        }
    }
    {  // out of space while writing: an IoError, 73 as no space is everywhere (zinf(7))
        EnvVar faults("ZINF_FAULTS", "write:3:ENOSPC");
        try {
            init(again, dir.path.string(), rig.engine, rig.pool, {}).commit();
            BOOST_ERROR("init passed over ENOSPC");
        } catch (const IoError& e) {
            BOOST_TEST(e.err() == ENOSPC);
            BOOST_TEST(e.exit_code() == 73);
        }
    }
    BOOST_TEST(temporaries(dir.path.string()).empty());
    BOOST_TEST(again.dir.empty());
    for (const auto& f : m.files()) BOOST_TEST(xxh3(slurp(m.dir + "/" + f)) == before[f], f);
    BOOST_TEST(verify(m, rig.engine, rig.pool, {}).partitions == m.parts.size());
}

// init --force over a committed state: every file under the name the old
// manifest does not use, so the old state is whole until the new manifest
// replaces it; then its files go.
BOOST_AUTO_TEST_CASE(init_over_a_committed_state_writes_beside_it) {
    Rig rig;
    TempDir dir;
    const std::string d = dir.path.string(), path = d + "/manifest.jsonl";
    const std::uint64_t s = seed("beside");
    const Manifest old = make(rig, d, {.dp = 2, .seed = s});
    save_manifest(old, path);
    std::map<std::string, std::uint64_t> before;
    for (const auto& f : old.files()) before[f] = xxh3(slurp(d + "/" + f));

    Manifest next = layout(ModelSpec::parse(kDiskModel), {.dp = 2, .seed = s + 1});
    Written w = init(next, d, rig.engine, rig.pool, {});
    for (const auto& f : next.files()) BOOST_TEST(f.ends_with(".alt.bin"), f);
    BOOST_TEST(w.superseded.size() == old.files().size());
    w.commit();
    // Every file in place, the old manifest still the commit: it verifies.
    for (const auto& f : old.files()) BOOST_TEST(xxh3(slurp(d + "/" + f)) == before[f], f);
    BOOST_TEST(verify(read_manifest_file(path), rig.engine, rig.pool, {}).partitions == old.parts.size());
    save_manifest(next, path);
    w.retire();
    for (const auto& f : old.files()) BOOST_TEST(!fs::exists(d + "/" + f), f);
    check_files(read_manifest_file(path));

    // And back: the next init over it takes the .bin names again.
    Manifest third = layout(ModelSpec::parse(kDiskModel), {.dp = 2, .seed = s + 2});
    Written w3 = init(third, d, rig.engine, rig.pool, {});
    for (const auto& f : third.files()) BOOST_TEST(!f.ends_with(".alt.bin"), f);
    w3.commit();
    w3.unplace();  // as when the manifest could not be committed
    for (const auto& f : third.files()) BOOST_TEST(!fs::exists(d + "/" + f), f);
    BOOST_TEST(verify(read_manifest_file(path), rig.engine, rig.pool, {}).partitions == next.parts.size());
}

// A rank folder that is a link leading outside: refused before anything
// is written there (init) or read (verify, check_paths).
BOOST_AUTO_TEST_CASE(a_rank_folder_leading_outside_is_refused) {
    Rig rig;
    TempDir dir, outside;
    const std::string d = dir.path.string();
    const Manifest m = make(rig, d, {.dp = 2, .seed = seed("outside")});
    fs::rename(d + "/rank1", outside.file("rank1"));
    fs::create_directory_symlink(outside.file("rank1"), d + "/rank1");
    const std::string msg = what_of<DataError>([&] { check_paths(m); }, "check_paths");
    BOOST_TEST(contains(msg, "rank1"), msg);
    BOOST_TEST(contains(msg, "outside the data directory"), msg);
    BOOST_TEST(!what_of<DataError>([&] { (void)verify(m, rig.engine, rig.pool, {}); }, "verify").empty());
    fs::remove(d + "/rank1");
    fs::create_directory_symlink(outside.path, d + "/rank1");
    Manifest again = layout(ModelSpec::parse(kDiskModel), {.dp = 2});
    BOOST_TEST(!what_of<DataError>([&] { (void)init(again, d, rig.engine, rig.pool, {}); }, "init").empty());
    // Nothing made outside: it holds the moved folder alone.
    BOOST_TEST(std::distance(fs::directory_iterator(outside.path), fs::directory_iterator()) == 1);
}

BOOST_AUTO_TEST_CASE(a_disk_too_small_fails_before_writing, *utf::precondition(CanMount{"tmpfs", "size=1m"})) {
    Rig rig;
    Mount small("tmpfs", "size=1m");  // 1MiB
    BOOST_REQUIRE(small.ok);
    Manifest m = layout(ModelSpec::parse(kDiskModel), {.dp = 1, .seed = seed("small disk")});
    BOOST_REQUIRE(m.total_bytes() > 2 * MiB);
    const std::string dir = small.dir.file("state");
    try {
        (void)init(m, dir, rig.engine, rig.pool, {});
        BOOST_ERROR("init passed on a 1MiB file system");
    } catch (const IoError& e) {
        BOOST_TEST_MESSAGE(e.what());
        BOOST_TEST(e.err() == ENOSPC);
        BOOST_TEST(contains(e.what(), "not enough space"), e.what());
        BOOST_TEST(contains(e.what(), "nothing was written"), e.what());
    }
    BOOST_TEST(!fs::exists(dir + "/rank0"));
    BOOST_TEST(m.dir.empty());
}

// Issue 29, finding 2. Probe: zinf-shard export in a loop while zinf-train
// ran: 20/20 exits 0, 5 files matched no committed step (tensors from steps
// 16 and 18 mixed; one from no step at all): export checked the hashes,
// then read the data a second time unchecked. A writer now cannot run beside
// it (the lock); one that ignores the lock changes bytes the export has
// read, and the export, checking the state again before its rename, refuses
// (65) and writes nothing.
BOOST_AUTO_TEST_CASE(export_refuses_a_state_that_changed_while_it_was_read) {
    Rig rig;
    TempDir dir, out;
    const Manifest m = make(rig, dir.path.string(), {.dp = 2, .param_dtype = DType::fp32, .seed = seed("torn")});
    const std::string to = out.file("torn.safetensors");
    RunOptions ro;
    bool changed = false;
    const auto victim = std::find_if(m.parts.begin(), m.parts.end(),
                                     [](const Partition& p) { return p.rank == 1 && p.state == "param"; });
    BOOST_REQUIRE(victim != m.parts.end());
    ro.progress = [&](std::uint64_t) {
        if (changed) return;
        changed = true;  // a writer that ignores the lock, half-way through
        flip(m.path_of(*victim), victim->offset);
    };
    const std::string what = what_of<DataError>(
        [&] { (void)export_weights(m, to, WeightFormat::safetensors, rig.engine, rig.pool, ro); }, "export");
    BOOST_TEST(changed);
    BOOST_TEST(contains(what, "changed while it was exported"), what);
    BOOST_TEST(!fs::exists(to));
    BOOST_TEST(std::distance(fs::directory_iterator(out.path), fs::directory_iterator()) == 0);
}

// Issue 29, finding 3. Probe: `export --to base/rank0/master.bin --force`
// and `--to base/manifest.jsonl --force` exited 0 and destroyed the state.
// Any output inside a data directory (or a rank folder) is refused (64),
// before anything is read or written.
BOOST_AUTO_TEST_CASE(export_refuses_an_output_inside_the_state) {
    Rig rig;
    TempDir dir;
    const Manifest m = make(rig, dir.path.string(), {.dp = 2, .seed = seed("inside")});
    std::map<std::string, std::uint64_t> before;
    for (const auto& f : m.files()) before[f] = xxh3(slurp(m.dir + "/" + f));
    for (const std::string& to : {m.dir + "/rank0/master.bin", m.dir + "/manifest.jsonl", m.dir + "/weights.bin",
                                 m.dir + "/rank1/../rank1/param.bin", std::string()}) {
        const std::string what = what_of<UsageError>(
            [&] { (void)export_weights(m, to, WeightFormat::llmc, rig.engine, rig.pool, {}); }, "export " + to);
        BOOST_TEST(!what.empty(), to);
    }
    // Another data directory too: it holds a lock file.
    TempDir other;
    (void)make(rig, other.path.string(), {.dp = 1});
    BOOST_TEST(!what_of<UsageError>([&] {
                    (void)export_weights(m, other.file("rank0/param.bin"), WeightFormat::llmc, rig.engine, rig.pool, {});
                }, "export into another data directory").empty());
    for (const auto& f : m.files()) BOOST_TEST(xxh3(slurp(m.dir + "/" + f)) == before[f], f);
}

// Issue 29, finding 11. Probe: killed exports left full-size temporaries
// (5 of 20 kills, 59 MB each) that a later export did not remove. Now the
// next export to the same file removes them, but never one a live export
// still writes (it holds a flock on it).
BOOST_AUTO_TEST_CASE(export_removes_what_killed_exports_left) {
    Rig rig;
    TempDir dir, out;
    const Manifest m = make(rig, dir.path.string(), {.dp = 1, .seed = seed("stale exports")});
    const std::string to = out.file("w.bin");
    const std::string dead = to + ".tmp.0123456789abcdef", live = to + ".tmp.fedcba9876543210";
    const std::string other = to + ".tmp.notmine";
    for (const auto& f : {dead, live, other}) std::ofstream(f) << "left";
    Fd held = Fd::open(live, O_RDONLY);
    BOOST_REQUIRE(::flock(held.get(), LOCK_EX | LOCK_NB) == 0);  // a live export's
    (void)export_weights(m, to, WeightFormat::llmc, rig.engine, rig.pool, {});
    BOOST_TEST(!fs::exists(dead));
    BOOST_TEST(fs::exists(live));
    BOOST_TEST(fs::exists(other));  // not a name export makes
    BOOST_TEST(fs::exists(to));
}

// Issue 29, finding 1: the lock (tests/e2e/round2.sh runs the probe's two
// trainers). Across processes a writer's exclusive lock refuses another
// writer and a reader; readers share. Within one process a lock held is
// shared, not taken again (a writer reading its own state).
BOOST_AUTO_TEST_CASE(a_data_directory_has_one_writer_or_many_readers) {
    TempDir dir;
    const std::string d = dir.path.string();
    // Another process: flock(1) (util-linux), exit 0 when it got the lock.
    // (A forked child would share this process's open lock file.)
    auto in_child = [&](LockMode mode) {
        const std::string cmd = std::string("flock -n ") + (mode == LockMode::exclusive ? "-x " : "-s ") + "'" + d +
                                "/" + kLockFile + "' true";
        const int status = std::system(cmd.c_str());
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 75;
    };
    {
        Lock w = lock_folder(d, LockMode::exclusive, true);
        BOOST_TEST(fs::exists(d + "/" + kLockFile));
        BOOST_TEST(in_child(LockMode::exclusive) == 75);
        BOOST_TEST(in_child(LockMode::shared) == 75);
        Lock again = lock_folder(d, LockMode::shared);  // this process's own: shared with it
        BOOST_TEST(again.held());
    }
    BOOST_TEST(in_child(LockMode::exclusive) == 0);  // released with its Lock
    {
        Lock r = lock_folder(d, LockMode::shared);
        BOOST_TEST(in_child(LockMode::shared) == 0);
        BOOST_TEST(in_child(LockMode::exclusive) == 75);
    }
    // A writer's folder that it made and then failed in goes again.
    const std::string fresh = d + "/new/run";
    {
        Lock w = lock_folder(fresh, LockMode::exclusive, true);
        w.abandon();
    }
    BOOST_TEST(!fs::exists(d + "/new"));
}

// A GPT-2's import tells a safetensors file from a JSON index of shards by
// its first byte and what its first 8 bytes say as a length: a header length
// whose low byte is '{' (123) is a safetensors file still, imported value
// for value; a JSON file, or a '{' too short to hold a length, is refused
// (65) saying it is JSON, and nothing is written.
BOOST_AUTO_TEST_CASE(import_tells_safetensors_whose_length_starts_with_a_brace_from_json) {
    Rig rig;
    TempDir dir, out, again;
    const Manifest m = make(rig, dir.path.string(), {.dp = 1, .param_dtype = DType::fp32, .seed = seed("brace")});
    const std::string plain = out.file("w.safetensors");
    (void)export_weights(m, plain, WeightFormat::safetensors, rig.engine, rig.pool, {});
    const std::vector<std::byte> file = slurp(plain);
    BOOST_REQUIRE(file.size() > 8);
    std::uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | std::to_integer<std::uint64_t>(file[static_cast<std::size_t>(i)]);
    BOOST_REQUIRE(8 + len <= file.size());
    // The same file with its header padded by spaces (the format allows
    // them) to a length whose low byte is '{'.
    std::uint64_t padded = len;
    while ((padded & 0xff) != '{') ++padded;
    std::vector<std::byte> brace(8);
    for (int i = 0; i < 8; ++i) brace[static_cast<std::size_t>(i)] = std::byte(padded >> (8 * i) & 0xff);
    brace.insert(brace.end(), file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(len));
    brace.insert(brace.end(), padded - len, std::byte{' '});
    brace.insert(brace.end(), file.begin() + 8 + static_cast<std::ptrdiff_t>(len), file.end());
    BOOST_REQUIRE(std::to_integer<char>(brace[0]) == '{');
    const std::string braced = out.file("brace.safetensors");
    write_file(braced, brace);

    Manifest n = layout(ModelSpec::parse(kDiskModel), {.dp = 1, .param_dtype = DType::fp32, .seed = seed("other")});
    Written w = import_weights(n, braced, again.path.string(), rig.engine, rig.pool, {});
    w.commit();
    for (std::size_t t = 0; t < m.tensors.size(); ++t)
        BOOST_TEST((cat_bytes(m, t, "param", rig) == cat_bytes(n, t, "param", rig)), m.tensors[t].name);

    for (const std::string json : {std::string(R"({"metadata": {}, "weight_map": {"wte": "a.safetensors"}})"),
                                   std::string("{\n}")}) {
        const std::string index = out.file("model.safetensors.index.json");
        write_file(index, std::as_bytes(std::span(json.data(), json.size())));
        TempDir none;
        Manifest k = layout(ModelSpec::parse(kDiskModel), {.dp = 1});
        const std::string what = what_of<DataError>(
            [&] { (void)import_weights(k, index, none.path.string(), rig.engine, rig.pool, {}); }, "import " + json);
        BOOST_TEST(contains(what, "is JSON"), what);
        BOOST_TEST(std::distance(fs::directory_iterator(none.path), fs::directory_iterator()) == 0);
    }
}

BOOST_AUTO_TEST_SUITE_END()
