// Linear layers: y = x w^T + bias over a weight packed in panels of 16 outputs.
//
// Every output y[i, j] is one float32 accumulator: acc = fma(x[i, kk], w[j, kk], acc) for
// kk = 0, 1, ..., k-1 starting from 0, then acc + bias[j]. The kernels below only choose
// which accumulators run side by side (register tiles of up to 4 panels x 6 rows, or 8
// panels x 1 row; on AVX2 without AVX-512, cut into tiles of at most 12 8-lane
// accumulators, run one after another), how the weights reach them (read in place, or converted to
// float32 once per k-block when many row tiles reuse them; the conversion is exact) and which
// thread owns which panels. None of that changes an accumulator's operations, so results do not
// depend on m, on a row's place in the batch, or on the thread count. Splitting k into
// blocks stores the float32 partial sum in y and reloads it, which is exact too.
//
// Up to 96 rows (decode, and steps that join a short prompt to a batch of decodes) each
// thread streams its own contiguous range of panels once per call, with software prefetch
// ahead of the loads, and reuses each loaded weight vector for every row; a thread that
// finishes early takes tiles from the end of a slower thread's range. At batch 1 this is
// bound by reading the weights. Longer prompts reuse float32 copies of k-blocks across
// row tiles, and threads take their work items as they finish.
//
// That is the fma path. On a CPU with AMX, bf16 weights take the tile unit instead (see
// the amx namespace): the same exact products, summed in another fixed order.

#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

constexpr int kPanel = 16;      // outputs per panel: one SIMD lane each
constexpr int kTilePanels = 4;  // panels per register tile
constexpr int kTileRows = 6;    // rows per register tile: 24 accumulators
constexpr int kGemvPanels = 8;  // panels side by side when m = 1: 8 memory streams
// Most k of a float32 copy's block in the many-row path (k is cut into equal blocks).
#if defined(PAGELLM_KERNELS_AVX512)
constexpr int64_t kKBlock = 256;  // 4 panels x 256 = 64 KiB
#else
// AVX2 runs a 4-panel tile as four one-panel tiles, each loading and storing its 12
// accumulators once a k-block: blocks of up to 768 (192 KiB for 4 panels, read from L2)
// ran 1.02 to 1.26 times as fast as blocks of 256 at 512 rows.
constexpr int64_t kKBlock = 768;
#endif
// Most rows of a work item when m is large (m is cut into equal chunks of 6-row tiles). A
// chunk converts its k-blocks once; 192 rows ran 1.0 to 1.14 times as fast as 96 at 512.
constexpr int64_t kRowChunk = 192;
// Up to this many rows the weights are streamed once from memory and converted in the
// register tiles; each k-block of a tile's panels stays in cache while every row tile uses it.
// That beats the float32 copies (read from L2) up to about 100 rows, 1.04 to 1.34 times
// as fast at 64 and 96 rows on AVX2 after the copies' k-blocks grew to 768: the steps that
// join one 64-token prompt to a batch of decodes.
constexpr int64_t kStreamRows = 96;
#if defined(PAGELLM_KERNELS_AVX512)
constexpr int64_t kStreamKBlock = 256;  // 4 bf16 panels x 256 = 32 KiB
#else
// AVX2 tiles of more than one row are one panel wide, run one after another: k-blocks of
// 256 restarted each panel's stream every 8 KiB and reloaded the accumulators, and the
// whole of k (the other row tiles reading the tile's panels from L2) ran 1.1 to 1.2 times
// as fast at 16 and 32 rows on one thread with the weights in cache.
constexpr int64_t kStreamKBlock = std::numeric_limits<int64_t>::max();
#endif
// How far ahead of its loads each weight stream is prefetched.
constexpr int64_t kPrefetchBytes = 1024;

// bf16 panels store k in pairs: the 64 bytes of kk and kk + 1 hold w[l, kk] in 16-bit
// element 2l and w[l, kk + 1] in element 2l + 1, so one load and one shift or mask give
// a float32 vector (bf16 is the high half of float32). An odd last kk is stored plainly.
// Other types store [k][16]. Offset of (kk, l) in a panel whose k-range has kn elements
// from an even start:
inline int64_t packed_offset(bool paired, int64_t kk, int l, int64_t kn) {
  const int64_t even = kk & ~int64_t{1};
  if (paired && even + 1 < kn) return even * kPanel + 2 * l + (kk & 1);
  return kk * kPanel + l;
}

// Weight element types, and their exact conversion to float32.
struct F32W {
  using T = float;
  static constexpr bool kPaired = false;
  static float scalar(T v) { return v; }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load1(const T* p) {
    return _mm512_loadu_ps(p);
  }
  static __m512 even(const T* p) {
    return _mm512_loadu_ps(p);
  }
  static __m512 odd(const T* p) {
    return _mm512_loadu_ps(p + kPanel);
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  // Lanes 8h .. 8h + 7 of a panel row: a plain one, the kk or the kk + 1 of a pair.
  static __m256 load1(const T* p, int h) {
    return _mm256_loadu_ps(p + 8 * h);
  }
  static __m256 even(const T* p, int h) {
    return _mm256_loadu_ps(p + 8 * h);
  }
  static __m256 odd(const T* p, int h) {
    return _mm256_loadu_ps(p + kPanel + 8 * h);
  }
#endif
};
struct BF16W {
  using T = uint16_t;
  static constexpr bool kPaired = true;
  static float scalar(T v) { return bf16_to_f32(v); }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load1(const T* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 even(const T* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
  }
  static __m512 odd(const T* p) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  static __m256 load1(const T* p, int h) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
  static __m256 even(const T* p, int h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  // The high halves by two shifts, not a mask held in a register beside a tile's 12
  // accumulators (with the prefetch's address in a register, a mask ran at the same speed).
  static __m256 odd(const T* p, int h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16));
  }
#endif
};
struct F16W {
  using T = uint16_t;
  static constexpr bool kPaired = false;
  static float scalar(T v) { return f16_to_f32(v); }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load1(const T* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 even(const T* p) {
    return load1(p);
  }
  static __m512 odd(const T* p) {
    return load1(p + kPanel);
  }
#elif defined(PAGELLM_KERNELS_AVX2)
  static __m256 load1(const T* p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * h)));
  }
  static __m256 even(const T* p, int h) {
    return load1(p, h);
  }
  static __m256 odd(const T* p, int h) {
    return load1(p + kPanel, h);
  }
#endif
};

// One register tile: rows [0, R) of x times panels [0, P) of w over kk in [0, kn).
// Accumulators start at 0 (`first`) or from y; bias is added after the last k-block.
template <class W>
struct TileArgs {
  const float* x;  // [R, ldx], already offset to the k-block
  int64_t ldx;
  const typename W::T* w;  // [P, ws] panels, each holding kn steps, offset to the k-block
  int64_t ws;
  int64_t kn;  // even unless the block ends at k
  bool first, last;
  const float* bias;  // [ncols] or nullptr
  float* y;           // [R, ldy]
  int64_t ldy;
  int ncols;  // valid outputs in this tile, <= P * 16
  // A second prefetch stream, into L2: bytes the next tile will read, `next_step` more on
  // each k-pair, continued by the following panel of the tile. Only the AVX2 one-panel
  // loop takes it.
  const char* next = nullptr;
  int64_t next_step = 0;
};

