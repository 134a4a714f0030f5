#pragma once
// The Llama-family forward pass (Llama, Mistral, Qwen2, Qwen3) on the CPU, over a batch
// of sequences whose attention reads and writes the paged KV cache.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/forward_batch.h"
#include "engine/kv_cache_memory.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "kernels/cpu/kernels.h"

namespace pagellm::engine {

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
