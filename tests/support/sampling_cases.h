#pragma once
// Sampling cases shared by the tests of the device sampler (on a GPU, and its block steps
// run on the host): rows of random logits with the parameters requests ask for, the CPU
// twin's tokens, and which of its decisions are clear of rounding (the device's exp
// differs from the CPU's by an ulp or two, and its masses are summed another way).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "support/test_seed.h"

namespace pagellm::testing {

namespace sampling {

struct RowParams {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

// A mix of what requests ask for: plain, greedy-like, top-k, top-p, min-p, all of them.
inline constexpr RowParams kMixes[] = {
    {1.0f, 0, 1.0f, 0.0f},   {1e-3f, 0, 1.0f, 0.0f},  {0.7f, 50, 1.0f, 0.0f},
    {1.0f, 1, 1.0f, 0.0f},   {1.0f, 0, 0.9f, 0.0f},   {1.2f, 0, 1.0f, 0.05f},
    {0.8f, 50, 0.9f, 0.05f}, {2.0f, 0, 0.5f, 0.0f},   {1.0f, 1 << 30, 1.0f, 0.0f},
    {0.6f, 5, 0.95f, 0.0f},  {1.5f, 0, 0.99f, 0.01f}, {1e-3f, 50, 0.9f, 0.05f}};

struct Batch {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits, temperature, top_p, min_p, uniform;
  std::vector<int32_t> top_k;
};

// Logits of three kinds: on a grid of 1/16 (exact ties, and distinct weights far apart),
// continuous, and one dominant token over noise. Draws spread over [0, 1), with 0 and the
// largest float below 1 among them.
inline Batch make_batch(int64_t rows, int64_t vocab, std::mt19937& rng) {
  Batch b;
  b.rows = rows;
  b.vocab = vocab;
  b.logits.resize(rows * vocab);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> jitter(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = b.logits.data() + r * vocab;
    const int kind = static_cast<int>((r / 3) % 3);
    for (int64_t i = 0; i < vocab; ++i) {
      const float x = normal(rng);
      row[i] = kind == 0 ? std::round(x * 16.0f) / 16.0f : x;
    }
    if (kind == 2) row[rng() % vocab] = 12.0f;
    const RowParams& p = kMixes[r % std::size(kMixes)];
    b.temperature.push_back(p.temperature);
    b.top_k.push_back(p.top_k);
    b.top_p.push_back(p.top_p);
    b.min_p.push_back(p.min_p);
    float u = (static_cast<float>(r) + jitter(rng)) / static_cast<float>(rows);
    if (r == 0) u = 0.0f;
    if (r == rows - 1 || u >= 1.0f) u = std::nextafter(1.0f, 0.0f);
    b.uniform.push_back(u);
  }
  return b;
}

inline std::vector<int32_t> cpu_sample(const Batch& b) {
  const std::vector<double> u(b.uniform.begin(), b.uniform.end());
  const kernels::cpu::SamplingRows params{b.temperature.data(), b.top_k.data(), b.top_p.data(),
                                          b.min_p.data(), u.data()};
  std::vector<int32_t> out(b.rows, -1);
  kernels::cpu::sample_top_k_top_p(b.logits.data(), b.rows, b.vocab, params, out.data());
  return out;
}

// The CPU's decision for one row, made again with a full sort, and whether it is clear:
// no draw, top-p target or min-p threshold within a relative 1e-6 of a boundary, and no
// two nearly equal weights (from different logits) on either side of a cut or of the
// chosen token, where the ulps of exp could swap them (the device's expf is within 2 ulp,
// 2.4e-7, the CPU kernels' exp within 4e-7, and this test's std::exp within one ulp).
// Weights below 1e-30 carry no mass and are left out of that last test.
struct Decision {
  int32_t token;
  bool clear;
};

inline Decision decide(const float* logits, int64_t vocab, const RowParams& p, double u) {
  constexpr double kEps = 1e-6;
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> s(vocab), w(vocab);
  float max_s = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    s[i] = logits[i] * inv_t;
    max_s = std::max(max_s, s[i]);
  }
  for (int64_t i = 0; i < vocab; ++i)
    w[i] = std::exp(s[i] - max_s);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; });
  bool clear = true;
  auto fragile = [&](int64_t a, int64_t b) {  // positions in `order`
    const int32_t ia = order[a], ib = order[b];
    const double big = std::max(w[ia], w[ib]);
    return s[ia] != s[ib] && big > 1e-30 && std::abs(double(w[ia]) - w[ib]) <= kEps * big;
  };
  auto near = [&](double a, double b, double scale) { return std::abs(a - b) <= kEps * scale; };