template <class W>
void tile_portable(int P, int R, const TileArgs<W>& a) {
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      const int cols = std::min(kPanel, a.ncols - kPanel * p);
      float* yr = a.y + r * a.ldy + kPanel * p;
      float acc[kPanel];
      for (int l = 0; l < kPanel; ++l)
        acc[l] = a.first || l >= cols ? 0.f : yr[l];
      const float* xr = a.x + r * a.ldx;
      const typename W::T* wp = a.w + p * a.ws;
      for (int64_t t = 0; t < a.kn; ++t) {
        const float xv = xr[t];
        for (int l = 0; l < kPanel; ++l)
          acc[l] = std::fma(xv, W::scalar(wp[packed_offset(W::kPaired, t, l, a.kn)]), acc[l]);
      }
      for (int l = 0; l < cols; ++l)
        yr[l] = a.last && a.bias != nullptr ? acc[l] + a.bias[kPanel * p + l] : acc[l];
    }
  }
}

#if defined(PAGELLM_KERNELS_AVX512) || defined(PAGELLM_KERNELS_AVX2)
#define PAGELLM_MATMUL_SIMD 1
// Prefetches the bytes `kPrefetchBytes` ahead of one k-pair of a panel.
template <class W>
inline void prefetch_pair(const typename W::T* w) {
  const char* p = reinterpret_cast<const char*>(w) + kPrefetchBytes;
  for (size_t b = 0; b < 2 * kPanel * sizeof(typename W::T); b += 64)
    detail::prefetch_l1(p + b);
}

// The prefetches of a tile's step at kk = t, w the k-pair read there: each of the P
// streams `kPrefetchBytes` ahead. NEXT (the tiles of one thread cover consecutive panels
// over the whole of k): near the end of its panels, each stream prefetches the start of
// the panel it reads in the next tile instead.
template <class W, int P, bool NEXT, class Args>
inline void prefetch_step(const typename W::T* w, int64_t t, const Args& a) {
  const typename W::T* ahead = w;
  if constexpr (NEXT) {
    if ((t + 2) * kPanel * static_cast<int64_t>(sizeof(typename W::T)) + kPrefetchBytes >
        a.kn * kPanel * static_cast<int64_t>(sizeof(typename W::T)))
      ahead += (P - 1) * a.ws;
  }
  for (int p = 0; p < P; ++p)
    prefetch_pair<W>(ahead + p * a.ws);
}
#endif

#if defined(PAGELLM_KERNELS_AVX512)

// PF: prefetch the weights ahead of the loads (prefetch_step).
template <class W, int P, int R, bool PF, bool NEXT = false>
void tile_avx512(const TileArgs<W>& a) {
  __mmask16 mask[P];
  for (int p = 0; p < P; ++p)
    mask[p] = detail::tail_mask(std::max(0, a.ncols - kPanel * p));
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      acc[r][p] = a.first ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(mask[p], a.y + r * a.ldy + kPanel * p);
  const typename W::T* w = a.w;
  const float* x = a.x;
  int64_t t = 0;
  for (; t + 2 <= a.kn; t += 2, w += 2 * kPanel, x += 2) {
    if constexpr (PF) prefetch_step<W, P, NEXT>(w, t, a);
    {
      __m512 wv[P];
      for (int p = 0; p < P; ++p)
        wv[p] = W::even(w + p * a.ws);
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * a.ldx]);
        for (int p = 0; p < P; ++p)
          acc[r][p] = _mm512_fmadd_ps(xb, wv[p], acc[r][p]);
      }
    }
    {
      __m512 wv[P];
      for (int p = 0; p < P; ++p)
        wv[p] = W::odd(w + p * a.ws);
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * a.ldx + 1]);
        for (int p = 0; p < P; ++p)
          acc[r][p] = _mm512_fmadd_ps(xb, wv[p], acc[r][p]);
      }
    }
  }
  if (t < a.kn) {
    __m512 wv[P];
    for (int p = 0; p < P; ++p)
      wv[p] = W::load1(w + p * a.ws);
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * a.ldx]);
      for (int p = 0; p < P; ++p)
        acc[r][p] = _mm512_fmadd_ps(xb, wv[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      __m512 v = acc[r][p];
      if (a.last && a.bias != nullptr)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[p], a.bias + kPanel * p));
      _mm512_mask_storeu_ps(a.y + r * a.ldy + kPanel * p, mask[p], v);
    }
  }
}

template <class W, int P, int R, bool PF, bool NEXT = false>
void tile_simd(const TileArgs<W>& a) {
  tile_avx512<W, P, R, PF, NEXT>(a);
}
#endif  // PAGELLM_KERNELS_AVX512

#if defined(PAGELLM_KERNELS_AVX2)
// Lanes [8h, 8h + 8) of a panel of `cols` valid outputs, as a maskload/maskstore mask.
inline __m256i half_mask(int cols, int h) {
  return detail::tail_mask8(cols - 8 * h);
}

// Keeps float32 weight vectors in registers. GCC otherwise folds their loads into every
// fma that uses them (one load per row: 24 loads and 12 broadcasts per 24 fmas, more than
// the load ports take), which ran the many-row tiles at half their speed. One-panel tiles
// now take panel_pairs below; this serves the wider ones (tiles of 1 or 2 rows).
template <int V>
inline void in_register(__m256 (&v)[V]) {
  for (int i = 0; i < V; ++i)
    asm("" : "+x"(v[i]));
}

#if defined(__x86_64__)
#define PAGELLM_MATMUL_PANEL_ASM 1
// The k-pair loop of a one-panel tile, written out. GCC's register allocation of the same
// loop in intrinsics depends on R: at 5 rows it moved accumulators between registers and
// through the stack on every step, and the bf16 tile ran slower than at 6 rows. Here row
// r's accumulators are ymm(2r) and ymm(2r + 1) for the whole loop; ymm12 and ymm13 hold
// the two halves of the panel's weights for one kk, ymm14 the broadcast x and ymm15 the
// bf16 mask.
//
// Row r's x is at x0 + r * s for r < 3 and at x3 + (r - 3) * s above (s = ldx in bytes).
// A step does what tile_avx2_core's step does, in the same order: the even kk times each
// row's x[kk], then the odd kk times x[kk + 1]. The weights of a kk, as W's even() and
// odd() make them: bf16, the low 16 bits of each 32-bit lane shifted up (even) or the
// high 16 bits masked (odd); float16, converted from 32 bytes, 32 bytes on; float32, 64
// bytes, 64 bytes on.
// clang-format off
#define PAGELLM_IF_ROW(r) ".if %c[rows] > " #r "\n\t"
#define PAGELLM_ROW(r, lo, hi, off, addr)           \
  PAGELLM_IF_ROW(r)                                 \
  "vbroadcastss " #off addr ", %%ymm14\n\t"         \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm" #lo "\n\t"  \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm" #hi "\n\t"  \
  ".endif\n\t"
