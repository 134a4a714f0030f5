// Paged attention. A work item is one KV head and a run of up to 8 consecutive queries
// of one sequence (in decode: one query and a group of consecutive KV heads, whose rows
// of a position lie together in the cache): the query heads that share a KV head (GQA)
// are scored against each cached key as it is read, so K is read and converted once per
// item. The value pass runs in rounds of positions, whose V rows its tiles find in L2.
// Both passes kick the L2 streamer on the pages of the blocks ahead (PageKicker).
// Softmax is two-pass in float32:
//   s[i] = dot(q, k_i) * scale      dot: lane_dot_scalar's 16-lane order (lane l an fma
//                                   chain over d = l, l + 16, ..., then a fixed tree)
//   p[i] = exp(s[i] - max_i s)      exp of simd.h
//   out  = (sum_i p[i] * v_i) / sum_i p[i]
// with sum_i p[i] in the 16-lane order (lane = i - first position mod 16) and each output
// element one fma chain over positions in increasing order. A query's result therefore
// depends only on its head, its position and the cache: prefill chunks, decode steps, the
// runs and the thread split all give the same bits, and the decode entry point runs this
// same code.

#include <omp.h>

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
  std::vector<float> scores;     // [heads, positions rounded up to 16]
  std::vector<float> row;        // [head_dim] a K or V row in float32
  std::vector<float> qpad;       // [heads, Dp] the query heads zero-padded, 64-byte aligned within
  std::vector<float> acc;        // [G, head_dim], or [heads, Dp] on the SIMD paths
  std::vector<int64_t> offsets;  // [positions] element offset of each K/V row
  std::vector<const float*> heads;  // [heads] each query head's vector
  std::vector<float*> outs;         // [heads] each query head's output
  std::vector<float> sums;          // [heads] each head's sum of softmax weights
  std::vector<int64_t> ranges;      // [2, heads] each head's first and end position
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Prefetches `count` cache elements from element offset `at` of K or V: one token's row
// of one KV head (head_dim), or its rows of consecutive KV heads.
inline void prefetch_cache_row(const void* base, DType t, int64_t at, int64_t count) {
  const char* row = static_cast<const char*>(base) + at * dtype_size(t);
  const int64_t bytes = count * dtype_size(t);
  for (int64_t x = 0; x < bytes; x += 64)
    detail::prefetch_l1(row + x);
}

// The L2 streamer follows the lines of one 4 KiB page and starts afresh, after a few
// misses, on each new page, and the page it guesses next is the one after: another
// sequence's block. So a pass over a sequence's blocks touches the first two lines of each
// page kKickAhead bytes on, and the streamer brings in the rest of the page. (Prefetching
// all of a block's lines a few blocks ahead instead, into L1 or L2, left a read of
// shuffled 8 KiB blocks where it was: the prefetches wait for fill buffers.)
class PageKicker {
 public:
  // The blocks holding positions [lo, end) of a sequence in K or V (`base`).
  PageKicker(const void* base, const KVCacheLayer& c, const int32_t* block_table, int64_t lo,
             int64_t end)
      : base_(static_cast<const char*>(base)),
        table_(block_table),
        block_bytes_(int64_t(kBlockSize) * c.num_kv_heads * c.head_dim * dtype_size(c.dtype)),
        ahead_(std::max<int64_t>(1, kKickAhead / block_bytes_)),
        lo_(lo),
        next_(lo / kBlockSize),
        last_((end - 1) / kBlockSize) {}

  // The pass has reached position lo + i: kicks the blocks up to `ahead_` past its own.
  void reach(int64_t i) {
    for (const int64_t upto = std::min(last_, (lo_ + i) / kBlockSize + ahead_); next_ <= upto;
         ++next_) {
      const char* block = base_ + table_[next_] * block_bytes_;
      const uintptr_t end = reinterpret_cast<uintptr_t>(block + block_bytes_);
      for (uintptr_t a = reinterpret_cast<uintptr_t>(block); a < end; a = (a | (kPage - 1)) + 1)
        for (uintptr_t line = a; line < std::min(end, a + 2 * 64); line += 64)
          detail::prefetch_l2(reinterpret_cast<const void*>(line));
    }
  }

