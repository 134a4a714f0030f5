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
#include <array>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

using detail::kLanes;

struct Scratch {
  std::vector<float> scores;     // [G, positions rounded up to 16]
  std::vector<float> row;        // [head_dim] a K or V row in float32
  std::vector<float> acc;        // [G, head_dim]
  std::vector<int64_t> offsets;  // [positions] element offset of each V row
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

#if defined(PAGELLM_KERNELS_AVX512)
// out[g, d] = (sum_i p[g, i] * v_i[d]) / sum[g] for NH heads x NC 16-lane chunks held in
// registers; each element is one fma chain over positions in order.
template <int NH, int NC>
void value_tile(const float* p, int64_t stride, int64_t npos, const int64_t* offsets, const void* v,
                DType t, int64_t d0, int64_t D, const float* sum, float* out) {
  __mmask16 mask[NC];
  for (int c = 0; c < NC; ++c)
    mask[c] = detail::tail_mask(std::max<int64_t>(0, D - d0 - c * kLanes));
  __m512 acc[NH][NC];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      acc[h][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < npos; ++i) {
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c)
      vv[c] = detail::load16(v, t, offsets[i] + d0 + c * kLanes, mask[c]);
    for (int h = 0; h < NH; ++h) {
      const __m512 pb = _mm512_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c)
        acc[h][c] = _mm512_fmadd_ps(pb, vv[c], acc[h][c]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    const __m512 vs = _mm512_set1_ps(sum[h]);
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(out + h * D + d0 + c * kLanes, mask[c], _mm512_div_ps(acc[h][c], vs));
  }
}

using ValueTileFn = void (*)(const float*, int64_t, int64_t, const int64_t*, const void*, DType,
                             int64_t, int64_t, const float*, float*);
template <int NH, int... Cs>
constexpr std::array<ValueTileFn, 4> value_tile_row(std::integer_sequence<int, Cs...>) {
  return {&value_tile<NH, Cs + 1>...};
}
constexpr std::array<std::array<ValueTileFn, 4>, 4> kValueTiles = {
    value_tile_row<1>(std::make_integer_sequence<int, 4>{}),
    value_tile_row<2>(std::make_integer_sequence<int, 4>{}),
    value_tile_row<3>(std::make_integer_sequence<int, 4>{}),
    value_tile_row<4>(std::make_integer_sequence<int, 4>{})};

// Tiles of up to 4 heads x 64 dims; V rows are re-read per tile (from cache: the first
// pass prefetched them).
void accumulate_values_avx512(const float* scores, int64_t stride, int64_t npos,
                              const int64_t* offsets, const KVCacheLayer& c, int G,
                              const float* sum, float* out) {
  const int64_t D = c.head_dim;
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  for (int g0 = 0; g0 < G; g0 += 4) {
    const int NH = std::min(4, G - g0);
    for (int64_t c0 = 0; c0 < chunks; c0 += 4) {
      const int NC = static_cast<int>(std::min<int64_t>(4, chunks - c0));
      kValueTiles[NH - 1][NC - 1](scores + g0 * stride, stride, npos, offsets, c.v, c.dtype,
                                  c0 * kLanes, D, sum + g0, out + g0 * D);
    }
  }
}
#endif

#if defined(PAGELLM_KERNELS_AVX512)
// Sums each of 16 vectors over its lanes, in the tree of detail::tree_sum16 (lanes
// (l, l+8), then (l, l+4), (l, l+2), (l, l+1)), all at once: lane j of the result is the
// sum of a[j].
__m512 tree_sum16x16(__m512 a[16]) {
  __m512 l1[8], l2[4], l3[2];
  for (int j = 0; j < 8; ++j) {  // halves: [a_2j(l) + a_2j(l+8) | a_2j+1(...)]
    const __m512 x = a[2 * j], y = a[2 * j + 1];
    l1[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  for (int j = 0; j < 4; ++j) {  // quarter q holds source 4j + q
    const __m512 u = l1[2 * j], v = l1[2 * j + 1];
    l2[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x88), _mm512_shuffle_f32x4(u, v, 0xDD));
  }
  for (int j = 0; j < 2; ++j) {
    const __m512 u = l2[2 * j], v = l2[2 * j + 1];
    l3[j] = _mm512_add_ps(_mm512_shuffle_ps(u, v, 0x44), _mm512_shuffle_ps(u, v, 0xEE));
  }
  const __m512 r =
      _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], 0x88), _mm512_shuffle_ps(l3[0], l3[1], 0xDD));
  // Lane 4q + r now holds source 4r + q.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// scores[g, i] = dot(q_g, k_i) * scale for 16 positions at a time: the K rows are
