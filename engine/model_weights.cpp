#include "engine/model_weights.h"

#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

// A missing tensor's message carries the expected shape too, to tell a truncated or
// foreign checkpoint from a config mismatch.
const TensorView& tensor(const SafetensorsCheckpoint& checkpoint, const std::string& name,
                         const std::vector<int64_t>& shape) {
  if (!checkpoint.contains(name)) {
    throw ConfigError(checkpoint.description() + ": tensor '" + name +
                      "' is missing (expected shape " + shape_string(shape) + ")");
  }
  return checkpoint.get(name, shape);
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& config, const SafetensorsCheckpoint& checkpoint) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = config.num_heads * config.head_dim;
  const int64_t kv_dim = config.num_kv_heads * config.head_dim;
  const int64_t ffn = config.intermediate_size;

  ModelWeights w;
  w.embed_tokens = tensor(checkpoint, "model.embed_tokens.weight", {config.vocab_size, hidden});
  w.layers.reserve(config.num_layers);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.input_norm = tensor(checkpoint, p + "input_layernorm.weight", {hidden});
    l.q_proj = tensor(checkpoint, p + "self_attn.q_proj.weight", {q_dim, hidden});
    l.k_proj = tensor(checkpoint, p + "self_attn.k_proj.weight", {kv_dim, hidden});
    l.v_proj = tensor(checkpoint, p + "self_attn.v_proj.weight", {kv_dim, hidden});
    if (config.attention_bias) {
      l.q_bias = tensor(checkpoint, p + "self_attn.q_proj.bias", {q_dim});
      l.k_bias = tensor(checkpoint, p + "self_attn.k_proj.bias", {kv_dim});
      l.v_bias = tensor(checkpoint, p + "self_attn.v_proj.bias", {kv_dim});
    }
    if (config.qk_norm) {
      l.q_norm = tensor(checkpoint, p + "self_attn.q_norm.weight", {config.head_dim});
      l.k_norm = tensor(checkpoint, p + "self_attn.k_norm.weight", {config.head_dim});
    }
    l.o_proj = tensor(checkpoint, p + "self_attn.o_proj.weight", {hidden, q_dim});
    l.post_attention_norm = tensor(checkpoint, p + "post_attention_layernorm.weight", {hidden});
    l.gate_proj = tensor(checkpoint, p + "mlp.gate_proj.weight", {ffn, hidden});
    l.up_proj = tensor(checkpoint, p + "mlp.up_proj.weight", {ffn, hidden});
    l.down_proj = tensor(checkpoint, p + "mlp.down_proj.weight", {hidden, ffn});
    w.layers.push_back(std::move(l));
  }
  w.final_norm = tensor(checkpoint, "model.norm.weight", {hidden});
  // Tied checkpoints usually omit lm_head.weight; some still carry a copy.
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    w.lm_head = tensor(checkpoint, "lm_head.weight", {config.vocab_size, hidden});
  }
  return w;
}

void take_weight_dtype(ModelConfig& config, const ModelWeights& weights) {
  if (!config.dtype_given) config.dtype = weights.embed_tokens.dtype;
}

}  // namespace pagellm::engine