 private:
  static constexpr int64_t kKickAhead = 64 << 10, kPage = 4096;
  const char* base_;
  const int32_t* table_;
  int64_t block_bytes_, ahead_, lo_, next_, last_;
};

// K or V (`base`) moved on by kk KV heads: for the rows at element offsets of KV head h,
// the same offsets then address KV head h + kk's rows.
inline const void* kv_head_rows(const void* base, const KVCacheLayer& c, int kk) {
  return static_cast<const char*>(base) +
         static_cast<int64_t>(kk) * c.head_dim * static_cast<int64_t>(dtype_size(c.dtype));
}

// A register tile of the value pass (value_tile, value_tile_avx2).
using ValueTileFn = void (*)(const float*, int64_t, const int64_t*, const int64_t*, const int64_t*,
                             const void*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);

#if defined(PAGELLM_KERNELS_AVX512)
// acc[h][d] += p[h, i] * v_i[d] for positions i in [lo, hi) of head h's [begin[h], end[h]),
// for NH heads x NC 16-lane chunks (elements d0 ..) held in registers: head h's sums are
// acc[h * acc_stride + d0 ..], loaded first and stored back, so that rounds of positions
// continue each element's one fma chain over its positions in order. The heads' ranges
// may differ: at a position outside its range a head leaves its accumulators untouched (a
// masked fma), whatever p and v hold there. The V rows kValueAhead positions on are
// prefetched as the pass goes. Full: all NC chunks lie within D, so V is read with plain
// loads. (The cache's type and Full are template arguments: a switch, or masked loads,
// inside the loop make GCC keep the accumulators in memory.)
constexpr int64_t kValueAhead = 16;  // V rows prefetched ahead of the value pass
template <DType T, int NH, int NC, bool Full>
void value_tile(const float* p, int64_t stride, const int64_t* begin, const int64_t* end,
                const int64_t* offsets, const void* v, int64_t d0, int64_t D, int64_t lo,
                int64_t hi, float* io, int64_t io_stride) {
  const int64_t first = std::max(lo, *std::min_element(begin, begin + NH));
  const int64_t last = std::min(hi, *std::max_element(end, end + NH));
  if (first >= last) return;
  // Every head is in range on [all_begin, all_end): plain fmas there, masked ones only
  // at the edges (a run's last queries, a window's first positions). With a mask worked
  // out per head at every position, GCC kept the accumulators on the stack, storing each
  // of them once a position.
  const int64_t all_begin = std::clamp(*std::max_element(begin, begin + NH), first, last);
  const int64_t all_end = std::clamp(*std::min_element(end, end + NH), all_begin, last);
  __mmask16 mask[NC];
  for (int c = 0; c < NC; ++c)
    mask[c] = detail::tail_mask(std::max<int64_t>(0, D - d0 - c * kLanes));
  __m512 acc[NH][NC];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      acc[h][c] = _mm512_loadu_ps(io + h * io_stride + c * kLanes);
  const auto load_row = [&](int64_t i, __m512(&vv)[NC]) {
    if (d0 == 0 && i + kValueAhead < last) prefetch_cache_row(v, T, offsets[i + kValueAhead], D);
    for (int c = 0; c < NC; ++c)
      vv[c] = Full ? detail::load16(v, T, offsets[i] + d0 + c * kLanes)
                   : detail::load16(v, T, offsets[i] + d0 + c * kLanes, mask[c]);
  };
  const auto masked = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      __m512 vv[NC];
      load_row(i, vv);
      for (int h = 0; h < NH; ++h) {
        const __mmask16 on = static_cast<__mmask16>(-((begin[h] <= i) & (i < end[h])));
        const __m512 pb = _mm512_set1_ps(p[h * stride + i]);
        for (int c = 0; c < NC; ++c)
          acc[h][c] = _mm512_mask3_fmadd_ps(pb, vv[c], acc[h][c], on);
      }
    }
  };
  masked(first, all_begin);
  for (int64_t i = all_begin; i < all_end; ++i) {
    __m512 vv[NC];
    load_row(i, vv);
    for (int h = 0; h < NH; ++h) {
      const __m512 pb = _mm512_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c)
        acc[h][c] = _mm512_fmadd_ps(pb, vv[c], acc[h][c]);
    }
  }
  masked(all_end, last);
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      _mm512_storeu_ps(io + h * io_stride + c * kLanes, acc[h][c]);
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