// converted once into `rows` and serve all G heads; each dot is one 16-lane fma chain
// over head_dim followed by the tree, as detail::lane_dot_scalar.
void scores_avx512(const float* q, int G, const int64_t* offsets, int64_t npos,
                   const KVCacheLayer& c, float scale, float* scores, int64_t stride,
                   float* rows) {  // [16, chunks * 16]
  const int64_t D = c.head_dim;
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  const int64_t Dp = chunks * kLanes;
  const int64_t row_bytes = D * dtype_size(c.dtype);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t b = 0; b < npos; b += kLanes) {
    const int64_t n = std::min<int64_t>(kLanes, npos - b);
    // Next 16 rows: K into L1 for the next round, V into L2 for the value pass.
    for (int64_t i = b + kLanes; i < std::min(npos, b + 2 * kLanes); ++i) {
      const int64_t off = offsets[i] * dtype_size(c.dtype);
      for (int64_t x = 0; x < row_bytes; x += 64) {
        detail::prefetch_l1(static_cast<const char*>(c.k) + off + x);
        detail::prefetch_l2(static_cast<const char*>(c.v) + off + x);
      }
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t ch = 0; ch < chunks; ++ch)
        _mm512_storeu_ps(rows + j * Dp + ch * kLanes,
                         detail::load16(c.k, c.dtype, offsets[b + j] + ch * kLanes,
                                        detail::tail_mask(D - ch * kLanes)));
    for (int64_t j = n; j < kLanes; ++j)
      for (int64_t ch = 0; ch < chunks; ++ch)
        _mm512_storeu_ps(rows + j * Dp + ch * kLanes, _mm512_setzero_ps());
    for (int g = 0; g < G; ++g) {
      __m512 acc[16];
      for (int j = 0; j < 16; ++j)
        acc[j] = _mm512_setzero_ps();
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const __m512 qc =
            _mm512_maskz_loadu_ps(detail::tail_mask(D - ch * kLanes), q + g * D + ch * kLanes);
        for (int j = 0; j < 16; ++j)
          acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(rows + j * Dp + ch * kLanes), acc[j]);
      }
      _mm512_mask_storeu_ps(scores + g * stride + b, detail::tail_mask(n),
                            _mm512_mul_ps(tree_sum16x16(acc), vscale));
    }
  }
}
#endif

// Attention of G query heads (sharing `kv_head`) at positions [lo, hi] of one sequence.
void attend(bool simd, const float* q,  // [G, head_dim]
            int G, const KVCacheLayer& c,
            const int32_t* block_table,  // [max_blocks_per_seq]
            int kv_head, int64_t lo, int64_t hi, float scale,
            float* out) {  // [G, head_dim]
  const int64_t D = c.head_dim;
  const int64_t npos = hi - lo + 1;
  const int64_t stride = (npos + kLanes - 1) / kLanes * kLanes;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  Scratch& s = thread_scratch();
  if (static_cast<int64_t>(s.scores.size()) < G * stride) s.scores.resize(G * stride);
  if (static_cast<int64_t>(s.row.size()) < kLanes * Dp) s.row.resize(kLanes * Dp);
  if (static_cast<int64_t>(s.acc.size()) < G * D) s.acc.resize(G * D);
  if (static_cast<int64_t>(s.offsets.size()) < npos) s.offsets.resize(npos);
  float* scores = s.scores.data();
  float* row = s.row.data();
  float* acc = s.acc.data();
  int64_t* offsets = s.offsets.data();  // element offset of each position's K/V row
  for (int64_t i = 0; i < npos; ++i) {
    const int64_t pos = lo + i;
    const int64_t slot =
        static_cast<int64_t>(block_table[pos / kBlockSize]) * kBlockSize + pos % kBlockSize;
    offsets[i] = (slot * c.num_kv_heads + kv_head) * D;
  }

  // Scores.
#if defined(PAGELLM_KERNELS_AVX512)
  if (simd) {
    scores_avx512(q, G, offsets, npos, c, scale, scores, stride, row);
  } else
#endif
  {
    for (int64_t i = 0; i < npos; ++i) {
      for (int64_t d = 0; d < D; ++d)
        row[d] = load_f32(c.k, c.dtype, offsets[i] + d);
      for (int g = 0; g < G; ++g)
        scores[g * stride + i] = detail::lane_dot_scalar(q + g * D, row, D) * scale;
    }
  }

  // Softmax weights (unnormalized) and their sums. The maximum does not depend on order.
  float sums[64];
  std::vector<float> sums_heap;
  float* sum = sums;
  if (G > 64) {
    sums_heap.resize(G);
    sum = sums_heap.data();
  }
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * stride;
#if defined(PAGELLM_KERNELS_AVX512)
    if (simd) {
      __m512 vmx = _mm512_set1_ps(sg[0]);
      for (int64_t i = 0; i < npos; i += kLanes)
        vmx = _mm512_mask_max_ps(vmx, detail::tail_mask(npos - i), vmx, _mm512_loadu_ps(sg + i));
      vmx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
      for (int64_t i = 0; i < npos; i += kLanes) {
        const __mmask16 m = detail::tail_mask(npos - i);
        const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + i), vmx));
        _mm512_mask_storeu_ps(sg + i, m, e);
      }
      sum[g] = detail::lane_sum_avx512(sg, npos);
      continue;
    }
#endif
    float mx = sg[0];
    for (int64_t i = 1; i < npos; ++i)
      mx = std::max(mx, sg[i]);
    for (int64_t i = 0; i < npos; ++i)
      sg[i] = detail::exp_scalar(sg[i] - mx);
    sum[g] = detail::lane_sum_scalar(sg, npos);
  }

  // Weighted sum of values.
#if defined(PAGELLM_KERNELS_AVX512)
  if (simd) {
    accumulate_values_avx512(scores, stride, npos, offsets, c, G, sum, out);
    return;
  }
#endif
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t i = 0; i < npos; ++i) {
    for (int64_t d = 0; d < D; ++d)
      row[d] = load_f32(c.v, c.dtype, offsets[i] + d);
    for (int g = 0; g < G; ++g) {
      const float p = scores[g * stride + i];
      float* ag = acc + g * D;
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

  // Later positions of a prompt attend to more keys, and the cores of a shared machine
  // do not run at one speed: threads take small runs of items as they finish.
#pragma omp parallel for schedule(dynamic, 4)
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
