// Unit tests of libzinf shard: model specs and presets (exact parameter
// counts, the paper's own table against 12*L*h^2), the tensor list and its
// tiles, the layout of partitions over ranks and files, the manifest (round
// trip, unknown keys kept, every malformed input a DataError naming its line).
// The values are in test_shard_values, the state on disk in test_shard_disk.
#define BOOST_TEST_MODULE shard
#include "shard_testing.hpp"

#include <zinf/family.hpp>

using namespace zinf;
using namespace zinf::shard;
using namespace zinf::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ===========================================================================
BOOST_AUTO_TEST_SUITE(model)

BOOST_AUTO_TEST_CASE(presets_parse_and_count_exactly) {
    // Every family's presets: a name reads as its entry's spec, in that family.
    std::set<std::string> names;
    std::size_t gpt = 0;
    for (const Family& f : families())
        for (const Preset& p : f.presets) {
            BOOST_TEST(names.insert(p.name).second, "preset " << p.name << " twice");
            const ModelSpec s = ModelSpec::parse(p.name);
            BOOST_TEST((s == ModelSpec::parse(p.spec)), p.name << ": " << p.spec);
            BOOST_TEST((s.arch == f.arch), p.name << " is not in its family " << f.name);
            BOOST_TEST(std::string_view(p.spec).starts_with(std::string(f.name) + ":"), p.spec);
            BOOST_TEST(s.preset == p.name);
            BOOST_TEST(s.hidden % s.heads == 0u, p.name);
            // The canonical explicit form names the same model (and no preset).
            const ModelSpec back = ModelSpec::parse(s.to_string());
            BOOST_TEST((back == s), p.name << ": " << s.to_string());
            BOOST_TEST(back.preset.empty());
            if (f.arch != Arch::gpt) continue;
            ++gpt;
            BOOST_TEST(s.vocab == 50257u);
            BOOST_TEST(s.seq == 1024u);
        }
    BOOST_TEST(gpt == 20u);
    BOOST_TEST(names.size() == 25u);
    // gpt2-124m is gpt:layers=12,hidden=768,heads=12; qwen2.5-0.5b a Qwen2.
    const ModelSpec small = ModelSpec::parse("gpt2-124m");
    BOOST_TEST(small.layers == 12u);
    BOOST_TEST(small.hidden == 768u);
    BOOST_TEST(small.heads == 12u);
    BOOST_TEST((ModelSpec::parse("qwen2.5-0.5b").arch == Arch::qwen2));
    BOOST_TEST((ModelSpec::parse("smollm-135m").arch == Arch::llama));
    // The refusal of an unknown name lists every family's form and preset.
    const std::string msg = what_of<UsageError>([] { (void)ModelSpec::parse("gpt3"); }, "gpt3");
    for (const Family& f : families()) {
        BOOST_TEST(contains(msg, std::string(f.name) + ":" + f.keys), msg);
        for (const Preset& p : f.presets) BOOST_TEST(contains(msg, p.name), msg);
    }
    BOOST_TEST(ModelSpec::parse("gpt2-124m").parameters() == 124439808u);
    BOOST_TEST(ModelSpec::parse("gpt2-350m").parameters() == 354823168u);
    BOOST_TEST(ModelSpec::parse("gpt2-1.5b").parameters() == 1557611200u);
    // V*C + T*C + L*(12C^2 + 13C) + 2C, by hand for the small model.
    BOOST_TEST(ModelSpec::parse(kSmall).parameters() == 97u * 64 + 16 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
}

BOOST_AUTO_TEST_CASE(explicit_specs_round_trip_through_to_string) {
    const ModelSpec s = ModelSpec::parse("gpt:layers=3,hidden=96,heads=3,vocab=101,seq=17");
    BOOST_TEST(s.layers == 3u);
    BOOST_TEST(s.hidden == 96u);
    BOOST_TEST(s.heads == 3u);
    BOOST_TEST(s.vocab == 101u);
    BOOST_TEST(s.seq == 17u);
    BOOST_TEST(s.preset.empty());
    BOOST_TEST(s.to_string() == "gpt:layers=3,hidden=96,heads=3,vocab=101,seq=17");
    BOOST_TEST((ModelSpec::parse(s.to_string()) == s));
    // Any key order gives the canonical form.
    BOOST_TEST(ModelSpec::parse("gpt:seq=17,vocab=101,heads=3,hidden=96,layers=3").to_string() == s.to_string());
    // Defaults: GPT-2's vocabulary and context, one head per 64 channels.
    const ModelSpec d = ModelSpec::parse("gpt:layers=2,hidden=128");
    BOOST_TEST(d.to_string() == "gpt:layers=2,hidden=128,heads=2,vocab=50257,seq=1024");
    BOOST_TEST(ModelSpec::parse("gpt:layers=2,hidden=100").heads == 1u);
    BOOST_TEST(!(ModelSpec::parse("gpt:layers=2,hidden=128,heads=4") == d));
}

BOOST_AUTO_TEST_CASE(bad_specs_are_usage_errors_naming_the_problem) {
    struct Case {
        const char* spec;
        const char* says;
    };
    const Case cases[] = {
        {"gpt:layers=2,hidden=64,heads=2,colour=3", "unknown key 'colour'"},
        {"gpt:layers=0,hidden=64,heads=2", "layers=0 is not a positive integer"},
        {"gpt:layers=2,hidden=0", "hidden=0"},
        {"gpt:layers=2,heads=2", "layers and hidden are required"},
        {"gpt:hidden=64", "layers and hidden are required"},
        {"gpt:layers=2,hidden=64,heads=3", "not a multiple of heads 3"},
        {"gpt:layers=2,hidden=64,heads=0", "heads=0"},
        {"gpt:layers=-1,hidden=64", "layers=-1"},
        {"gpt:layers=2x,hidden=64", "layers=2x"},
        {"gpt:layers=2,hidden=99999999999999999999999", "hidden=99999999999999999999999"},
        {"gpt:layers=2,hidden=33554432,heads=1", "too large"},
        {"gpt:layers=2,,hidden=64", "stray comma"},
        {"gpt:layers=2,hidden=64,", "stray comma"},
        {"gpt:layers=2,hidden=64,layers=3", "layers given twice"},
        {"gpt:layers", "'layers' is not key=value"},
        {"gpt:", "layers and hidden are required"},
        {"", "expected gpt:layers="},
        {"gpt2", "expected gpt:layers="},
        {"GPT2-124M", "expected gpt:layers="},
        {"bert:layers=2,hidden=64", "expected gpt:layers="},
    };
    for (const auto& c : cases) {
        const std::string msg = what_of<UsageError>([&] { (void)ModelSpec::parse(c.spec); }, c.spec);
        BOOST_TEST(contains(msg, c.says), "'" << c.spec << "' -> " << msg);
        BOOST_TEST(contains(msg, "'" + std::string(c.spec) + "'"), "message names the text: " << msg);
    }
}

// parse() guards the arithmetic of parameters() and paper_estimate(); a spec
// it accepts must have counts that fit 64 bits. 10000 layers of 2^24
// channels are 12 * 10000 * 2^48 = 3.4e19 > 2^64 parameters. (Fails today:
// the guard bounds hidden, vocab, seq and layers one by one, not the count.)
BOOST_AUTO_TEST_CASE(specs_whose_counts_overflow_are_refused) {
    for (const char* spec : {"gpt:layers=10000,hidden=16777216,heads=1", "gpt:layers=1048576,hidden=16777216,heads=1",
                             "gpt:layers=1048576,hidden=4194304,heads=1"}) {
        try {
            const ModelSpec s = ModelSpec::parse(spec);
            // Accepted: then the counts must be exact (long double has 64 mantissa bits).
            const long double C = s.hidden, L = s.layers;
            const long double exact = s.vocab * C + s.seq * C + L * (12 * C * C + 13 * C) + 2 * C;
            BOOST_TEST(static_cast<long double>(s.parameters()) == exact,
                       spec << ": parameters() " << s.parameters() << " but the count is " << static_cast<double>(exact));
            BOOST_TEST(static_cast<long double>(s.paper_estimate()) == 12 * L * C * C, spec);
        } catch (const UsageError& e) {
            BOOST_TEST(contains(e.what(), "too large"), e.what());
        }
    }
}

// The paper's appendix tables give each model a size; most agree with its own
// estimate 12*L*h^2 within 3%. Where a row does not, the preset keeps the
// layers and hidden size as printed, and this pins the mismatch: the four
// that man/zinf-shard.1 explains, and h16k (+7.4%) and h64k (+3.1%), which
// it does not single out.
BOOST_AUTO_TEST_CASE(paper_configurations_against_their_labels) {
    const std::set<std::string> agree = {"paper-10b", "paper-13b", "paper-20b", "paper-1t",  "paper-h32k",
                                         "paper-8b",  "paper-4b",  "paper-16b", "paper-64b", "paper-260b"};
    // name -> (layers, hidden, 12*L*h^2) of the rows whose label is off by more than 3%.
    const std::map<std::string, std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> off = {
        {"paper-70b", {125, 8192, 100'663'296'000}},   // labelled 70B
        {"paper-1.4b", {40, 1536, 1'132'462'080}},     // labelled 1.4B
        {"paper-h8k", {1, 8192, 805'306'368}},         // labelled 900M
        {"paper-275m", {5, 2048, 251'658'240}},        // labelled 275M
        {"paper-h16k", {1, 16384, 3'221'225'472}},     // labelled 3B (+7.4%)
        {"paper-h64k", {1, 65536, 51'539'607'552}},    // labelled 50B (+3.08%)
    };
    std::ostringstream table;
    table << "# preset        layers  hidden  label        12*L*h^2   diff\n";
    std::size_t seen = 0;
    for (const Preset& p : family(Arch::gpt).presets) {
        if (!std::string_view(p.name).starts_with("paper-")) continue;
        ++seen;
        const ModelSpec s = ModelSpec::parse(p.name);
        const std::uint64_t label = parse_label(p.label), est = s.paper_estimate();
        BOOST_TEST(est == 12 * s.layers * s.hidden * s.hidden);
        const double diff = (static_cast<double>(est) - static_cast<double>(label)) / static_cast<double>(label);
        char row[160];
        std::snprintf(row, sizeof row, "%-14s %7llu %7llu  %-6s %15llu %+6.2f%%\n", p.name,
                      static_cast<unsigned long long>(s.layers), static_cast<unsigned long long>(s.hidden), p.label,
                      static_cast<unsigned long long>(est), 100 * diff);
        table << row;
        BOOST_TEST((agree.count(p.name) + off.count(p.name) == 1u), p.name << " is in neither list (or both)");
        if (agree.count(p.name)) {
            BOOST_TEST(std::abs(diff) <= 0.03, p.name << ": " << est << " vs label " << p.label);
        } else if (auto it = off.find(p.name); it != off.end()) {
            const auto [L, h, e] = it->second;
            BOOST_TEST(s.layers == L, p.name);
            BOOST_TEST(s.hidden == h, p.name);
            BOOST_TEST(est == e, p.name);
            BOOST_TEST(std::abs(diff) > 0.03, p.name << " now agrees with its label: move it to the other list");
        }
    }
    BOOST_TEST(seen == agree.size() + off.size());
    BOOST_TEST_MESSAGE(table.str());
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(tensor_list)

BOOST_AUTO_TEST_CASE(gpt2_124m_in_execution_order) {
    const ModelSpec spec = ModelSpec::parse("gpt2-124m");
    const auto ts = tensors(spec);
    BOOST_REQUIRE(ts.size() == 4u + 12u * 12u);
    const std::uint64_t C = 768;
    BOOST_TEST(ts.front().name == "wte.weight");
    BOOST_TEST(ts.front().shape == (std::vector<std::uint64_t>{50257, 768}), boost::test_tools::per_element());
    BOOST_TEST(ts[1].name == "wpe.weight");
    BOOST_TEST(ts[1].shape == (std::vector<std::uint64_t>{1024, 768}), boost::test_tools::per_element());
    BOOST_TEST(ts[2].name == "h.0.ln_1.weight");
    BOOST_TEST(ts[ts.size() - 2].name == "ln_f.weight");
    BOOST_TEST(ts.back().name == "ln_f.bias");
    struct Row {
        const char* name;
        std::vector<std::uint64_t> shape;
        InitKind init;
    };
    const Row layer[] = {
        {"ln_1.weight", {C}, InitKind::ones},          {"ln_1.bias", {C}, InitKind::zeros},
        {"attn.c_attn.weight", {C, 3 * C}, InitKind::normal}, {"attn.c_attn.bias", {3 * C}, InitKind::zeros},
        {"attn.c_proj.weight", {C, C}, InitKind::residual},   {"attn.c_proj.bias", {C}, InitKind::zeros},
        {"ln_2.weight", {C}, InitKind::ones},          {"ln_2.bias", {C}, InitKind::zeros},
        {"mlp.c_fc.weight", {C, 4 * C}, InitKind::normal},    {"mlp.c_fc.bias", {4 * C}, InitKind::zeros},
        {"mlp.c_proj.weight", {4 * C, C}, InitKind::residual}, {"mlp.c_proj.bias", {C}, InitKind::zeros},
    };
    for (std::size_t l = 0; l < 12; ++l)
        for (std::size_t k = 0; k < 12; ++k) {
            const Tensor& t = ts[2 + l * 12 + k];
            BOOST_TEST(t.name == "h." + std::to_string(l) + "." + layer[k].name);
            BOOST_TEST(t.shape == layer[k].shape, boost::test_tools::per_element());
            BOOST_TEST((t.init == layer[k].init), t.name);
        }
    BOOST_TEST((ts[0].init == InitKind::normal && ts[1].init == InitKind::normal));
    BOOST_TEST((ts.back().init == InitKind::zeros && ts[ts.size() - 2].init == InitKind::ones));
    std::uint64_t sum = 0;
    for (const Tensor& t : ts) {
        std::uint64_t prod = 1;
        for (auto d : t.shape) prod *= d;
        BOOST_TEST(t.numel == prod, t.name);
        BOOST_TEST(t.key == t.name);
        BOOST_TEST(t.cols == t.numel);
        BOOST_TEST(t.key_cols == t.numel);
        BOOST_TEST(t.col0 == 0u);
        sum += t.numel;
    }
    BOOST_TEST(sum == spec.parameters());
}

void check_tiles(const ModelSpec& spec, unsigned tile) {
    BOOST_TEST_CONTEXT(spec.to_string() << " tile " << tile) {
        const auto whole = tensors(spec), tiled = tensors(spec, tile);
        const std::set<std::string> linear = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                              "mlp.c_proj.weight"};
        auto is_linear = [&](const std::string& name) {
            auto dot = name.find('.', 2);  // "h.<l>."
            return name.starts_with("h.") && linear.count(name.substr(dot + 1));
        };
        BOOST_REQUIRE(tiled.size() == whole.size() + spec.layers * 4 * (tile - 1));
        std::uint64_t sum_whole = 0, sum_tiled = 0;
        for (const auto& t : whole) sum_whole += t.numel;
        for (const auto& t : tiled) sum_tiled += t.numel;
        BOOST_TEST(sum_tiled == sum_whole);
        BOOST_TEST(sum_tiled == spec.parameters());
        std::size_t j = 0;
        for (const Tensor& w : whole) {
            if (!is_linear(w.name)) {
                BOOST_TEST(tiled[j].name == w.name);
                BOOST_TEST(tiled[j].numel == w.numel);
                ++j;
                continue;
            }
            const std::uint64_t in = w.shape[0], out = w.shape[1];
            std::uint64_t col = 0;
            for (unsigned k = 0; k < tile; ++k, ++j) {
                const Tensor& t = tiled[j];
                BOOST_TEST(t.name == w.name + ".tile" + std::to_string(k));
                BOOST_TEST(t.key == w.name);
                BOOST_REQUIRE(t.shape.size() == 2u);
                BOOST_TEST(t.shape[0] == in);
                BOOST_TEST(t.shape[1] >= 1u);
                BOOST_TEST(t.cols == t.shape[1]);
                BOOST_TEST(t.key_cols == out);
                BOOST_TEST(t.col0 == col);
                BOOST_TEST(t.numel == in * t.shape[1]);
                BOOST_TEST((t.init == w.init));
                // Splits as even as they come: sizes differ by at most one.
                BOOST_TEST(t.shape[1] >= out / tile);
                BOOST_TEST(t.shape[1] <= out / tile + 1);
                col += t.shape[1];
            }
            BOOST_TEST(col == out, w.name << ": the tiles' columns sum to the out dim");
        }
        BOOST_TEST(j == tiled.size());
    }
}

BOOST_AUTO_TEST_CASE(tiles_split_linear_weights_by_columns) {
    check_tiles(ModelSpec::parse("gpt2-124m"), 3);
    check_tiles(ModelSpec::parse("gpt:layers=2,hidden=70,heads=2,vocab=97,seq=16"), 3);
    check_tiles(ModelSpec::parse("gpt:layers=2,hidden=70,heads=2,vocab=97,seq=16"), 70);  // one column each
    const ModelSpec s = ModelSpec::parse(kSmall);
    for (unsigned bad : {0u, 65u, 1000u}) {
        const std::string msg = what_of<UsageError>([&] { (void)tensors(s, bad); }, "tile " + std::to_string(bad));
        BOOST_TEST(contains(msg, "--tile " + std::to_string(bad)), msg);
    }
    BOOST_TEST(tensors(s, 64).size() == tensors(s).size() + 2 * 4 * 63);
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(partition_layout)

void check_layout(const ModelSpec& spec, const LayoutOptions& o, const std::vector<std::string>& states) {
    BOOST_TEST_CONTEXT(spec.to_string() << " dp " << o.dp << " tile " << o.tile << " " << dtype_name(o.param_dtype)
                                        << (o.train ? " train" : " inference") << " align " << o.alignment) {
        const Manifest m = layout(spec, o);
        BOOST_TEST(m.states == states, boost::test_tools::per_element());
        BOOST_TEST(m.dir.empty());
        BOOST_TEST(!m.initialised());
        BOOST_TEST(m.created_by == std::string("zinf-shard ") + version());
        const auto ts = tensors(spec, o.tile);
        BOOST_REQUIRE(m.tensors.size() == ts.size());
        BOOST_REQUIRE(m.parts.size() == ts.size() * o.dp * states.size());
        std::map<std::tuple<std::size_t, unsigned, std::string>, const Partition*> at;
        for (const Partition& p : m.parts)
            BOOST_TEST(at.emplace(std::tuple(p.tensor, p.rank, p.state), &p).second,
                       "twice: tensor " << p.tensor << " rank " << p.rank << " " << p.state);
        BOOST_REQUIRE(at.size() == m.parts.size());
        for (std::size_t t = 0; t < ts.size(); ++t) {
            BOOST_TEST(m.tensors[t].name == ts[t].name);
            const std::uint64_t numel = ts[t].numel, per = (numel + o.dp - 1) / o.dp;
            BOOST_TEST(m.elements_per_rank(m.tensors[t]) == per);
            for (const auto& s : states) {
                std::uint64_t next = 0;  // the ranks' ranges tile [0, numel) in rank order
                for (unsigned r = 0; r < o.dp; ++r) {
                    const Partition& p = *at.at({t, r, s});
                    BOOST_TEST(p.first == next, ts[t].name << " rank " << r << " " << s);
                    BOOST_TEST(p.last >= p.first);
                    BOOST_TEST(p.last - p.first <= per);
                    if (p.last < numel) BOOST_TEST(p.last - p.first == per);
                    next = p.last;
                    const DType dt = s == "param" ? o.param_dtype : DType::fp32;
                    BOOST_TEST((p.dtype == dt), s);
                    BOOST_TEST((p.tier == (s == "param" ? o.param_tier : o.optim_tier)), s);
                    BOOST_TEST(p.bytes == per * dtype_bytes(dt));
                    BOOST_TEST(p.file == "rank" + std::to_string(r) + "/" + s + ".bin");
                    BOOST_TEST(!p.xxh3.has_value());
                    BOOST_TEST(p.line == 0u);
                }
                BOOST_TEST(next == numel, ts[t].name << " " << s << ": ranges end at numel");
            }
        }
        // Files: each (rank, state) once; partitions packed in execution
        // order, each at the first aligned offset after the one before.
        const auto files = m.files();
        BOOST_TEST(files.size() == o.dp * states.size());
        BOOST_TEST(std::set<std::string>(files.begin(), files.end()).size() == files.size());
        std::map<std::string, std::vector<const Partition*>> by_file;
        std::uint64_t total = 0;
        for (const Partition& p : m.parts) {
            by_file[p.file].push_back(&p);
            total += p.bytes;
        }
        BOOST_TEST(m.total_bytes() == total);
        BOOST_TEST(by_file.size() == files.size());
        for (auto& [f, ps] : by_file) {
            std::sort(ps.begin(), ps.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
            BOOST_TEST(ps.size() == ts.size(), f);
            BOOST_TEST(ps.front()->offset == 0u, f);
            for (std::size_t i = 0; i < ps.size(); ++i) {
                BOOST_TEST(ps[i]->offset % o.alignment == 0u, f << " at " << ps[i]->offset);
                BOOST_TEST(ps[i]->tensor == i, f);
                if (i > 0) {
                    BOOST_TEST(ps[i]->offset >= ps[i - 1]->offset + ps[i - 1]->bytes, f << ": overlap");
                    BOOST_TEST(ps[i]->offset == align_up(ps[i - 1]->offset + ps[i - 1]->bytes, o.alignment), f);
                }
            }
            BOOST_TEST(m.file_bytes(f) == align_up(ps.back()->offset + ps.back()->bytes, o.alignment));
        }
    }
}

BOOST_AUTO_TEST_CASE(every_partition_once_ranges_tiling_aligned_packed) {
    const ModelSpec odd = ModelSpec::parse("gpt:layers=3,hidden=60,heads=3,vocab=101,seq=7");
    const ModelSpec small = ModelSpec::parse(kSmall);
    const std::vector<std::string> bf16_train = {"param", "master", "exp_avg", "exp_avg_sq"},
                                   fp32_train = {"param", "exp_avg", "exp_avg_sq"}, inference = {"param"};
    for (unsigned dp : {1u, 2u, 3u, 8u}) {
        check_layout(odd, {.dp = dp}, bf16_train);
        check_layout(odd, {.dp = dp, .param_dtype = DType::fp32}, fp32_train);
        check_layout(odd, {.dp = dp, .train = false}, inference);
        check_layout(odd, {.dp = dp, .param_dtype = DType::fp32, .train = false}, inference);
        check_layout(small, {.dp = dp, .tile = 3, .param_tier = Tier::cpu, .optim_tier = Tier::gpu, .alignment = 512},
                     bf16_train);
    }
    // More ranks than elements in the small tensors: empty ranges at the end.
    check_layout(odd, {.dp = 61}, bf16_train);
}

BOOST_AUTO_TEST_CASE(bad_layout_options_and_lookups) {
    const ModelSpec s = ModelSpec::parse(kSmall);
    BOOST_TEST(contains(what_of<UsageError>([&] { (void)layout(s, {.dp = 0}); }, "dp 0"), "--dp"));
    for (std::uint64_t a : {0ull, 256ull, 1000ull, 4097ull})
        BOOST_TEST(contains(what_of<UsageError>([&] { (void)layout(s, {.alignment = a}); }, "align"),
                            "--align " + std::to_string(a)));
    BOOST_TEST(contains(what_of<UsageError>([&] { (void)layout(s, {.tile = 0}); }, "tile 0"), "--tile 0"));
    // A dp inside --dp's range that makes more records than a manifest
    // holds: a usage error before anything is allocated, not bad_alloc.
    const std::string many = what_of<UsageError>(
        [] { (void)layout(ModelSpec::parse("gpt2-124m"), {.dp = 1u << 20}); }, "gpt2-124m dp 2^20");
    BOOST_TEST(contains(many, "148 tensors x 1048576 ranks x 4 states"), many);
    BOOST_TEST(contains(many, "at most dp 453438"), many);
    const Manifest m = layout(s, {.dp = 2, .tile = 2});
    BOOST_TEST(m.find_tensor("h.1.mlp.c_fc.weight.tile1") == 2u + 16 + 11);  // 16 tensors a layer with tile 2
    const std::string msg = what_of<DataError>([&] { (void)m.find_tensor("h.1.mlp.c_fc.weight"); }, "find");
    BOOST_TEST(contains(msg, "no tensor named 'h.1.mlp.c_fc.weight'"), msg);
    BOOST_TEST(contains(msg, "h.1.mlp.c_fc.weight.tile0"), msg);
    BOOST_TEST(contains(what_of<UsageError>([&] { (void)m.path_of(m.parts[0]); }, "path_of"), "no data directory"));
    BOOST_TEST(dtype_bytes(DType::bf16) == 2u);
    BOOST_TEST(dtype_bytes(DType::fp32) == 4u);
    BOOST_TEST((parse_dtype("fp32") == DType::fp32 && parse_tier("cpu") == Tier::cpu));
    BOOST_TEST(contains(what_of<UsageError>([] { (void)parse_dtype("fp16"); }, "fp16"), "'fp16'"));
    BOOST_TEST(contains(what_of<UsageError>([] { (void)parse_tier("disk"); }, "disk"), "'disk'"));
}

BOOST_AUTO_TEST_SUITE_END()

// ===========================================================================
BOOST_AUTO_TEST_SUITE(manifest)

std::string text_of(const Manifest& m) {
    std::ostringstream out;
    write_manifest(out, m);
    return out.str();
}

Manifest read_text(const std::string& text, const std::string& source = "test.jsonl") {
    std::istringstream in(text);
    return read_manifest(in, source);
}

// The what() of the DataError that reading `text` throws.
std::string read_error(const std::string& text, const std::string& context) {
    const std::string msg = what_of<DataError>([&] { (void)read_text(text, "bad.jsonl"); }, context);
    BOOST_TEST_MESSAGE(context << ": " << msg);
    return msg;
}

// A manifest as lines, to be edited one JSON record at a time (1-based).
struct Lines {
    std::vector<std::string> v;
    explicit Lines(const std::string& text) {
        std::istringstream in(text);
        for (std::string l; std::getline(in, l);) v.push_back(l);
    }
    json::Json get(std::size_t line) const { return json::Json::parse(v.at(line - 1)); }
    void put(std::size_t line, const json::Json& j) {
        std::string s = json::line(j);
        s.pop_back();
        v.at(line - 1) = s;
    }
    template <class F>
    Lines edit(std::size_t line, F f) const {
        Lines c = *this;
        json::Json j = c.get(line);
        f(j);
        c.put(line, j);
        return c;
    }
    // The line of the first record that `pred` accepts.
    std::size_t find(const std::function<bool(const json::Json&)>& pred) const {
        for (std::size_t i = 2; i <= v.size(); ++i)
            if (pred(get(i))) return i;
        BOOST_FAIL("no such record");
        return 0;
    }
    std::string str() const {
        std::string s;
        for (const auto& l : v) s += l + "\n";
        return s;
    }
};

void check_same(const Manifest& a, const Manifest& b) {
    BOOST_TEST((a.spec == b.spec));
    BOOST_TEST(a.spec.preset == b.spec.preset);
    BOOST_TEST(a.opts.dp == b.opts.dp);
    BOOST_TEST(a.opts.tile == b.opts.tile);
    BOOST_TEST((a.opts.param_dtype == b.opts.param_dtype));
    BOOST_TEST((a.opts.param_tier == b.opts.param_tier));
    BOOST_TEST((a.opts.optim_tier == b.opts.optim_tier));
    BOOST_TEST(a.opts.train == b.opts.train);
    BOOST_TEST(a.opts.alignment == b.opts.alignment);
    BOOST_TEST(a.opts.seed == b.opts.seed);
    BOOST_TEST(a.states == b.states, boost::test_tools::per_element());
    BOOST_TEST(a.dir == b.dir);
    BOOST_TEST(a.created_by == b.created_by);
    BOOST_TEST((a.extra == b.extra));
    BOOST_REQUIRE(a.tensors.size() == b.tensors.size());
    for (std::size_t i = 0; i < a.tensors.size(); ++i) BOOST_TEST(a.tensors[i].name == b.tensors[i].name);
    BOOST_REQUIRE(a.parts.size() == b.parts.size());
    for (std::size_t i = 0; i < a.parts.size(); ++i) {
        const Partition &p = a.parts[i], &q = b.parts[i];
        BOOST_TEST_CONTEXT("record " << i) {
            BOOST_TEST(p.tensor == q.tensor);
            BOOST_TEST(p.rank == q.rank);
            BOOST_TEST(p.state == q.state);
            BOOST_TEST((p.dtype == q.dtype));
            BOOST_TEST((p.tier == q.tier));
            BOOST_TEST(p.first == q.first);
            BOOST_TEST(p.last == q.last);
            BOOST_TEST(p.file == q.file);
            BOOST_TEST(p.offset == q.offset);
            BOOST_TEST(p.bytes == q.bytes);
            BOOST_TEST((p.xxh3 == q.xxh3));
            BOOST_TEST((p.extra == q.extra));
        }
    }
}

BOOST_AUTO_TEST_CASE(write_read_round_trip) {
    std::mt19937_64 rng(seed("manifest round trip"));
    for (const char* spec : {kSmall, "gpt2-124m"}) {
        Manifest m = layout(ModelSpec::parse(spec), {.dp = 3,
                                                     .tile = 2,
                                                     .param_tier = Tier::cpu,
                                                     .alignment = 8192,
                                                     .seed = rng()});
        m.dir = "/data/run 1";
        for (auto& p : m.parts)
            if (rng() % 2) p.xxh3 = rng();
        const std::string text = text_of(m);
        const Manifest back = read_text(text);
        check_same(m, back);
        for (std::size_t i = 0; i < back.parts.size(); ++i) BOOST_TEST(back.parts[i].line == i + 2);
        BOOST_TEST(text_of(back) == text);
        // The header says what a reader needs without the records.
        const json::Json h = json::Json::parse(text.substr(0, text.find('\n')));
        BOOST_TEST(h["schema"] == kManifestSchema);
        BOOST_TEST(h["model"] == m.spec.to_string());
        BOOST_TEST(h["parameters"] == m.spec.parameters());
        BOOST_TEST(h["records"] == m.parts.size());
        BOOST_TEST(h["dir"] == "/data/run 1");
        BOOST_TEST((h.contains("preset") == !m.spec.preset.empty()));
    }
    // An inference manifest in fp32, not initialised.
    const Manifest inf = layout(ModelSpec::parse(kSmall), {.dp = 2, .param_dtype = DType::fp32, .train = false});
    check_same(inf, read_text(text_of(inf)));
    BOOST_TEST(!contains(text_of(inf), "xxh3"));
    BOOST_TEST(!contains(text_of(inf), "\"dir\""));
}

BOOST_AUTO_TEST_CASE(save_and_read_a_file) {
    TempDir dir;
    Manifest m = layout(ModelSpec::parse(kSmall), {.dp = 2, .seed = seed("save manifest")});
    const std::string path = dir.file("m.jsonl");
    save_manifest(m, path);
    check_same(m, read_manifest_file(path));
    for (const auto& e : fs::directory_iterator(dir.path)) BOOST_TEST(e.path().filename() == "m.jsonl");
    const std::string msg = what_of<MissingInputError>([&] { (void)read_manifest_file(dir.file("absent")); }, "absent");
    BOOST_TEST(contains(msg, dir.file("absent")), msg);
}

BOOST_AUTO_TEST_CASE(unknown_keys_survive_write_read_write) {
    Manifest m = layout(ModelSpec::parse(kSmall), {.dp = 2, .seed = seed("unknown keys")});
    const Lines base(text_of(m));
    const json::Json note = {{"a", 1}};
    Lines mod = base.edit(1, [&](json::Json& h) {
        h["note"] = note;
        h["zz_future"] = json::Json::array({1, "two"});
    });
    mod = mod.edit(5, [&](json::Json& r) { r["note"] = note; });
    const Manifest back = read_text(mod.str());
    BOOST_TEST(back.extra->size() == 2u);
    BOOST_TEST(((*back.extra)["note"] == note));
    BOOST_TEST(((*back.extra)["zz_future"] == json::Json::array({1, "two"})));
    for (std::size_t i = 0; i < back.parts.size(); ++i)
        BOOST_TEST((*back.parts[i].extra == (i == 3 ? json::Json{{"note", note}} : json::Json::object())), i);
    BOOST_TEST(text_of(back) == mod.str());
    BOOST_TEST(text_of(read_text(text_of(back))) == mod.str());
}

BOOST_AUTO_TEST_CASE(malformed_manifests_are_data_errors_naming_the_line) {
    const Manifest m = layout(ModelSpec::parse(kSmall), {.dp = 2});
    const Lines base(text_of(m));
    const std::size_t n_lines = base.v.size();
    BOOST_REQUIRE(n_lines == 1 + 28u * 2 * 4);
    auto says = [](const std::string& msg, std::initializer_list<std::string> parts) {
        for (const auto& p : parts) BOOST_TEST(contains(msg, p), "expected '" << p << "' in: " << msg);
    };
    auto record_line = [&](const std::string& tensor, unsigned rank, const std::string& state) {
        return base.find([&](const json::Json& r) {
            return r["tensor"] == tensor && r["rank"] == rank && r["state"] == state;
        });
    };
    BOOST_TEST(read_text(base.str()).parts.size() == n_lines - 1);  // the base is fine

    {  // invalid JSON on line 3
        Lines l = base;
        l.v[2] = "{\"tensor\": \"wte.weight\", ";
        says(read_error(l.str(), "invalid JSON"), {"bad.jsonl: line 3: invalid JSON"});
    }
    {  // a missing key in a record and in the header
        says(read_error(base.edit(5, [](json::Json& r) { r.erase("offset"); }).str(), "missing offset"),
             {"line 5: missing key 'offset'"});
        says(read_error(base.edit(1, [](json::Json& h) { h.erase("seed"); }).str(), "missing seed"),
             {"line 1: missing key 'seed'"});
        says(read_error(base.edit(9, [](json::Json& r) { r["rank"] = "0"; }).str(), "mistyped rank"),
             {"line 9: key 'rank' must be a non-negative integer"});
    }
    {  // a record before any header, on line 1 and (after a blank line) on line 2
        Lines l = base;
        std::swap(l.v[0], l.v[1]);
        says(read_error(l.str(), "record first"), {"line 1: the first record must be the header"});
        l.v.insert(l.v.begin(), "   ");
        says(read_error(l.str(), "blank, record first"), {"line 2: the first record must be the header"});
    }
    {  // a duplicated record: both lines named
        Lines l = base;
        l.v[9] = l.v[3];
        const json::Json r = l.get(4);
        says(read_error(l.str(), "duplicate"),
             {"line 10: " + r["tensor"].get<std::string>() + " rank " + std::to_string(r["rank"].get<int>()) + " " +
                  r["state"].get<std::string>() + " again (first on line 4)"});
    }
    {  // a missing record
        Lines l = base;
        const json::Json r = l.get(7);
        l.v.erase(l.v.begin() + 6);
        says(read_error(l.str(), "missing record"),
             {"1 record(s) missing after line " + std::to_string(n_lines - 1),
              "the first: " + r["tensor"].get<std::string>() + " rank " + std::to_string(r["rank"].get<int>()) + " " +
                  r["state"].get<std::string>(),
              "header on line 1"});
    }
    {  // rank >= dp
        says(read_error(base.edit(6, [](json::Json& r) { r["rank"] = 2; }).str(), "rank 2"),
             {"line 6: rank 2 is not below dp 2"});
    }
    {  // element range altered, at either end
        says(read_error(base.edit(8, [](json::Json& r) { r["elements"][0] = r["elements"][0].get<int>() + 1; }).str(),
                        "first+1"),
             {"line 8: ", "(overlapping or missing range)"});
        const std::size_t last = record_line("wpe.weight", 1, "exp_avg");
        says(read_error(base.edit(last, [](json::Json& r) { r["elements"][1] = 1023; }).str(), "last-1"),
             {"line " + std::to_string(last) + ": wpe.weight rank 1: elements [512, 1023), but dp 2 gives [512, 1024)"});
        says(read_error(base.edit(8, [](json::Json& r) { r["elements"] = {1, 2, 3}; }).str(), "three elements"),
             {"line 8: elements must be [first, last]"});
    }
    {  // the header's record count is wrong
        says(read_error(base.edit(1, [&](json::Json& h) { h["records"] = n_lines - 2; }).str(), "records"),
             {"line 1: records " + std::to_string(n_lines - 2) + ", but dp 2 x 28 tensors x 4 states makes " +
              std::to_string(n_lines - 1)});
    }
    {  // overlapping offsets: wpe's param moved into the end of wte's (6208 bytes at 0)
        const std::size_t wte = record_line("wte.weight", 0, "param"), wpe = record_line("wpe.weight", 0, "param");
        BOOST_REQUIRE(base.get(wte)["bytes"] == 6208);
        says(read_error(base.edit(wpe, [](json::Json& r) { r["offset"] = 4096; }).str(), "overlap"),
             {"line " + std::to_string(wpe) + ": bytes [4096, 5120) of rank0/param.bin overlap line " +
              std::to_string(wte) + "'s [0, 6208)"});
        // The same overlap with the file spelled another way: paths are
        // compared in their normal form, so it is caught all the same.
        for (const char* spelling : {"rank0//param.bin", "./rank0/param.bin", "rank0/./param.bin"})
            says(read_error(base.edit(wpe, [&](json::Json& r) {
                                    r["offset"] = 4096;
                                    r["file"] = spelling;
                                }).str(),
                            spelling),
                 {"line " + std::to_string(wpe) + ": bytes [4096, 5120) of rank0/param.bin overlap"});
        const Manifest n = read_text(base.edit(wpe, [](json::Json& r) { r["file"] = "rank0//param.bin"; }).str());
        BOOST_TEST(n.parts[wpe - 2].file == "rank0/param.bin");
    }
    {  // an offset not aligned
        says(read_error(base.edit(12, [](json::Json& r) { r["offset"] = r["offset"].get<std::uint64_t>() + 100; })
                            .str(),
                        "unaligned"),
             {"line 12: offset ", "is not aligned to 4096"});
    }
    {  // paths that leave the data directory
        for (const char* bad : {"/etc/passwd", "../x", "rank0/../../x", "rank0/..", "..", "rank0/"}) {
            says(read_error(base.edit(14, [&](json::Json& r) { r["file"] = bad; }).str(), bad),
                 {"line 14: ", "'" + std::string(bad) + "'"});
        }
        says(read_error(base.edit(14, [](json::Json& r) { r["file"] = ""; }).str(), "empty path"),
             {"line 14: empty file path"});
    }
    {  // the header's dp disagrees with the records
        says(read_error(base.edit(1, [](json::Json& h) { h["dp"] = 3; }).str(), "dp 3"),
             {"line 1: records " + std::to_string(n_lines - 1) + ", but dp 3 x 28 tensors"});
        says(read_error(base.edit(1, [&](json::Json& h) {
                                h["dp"] = 3;
                                h["records"] = 28 * 3 * 4;
                            }).str(),
                        "dp 3, records fixed"),
             {"line 2: wte.weight rank 0: elements [0, 3104), but dp 3 gives [0, 2070)"});
    }
    {  // the rest of what a header or record must agree with
        says(read_error("", "empty"), {"empty manifest"});
        says(read_error(base.edit(1, [](json::Json& h) { h["schema"] = "zinf.manifest/2"; }).str(), "schema"),
             {"line 1: schema \"zinf.manifest/2\" is not zinf.manifest/1"});
        Lines twice = base;
        twice.v.insert(twice.v.begin() + 3, twice.v[0]);
        says(read_error(twice.str(), "second header"), {"line 4: a second header"});
        says(read_error(base.edit(1, [](json::Json& h) { h["parameters"] = 1; }).str(), "parameters"),
             {"line 1: parameters 1 disagrees"});
        says(read_error(base.edit(3, [](json::Json& r) { r["dtype"] = "bf16"; }).str(), "dtype"),
             {"line 3: ", "dtype bf16, the header says fp32"});
        says(read_error(base.edit(3, [](json::Json& r) { r["bytes"] = 4; }).str(), "bytes"),
             {"line 3: bytes 4, expected"});
        says(read_error(base.edit(3, [](json::Json& r) { r["tensor"] = "wte.bias"; }).str(), "tensor"),
             {"line 3: tensor 'wte.bias' is not in"});
        says(read_error(base.edit(3, [](json::Json& r) { r["xxh3"] = "xyz"; }).str(), "xxh3"), {"line 3: "});
        says(read_error(base.edit(1, [](json::Json& h) { h["model"] = "gpt:layers=2"; }).str(), "model"),
             {"line 1: ", "layers and hidden are required"});
    }
}

BOOST_AUTO_TEST_CASE(rank_dirs_place_each_ranks_files_and_are_checked) {
    Manifest m = layout(ModelSpec::parse(kSmall), {.dp = 3});
    m.dir = "/shared/run";
    BOOST_TEST(m.path_of(m.parts.front()) == "/shared/run/" + m.parts.front().file);
    BOOST_TEST(m.rank_folder(2) == "/shared/run/rank2");
    m.rank_dirs = expand_rank_dirs({"/local/nvme/%%run/rank%r/"}, 3);
    BOOST_TEST(m.rank_dirs == (std::vector<std::string>{"/local/nvme/%run/rank0", "/local/nvme/%run/rank1",
                                                        "/local/nvme/%run/rank2"}),
               boost::test_tools::per_element());
    for (const auto& p : m.parts) {
        const Manifest::Place at = m.place(p.file);
        BOOST_TEST(at.root == m.rank_dirs[p.rank]);
        BOOST_TEST(at.rel == p.file.substr(p.file.find('/') + 1));
        BOOST_TEST(at.rel.find('/') == std::string::npos);
        BOOST_TEST(m.place(p.file, "/elsewhere").root == m.rank_dirs[p.rank]);  // a rank's folder wherever --dir is
    }
    BOOST_TEST(m.place("manifest.jsonl").path() == "/shared/run/manifest.jsonl");  // not a rank's file
    BOOST_TEST(m.place("rank7/x.bin").path() == "/shared/run/rank7/x.bin");        // no such rank
    BOOST_TEST(m.rank_folder(1) == "/local/nvme/%run/rank1");
    // Written and read back; a manifest without them has no key.
    const std::string text = text_of(m);
    BOOST_TEST(read_text(text).rank_dirs == m.rank_dirs, boost::test_tools::per_element());
    BOOST_TEST(text_of(read_text(text)) == text);
    // One folder per rank, literally.
    BOOST_TEST(expand_rank_dirs({"/a/x", "/b/y", "/c/z"}, 3)[1] == "/b/y");
    BOOST_TEST(expand_rank_dirs({"/only"}, 1)[0] == "/only");
    for (const auto& [given, dp, says] : std::vector<std::tuple<std::vector<std::string>, unsigned, std::string>>{
             {{"rel/rank%r"}, 2, "absolute"},
             {{"/a/rank"}, 2, "share"},
             {{"/a/rank%r%q"}, 2, "%q"},
             {{"/a/rank%r%"}, 2, "neither"},
             {{"/a/../b/rank%r"}, 2, "'..'"},
             {{"/a", "/b"}, 3, "not 2"},
             {{"/a", "/a/"}, 2, "share"},
             {{}, 2, "not 0"}}) {
        const std::string msg = what_of<UsageError>([&g = given, d = dp] { (void)expand_rank_dirs(g, d); }, says);
        BOOST_TEST(contains(msg, says), msg);
    }
    // The reader refuses what would put a rank's files anywhere else.
    const Lines base(text);
    auto refused = [&](const Lines& l, const std::string& says) {
        const std::string msg = read_error(l.str(), says);
        BOOST_TEST(contains(msg, says), "expected '" << says << "' in: " << msg);
    };
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"] = {"/a", "/b"}; }), "array of 3 folders");
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"] = "/a"; }), "array of 3 folders");
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"][1] = "b"; }), "not an absolute path");
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"][1] = 7; }), "is not a string");
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"][2] = "/x/../local"; }), "'..' is refused");
    refused(base.edit(1, [](json::Json& h) { h["rank_dirs"][2] = "/local/nvme/%run/./rank0"; }),
            "another rank's folder");
    const std::size_t r1 = base.find([](const json::Json& r) { return r.value("rank", 0u) == 1; });
    refused(base.edit(r1, [](json::Json& r) { r["file"] = "rank0/param.bin"; }), "rank 1's files are named rank1/");
    refused(base.edit(r1, [](json::Json& r) { r["file"] = "rank1/sub/param.bin"; }), "rank1/<name>");
}

// Found with the manifest fuzz target (tests/fuzz/corpus/manifest/crash-*):
// a one-line header that claims a huge tile factor or dp made the reader
// build millions of tensors, or reserve a record per claimed partition,
// before it read a single record -- gigabytes and a minute for 300 bytes of
// input, then bad_alloc (exit 70). Now each count is checked before anything
// of its size is allocated, and what the records do not justify is not reserved.
BOOST_AUTO_TEST_CASE(a_header_alone_allocates_nothing_of_the_size_it_claims) {
    const std::string head = R"({"schema":"zinf.manifest/1","param_dtype":"bf16","param_tier":"nvme","optim_tier":"nvme",)"
                             R"("train":true,"alignment":4096,"seed":1,"states":["param","master","exp_avg","exp_avg_sq"],)";
    // hidden 2^24 tiled 2^24 ways: 4 + 12 * 2^24... tensors, beyond the reader's 2^20.
    const std::string tiles = head + R"("model":"gpt:layers=1,hidden=16777216,heads=1,vocab=1,seq=1","dp":1,)"
                                     R"("tile":16777216,"tensors":67108876,"records":268435504})";
    std::string msg = read_error(tiles + "\n", "tile bomb");
    BOOST_TEST(contains(msg, "line 1: tile 16777216 makes 67108876 tensors, more than this reader takes (1048576)"), msg);
    // ... and a header whose tensors disagree says so before listing them.
    msg = read_error(head + R"("model":"gpt:layers=1,hidden=16777216,heads=1,vocab=1,seq=1","dp":1,)"
                            R"("tile":16777216,"tensors":1,"records":4})" "\n",
                     "tile bomb, tensors 1");
    BOOST_TEST(contains(msg, "tensors 1 disagrees with the model (67108876)"), msg);
    // dp 2^18 of gpt2-124m: 155 million records claimed, none given. The
    // reader reports the first missing record rather than reserving them all.
    msg = read_error(head + R"("model":"gpt2-124m","dp":262144,"tile":1,"tensors":148,"records":155189248})" "\n",
                     "dp 2^18, no records");
    BOOST_TEST(contains(msg, "155189248 record(s) missing after line 1, the first: wte.weight rank 0 param"), msg);
    // The layout refuses the tile factor the reader would refuse, before listing tensors.
    const std::string lay = what_of<UsageError>(
        [] { (void)layout(ModelSpec::parse("gpt:layers=4,hidden=65536,heads=1,vocab=1,seq=1"), {.tile = 65536}); },
        "layout tile 65536");
    BOOST_TEST(contains(lay, "--tile 65536: 1048612 tensors, more than a manifest holds (1048576)"), lay);
    BOOST_TEST(tensor_count(ModelSpec::parse(kSmall), 3) == tensors(ModelSpec::parse(kSmall), 3).size());
    BOOST_TEST(tensor_count(ModelSpec::parse("gpt2-124m")) == 148u);
}

BOOST_AUTO_TEST_SUITE_END()