// score_lanes_avx2 on 16-lane vectors: position j's lanes of head h are one register.
// Positions go in pairs, so that each q vector loaded serves two fmas: with one position
// at a time, the 6 heads' loads of q beside the K row's (28 a position) were more than
// the load ports take for its 24 fmas.
template <DType T, int NH, bool Full>
void score_lanes_avx512(const float* q, int64_t Dp, const void* k, const int64_t* offsets,
                        int64_t n, int64_t D, float* red) {
  const auto fold = [&](const __m512& acc, int h, int64_t j) {
    const __m256 lo = _mm512_castps512_ps256(acc);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    _mm256_store_ps(red + (h * 8 + j) * 8, _mm256_add_ps(lo, hi));
  };
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    __m512 a0[NH], a1[NH];
    for (int h = 0; h < NH; ++h)
      a0[h] = a1[h] = _mm512_setzero_ps();
    const int64_t at0 = offsets[j], at1 = offsets[j + 1];
    for (int64_t d = 0; d < Dp; d += kLanes) {
      if constexpr (Full) {
        const __m512 k0 = detail::load16(k, T, at0 + d), k1 = detail::load16(k, T, at1 + d);
        for (int h = 0; h < NH; ++h) {
          __m512 qv = _mm512_load_ps(q + h * Dp + d);
          detail::keep_in_register(qv);  // loaded once, not folded into each fma
          a0[h] = _mm512_fmadd_ps(qv, k0, a0[h]);
          a1[h] = _mm512_fmadd_ps(qv, k1, a1[h]);
        }
      } else {  // lanes past head_dim keep their sums, as lane_dot_scalar's do
        const __mmask16 m = detail::tail_mask(D - d);
        const __m512 k0 = detail::load16(k, T, at0 + d, m), k1 = detail::load16(k, T, at1 + d, m);
        for (int h = 0; h < NH; ++h) {
          __m512 qv = _mm512_load_ps(q + h * Dp + d);
          detail::keep_in_register(qv);
          a0[h] = _mm512_mask3_fmadd_ps(qv, k0, a0[h], m);
          a1[h] = _mm512_mask3_fmadd_ps(qv, k1, a1[h], m);
        }
      }
    }
    for (int h = 0; h < NH; ++h) {
      fold(a0[h], h, j);
      fold(a1[h], h, j + 1);
    }
  }
  for (; j < n; ++j) {
    __m512 acc[NH];
    for (int h = 0; h < NH; ++h)
      acc[h] = _mm512_setzero_ps();
    const int64_t at = offsets[j];
    for (int64_t d = 0; d < Dp; d += kLanes) {
      if constexpr (Full) {
        const __m512 kv = detail::load16(k, T, at + d);
        for (int h = 0; h < NH; ++h)
          acc[h] = _mm512_fmadd_ps(_mm512_load_ps(q + h * Dp + d), kv, acc[h]);
      } else {
        const __mmask16 m = detail::tail_mask(D - d);
        const __m512 kv = detail::load16(k, T, at + d, m);
        for (int h = 0; h < NH; ++h)
          acc[h] = _mm512_mask3_fmadd_ps(_mm512_load_ps(q + h * Dp + d), kv, acc[h], m);
      }
    }
    for (int h = 0; h < NH; ++h)
      fold(acc[h], h, j);
  }
  for (; j < 8; ++j)
    for (int h = 0; h < NH; ++h)
      _mm256_store_ps(red + (h * 8 + j) * 8, _mm256_setzero_ps());
}
#endif

#if defined(PAGELLM_KERNELS_AVX2)
// The same scores, softmax weights and weighted sums on 8-lane vectors, for machines with
// AVX2 but not AVX-512: every score is still one fma chain over d, every weight the exp
// of simd.h, every sum the 16-lane order, every output one fma chain over positions.

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

