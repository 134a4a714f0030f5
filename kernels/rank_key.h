#pragma once
// The ranking every cut of the top-k / top-p / min-p samplers follows, on the CPU
// (kernels/cpu/sampling.cpp) and on the device (kernels/cuda/block_sampler.h): larger
// weight first, lower token id first on ties, as the ascending order of one 64-bit key
// per token (weights are non-negative floats, so their bit patterns order like their
// values).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PAGELLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PAGELLM_HOST_DEVICE inline
#endif

namespace pagellm::kernels {

PAGELLM_HOST_DEVICE uint32_t float_bits(float w) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(w);
#else
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof bits);
  return bits;
#endif
}

PAGELLM_HOST_DEVICE uint64_t rank_key(float w, int64_t id) {
  return (static_cast<uint64_t>(~float_bits(w)) << 32) | static_cast<uint32_t>(id);
}
PAGELLM_HOST_DEVICE int32_t id_of(uint64_t key) {
  return static_cast<int32_t>(static_cast<uint32_t>(key));
}
PAGELLM_HOST_DEVICE float weight_of(uint64_t key) {
  const uint32_t bits = ~static_cast<uint32_t>(key >> 32);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float w;
  std::memcpy(&w, &bits, sizeof w);
  return w;
#endif
}

}  // namespace pagellm::kernels
