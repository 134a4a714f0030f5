// Paged attention. A work item is one KV head and a run of up to 8 consecutive queries
// of one sequence: the query heads of the run that share the KV head (GQA) are scored
// against each cached key as it is read, so K is read and converted once per item.
// Softmax is two-pass in float32:
//   s[i] = dot(q, k_i) * scale      dot: one fma chain over head_dim, d = 0, 1, ...
//   p[i] = exp(s[i] - max_i s)      exp of simd.h
//   out  = (sum_i p[i] * v_i) / sum_i p[i]
// with sum_i p[i] in the 16-lane order (lane = i - first position mod 16) and each output
// element one fma chain over positions in increasing order. A query's result therefore
// depends only on its head, its position and the cache: prefill chunks, decode steps, the
// runs and the thread split all give the same bits, and the decode entry point runs this
// same code.

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

using detail::kLanes;

struct Scratch {
  std::vector<float> scores;        // [heads, positions rounded up to 16]
  std::vector<float> row;           // [head_dim] a K or V row in float32
  std::vector<float> kt;            // [2, Dp, 16] 32 K rows transposed, 64-byte aligned within
  std::vector<float> acc;           // [G, head_dim]
  std::vector<int64_t> offsets;     // [positions] element offset of each K/V row
  std::vector<const float*> heads;  // [heads] each query head's vector
  std::vector<float*> outs;         // [heads] each query head's output
  std::vector<float> sums;          // [heads] each head's sum of softmax weights
  std::vector<int64_t> ranges;      // [2, heads] each head's first and end position
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Prefetches one cache row (a token's head_dim values for one KV head) at element offset
// `at` of K or V.
inline void prefetch_cache_row(const void* base, DType t, int64_t at, int64_t head_dim,
                               bool l2_only = false) {
  const char* row = static_cast<const char*>(base) + at * dtype_size(t);
  const int64_t bytes = head_dim * dtype_size(t);
  for (int64_t x = 0; x < bytes; x += 64)
    l2_only ? detail::prefetch_l2(row + x) : detail::prefetch_l1(row + x);
}
// Up to this many bytes of a KV head's values (its whole range), the AVX2 score pass
// prefetches each block's V rows into L2 as it reads the block's keys, so that the value
// pass reads them from L2 instead of waiting on memory row by row. Half of a 512 KiB L2:
// 16 sequences x 512 positions decoded 1.12 times as fast, 4 x 2,048 1.04 times.
constexpr int64_t kValuesToL2Bytes = 256 * 1024;

// A register tile of the value pass (value_tile, value_tile_avx2).
using ValueTileFn = void (*)(const float*, int64_t, const int64_t*, const int64_t*, const int64_t*,
                             const void*, int64_t, int64_t, const float*, float* const*);

#if defined(PAGELLM_KERNELS_AVX512)
// out[h][d] = (sum_i p[h, i] * v_i[d]) / sum[h] over head h's positions [begin[h], end[h])
// for NH heads x NC 16-lane chunks held in registers; each element is one fma chain over
// its positions in order. The heads' ranges may differ: positions run from the first
// begin to the last end, and at a position outside its range a head leaves its
// accumulators untouched (a masked fma), whatever p and v hold there. The V rows
// kValueAhead positions on are prefetched as the pass goes. Full: all NC chunks lie
// within D, so V is read with plain loads. (The cache's type and Full are template
// arguments: a switch, or masked loads, inside the loop make GCC keep the accumulators in
// memory.)
constexpr int64_t kValueAhead = 16;  // V rows prefetched ahead of the value pass
template <DType T, int NH, int NC, bool Full>
void value_tile(const float* p, int64_t stride, const int64_t* begin, const int64_t* end,
                const int64_t* offsets, const void* v, int64_t d0, int64_t D, const float* sum,
                float* const* out) {
  __mmask16 mask[NC];
  for (int c = 0; c < NC; ++c)
    mask[c] = detail::tail_mask(std::max<int64_t>(0, D - d0 - c * kLanes));
  __m512 acc[NH][NC];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      acc[h][c] = _mm512_setzero_ps();
  const int64_t first = *std::min_element(begin, begin + NH);
  const int64_t last = *std::max_element(end, end + NH);
  for (int64_t i = first; i < last; ++i) {
    if (d0 == 0 && i + kValueAhead < last) prefetch_cache_row(v, T, offsets[i + kValueAhead], D);
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c)
      vv[c] = Full ? detail::load16(v, T, offsets[i] + d0 + c * kLanes)
                   : detail::load16(v, T, offsets[i] + d0 + c * kLanes, mask[c]);
    for (int h = 0; h < NH; ++h) {
      const __mmask16 on = static_cast<__mmask16>(-((begin[h] <= i) & (i < end[h])));
      const __m512 pb = _mm512_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c)
        acc[h][c] = _mm512_mask3_fmadd_ps(pb, vv[c], acc[h][c], on);
    }
  }
  for (int h = 0; h < NH; ++h) {
    const __m512 vs = _mm512_set1_ps(sum[h]);
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(out[h] + d0 + c * kLanes, mask[c], _mm512_div_ps(acc[h][c], vs));
  }
}