#define PAGELLM_ROWS(off)                          \
  PAGELLM_ROW(0, 0, 1, off, "(%[x0])")             \
  PAGELLM_ROW(1, 2, 3, off, "(%[x0],%[s])")        \
  PAGELLM_ROW(2, 4, 5, off, "(%[x0],%[s],2)")      \
  PAGELLM_ROW(3, 6, 7, off, "(%[x3])")             \
  PAGELLM_ROW(4, 8, 9, off, "(%[x3],%[s])")        \
  PAGELLM_ROW(5, 10, 11, off, "(%[x3],%[s],2)")
#define PAGELLM_MOVE_ROW(r, lo, hi, load)                     \
  PAGELLM_IF_ROW(r)                                           \
  load(64 * r, lo)                                            \
  load(64 * r + 32, hi)                                       \
  ".endif\n\t"
#define PAGELLM_LOAD(off, reg) "vmovups " #off "(%[acc]), %%ymm" #reg "\n\t"
#define PAGELLM_STORE(off, reg) "vmovups %%ymm" #reg ", " #off "(%[acc])\n\t"
#define PAGELLM_MOVE_ROWS(load)         \
  PAGELLM_MOVE_ROW(0, 0, 1, load)       \
  PAGELLM_MOVE_ROW(1, 2, 3, load)       \
  PAGELLM_MOVE_ROW(2, 4, 5, load)       \
  PAGELLM_MOVE_ROW(3, 6, 7, load)       \
  PAGELLM_MOVE_ROW(4, 8, 9, load)       \
  PAGELLM_MOVE_ROW(5, 10, 11, load)
// clang-format on

// The asm's name for each weight type.
template <class W>
constexpr int kAsmWeight = std::is_same_v<W, BF16W>  ? 0
                           : std::is_same_v<W, F16W> ? 1
                                                     : 2;

alignas(32) constexpr uint32_t kHighHalves[8] = {0xffff0000u, 0xffff0000u, 0xffff0000u,
                                                 0xffff0000u, 0xffff0000u, 0xffff0000u,
                                                 0xffff0000u, 0xffff0000u};

// acc[r][h] += the `pairs` (> 0) k-pairs of one panel (w) times rows [0, R) of x;
// PF: prefetch each step's line `kPrefetchBytes` ahead, as prefetch_step does for one panel;
// else, with `next`, prefetch into L2 from `next` on, `next_step` bytes further each step.
// Volatile: the asm's effect is on acc, through memory, not on its outputs.
template <class W, int R, bool PF>
inline void panel_pairs(__m256 (&acc)[R][2], const typename W::T* w, const float* x, int64_t ldx,
                        int64_t pairs, const char* next, int64_t next_step) {
  static_assert(R >= 1 && R <= 6);
  uintptr_t x0 = reinterpret_cast<uintptr_t>(x);
  uintptr_t x3 = x0 + 3 * sizeof(float) * ldx;
  if (next == nullptr) {
    next = reinterpret_cast<const char*>(w);  // a line the loop reads anyway
    next_step = 0;
  }
  // clang-format off
  asm volatile(PAGELLM_MOVE_ROWS(PAGELLM_LOAD)
      "vmovdqa %[mask], %%ymm15\n\t"
      "1:\n\t"
      ".if %c[pf]\n\t"
      "prefetcht0 %c[ahead](%[w])\n\t"
      ".if %c[type] == 2\n\t"
      "prefetcht0 %c[ahead]+64(%[w])\n\t"
      ".endif\n\t"
      ".else\n\t"
      "prefetcht1 (%[next])\n\t"
      ".if %c[type] == 2\n\t"
      "prefetcht1 64(%[next])\n\t"
      ".endif\n\t"
      "add %[next_step], %[next]\n\t"
      ".endif\n\t"
      ".if %c[type] == 0\n\t"
      "vmovdqu (%[w]), %%ymm12\n\t"
      "vmovdqu 32(%[w]), %%ymm13\n\t"
      "vpslld $16, %%ymm12, %%ymm12\n\t"
      "vpslld $16, %%ymm13, %%ymm13\n\t"
      ".elseif %c[type] == 1\n\t"
      "vcvtph2ps (%[w]), %%ymm12\n\t"
      "vcvtph2ps 16(%[w]), %%ymm13\n\t"
      ".else\n\t"
      "vmovups (%[w]), %%ymm12\n\t"
      "vmovups 32(%[w]), %%ymm13\n\t"
      ".endif\n\t"
      PAGELLM_ROWS(0)
      ".if %c[type] == 0\n\t"
      "vpand (%[w]), %%ymm15, %%ymm12\n\t"
      "vpand 32(%[w]), %%ymm15, %%ymm13\n\t"
      ".elseif %c[type] == 1\n\t"
      "vcvtph2ps 32(%[w]), %%ymm12\n\t"
      "vcvtph2ps 48(%[w]), %%ymm13\n\t"
      ".else\n\t"
      "vmovups 64(%[w]), %%ymm12\n\t"
      "vmovups 96(%[w]), %%ymm13\n\t"
      ".endif\n\t"
      PAGELLM_ROWS(4)
      "add %[step], %[w]\n\t"
      "add $8, %[x0]\n\t"
      "add $8, %[x3]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      PAGELLM_MOVE_ROWS(PAGELLM_STORE)
      : [w] "+r"(w), [x0] "+r"(x0), [x3] "+r"(x3), [n] "+r"(pairs), [next] "+r"(next)
      : [acc] "r"(&acc[0][0]), [s] "r"(sizeof(float) * ldx), [next_step] "r"(next_step),
        [mask] "m"(*reinterpret_cast<const __m256i*>(kHighHalves)), [pf] "i"(PF ? 1 : 0),
        [ahead] "i"(kPrefetchBytes), [rows] "i"(R), [type] "i"(kAsmWeight<W>),
        [step] "i"(2 * kPanel * sizeof(typename W::T))
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  // clang-format on
}
#undef PAGELLM_MOVE_ROWS
#undef PAGELLM_STORE
#undef PAGELLM_LOAD
#undef PAGELLM_MOVE_ROW
#undef PAGELLM_ROWS
#undef PAGELLM_ROW
#undef PAGELLM_IF_ROW
#endif  // __x86_64__

// tile_avx512 on 8-lane vectors: a panel's 16 accumulators are two registers, so a tile
// holds at most 12 of them (P x R <= 6), beside its weight vectors and the broadcast x.
template <class W, int P, int R, bool PF, bool NEXT>
void tile_avx2_core(const TileArgs<W>& a) {
  static_assert(P * R <= 6);
  constexpr int V = 2 * P;  // vectors of a row: panel p's lanes 8h .. 8h + 7 at 2p + h
  // Accumulators as a flat [R][V] array, loaded and stored outside the loop only, with the
  // masks made where they are used: GCC otherwise stores every accumulator to the stack on
  // each iteration, or spills them to hold the masks.
  // A tile of whole panels moves y (and bias) with plain loads and stores: Zen 3's
  // 256-bit masked store is microcoded, and the masked epilogue of the many-row path's
  // 6 x 16 tiles took about a tenth of their time.
  const bool whole = a.ncols >= P * kPanel;
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < V; ++i)
      acc[r][i] = a.first ? _mm256_setzero_ps()
                  : whole ? _mm256_loadu_ps(a.y + r * a.ldy + 8 * i)
                          : _mm256_maskload_ps(a.y + r * a.ldy + 8 * i,
                                               half_mask(a.ncols - kPanel * (i / 2), i % 2));
  const typename W::T* w = a.w;
  const float* x = a.x;
  int64_t t = 0;
#if defined(PAGELLM_MATMUL_PANEL_ASM)
  if constexpr (P == 1) {
    const int64_t pairs = a.kn / 2;
    if (pairs > 0) {
      panel_pairs<W, R, PF>(acc, w, x, a.ldx, pairs, a.next, a.next_step);
      t = 2 * pairs;
      w += 2 * kPanel * pairs;
      x += 2 * pairs;
    }
  }
#endif
  for (; t + 2 <= a.kn; t += 2, w += 2 * kPanel, x += 2) {
    if constexpr (PF) prefetch_step<W, P, NEXT>(w, t, a);
    {
      __m256 wv[V];
      for (int i = 0; i < V; ++i)
        wv[i] = W::even(w + (i / 2) * a.ws, i % 2);
      if constexpr (std::is_same_v<W, F32W>) in_register(wv);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_set1_ps(x[r * a.ldx]);
        for (int i = 0; i < V; ++i)
          acc[r][i] = _mm256_fmadd_ps(xb, wv[i], acc[r][i]);
      }
    }
    {
      __m256 wv[V];
      for (int i = 0; i < V; ++i)
        wv[i] = W::odd(w + (i / 2) * a.ws, i % 2);
      if constexpr (std::is_same_v<W, F32W>) in_register(wv);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_set1_ps(x[r * a.ldx + 1]);
        for (int i = 0; i < V; ++i)
          acc[r][i] = _mm256_fmadd_ps(xb, wv[i], acc[r][i]);
      }
    }
  }
  if (t < a.kn) {
    __m256 wv[V];
    for (int i = 0; i < V; ++i)
      wv[i] = W::load1(w + (i / 2) * a.ws, i % 2);
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_set1_ps(x[r * a.ldx]);
      for (int i = 0; i < V; ++i)
        acc[r][i] = _mm256_fmadd_ps(xb, wv[i], acc[r][i]);
    }
  }
  const bool add_bias = a.last && a.bias != nullptr;
  if (whole) {
    for (int i = 0; i < V; ++i) {
      const __m256 b = add_bias ? _mm256_loadu_ps(a.bias + 8 * i) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r)
        _mm256_storeu_ps(a.y + r * a.ldy + 8 * i,
                         add_bias ? _mm256_add_ps(acc[r][i], b) : acc[r][i]);
    }
    return;
  }
  for (int i = 0; i < V; ++i) {
    const __m256i mask = half_mask(a.ncols - kPanel * (i / 2), i % 2);
    for (int r = 0; r < R; ++r) {
      __m256 v = acc[r][i];
      if (add_bias) v = _mm256_add_ps(v, _mm256_maskload_ps(a.bias + 8 * i, mask));
      _mm256_maskstore_ps(a.y + r * a.ldy + 8 * i, mask, v);
    }
  }
}

