// Linear layers: y = x w^T + bias over a weight packed in panels of 16 outputs.
//
// Every output y[i, j] is one float32 accumulator: acc = fma(x[i, kk], w[j, kk], acc) for
// kk = 0, 1, ..., k-1 starting from 0, then acc + bias[j]. The kernels below only choose
// which accumulators run side by side (register tiles of up to 4 panels x 6 rows), how the
// weights reach them (read in place, or converted to float32 once per k-block when several
// row tiles reuse them; the conversion is exact) and which thread owns which panels. None
// of that changes an accumulator's operations, so results do not depend on m, on a row's
// place in the batch, or on the thread count. Splitting k into blocks stores the float32
// partial sum in y and reloads it, which is exact too.

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {

using detail::kLanes;

constexpr int kPanel = 16;         // outputs per panel: one SIMD lane each
constexpr int kTilePanels = 4;     // panels per register tile
constexpr int kTileRows = 6;       // rows per register tile: 24 accumulators
constexpr int64_t kKBlock = 256;   // k-block: 4 float32 panels x 256 = 64 KiB, in L2
constexpr int64_t kRowChunk = 96;  // rows per work item when m is large
// Up to two row tiles read 16-bit weights in place (converted in the tile, k-block in L1);
// more share one float32 conversion per k-block.
constexpr int64_t kInlineRows = 2 * kTileRows;

// Weight element types, and their exact conversion to float32.
struct F32W {
  using T = float;
  static float scalar(T v) { return v; }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load(const T* p) {
    return _mm512_loadu_ps(p);
  }
#endif
};
struct BF16W {
  using T = uint16_t;
  static float scalar(T v) { return bf16_to_f32(v); }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load(const T* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#endif
};
struct F16W {
  using T = uint16_t;
  static float scalar(T v) { return f16_to_f32(v); }
#if defined(PAGELLM_KERNELS_AVX512)
  static __m512 load(const T* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
#endif
};

// One register tile: rows [0, R) of x times panels [0, P) of w over kk in [0, kn).
// Accumulators start at 0 (`first`) or from y; bias is added after the last k-block.
template <class W>
struct TileArgs {
  const float* x;  // [R, ldx], already offset to the k-block
  int64_t ldx;
  const typename W::T* w;  // [P, ws] panels, each [kn][16], offset to the k-block
  int64_t ws;
  int64_t kn;
  bool first, last;
  const float* bias;  // [ncols] or nullptr
  float* y;           // [R, ldy]
  int64_t ldy;
  int ncols;  // valid outputs in this tile, <= P * 16
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
          acc[l] = std::fma(xv, W::scalar(wp[t * kPanel + l]), acc[l]);
      }
      for (int l = 0; l < cols; ++l)
        yr[l] = a.last && a.bias != nullptr ? acc[l] + a.bias[kPanel * p + l] : acc[l];
    }
  }
}