constexpr int kValueHeads = 6;  // heads per value tile: 24 accumulators over 64 dims
template <DType T, bool Full, int NH, int... Cs>
constexpr std::array<ValueTileFn, 4> value_tile_row(std::integer_sequence<int, Cs...>) {
  return {&value_tile<T, NH, Cs + 1, Full>...};
}
template <DType T, bool Full, int... Hs>
constexpr std::array<std::array<ValueTileFn, 4>, kValueHeads> value_table(
    std::integer_sequence<int, Hs...>) {
  return {value_tile_row<T, Full, Hs + 1>(std::make_integer_sequence<int, 4>{})...};
}
// [Full][NH - 1][NC - 1]
template <DType T>
constexpr std::array<std::array<std::array<ValueTileFn, 4>, kValueHeads>, 2> kValueTiles = {
    value_table<T, false>(std::make_integer_sequence<int, kValueHeads>{}),
    value_table<T, true>(std::make_integer_sequence<int, kValueHeads>{})};

// Tiles of up to 6 heads x 64 dims; V rows are re-read per tile (from cache: the tiles of
// the first 64 dims prefetch them). Head h's weights are at scores + h * stride, its
// positions are [begin[h], end[h]), its output goes to out[h].
void accumulate_values_avx512(const float* scores, int64_t stride, const int64_t* begin,
                              const int64_t* end, const int64_t* offsets, const KVCacheLayer& c,
                              int heads, const float* sum, float* const* out) {
  const int64_t D = c.head_dim;
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  const auto& tiles = c.dtype == DType::kF32   ? kValueTiles<DType::kF32>
                      : c.dtype == DType::kF16 ? kValueTiles<DType::kF16>
                                               : kValueTiles<DType::kBF16>;
  for (int h0 = 0; h0 < heads; h0 += kValueHeads) {
    const int NH = std::min(kValueHeads, heads - h0);
    for (int64_t c0 = 0; c0 < chunks; c0 += 4) {
      const int NC = static_cast<int>(std::min<int64_t>(4, chunks - c0));
      const bool full = (c0 + NC) * kLanes <= D;
      tiles[full ? 1 : 0][NH - 1][NC - 1](scores + h0 * stride, stride, begin + h0, end + h0,
                                          offsets, c.v, c0 * kLanes, D, sum + h0, out + h0);
    }
  }
}
#endif

#if defined(PAGELLM_KERNELS_AVX512)
// Transposes a 16 x 16 block of 32-bit elements in registers: element e of r[j] moves to
// element j of r[e]. (The full-mask forms of the shuffles: GCC 12's plain forms warn
// about their own undefined pass-through operand.)
inline void transpose16(__m512 r[16]) {
  constexpr __mmask16 all = 0xffff;
  const auto lo = [](__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, all, a, b); };
  const auto hi = [](__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, all, a, b); };
  const auto pair = [](__m512 a, __m512 b, auto imm) {
    return _mm512_mask_shuffle_ps(a, all, a, b, decltype(imm)::value);
  };
  const auto lanes = [](__m512 a, __m512 b, auto imm) {
    return _mm512_mask_shuffle_f32x4(a, all, a, b, decltype(imm)::value);
  };
  using I44 = std::integral_constant<int, 0x44>;
  using IEE = std::integral_constant<int, 0xEE>;
  using I88 = std::integral_constant<int, 0x88>;
  using IDD = std::integral_constant<int, 0xDD>;
  __m512 t[16];
  for (int j = 0; j < 16; j += 2) {  // per 128-bit lane: r_j[0] r_j+1[0] r_j[1] r_j+1[1], ...
    t[j] = lo(r[j], r[j + 1]);
    t[j + 1] = hi(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // r[j + e], lane L: rows j .. j + 3, element 4L + e
    r[j] = pair(t[j], t[j + 2], I44{});
    r[j + 1] = pair(t[j], t[j + 2], IEE{});
    r[j + 2] = pair(t[j + 1], t[j + 3], I44{});
    r[j + 3] = pair(t[j + 1], t[j + 3], IEE{});
  }
  for (int e = 0; e < 4; ++e) {  // lanes 0 and 2, then 1 and 3, of row groups 0, 1 and 2, 3
    t[e] = lanes(r[e], r[4 + e], I88{});
    t[4 + e] = lanes(r[e], r[4 + e], IDD{});
    t[8 + e] = lanes(r[8 + e], r[12 + e], I88{});
    t[12 + e] = lanes(r[8 + e], r[12 + e], IDD{});
  }
  for (int e = 0; e < 4; ++e) {  // element 4L + e: lane L of the four row groups
    r[0 + e] = lanes(t[e], t[8 + e], I88{});
    r[8 + e] = lanes(t[e], t[8 + e], IDD{});
    r[4 + e] = lanes(t[4 + e], t[12 + e], I88{});
    r[12 + e] = lanes(t[4 + e], t[12 + e], IDD{});
  }
}

