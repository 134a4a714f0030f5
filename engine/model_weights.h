#pragma once
// The weights of a Llama-family model, by role, checked against its config: every
// tensor present with the shape the config implies. Views into the checkpoint mapping.

#include <optional>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace pagellm::engine {

struct LayerWeights {
  TensorView input_norm;                             // [hidden]
  TensorView q_proj;                                 // [heads * head_dim, hidden]
  TensorView k_proj;                                 // [kv_heads * head_dim, hidden]
  TensorView v_proj;                                 // [kv_heads * head_dim, hidden]
  std::optional<TensorView> q_bias, k_bias, v_bias;  // [out] when attention_bias
  std::optional<TensorView> q_norm, k_norm;          // [head_dim] when qk_norm
  TensorView o_proj;                                 // [hidden, heads * head_dim]
  TensorView post_attention_norm;                    // [hidden]
  TensorView gate_proj;                              // [intermediate, hidden]
  TensorView up_proj;                                // [intermediate, hidden]
  TensorView down_proj;                              // [hidden, intermediate]
};

struct ModelWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden]; the embedding when tied
};

// Hugging Face names (model.layers.N.self_attn.q_proj.weight, ...). Throws ConfigError
// naming the file, tensor and expected shape for anything missing or mis-shaped.
ModelWeights bind_weights(const ModelConfig& config, const SafetensorsCheckpoint& checkpoint);

// A config.json without torch_dtype takes the dtype its weights are stored in (the
// embedding's), so that a bf16 checkpoint gets a bf16 KV cache rather than float32.
void take_weight_dtype(ModelConfig& config, const ModelWeights& weights);

}  // namespace pagellm::engine
