// The run's engine with the resident reference (zero.hpp, Engine): every
// rank keeps every parameter and gradient on its device (plain data
// parallel); after the backward one reduce-scatter of every gradient into
// the rank's partitions, the optimizer's step, and the new parameters
// gathered back into every rank's copy.
#include "engine.hpp"

#include <algorithm>
#include <cstring>

namespace zinf::zero::detail {

namespace {

class ResidentRun final : public EngineBase, private ParamListener {
public:
    ResidentRun(shard::Manifest& m, comm::Communicator& comm, io::Engine& io, mem::PinnedPool& pool,
                device::Device& dev, const EngineOptions& o, const ActivationPlan& plan);
    ~ResidentRun() override {
        if (optim) optim->listen(nullptr);
    }

    ParamEngine& hooks() override { return engine; }
    void end() override {}
    StepReport step() override;
    void reset() noexcept override {}
    bool loss_before_backward() const override { return true; }  // its collectives follow the backward
    std::vector<std::string> trace(bool) const override { return {}; }
    std::uint64_t device_need() const override { return need; }

private:
    void begin_pass(bool train) override {
        if (train) engine.zero_grad(dev.compute());
    }
    InfinityStats pass_stats() const override {
        InfinityStats s;
        s.device_peak = dev.arena().stats().peak;
        return s;
    }
    // The new working parameters of a piece a step updated: this rank's copy
    // of its partitions, gathered back after the step.
    void updated(std::size_t t, std::uint64_t first, std::span<const std::byte> v) override {
        std::memcpy(own_param[t].data() + first * pbytes, v.data(), v.size());
    }
    void load_weights();
    // param dtype -> device fp32, or bf16 as it is where the engine keeps it so
    void install(std::size_t t, std::span<const std::byte> full);
    void open_buckets();

    ResidentEngine engine;
    shard::DType param_dtype;
    std::size_t pbytes;
    std::uint64_t need = 0;  // the arena's use once the activations and the copies are in
    // This rank's partition of each tensor: its averaged gradient (fp32) and
    // its new working parameters (param dtype), per elements each.
    std::vector<std::vector<float>> own_grad;
    std::vector<AlignedBuffer> own_param;
    std::vector<std::uint16_t> staging;  // the largest bf16 tensor, for the gather
    // The collectives' buckets, made once: every tensor in one collective.
    std::vector<Scatter> grad_bucket;
    std::vector<Gather> param_bucket;
};

std::vector<std::uint64_t> numels_of(const shard::Manifest& m) {
    std::vector<std::uint64_t> n;
    for (const auto& t : m.tensors) n.push_back(t.numel);
    return n;
}

// The parameters kept bf16 on the device: ZeRO-Infinity's rule
// (InfinityOptions::keeps_bf16), the matrices and embedding tables of a
// manifest whose working parameters are bf16.
std::vector<bool> kept_bf16(const shard::Manifest& m, const EngineOptions& o) {
    std::vector<bool> keep;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) keep.push_back(o.infinity.keeps_bf16(m, t));
    return keep;
}

// Every rank reads every tensor whole into its resident copy, which is
// taken before the activations.
ResidentRun::ResidentRun(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p,
                         device::Device& d, const EngineOptions& o, const ActivationPlan& plan)
    : EngineBase(m_, c, e, p, d, o),
      engine(d, numels_of(m_), kept_bf16(m_, o)),
      param_dtype(m_.opts.param_dtype),
      pbytes(shard::dtype_bytes(m_.opts.param_dtype)) {
    if (plan.take) plan.take();
    open_activations(plan);
    load_weights();
    need = dev.arena().stats().used;
    if (!opts.optimizer) return;
    own_grad.resize(m.tensors.size());
    own_param.resize(m.tensors.size());
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t per = m.elements_per_rank(m.tensors[t]);
        own_grad[t].assign(per, 0.0f);
        own_param[t] = AlignedBuffer::allocate(std::max<std::size_t>(per * pbytes, 1), 64);
    }
    open_optimizer(dev.arena().stats().used);
    optim->listen(this);
    if (dp > 1 && !dev.host_addressable())
        throw UsageError("--resident at dp > 1 runs its collectives over device memory, which this device does not "
                         "allow; use the ZeRO-Infinity engine");
    open_buckets();
}