// kt[d * 16 + j] = k_j[d] in float32 for the n <= 16 keys at element offsets `offsets`
// (zeros for j >= n), d < head_dim rounded up to 16. A bf16 cache with an even head_dim
// is transposed as 32-bit pairs before the (exact) conversion: half the shuffles.
// Meanwhile the K rows at `ahead` (ahead_n of them) are prefetched, one with each row
// loaded: spread out, the prefetches keep memory busy without stalling the shuffles.
void transpose_keys(const KVCacheLayer& c, const int64_t* offsets, int64_t n, float* kt,
                    const int64_t* ahead, int64_t ahead_n) {
  const int64_t D = c.head_dim;
  const auto prefetch_row = [&](int64_t j) {
    if (j < ahead_n) prefetch_cache_row(c.k, c.dtype, ahead[j], D);
  };
  __m512 r[16];
  if (c.dtype == DType::kBF16 && D % 2 == 0) {
    const int64_t pairs = D / 2;
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t p0 = 0; p0 < pairs; p0 += kLanes) {
      const __mmask16 m = detail::tail_mask(pairs - p0);
      for (int64_t j = 0; j < kLanes; ++j) {
        if (p0 == 0) prefetch_row(j);
        r[j] = j < n ? _mm512_maskz_loadu_ps(
                           m, static_cast<const uint16_t*>(c.k) + offsets[j] + 2 * p0)
                     : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t e = 0; e < kLanes && p0 + e < pairs; ++e) {
        const __m512i w = _mm512_castps_si512(r[e]);
        _mm512_store_ps(kt + (2 * (p0 + e)) * kLanes,
                        _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        _mm512_store_ps(kt + (2 * (p0 + e) + 1) * kLanes,
                        _mm512_castsi512_ps(_mm512_and_si512(w, high)));
      }
    }
    return;
  }
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    const __mmask16 m = detail::tail_mask(D - d0);
    for (int64_t j = 0; j < kLanes; ++j) {
      if (d0 == 0) prefetch_row(j);
      r[j] = j < n ? detail::load16(c.k, c.dtype, offsets[j] + d0, m) : _mm512_setzero_ps();
    }
    transpose16(r);
    for (int64_t e = 0; e < kLanes; ++e)
      _mm512_store_ps(kt + (d0 + e) * kLanes, r[e]);
  }
}

// NH heads x NB blocks of 16 keys: lane j of block b holds key 16b + j, and each score is
// one fma chain over d = 0 .. D-1. kt: the keys transposed, [NB][Dp][16] (block stride kb).
template <int NH, int NB>
void score_tile(const float* const* q, const float* kt, int64_t kb, int64_t D, float scale,
                float* const* dst, const __mmask16* mask) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 acc[NH][NB];
  for (int h = 0; h < NH; ++h)
    for (int b = 0; b < NB; ++b)
      acc[h][b] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 k[NB];
    for (int b = 0; b < NB; ++b)
      k[b] = _mm512_load_ps(kt + b * kb + d * kLanes);
    for (int h = 0; h < NH; ++h) {
      const __m512 qb = _mm512_set1_ps(q[h][d]);
      for (int b = 0; b < NB; ++b)
        acc[h][b] = _mm512_fmadd_ps(qb, k[b], acc[h][b]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int b = 0; b < NB; ++b)
      _mm512_mask_storeu_ps(dst[h] + b * kLanes, mask[b], _mm512_mul_ps(acc[h][b], vscale));
}

constexpr int kScoreHeads = 6;  // heads per score tile: 12 accumulators over 32 keys
using ScoreTileFn = void (*)(const float* const*, const float*, int64_t, int64_t, float,
                             float* const*, const __mmask16*);
template <int... Hs>
constexpr std::array<std::array<ScoreTileFn, 2>, kScoreHeads> score_table(
    std::integer_sequence<int, Hs...>) {
  return {std::array<ScoreTileFn, 2>{&score_tile<Hs + 1, 1>, &score_tile<Hs + 1, 2>}...};
}
constexpr auto kScoreTiles = score_table(std::make_integer_sequence<int, kScoreHeads>{});

// Scores of every head against 32 keys at a time: the K rows are transposed and converted
// once, then serve all heads.
void scores_avx512(const float* const* q, int heads, const int64_t* offsets, int64_t npos,
                   const KVCacheLayer& c, float scale, float* scores, int64_t stride,
                   float* kt) {  // [2, Dp, 16], 64-byte aligned
  const int64_t D = c.head_dim;
  const int64_t chunks = (D + kLanes - 1) / kLanes;
  const int64_t Dp = chunks * kLanes;
  const float* hq[kScoreHeads];
  float* dst[kScoreHeads];
  for (int64_t b = 0; b < npos; b += 2 * kLanes) {
    const int64_t n = std::min<int64_t>(2 * kLanes, npos - b);
    const int nb = n > kLanes ? 2 : 1;
    // Each block of 16 rows prefetches the block 32 rows on (the next round's).
    for (int blk = 0; blk < nb; ++blk) {
      const int64_t at = b + blk * kLanes;
      const int64_t ahead = std::clamp<int64_t>(npos - at - 2 * kLanes, 0, kLanes);
      transpose_keys(c, offsets + at, std::min<int64_t>(kLanes, n - blk * kLanes),
                     kt + blk * Dp * kLanes, ahead > 0 ? offsets + at + 2 * kLanes : nullptr,
                     ahead);
    }
    const __mmask16 mask[2] = {detail::tail_mask(n),
                               detail::tail_mask(std::max<int64_t>(0, n - kLanes))};
    for (int h0 = 0; h0 < heads; h0 += kScoreHeads) {
      const int nh = std::min(kScoreHeads, heads - h0);
      for (int h = 0; h < nh; ++h) {
        hq[h] = q[h0 + h];
        dst[h] = scores + (h0 + h) * stride + b;
      }
      kScoreTiles[nh - 1][nb - 1](hq, kt, Dp * kLanes, D, scale, dst, mask);
    }
  }
}
#endif