// The lanes of the 16-lane dot products of NH heads with the K rows of n <= 8
// positions: position j's lanes l of head h are acc[h][0] (l < 8) and acc[h][1]
// (l >= 8), each one fma chain over d = 16c + l as in lane_dot_scalar, and
// red[(h * 8 + j) * 8 + l] gets lane l + lane l + 8 (the first step of tree_sum16); rows
// j >= n are zeros. The NH heads share each K row as it is loaded. Full: head_dim a
// multiple of 16, so no lane is past it. q: the heads' vectors, zero-padded to Dp.
template <DType T, int NH, bool Full>
void score_lanes_avx2(const float* q, int64_t Dp, const void* k, const int64_t* offsets, int64_t n,
                      int64_t D, float* red) {
  for (int64_t j = 0; j < n; ++j) {
    __m256 acc[NH][2];
    for (int h = 0; h < NH; ++h)
      acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    const int64_t at = offsets[j];
    for (int64_t d = 0; d < Dp; d += 16) {
      for (int x = 0; x < 2; ++x) {
        const int64_t d8 = d + 8 * x;
        if constexpr (Full) {
          const __m256 kv = load8<T>(k, at + d8);
          for (int h = 0; h < NH; ++h)
            acc[h][x] = _mm256_fmadd_ps(_mm256_load_ps(q + h * Dp + d8), kv, acc[h][x]);
        } else {  // lanes past head_dim keep their sums, as lane_dot_scalar's do
          const __m256 kv = load8(k, T, at + d8, D - d8);
          const __m256 m = _mm256_castsi256_ps(detail::tail_mask8(D - d8));
          for (int h = 0; h < NH; ++h)
            acc[h][x] = _mm256_blendv_ps(
                acc[h][x], _mm256_fmadd_ps(_mm256_load_ps(q + h * Dp + d8), kv, acc[h][x]), m);
        }
      }
    }
    for (int h = 0; h < NH; ++h)
      _mm256_store_ps(red + (h * 8 + j) * 8, _mm256_add_ps(acc[h][0], acc[h][1]));
  }
  for (int64_t j = n; j < 8; ++j)
    for (int h = 0; h < NH; ++h)
      _mm256_store_ps(red + (h * 8 + j) * 8, _mm256_setzero_ps());
}

constexpr int64_t kValueAheadAvx2 = 16;  // V rows prefetched ahead of the value pass

// value_tile on 8-lane vectors: NH heads x NC 8-lane chunks in registers (NH * NC <= 12).
// Without masked fmas, the positions where every head of the tile is in range (all but a
// run's last queries, and a window's first positions) take plain fmas; at the others each
// head's fma result is blended in only where the head is in range, so its accumulators
// are left untouched elsewhere whatever p and v hold there.
template <DType T, int NH, int NC, bool Full>
void value_tile_avx2(const float* p, int64_t stride, const int64_t* begin, const int64_t* end,
                     const int64_t* offsets, const void* v, int64_t d0, int64_t D, int64_t lo,
                     int64_t hi, float* io, int64_t io_stride) {
  static_assert(NH * NC <= 12);
  const int64_t first = std::max(lo, *std::min_element(begin, begin + NH));
  const int64_t last = std::min(hi, *std::max_element(end, end + NH));
  if (first >= last) return;
  // Every head is in range on [all_begin, all_end).
  const int64_t all_begin = std::clamp(*std::max_element(begin, begin + NH), first, last);
  const int64_t all_end = std::clamp(*std::min_element(end, end + NH), all_begin, last);
  __m256 acc[NH][NC];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      acc[h][c] = _mm256_loadu_ps(io + h * io_stride + 8 * c);
  // The first pass brings whole rows into L1; the later ones (the rows have left L1)
  // prefetch the line their chunks start in.
  const auto prefetch_ahead = [&](int64_t i) {
    if (i + kValueAheadAvx2 < last) {
      if (d0 == 0)
        prefetch_cache_row(v, T, offsets[i + kValueAheadAvx2], D);
      else
        detail::prefetch_l1(static_cast<const char*>(v) +
                            (offsets[i + kValueAheadAvx2] + d0) * dtype_size(T));
    }
  };
  const auto load_chunk = [&](int64_t i, int c) {
    return Full ? load8<T>(v, offsets[i] + d0 + 8 * c)
                : load8(v, T, offsets[i] + d0 + 8 * c, D - d0 - 8 * c);
  };
  const auto load_row = [&](int64_t i, __m256(&vv)[NC]) {
    prefetch_ahead(i);
    for (int c = 0; c < NC; ++c)
      vv[c] = load_chunk(i, c);
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
    if constexpr (NH < NC) {
      // The heads' weights first, then one V chunk at a time: NH + 1 registers beside the
      // accumulators, not NC + 1 (3 heads x 4 chunks: 16 registers, not 17, so no
      // accumulator lives on the stack).
      prefetch_ahead(i);
      __m256 pb[NH];
      for (int h = 0; h < NH; ++h)
        pb[h] = _mm256_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c) {
        const __m256 vc = load_chunk(i, c);
        for (int h = 0; h < NH; ++h)
          acc[h][c] = _mm256_fmadd_ps(pb[h], vc, acc[h][c]);
      }
      continue;
    }
    __m256 vv[NC];
    load_row(i, vv);
    for (int h = 0; h < NH; ++h) {
      const __m256 pb = _mm256_set1_ps(p[h * stride + i]);
      for (int c = 0; c < NC; ++c)
        acc[h][c] = _mm256_fmadd_ps(pb, vv[c], acc[h][c]);
    }
  }
  blended(all_end, last);
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NC; ++c)
      _mm256_storeu_ps(io + h * io_stride + 8 * c, acc[h][c]);
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

