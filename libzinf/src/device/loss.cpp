// The cpu backend's loss (kernels.def): the fused classifier, softmax
// cross-entropy with its gradient written over the logits in place (llm.c's
// crossentropy_softmax_backward), a row per task, the exps summed in double
// in one fixed order. Rows are `ld` apart; the pad past V is never read and
// is written 0 by the backward. bf16 logits: the row is widened into the
// task's own fp32 row, the fp32 body runs on it, and the gradient is
// rounded once into the bf16 row (the fp32 kernel's bits on the widened
// copy, rounded).
#include "kernels.hpp"

#include <zinf/util.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace zinf::device::cpu {

namespace {

void check_targets(const std::int32_t* targets, u64 N, u64 V) {
    for (u64 i = 0; i < N; ++i) {
        const std::int64_t v = targets[i];
        if (v < 0 || static_cast<u64>(v) >= V) throw bad_target(v, i, V);
    }
}

float row_max(const float* x, u64 V) {
    float m = -std::numeric_limits<float>::infinity();
    for (u64 j = 0; j < V; ++j) m = std::max(m, x[j]);
    return m;
}

// sum_j e[j] in double, four lanes (j mod 4) added pairwise.
double sum_double(const float* e, u64 V) {
    double acc[4] = {};
    u64 j = 0;
    for (; j + 4 <= V; j += 4)
        for (int l = 0; l < 4; ++l) acc[l] += e[j + l];
    double tail = 0;
    for (; j < V; ++j) tail += e[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + tail;
}

// -log softmax(x)[target] = log sum_j exp(x[j] - max) - (x[target] - max).
float nll(double expsum, float xt, float maxval) {
    return static_cast<float>(std::log(expsum) - (static_cast<double>(xt) - maxval));
}

// One row in place over its V fp32 logits: the loss, and the row becomes
// the gradient.
float ce_row(float* x, u64 target, float dloss, u64 V) {
    const float maxval = row_max(x, V), xt = x[target];
    for (u64 j = 0; j < V; ++j) x[j] = std::exp(x[j] - maxval);  // the row now holds the exps
    const double expsum = sum_double(x, V);
    const float inv = static_cast<float>(1.0 / expsum);
    for (u64 j = 0; j < V; ++j) x[j] = dloss * (x[j] * inv - (j == target ? 1.0f : 0.0f));
    return nll(expsum, xt, maxval);
}

// One row's loss alone, its exps in `e` (V).
float ce_loss(const float* x, u64 target, u64 V, float* e) {
    const float maxval = row_max(x, V);
    for (u64 j = 0; j < V; ++j) e[j] = std::exp(x[j] - maxval);
    return nll(sum_double(e, V), x[target], maxval);
}

void crossentropy_rows(float* losses, float* logits, const std::int32_t* targets, float dloss, u64 N, u64 V, u64 ld) {
    check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
    for (u64 i = 0; i < N; ++i) {
        float* x = logits + i * ld;
        losses[i] = ce_row(x, static_cast<u64>(targets[i]), dloss, V);
        std::fill(x + V, x + ld, 0.0f);
    }
}

void crossentropy_rows(float* losses, std::uint16_t* logits, const std::int32_t* targets, float dloss, u64 N, u64 V,
                       u64 ld) {
    check_targets(targets, N, V);
#pragma omp parallel if (N * V >= kParallelMin)
    {
        std::vector<float> row(V);
#pragma omp for schedule(static)
        for (u64 i = 0; i < N; ++i) {
            std::uint16_t* x = logits + i * ld;
            zinf::from_bf16(std::span<const std::uint16_t>(x, V), std::span(row));
            losses[i] = ce_row(row.data(), static_cast<u64>(targets[i]), dloss, V);
            zinf::to_bf16(std::span<const float>(row), std::span(x, V));
            std::fill(x + V, x + ld, std::uint16_t{0});
        }
    }
}

template <class E>
void crossentropy_losses(float* losses, const E* logits, const std::int32_t* targets, u64 N, u64 V, u64 ld) {
    check_targets(targets, N, V);
#pragma omp parallel if (N * V >= kParallelMin)
    {
        std::vector<float> e(V), row;
        if constexpr (!std::is_same_v<E, float>) row.resize(V);
#pragma omp for schedule(static)
        for (u64 i = 0; i < N; ++i) {
            const E* x = logits + i * ld;
            const u64 t = static_cast<u64>(targets[i]);
            if constexpr (std::is_same_v<E, float>) {
                losses[i] = ce_loss(x, t, V, e.data());
            } else {
                zinf::from_bf16(std::span<const std::uint16_t>(x, V), std::span(row));
                losses[i] = ce_loss(row.data(), t, V, e.data());
            }
        }
    }
}

}  // namespace

void crossentropy_forward_backward(std::span<float> losses, View logits, std::span<const std::int32_t> targets,
                                   float dloss, u64 N, u64 V, u64 ldl) {
    with_dtype(logits.dtype(), [&]<class E>(E) {
        crossentropy_rows(losses.data(), logits.data<E>(), targets.data(), dloss, N, V, logits_stride(ldl, V));
    });
}

void crossentropy_forward(std::span<float> losses, ConstView logits, std::span<const std::int32_t> targets, u64 N,
                          u64 V, u64 ldl) {
    with_dtype(logits.dtype(), [&]<class E>(E) {
        crossentropy_losses(losses.data(), logits.data<E>(), targets.data(), N, V, logits_stride(ldl, V));
    });
}

}  // namespace zinf::device::cpu
