// Paged attention. One query position and one KV head form a work item: the query heads
// that share the KV head (GQA) are scored against each cached key as it is read, so K and
// V are read once per item. Softmax is two-pass in float32:
//   s[i] = dot(q, k_i) * scale      dot in the 16-lane order of simd.h
//   p[i] = exp(s[i] - max_i s)      exp of simd.h
//   out  = (sum_i p[i] * v_i) / sum_i p[i]
// with sum_i p[i] in the 16-lane order (lane = i - first position mod 16) and each output
// element one fma chain over positions in increasing order. A query's result therefore
// depends only on its head, its position and the cache: prefill chunks, decode steps and
// the thread split all give the same bits, and the decode entry point runs this same code.

#include <algorithm>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

using detail::kLanes;

struct Scratch {
  std::vector<float> scores;  // [G, positions rounded up to 16]
  std::vector<float> row;     // [head_dim] a K or V row in float32
  std::vector<float> acc;     // [G, head_dim]
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Converts cache row `slot` of `kv_head` to float32.
void load_row(bool simd, const void* base, const KVCacheLayer& c, int64_t slot, int kv_head,
              float* out) {
  const int64_t D = c.head_dim;
  const int64_t offset = (slot * c.num_kv_heads + kv_head) * D;
#if defined(PAGELLM_KERNELS_AVX512)
  if (simd) {
    for (int64_t d = 0; d < D; d += kLanes) {
      const __mmask16 m = detail::tail_mask(D - d);
      _mm512_mask_storeu_ps(out + d, m, detail::load16(base, c.dtype, offset + d, m));
    }
    return;
  }
#endif
  for (int64_t d = 0; d < D; ++d)
    out[d] = detail::load_scalar(base, c.dtype, offset + d);
}

// Attention of G query heads (sharing `kv_head`) at positions [lo, hi] of one sequence.
void attend(bool simd, const float* q,  // [G, head_dim]
            int G, const KVCacheLayer& c,
            const int32_t* block_table,  // [max_blocks_per_seq]
            int kv_head, int64_t lo, int64_t hi, float scale,
            float* out) {  // [G, head_dim]
  const int64_t D = c.head_dim;
  const int64_t npos = hi - lo + 1;
  const int64_t stride = (npos + kLanes - 1) / kLanes * kLanes;
  Scratch& s = thread_scratch();
  if (static_cast<int64_t>(s.scores.size()) < G * stride) s.scores.resize(G * stride);
  if (static_cast<int64_t>(s.row.size()) < D) s.row.resize(D);
  if (static_cast<int64_t>(s.acc.size()) < G * D) s.acc.resize(G * D);
  float* scores = s.scores.data();
  float* row = s.row.data();
  float* acc = s.acc.data();
  auto slot_of = [&](int64_t i) {
    return static_cast<int64_t>(block_table[i / kBlockSize]) * kBlockSize + i % kBlockSize;
  };

  // Scores.
  for (int64_t i = lo; i <= hi; ++i) {
    load_row(simd, c.k, c, slot_of(i), kv_head, row);
    for (int g = 0; g < G; ++g) {
#if defined(PAGELLM_KERNELS_AVX512)
      const float dot = simd ? detail::lane_dot_avx512(q + g * D, row, D)
                             : detail::lane_dot_scalar(q + g * D, row, D);
#else
      const float dot = detail::lane_dot_scalar(q + g * D, row, D);
#endif
      scores[g * stride + (i - lo)] = dot * scale;
    }
  }

  // Softmax weights (unnormalized) and their sums.
  float sums[64];
  std::vector<float> sums_heap;
  float* sum = sums;
  if (G > 64) {
    sums_heap.resize(G);
    sum = sums_heap.data();
  }
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * stride;
    float mx = sg[0];
    for (int64_t i = 1; i < npos; ++i)
      mx = std::max(mx, sg[i]);
#if defined(PAGELLM_KERNELS_AVX512)
    if (simd) {
      const __m512 vmx = _mm512_set1_ps(mx);
      for (int64_t i = 0; i < npos; i += kLanes) {
        const __mmask16 m = detail::tail_mask(npos - i);
        const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + i), vmx));
        _mm512_mask_storeu_ps(sg + i, m, e);
      }
      sum[g] = detail::lane_sum_avx512(sg, npos);
      continue;
    }