  int64_t count = vocab;
  if (p.min_p > 0.0f) {
    count = std::count_if(w.begin(), w.end(), [&](float x) { return x >= p.min_p; });
    for (float x : w)
      if (near(x, p.min_p, p.min_p)) clear = false;
  }
  if (p.top_k > 0 && p.top_k < count) {
    if (fragile(p.top_k - 1, p.top_k)) clear = false;
    count = p.top_k;
  }
  if (p.top_p < 1.0f) {
    double total = 0;
    for (int64_t j = 0; j < count; ++j)
      total += w[order[j]];
    const double target = p.top_p * total;
    double mass = 0, before = 0;
    int64_t keep = 0;
    while (keep < count && mass < target) {
      before = mass;
      mass += w[order[keep++]];
    }
    if (near(before, target, total) || near(mass, target, total)) clear = false;
    keep = std::max<int64_t>(keep, 1);
    if (keep < count && fragile(keep - 1, keep)) clear = false;
    count = keep;
  }
  double total = 0;
  for (int64_t j = 0; j < count; ++j)
    total += w[order[j]];
  const double threshold = u * total;
  double cumulative = 0, before = 0;
  int64_t pick = count - 1;
  for (int64_t j = 0; j < count; ++j) {
    before = cumulative;
    cumulative += w[order[j]];
    if (threshold < cumulative) {
      pick = j;
      break;
    }
  }
  // (Before the first token the running sum is 0 on both sides, exactly.)
  if ((pick > 0 && near(before, threshold, total)) || near(cumulative, threshold, total))
    clear = false;
  if (pick > 0 && fragile(pick - 1, pick)) clear = false;
  if (pick + 1 < count && fragile(pick, pick + 1)) clear = false;
  return {order[pick], clear};
}

// Checks `got`, one token per row of `b` from a sampler under test, against the CPU twin:
// every clear row must agree. Returns the number of clear rows.
inline int64_t expect_same_tokens(const Batch& b, const std::vector<int32_t>& got) {
  const std::vector<int32_t> cpu_tokens = cpu_sample(b);
  EXPECT_EQ(got.size(), static_cast<size_t>(b.rows));
  if (got.size() != static_cast<size_t>(b.rows)) return 0;
  int64_t clear = 0, unclear_differ = 0;
  for (int64_t r = 0; r < b.rows; ++r) {
    const RowParams p{b.temperature[r], b.top_k[r], b.top_p[r], b.min_p[r]};
    const Decision d = decide(b.logits.data() + r * b.vocab, b.vocab, p, b.uniform[r]);
    EXPECT_TRUE(got[r] >= 0 && got[r] < b.vocab) << "row " << r;
    if (!d.clear) {
      unclear_differ += got[r] != cpu_tokens[r];
      continue;
    }
    ++clear;
    EXPECT_EQ(d.token, cpu_tokens[r]) << "row " << r << ": the test's full sort vs the CPU twin";
    EXPECT_EQ(got[r], cpu_tokens[r])
        << "row " << r << " T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
        << " min_p=" << p.min_p << " u=" << b.uniform[r];
  }
  std::cout << "[ sample   ] vocab " << b.vocab << ": " << clear << " of " << b.rows
            << " rows clear; " << unclear_differ << " near-boundary rows differ\n";
  return clear;
}

}  // namespace sampling
}  // namespace pagellm::testing
