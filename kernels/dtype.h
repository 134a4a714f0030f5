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

}  // namespace pagellm::kernels
