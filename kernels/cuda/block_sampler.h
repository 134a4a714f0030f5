// The top-k / top-p / min-p draw of one row by one thread block, written against a small
// block interface, so that the same steps run in the CUDA kernel (kernels/cuda/sampling.cu)
// and, one thread after another, on the host in tests (tests/unit/block_sampler_test.cpp).
//
// Every set of tokens the sampler keeps is a prefix of the ranking "larger weight first,
// lower id first on ties", which is the ascending order of the key (~bits(w) << 32 | id)
// (weights are non-negative floats, so their bit patterns order like their values). Each
// step of the draw finds the token of that ranking where a running total first passes a
// bound: a count for top-k, a mass for top-p and for the draw itself. It is a radix
// select over the key, most significant digit first: one pass over the row counts the
// candidates and sums their mass per digit (a histogram of up to 2,048 bins in shared
// memory), a block scan over the bins finds the one where the bound is passed, and the
// next pass looks only inside that bin. Once a bin holds at most kGather tokens, one pass
// gathers their keys and every thread ranks its keys against all of them. A draw at
// top-p 0.95 reads a row of 128k tokens about six times when it is flat (normal logits,
// spread 1), four times when it is peaked (spread 4), the pass for the maximum included.
//
// Masses are integers: a weight w in [0, 1] counts as round(w * 2^S), where S is the
// largest shift that keeps the mass of a whole row below 2^63. Integer sums do not depend
// on the order of the additions, so the shared-memory atomics give the same totals on
// every run and a row's token depends on that row alone. The rounding moves a cut by at
// most vocab / 2^(S+1) of the largest weight: 2^-30 for a vocabulary of 128k.
//
// The block interface B (see DeviceBlock in sampling.cu):
//   B::kThreads, B::kGather            threads per block, most tokens ranked at once
//   B::Shared& shared()                this block's Shared<B::kGather>
//   each(f)                            f(t) for every thread t, the block in step before and after
//   reduce_max(f), sum(f)              the largest f(t) (NaN skipped), the sum of f(t)
//   scan(f, g)                         g(t, sum of f(s) for s < t) for every t; the sum of all
//   B::atomic_add(p, v)                *p += v on a 32-bit word, returning the old value
//   B::scaled(x, inv_t), B::exp_diff(s, m), B::recip(t), B::quantize(x)
//                                      x * inv_t; exp(s - m); 1 / t; x rounded to an integer
// Control flow outside the functions passed to each/scan depends only on block-wide
// values, so every thread of a block takes the same branches.

#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/rank_key.h"

#if defined(__CUDACC__)
#define PAGELLM_BLOCK_FN __device__ __forceinline__
#define PAGELLM_BLOCK_UNROLL _Pragma("unroll")
#else
#define PAGELLM_BLOCK_FN inline
#define PAGELLM_BLOCK_UNROLL
#endif