#if defined(PAGELLM_KERNELS_AVX512)
template <class W, int P, int R>
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
  for (int64_t t = 0; t < a.kn; ++t, w += kPanel, ++x) {
    __m512 wv[P];
    for (int p = 0; p < P; ++p)
      wv[p] = W::load(w + p * a.ws);
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

template <class W>
using TileFn = void (*)(const TileArgs<W>&);

template <class W, int P, int... Rs>
constexpr std::array<TileFn<W>, kTileRows> tile_row_table(std::integer_sequence<int, Rs...>) {
  return {&tile_avx512<W, P, Rs + 1>...};
}

template <class W>
constexpr std::array<std::array<TileFn<W>, kTileRows>, kTilePanels> kTiles = {
    tile_row_table<W, 1>(std::make_integer_sequence<int, kTileRows>{}),
    tile_row_table<W, 2>(std::make_integer_sequence<int, kTileRows>{}),
    tile_row_table<W, 3>(std::make_integer_sequence<int, kTileRows>{}),
    tile_row_table<W, 4>(std::make_integer_sequence<int, kTileRows>{})};
#endif

template <class W>
void run_tile(bool simd, int P, int R, const TileArgs<W>& a) {
#if defined(PAGELLM_KERNELS_AVX512)
  if (simd) return kTiles<W>[P - 1][R - 1](a);
#endif
  tile_portable(P, R, a);
}

// Float32 copy of panels [0, P) of a group over kk in [k0, k1): [P][k1 - k0][16].
template <class W>
void convert_panels(bool simd, const typename W::T* group, int64_t k, int P, int64_t k0, int64_t k1,
                    float* out) {
  const int64_t kn = k1 - k0;
  for (int p = 0; p < P; ++p) {
    const typename W::T* src = group + (p * k + k0) * kPanel;
    float* dst = out + p * kn * kPanel;
#if defined(PAGELLM_KERNELS_AVX512)
    if (simd) {
      for (int64_t i = 0; i < kn; ++i)
        _mm512_storeu_ps(dst + i * kPanel, W::load(src + i * kPanel));
      continue;
    }
#endif
    for (int64_t i = 0; i < kn * kPanel; ++i)
      dst[i] = W::scalar(src[i]);
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

template <class W>
void matmul_typed(const float* x, const typename W::T* packed, const float* bias, int64_t m,
                  int64_t n, int64_t k, float* y) {
  const bool simd = detail::use_simd();
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kTilePanels - 1) / kTilePanels;
  // Up to one register tile of rows: stream the weights once, straight from the packing.
  // More rows: k-blocks of the group's panels are reused by every row tile, so 16-bit
  // weights are converted once per block into a float32 scratch.
  const bool single_tile = m <= kTileRows || k == 0;
  const int64_t row_chunks = single_tile ? 1 : (m + kRowChunk - 1) / kRowChunk;
  const int64_t items = groups * row_chunks;

#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t g = item / row_chunks;
    const int64_t chunk = item % row_chunks;
    const int P = static_cast<int>(std::min<int64_t>(kTilePanels, panels - g * kTilePanels));
    const int64_t col0 = g * kTilePanels * kPanel;
    const int ncols = static_cast<int>(std::min<int64_t>(kTilePanels * kPanel, n - col0));
    const typename W::T* group = packed + col0 * k;
    const float* gbias = bias != nullptr ? bias + col0 : nullptr;

    if (single_tile) {
      const TileArgs<W> a{x, k, group, k * kPanel, k, true, true, gbias, y + col0, n, ncols};
      run_tile(simd, P, static_cast<int>(m), a);
      continue;
    }
    const int64_t r_begin = chunk * kRowChunk;
    const int64_t r_end = std::min(m, r_begin + kRowChunk);
    const int64_t rows = r_end - r_begin;
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    float* scratch = std::is_same_v<W, F32W> || m <= kInlineRows
                         ? nullptr
                         : thread_scratch(kTilePanels * kKBlock * kPanel);
    for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
      const int64_t k1 = std::min(k, k0 + kKBlock);
      if (scratch == nullptr && !std::is_same_v<W, F32W>) {
        // Few row tiles: convert in the tiles; the block stays in L1 between them.
        int64_t r0 = r_begin;
        for (int64_t t = 0; t < tiles; ++t) {
          const int R = static_cast<int>(rows / tiles + (t < rows % tiles ? 1 : 0));
          const TileArgs<W> a{
              x + r0 * k + k0, k,     group + k0 * kPanel, k * kPanel, k1 - k0, k0 == 0,
              k1 == k,         gbias, y + r0 * n + col0,   n,          ncols};
          run_tile(simd, P, R, a);
          r0 += R;
        }
        continue;
      }
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
        const int R = static_cast<int>(rows / tiles + (t < rows % tiles ? 1 : 0));
        const TileArgs<F32W> a{x + r0 * k + k0,   k, wblock, ws, k1 - k0, k0 == 0, k1 == k, gbias,
                               y + r0 * n + col0, n, ncols};
        run_tile(simd, P, R, a);
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
  const int64_t alloc = std::max<int64_t>(64, (bytes_ + 63) / 64 * 64);
  data_.reset(std::aligned_alloc(64, alloc));
  if (!data_) throw std::bad_alloc();
  auto* dst = static_cast<unsigned char*>(data_.get());
  const auto* src = static_cast<const unsigned char*>(w);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t kk = 0; kk < k; ++kk) {
      unsigned char* out = dst + ((p * k + kk) * kPanel) * esize;
      for (int l = 0; l < kPanel; ++l) {
        const int64_t j = p * kPanel + l;
        if (j < n)
          std::memcpy(out + l * esize, src + (j * k + kk) * esize, esize);
        else
          std::memset(out + l * esize, 0, esize);
      }
    }
  }
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
        acc = std::fma(x[i * k + kk], detail::load_scalar(w, w_dtype, j * k + kk), acc);
      y[i * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace pagellm::kernels::cpu