// A P x R tile as tiles of as many panels as fit beside R rows, one after another: each
// accumulator still takes kk = 0, 1, ... in order, so the results are tile_avx512's.
template <class W, int P, int R, bool PF, bool NEXT = false>
void tile_simd(const TileArgs<W>& a) {
  constexpr int kSub = R == 1 ? 4 : (R == 2 ? 2 : 1);
  if constexpr (P <= kSub) {
    tile_avx2_core<W, P, R, PF, NEXT>(a);
  } else {
    TileArgs<W> head = a;
    head.ncols = std::min(a.ncols, kSub * kPanel);
    tile_avx2_core<W, kSub, R, PF, NEXT>(head);
    if (a.ncols <= kSub * kPanel) return;
    TileArgs<W> rest = a;
    rest.w += kSub * a.ws;
    if (rest.next != nullptr) rest.next += a.kn / 2 * a.next_step;
    rest.y += kSub * kPanel;
    if (rest.bias != nullptr) rest.bias += kSub * kPanel;
    rest.ncols -= kSub * kPanel;
    tile_simd<W, P - kSub, R, PF, NEXT>(rest);
  }
}
#endif  // PAGELLM_KERNELS_AVX2

#if defined(PAGELLM_MATMUL_SIMD)
template <class W>
using TileFn = void (*)(const TileArgs<W>&);

template <class W, int P, bool PF, int... Rs>
constexpr std::array<TileFn<W>, kTileRows> tile_row_table(std::integer_sequence<int, Rs...>) {
  return {&tile_simd<W, P, Rs + 1, PF>...};
}

template <class W, bool PF>
constexpr std::array<std::array<TileFn<W>, kTileRows>, kTilePanels> tile_table() {
  return {tile_row_table<W, 1, PF>(std::make_integer_sequence<int, kTileRows>{}),
          tile_row_table<W, 2, PF>(std::make_integer_sequence<int, kTileRows>{}),
          tile_row_table<W, 3, PF>(std::make_integer_sequence<int, kTileRows>{}),
          tile_row_table<W, 4, PF>(std::make_integer_sequence<int, kTileRows>{})};
}

template <class W>
constexpr std::array<std::array<std::array<TileFn<W>, kTileRows>, kTilePanels>, 2> kTiles = {
    tile_table<W, false>(), tile_table<W, true>()};

template <class W, int... Ps>
constexpr std::array<TileFn<W>, kGemvPanels> gemv_table(std::integer_sequence<int, Ps...>) {
  return {&tile_simd<W, Ps + 1, 1, true, true>...};
}

template <class W>
constexpr std::array<TileFn<W>, kGemvPanels> kGemv =
    gemv_table<W>(std::make_integer_sequence<int, kGemvPanels>{});
#endif  // PAGELLM_MATMUL_SIMD

// P panels x R rows; `prefetch` when the weights come from memory (first pass over them).
template <class W>
void run_tile(bool simd, int P, int R, bool prefetch, const TileArgs<W>& a) {
#if defined(PAGELLM_MATMUL_SIMD)
  if (simd) {
    if (P > kTilePanels) return kGemv<W>[P - 1](a);
    return kTiles<W>[prefetch ? 1 : 0][P - 1][R - 1](a);
  }
#endif
  tile_portable(P, R, a);
}

