#pragma once
// Number formats of weights and KV caches, and exact conversions between them.

#include <cstdint>
#include <cstring>

namespace pagellm::kernels {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr int64_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
const char* dtype_name(DType t);

inline float bf16_to_f32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);  // round to nearest even

// Element i of an array of `t` values, as float32 (exact).
inline float load_f32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// Stores v as element i of an array of `t` values (round to nearest even).
inline void store_f32(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = f32_to_f16(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = f32_to_bf16(v);
      break;
  }
}

}  // namespace pagellm::kernels