#if defined(PAGELLM_KERNELS_AVX2)
// The same scores, softmax weights and weighted sums on 8-lane vectors, for machines with
// AVX2 but not AVX-512: every score is still one fma chain over d, every weight the exp
// of simd.h, every sum the 16-lane order, every output one fma chain over positions.

// Transposes an 8 x 8 block of floats in registers: element e of r[j] moves to element j
// of r[e].
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
    r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
  }
}

// The 8 cache elements at element offset `at`, as float32.
template <DType T>
inline __m256 load8(const void* base, int64_t at) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + at);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + at));
    if constexpr (T == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Elements d0 .. d0 + 7 of the cache row at element offset `at`, as float32 (zeros past
// `count` of them).
inline __m256 load8(const void* base, DType t, int64_t at, int64_t count) {
  if (count >= 8) {
    switch (t) {
      case DType::kF32:
        return load8<DType::kF32>(base, at);
      case DType::kF16:
        return load8<DType::kF16>(base, at);
      case DType::kBF16:
        return load8<DType::kBF16>(base, at);
    }
  }
  alignas(32) float tail[8] = {};
  for (int64_t e = 0; e < count; ++e)
    tail[e] = load_f32(base, t, at + e);
  return _mm256_load_ps(tail);
}

// One block of transpose_keys_avx2. Full (16 keys, head_dim a multiple of 16, so every
// d0 < head_dim): the element type fixed and no bounds to test, which the generic load
// costs on every 8 elements.
template <DType T, bool Full>
void transpose_block_avx2(const void* k, const int64_t* offsets, int64_t n, int64_t D, float* kt) {
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  __m256 r[8];
  for (int64_t d0 = 0; d0 < Dp; d0 += 8) {
    for (int64_t g = 0; g < 2; ++g) {  // keys 8g .. 8g + 7
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t key = 8 * g + j;
        if constexpr (Full) {
          r[j] = load8<T>(k, offsets[key] + d0);
        } else {
          r[j] = key < n && d0 < D ? load8(k, T, offsets[key] + d0, D - d0) : _mm256_setzero_ps();
        }
      }
      transpose8(r);
      for (int64_t e = 0; e < 8; ++e)
        _mm256_store_ps(kt + (d0 + e) * kLanes + 8 * g, r[e]);
    }
  }
}

// kt as transpose_keys above fills it: kt[d * 16 + j] = k_j[d] for the n <= 16 keys at
// element offsets `offsets` (zeros for j >= n), d < head_dim rounded up to 16, while the
// rows at `ahead` are prefetched.
void transpose_keys_avx2(const KVCacheLayer& c, const int64_t* offsets, int64_t n, float* kt,
                         const int64_t* ahead, int64_t ahead_n) {
  const int64_t D = c.head_dim;
  for (int64_t j = 0; j < ahead_n; ++j)
    prefetch_cache_row(c.k, c.dtype, ahead[j], D);
  const bool full = n == kLanes && D % kLanes == 0;
  switch (c.dtype) {
    case DType::kF32:
      return full ? transpose_block_avx2<DType::kF32, true>(c.k, offsets, n, D, kt)
                  : transpose_block_avx2<DType::kF32, false>(c.k, offsets, n, D, kt);
    case DType::kF16:
      return full ? transpose_block_avx2<DType::kF16, true>(c.k, offsets, n, D, kt)
                  : transpose_block_avx2<DType::kF16, false>(c.k, offsets, n, D, kt);
    case DType::kBF16:
      return full ? transpose_block_avx2<DType::kBF16, true>(c.k, offsets, n, D, kt)
                  : transpose_block_avx2<DType::kBF16, false>(c.k, offsets, n, D, kt);
  }
}

// NH heads x NB blocks of 16 keys (two 8-lane halves each), as score_tile: each score one
// fma chain over d. n: the valid keys of the NB blocks.
template <int NH, int NB>
void score_tile_avx2(const float* const* q, const float* kt, int64_t kb, int64_t D, float scale,
                     float* const* dst, int64_t n) {
  __m256 acc[NH][NB][2];
  for (int h = 0; h < NH; ++h)
    for (int b = 0; b < NB; ++b)
      for (int x = 0; x < 2; ++x)
        acc[h][b][x] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m256 k[NB][2];
    for (int b = 0; b < NB; ++b)
      for (int x = 0; x < 2; ++x)
        k[b][x] = _mm256_load_ps(kt + b * kb + d * kLanes + 8 * x);
    for (int h = 0; h < NH; ++h) {
      const __m256 qb = _mm256_set1_ps(q[h][d]);
      for (int b = 0; b < NB; ++b)
        for (int x = 0; x < 2; ++x)
          acc[h][b][x] = _mm256_fmadd_ps(qb, k[b][x], acc[h][b][x]);
    }
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  // Plain stores where every key is valid: Zen 3's 256-bit masked store is microcoded.
  if (n >= NB * kLanes) {
    for (int b = 0; b < NB; ++b)
      for (int x = 0; x < 2; ++x)
        for (int h = 0; h < NH; ++h)
          _mm256_storeu_ps(dst[h] + b * kLanes + 8 * x, _mm256_mul_ps(acc[h][b][x], vscale));
    return;
  }
  for (int b = 0; b < NB; ++b)
    for (int x = 0; x < 2; ++x) {
      const __m256i m = detail::tail_mask8(n - b * kLanes - 8 * x);
      for (int h = 0; h < NH; ++h)
        _mm256_maskstore_ps(dst[h] + b * kLanes + 8 * x, m, _mm256_mul_ps(acc[h][b][x], vscale));
    }
}

constexpr int64_t kValueAheadAvx2 = 16;  // V rows prefetched ahead of the value pass

// value_tile on 8-lane vectors: NH heads x NC 8-lane chunks in registers (NH * NC <= 12).
// Without masked fmas, the positions where every head of the tile is in range (all but a
// run's last queries, and a window's first positions) take plain fmas; at the others each
// head's fma result is blended in only where the head is in range, so its accumulators
// are left untouched elsewhere whatever p and v hold there.
template <DType T, int NH, int NC, bool Full>
void value_tile_avx2(const float* p, int64_t stride, const int64_t* begin, const int64_t* end,
                     const int64_t* offsets, const void* v, int64_t d0, int64_t D, const float* sum,
                     float* const* out) {
  static_assert(NH * NC <= 12);
  __m256 acc[NH][NC];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      acc[h][c] = _mm256_setzero_ps();
  const int64_t first = *std::min_element(begin, begin + NH);
  const int64_t last = *std::max_element(end, end + NH);
  // Every head is in range on [all_begin, all_end).
  const int64_t all_begin = *std::max_element(begin, begin + NH);
  const int64_t all_end = std::max(all_begin, *std::min_element(end, end + NH));
  const auto load_row = [&](int64_t i, __m256(&vv)[NC]) {
    // The first pass brings whole rows into L1; the later ones (the rows have left L1)
    // prefetch the line their chunks start in.
    if (i + kValueAheadAvx2 < last) {
      if (d0 == 0)
        prefetch_cache_row(v, T, offsets[i + kValueAheadAvx2], D);
      else
        detail::prefetch_l1(static_cast<const char*>(v) +
                            (offsets[i + kValueAheadAvx2] + d0) * dtype_size(T));
    }
    for (int c = 0; c < NC; ++c)
      vv[c] = Full ? load8<T>(v, offsets[i] + d0 + 8 * c)
                   : load8(v, T, offsets[i] + d0 + 8 * c, D - d0 - 8 * c);
  };
  const auto blended = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      __m256 vv[NC];
      load_row(i, vv);
      for (int h = 0; h < NH; ++h) {
        const __m256 on = _mm256_castsi256_ps(
            _mm256_set1_epi32(-static_cast<int>((begin[h] <= i) & (i < end[h]))));
        const __m256 pb = _mm256_set1_ps(p[h * stride + i]);
        for (int c = 0; c < NC; ++c)
          acc[h][c] = _mm256_blendv_ps(acc[h][c], _mm256_fmadd_ps(pb, vv[c], acc[h][c]), on);
      }
    }
  };
  blended(first, all_begin);
  for (int64_t i = all_begin; i < all_end; ++i) {
    __m256 vv[NC];
    load_row(i, vv);
    for (int h = 0; h < NH; ++h) {
      const __m256 pb = _mm256_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c)
        acc[h][c] = _mm256_fmadd_ps(pb, vv[c], acc[h][c]);
    }
  }
  blended(all_end, last);
  for (int h = 0; h < NH; ++h) {
    const __m256 vs = _mm256_set1_ps(sum[h]);
    for (int c = 0; c < NC; ++c) {
      const __m256i m = detail::tail_mask8(D - d0 - 8 * c);
      _mm256_maskstore_ps(out[h] + d0 + 8 * c, m, _mm256_div_ps(acc[h][c], vs));
    }
  }
}

