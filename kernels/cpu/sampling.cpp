// Penalties and top-k / top-p / min-p sampling of one token per row: the arithmetic of
// engine/Sampler, and the reference the CUDA kernels are tested against.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/kernels.h"

namespace pagellm::kernels::cpu {
namespace {

int32_t sample_row(const float* logits, int32_t vocab, float temperature, int32_t top_k,
                   float top_p, float min_p, double uniform, SamplingScratch& scratch) {
  std::vector<float>& w = scratch.weights;
  std::vector<int32_t>& order = scratch.order;
  w.resize(vocab);
  // Weights up to a common factor: exp(x / T - max), the largest exactly 1.
  const float inv_t = 1.0f / temperature;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab; ++i) {
    w[i] = logits[i] * inv_t;
    max_logit = std::max(max_logit, w[i]);
  }
  for (int32_t i = 0; i < vocab; ++i)
    w[i] = std::exp(w[i] - max_logit);

  // Candidates in a deterministic order: most likely first, ties by token id.
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; };
  int32_t count = vocab;
  if (min_p > 0.0f) {
    // The largest weight is exp(0) = 1, so the threshold is min_p itself.
    const float threshold = min_p;
    count = static_cast<int32_t>(
        std::partition(order.begin(), order.end(), [&](int32_t t) { return w[t] >= threshold; }) -
        order.begin());
  }
  if (top_k > 0 && top_k < count) {
    std::nth_element(order.begin(), order.begin() + top_k, order.begin() + count, more_likely);
    count = top_k;
  }
  if (top_p < 1.0f) {
    // Sort a growing head of the candidates until it holds top_p of the mass.
    double total = 0.0;
    for (int32_t i = 0; i < count; ++i)
      total += w[order[i]];
    const double target = top_p * total;
    int32_t sorted = 0;
    for (int32_t head = std::min(count, 64);; head = std::min(count, head * 4)) {
      std::partial_sort(order.begin() + sorted, order.begin() + head, order.begin() + count,
                        more_likely);
      sorted = head;
      double mass = 0.0;
      int32_t keep = 0;
      while (keep < sorted && mass < target)
        mass += w[order[keep++]];
      if (mass >= target || sorted == count) {
        count = std::max(keep, 1);
        break;
      }
    }
  } else {
    std::sort(order.begin(), order.begin() + count, more_likely);
  }
  double total = 0.0;
  for (int32_t i = 0; i < count; ++i)
    total += w[order[i]];
  const double u = uniform * total;
  double cumulative = 0.0;
  for (int32_t i = 0; i < count; ++i) {
    cumulative += w[order[i]];
    if (u < cumulative) return order[i];
  }
  return order[count - 1];
}

}  // namespace

void apply_penalties(float* logits, int64_t rows, int64_t vocab, const PenaltyRow* penalty_rows,
                     const PenaltyToken* tokens) {
  for (int64_t r = 0; r < rows; ++r) {
    const PenaltyRow& row = penalty_rows[r];
    float* x = logits + r * vocab;
    for (int32_t i = row.begin; i < row.end; ++i) {
      const PenaltyToken& t = tokens[i];
      if (t.token < 0 || t.token >= vocab) continue;
      float v = x[t.token];
      if (t.flags & kPenaltyHasBias) v += t.bias;
      if (row.repetition != 1.0f && ((t.flags & kPenaltyInPrompt) || t.output_count > 0)) {
        v = v > 0.0f ? v / row.repetition : v * row.repetition;
      }
      if (t.output_count > 0 && (row.presence != 0.0f || row.frequency != 0.0f)) {
        v -= row.presence + row.frequency * static_cast<float>(t.output_count);
      }
      x[t.token] = v;
    }
  }
}

void sample_top_k_top_p(const float* logits, int64_t rows, int64_t vocab,
                        const SamplingRows& params, int32_t* out, SamplingScratch* scratch) {
  auto sample = [&](int64_t r, SamplingScratch& s) {
    if (!(params.temperature[r] > 0.0f)) return;  // not sampled: out[r] stays
    out[r] = sample_row(logits + r * vocab, static_cast<int32_t>(vocab), params.temperature[r],
                        params.top_k[r], params.top_p[r], params.min_p[r], params.uniform[r], s);
  };
  if (rows > 1 && omp_get_max_threads() > 1) {
    // A row's token depends on that row alone: rows go to threads as they come free
    // (their cost varies with their top-p), each thread with its own scratch.
#pragma omp parallel
    {
      thread_local SamplingScratch local;
#pragma omp for schedule(dynamic)
      for (int64_t r = 0; r < rows; ++r)
        sample(r, local);
    }
    return;
  }
  SamplingScratch local;
  SamplingScratch& s = scratch != nullptr ? *scratch : local;
  for (int64_t r = 0; r < rows; ++r)
    sample(r, s);
}

}  // namespace pagellm::kernels::cpu
