// Penalties and top-k / top-p / min-p sampling of one token per row: the arithmetic of
// engine/Sampler, and the reference the CUDA kernels are tested against.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/rank_key.h"

namespace pagellm::kernels::cpu {
namespace {

// Buffers a draw reuses from row to row and call to call.
struct SamplingScratch {
  std::vector<float> weights;       // [vocab]
  std::vector<int32_t> order;       // [vocab] candidates
  std::vector<uint64_t> head, tmp;  // [vocab] ranked candidates
  std::vector<double> bucket_mass;
};

// This thread's buffers, kept for its life.
SamplingScratch& thread_scratch() {
  thread_local SamplingScratch scratch;
  return scratch;
}

// Buckets of weight by their top 11 bits (a quarter of a binade each), in rank order.
constexpr int kBucketBits = 11;
constexpr int kBuckets = 1 << kBucketBits;
int bucket_of(float w) {
  return static_cast<int>(~float_bits(w) >> (32 - kBucketBits));
}

// Sorts keys ascending: std::sort for a few, else a radix sort over the weight half (the
// id half is already ascending, since keys are made in id order, and each pass is stable).
void sort_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp) {
  if (keys.size() <= 256) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  tmp.resize(keys.size());
  for (int shift = 32; shift < 64; shift += kBucketBits) {
    size_t count[kBuckets + 1] = {};
    for (uint64_t k : keys)
      ++count[((k >> shift) & (kBuckets - 1)) + 1];
    if (count[((keys[0] >> shift) & (kBuckets - 1)) + 1] == keys.size()) continue;  // one digit
    for (int d = 0; d < kBuckets; ++d)
      count[d + 1] += count[d];
    for (uint64_t k : keys)
      tmp[count[(k >> shift) & (kBuckets - 1)]++] = k;
    keys.swap(tmp);
  }
}

// The candidates (w > 0 and w >= threshold; never NaN) in token order into s.order, their
// mass, summed in token order, and the mass of each bucket of weight into s.bucket_mass
// (for the cuts made without ranking every candidate). One pass over the row.
double gather_candidates(const float* w, int32_t vocab, float threshold, SamplingScratch& s) {
  std::vector<int32_t>& ids = s.order;
  ids.clear();
  s.bucket_mass.assign(kBuckets, 0.0);
  double* bucket_mass = s.bucket_mass.data();
  double total = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = w[i];
    if (!(x > 0.0f && x >= threshold)) continue;
    ids.push_back(i);
    total += x;
    bucket_mass[bucket_of(x)] += x;
  }
  return total;
}

// Ranks into s.head the candidates `ids` (ascending) in the buckets of weight up to
// `last`: always a prefix of the whole ranking.
void rank_buckets(const std::vector<int32_t>& ids, const float* w, int last, SamplingScratch& s) {
  s.head.clear();
  for (int32_t id : ids) {
    if (bucket_of(w[id]) <= last) s.head.push_back(rank_key(w[id], id));
  }
  sort_keys(s.head, s.tmp);
}

// Ranks into s.head a prefix of the candidates `ids` whose running mass, most likely
// first, exceeds `mass`, or all of them: the candidates in the buckets down to the one
// where the bucket masses (s.bucket_mass) reach `mass`, and one more bucket; all of them
// where that prefix's ranked sum rounds to no more than `mass`.
void rank_head(const std::vector<int32_t>& ids, const float* w, double mass, SamplingScratch& s) {
  int last = kBuckets - 1;
  double reached = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    reached += s.bucket_mass[b];
    if (reached >= mass) {
      last = b + 1;
      while (last < kBuckets && s.bucket_mass[last] == 0.0)
        ++last;
      if (last == kBuckets) last = b;
      break;
    }
  }
  rank_buckets(ids, w, last, s);
  if (s.head.size() == ids.size()) return;
  double ranked = 0.0;
  for (uint64_t k : s.head)
    ranked += weight_of(k);
  if (!(ranked > mass)) rank_buckets(ids, w, kBuckets - 1, s);
}

// Weights up to a common factor: w = exp(x * inv_t - max) with the kernels' exp (both
// forms give the same bits), and exactly 1 where x * inv_t is the maximum, as on the
// device: so also for an infinite maximum, or a row of -inf. NaN logits give NaN, which
// the kernels' exp would not keep.
void weights(const float* logits, int32_t vocab, float inv_t, float* w) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  float max_logit = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd()) {
    // The maximum does not depend on the order it is taken in.
    const __m512 scale = _mm512_set1_ps(inv_t);
    __m512 mx = _mm512_set1_ps(max_logit);
    for (; i + detail::kLanes <= vocab; i += detail::kLanes) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(logits + i), scale);
      _mm512_storeu_ps(w + i, x);
      mx = _mm512_max_ps(x, mx);  // a NaN x keeps mx
    }
    max_logit = _mm512_reduce_max_ps(mx);
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  if (detail::use_simd_or_avx2()) {
    const __m256 scale = _mm256_set1_ps(inv_t);
    __m256 mx = _mm256_set1_ps(max_logit);
    for (; i + 8 <= vocab; i += 8) {
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(logits + i), scale);
      _mm256_storeu_ps(w + i, x);
      mx = _mm256_max_ps(x, mx);  // a NaN x keeps mx
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    for (float x : lanes)
      max_logit = std::max(max_logit, x);
  }
