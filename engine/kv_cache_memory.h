#pragma once
// The KV tensors on the CPU: for every layer, K and V as [num_blocks, 16, kv_heads,
// head_dim] in the cache dtype. paging/ hands out block ids; this is what they index.

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model_config.h"
#include "kernels/cpu/kernels.h"

namespace pagellm::engine {

class KVCacheMemory {
 public:
  // Allocates (and zeroes) the whole pool at once. Throws std::bad_alloc when it
  // cannot, before anything is served.
  KVCacheMemory(const ModelConfig& config, int64_t num_blocks, kernels::DType dtype);

  kernels::cpu::KVCacheLayer layer(int64_t index) const;
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  kernels::DType dtype() const { return dtype_; }
  // Bytes allocated for all layers: num_blocks x 16 x kv_bytes_per_token.
  int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  struct Layer {
    std::unique_ptr<void, Free> k, v;
  };
  std::vector<Layer> layers_;
  int64_t num_blocks_ = 0;
  int64_t bytes_ = 0;
  kernels::DType dtype_;
  int num_kv_heads_ = 0;
  int head_dim_ = 0;
};

// Blocks that fit in `bytes` of KV memory.
int64_t kv_blocks_for_bytes(const ModelConfig& config, kernels::DType dtype, int64_t bytes);

// The cache dtype for a model: its own 16-bit format, float32 for float32 models.
kernels::DType default_kv_dtype(const ModelConfig& config);

}  // namespace pagellm::engine