constexpr int kValueHeadsAvx2 = 6;   // heads per value tile
constexpr int kValueChunksAvx2 = 4;  // 8-dim chunks per value tile, with NH x NC <= 12
// The tile of NH heads x NC chunks, or nullptr past 12 accumulators.
template <DType T, bool Full, int NH, int NC>
constexpr ValueTileFn value_tile_or_null() {
  if constexpr (NH * NC <= 12)
    return &value_tile_avx2<T, NH, NC, Full>;
  else
    return nullptr;
}
template <DType T, bool Full, int NH, int... Cs>
constexpr std::array<ValueTileFn, kValueChunksAvx2> value_row_avx2(
    std::integer_sequence<int, Cs...>) {
  return {value_tile_or_null<T, Full, NH, Cs + 1>()...};
}
template <DType T, bool Full, int... Hs>
constexpr std::array<std::array<ValueTileFn, kValueChunksAvx2>, kValueHeadsAvx2> value_table_avx2(
    std::integer_sequence<int, Hs...>) {
  return {value_row_avx2<T, Full, Hs + 1>(std::make_integer_sequence<int, kValueChunksAvx2>{})...};
}
// [Full][NH - 1][NC - 1]
template <DType T>
constexpr std::array<std::array<std::array<ValueTileFn, kValueChunksAvx2>, kValueHeadsAvx2>, 2>
    kValueTilesAvx2 = {
        value_table_avx2<T, false>(std::make_integer_sequence<int, kValueHeadsAvx2>{}),
        value_table_avx2<T, true>(std::make_integer_sequence<int, kValueHeadsAvx2>{})};

