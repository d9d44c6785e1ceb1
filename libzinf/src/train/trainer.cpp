// The training step: forward and backward on the device, the gradients
// averaged over the ranks into each rank's partitions, the tiered optimizer
// step, and the new working parameters gathered back into the device.
#include <zinf/train.hpp>

#include <cmath>
#include <cstring>
#include <numbers>

namespace zinf::train {

double Schedule::at(std::uint64_t step) const {
    if (warmup && step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
    if (!cosine || total <= warmup) return lr;
    const double progress =
        std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
    const double min_lr = lr * min_ratio;
    return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

struct Trainer::Impl {
    Impl(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p, device::Device& d,
         const Options& o);

    shard::Manifest& m;
    comm::Communicator& comm;
    device::Device& dev;
    Options opts;
    unsigned dp = 1, rank = 0;
    model::GPT gpt;
    model::ResidentEngine engine;
    model::Activations acts;
    std::unique_ptr<zero::Optimizer> optim;
    shard::DType param_dtype;
    std::size_t pbytes;
    // This rank's partition of each tensor: its averaged gradient (fp32) and
    // its new working parameters (param dtype), per elements each.
    std::vector<std::vector<float>> own_grad;
    std::vector<AlignedBuffer> own_param;
    std::vector<std::uint16_t> staging;  // the largest bf16 tensor, for the gather
    // The collectives' buckets, made once: every tensor in one collective.
    std::vector<zero::Scatter> grad_bucket;
    std::vector<zero::Gather> param_bucket;
    std::vector<std::int32_t> inputs, targets;
    std::vector<float> losses;

    // Queued work reads the activations and the host vectors below: it must be
    // done before they go (an error thrown between two enqueues leaves some).
    ~Impl() {
        try {
            dev.synchronize(dev.compute());
        } catch (const std::exception& e) {
            log::warn(std::string("the device's last work failed as the trainer closed: ") + e.what());
        }
    }

    void load_weights(io::Engine& e, mem::PinnedPool& p);
    void install(std::size_t t, std::span<const std::byte> full);  // param dtype -> device fp32
    double mean_loss();
};

namespace {

model::Config config_of(const shard::Manifest& m) { return model::Config::from(m.spec, m.opts.tile); }

}  // namespace

Trainer::Impl::Impl(shard::Manifest& m_, comm::Communicator& c, io::Engine& e, mem::PinnedPool& p, device::Device& d,
                    const Options& o)
    : m(m_),
      comm(c),
      dev(d),
      opts(o),
      dp(m_.opts.dp),
      rank(static_cast<unsigned>(c.rank())),
      gpt(config_of(m_)),
      engine(d, gpt.params_table()),
      acts(gpt.plan(d, {.batch = o.batch, .seq = o.seq, .checkpoint = o.checkpoint})),
      param_dtype(m_.opts.param_dtype),
      pbytes(shard::dtype_bytes(m_.opts.param_dtype)) {
    if (!m.opts.train)
        throw DataError("manifest " + o.manifest_path +
                        ": laid out for inference (no optimizer state); lay it out without --inference to train");
    if (static_cast<unsigned>(comm.size()) != dp)
        throw UsageError("manifest " + o.manifest_path + " is laid out for dp " + std::to_string(dp) + ", but " +
                         std::to_string(comm.size()) + " ranks are running (reshard it with zinf-shard reshard)");
    const auto& table = gpt.params_table();
    if (table.size() != m.tensors.size()) throw InternalError("the model's parameters and the manifest's tensors differ");
    for (std::size_t t = 0; t < table.size(); ++t)
        if (table[t].name != m.tensors[t].name || table[t].shape != m.tensors[t].shape)
            throw DataError("manifest " + o.manifest_path + ": tensor " + std::to_string(t) + " is " +
                            m.tensors[t].name + ", the model expects " + table[t].name);

    load_weights(e, p);

    own_grad.resize(m.tensors.size());
    own_param.resize(m.tensors.size());
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t per = m.elements_per_rank(m.tensors[t]);
        own_grad[t].assign(per, 0.0f);
        own_param[t] = AlignedBuffer::allocate(std::max<std::size_t>(per * pbytes, 1), 64);
    }
    zero::OptimizerOptions zo;
    zo.adamw = opts.adamw;
    zo.adamw.lr = opts.schedule.at(1);
    zo.grad_clip = opts.grad_clip;
    zo.kernel = opts.kernel;
    zo.manifest_path = opts.manifest_path;
    zo.on_param = [this](std::size_t t, std::uint64_t first, std::span<const std::byte> v) {
        std::memcpy(own_param[t].data() + first * pbytes, v.data(), v.size());
    };
    optim = std::make_unique<zero::Optimizer>(m, comm, e, p, zo);
    std::uint64_t largest = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        const std::uint64_t n = m.tensors[t].numel;
        largest = std::max(largest, n);
        grad_bucket.push_back({std::as_bytes(engine.gradient(t)), std::as_writable_bytes(std::span(own_grad[t])), n});
        param_bucket.push_back({own_param[t].bytes(), std::as_writable_bytes(engine.values(t)), n});
    }
    if (dp > 1 && param_dtype == shard::DType::bf16) staging.resize(largest);
    inputs.resize(o.batch * o.seq);
    targets.resize(o.batch * o.seq);
    losses.resize(o.batch * o.seq);
}

void Trainer::Impl::install(std::size_t t, std::span<const std::byte> full) {
    auto dst = engine.values(t);
    if (param_dtype == shard::DType::fp32) {
        std::memcpy(dst.data(), full.data(), dst.size_bytes());
    } else {
        const auto* src = reinterpret_cast<const std::uint16_t*>(full.data());
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = from_bf16(src[i]);
    }
}

// Every rank reads every tensor whole (the resident engine keeps them all):
// the working parameters the manifest names, at its committed step.
void Trainer::Impl::load_weights(io::Engine& e, mem::PinnedPool& p) {
    std::vector<std::byte> full;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        full.clear();
        full.reserve(m.tensors[t].numel * pbytes);
        shard::cat(m, t, "param", e, p, [&](std::span<const std::byte> piece) {
            full.insert(full.end(), piece.begin(), piece.end());
        });
        if (full.size() != m.tensors[t].numel * pbytes)
            throw DataError("manifest " + opts.manifest_path + ": tensor " + m.tensors[t].name + " gave " +
                            std::to_string(full.size()) + " bytes of parameters, expected " +
                            std::to_string(m.tensors[t].numel * pbytes));
        install(t, full);
    }
}

