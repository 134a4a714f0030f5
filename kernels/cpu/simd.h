#pragma once
// Shared building blocks of the CPU kernels, in forms that give the same bits: an AVX-512
// one, for some an AVX2 one (machines without AVX-512), and a portable scalar one.
// Reductions are written as 16 lane partial sums followed by a fixed tree, so that every
// form sums in the same order.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

#if defined(PAGELLM_EMULATE_AVX512)
#include "kernels/cpu/avx512_emulation.h"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define PAGELLM_KERNELS_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// Without AVX-512, the matmul, attention's scores and weights, SiLU and the sampler's
// weights still have vector forms, on AVX2 and FMA; the other kernels take their portable
// path.
#include <immintrin.h>
#define PAGELLM_KERNELS_AVX2 1
#endif

namespace pagellm::kernels::cpu {

// The kernels run their portable path when this is set (tests compare both paths); it
// is always the path taken on machines without AVX-512, but by the kernels with an AVX2
// form.
void set_portable_kernels(bool on);
bool portable_kernels();

namespace detail {

inline constexpr int kLanes = 16;

// Keeps a loaded vector in a register for the instructions that use it: GCC otherwise
// folds the load into each of them (one load per use). Nothing under emulation, whose
// vectors are structs in memory.
template <class V>
inline void keep_in_register(V& v) {
#if defined(__x86_64__) && !defined(PAGELLM_EMULATE_AVX512)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// Software prefetch. GCC 12 deletes loops whose only effect is __builtin_prefetch, so
// on x86 the instruction is emitted through volatile asm. The address goes in as a
// register, not as a memory operand: an asm that may read memory keeps GCC from holding
// a loop's array of accumulators in registers, and it then stores all of them on every
// iteration.
inline void prefetch_l1(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// The same into L2 only (prefetcht1).
inline void prefetch_l2(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

inline bool use_simd() {
#if defined(PAGELLM_KERNELS_AVX512)
  return !portable_kernels();
#else
  return false;
#endif
}
// Whether a kernel with an AVX2 form takes it (or its AVX-512 one).
inline bool use_simd_or_avx2() {
#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
  return !portable_kernels();
#else
  return false;
#endif
}

// Tree over 16 lanes: (l, l+8), then (l, l+4), (l, l+2), (0, 1).
inline float tree_sum16(const float* lanes) {
  float t8[8], t4[4], t2[2];
  for (int l = 0; l < 8; ++l)
    t8[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l)
    t4[l] = t8[l] + t8[l + 4];
  for (int l = 0; l < 2; ++l)
    t2[l] = t4[l] + t4[l + 2];
  return t2[0] + t2[1];
}

// exp for softmax and SiLU: Cephes' single-precision polynomial, written with explicit
// fma so that the scalar and vector forms agree bit for bit (a few ulp from exact).
// Inputs below -87 give 0 and inputs above 88 give +inf (both within float32's edge of
// range: softmax only passes inputs <= 0, SiLU divides by 1 + exp(-x)).
inline constexpr float kExpMax = 88.0f;
inline constexpr float kExpMin = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpC[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                   4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_scalar(float x) {
  const bool underflow = x < kExpMin;
  const bool overflow = x > kExpMax;
  x = x < kExpMax ? x : kExpMax;  // NaN becomes kExpMax, as vminps does
  // Far below the range (to -inf) the result is 0 anyway; the clamp keeps n within int.
  x = x > kExpMin - 1.0f ? x : kExpMin - 1.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpC[0];
  for (int i = 1; i < 6; ++i)
    p = std::fma(p, r, kExpC[i]);
  const float r2 = r * r;
  const float y = std::fma(p, r2, r) + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  if (overflow) return HUGE_VALF;
  return underflow ? 0.f : y * scale;
}

#if defined(PAGELLM_KERNELS_AVX512)

inline float tree_sum16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

inline __m512 exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  const __mmask16 overflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMax), _CMP_GT_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(kExpMax));
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin - 1.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpC[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC[i]));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e =
      _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), y, _mm512_castsi512_ps(bits));
  return _mm512_mask_mov_ps(e, overflow, _mm512_set1_ps(HUGE_VALF));
}

