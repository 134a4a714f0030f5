#include "engine/kv_cache_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace pagellm::engine {

void KVCacheMemory::Free::operator()(void* p) const {
  std::free(p);
}

KVCacheMemory::KVCacheMemory(const ModelConfig& config, int64_t num_blocks, kernels::DType dtype)
    : num_blocks_(num_blocks),
      dtype_(dtype),
      num_kv_heads_(static_cast<int>(config.num_kv_heads)),
      head_dim_(static_cast<int>(config.head_dim)) {
  const int64_t per_layer = num_blocks * kernels::cpu::kBlockSize * config.num_kv_heads *
                            config.head_dim * kernels::dtype_size(dtype);
  // aligned_alloc wants a size that is a multiple of the alignment.
  const int64_t rounded = (per_layer + 63) / 64 * 64;
  layers_.resize(config.num_layers);
  for (Layer& layer : layers_) {
    for (auto* half : {&layer.k, &layer.v}) {
      void* p = std::aligned_alloc(64, static_cast<size_t>(rounded));
      if (p == nullptr) throw std::bad_alloc();
      std::memset(p, 0, static_cast<size_t>(rounded));
      half->reset(p);
    }
  }
  bytes_ = 2 * per_layer * config.num_layers;
}

kernels::cpu::KVCacheLayer KVCacheMemory::layer(int64_t index) const {
  const Layer& l = layers_.at(index);
  return kernels::cpu::KVCacheLayer{l.k.get(),   l.v.get(),     dtype_,
                                    num_blocks_, num_kv_heads_, head_dim_};
}

int64_t kv_blocks_for_bytes(const ModelConfig& config, kernels::DType dtype, int64_t bytes) {
  return bytes / (config.kv_bytes_per_token(dtype) * kernels::cpu::kBlockSize);
}

kernels::DType default_kv_dtype(const ModelConfig& config) {
  return config.dtype;
}

}  // namespace pagellm::engine