// Float32 copy of panels [0, P) of a group over kk in [k0, k1) (k0 even): [P][k1 - k0][16].
template <class W>
void convert_panels(bool simd, const typename W::T* group, int64_t k, int P, int64_t k0, int64_t k1,
                    float* out) {
  const int64_t kn = k1 - k0;
  for (int p = 0; p < P; ++p) {
    const typename W::T* src = group + (p * k + k0) * kPanel;
    float* dst = out + p * kn * kPanel;
#if defined(PAGELLM_KERNELS_AVX512)
    if (simd) {
      int64_t i = 0;
      for (; i + 2 <= kn; i += 2) {
        _mm512_storeu_ps(dst + i * kPanel, W::even(src + i * kPanel));
        _mm512_storeu_ps(dst + (i + 1) * kPanel, W::odd(src + i * kPanel));
      }
      if (i < kn) _mm512_storeu_ps(dst + i * kPanel, W::load1(src + i * kPanel));
      continue;
    }
#elif defined(PAGELLM_KERNELS_AVX2)
    if (simd) {
      int64_t i = 0;
      for (; i + 2 <= kn; i += 2) {
        for (int h = 0; h < 2; ++h) {
          _mm256_storeu_ps(dst + i * kPanel + 8 * h, W::even(src + i * kPanel, h));
          _mm256_storeu_ps(dst + (i + 1) * kPanel + 8 * h, W::odd(src + i * kPanel, h));
        }
      }
      if (i < kn)
        for (int h = 0; h < 2; ++h)
          _mm256_storeu_ps(dst + i * kPanel + 8 * h, W::load1(src + i * kPanel, h));
      continue;
    }
#endif
    for (int64_t i = 0; i < kn; ++i)
      for (int l = 0; l < kPanel; ++l)
        dst[i * kPanel + l] = W::scalar(src[packed_offset(W::kPaired, i, l, kn)]);
  }
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

float* thread_scratch(int64_t floats) {
  thread_local std::unique_ptr<float, AlignedFree> buf;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    const int64_t bytes = (floats * 4 + 63) / 64 * 64;
    buf.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!buf) throw std::bad_alloc();
    capacity = floats;
  }
  return buf.get();
}

// The k-block of the many-row path: k cut into the fewest blocks of at most kKBlock, of
// even and nearly equal lengths.
inline int64_t many_row_k_block(int64_t k) {
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  return ((k + blocks - 1) / blocks + 1) / 2 * 2;
}

// Splits `count` into `parts` sizes that differ by at most one: size of part i.
inline int64_t balanced(int64_t count, int64_t parts, int64_t i) {
  return count / parts + (i < count % parts ? 1 : 0);
}

// First index of part i when `count` is split as `balanced` splits it.
inline int64_t balanced_start(int64_t count, int64_t parts, int64_t i) {
  return i * (count / parts) + std::min(i, count % parts);
}

// Few rows: the panels are cut into tiles of `width` panels, each streamed once from
// memory. A tile runs its row tiles over one k-block at a time, so the block is read from
// memory by the first row tile (with prefetch) and from L1 (AVX2: the whole of k, from L2)
// by the others.
template <class W>
struct StreamTiles {
  bool simd;
  const float* x;
  const typename W::T* packed;
  const float* bias;
  int64_t m, n, k;
  int64_t panels;
  int64_t count;  // tiles of about `width` panels: kGemvPanels for one row, else kTilePanels

  void run(int64_t i, float* y) const {
    const int P = static_cast<int>(balanced(panels, count, i));
    const int64_t col0 = balanced_start(panels, count, i) * kPanel;
    const int ncols = static_cast<int>(std::min<int64_t>(P * kPanel, n - col0));
    const typename W::T* group = packed + col0 * k;
    const float* gbias = bias != nullptr ? bias + col0 : nullptr;
    const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
    const int64_t kblock = std::max<int64_t>(row_tiles == 1 ? k : std::min(k, kStreamKBlock), 1);
    // Over the whole of k, the last two row tiles (which read this tile from cache; never
    // the first) prefetch the tile that follows in memory, the one this thread most likely
    // runs next: its first row tile then reads from L2 instead of stalling on memory.
    const char* next = nullptr;
    int64_t next_step = 0;
    const int64_t fetchers = std::min<int64_t>(2, row_tiles - 1);
    const int64_t pair_steps = fetchers * P * (k / 2);
    if (kblock == k && i + 1 < count && pair_steps > 0) {
      next = reinterpret_cast<const char*>(group + P * k * kPanel);
      const int64_t bytes = balanced(panels, count, i + 1) * k * kPanel * sizeof(typename W::T);
      next_step = (bytes + pair_steps - 1) / pair_steps;
    }
    int64_t k0 = 0;
    do {
      const int64_t k1 = std::min(k, k0 + kblock);
      int64_t r0 = 0;
      for (int64_t t = 0; t < row_tiles; ++t) {
        const int R = static_cast<int>(balanced(m, row_tiles, t));
        TileArgs<W> a{x + r0 * k + k0, k,     group + k0 * kPanel, k * kPanel, k1 - k0, k0 == 0,
                      k1 == k,         gbias, y + r0 * n + col0,   n,          ncols};
        if (next != nullptr && t >= row_tiles - fetchers) {
          a.next = next + (t - (row_tiles - fetchers)) * P * (k / 2) * next_step;
          a.next_step = next_step;
        }
        run_tile(simd, P, R, t == 0, a);
        r0 += R;
      }
      k0 = k1;
    } while (k0 < k);
  }
};

// The tiles [front, back) first given to one thread. Its owner takes them from the front;
// a thread that has run out of its own takes them from the back. Each memory stream stays
// contiguous, and a thread slowed by its neighbours on the machine holds the others up by
// at most one tile instead of by the difference in their speeds.
class alignas(64) TileRange {
 public:
  void reset(int64_t front, int64_t back) {
    v_.store(pack(front, back), std::memory_order_relaxed);
  }
  bool take_front(int64_t& tile) { return take(tile, true); }
  bool take_back(int64_t& tile) { return take(tile, false); }

 private:
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
  }
  bool take(int64_t& tile, bool from_front) {
    uint64_t cur = v_.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(cur & 0xffffffffu);
      const int64_t back = static_cast<int64_t>(cur >> 32);
      if (front >= back) return false;
      const uint64_t next = from_front ? pack(front + 1, back) : pack(front, back - 1);
      if (v_.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        tile = from_front ? front : back - 1;
        return true;
      }
    }
  }
  std::atomic<uint64_t> v_{0};
};

// Thread `tid` of `nt` runs its own range from the front, then the others' from the back.
template <class Run>
void run_ranges(TileRange* ranges, int64_t nt, int64_t tid, Run&& run) {
  int64_t item = 0;
  while (ranges[tid].take_front(item))
    run(item);
  for (int64_t o = 1; o < nt; ++o) {
    TileRange& other = ranges[(tid + o) % nt];
    while (other.take_back(item))
      run(item);
  }
}

// One range per thread, kept by the calling thread between calls.
TileRange* tile_ranges(int64_t threads) {
  thread_local std::vector<TileRange> ranges;
  if (static_cast<int64_t>(ranges.size()) < threads) ranges = std::vector<TileRange>(threads);
  return ranges.data();
}

