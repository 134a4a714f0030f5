#include "engine/kv_cache_memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "engine/tokenizer_config.h"

namespace pagellm::engine {

void KVCacheMemory::Free::operator()(unsigned char* p) const {
  std::free(p);
}

KVCacheMemory::KVCacheMemory(const ModelConfig& config, int64_t num_blocks, kernels::DType dtype)
    : num_layers_(config.num_layers),
      layer_bytes_(num_blocks * kernels::cpu::kBlockSize * config.num_kv_heads * config.head_dim *
                   kernels::dtype_size(dtype)),
      num_blocks_(num_blocks),
      dtype_(dtype),
      num_kv_heads_(static_cast<int>(config.num_kv_heads)),
      head_dim_(static_cast<int>(config.head_dim)) {
  bytes_ = 2 * layer_bytes_ * num_layers_;
  // On huge pages where the system allows it: decode reads each sequence's blocks from
  // all over the pool, and with 4 KiB pages nearly every block costs TLB walks.
  pool_.reset(static_cast<unsigned char*>(kernels::cpu::allocate_streamed(bytes_)));
  std::memset(pool_.get(), 0, static_cast<size_t>(bytes_));
}

kernels::cpu::KVCacheLayer KVCacheMemory::layer(int64_t index) const {
  if (index < 0 || index >= num_layers_)
    throw std::out_of_range("KV cache layer " + std::to_string(index) + " of " +
                            std::to_string(num_layers_));
  unsigned char* k = pool_.get() + 2 * index * layer_bytes_;
  return kernels::cpu::KVCacheLayer{k,           k + layer_bytes_, dtype_,
                                    num_blocks_, num_kv_heads_,    head_dim_};
}

int64_t kv_blocks_for_bytes(const ModelConfig& config, kernels::DType dtype, int64_t bytes) {
  return bytes / (config.kv_bytes_per_token(dtype) * kernels::cpu::kBlockSize);
}

std::string KVPoolPlan::describe() const {
  char line[320];
  std::snprintf(line, sizeof line,
                "KV cache: %s, %lld bytes per token, %lld bytes per block of 16, %lld blocks "
                "(%.2f GiB), capacity %lld tokens = %.1f sequences of the full %lld-token context",
                kernels::dtype_name(dtype), static_cast<long long>(bytes_per_token),
                static_cast<long long>(bytes_per_block), static_cast<long long>(num_blocks),
                total_bytes / double(int64_t(1) << 30), static_cast<long long>(capacity_tokens),
                full_context_sequences(), static_cast<long long>(context_length));
  return line;
}

KVPoolPlan plan_kv_pool(const ModelConfig& config, kernels::DType dtype,
                        std::optional<int64_t> num_blocks, std::optional<int64_t> bytes,
                        int64_t context_length) {
  if (num_blocks.has_value() == bytes.has_value()) {
    throw ConfigError("size the KV cache with exactly one of --num-kv-blocks and --kv-cache-bytes");
  }
  KVPoolPlan plan;
  plan.dtype = dtype;
  plan.bytes_per_token = config.kv_bytes_per_token(dtype);
  plan.bytes_per_block = plan.bytes_per_token * kernels::cpu::kBlockSize;
  plan.num_blocks = num_blocks ? *num_blocks : *bytes / plan.bytes_per_block;
  if (plan.num_blocks <= 0) {
    throw ConfigError(num_blocks ? "--num-kv-blocks must be positive"
                                 : "--kv-cache-bytes " + std::to_string(*bytes) +
                                       " holds no KV block: one block takes " +
                                       std::to_string(plan.bytes_per_block) + " bytes");
  }
  // Block ids are int32 (the page tables, the kernels).
  if (constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max();
      plan.num_blocks > kMaxBlocks) {
    throw ConfigError((num_blocks ? "--num-kv-blocks " + std::to_string(*num_blocks)
                                  : "--kv-cache-bytes " + std::to_string(*bytes) + " holds " +
                                        std::to_string(plan.num_blocks) + " KV blocks of " +
                                        std::to_string(plan.bytes_per_block) + " bytes") +
                      "; at most " + std::to_string(kMaxBlocks) + " blocks are supported");
  }
  plan.total_bytes = plan.num_blocks * plan.bytes_per_block;
  plan.capacity_tokens = plan.num_blocks * kernels::cpu::kBlockSize;
  plan.context_length = context_length > 0 ? context_length : config.context_length();
  return plan;
}

kernels::DType default_kv_dtype(const ModelConfig& config) {
  return config.dtype;
}

}  // namespace pagellm::engine