#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
// Scores on either instruction set: the lanes of 8 positions at a time (score_lanes_*),
// then one tree for each head's 8 positions, in registers.

// The rest of tree_sum16 for 8 positions at once: red[j * 8 + l] holds position j's
// folded lane l; lane j of the result is position j's sum: (l, l+4), then (l, l+2), then
// (0, 1), each add as the scalar tree does it.
inline __m256 tree_sum8x8(const float* red) {
  __m256 v[8];
  for (int j = 0; j < 8; ++j)
    v[j] = _mm256_load_ps(red + j * 8);
  // Position j's lanes l + lanes l + 4 in the low half, position j + 4's in the high.
  const auto fold4 = [](__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  };
  // Two positions a half: lanes 0 + 2 and 1 + 3 of each.
  const auto fold2 = [](__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE));
  };
  const __m256 x0 = fold2(fold4(v[0], v[4]), fold4(v[1], v[5]));  // positions 0, 1 | 4, 5
  const __m256 x1 = fold2(fold4(v[2], v[6]), fold4(v[3], v[7]));  // positions 2, 3 | 6, 7
  return _mm256_add_ps(_mm256_shuffle_ps(x0, x1, 0x88), _mm256_shuffle_ps(x0, x1, 0xDD));
}

constexpr int kScoreHeads = 6;     // heads a pass over a K row: 12 or 6 accumulators
constexpr int64_t kKeyAhead = 16;  // K rows prefetched into L1 ahead of the score pass
using ScoreLanesFn = void (*)(const float*, int64_t, const void*, const int64_t*, int64_t, int64_t,
                              float*);
template <DType T, bool Full, int NH>
constexpr ScoreLanesFn score_lanes() {
#if defined(PAGELLM_KERNELS_AVX512)
  return &score_lanes_avx512<T, NH, Full>;
#else
  return &score_lanes_avx2<T, NH, Full>;
#endif
}
template <DType T, bool Full, int... Hs>
constexpr std::array<ScoreLanesFn, kScoreHeads> score_lanes_row(std::integer_sequence<int, Hs...>) {
  return {score_lanes<T, Full, Hs + 1>()...};
}
// [Full][NH - 1]
template <DType T>
constexpr std::array<std::array<ScoreLanesFn, kScoreHeads>, 2> kScoreLanes = {
    score_lanes_row<T, false>(std::make_integer_sequence<int, kScoreHeads>{}),
    score_lanes_row<T, true>(std::make_integer_sequence<int, kScoreHeads>{})};