#endif
  for (; i < vocab; ++i) {
    w[i] = logits[i] * inv_t;
    max_logit = std::max(max_logit, w[i]);  // skips NaN
  }
  i = 0;
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd()) {
    const __m512 mx = _mm512_set1_ps(max_logit);
    for (; i + detail::kLanes <= vocab; i += detail::kLanes) {
      const __m512 x = _mm512_loadu_ps(w + i);
      const __m512 d = _mm512_sub_ps(x, mx);
      const __mmask16 top = _mm512_cmp_ps_mask(x, mx, _CMP_EQ_OQ);
      const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      __m512 e = _mm512_mask_mov_ps(detail::exp16(d), top, _mm512_set1_ps(1.0f));
      _mm512_storeu_ps(w + i, _mm512_mask_mov_ps(e, nan, _mm512_set1_ps(kNaN)));
    }
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  if (detail::use_simd_or_avx2()) {
    const __m256 mx = _mm256_set1_ps(max_logit);
    for (; i + 8 <= vocab; i += 8) {
      const __m256 x = _mm256_loadu_ps(w + i);
      const __m256 top = _mm256_cmp_ps(x, mx, _CMP_EQ_OQ);
      const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
      const __m256 e =
          _mm256_blendv_ps(detail::exp8(_mm256_sub_ps(x, mx)), _mm256_set1_ps(1.0f), top);
      _mm256_storeu_ps(w + i, _mm256_blendv_ps(e, _mm256_set1_ps(kNaN), nan));
    }
  }
#endif
  for (; i < vocab; ++i) {
    const float x = w[i];
    w[i] = std::isnan(x) ? kNaN : x == max_logit ? 1.0f : detail::exp_scalar(x - max_logit);
  }
}

int32_t sample_row(const float* logits, int32_t vocab, float temperature, int32_t top_k,
                   float top_p, float min_p, double uniform, SamplingScratch& s) {
  std::vector<float>& w = s.weights;
  w.resize(vocab);
  weights(logits, vocab, 1.0f / temperature, w.data());

  // Candidates in token order: min-p keeps w >= min_p (the largest weight is 1, so the
  // threshold is min_p itself, at most 1). Weights of 0 (exp underflows below e^-87) carry
  // no mass and are never drawn; nor is NaN.
  const float threshold = min_p > 0.0f ? std::min(min_p, 1.0f) : 0.0f;
  const double candidate_mass = gather_candidates(w.data(), vocab, threshold, s);
  std::vector<int32_t>& ids = s.order;
  if (ids.empty()) return 0;

  // `ranked`: when set, the kept tokens in rank order (s.head, first `count`).
  bool ranked = false;
  int64_t count = static_cast<int64_t>(ids.size());
  if (top_k > 0 && top_k < count) {
    s.head.clear();
    for (int32_t id : ids)
      s.head.push_back(rank_key(w[id], id));
    std::nth_element(s.head.begin(), s.head.begin() + top_k, s.head.end());
    s.head.resize(top_k);
    std::sort(s.head.begin(), s.head.end());
    count = top_k;
    ranked = true;
    if (top_p < 1.0f) {
      ids.clear();  // the kept tokens in token order, for their mass
      for (uint64_t k : s.head)
        ids.push_back(id_of(k));
      std::sort(ids.begin(), ids.end());
    }
  }
  if (top_p < 1.0f) {
    // The shortest ranked prefix whose mass reaches top_p of the kept mass.
    double total = candidate_mass;
    if (ranked) {  // the top k, in token order
      total = 0.0;
      for (int32_t id : ids)
        total += w[id];
    }
    const double target = top_p * total;
    if (!ranked) {
      rank_head(ids, w.data(), target, s);
      count = static_cast<int64_t>(s.head.size());
    }
    double mass = 0.0;
    int64_t keep = 0;
    while (keep < count && mass < target)
      mass += weight_of(s.head[keep++]);
    count = std::max<int64_t>(keep, 1);
    ranked = true;
  }
  // The draw along the ranking: the first kept token where the running mass exceeds
  // uniform * (the kept mass), or the last if rounding leaves none. When every candidate
  // is kept, their mass is the one summed in token order, and they are ranked only as
  // far as the draw goes.
  double total = 0.0;
  if (ranked) {
    for (int64_t i = 0; i < count; ++i)
      total += weight_of(s.head[i]);
  } else {
    total = candidate_mass;
    rank_head(ids, w.data(), uniform * total, s);
    count = static_cast<int64_t>(s.head.size());
  }
  const double u = uniform * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    cumulative += weight_of(s.head[i]);
    if (u < cumulative) return id_of(s.head[i]);
  }
  return id_of(s.head[count - 1]);
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
                        const SamplingRows& params, int32_t* out) {
  auto sample = [&](int64_t r, SamplingScratch& s) {
    if (!(params.temperature[r] > 0.0f)) return;  // not sampled: out[r] stays
    out[r] = sample_row(logits + r * vocab, static_cast<int32_t>(vocab), params.temperature[r],
                        params.top_k[r], params.top_p[r], params.min_p[r], params.uniform[r], s);
  };
  const int threads = static_cast<int>(std::min<int64_t>(rows, omp_get_max_threads()));
  if (threads > 1) {
    // A row's token depends on that row alone: rows go to threads as they come free
    // (their cost varies with their top-p), each thread with its own scratch.
#pragma omp parallel num_threads(threads)
    {
      SamplingScratch& s = thread_scratch();
#pragma omp for schedule(dynamic)
      for (int64_t r = 0; r < rows; ++r)
        sample(r, s);
    }
    return;
  }
  SamplingScratch& s = thread_scratch();
  for (int64_t r = 0; r < rows; ++r)
    sample(r, s);
}

}  // namespace pagellm::kernels::cpu
