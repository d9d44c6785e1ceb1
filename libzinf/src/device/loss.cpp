// The cpu backend's loss (kernels.def): the softmax cross-entropy, with its
// gradient fused into the logits (llm.c's crossentropy_softmax_backward), a
// row per task, the exps summed in double in one fixed order.
#include "kernels.hpp"

#include <algorithm>
#include <cmath>
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

void crossentropy_rows(float* losses, float* logits, const std::int32_t* targets, float dloss, u64 N, u64 V) {
    check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
    for (u64 i = 0; i < N; ++i) {
        float* x = logits + i * V;
        const u64 target = static_cast<u64>(targets[i]);
        const float maxval = row_max(x, V), xt = x[target];
        for (u64 j = 0; j < V; ++j) x[j] = std::exp(x[j] - maxval);  // the row now holds the exps
        const double expsum = sum_double(x, V);
        losses[i] = nll(expsum, xt, maxval);
        const float inv = static_cast<float>(1.0 / expsum);
        for (u64 j = 0; j < V; ++j) x[j] = dloss * (x[j] * inv - (j == target ? 1.0f : 0.0f));
    }
}

void crossentropy_losses(float* losses, const float* logits, const std::int32_t* targets, u64 N, u64 V) {
    check_targets(targets, N, V);
#pragma omp parallel if (N * V >= kParallelMin)
    {
        std::vector<float> e(V);
#pragma omp for schedule(static)
        for (u64 i = 0; i < N; ++i) {
            const float* x = logits + i * V;
            const float maxval = row_max(x, V);
            for (u64 j = 0; j < V; ++j) e[j] = std::exp(x[j] - maxval);
            losses[i] = nll(sum_double(e.data(), V), x[targets[i]], maxval);
        }
    }
}

}  // namespace

void crossentropy_forward_backward(std::span<float> losses, std::span<float> logits,
                                   std::span<const std::int32_t> targets, float dloss, u64 N, u64 V) {
    crossentropy_rows(losses.data(), logits.data(), targets.data(), dloss, N, V);
}

void crossentropy_forward(std::span<float> losses, std::span<const float> logits,
                          std::span<const std::int32_t> targets, u64 N, u64 V) {
    crossentropy_losses(losses.data(), logits.data(), targets.data(), N, V);
}

}  // namespace zinf::device::cpu