// scores[h * stride + i] = lane_dot_scalar(q_h, k_i) * scale for the heads of nkv KV
// heads (hk each: head kk * hk + r reads KV head kk, whose rows are kk * head_dim elements
// past offsets[i]) and each of the npos positions, 8 positions at a time: each K row is
// read once for up to 6 heads, and the rows of a position's nkv heads (contiguous in the
// cache) one after another. Meanwhile the K rows kKeyAhead positions on are prefetched
// into L1, a share of the 8 positions before each KV head's scores (in one burst, they
// waited on the fill buffers), and `kick` starts the streamer on the blocks further on.
void scores_simd(const float* const* q, int hk, int nkv, const int64_t* offsets, int64_t npos,
                 const KVCacheLayer& c, float scale, float* scores, int64_t stride,
                 float* qpad,  // [heads, Dp], 64-byte aligned
                 PageKicker& kick) {
  const int64_t D = c.head_dim;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  const int heads = hk * nkv;
  for (int h = 0; h < heads; ++h) {
    std::copy(q[h], q[h] + D, qpad + h * Dp);
    std::fill(qpad + h * Dp + D, qpad + (h + 1) * Dp, 0.f);
  }
  const auto& lanes = c.dtype == DType::kF32   ? kScoreLanes<DType::kF32>
                      : c.dtype == DType::kF16 ? kScoreLanes<DType::kF16>
                                               : kScoreLanes<DType::kBF16>;
  const bool full = D % kLanes == 0;
  const int64_t run = nkv * D;  // elements of a position's rows
  const __m256 vscale = _mm256_set1_ps(scale);
  alignas(64) float red[kScoreHeads * 8 * 8];
  for (int64_t i0 = 0; i0 < npos; i0 += 8) {
    const int64_t n = std::min<int64_t>(8, npos - i0);
    kick.reach(i0);
    for (int kk = 0; kk < nkv; ++kk) {
      for (int64_t i = i0 + kKeyAhead + kk * 8 / nkv;
           i < std::min(npos, i0 + kKeyAhead + (kk + 1) * 8 / nkv); ++i)
        prefetch_cache_row(c.k, c.dtype, offsets[i], run);
      const void* k = kv_head_rows(c.k, c, kk);
      for (int h0 = kk * hk; h0 < (kk + 1) * hk; h0 += kScoreHeads) {
        const int nh = std::min(kScoreHeads, (kk + 1) * hk - h0);
        lanes[full ? 1 : 0][nh - 1](qpad + h0 * Dp, Dp, k, offsets + i0, n, D, red);
        // Score rows hold npos rounded up to 16 floats: the 8 from i0 fit.
        for (int h = 0; h < nh; ++h)
          _mm256_storeu_ps(scores + (h0 + h) * stride + i0,
                           _mm256_mul_ps(tree_sum8x8(red + h * 64), vscale));
      }
    }
  }
}

#if defined(PAGELLM_KERNELS_AVX512)
constexpr int64_t kValueLanes = kLanes;
constexpr int kValueTileHeads = kValueHeads;
// 4 chunks: 24 of the 32 registers at 6 heads.
constexpr int value_tile_chunks(int) {
  return 4;
}
template <DType T>
constexpr const auto& value_tiles() {
  return kValueTiles<T>;
}
#else
constexpr int64_t kValueLanes = 8;
constexpr int kValueTileHeads = kValueHeadsAvx2;
constexpr int value_tile_chunks(int nh) {
  return std::min(kValueChunksAvx2, 12 / nh);
}
template <DType T>
constexpr const auto& value_tiles() {
  return kValueTilesAvx2<T>;
}
#endif
// Positions a round of the value pass takes: 64 KiB of V rows at 4 KV heads of 64 bf16.
constexpr int64_t kValueRound = 128;

