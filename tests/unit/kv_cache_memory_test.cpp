#include "engine/kv_cache_memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

ModelConfig bench_shape() {
  ModelConfig config;  // the bench demo model: 12 layers, 4 KV heads of 64
  config.num_layers = 12;
  config.num_kv_heads = 4;
  config.head_dim = 64;
  config.max_position_embeddings = 2048;
  return config;
}

TEST(KVCacheMemory, AllocationMatchesTheFormula) {
  const ModelConfig config = bench_shape();
  // 2 (K and V) x 12 layers x 4 KV heads x 64 dims x 2 bytes = 12,288 bytes per token.
  EXPECT_EQ(config.kv_bytes_per_token(kernels::DType::kBF16), 2 * 12 * 4 * 64 * 2);
  EXPECT_EQ(config.kv_bytes_per_token(kernels::DType::kF32), 2 * 12 * 4 * 64 * 4);
  KVCacheMemory memory(config, 100, kernels::DType::kBF16);
  EXPECT_EQ(memory.bytes(), 100 * 16 * 12288);
  const kernels::cpu::KVCacheLayer last = memory.layer(11);
  EXPECT_EQ(last.num_blocks, 100);
  EXPECT_EQ(last.num_kv_heads, 4);
  EXPECT_EQ(last.head_dim, 64);
  EXPECT_NE(last.k, last.v);
  EXPECT_THROW(memory.layer(12), std::out_of_range);
  EXPECT_THROW(memory.layer(-1), std::out_of_range);
}

// Every layer's K and V are disjoint, zeroed, and together span exactly bytes().
TEST(KVCacheMemory, LayersTileThePoolWithoutOverlap) {
  const ModelConfig config = bench_shape();
  KVCacheMemory memory(config, 7, kernels::DType::kBF16);
  const int64_t tensor = 7 * 16 * 4 * 64 * 2;
  std::vector<std::pair<const unsigned char*, const unsigned char*>> spans;
  for (int64_t l = 0; l < memory.num_layers(); ++l) {
    const kernels::cpu::KVCacheLayer layer = memory.layer(l);
    for (void* t : {layer.k, layer.v}) {
      const auto* p = static_cast<const unsigned char*>(t);
      EXPECT_TRUE(std::all_of(p, p + tensor, [](unsigned char b) { return b == 0; }));
      std::fill(static_cast<unsigned char*>(t), static_cast<unsigned char*>(t) + tensor, 1);
      spans.emplace_back(p, p + tensor);
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].second, spans[i].first);
  EXPECT_EQ(spans.back().second - spans.front().first, memory.bytes());
}

TEST(KVPoolPlan, FromBlocksOrBytes) {
  const ModelConfig config = bench_shape();
  const KVPoolPlan by_blocks = plan_kv_pool(config, kernels::DType::kBF16, 1024, std::nullopt);
  EXPECT_EQ(by_blocks.bytes_per_token, 12288);
  EXPECT_EQ(by_blocks.bytes_per_block, 12288 * 16);
  EXPECT_EQ(by_blocks.total_bytes, 1024 * 12288 * 16);
  EXPECT_EQ(by_blocks.capacity_tokens, 16384);
  EXPECT_DOUBLE_EQ(by_blocks.full_context_sequences(), 8.0);
  EXPECT_NE(by_blocks.describe().find("12288 bytes per token"), std::string::npos)
      << by_blocks.describe();

  const KVPoolPlan by_bytes =
      plan_kv_pool(config, kernels::DType::kBF16, std::nullopt, int64_t(1) << 30);
  EXPECT_EQ(by_bytes.num_blocks, (int64_t(1) << 30) / (12288 * 16));  // 5461
  EXPECT_LE(by_bytes.total_bytes, int64_t(1) << 30);
}

// With --max-model-len below the model's context, full-context sequences count in it.
TEST(KVPoolPlan, FullContextIsTheServedContext) {
  const ModelConfig config = bench_shape();
  const KVPoolPlan plan = plan_kv_pool(config, kernels::DType::kBF16, 1024, std::nullopt, 512);
  EXPECT_EQ(plan.context_length, 512);
  EXPECT_DOUBLE_EQ(plan.full_context_sequences(), 32.0);
  EXPECT_NE(plan.describe().find("32.0 sequences of the full 512-token context"), std::string::npos)
      << plan.describe();
  EXPECT_EQ(plan_kv_pool(config, kernels::DType::kBF16, 1024, std::nullopt, 0).context_length,
            config.max_position_embeddings);
}

TEST(KVPoolPlan, RejectsImpossibleSizes) {
  const ModelConfig config = bench_shape();
  EXPECT_THROW(plan_kv_pool(config, kernels::DType::kBF16, std::nullopt, std::nullopt),
               ConfigError);
  EXPECT_THROW(plan_kv_pool(config, kernels::DType::kBF16, 10, 1000), ConfigError);
  EXPECT_THROW(plan_kv_pool(config, kernels::DType::kBF16, 0, std::nullopt), ConfigError);
  EXPECT_THROW(plan_kv_pool(config, kernels::DType::kBF16, std::nullopt, 1000), ConfigError);
}

}  // namespace
}  // namespace pagellm::engine
