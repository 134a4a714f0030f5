#include "engine/model_weights.h"

#include <set>

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

// Tensors a checkpoint may carry that the model has no use for, as vLLM skips them:
// precomputed RoPE tables, and a tied model's copy of its embeddings.
bool skippable(const std::string& name, const ModelConfig& config) {
  for (const char* table :
       {".rotary_emb.inv_freq", ".rotary_emb.cos_cached", ".rotary_emb.sin_cached"}) {
    const std::string_view t(table);
    if (name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0)
      return true;
  }
  return config.tie_word_embeddings && name == "lm_head.weight";
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& config, const SafetensorsCheckpoint& checkpoint) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = config.num_heads * config.head_dim;
  const int64_t kv_dim = config.num_kv_heads * config.head_dim;
  const int64_t ffn = config.intermediate_size;

  std::set<std::string> used;
  auto take = [&](const std::string& name, const std::vector<int64_t>& shape) -> const TensorView& {
    used.insert(name);
    return tensor(checkpoint, name, shape);
  };
  ModelWeights w;
  w.embed_tokens = take("model.embed_tokens.weight", {config.vocab_size, hidden});
  w.layers.reserve(config.num_layers);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.input_norm = take(p + "input_layernorm.weight", {hidden});
    l.q_proj = take(p + "self_attn.q_proj.weight", {q_dim, hidden});
    l.k_proj = take(p + "self_attn.k_proj.weight", {kv_dim, hidden});
    l.v_proj = take(p + "self_attn.v_proj.weight", {kv_dim, hidden});
    if (config.attention_bias) {
      l.q_bias = take(p + "self_attn.q_proj.bias", {q_dim});
      l.k_bias = take(p + "self_attn.k_proj.bias", {kv_dim});
      l.v_bias = take(p + "self_attn.v_proj.bias", {kv_dim});
    }
    if (config.qk_norm) {
      l.q_norm = take(p + "self_attn.q_norm.weight", {config.head_dim});
      l.k_norm = take(p + "self_attn.k_norm.weight", {config.head_dim});
    }
    l.o_proj = take(p + "self_attn.o_proj.weight", {hidden, q_dim});
    l.post_attention_norm = take(p + "post_attention_layernorm.weight", {hidden});
    l.gate_proj = take(p + "mlp.gate_proj.weight", {ffn, hidden});
    l.up_proj = take(p + "mlp.up_proj.weight", {ffn, hidden});
    l.down_proj = take(p + "mlp.down_proj.weight", {hidden, ffn});
    w.layers.push_back(std::move(l));
  }
  w.final_norm = take("model.norm.weight", {hidden});
  // Tied checkpoints usually omit lm_head.weight; some still carry a copy.
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    w.lm_head = take("lm_head.weight", {config.vocab_size, hidden});
  }

  // What the model would leave unused means config.json does not describe this
  // checkpoint (a layer more than num_hidden_layers, biases the architecture has none
  // of): refused, as vLLM refuses it, rather than served without them.
  std::vector<std::string> unused;
  for (const auto& [name, view] : checkpoint.tensors()) {
    if (!used.count(name) && !skippable(name, config)) unused.push_back(name);
  }
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i)
      list += (i ? ", '" : "'") + unused[i] + "'";
    if (unused.size() > 5) list += ", ...";
    throw ConfigError(checkpoint.description() + ": " + std::to_string(unused.size()) +
                      (unused.size() == 1 ? " tensor is" : " tensors are") +
                      " not part of the model config.json describes: " + list);
  }
  return w;
}

void take_weight_dtype(ModelConfig& config, const ModelWeights& weights) {
  if (!config.dtype_given) config.dtype = weights.embed_tokens.dtype;
}

}  // namespace pagellm::engine
