#pragma once
// Writes a complete Hugging Face model directory with random weights: config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json and generation_config.json,
// in exactly the layout transformers would save. Used to serve, test and benchmark
// without downloading a model.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "engine/model_config.h"
#include "kernels/dtype.h"

namespace pagellm::engine {

struct DemoModelSpec {
  Architecture architecture = Architecture::kLlama;
  int64_t vocab_size = 512;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 500000.0;
  double rms_norm_eps = 1e-5;
  std::optional<RopeScaling> rope_scaling;  // Llama only
  // Mistral: its sliding_window (0 writes null). Qwen2/Qwen3: use_sliding_window on
  // every layer. Llama: must be 0.
  int64_t sliding_window = 0;
  bool tie_word_embeddings = false;
  kernels::DType dtype = kernels::DType::kBF16;
  uint64_t seed = 0;
};

// Presets: "tiny" (tests: 2 layers, hidden 64, vocab 512), "small" (the default demo:
// 4 layers, hidden 256, vocab 4096), "bench" (12 layers, hidden 768, 12 query and 4 KV
// heads of 64, FFN 2048, vocab 32000, untied: 124,668,672 parameters). Each
// architecture gets its usual rope_theta and norm epsilon; Mistral a small sliding
// window. Throws std::invalid_argument for an unknown name.
DemoModelSpec demo_model_preset(std::string_view preset,
                                Architecture architecture = Architecture::kLlama);
std::optional<Architecture> parse_architecture_name(std::string_view name);  // "llama", ...

// Parameters the checkpoint will hold (every tensor's elements).
int64_t demo_model_num_parameters(const DemoModelSpec& spec);

// Writes the directory (created if needed; the files named above are replaced). Each
// file is written under a temporary name and renamed, config.json last, so a directory
// with a config.json is complete. Deterministic: the same spec gives the same bytes.
// Throws std::invalid_argument for an inconsistent spec, ConfigError for I/O failures.
void write_demo_model(const std::filesystem::path& dir, const DemoModelSpec& spec);

}  // namespace pagellm::engine