#if defined(PAGELLM_KERNELS_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#define PAGELLM_MATMUL_AMX 1
// bf16 weights on a CPU with AMX: the tile unit's bf16 dot products, with x cut into three
// bf16 parts hi + mid + lo that sum to it exactly (8 significant bits each, 24 in all), so
// that every product x[i, kk] * w[j, kk] is exact, as in the fma path; only the order and
// rounding of the sum differ. One exception, far below anything a model computes: the
// tile unit reads subnormal inputs as zero and flushes subnormal results, so parts (or
// bf16 weights) under 2^-126 in magnitude, and products under it, count as zero.
//
// A tile step adds, for each part, the products of 32 kk (16 pairs) into a float32
// accumulator tile; the parts go smallest first. The kk from the last multiple of 32 on
// are added by the fma tiles, from float32 x. Every row of a tile is computed alone, by
// the same steps whatever m is, so results still do not depend on m, on a row's place in
// the batch, or on the thread count.
namespace amx {

constexpr int64_t kChunk = 32;  // kk per tile step: 16 rows of 16 bf16 pairs
constexpr int kRows = 16;       // rows per tile
constexpr int kParts = 3;
// Row tiles per work item when m is large: a group's panels (4 x 16 outputs) are read
// from cache by every row tile of an item.
constexpr int64_t kItemTiles = 12;
// ... and at most about this many bytes of x's parts, which stay in L2 while the item's
// thread runs the chunk's items for one group after another.
constexpr int64_t kItemPartsBytes = int64_t{1} << 20;
// Most rows of one call's split of x (longer ones run as several).
constexpr int64_t kMaxRows = 512;
// How far ahead of its tile loads each panel is prefetched by an item's first row tile.
constexpr int64_t kPrefetchAhead = 2048;

// Linux lets a process use the tile registers once it asks (5.16 and later).
bool permitted() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The configuration this thread has loaded (0: none). A call owns the tile state from its
// first configure to its release: nothing else may use the tiles in between.
thread_local int g_configured = 0;

// Tiles 0-3: accumulators of up to 4 panels; 4-6: x's parts lo, mid, hi; 7: one panel's
// 32 kk of weights. All rows are 64 bytes; the x and accumulator tiles hold `rows` rows.
void configure(int rows) {
  int& current = g_configured;
  if (current == rows) return;
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = static_cast<uint8_t>(rows);
  }
  c.colsb[7] = 64;
  c.rows[7] = kRows;
  _tile_loadconfig(&c);
  current = rows;
}

// Ends a call's use of the tiles: the state is released (a thread that holds it costs
// every context switch 8 KiB more to save), and the next call configures afresh.
void release() {
  if (g_configured == 0) return;
  _tile_release();
  g_configured = 0;
}

// The parts of the R rows of one row tile (x's rows r0 .. r0 + R - 1), at
// parts + kParts * r0 * k32: for each tile step, lo, then mid, then hi, each [R][32], so
// that every tile load reads R x 64 contiguous bytes (against rows a row of x apart,
// 0.89x to 1.0x the time of BM_MatmulBF16 at m = 16 to 512).
struct TileParts {
  int64_t part;  // elements from one part of a step to the next: R * kChunk
  int64_t step;  // elements from one tile step to the next: kParts * R * kChunk
};

inline TileParts tile_parts(int R) {
  return {R * kChunk, kParts * R * kChunk};
}

// The parts of the row tile at x (R rows of k) into `tile`: hi = x cut to its top 8
// significant bits (the bf16 it starts with), mid = the top 8 of x - hi, lo = x - hi -
// mid. Each cut and each difference is exact (a truncation never rounds up, so hi cannot
// overflow to inf, and x - hi is exact by Sterbenz's lemma), and lo has at most 8
// significant bits left. A non-finite x is hi alone (NaN quieted as bf16 rounding quiets
// it).
void split_tile(const float* x, int64_t k, int64_t k32, int R, uint16_t* tile) {
  const TileParts tp = tile_parts(R);
  for (int r = 0; r < R; ++r) {
    for (int64_t kk = 0; kk < k32; kk += 16) {
      uint16_t* lo = tile + kk / kChunk * tp.step + r * kChunk + kk % kChunk;
      uint16_t* mid = lo + tp.part;
      uint16_t* hi = mid + tp.part;
      const __m512 v = _mm512_loadu_ps(x + r * k + kk);
      const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      const __mmask16 finite = static_cast<__mmask16>(~_mm512_fpclass_ps_mask(v, 0x99));
      const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
      const __m512 r1 = _mm512_maskz_sub_ps(finite, v, h);
      const __m512 md = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), top));
      const __m512 l = _mm512_sub_ps(r1, md);
      const __m256bh rounded = _mm512_cvtneps_pbh(v);
      const __m256i hi16 = _mm256_mask_blend_epi16(
          finite, reinterpret_cast<const __m256i&>(rounded),
          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(h), 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), hi16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(md), 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(l), 16)));
    }
  }
}

// Accumulator tile Acc += part tile Part (4: lo, 5: mid, 6: hi) times the weights in tile
// 7. (_tile_dpbf16ps pastes its arguments into the instruction's text, so it takes only
// literal tile numbers, not template parameters.)
template <int Acc, int Part>
inline void dot_part() {
  asm volatile("tdpbf16ps %%tmm7, %%tmm%c1, %%tmm%c0" ::"n"(Acc), "n"(Part));
}

// All three parts, smallest first, into accumulator tile Acc.
template <int Acc>
inline void dot_parts() {
  dot_part<Acc, 4>();
  dot_part<Acc, 5>();
  dot_part<Acc, 6>();
}

// Accumulates P panels (w, `ws` elements apart) times the parts of one row tile (at a,
// laid out as tp says) over `chunks` tile steps into tiles 0 .. P-1.
//
// A load into a tile waits for the instructions that still read it, and a dot product
// waits for its loads. So, from the second row tile of an item on (whose panels and parts
// come from L2), each of the next step's parts is loaded as soon as the last panel's dot
// product with it is issued: the loads overlap the dot products (0.75x to 0.85x the time
// at m = 96 and 512 with k = 768). The first row tile, whose panels come from memory
// behind its prefetches, keeps the plain order, which measured a little faster there.
template <int P, bool PF>
void dot_chunks(const uint16_t* a, TileParts tp, const uint16_t* w, int64_t ws, int64_t chunks) {
  _tile_zero(0);
  if constexpr (P > 1) _tile_zero(1);
  if constexpr (P > 2) _tile_zero(2);
  if constexpr (P > 3) _tile_zero(3);
  if constexpr (!PF) {
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + tp.part, 64);
    _tile_loadd(6, a + 2 * tp.part, 64);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const uint16_t* b = w + c * kChunk * kPanel;
    if constexpr (PF) {
      const uint16_t* step = a + c * tp.step;
      _tile_loadd(4, step, 64);
      _tile_loadd(5, step + tp.part, 64);
      _tile_loadd(6, step + 2 * tp.part, 64);
      // Each panel's stream kPrefetchAhead bytes ahead of its tile loads; past the end of
      // its panel, into the same panel of the next group (the item this thread most
      // likely runs next), whose stream would otherwise start with a wait on memory.
      const int64_t bytes = static_cast<int64_t>(sizeof(uint16_t)) * ws;
      int64_t pos = static_cast<int64_t>(sizeof(uint16_t)) * c * kChunk * kPanel + kPrefetchAhead;
      int64_t first = 0;
      if (pos >= bytes) {
        pos -= bytes;
        first = P;
      }
      const char* base = reinterpret_cast<const char*>(w) + pos;
      for (int p = 0; p < P; ++p) {
        const char* ahead = base + (first + p) * bytes;
        for (int line = 0; line < 16; ++line)
          detail::prefetch_l1(ahead + 64 * line);
      }
    }
    // Panels 0 .. P-2, then the last one, whose dot products free the part tiles one by
    // one for the next step's loads.
    _tile_loadd(7, b, 64);
    if constexpr (P > 1) {
      dot_parts<0>();
      _tile_loadd(7, b + ws, 64);
    }
    if constexpr (P > 2) {
      dot_parts<1>();
      _tile_loadd(7, b + 2 * ws, 64);
    }
    if constexpr (P > 3) {
      dot_parts<2>();
      _tile_loadd(7, b + 3 * ws, 64);
    }
    if (!PF && c + 1 < chunks) {
      const uint16_t* next = a + (c + 1) * tp.step;
      dot_part<P - 1, 4>();
      _tile_loadd(4, next, 64);
      dot_part<P - 1, 5>();
      _tile_loadd(5, next + tp.part, 64);
      dot_part<P - 1, 6>();
      _tile_loadd(6, next + 2 * tp.part, 64);
    } else {
      dot_parts<P - 1>();
    }
  }
}