// accumulate_values_avx512 on AVX2: tiles of up to 6 heads and 12 accumulators, with as
// many chunks as fit beside the heads. A pass per tile reads every row; a KV head's rows
// are num_kv_heads * head_dim elements apart, so they share a few L1 sets and each pass
// reads them from L2. Up to 4 chunks (3 heads: 2 passes over 64 dims, not 4) decoded
// 1.09 to 1.14 times as fast as 2.
void accumulate_values_avx2(const float* scores, int64_t stride, const int64_t* begin,
                            const int64_t* end, const int64_t* offsets, const KVCacheLayer& c,
                            int heads, const float* sum, float* const* out) {
  const int64_t D = c.head_dim;
  const int64_t chunks = (D + 7) / 8;
  const auto& tiles = c.dtype == DType::kF32   ? kValueTilesAvx2<DType::kF32>
                      : c.dtype == DType::kF16 ? kValueTilesAvx2<DType::kF16>
                                               : kValueTilesAvx2<DType::kBF16>;
  for (int h0 = 0; h0 < heads; h0 += kValueHeadsAvx2) {
    const int NH = std::min(kValueHeadsAvx2, heads - h0);
    const int most = std::min(kValueChunksAvx2, 12 / NH);
    for (int64_t c0 = 0; c0 < chunks; c0 += most) {
      const int NC = static_cast<int>(std::min<int64_t>(most, chunks - c0));
      const bool full = (c0 + NC) * 8 <= D;
      tiles[full ? 1 : 0][NH - 1][NC - 1](scores + h0 * stride, stride, begin + h0, end + h0,
                                          offsets, c.v, c0 * 8, D, sum + h0, out + h0);
    }
  }
}

constexpr int kScoreHeadsAvx2 = 2;  // heads per score tile: 8 accumulators over 32 keys
using ScoreTileAvx2Fn = void (*)(const float* const*, const float*, int64_t, int64_t, float,
                                 float* const*, int64_t);
constexpr ScoreTileAvx2Fn kScoreTilesAvx2[kScoreHeadsAvx2][2] = {
    {&score_tile_avx2<1, 1>, &score_tile_avx2<1, 2>},
    {&score_tile_avx2<2, 1>, &score_tile_avx2<2, 2>}};

// scores_avx512 on AVX2.
void scores_avx2(const float* const* q, int heads, const int64_t* offsets, int64_t npos,
                 const KVCacheLayer& c, float scale, float* scores, int64_t stride,
                 float* kt) {  // [2, Dp, 16], 64-byte aligned
  const int64_t D = c.head_dim;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  const float* hq[kScoreHeadsAvx2];
  float* dst[kScoreHeadsAvx2];
  const bool values_to_l2 =
      npos * D * static_cast<int64_t>(dtype_size(c.dtype)) <= kValuesToL2Bytes;
  for (int64_t b = 0; b < npos; b += 2 * kLanes) {
    const int64_t n = std::min<int64_t>(2 * kLanes, npos - b);
    const int nb = n > kLanes ? 2 : 1;
    for (int blk = 0; blk < nb; ++blk) {
      const int64_t at = b + blk * kLanes;
      const int64_t ahead = std::clamp<int64_t>(npos - at - 2 * kLanes, 0, kLanes);
      transpose_keys_avx2(c, offsets + at, std::min<int64_t>(kLanes, n - blk * kLanes),
                          kt + blk * Dp * kLanes, ahead > 0 ? offsets + at + 2 * kLanes : nullptr,
                          ahead);
    }
    if (values_to_l2)
      for (int64_t i = b; i < b + n; ++i)
        prefetch_cache_row(c.v, c.dtype, offsets[i], D, true);
    for (int h0 = 0; h0 < heads; h0 += kScoreHeadsAvx2) {
      const int nh = std::min(kScoreHeadsAvx2, heads - h0);
      for (int h = 0; h < nh; ++h) {
        hq[h] = q[h0 + h];
        dst[h] = scores + (h0 + h) * stride + b;
      }
      kScoreTilesAvx2[nh - 1][nb - 1](hq, kt, Dp * kLanes, D, scale, dst, n);
    }
  }
}