// out[h][d] = (sum_i p[h, i] * v_i[d]) / sum[h] over head h's positions [begin[h], end[h])
// for the heads of nkv KV heads laid out as in scores_simd; p is at scores + h * stride.
// Register tiles of up to 6 heads and as many chunks of head_dim as fit beside them, in
// rounds of kValueRound positions: a tile carries its sums through acc ([heads][Dp]) from
// round to round, so every element is one fma chain over its positions in order. At the
// start of a round, `kick` starts the streamer on the pages of the next round's blocks,
// so that the round's tiles, which each read a row's chunks of one head, find them in L2.
// (Prefetching each of the next round's lines into L2 instead cost cache-resident passes
// a fifth of their time, and gained nothing from memory.) A KV head's rows are
// num_kv_heads * head_dim elements apart: they share a few L1 sets, and each tile's pass
// over a round reads them from L2.
void accumulate_values_simd(const float* scores, int64_t stride, const int64_t* begin,
                            const int64_t* end, const int64_t* offsets, const KVCacheLayer& c,
                            int hk, int nkv, const float* sum, float* const* out, float* acc,
                            PageKicker& kick) {
  const int64_t D = c.head_dim;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  const int heads = hk * nkv;
  const int64_t chunks = (D + kValueLanes - 1) / kValueLanes;
  const auto& tiles = c.dtype == DType::kF32   ? value_tiles<DType::kF32>()
                      : c.dtype == DType::kF16 ? value_tiles<DType::kF16>()
                                               : value_tiles<DType::kBF16>();
  const int64_t first = *std::min_element(begin, begin + heads);
  const int64_t last = *std::max_element(end, end + heads);
  std::fill(acc, acc + heads * Dp, 0.f);
  for (int64_t r0 = first; r0 < last; r0 += kValueRound) {
    const int64_t r1 = std::min(last, r0 + kValueRound);
    kick.reach(r1);
    for (int kk = 0; kk < nkv; ++kk) {
      const void* v = kv_head_rows(c.v, c, kk);
      for (int h0 = kk * hk; h0 < (kk + 1) * hk; h0 += kValueTileHeads) {
        const int nh = std::min(kValueTileHeads, (kk + 1) * hk - h0);
        const int most = value_tile_chunks(nh);
        for (int64_t c0 = 0; c0 < chunks; c0 += most) {
          const int nc = static_cast<int>(std::min<int64_t>(most, chunks - c0));
          const bool full = (c0 + nc) * kValueLanes <= D;
          tiles[full ? 1 : 0][nh - 1][nc - 1](scores + h0 * stride, stride, begin + h0, end + h0,
                                              offsets, v, c0 * kValueLanes, D, r0, r1,
                                              acc + h0 * Dp + c0 * kValueLanes, Dp);
        }
      }
    }
  }
  for (int h = 0; h < heads; ++h)
    for (int64_t d = 0; d < D; ++d)
      out[h][d] = acc[h * Dp + d] / sum[h];
}
#endif