// Stores tiles 0 .. P-1 as [rows][64] floats.
template <int P>
void store_acc(float* out) {
  constexpr int64_t kStride = 4 * kPanel * sizeof(float);
  _tile_stored(0, out, kStride);
  if constexpr (P > 1) _tile_stored(1, out + kPanel, kStride);
  if constexpr (P > 2) _tile_stored(2, out + 2 * kPanel, kStride);
  if constexpr (P > 3) _tile_stored(3, out + 3 * kPanel, kStride);
}

// One row tile times P panels into out ([rows][64] floats); PF: prefetch the weights.
template <int P, bool PF>
void row_tile(const uint16_t* a, TileParts tp, const uint16_t* w, int64_t ws, int64_t chunks,
              float* out) {
  dot_chunks<P, PF>(a, tp, w, ws, chunks);
  store_acc<P>(out);
}

struct Job {
  const float* x;
  const uint16_t* parts;  // kParts * m * k32, tile by tile (split_tile)
  const uint16_t* packed;
  const float* bias;
  int64_t m, n, k, k32;
  int64_t panels, groups, row_tiles, chunks_per_group;

  // Item i: row chunk i / groups, group i % groups. A thread runs consecutive items: one
  // chunk of rows (its parts in L2) against group after group of panels.
  void run(int64_t item, float* y) const {
    const int64_t g = item % groups;
    const int64_t chunk = item / groups;
    const int P = static_cast<int>(std::min<int64_t>(kTilePanels, panels - g * kTilePanels));
    const int64_t col0 = g * kTilePanels * kPanel;
    const int ncols = static_cast<int>(std::min<int64_t>(P * kPanel, n - col0));
    const uint16_t* group = packed + col0 * k;
    const int64_t t0 = balanced_start(row_tiles, chunks_per_group, chunk);
    const int64_t t1 = balanced_start(row_tiles, chunks_per_group, chunk + 1);
    alignas(64) float acc[kRows * kTilePanels * kPanel];
    const __mmask16 last_mask = detail::tail_mask(ncols - kPanel * (P - 1));
    const int64_t ws = k * kPanel;
    const int64_t chunks = k32 / kChunk;
    // With no kk left past k32 the bias goes in here; else the fma tiles add the rest.
    const bool done = k32 == k;
    using Fn = void (*)(const uint16_t*, TileParts, const uint16_t*, int64_t, int64_t, float*);
    static constexpr Fn kFns[2][kTilePanels] = {
        {&row_tile<1, false>, &row_tile<2, false>, &row_tile<3, false>, &row_tile<4, false>},
        {&row_tile<1, true>, &row_tile<2, true>, &row_tile<3, true>, &row_tile<4, true>}};
    for (int64_t t = t0; t < t1; ++t) {
      const int R = static_cast<int>(balanced(m, row_tiles, t));
      const int64_t r0 = balanced_start(m, row_tiles, t);
      configure(R);
      kFns[t == t0 ? 1 : 0][P - 1](parts + kParts * r0 * k32, tile_parts(R), group, ws, chunks,
                                   acc);
      for (int r = 0; r < R; ++r) {
        float* yr = y + (r0 + r) * n + col0;
        for (int p = 0; p < P; ++p) {
          const __mmask16 mask = p == P - 1 ? last_mask : static_cast<__mmask16>(0xffff);
          __m512 v = _mm512_load_ps(acc + r * kTilePanels * kPanel + p * kPanel);
          if (done && bias != nullptr)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + col0 + p * kPanel));
          _mm512_mask_storeu_ps(yr + p * kPanel, mask, v);
        }
      }
      if (done) continue;
      for (int r = 0; r < R; r += kTileRows) {
        const int rows = std::min(kTileRows, R - r);
        const TileArgs<BF16W> a{x + (r0 + r) * k + k32,
                                k,
                                group + k32 * kPanel,
                                ws,
                                k - k32,
                                false,
                                true,
                                bias != nullptr ? bias + col0 : nullptr,
                                y + (r0 + r) * n + col0,
                                n,
                                ncols};
        kTiles<BF16W>[0][P - 1][rows - 1](a);
      }
    }
  }
};

}  // namespace amx
#endif  // AMX

#if defined(PAGELLM_MATMUL_AMX)
void matmul_amx(const float* x, const uint16_t* packed, const float* bias, int64_t m, int64_t n,
                int64_t k, float* y) {
  // Rows are computed alone: a long prompt runs as blocks of rows, which keeps the parts'
  // scratch (6 bytes per element of x) to a few tens of MB even at k = 14336.
  if (m > amx::kMaxRows) {
    for (int64_t r0 = 0; r0 < m; r0 += amx::kMaxRows)
      matmul_amx(x + r0 * k, packed, bias, std::min(amx::kMaxRows, m - r0), n, k, y + r0 * n);
    return;
  }
  const int64_t k32 = k / amx::kChunk * amx::kChunk;
  thread_local std::vector<uint16_t> scratch;
  if (static_cast<int64_t>(scratch.size()) < amx::kParts * m * k32)
    scratch.resize(amx::kParts * m * k32);
  uint16_t* parts = scratch.data();
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t row_tiles = (m + amx::kRows - 1) / amx::kRows;
  const int64_t item_tiles = std::clamp<int64_t>(
      amx::kItemPartsBytes / (amx::kRows * amx::kParts * k32 * sizeof(uint16_t)), 1,
      amx::kItemTiles);
  const int64_t chunks = (row_tiles + item_tiles - 1) / item_tiles;
  const int64_t groups = (panels + kTilePanels - 1) / kTilePanels;
  const amx::Job job{x, parts, packed, bias, m, n, k, k32, panels, groups, row_tiles, chunks};
  const int64_t items = groups * chunks;
  const int64_t nt = std::min<int64_t>(items, omp_get_max_threads());
  // Each thread starts on a contiguous range of items (of panels, when m is small: one
  // stream of memory) and then takes items from the back of the others' ranges.
  TileRange* ranges = tile_ranges(nt);
  for (int64_t t = 0; t < nt; ++t)
    ranges[t].reset(balanced_start(items, nt, t), balanced_start(items, nt, t + 1));
#pragma omp parallel num_threads(static_cast <int>(nt)) if (nt > 1)
  {
    const int64_t tid = omp_get_thread_num();
    const int64_t team = omp_get_num_threads();
    for (int64_t t = balanced_start(row_tiles, team, tid);
         t < balanced_start(row_tiles, team, tid + 1); ++t) {
      const int64_t r0 = balanced_start(m, row_tiles, t);
      amx::split_tile(x + r0 * k, k, k32, static_cast<int>(balanced(m, row_tiles, t)),
                      parts + amx::kParts * r0 * k32);
    }
#pragma omp barrier
    run_ranges(ranges, nt, tid, [&](int64_t item) { job.run(item, y); });
    amx::release();
  }
}
#endif