// sg[i] = exp(sg[i] - max) for i < n, and their sum in the 16-lane order of
// lane_sum_scalar: the portable loop's bits.
float softmax_weights_avx2(float* sg, int64_t n) {
  // Whole vectors with plain loads and stores (Zen 3's 256-bit masked store is
  // microcoded), the last partial one masked.
  const int64_t whole = n / 8 * 8;
  __m256 vmx = _mm256_set1_ps(sg[0]);
  for (int64_t i = 0; i < whole; i += 8)
    vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(sg + i));
  if (whole < n) {
    const __m256i m = detail::tail_mask8(n - whole);
    vmx = _mm256_blendv_ps(vmx, _mm256_max_ps(vmx, _mm256_maskload_ps(sg + whole, m)),
                           _mm256_castsi256_ps(m));
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, vmx);
  float mx = lanes[0];
  for (int l = 1; l < 8; ++l)
    mx = std::max(mx, lanes[l]);
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < whole; i += 8) {
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + i), vm));
    _mm256_storeu_ps(sg + i, e);
    __m256& s = sum[(i / 8) % 2];  // lanes 0-7, then 8-15, of each 16
    s = _mm256_add_ps(s, e);
  }
  if (whole < n) {
    const __m256i m = detail::tail_mask8(n - whole);
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_maskload_ps(sg + whole, m), vm));
    _mm256_maskstore_ps(sg + whole, m, e);
    __m256& s = sum[(whole / 8) % 2];
    s = _mm256_blendv_ps(s, _mm256_add_ps(s, e), _mm256_castsi256_ps(m));
  }
  _mm256_store_ps(lanes, sum[0]);
  _mm256_store_ps(lanes + 8, sum[1]);
  return detail::tree_sum16(lanes);
}
#endif  // PAGELLM_KERNELS_AVX2

// First attended position of a query at `pos`.
int64_t window_start(int64_t pos, int32_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// Attention of the G query heads that share `kv_head`, for the queries at positions
// pos0 .. pos0 + nq - 1 of one sequence: query j's heads are G rows of head_dim at
// q + j * ld, its output goes to out + j * ld. The scores of all nq * G heads are taken
// over the union of the queries' ranges, so each key is read and converted once; each
// query then runs its softmax and weighted sum over its own range only.
void attend(bool simd, const float* q, int64_t ld, int nq, int G, const KVCacheLayer& c,
            const int32_t* block_table,  // [max_blocks_per_seq]
            int kv_head, int64_t pos0, int32_t window, float scale, float* out) {
  const int64_t D = c.head_dim;
  const int64_t lo = window_start(pos0, window);
  const int64_t npos = pos0 + nq - lo;
  const int64_t stride = (npos + kLanes - 1) / kLanes * kLanes;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  const int heads = nq * G;
  Scratch& s = thread_scratch();
  const auto ensure = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  ensure(s.scores, heads * stride);
  ensure(s.row, D);
  ensure(s.kt, 2 * kLanes * Dp + kLanes);
  ensure(s.acc, G * D);
  ensure(s.offsets, npos);
  ensure(s.heads, heads);
  ensure(s.outs, heads);
  ensure(s.sums, heads);
  ensure(s.ranges, 2 * heads);
  float* scores = s.scores.data();
  float* row = s.row.data();
  float* acc = s.acc.data();
  float* sum = s.sums.data();
  int64_t* offsets = s.offsets.data();  // element offset of each position's K/V row
  for (int64_t i = 0; i < npos; ++i) {
    const int64_t pos = lo + i;
    const int64_t slot =
        static_cast<int64_t>(block_table[pos / kBlockSize]) * kBlockSize + pos % kBlockSize;
    offsets[i] = (slot * c.num_kv_heads + kv_head) * D;
  }
  // Head h = j * G + g is head g of query j: its vector, its output, and its query's
  // range [lo_j, pos0 + j] as positions [begin[h], end[h]) of the union.
  const float** hq = s.heads.data();
  float** outs = s.outs.data();
  int64_t* begin = s.ranges.data();
  int64_t* end = begin + heads;
  for (int h = 0; h < heads; ++h) {
    const int64_t j = h / G, at = j * ld + h % G * D;
    hq[h] = q + at;
    outs[h] = out + at;
    begin[h] = window_start(pos0 + j, window) - lo;
    end[h] = pos0 + j - lo + 1;
  }

  // Scores: scores[h * stride + i] = (fma chain over d of q_h[d] * k_i[d]) * scale.
#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
  if (simd) {
    float* kt = s.kt.data();
    kt += (kLanes - reinterpret_cast<uintptr_t>(kt) / sizeof(float) % kLanes) % kLanes;
#if defined(PAGELLM_KERNELS_AVX512)
    scores_avx512(hq, heads, offsets, npos, c, scale, scores, stride, kt);
#else
    scores_avx2(hq, heads, offsets, npos, c, scale, scores, stride, kt);
#endif
  } else
#endif
  {
    for (int64_t i = 0; i < npos; ++i) {
      for (int64_t d = 0; d < D; ++d)
        row[d] = load_f32(c.k, c.dtype, offsets[i] + d);
      for (int h = 0; h < heads; ++h) {
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d)
          dot = std::fma(hq[h][d], row[d], dot);
        scores[h * stride + i] = dot * scale;
      }
    }
  }

  // Softmax weights (unnormalized) over each head's range, and their sums. The maximum
  // does not depend on order.
  for (int h = 0; h < heads; ++h) {
    float* sg = scores + h * stride + begin[h];
    const int64_t n = end[h] - begin[h];
#if defined(PAGELLM_KERNELS_AVX512)
    if (simd) {
      __m512 vmx = _mm512_set1_ps(sg[0]);
      for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = detail::tail_mask(n - i);
        vmx = _mm512_mask_max_ps(vmx, m, vmx, _mm512_maskz_loadu_ps(m, sg + i));
      }
      vmx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
      for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = detail::tail_mask(n - i);
        const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + i), vmx));
        _mm512_mask_storeu_ps(sg + i, m, e);
      }
      sum[h] = detail::lane_sum_avx512(sg, n);
      continue;
    }