namespace pagellm::kernels::cuda::block_sampler {

using u64 = unsigned long long;  // CUDA's 64-bit unsigned type (as __float2ull_rn returns)

constexpr int kBins = 2048;

// The digits of the key, most significant first. The key's two top bits are always 1
// (w <= 1: no sign, and the exponent's top bit is 0), so the first digit starts at bit 61.
struct Level {
  int shift;
  int bits;
};
constexpr int kTopShift = 62;
constexpr u64 kTopBits = 3;
constexpr int kLevelCount = 6;
constexpr int kFirstIdLevel = 3;
PAGELLM_BLOCK_FN Level level_at(int i) {
  switch (i) {
    case 0:
      return {51, 11};  // the exponent and 4 bits of the mantissa
    case 1:
      return {40, 11};
    case 2:
      return {32, 8};
    case 3:
      return {21, 11};  // the id
    case 4:
      return {10, 11};
    default:
      return {0, 10};
  }
}

// A count of tokens and their mass.
struct Tally {
  uint32_t count;
  u64 mass;
};
PAGELLM_BLOCK_FN Tally operator+(const Tally& a, const Tally& b) {
  return {a.count + b.count, a.mass + b.mass};
}

template <int kGather>
struct Shared {
  uint32_t count[kBins];  // the histogram; masses as two 32-bit words (add_mass)
  uint32_t mass_lo[kBins];
  uint32_t mass_hi[kBins];
  u64 keys[kGather];  // the gathered tokens
  u64 masses[kGather];
  uint32_t gathered;
  int32_t cross_bin;  // the bin where the bound is passed, -1: none
  Tally cross_before, cross_tally;
  u64 found_key;  // the token where the bound is passed, ~0: none
  Tally found_through;
};

// Adds v to the mass of bin d with two 32-bit atomic adds, the low word's carry going
// into the high word, so that the bin's total is exact once every thread has added.
// (CUDA's 64-bit atomicAdd on shared memory is a compare-and-swap loop, which serializes
// and retries when the threads of a warp add to one bin, as they do on flat rows.)
template <class B, int kGather>
PAGELLM_BLOCK_FN void add_mass(Shared<kGather>& sh, int d, u64 v) {
  const uint32_t lo = static_cast<uint32_t>(v);
  uint32_t hi = static_cast<uint32_t>(v >> 32);
  if (lo != 0 && B::atomic_add(&sh.mass_lo[d], lo) + lo < lo) ++hi;  // wrapped: a carry
  if (hi != 0) B::atomic_add(&sh.mass_hi[d], hi);
}
template <int kGather>
PAGELLM_BLOCK_FN u64 mass_of(const Shared<kGather>& sh, int d) {
  return static_cast<u64>(sh.mass_hi[d]) << 32 | sh.mass_lo[d];
}

constexpr u64 kNoKey = ~0ull;

// Where a running total (count and mass, most likely first) passes a bound.
struct Bound {
  enum Kind { kCount, kReach, kExceed } kind;
  uint32_t count;  // kCount: count >= this
  double mass;     // kReach: mass >= this; kExceed: mass > this
  PAGELLM_BLOCK_FN bool passed(const Tally& t) const {
    const double m = static_cast<double>(t.mass);
    return kind == kCount ? t.count >= count : kind == kReach ? m >= mass : m > mass;
  }
};

// A row and its weights: w = exp(x * inv_t - max_s), exactly 1 for the largest.
// Candidates have w > 0 and w >= threshold (never NaN).
struct RowInput {
  const float* logits;
  int64_t vocab;
  float inv_t;
  float max_s;
  float threshold;
  float mass_scale;  // 2^S
};

template <class B>
PAGELLM_BLOCK_FN float weight(const RowInput& row, float logit) {
  const float s = B::scaled(logit, row.inv_t);
  return s == row.max_s ? 1.0f : B::exp_diff(s, row.max_s);
}

// f(i, logits[i]) for thread t's elements of a row (t, t + kThreads, ...), their loads
// issued kLoadsAhead at a time before any is used: with one block per row, a pass is
// bound by the latency of its loads, not by bandwidth.
constexpr int kLoadsAhead = 4;
template <class B, class F>
PAGELLM_BLOCK_FN void visit_row(const float* logits, int64_t vocab, int t, F f) {
  constexpr int64_t kStride = B::kThreads;
  int64_t i = t;
  for (; i + (kLoadsAhead - 1) * kStride < vocab; i += kLoadsAhead * kStride) {
    float x[kLoadsAhead];
    PAGELLM_BLOCK_UNROLL
    for (int k = 0; k < kLoadsAhead; ++k)
      x[k] = logits[i + k * kStride];
    PAGELLM_BLOCK_UNROLL
    for (int k = 0; k < kLoadsAhead; ++k)
      f(i + k * kStride, x[k]);
  }
  for (; i < vocab; i += kStride)
    f(i, logits[i]);
}

PAGELLM_BLOCK_FN bool candidate(const RowInput& row, float w) {
  return w > 0.0f && w >= row.threshold;
}

// f(key, mass) for each candidate of thread t's share of the row whose key starts with
// `prefix` (key >> match_shift): the one filter of the histogram and the gather.
template <class B, class F>
PAGELLM_BLOCK_FN void visit_candidates(const RowInput& row, int t, int match_shift, u64 prefix,
                                       F f) {
  visit_row<B>(row.logits, row.vocab, t, [&](int64_t i, float logit) {
    const float w = weight<B>(row, logit);
    if (!candidate(row, w)) return;
    const u64 key = rank_key(w, i);
    if ((key >> match_shift) != prefix) return;
    f(key, B::quantize(w * row.mass_scale));
  });
}

// The histogram of the candidates whose key starts with `prefix` (key >> match_shift),
// by the digit of `bits` bits at `shift`; returns their count and mass when kTotal.
template <bool kTotal, class B>
PAGELLM_BLOCK_FN Tally histogram(B& b, const RowInput& row, int match_shift, u64 prefix, int shift,
                                 int bits) {
  auto& sh = b.shared();
  b.each([&](int t) {
    for (int j = t; j < kBins; j += B::kThreads) {
      sh.count[j] = 0;
      sh.mass_lo[j] = 0;
      sh.mass_hi[j] = 0;
    }
  });
  const u64 digit_mask = (1ull << bits) - 1;
  auto pass = [&](int t) {
    Tally local{0, 0};
    visit_candidates<B>(row, t, match_shift, prefix, [&](u64 key, u64 q) {
      const int d = static_cast<int>((key >> shift) & digit_mask);
      B::atomic_add(&sh.count[d], 1u);
      add_mass<B>(sh, d, q);
      local.count += 1;
      local.mass += q;
    });
    return local;
  };
  if constexpr (kTotal) {
    return b.sum(pass);
  } else {
    b.each([&](int t) { pass(t); });
    return Tally{0, 0};
  }
}

// The bin of the histogram where before + (the bins up to it) passes the bound, into
// sh.cross_*: the bound is not passed at `before`, and is by the last bin.
template <class B>
PAGELLM_BLOCK_FN void find_crossing(B& b, const Tally& before, const Bound& bound) {
  static_assert(kBins % B::kThreads == 0, "bins per thread");
  constexpr int kPer = kBins / B::kThreads;
  auto& sh = b.shared();
  b.each([&](int t) {
    if (t == 0) sh.cross_bin = -1;
  });
  auto bin = [&](int j) { return Tally{sh.count[j], mass_of(sh, j)}; };
  b.scan(
      [&](int t) {
        Tally s{0, 0};
        for (int k = 0; k < kPer; ++k)
          s = s + bin(t * kPer + k);
        return s;
      },
      [&](int t, Tally prefix) {
        Tally run = before + prefix;
        for (int k = 0; k < kPer; ++k) {
          const int j = t * kPer + k;
          const Tally next = run + bin(j);
          if (!bound.passed(run) && bound.passed(next)) {
            sh.cross_bin = j;
            sh.cross_before = run;
            sh.cross_tally = bin(j);
          }
          run = next;
        }
      });
}

// Among the candidates whose key starts with `prefix` (at most kGather of them): the one
// where before + (the tokens ranked up to it) passes the bound.
template <class B>
PAGELLM_BLOCK_FN void gather_and_rank(B& b, const RowInput& row, int match_shift, u64 prefix,
                                      const Tally& before, const Bound& bound) {
  auto& sh = b.shared();
  b.each([&](int t) {
    if (t == 0) {
      sh.gathered = 0;
      sh.found_key = kNoKey;
    }
  });
  b.each([&](int t) {
    visit_candidates<B>(row, t, match_shift, prefix, [&](u64 key, u64 q) {
      const uint32_t slot = B::atomic_add(&sh.gathered, 1u);
      if (slot < static_cast<uint32_t>(B::kGather)) {
        sh.keys[slot] = key;
        sh.masses[slot] = q;
      }
    });
  });
  const uint32_t n = sh.gathered < static_cast<uint32_t>(B::kGather)
                         ? sh.gathered
                         : static_cast<uint32_t>(B::kGather);
  b.each([&](int t) {
    for (uint32_t j = t; j < n; j += B::kThreads) {
      const u64 key = sh.keys[j];
      Tally at = before;
      for (uint32_t i = 0; i < n; ++i) {
        if (sh.keys[i] < key) at = at + Tally{1, sh.masses[i]};
      }
      const Tally through = at + Tally{1, sh.masses[j]};
      if (!bound.passed(at) && bound.passed(through)) {
        sh.found_key = key;
        sh.found_through = through;
      }
    }
  });
}

// The token of the candidates' ranking where the running total passes the bound, and the
// total through it; sh.found_key is kNoKey when the bound is not passed within the
// candidates (which the callers rule out). `level0` says whether the histogram holds the
// first digit of all candidates, and is kept up to date.
template <class B>
PAGELLM_BLOCK_FN void select_token(B& b, const RowInput& row, const Bound& bound, bool& level0) {
  auto& sh = b.shared();
  Tally before{0, 0};
  int match_shift = kTopShift;
  u64 prefix = kTopBits;
  for (int level = 0; level < kLevelCount; ++level) {
    const Level lv = level_at(level);
    if (level >= kFirstIdLevel && ((row.vocab - 1) >> lv.shift) == 0) {
      // Every id's digit here is 0: the bin is the same, without a pass.
      prefix <<= lv.bits;
      match_shift = lv.shift;
      continue;
    }
    if (level > 0 || !level0) histogram<false>(b, row, match_shift, prefix, lv.shift, lv.bits);
    level0 = level == 0;
    find_crossing(b, before, bound);
    const int32_t bin = sh.cross_bin;
    if (bin < 0) break;
    const uint32_t in_bin = sh.cross_tally.count;
    before = sh.cross_before;
    prefix = (prefix << lv.bits) | static_cast<u64>(bin);
    match_shift = lv.shift;
    if (in_bin <= static_cast<uint32_t>(B::kGather)) {
      gather_and_rank(b, row, match_shift, prefix, before, bound);
      // The gather filters the row as the histogram pass did (visit_candidates), so it
      // finds the same tokens; were it not to, the next digit's
      // histogram would split the bin again rather than rank part of it.
      if (sh.gathered == in_bin) return;
    }
  }
  // Not reached with the callers' bounds: the last level's bins hold one token each.
  b.each([&](int t) {
    if (t == 0) sh.found_key = kNoKey;
  });
}

// S for a vocabulary: the largest shift with vocab * 2^S < 2^63.
inline int mass_shift(int64_t vocab) {
  int width = 0;
  while (width < 63 && (int64_t{1} << width) <= vocab)
    ++width;
  return 63 - width;
}
// 2^S, the scale of RowInput::mass_scale.
inline float mass_scale(int64_t vocab) {
  return std::ldexp(1.0f, mass_shift(vocab));
}

// One row's token (the contract of kernels::cuda::sample_top_k_top_p; temperature > 0),
// or -1 if a step finds nothing (not reached). The same in every thread.
template <class B>
PAGELLM_BLOCK_FN int32_t sample_row(B& b, const float* logits, int64_t vocab, float temperature,
                                    int32_t top_k, float top_p, float min_p, float uniform,
                                    float mass_scale) {
  auto& sh = b.shared();
  RowInput row{logits, vocab, B::recip(temperature), 0.0f, 0.0f, mass_scale};
  row.max_s = b.reduce_max([&](int t) {
    float m = -__builtin_huge_valf();
    visit_row<B>(logits, vocab, t, [&](int64_t, float logit) {
      const float s = B::scaled(logit, row.inv_t);
      if (s > m) m = s;
    });
    return m;
  });
  // min-p keeps w >= min_p: the largest weight is 1.
  row.threshold = min_p > 0.0f ? (min_p < 1.0f ? min_p : 1.0f) : 0.0f;
  const Tally all =
      histogram<true>(b, row, kTopShift, kTopBits, level_at(0).shift, level_at(0).bits);
  if (all.count == 0) return 0;
  bool level0 = true;
  Tally kept = all;
  // top-k: the k most likely.
  if (top_k > 0 && static_cast<uint32_t>(top_k) < all.count) {
    select_token(b, row, Bound{Bound::kCount, static_cast<uint32_t>(top_k), 0.0}, level0);
    if (sh.found_key == kNoKey) return -1;
    kept = sh.found_through;
  }
  // top-p: the shortest prefix with top_p of the kept mass, at least one token.
  if (top_p < 1.0f) {
    const double target = static_cast<double>(top_p) * static_cast<double>(kept.mass);
    select_token(b, row,
                 target > 0.0 ? Bound{Bound::kReach, 0, target} : Bound{Bound::kCount, 1, 0.0},
                 level0);
    if (sh.found_key == kNoKey) return -1;
    kept = sh.found_through;
  }
  // The draw: the first token whose running mass exceeds uniform * (kept mass), or the
  // last kept token when that is not below the kept mass.
  const double kept_mass = static_cast<double>(kept.mass);
  const double threshold = (uniform > 0.0f ? static_cast<double>(uniform) : 0.0) * kept_mass;
  select_token(b, row,
               threshold < kept_mass ? Bound{Bound::kExceed, 0, threshold}
                                     : Bound{Bound::kCount, kept.count, 0.0},
               level0);
  if (sh.found_key == kNoKey) return -1;
  return static_cast<int32_t>(static_cast<uint32_t>(sh.found_key));
}

}  // namespace pagellm::kernels::cuda::block_sampler