template <class W>
void matmul_typed(const float* x, const typename W::T* packed, const float* bias, int64_t m,
                  int64_t n, int64_t k, float* y) {
  const bool simd = detail::use_simd_or_avx2();
  const int64_t panels = (n + kPanel - 1) / kPanel;
#if defined(PAGELLM_MATMUL_AMX)
  if constexpr (std::is_same_v<W, BF16W>) {
    if (simd && k >= amx::kChunk && amx_matmul()) return matmul_amx(x, packed, bias, m, n, k, y);
  }
#endif
  if (m <= kStreamRows || k == 0) {
    // Each thread starts on a contiguous range of tiles: one region of memory. Every
    // thread then drains all ranges, so they are done even if fewer threads run.
    const int width = m == 1 && simd ? kGemvPanels : kTilePanels;
    const StreamTiles<W> job{simd, x, packed, bias, m, n, k, panels, (panels + width - 1) / width};
    const int64_t nt = std::min<int64_t>(job.count, omp_get_max_threads());
    TileRange* ranges = tile_ranges(nt);
    for (int64_t t = 0; t < nt; ++t)
      ranges[t].reset(balanced_start(job.count, nt, t), balanced_start(job.count, nt, t + 1));
#pragma omp parallel num_threads(static_cast <int>(nt)) if (nt > 1)
    {
      run_ranges(ranges, nt, omp_get_thread_num(), [&](int64_t tile) { job.run(tile, y); });
    }
    return;
  }

  // Many rows: k-blocks of a group's panels are reused by every row tile of a chunk, so
  // 16-bit weights are converted once per block into a float32 scratch.
  const int64_t groups = (panels + kTilePanels - 1) / kTilePanels;
  // Chunks of nearly equal numbers of 6-row tiles.
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t row_chunks = (m + kRowChunk - 1) / kRowChunk;
  const int64_t items = groups * row_chunks;
  const int64_t kb = many_row_k_block(k);

  // Items are taken as threads finish them: an item is tens of microseconds of work, and
  // the cores of a shared machine do not run at one speed.
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t g = item / row_chunks;
    const int64_t chunk = item % row_chunks;
    const int P = static_cast<int>(std::min<int64_t>(kTilePanels, panels - g * kTilePanels));
    const int64_t col0 = g * kTilePanels * kPanel;
    const int ncols = static_cast<int>(std::min<int64_t>(kTilePanels * kPanel, n - col0));
    const typename W::T* group = packed + col0 * k;
    const float* gbias = bias != nullptr ? bias + col0 : nullptr;
    const int64_t r_begin = kTileRows * balanced_start(row_tiles, row_chunks, chunk);
    const int64_t rows =
        std::min(m, kTileRows * balanced_start(row_tiles, row_chunks, chunk + 1)) - r_begin;
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    float* scratch = std::is_same_v<W, F32W> ? nullptr : thread_scratch(kTilePanels * kb * kPanel);
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
      const int64_t k1 = std::min(k, k0 + kb);
      const float* wblock;
      int64_t ws;
      if constexpr (std::is_same_v<W, F32W>) {
        wblock = group + k0 * kPanel;
        ws = k * kPanel;
      } else {
        convert_panels<W>(simd, group, k, P, k0, k1, scratch);
        wblock = scratch;
        ws = (k1 - k0) * kPanel;
      }
      // Balanced row tiles (all of 1..6 rows) so that no tile is left nearly empty.
      int64_t r0 = r_begin;
      for (int64_t t = 0; t < tiles; ++t) {
        const int R = static_cast<int>(balanced(rows, tiles, t));
        const TileArgs<F32W> a{x + r0 * k + k0,   k, wblock, ws, k1 - k0, k0 == 0, k1 == k, gbias,
                               y + r0 * n + col0, n, ncols};
        run_tile(simd, P, R, false, a);
        r0 += R;
      }
    }
  }
}

}  // namespace

void PackedWeight::Free::operator()(void* p) const {
  std::free(p);
}

PackedWeight::PackedWeight(const void* w, DType dtype, int64_t n, int64_t k)
    : dtype_(dtype), n_(n), k_(k) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t esize = dtype_size(dtype);
  bytes_ = panels * kPanel * k * esize;
  data_.reset(allocate_streamed(bytes_));
  const bool paired = dtype == DType::kBF16;
  auto* dst = static_cast<unsigned char*>(data_.get());
  const auto* src = static_cast<const unsigned char*>(w);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    unsigned char* panel = dst + p * k * kPanel * esize;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int l = 0; l < kPanel; ++l) {
        unsigned char* out = panel + packed_offset(paired, kk, l, k) * esize;
        const int64_t j = p * kPanel + l;
        if (j < n)
          std::memcpy(out, src + (j * k + kk) * esize, esize);
        else
          std::memset(out, 0, esize);
      }
    }
  }
}

namespace {
std::atomic<bool> g_amx_enabled{true};
}  // namespace

bool amx_matmul_available() {
#if defined(PAGELLM_MATMUL_AMX)
  return amx::permitted();
#else
  return false;
#endif
}

void set_amx_matmul(bool on) {
  g_amx_enabled.store(on, std::memory_order_relaxed);
}

bool amx_matmul() {
  return g_amx_enabled.load(std::memory_order_relaxed) && amx_matmul_available();
}

void matmul(const float* x, const PackedWeight& w, const float* bias, int64_t m, float* y) {
  if (m <= 0 || w.n() <= 0) return;
  switch (w.dtype()) {
    case DType::kF32:
      return matmul_typed<F32W>(x, static_cast<const float*>(w.data()), bias, m, w.n(), w.k(), y);
    case DType::kBF16:
      return matmul_typed<BF16W>(x, static_cast<const uint16_t*>(w.data()), bias, m, w.n(), w.k(),
                                 y);
    case DType::kF16:
      return matmul_typed<F16W>(x, static_cast<const uint16_t*>(w.data()), bias, m, w.n(), w.k(),
                                y);
  }
}

void matmul_reference(const float* x, const void* w, DType w_dtype, const float* bias, int64_t m,
                      int64_t n, int64_t k, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.f;
      for (int64_t kk = 0; kk < k; ++kk)
        acc = std::fma(x[i * k + kk], load_f32(w, w_dtype, j * k + kk), acc);
      y[i * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace pagellm::kernels::cpu