#endif
    for (int64_t i = 0; i < npos; ++i)
      sg[i] = detail::exp_scalar(sg[i] - mx);
    sum[g] = detail::lane_sum_scalar(sg, npos);
  }

  // Weighted sum of values.
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t i = lo; i <= hi; ++i) {
    load_row(simd, c.v, c, slot_of(i), kv_head, row);
    for (int g = 0; g < G; ++g) {
      const float p = scores[g * stride + (i - lo)];
      float* ag = acc + g * D;
#if defined(PAGELLM_KERNELS_AVX512)
      if (simd) {
        const __m512 vp = _mm512_set1_ps(p);
        for (int64_t d = 0; d < D; d += kLanes) {
          const __mmask16 m = detail::tail_mask(D - d);
          const __m512 a = _mm512_maskz_loadu_ps(m, ag + d);
          _mm512_mask_storeu_ps(ag + d, m,
                                _mm512_fmadd_ps(vp, _mm512_maskz_loadu_ps(m, row + d), a));
        }
        continue;
      }
#endif
      for (int64_t d = 0; d < D; ++d)
        ag[d] = std::fma(p, row[d], ag[d]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d)
      out[g * D + d] = acc[g * D + d] / sum[g];
}

// First attended position of a query at `pos`.
int64_t window_start(int64_t pos, int32_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

}  // namespace

void paged_attention(const float* q, const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                     int num_q_heads, float scale, float* out) {
  const int kvh = cache.num_kv_heads;
  const int G = num_q_heads / kvh;
  const int64_t D = cache.head_dim;
  const int64_t num_tokens = batch.query_start[batch.num_seqs];
  std::vector<int32_t> seq_of(num_tokens);
  for (int32_t s = 0; s < batch.num_seqs; ++s)
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t)
      seq_of[t] = s;
  const bool simd = detail::use_simd();
  const int64_t items = num_tokens * kvh;

#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t t = item / kvh;
    const int h = static_cast<int>(item % kvh);
    const int32_t s = seq_of[t];
    const int64_t q_len = batch.query_start[s + 1] - batch.query_start[s];
    const int64_t pos = batch.context_lens[s] - q_len + (t - batch.query_start[s]);
    const int64_t offset = (t * num_q_heads + static_cast<int64_t>(h) * G) * D;
    if (pos < 0) {
      std::fill(out + offset, out + offset + G * D, 0.f);
      continue;
    }
    attend(simd, q + offset, G, cache,
           batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq, h,
           window_start(pos, batch.sliding_window), pos, scale, out + offset);
  }
}

void paged_attention_decode(const float* q, const KVCacheLayer& cache,
                            const PagedAttentionBatch& batch, int num_q_heads, float scale,
                            float* out) {
  const int kvh = cache.num_kv_heads;
  const int G = num_q_heads / kvh;
  const int64_t D = cache.head_dim;
  const bool simd = detail::use_simd();
  const int64_t items = static_cast<int64_t>(batch.num_seqs) * kvh;

#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t s = item / kvh;
    const int h = static_cast<int>(item % kvh);
    const int64_t pos = batch.context_lens[s] - 1;
    const int64_t offset = (s * num_q_heads + static_cast<int64_t>(h) * G) * D;
    if (pos < 0) {
      std::fill(out + offset, out + offset + G * D, 0.f);
      continue;
    }
    attend(simd, q + offset, G, cache, batch.block_tables + s * batch.max_blocks_per_seq, h,
           window_start(pos, batch.sliding_window), pos, scale, out + offset);
  }
}

}  // namespace pagellm::kernels::cpu
