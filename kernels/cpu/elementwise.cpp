// Row-wise and elementwise kernels. Each row's reductions use the 16-lane order of
// simd.h, so a row's result depends only on that row.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

using detail::kLanes;

// out[0, dim) = table row converted to float32.
void convert_row(const void* src, DType t, int64_t offset, int64_t dim, float* out) {
  if (t == DType::kF32) {
    std::memcpy(out, static_cast<const float*>(src) + offset, dim * sizeof(float));
    return;
  }
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd()) {
    for (int64_t d = 0; d < dim; d += kLanes) {
      const __mmask16 m = detail::tail_mask(dim - d);
      _mm512_mask_storeu_ps(out + d, m, detail::load16(src, t, offset + d, m));
    }
    return;
  }
#endif
  for (int64_t d = 0; d < dim; ++d)
    out[d] = load_f32(src, t, offset + d);
}

// out = x * (1 / sqrt(mean(x^2) + eps)) * weight for one row, as Hugging Face's
// LlamaRMSNorm: weight * (x * rsqrt(variance + eps)).
void rmsnorm_row(const float* x, const void* weight, DType wt, int64_t dim, float eps, float* out) {
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd()) {
    const float ss = detail::lane_dot_avx512(x, x, dim);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t d = 0; d < dim; d += kLanes) {
      const __mmask16 m = detail::tail_mask(dim - d);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + d), vinv);
      _mm512_mask_storeu_ps(out + d, m, _mm512_mul_ps(detail::load16(weight, wt, d, m), v));
    }
    return;
  }
#endif
  const float ss = detail::lane_dot_scalar(x, x, dim);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
  for (int64_t d = 0; d < dim; ++d)
    out[d] = load_f32(weight, wt, d) * (x[d] * inv);
}

// out[i] = silu(gate[i]) * up[i] for i in [0, n).
void silu_mul_span(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd()) {
    for (; i < n; i += kLanes) {
      const __mmask16 m = detail::tail_mask(n - i);
      const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
      const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  if (detail::use_simd_or_avx2()) {
    for (; i + 8 <= n; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    const float s = g / (1.0f + detail::exp_scalar(0.0f - g));
    out[i] = s * up[i];
  }
}

// Below this many elements an elementwise kernel runs on the calling thread: waking the
// others costs more than the work.
constexpr int64_t kSmallElementwise = 8192;

#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
// The smallest index of the largest value over the lanes of the vector argmax's chains, -1
// when no lane took a value (a lane that took one holds one above -inf).
int64_t merge_argmax_lanes(const float* values, const int32_t* indices, int lanes) {
  float top = -INFINITY;
  int32_t first = -1;
  for (int l = 0; l < lanes; ++l) {
    if (indices[l] >= 0 && (values[l] > top || (values[l] == top && indices[l] < first))) {
      top = values[l];
      first = indices[l];
    }
  }
  return first;
}
#endif

// The index of the first maximum of row[0, n); NaN never wins (a row of NaN gives 0).
int64_t argmax_row(const float* row, int64_t n) {
#if defined(PAGELLM_KERNELS_AVX512)
  if (detail::use_simd() && n < (int64_t(1) << 31) - 64) {  // indices fit int32 lanes
    // kChains independent chains of 16 lanes, each lane keeping the first of its largest
    // values: only a strictly larger value replaces it (NaN compares false), starting from
    // -inf. The first maximum of the row is then the smallest index among the lanes that
    // hold the largest value.
    constexpr int kChains = 4;
    __m512 best[kChains];
    __m512i at[kChains];
    for (int c = 0; c < kChains; ++c) {
      best[c] = _mm512_set1_ps(-INFINITY);
      at[c] = _mm512_set1_epi32(-1);
    }
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Chain c takes the values v of positions at0 .. at0 + 15 whose lanes are in `valid`.
    const auto take = [&](int c, __m512 v, __mmask16 valid, int64_t at0) {
      const __mmask16 up = _mm512_cmp_ps_mask(v, best[c], _CMP_GT_OQ) & valid;
      best[c] = _mm512_mask_mov_ps(best[c], up, v);
      at[c] = _mm512_mask_mov_epi32(
          at[c], up, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(at0))));
    };
    int64_t i = 0;
    for (; i + kChains * kLanes <= n; i += kChains * kLanes)
      for (int c = 0; c < kChains; ++c)
        take(c, _mm512_loadu_ps(row + i + c * kLanes), 0xffff, i + c * kLanes);
    for (; i < n; i += kLanes) {
      const __mmask16 valid = detail::tail_mask(n - i);
      take(0, _mm512_maskz_loadu_ps(valid, row + i), valid, i);
    }
    float values[kChains * kLanes];
    int32_t indices[kChains * kLanes];
    for (int c = 0; c < kChains; ++c) {
      _mm512_storeu_ps(values + c * kLanes, best[c]);
      _mm512_storeu_si512(indices + c * kLanes, at[c]);
    }
    const int64_t first = merge_argmax_lanes(values, indices, kChains * kLanes);
    if (first >= 0) return first;
    // No value above -inf: the scalar loop finds the first -inf, if any.
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  if (detail::use_simd_or_avx2() && n < (int64_t(1) << 31) - 32) {
    // The AVX-512 form's chains on 8 lanes, over the whole vectors of the row; the
    // positions past them go through the scalar step from the chains' first maximum.
    constexpr int kChains = 4, kWidth = 8;
    __m256 best[kChains];
    __m256i at[kChains];
    for (int c = 0; c < kChains; ++c) {
      best[c] = _mm256_set1_ps(-INFINITY);
      at[c] = _mm256_set1_epi32(-1);
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const auto take = [&](int c, __m256 v, int64_t at0) {
      const __m256 up = _mm256_cmp_ps(v, best[c], _CMP_GT_OQ);
      best[c] = _mm256_blendv_ps(best[c], v, up);
      at[c] = _mm256_blendv_epi8(at[c],
                                 _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(at0))),
                                 _mm256_castps_si256(up));
    };
    int64_t i = 0;
    for (; i + kChains * kWidth <= n; i += kChains * kWidth)
      for (int c = 0; c < kChains; ++c)
        take(c, _mm256_loadu_ps(row + i + c * kWidth), i + c * kWidth);
    for (; i + kWidth <= n; i += kWidth)
      take(0, _mm256_loadu_ps(row + i), i);
    float values[kChains * kWidth];
    int32_t indices[kChains * kWidth];
    for (int c = 0; c < kChains; ++c) {
      _mm256_storeu_ps(values + c * kWidth, best[c]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + c * kWidth), at[c]);
    }
    int64_t first = merge_argmax_lanes(values, indices, kChains * kWidth);
    if (first >= 0) {
      for (; i < n; ++i)
        if (row[i] > row[first]) first = i;
      return first;
    }
    // No value above -inf among the vectors: the scalar loop, over the whole row.
  }