#elif defined(PAGELLM_KERNELS_AVX2)
    if (simd) {
      sum[h] = softmax_weights_avx2(sg, n);
      continue;
    }
#endif
    float mx = sg[0];
    for (int64_t i = 1; i < n; ++i)
      mx = std::max(mx, sg[i]);
    for (int64_t i = 0; i < n; ++i)
      sg[i] = detail::exp_scalar(sg[i] - mx);
    sum[h] = detail::lane_sum_scalar(sg, n);
  }

  // Weighted sum of values.
#if defined(PAGELLM_KERNELS_AVX512)
  if (simd) {
    accumulate_values_avx512(scores, stride, begin, end, offsets, c, heads, sum, outs);
    return;
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  if (simd) {
    accumulate_values_avx2(scores, stride, begin, end, offsets, c, heads, sum, outs);
    return;
  }
#endif
  for (int h0 = 0; h0 < heads; h0 += G) {  // the G heads of one query share its range
    std::fill(acc, acc + G * D, 0.f);
    for (int64_t i = begin[h0]; i < end[h0]; ++i) {
      for (int64_t d = 0; d < D; ++d)
        row[d] = load_f32(c.v, c.dtype, offsets[i] + d);
      for (int g = 0; g < G; ++g) {
        const float p = scores[(h0 + g) * stride + i];
        float* ag = acc + g * D;
        for (int64_t d = 0; d < D; ++d)
          ag[d] = std::fma(p, row[d], ag[d]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d)
        outs[h0 + g][d] = acc[g * D + d] / sum[h0 + g];
  }
}

}  // namespace

void paged_attention(const float* q, const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                     int num_q_heads, float scale, float* out) {
  const int kvh = cache.num_kv_heads;
  const int G = num_q_heads / kvh;
  const int64_t D = cache.head_dim;
  const int64_t ld = static_cast<int64_t>(num_q_heads) * D;
  // Runs of up to 8 consecutive queries of one sequence: they share each key they read
  // (see attend). Their scores take run * G * context floats of a thread's scratch, kept
  // to about 4 MiB by shorter runs for long contexts.
  constexpr int64_t kQueryRun = 8, kScoreFloats = int64_t(1) << 20;
  struct Run {
    int32_t seq, t0, n;
  };
  std::vector<Run> runs;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t span = int64_t(G) * std::max(1, batch.context_lens[s]);
    const int32_t run =
        static_cast<int32_t>(std::clamp<int64_t>(kScoreFloats / span, 1, kQueryRun));
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; t += run)
      runs.push_back({s, t, std::min(run, batch.query_start[s + 1] - t)});
  }
  const bool simd = detail::use_simd_or_avx2();
  const int64_t items = static_cast<int64_t>(runs.size()) * kvh;

  // Later positions of a prompt attend to more keys, and the cores of a shared machine
  // do not run at one speed: threads take items as they finish.
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < items; ++item) {
    const Run& r = runs[item / kvh];
    const int h = static_cast<int>(item % kvh);
    const int64_t q_len = batch.query_start[r.seq + 1] - batch.query_start[r.seq];
    int64_t pos = batch.context_lens[r.seq] - q_len + (r.t0 - batch.query_start[r.seq]);
    int64_t t = r.t0;
    const int64_t offset = static_cast<int64_t>(h) * G * D;
    for (; t < r.t0 + r.n && pos < 0; ++t, ++pos)  // (a query before the first position)
      std::fill(out + t * ld + offset, out + t * ld + offset + G * D, 0.f);
    if (t == r.t0 + r.n) continue;
    attend(simd, q + t * ld + offset, ld, static_cast<int>(r.t0 + r.n - t), G, cache,
           batch.block_tables + static_cast<int64_t>(r.seq) * batch.max_blocks_per_seq, h, pos,
           batch.sliding_window, scale, out + t * ld + offset);
  }
}

void paged_attention_decode(const float* q, const KVCacheLayer& cache,
                            const PagedAttentionBatch& batch, int num_q_heads, float scale,
                            float* out) {
  const int kvh = cache.num_kv_heads;
  const int G = num_q_heads / kvh;
  const int64_t D = cache.head_dim;
  const bool simd = detail::use_simd_or_avx2();
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
    attend(simd, q + offset, 0, 1, G, cache, batch.block_tables + s * batch.max_blocks_per_seq, h,
           pos, batch.sliding_window, scale, out + offset);
  }
}

}  // namespace pagellm::kernels::cpu