void ResidentRun::open_buckets() {
    std::uint64_t largest = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t n = m.tensors[t].numel;
        largest = std::max(largest, n);
        grad_bucket.push_back({std::as_bytes(engine.gradient(t)), std::as_writable_bytes(std::span(own_grad[t])), n});
        if (param_dtype == shard::DType::fp32)  // bf16 goes through the staging (step())
            param_bucket.push_back({own_param[t].bytes(), std::as_writable_bytes(engine.values(t)), n});
    }
    staging.resize(largest);
}

// Through a copy: device memory is not the host's to write. A parameter
// kept bf16 takes its bytes as they are.
void ResidentRun::install(std::size_t t, std::span<const std::byte> full) {
    auto& s = dev.stream(device::StreamKind::h2d);
    if (const auto kept = engine.values_bf16(t); !kept.empty()) {
        dev.copy(s, std::as_writable_bytes(kept), full.first(kept.size_bytes()));
        dev.synchronize(s);
        return;
    }
    auto dst = engine.values(t);
    if (param_dtype == shard::DType::fp32) {
        dev.copy(s, std::as_writable_bytes(dst), full.first(dst.size_bytes()));
        dev.synchronize(s);
        return;
    }
    std::vector<float> wide(dst.size());
    const auto* src = reinterpret_cast<const std::uint16_t*>(full.data());
    from_bf16(std::span(src, wide.size()), std::span(wide));
    dev.copy(s, std::as_writable_bytes(dst), std::as_bytes(std::span(wide)));
    dev.synchronize(s);
}

// The working parameters the manifest names, at its committed step.
void ResidentRun::load_weights() {
    const std::string source = opts.optimizer ? opts.optimizer->manifest_path : m.dir + "/manifest.jsonl";
    std::vector<std::byte> full;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        full.clear();
        full.reserve(m.tensors[t].numel * pbytes);
        shard::cat(m, t, "param", io, pool, [&](std::span<const std::byte> piece) {
            full.insert(full.end(), piece.begin(), piece.end());
        });
        if (full.size() != m.tensors[t].numel * pbytes)
            throw DataError("manifest " + source + ": tensor " + m.tensors[t].name + " gave " +
                            std::to_string(full.size()) + " bytes of parameters, expected " +
                            std::to_string(m.tensors[t].numel * pbytes));
        install(t, full);
    }
}

// Every gradient averaged into this rank's partitions in one collective,
// the optimizer, the new parameters back.
StepReport ResidentRun::step() {
    Optimizer& o = optimizer();
    const std::size_t T = m.tensors.size();
    auto& s = dev.compute();
    if (dp > 1) {
        reduce_scatter(comm, grad_bucket, comm::DType::f32);
    } else {
        for (std::size_t i = 0; i < T; ++i)
            dev.copy(s, std::as_writable_bytes(std::span(own_grad[i])), std::as_bytes(engine.gradient(i)));
        dev.synchronize(s);
    }
    for (std::size_t i = 0; i < T; ++i) {
        const auto own = shard::owned(m.tensors[i].numel, dp, rank);
        o.put_gradient(i, std::span<const float>(own_grad[i]).first(own.count));
    }
    const StepReport r = o.step();
    if (r.overflow) return r;
    // The new working parameters back into every rank's resident copy.
    if (dp == 1) {
        for (std::size_t i = 0; i < T; ++i) install(i, own_param[i].bytes().first(m.tensors[i].numel * pbytes));
    } else if (param_dtype == shard::DType::fp32) {
        gather(comm, param_bucket, comm::DType::f32);
    } else {  // bf16 on the wire, one tensor at a time through the staging buffer
        for (std::size_t i = 0; i < T; ++i) {
            const std::uint64_t n = m.tensors[i].numel;
            const auto full = std::span(staging).first(n);
            gather(comm, Gather{own_param[i].bytes(), std::as_writable_bytes(full), n}, comm::DType::bf16);
            install(i, std::as_bytes(full));
        }
    }
    return r;
}

}  // namespace

std::unique_ptr<Engine> open_resident(shard::Manifest& m, comm::Communicator& comm, io::Engine& io,
                                      mem::PinnedPool& pool, device::Device& dev, const EngineOptions& opts,
                                      const ActivationPlan& plan) {
    return std::make_unique<ResidentRun>(m, comm, io, pool, dev, opts, plan);
}

}  // namespace zinf::zero::detail