#endif
  int64_t best = 0;
  while (best + 1 < n && std::isnan(row[best]))
    ++best;
  if (std::isnan(row[best])) best = 0;
  for (int64_t i = best + 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

}  // namespace

void embedding(const int32_t* ids, int64_t num_tokens, const void* table, DType dtype,
               int64_t hidden, float* out) {
  // A single row is not worth waking the other threads for (decode at batch 1).
#pragma omp parallel for schedule(static) if (num_tokens > 1)
  for (int64_t t = 0; t < num_tokens; ++t)
    convert_row(table, dtype, static_cast<int64_t>(ids[t]) * hidden, hidden, out + t * hidden);
}

void rmsnorm(const float* x, const void* weight, DType w_dtype, int64_t rows, int64_t dim,
             float eps, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    rmsnorm_row(x + r * dim, weight, w_dtype, dim, eps, out + r * dim);
}

void add_rmsnorm(float* residual, const float* x, const void* weight, DType w_dtype, int64_t rows,
                 int64_t dim, float eps, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual + r * dim;
    const float* xr = x + r * dim;
    // The row of x is consumed before `out` is written, so out may alias x.
    for (int64_t d = 0; d < dim; ++d)
      res[d] = res[d] + xr[d];
    rmsnorm_row(res, weight, w_dtype, dim, eps, out + r * dim);
  }
}

void rope(float* q, float* k, const int32_t* positions, int64_t num_tokens, int num_q_heads,
          int num_kv_heads, int head_dim, const float* inv_freq) {
  const int half = head_dim / 2;
#pragma omp parallel if (num_tokens > 1)
  {
    std::vector<float> cos_t(half), sin_t(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      detail::rope_angles(positions[t], inv_freq, half, cos_t.data(), sin_t.data());
      for (int h = 0; h < num_q_heads; ++h)
        detail::rope_rotate(q + (t * num_q_heads + h) * head_dim, cos_t.data(), sin_t.data(), half);
      for (int h = 0; h < num_kv_heads; ++h)
        detail::rope_rotate(k + (t * num_kv_heads + h) * head_dim, cos_t.data(), sin_t.data(),
                            half);
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t rows, int64_t dim, float* out) {
  const int64_t total = rows * dim;
  // Elementwise: the split over threads cannot change any value.
#pragma omp parallel for schedule(static) if (total > kSmallElementwise)
  for (int64_t c = 0; c < total; c += 1024) {
    const int64_t end = std::min(total, c + 1024);
    silu_mul_span(gate + c, up + c, end - c, out + c);
  }
}

void silu_mul_fused(const float* gate_up, int64_t rows, int64_t dim, float* out) {
  const int64_t chunks = (dim + 1023) / 1024;
#pragma omp parallel for schedule(static) if (rows * dim > kSmallElementwise)
  for (int64_t item = 0; item < rows * chunks; ++item) {
    const int64_t r = item / chunks;
    const int64_t c = (item % chunks) * 1024;
    const int64_t n = std::min(dim, c + 1024) - c;
    const float* g = gate_up + r * 2 * dim + c;
    silu_mul_span(g, g + dim, n, out + r * dim + c);
  }
}

void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out) {
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    out[r] = static_cast<int32_t>(argmax_row(logits + r * vocab, vocab));
}

}  // namespace pagellm::kernels::cpu