inline __mmask16 tail_mask(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// 16 values of `t` starting at element i, as float32: the vector form of load_f32
// (kernels/dtype.h). Plain loads: GCC keeps a loop's accumulators in registers around
// these, while around masked loads it stores them on every iteration.
inline __m512 load16(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
    case DType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i))),
          16));
  }
  return _mm512_setzero_ps();
}

// Up to 16 values, as load16 above (lanes past `mask` are 0).
inline __m512 load16(const void* p, DType t, int64_t i, __mmask16 mask) {
  switch (t) {
    case DType::kF32:
      return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(p) + i);
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(p) + i));
    case DType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                                       mask, static_cast<const uint16_t*>(p) + i)),
                                                   16));
  }
  return _mm512_setzero_ps();
}

#endif  // PAGELLM_KERNELS_AVX512

#if defined(PAGELLM_KERNELS_AVX2)
// Lanes [0, count) of 8 as a maskload/maskstore mask (none for count <= 0, all from 8).
inline __m256i tail_mask8(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(count, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp_scalar on 8 lanes, operation for operation (machines with AVX2 but not AVX-512).
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  const __m256 overflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMax), _CMP_GT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(kExpMax));  // NaN becomes kExpMax
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpMin - 1.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpC[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC[i]));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
  return _mm256_blendv_ps(e, _mm256_set1_ps(HUGE_VALF), overflow);
}
#endif  // PAGELLM_KERNELS_AVX2

// Sum over lanes then tree (see above) of f(a[i]) for i in [0, n): lane l takes i = l,
// l + 16, ... in order; `fma` form accumulates a[i] * b[i].
inline float lane_dot_scalar(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  for (int64_t c = 0; c < n; c += kLanes)
    for (int l = 0; l < kLanes && c + l < n; ++l)
      lanes[l] = std::fma(a[c + l], b[c + l], lanes[l]);
  return tree_sum16(lanes);
}

inline float lane_sum_scalar(const float* a, int64_t n) {
  float lanes[kLanes] = {};
  for (int64_t c = 0; c < n; c += kLanes)
    for (int l = 0; l < kLanes && c + l < n; ++l)
      lanes[l] = lanes[l] + a[c + l];
  return tree_sum16(lanes);
}

#if defined(PAGELLM_KERNELS_AVX512)
inline float lane_dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c), acc);
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c),
                                acc, m);
  }
  return tree_sum16(acc);
}

inline float lane_sum_avx512(const float* a, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    acc = _mm512_add_ps(acc, _mm512_loadu_ps(a + c));
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    acc = _mm512_mask_add_ps(acc, m, acc, _mm512_maskz_loadu_ps(m, a + c));
  }
  return tree_sum16(acc);
}
#endif

// Rotary angles of one position, as Hugging Face computes them: angle = position *
// inv_freq[i] in float32, then its cos and sin (i < half = head_dim / 2).
inline void rope_angles(int32_t position, const float* inv_freq, int half, float* cos_t,
                        float* sin_t) {
  const float pos = static_cast<float>(position);
  for (int i = 0; i < half; ++i) {
    const float angle = pos * inv_freq[i];
    cos_t[i] = std::cos(angle);
    sin_t[i] = std::sin(angle);
  }
}

// Rotates one head in the rotate-half layout: element i pairs with element i + half.
inline void rope_rotate(float* head, const float* cos_t, const float* sin_t, int half) {
  for (int i = 0; i < half; ++i) {
    const float x0 = head[i], x1 = head[i + half];
    head[i] = x0 * cos_t[i] - x1 * sin_t[i];
    head[i + half] = x1 * cos_t[i] + x0 * sin_t[i];
  }
}

// Converts `count` floats to the cache's dtype (round to nearest even, subnormals kept)
// at dst: one token's K or V row (kv_cache.cpp).
void store_row(const float* src, int64_t count, DType t, void* dst);

}  // namespace detail
}  // namespace pagellm::kernels::cpu