double Trainer::Impl::mean_loss() {
    double sum = 0;  // in order, in double: the same bits every run
    for (float l : losses) sum += l;
    double mean = sum / static_cast<double>(losses.size());
    if (dp > 1)
        comm.allreduce(std::as_bytes(std::span(&mean, 1)), std::as_writable_bytes(std::span(&mean, 1)),
                       comm::DType::f64, comm::Reduce::avg);
    return mean;
}

Trainer::Trainer(shard::Manifest& m, comm::Communicator& comm, io::Engine& engine, mem::PinnedPool& pool,
                 device::Device& dev, const Options& opts)
    : impl_(std::make_unique<Impl>(m, comm, engine, pool, dev, opts)) {}

Trainer::~Trainer() = default;

std::uint64_t Trainer::step_count() const { return impl_->optim->step_count(); }
model::GPT& Trainer::gpt() { return impl_->gpt; }
model::ResidentEngine& Trainer::engine() { return impl_->engine; }
model::Activations& Trainer::activations() { return impl_->acts; }
double Trainer::flops_per_step() const { return impl_->gpt.flops_per_step(impl_->opts.batch, impl_->opts.seq); }
void Trainer::save() { impl_->optim->save(); }

StepLog Trainer::step(const data::Loader& train) {
    Impl& I = *impl_;
    auto& dev = I.dev;
    auto& s = dev.compute();
    model::Context ctx{dev, s, I.engine};
    StepLog log;
    log.step = step_count() + 1;
    log.lr = I.opts.schedule.at(log.step);
    Timer total;

    // Forward: the batch in, the per-token losses and the logits' gradient out.
    Timer t;
    train.batch(log.step - 1, I.inputs, I.targets);
    dev.copy(s, std::as_writable_bytes(I.acts.inputs.span()), std::as_bytes(std::span(I.inputs)));
    dev.copy(s, std::as_writable_bytes(I.acts.targets.span()), std::as_bytes(std::span(I.targets)));
    I.engine.zero_grad(s);
    I.gpt.forward(ctx, I.acts);
    dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
    dev.synchronize(s);
    log.forward_seconds = t.seconds();

    t.reset();
    I.gpt.backward(ctx, I.acts);
    dev.synchronize(s);
    log.backward_seconds = t.seconds();
    log.loss = I.mean_loss();

    // The gradients averaged over the ranks, each rank getting its partitions.
    t.reset();
    const std::size_t T = I.m.tensors.size();
    if (I.dp > 1) zero::reduce_scatter(I.comm, I.grad_bucket, comm::DType::f32);
    I.optim->set_lr(log.lr);
    for (std::size_t i = 0; i < T; ++i) {
        const auto own = shard::owned(I.m.tensors[i].numel, I.dp, I.rank);
        if (I.dp > 1)
            I.optim->put_gradient(i, std::span<const float>(I.own_grad[i]).first(own.count));
        else
            I.optim->put_gradient(i, I.engine.gradient(i));
    }
    const zero::StepReport r = I.optim->step();
    log.grad_norm = r.grad_norm;
    log.overflow = r.overflow;
    // The new working parameters back into every rank's resident copy.
    if (!r.overflow) {
        if (I.dp == 1) {
            for (std::size_t i = 0; i < T; ++i)
                I.install(i, I.own_param[i].bytes().first(I.m.tensors[i].numel * I.pbytes));
        } else if (I.param_dtype == shard::DType::fp32) {
            zero::gather(I.comm, I.param_bucket, comm::DType::f32);
        } else {  // bf16 on the wire, one tensor at a time through the staging buffer
            for (std::size_t i = 0; i < T; ++i) {
                const std::uint64_t n = I.m.tensors[i].numel;
                const auto full = std::span(I.staging).first(n);
                zero::gather(I.comm, zero::Gather{I.own_param[i].bytes(), std::as_writable_bytes(full), n},
                             comm::DType::bf16);
                I.install(i, std::as_bytes(full));
            }
        }
    }
    log.optimizer_seconds = t.seconds();

    log.seconds = total.seconds();
    log.tokens = I.opts.batch * I.opts.seq * I.dp;
    log.tokens_per_s = static_cast<double>(log.tokens) / log.seconds;
    log.flops_per_s = flops_per_step() * I.dp / log.seconds;
    return log;
}

double Trainer::evaluate(const data::Loader& val, std::uint64_t batches) {
    Impl& I = *impl_;
    auto& s = I.dev.compute();
    model::Context ctx{I.dev, s, I.engine};
    double sum = 0;
    for (std::uint64_t b = 0; b < batches; ++b) {
        val.batch(b, I.inputs, I.targets);
        I.dev.copy(s, std::as_writable_bytes(I.acts.inputs.span()), std::as_bytes(std::span(I.inputs)));
        I.dev.copy(s, std::as_writable_bytes(I.acts.targets.span()), std::as_bytes(std::span(I.targets)));
        I.gpt.forward(ctx, I.acts, false);
        I.dev.copy(s, std::as_writable_bytes(std::span(I.losses)), std::as_bytes(I.acts.losses.span()));
        I.dev.synchronize(s);
        sum += I.mean_loss();
    }
    return batches ? sum / static_cast<double>(batches) : 0.0;
}

}  // namespace zinf::train
