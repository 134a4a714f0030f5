#pragma once
// The Llama-family forward pass (Llama, Mistral, Qwen2, Qwen3) on the CPU, over a batch
// of sequences whose attention reads and writes the paged KV cache.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/kv_cache_memory.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "kernels/cpu/kernels.h"

namespace pagellm::engine {

// One step's work, flattened: the new tokens of every scheduled sequence, in order.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int64_t> slots;         // [num_tokens] KV slot of each new token
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> context_lens;  // [num_seqs] cached tokens after this step
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;  // token rows whose next-token logits are wanted
  std::vector<int32_t> copy_src;    // blocks to copy before the pass (copy-on-write)
  std::vector<int32_t> copy_dst;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
};

class LlamaModel {
 public:
  // Reads config.json and the safetensors checkpoint of `model_dir`, checks every
  // tensor, and repacks the projection weights for the CPU matmul (16-bit stays 16-bit).
  static std::unique_ptr<LlamaModel> load(const std::filesystem::path& model_dir);

  const ModelConfig& config() const { return config_; }
  // Bytes of weights the forward pass reads per step (packed projections, lm_head).
  int64_t weight_bytes_per_step() const { return weight_bytes_; }

  // Runs the batch through every layer, writing its K/V into `cache`, and returns the
  // logits of the requested rows: [logit_rows.size(), vocab].
  void forward(const ForwardBatch& batch, KVCacheMemory& cache, std::vector<float>& logits);

 private:
  struct Layer {
    // qkv (q|k|v outputs) and gate_up (gate|up) when the parts can be fused; otherwise
    // (n() == 0) the separate weights.
    kernels::cpu::PackedWeight qkv, gate_up;
    kernels::cpu::PackedWeight q, k, v, o, gate, up, down;
    std::vector<float> qkv_bias, q_bias, k_bias, v_bias;  // empty without attention bias
    TensorView input_norm, post_attention_norm;
    std::optional<TensorView> q_norm, k_norm;
  };

  LlamaModel(ModelConfig config, SafetensorsCheckpoint checkpoint);

  ModelConfig config_;
  SafetensorsCheckpoint checkpoint_;  // keeps the mapping of embeddings and norms alive
  TensorView embed_tokens_, final_norm_;
  std::vector<Layer> layers_;
  kernels::cpu::PackedWeight lm_head_;
  std::vector<float> inv_freq_;
  int64_t weight_bytes_ = 0;

  // Activations, reused across steps.
  std::vector<float> hidden_, normed_, q_, k_, v_, qkv_, attn_, proj_, gate_, up_, gate_up_, rows_;
};

}  // namespace pagellm::engine