// First attended position of a query at `pos`.
int64_t window_start(int64_t pos, int32_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// Attention of the G query heads that share each of the KV heads kv_head .. kv_head +
// nkv - 1, for the queries at positions pos0 .. pos0 + nq - 1 of one sequence: query j's
// heads are nkv * G rows of head_dim at q + j * ld, its output goes to out + j * ld. The
// scores of all heads are taken over the union of the queries' ranges, so each key is
// read and converted once, and a position's rows of the nkv KV heads (contiguous in the
// cache) are read together; each query then runs its softmax and weighted sum over its
// own range only. A head's result does not depend on nkv.
void attend(bool simd, const float* q, int64_t ld, int nq, int G, int nkv, const KVCacheLayer& c,
            const int32_t* block_table,  // [max_blocks_per_seq]
            int kv_head, int64_t pos0, int32_t window, float scale, float* out) {
  const int64_t D = c.head_dim;
  const int64_t lo = window_start(pos0, window);
  const int64_t npos = pos0 + nq - lo;
  const int64_t stride = (npos + kLanes - 1) / kLanes * kLanes;
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  const int hk = nq * G;  // heads of one KV head
  const int heads = hk * nkv;
  Scratch& s = thread_scratch();
  const auto ensure = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  ensure(s.scores, heads * stride);
  ensure(s.row, D);
  ensure(s.qpad, heads * Dp + kLanes);
  ensure(s.acc, std::max<int64_t>(G * D, heads * Dp));
  ensure(s.offsets, npos);
  ensure(s.heads, heads);
  ensure(s.outs, heads);
  ensure(s.sums, heads);
  ensure(s.ranges, 2 * heads);
  float* scores = s.scores.data();
  float* row = s.row.data();
  float* acc = s.acc.data();
  float* sum = s.sums.data();
  int64_t* offsets = s.offsets.data();  // element offset of each position's row of kv_head
  for (int64_t i = 0; i < npos; ++i) {
    const int64_t pos = lo + i;
    const int64_t slot =
        static_cast<int64_t>(block_table[pos / kBlockSize]) * kBlockSize + pos % kBlockSize;
    offsets[i] = (slot * c.num_kv_heads + kv_head) * D;
  }
  // Head h = kk * hk + j * G + g is head g of KV head kv_head + kk for query j: its
  // vector, its output, and its query's range [lo_j, pos0 + j] as positions
  // [begin[h], end[h]) of the union.
  const float** hq = s.heads.data();
  float** outs = s.outs.data();
  int64_t* begin = s.ranges.data();
  int64_t* end = begin + heads;
  for (int h = 0; h < heads; ++h) {
    const int kk = h / hk, j = h % hk / G, g = h % G;
    const int64_t at = j * ld + (kk * G + g) * D;
    hq[h] = q + at;
    outs[h] = out + at;
    begin[h] = window_start(pos0 + j, window) - lo;
    end[h] = pos0 + j - lo + 1;
  }

  // Scores: scores[h * stride + i] = lane_dot_scalar(q_h, k_i) * scale.
#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
  if (simd) {
    float* qpad = s.qpad.data();
    qpad += (kLanes - reinterpret_cast<uintptr_t>(qpad) / sizeof(float) % kLanes) % kLanes;
    PageKicker kick_k(c.k, c, block_table, lo, lo + npos);
    scores_simd(hq, hk, nkv, offsets, npos, c, scale, scores, stride, qpad, kick_k);
  } else
#endif
  {
    for (int kk = 0; kk < nkv; ++kk) {
      const void* k = kv_head_rows(c.k, c, kk);
      for (int64_t i = 0; i < npos; ++i) {
        for (int64_t d = 0; d < D; ++d)
          row[d] = load_f32(k, c.dtype, offsets[i] + d);
        for (int h = kk * hk; h < (kk + 1) * hk; ++h)
          scores[h * stride + i] = detail::lane_dot_scalar(hq[h], row, D) * scale;
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
#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
  if (simd) {
    PageKicker kick_v(c.v, c, block_table, lo, lo + npos);
    kick_v.reach(0);
    accumulate_values_simd(scores, stride, begin, end, offsets, c, hk, nkv, sum, outs, acc, kick_v);
    return;
  }
#endif
  for (int h0 = 0; h0 < heads; h0 += G) {  // the G heads of one query share its range
    const void* v = kv_head_rows(c.v, c, h0 / hk);
    std::fill(acc, acc + G * D, 0.f);
    for (int64_t i = begin[h0]; i < end[h0]; ++i) {
      for (int64_t d = 0; d < D; ++d)
        row[d] = load_f32(v, c.dtype, offsets[i] + d);
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
    attend(simd, q + t * ld + offset, ld, static_cast<int>(r.t0 + r.n - t), G, 1, cache,
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
  // A work item is one sequence's group of nkv consecutive KV heads, whose rows of a
  // position lie together in the cache: read as one run, not as rows num_kv_heads *
  // head_dim elements apart, they stream from memory at about twice the rate. nkv is
  // the largest divisor of num_kv_heads that leaves 4 items a thread and keeps an item's
  // scores within kDecodeScoreFloats.
  constexpr int64_t kItemsPerThread = 4, kDecodeScoreFloats = int64_t(1) << 20;
  int32_t longest = 1;
  for (int32_t s = 0; s < batch.num_seqs; ++s)
    longest = std::max(longest, batch.context_lens[s]);
  const int64_t want = kItemsPerThread * omp_get_max_threads();
  int nkv = kvh;
  while (nkv > 1 && (kvh % nkv != 0 || int64_t(batch.num_seqs) * (kvh / nkv) < want ||
                     int64_t(nkv) * G * longest > kDecodeScoreFloats))
    --nkv;
  const int groups = kvh / nkv;
  const int64_t items = static_cast<int64_t>(batch.num_seqs) * groups;

  // Items as threads finish: the cores of a shared machine do not run at one speed.
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t s = item / groups;
    const int h = static_cast<int>(item % groups) * nkv;
    const int64_t pos = batch.context_lens[s] - 1;
    const int64_t offset = (s * num_q_heads + static_cast<int64_t>(h) * G) * D;
    if (pos < 0) {
      std::fill(out + offset, out + offset + nkv * G * D, 0.f);
      continue;
    }
    attend(simd, q + offset, 0, 1, G, nkv, cache, batch.block_tables + s * batch.max_blocks_per_seq,
           h, pos, batch.sliding_window, scale, out + offset);
  }
}

}  // namespace pagellm::kernels::cpu
