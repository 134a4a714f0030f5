#pragma once
// A Hugging Face `config.json` of the Llama family, read into one plain struct.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace pagellm::engine {

enum class Architecture {
  kLlama,    // LlamaForCausalLM: Llama 2/3/3.1/3.2, TinyLlama, SmolLM
  kMistral,  // MistralForCausalLM: sliding-window attention
  kQwen2,    // Qwen2ForCausalLM: q/k/v projections with bias
  kQwen3,    // Qwen3ForCausalLM: RMSNorm on each q and k head
};

const char* architecture_name(Architecture a);

// rope_scaling (or rope_parameters) other than the default RoPE:
//   llama3 (Llama 3.1/3.2): frequencies below a band are divided by `factor`, those above
//     kept, those in between interpolated;
//   linear: every frequency divided by `factor` (positions interpolated);
//   yarn: frequencies past the band [beta_fast, beta_slow] rotations over
//     original_max_position_embeddings divided by `factor`, those before it kept, a linear
//     ramp between; queries and keys scaled by attention_factor (default 0.1 ln(factor) + 1).
struct RopeScaling {
  enum class Type { kLlama3, kLinear, kYarn };
  double factor = 8.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  Type type = Type::kLlama3;
  double beta_fast = 32.0;                                // yarn
  double beta_slow = 1.0;                                 // yarn
  std::optional<double> attention_factor = std::nullopt;  // yarn
  bool truncate = true;  // yarn: the band's ends rounded outward to whole dimensions
};

// The sampling parameters a model folder's generation_config.json sets, which serving
// takes as the defaults of requests that leave them out.
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;

  bool empty() const { return !temperature && !top_p && !top_k && !min_p && !repetition_penalty; }
  std::string describe() const;  // "temperature 0.6, top_p 0.9"
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int64_t head_dim = 0;      // head_dim (defaults to hidden_size / num_heads)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;              // or rope_parameters.rope_theta
  std::optional<RopeScaling> rope_scaling;  // or from rope_parameters
  int64_t max_position_embeddings = 2048;
  int64_t sliding_window = 0;  // 0: none
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2; Llama's attention_bias)
  bool qk_norm = false;         // per-head q/k RMSNorm (Qwen3)
  // torch_dtype; without one, the weights' dtype once loaded (take_weight_dtype). The KV
  // cache is kept in it.
  kernels::DType dtype = kernels::DType::kBF16;
  bool dtype_given = false;  // config.json has torch_dtype (or dtype)
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;      // eos_token_id: one id or a list
  GenerationDefaults generation_defaults;  // from generation_config.json

  // KV cache bytes for one token over all layers: 2 (K and V) x layers x KV heads x
  // head_dim x bytes per number.
  int64_t kv_bytes_per_token(kernels::DType cache_dtype) const;
  // The longest context the model serves (the default and the cap of --max-model-len):
  // max_position_embeddings, or, as vLLM reads a RoPE scaling that stretches positions,
  // original_max_position_embeddings x factor for yarn and max_position_embeddings x
  // factor for linear (llama3 configs already give the stretched length).
  int64_t context_length() const;
  // The softmax scale of attention: 1 / sqrt(head_dim), times the square of YaRN's
  // attention factor (transformers scales the cos and sin that rotate both q and k by it).
  float attention_scale() const;
};

// Parses config.json text; errors (ConfigError from tokenizer_config.h) name `origin`
// and the field: unsupported architecture, missing or ill-typed field, inconsistent
// head counts.
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin);
// config.json of `model_dir`; when the directory has a generation_config.json, its
// eos_token_id joins the stop ids and its sampling parameters fill generation_defaults.
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// RoPE inverse frequencies [head_dim / 2]: 1 / theta^(2i / head_dim), with the scaling
// applied when configured. Computed as transformers does (float32 result).
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace pagellm::engine
