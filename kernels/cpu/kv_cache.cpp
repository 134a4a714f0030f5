// Writes into and copies within the paged KV cache.

#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace detail {

// With the exact round-to-nearest-even conversions of dtype.h (which keep subnormals,
// unlike vcvtneps2bf16).
void store_row(const float* src, int64_t count, DType t, void* dst) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i)
        out[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i)
        out[i] = f32_to_f16(src[i]);
      return;
    }
  }
}

}  // namespace detail

using detail::store_row;

void write_kv(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
              const KVCacheLayer& cache) {
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  const int64_t row_bytes = row * dtype_size(cache.dtype);
  const int64_t num_slots = cache.num_blocks * kBlockSize;
#pragma omp parallel for schedule(static) if (num_tokens > 1)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue;
    store_row(k + t * row, row, cache.dtype, static_cast<char*>(cache.k) + slot * row_bytes);
    store_row(v + t * row, row, cache.dtype, static_cast<char*>(cache.v) + slot * row_bytes);
  }
}

void rope_write_kv(const float* qkv, const int32_t* positions, const int64_t* slots,
                   int64_t num_tokens, int num_q_heads, const float* inv_freq, float* q,
                   const KVCacheLayer& cache) {
  const int D = cache.head_dim, half = D / 2;
  const int64_t qd = int64_t(num_q_heads) * D, kvd = int64_t(cache.num_kv_heads) * D;
  const int64_t row_bytes = kvd * dtype_size(cache.dtype);
  const int64_t num_slots = cache.num_blocks * kBlockSize;
#pragma omp parallel if (num_tokens > 1)
  {
    std::vector<float> cos_t(half), sin_t(half), k(kvd);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* row = qkv + t * (qd + 2 * kvd);
      detail::rope_angles(positions[t], inv_freq, half, cos_t.data(), sin_t.data());
      float* qt = q + t * qd;
      std::memcpy(qt, row, qd * sizeof(float));
      for (int h = 0; h < num_q_heads; ++h)
        detail::rope_rotate(qt + int64_t(h) * D, cos_t.data(), sin_t.data(), half);
      const int64_t slot = slots[t];
      if (slot < 0 || slot >= num_slots) continue;
      std::memcpy(k.data(), row + qd, kvd * sizeof(float));
      for (int h = 0; h < cache.num_kv_heads; ++h)
        detail::rope_rotate(k.data() + int64_t(h) * D, cos_t.data(), sin_t.data(), half);
      store_row(k.data(), kvd, cache.dtype, static_cast<char*>(cache.k) + slot * row_bytes);
      store_row(row + qd + kvd, kvd, cache.dtype, static_cast<char*>(cache.v) + slot * row_bytes);
    }
  }
}

void copy_blocks(const KVCacheLayer& cache, const int32_t* src, const int32_t* dst,
                 int64_t num_copies) {
  const int64_t block_bytes = static_cast<int64_t>(kBlockSize) * cache.num_kv_heads *
                              cache.head_dim * dtype_size(cache.dtype);
  for (int64_t i = 0; i < num_copies; ++i) {
    for (void* base : {cache.k, cache.v}) {
      char* b = static_cast<char*>(base);
      std::memmove(b + dst[i] * block_bytes, b + src[i] * block_bytes, block_bytes);
    }
  }
}

}  // namespace pagellm::kernels::cpu
