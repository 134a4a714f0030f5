#pragma once
// Tests only (-DPAGELLM_EMULATE_AVX512): the AVX-512 forms of the kernels on a machine
// without AVX-512, their intrinsics from SIMDe's portable implementations, so that CI
// runs them against the portable path. SIMDe 0.7 lacks a few the kernels use; they are
// written here lane by lane, as the instructions define them (masked-off lanes of a load
// or store are not touched in memory).

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#define PAGELLM_KERNELS_AVX512 1

namespace pagellm::kernels::cpu::emulated {

inline simde__m512 from_lanes(const float* f) {
  return simde_mm512_loadu_ps(f);
}
inline void to_lanes(simde__m512 v, float* f) {
  simde_mm512_storeu_ps(f, v);
}
inline bool on(simde__mmask16 k, int l) {
  return (k >> l) & 1;
}

// Rounds to nearest even, as the instruction does in the default rounding mode.
inline simde__m512i cvtps_epi32(simde__m512 x) {
  float f[16];
  int32_t i[16];
  to_lanes(x, f);
  for (int l = 0; l < 16; ++l)
    i[l] = static_cast<int32_t>(std::nearbyint(f[l]));
  return simde_mm512_loadu_si512(i);
}

inline simde__m512i cvtepu16_epi32(__m256i a) {
  uint16_t h[16];
  int32_t i[16];
  std::memcpy(h, &a, sizeof h);
  for (int l = 0; l < 16; ++l)
    i[l] = h[l];
  return simde_mm512_loadu_si512(i);
}

// F16C converts each half exactly.
inline simde__m512 cvtph_ps(__m256i a) {
  float f[16];
  _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm256_castsi256_si128(a)));
  _mm256_storeu_ps(f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)));
  return from_lanes(f);
}

inline __m256i maskz_loadu_epi16(simde__mmask16 k, const void* p) {
  uint16_t h[16] = {};
  for (int l = 0; l < 16; ++l)
    if (on(k, l)) std::memcpy(&h[l], static_cast<const uint16_t*>(p) + l, 2);
  __m256i r;
  std::memcpy(&r, h, sizeof r);
  return r;
}

inline simde__m512 maskz_loadu_ps(simde__mmask16 k, const void* p) {
  float f[16] = {};
  for (int l = 0; l < 16; ++l)
    if (on(k, l)) std::memcpy(&f[l], static_cast<const float*>(p) + l, 4);
  return from_lanes(f);
}

inline void mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  float f[16];
  to_lanes(a, f);
  for (int l = 0; l < 16; ++l)
    if (on(k, l)) std::memcpy(static_cast<float*>(p) + l, &f[l], 4);
}

inline simde__m512 mask3_fmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c, simde__mmask16 k) {
  float fa[16], fb[16], fc[16];
  to_lanes(a, fa);
  to_lanes(b, fb);
  to_lanes(c, fc);
  for (int l = 0; l < 16; ++l)
    if (on(k, l)) fc[l] = std::fma(fa[l], fb[l], fc[l]);
  return from_lanes(fc);
}

// The largest lane: a tree of maxima over halves.
inline float reduce_max_ps(simde__m512 a) {
  float f[16];
  to_lanes(a, f);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l)
      f[l] = f[l + w] > f[l] ? f[l + w] : f[l];
  return f[0];
}

}  // namespace pagellm::kernels::cpu::emulated

#define _mm512_cvtps_epi32 ::pagellm::kernels::cpu::emulated::cvtps_epi32
#define _mm512_cvtepu16_epi32 ::pagellm::kernels::cpu::emulated::cvtepu16_epi32
#define _mm512_cvtph_ps ::pagellm::kernels::cpu::emulated::cvtph_ps
#define _mm256_maskz_loadu_epi16 ::pagellm::kernels::cpu::emulated::maskz_loadu_epi16
#define _mm512_maskz_loadu_ps ::pagellm::kernels::cpu::emulated::maskz_loadu_ps
#define _mm512_mask_storeu_ps ::pagellm::kernels::cpu::emulated::mask_storeu_ps
#define _mm512_mask3_fmadd_ps ::pagellm::kernels::cpu::emulated::mask3_fmadd_ps
#define _mm512_reduce_max_ps ::pagellm::kernels::cpu::emulated::reduce_max_ps
