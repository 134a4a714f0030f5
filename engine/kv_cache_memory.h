#pragma once
// The KV tensors on the CPU: for every layer, K and V as [num_blocks, 16, kv_heads,
// head_dim] in the cache dtype. paging/ hands out block ids; this is what they index.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  kernels::DType dtype() const { return dtype_; }
  // Bytes of all layers' K and V: num_blocks x 16 x kv_bytes_per_token (on huge pages the
  // allocation rounds this up to a whole 2 MiB page).
  int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const;
  };
  // One allocation for every layer's K then V: on huge pages, its size is rounded up to
  // a 2 MiB page once, not once per tensor.
  std::unique_ptr<unsigned char, Free> pool_;
  int64_t num_layers_ = 0;
  int64_t layer_bytes_ = 0;  // one K (or V) tensor
  int64_t num_blocks_ = 0;
  int64_t bytes_ = 0;
  kernels::DType dtype_;
  int num_kv_heads_ = 0;
  int head_dim_ = 0;
};

// How the KV pool is sized, in the terms an operator plans with. The daemon logs
// describe() at start.
struct KVPoolPlan {
  kernels::DType dtype = kernels::DType::kBF16;
  int64_t bytes_per_token = 0;  // 2 x layers x KV heads x head_dim x bytes per number
  int64_t bytes_per_block = 0;  // x 16 tokens
  int64_t num_blocks = 0;
  int64_t total_bytes = 0;
  int64_t capacity_tokens = 0;
  int64_t context_length = 0;  // max_model_len: the model's context_length() unless capped
  // How many sequences of a full context window fit at once.
  double full_context_sequences() const {
    return context_length > 0 ? double(capacity_tokens) / context_length : 0.0;
  }
  std::string describe() const;
};

// Sizes the pool from a block count or a byte budget (exactly one of them, > 0).
// Throws ConfigError when neither or both are given, or the budget holds no block.
// `context_length` (the served max_model_len; <= 0 for the model's context_length()) is what
// full_context_sequences() counts in.
KVPoolPlan plan_kv_pool(const ModelConfig& config, kernels::DType dtype,
                        std::optional<int64_t> num_blocks, std::optional<int64_t> bytes,
                        int64_t context_length = 0);

// Blocks that fit in `bytes` of KV memory.
int64_t kv_blocks_for_bytes(const ModelConfig& config, kernels::DType dtype, int64_t bytes);

// The cache dtype for a model: its own 16-bit format, float32 for float32 models.
kernels::DType default_kv_dtype(const ModelConfig& config);

}  // namespace pagellm::engine
