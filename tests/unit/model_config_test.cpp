#include "engine/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>

#include "engine/tokenizer_config.h"
#include "support/temp_model.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// config.json of meta-llama/Llama-3.1-8B-Instruct.
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// TinyLlama/TinyLlama-1.1B-Chat-v1.0.
constexpr const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// mistralai/Mistral-7B-v0.1.
constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Qwen/Qwen2.5-0.5B: the sliding window is configured but switched off.
constexpr const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3-0.6B: head_dim 128 although hidden_size / heads is 64; rope_theta an int.
constexpr const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

ModelConfig parse(const std::string& text) {
  return parse_model_config(text, "test/config.json");
}

// The snippet with one field replaced (or removed, with a null json and remove=true).
std::string edited(const char* base, const std::string& key, const json& value,
                   bool remove = false) {
  json j = json::parse(base);
  if (remove) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return j.dump();
}

// Message of the ConfigError that parsing `text` throws ("" if none).
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, Llama31WithLlama3RopeScaling) {
  const ModelConfig c = parse(kLlama31_8B);
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_STREQ(architecture_name(c.architecture), "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.dtype, kernels::DType::kBF16);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  // 2 x 32 layers x 8 KV heads x 128 x 2 bytes: the well-known 128 KiB per token.
  EXPECT_EQ(c.kv_bytes_per_token(kernels::DType::kBF16), 131072);
  EXPECT_EQ(c.kv_bytes_per_token(kernels::DType::kF32), 262144);
}

TEST(ModelConfig, TinyLlama) {
  const ModelConfig c = parse(kTinyLlama);
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 22);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 64);  // 2048 / 32
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
}

TEST(ModelConfig, Mistral7BHasSlidingWindow) {
  const ModelConfig c = parse(kMistral7B);
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  // v0.2 and later write null: no window. MistralConfig defaults to 4096 when absent.
  EXPECT_EQ(parse(edited(kMistral7B, "sliding_window", nullptr)).sliding_window, 0);
  EXPECT_EQ(parse(edited(kMistral7B, "sliding_window", nullptr, true)).sliding_window, 4096);
}

TEST(ModelConfig, Qwen25HasBiasesTiedEmbeddingsAndNoWindow) {
  const ModelConfig c = parse(kQwen25_05B);
  EXPECT_EQ(c.architecture, Architecture::kQwen2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151643}));
}

TEST(ModelConfig, QwenSlidingWindowFollowsMaxWindowLayers) {
  json j = json::parse(kQwen25_05B);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 0;  // every layer slides
  EXPECT_EQ(parse(j.dump()).sliding_window, 4096);
  j["max_window_layers"] = 24;  // no layer does
  EXPECT_EQ(parse(j.dump()).sliding_window, 0);
  j["max_window_layers"] = 12;  // a mix: not supported, and said so
  EXPECT_THAT(error_of(j.dump()),
              AllOf(HasSubstr("test/config.json"), HasSubstr("max_window_layers")));
  // A null window is none, in every layer (transformers reads it as None).
  j["max_window_layers"] = 0;
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse(j.dump()).sliding_window, 0);
  j.erase("sliding_window");  // absent: transformers' default of 4096
  EXPECT_EQ(parse(j.dump()).sliding_window, 4096);
}

// layer_types, when given, says which layers slide, whatever max_window_layers says.
TEST(ModelConfig, QwenLayerTypesOverrideMaxWindowLayers) {
  json j = json::parse(kQwen25_05B);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 32;
  j["max_window_layers"] = 24;  // alone, no layer would slide
  j["layer_types"] = json(std::vector<std::string>(24, "sliding_attention"));
  EXPECT_EQ(parse(j.dump()).sliding_window, 32);
  j["max_window_layers"] = 0;  // alone, every layer would slide
  j["layer_types"] = json(std::vector<std::string>(24, "full_attention"));
  EXPECT_EQ(parse(j.dump()).sliding_window, 0);
  j["layer_types"][3] = "sliding_attention";
  EXPECT_THAT(error_of(j.dump()), HasSubstr("layer_types"));
  j["layer_types"] = json(std::vector<std::string>(23, "full_attention"));
  EXPECT_THAT(error_of(j.dump()), HasSubstr("one type for each of the 24 layers"));
  j["layer_types"] = json(std::vector<std::string>(24, "chunked_attention"));
  EXPECT_THAT(error_of(j.dump()), HasSubstr("chunked_attention"));
  // Without use_sliding_window, nothing slides.
  j["use_sliding_window"] = false;
  EXPECT_EQ(parse(j.dump()).sliding_window, 0);
}

TEST(ModelConfig, Qwen3HeadDimFromConfigAndQkNorm) {
  const ModelConfig c = parse(kQwen3_06B);
  EXPECT_EQ(c.architecture, Architecture::kQwen3);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads * c.head_dim, 2048);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // written as an integer
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  // Qwen3Config's default head_dim is 128, not hidden / heads.
  EXPECT_EQ(parse(edited(kQwen3_06B, "head_dim", nullptr, true)).head_dim, 128);
}

TEST(ModelConfig, DefaultsAsTransformers) {
  json j = json::parse(kTinyLlama);
  for (const char* key :
       {"num_key_value_heads", "rms_norm_eps", "rope_theta", "torch_dtype", "tie_word_embeddings",
        "max_position_embeddings", "bos_token_id", "eos_token_id", "rope_scaling", "hidden_act"}) {
    j.erase(key);
  }
  const ModelConfig c = parse(j.dump());
  EXPECT_EQ(c.num_kv_heads, 32);  // = num_attention_heads
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.dtype, kernels::DType::kF32);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfig, ArchitectureFromModelTypeAndDtypeSpellings) {
  json j = json::parse(kMistral7B);
  j.erase("architectures");
  EXPECT_EQ(parse(j.dump()).architecture, Architecture::kMistral);
  EXPECT_EQ(parse(edited(kTinyLlama, "torch_dtype", "float16")).dtype, kernels::DType::kF16);
  EXPECT_EQ(parse(edited(kTinyLlama, "torch_dtype", "float32")).dtype, kernels::DType::kF32);
  // transformers >= 4.56 writes "dtype".
  json newer = json::parse(kTinyLlama);
  newer.erase("torch_dtype");
  newer["dtype"] = "float16";
  EXPECT_EQ(parse(newer.dump()).dtype, kernels::DType::kF16);
}

TEST(ModelConfig, RopeScalingAcceptsTypeKeyAndDefault) {
  json j = json::parse(kLlama31_8B);
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  EXPECT_TRUE(parse(j.dump()).rope_scaling.has_value());
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(parse(j.dump()).rope_scaling.has_value());
}

// transformers 5 writes rope_theta and the scaling into one rope_parameters object.
TEST(ModelConfig, RopeParametersAsTransformers5WritesThem) {
  json j = json::parse(kLlama31_8B);
  json params = j["rope_scaling"];
  params["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = params;
  const ModelConfig c = parse(j.dump());
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(parse(kLlama31_8B)));

  json plain = json::parse(kTinyLlama);
  plain.erase("rope_theta");
  plain["rope_parameters"] = {{"rope_theta", 250000.0}, {"rope_type", "default"}};
  EXPECT_DOUBLE_EQ(parse(plain.dump()).rope_theta, 250000.0);
  EXPECT_FALSE(parse(plain.dump()).rope_scaling.has_value());
  plain["rope_parameters"] = {{"rope_theta", 250000.0}};  // no rope_type: default
  EXPECT_DOUBLE_EQ(parse(plain.dump()).rope_theta, 250000.0);
  EXPECT_FALSE(parse(plain.dump()).rope_scaling.has_value());

  plain["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "yarn"}, {"factor", 4}};
  EXPECT_EQ(parse(plain.dump()).rope_scaling->type, RopeScaling::Type::kYarn);
  plain["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "longrope"}, {"factor", 4}};
  EXPECT_THAT(error_of(plain.dump()),
              AllOf(HasSubstr("'rope_parameters.rope_type'"), HasSubstr("longrope")));
  plain["rope_parameters"] = {{"rope_theta", 1e6}, {"partial_rotary_factor", 0.5}};
  EXPECT_THAT(error_of(plain.dump()), HasSubstr("'rope_parameters.partial_rotary_factor'"));
  plain["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e6}}},
                              {"sliding_attention", {{"rope_theta", 1e4}}}};
  EXPECT_THAT(error_of(plain.dump()),
              AllOf(HasSubstr("'rope_parameters'"), HasSubstr("per layer type")));
  plain["rope_parameters"] = {{"rope_theta", -1.0}};
  EXPECT_THAT(error_of(plain.dump()), HasSubstr("'rope_parameters.rope_theta'"));
  plain["rope_parameters"] = 7;
  EXPECT_THAT(error_of(plain.dump()), HasSubstr("'rope_parameters'"));
}

TEST(ModelConfig, ErrorsNameTheFileAndTheField) {
  EXPECT_THAT(error_of(edited(kTinyLlama, "architectures", json::array({"GPT2LMHeadModel"}))),
              AllOf(HasSubstr("test/config.json"), HasSubstr("'architectures'"),
                    HasSubstr("GPT2LMHeadModel")));
  EXPECT_THAT(
      error_of(edited(kTinyLlama, "hidden_size", nullptr, true)),
      AllOf(HasSubstr("test/config.json"), HasSubstr("'hidden_size'"), HasSubstr("missing")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "num_attention_heads", "32")),
              AllOf(HasSubstr("test/config.json"), HasSubstr("'num_attention_heads'"),
                    HasSubstr("integer")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "rms_norm_eps", "small")),
              AllOf(HasSubstr("'rms_norm_eps'"), HasSubstr("number")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "tie_word_embeddings", 1)),
              AllOf(HasSubstr("'tie_word_embeddings'"), HasSubstr("boolean")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "torch_dtype", "int8")),
              AllOf(HasSubstr("'torch_dtype'"), HasSubstr("int8")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "num_key_value_heads", 5)),
              AllOf(HasSubstr("'num_key_value_heads'"), HasSubstr("divide")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "eos_token_id", json::array({2, "x"}))),
              AllOf(HasSubstr("'eos_token_id'"), HasSubstr("integer")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "eos_token_id", 32000)),
              AllOf(HasSubstr("'eos_token_id'"), HasSubstr("outside the vocabulary")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "hidden_act", "gelu")),
              AllOf(HasSubstr("'hidden_act'"), HasSubstr("gelu")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "attention_bias", true)), HasSubstr("'attention_bias'"));
  EXPECT_THAT(
      error_of(edited(kLlama31_8B, "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4}})),
      AllOf(HasSubstr("test/config.json"), HasSubstr("'rope_scaling.rope_type'"),
            HasSubstr("dynamic")));
  EXPECT_THAT(error_of(edited(kLlama31_8B, "rope_scaling", {{"type", "longrope"}, {"factor", 2}})),
              AllOf(HasSubstr("'rope_scaling.type'"), HasSubstr("longrope")));
  json no_factor = json::parse(kLlama31_8B);
  no_factor["rope_scaling"].erase("low_freq_factor");
  EXPECT_THAT(error_of(no_factor.dump()),
              AllOf(HasSubstr("'rope_scaling.low_freq_factor'"), HasSubstr("missing")));
  EXPECT_THAT(error_of("{\"architectures\": [\"LlamaForCausalLM\"],"),
              AllOf(HasSubstr("test/config.json"), HasSubstr("not valid JSON")));
  EXPECT_THAT(error_of("[1, 2]"), HasSubstr("JSON object"));
  // A number past a double's range names the file too.
  EXPECT_THAT(error_of(R"({"rope_theta": 1e400})"),
              AllOf(HasSubstr("test/config.json"), HasSubstr("not valid JSON")));
}

// Sizes and numbers no model has are refused with their field, before anything is
// allocated for them or computed from them.
TEST(ModelConfig, ImplausibleSizesAndNumbersAreRefused) {
  EXPECT_THAT(
      error_of(edited(kTinyLlama, "num_hidden_layers", int64_t{1} << 50)),
      AllOf(HasSubstr("test/config.json"), HasSubstr("'num_hidden_layers'"), HasSubstr("at most")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "vocab_size", int64_t{1} << 40)),
              AllOf(HasSubstr("'vocab_size'"), HasSubstr("at most")));
  // Head counts whose products would wrap around to the real shapes.
  json wrap = json::parse(kTinyLlama);
  wrap["num_attention_heads"] = (int64_t{1} << 62) + 4;
  wrap["num_key_value_heads"] = (int64_t{1} << 61) + 2;
  wrap["head_dim"] = 64;
  EXPECT_THAT(error_of(wrap.dump()),
              AllOf(HasSubstr("'num_attention_heads'"), HasSubstr("at most")));
  json wide = json::parse(kTinyLlama);
  wide["num_attention_heads"] = 65536;
  wide["num_key_value_heads"] = 65536;
  wide["head_dim"] = 65536;
  EXPECT_THAT(error_of(wide.dump()), AllOf(HasSubstr("'head_dim'"), HasSubstr("at most")));
  EXPECT_THAT(error_of(edited(kTinyLlama, "rms_norm_eps", -1.0)),
              AllOf(HasSubstr("'rms_norm_eps'"), HasSubstr("negative")));
  // YaRN divides by log(rope_theta).
  json yarn = json::parse(kTinyLlama);
  yarn["rope_theta"] = 1.0;
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THAT(error_of(yarn.dump()), AllOf(HasSubstr("'rope_theta'"), HasSubstr("above 1")));
  // A context the factor stretches past an int, or shrinks to nothing.
  for (double factor : {1e300, 1e-4}) {
    json linear = json::parse(kTinyLlama);
    linear["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
    EXPECT_THAT(error_of(linear.dump()),
                AllOf(HasSubstr("'max_position_embeddings'"), HasSubstr("context of")))
        << factor;
  }
  EXPECT_THAT(error_of(edited(kTinyLlama, "max_position_embeddings", int64_t{1} << 40)),
              AllOf(HasSubstr("'max_position_embeddings'"), HasSubstr("at most")));
}

TEST(ModelConfig, LoadNamesTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / "pagellm_model_config_test";
  std::filesystem::remove_all(dir);
  try {
    load_model_config(dir);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "config.json").string()));
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << edited(kTinyLlama, "vocab_size", -1);
  try {
    load_model_config(dir);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr((dir / "config.json").string()),
                                HasSubstr("'vocab_size'"), HasSubstr("positive")));
  }
  std::ofstream(dir / "config.json") << kTinyLlama;
  EXPECT_EQ(load_model_config(dir).num_layers, 22);
  std::filesystem::remove_all(dir);
}

// Chat checkpoints list their end-of-turn token in generation_config.json (Llama 3
// Instruct's 128009); generation stops on those as well as on config.json's.
TEST(ModelConfig, LoadAddsGenerationConfigEosTokens) {
  const testing::TempDir temp("pagellm_generation_config_test");
  const std::filesystem::path& dir = temp.path();
  std::ofstream(dir / "config.json") << kTinyLlama;
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int64_t>{2}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, 7, 7], "top_p": 0.9})";
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int64_t>{2, 7}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 5})";
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int64_t>{2, 5}));
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 0.6})";
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(load_model_config(dir).generation_defaults.describe(), "temperature 0.6");
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 40000})";
  try {
    load_model_config(dir);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr((dir / "generation_config.json").string()),
                                HasSubstr("'eos_token_id'"), HasSubstr("outside the vocabulary")));
  }
  std::ofstream(dir / "generation_config.json") << "{not json";
  EXPECT_THROW(load_model_config(dir), ConfigError);
}

// Sampling parameters of generation_config.json (Qwen2.5 Instruct's, for example) become
// the serving defaults; out-of-range values are errors naming the file.
TEST(ModelConfig, LoadReadsGenerationConfigSamplingDefaults) {
  const testing::TempDir temp("pagellm_generation_defaults_test");
  const std::filesystem::path& dir = temp.path();
  std::ofstream(dir / "config.json") << kTinyLlama;
  EXPECT_TRUE(load_model_config(dir).generation_defaults.empty());
  std::ofstream(dir / "generation_config.json")
      << R"({"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
             "repetition_penalty": 1.05, "eos_token_id": [2]})";
  const GenerationDefaults d = load_model_config(dir).generation_defaults;
  EXPECT_EQ(d.temperature, 0.7);
  EXPECT_EQ(d.top_p, 0.8);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_FALSE(d.min_p.has_value());
  EXPECT_EQ(d.repetition_penalty, 1.05);
  EXPECT_EQ(d.describe(), "temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05");
  for (const char* bad :
       {R"({"top_p": 0})", R"({"temperature": -1})", R"({"top_k": 2.5})", R"({"min_p": "0.1"})"}) {
    std::ofstream(dir / "generation_config.json") << bad;
    EXPECT_THROW(load_model_config(dir), ConfigError) << bad;
  }
}

// The published llama3 rule, in double precision, written out independently of the
// implementation: wavelengths shorter than original/high_freq_factor keep their
// frequency, longer than original/low_freq_factor are divided by factor, and the band
// between is interpolated linearly in original/wavelength.
std::vector<double> llama3_inv_freq_reference(double theta, int head_dim, double factor, double low,
                                              double high, double original) {
  std::vector<double> out;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double f = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < original / high) {
      out.push_back(f);
    } else if (wavelen > original / low) {
      out.push_back(f / factor);
    } else {
      const double smooth = (original / wavelen - low) / (high - low);
      out.push_back((1 - smooth) * f / factor + smooth * f);
    }
  }
  return out;
}

TEST(RopeInvFreq, PlainRopeMatchesTheFormula) {
  const ModelConfig c = parse(kTinyLlama);
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    EXPECT_NEAR(f[i], want, want * 2e-6) << "i=" << i;
  }
}

TEST(RopeInvFreq, Llama3ScalingMatchesThePublishedFormula) {
  const ModelConfig c = parse(kLlama31_8B);
  const std::vector<float> f = rope_inv_freq(c);
  const std::vector<double> want = llama3_inv_freq_reference(500000.0, 128, 8.0, 1.0, 4.0, 8192);
  ASSERT_EQ(f.size(), want.size());
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_NEAR(f[i], want[i], want[i] * 2e-6) << "i=" << i;
    const double plain = 1.0 / std::pow(500000.0, 2.0 * i / 128);
    if (std::fabs(want[i] - plain) < plain * 1e-12)
      ++kept;
    else if (std::fabs(want[i] - plain / 8) < plain * 1e-12)
      ++divided;
    else
      ++blended;
  }
  // Llama 3.1 8B's 64 frequencies: all three bands are present.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(kept + divided + blended, 64);
  EXPECT_FLOAT_EQ(f[0], 1.0f);                    // highest frequency: unchanged
  EXPECT_NEAR(f[63], want[63], want[63] * 2e-6);  // lowest: divided by 8
}

// Qwen2.5's documented YaRN: factor 4 over 32768 positions. The expected values are
// transformers' _compute_yarn_parameters evaluated in float64 (numpy): dimensions 0..11
// kept, 20.. divided by 4, a ramp between; an attention factor of 0.1 ln 4 + 1.
TEST(RopeInvFreq, YarnKeepsHighFrequenciesAndDividesLowOnes) {
  json j = json::parse(kQwen25_05B);
  j["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  const ModelConfig c = parse(j.dump());
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_slow, 1.0);
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double plain = 1.0 / std::pow(1e6, 2.0 * i / 64);
    if (i <= 11) {
      EXPECT_NEAR(f[i], plain, plain * 2e-6) << i;
    }
    if (i >= 20) {
      EXPECT_NEAR(f[i], plain / 4, plain / 4 * 2e-6) << i;
    }
  }
  EXPECT_NEAR(f[15], 0.0010266176840396616, 0.0010266176840396616 * 2e-6);  // 4/9 of the way
  EXPECT_NEAR(f[31], 3.84981631514873e-07, 3.84981631514873e-07 * 2e-6);
  const double gain = 0.1 * std::log(4.0) + 1.0;
  EXPECT_FLOAT_EQ(c.attention_scale(), static_cast<float>(gain * gain / 8.0));

  // Untruncated band: from 11.80 to 19.83 dimensions.
  j["rope_scaling"]["truncate"] = false;
  EXPECT_NEAR(rope_inv_freq(parse(j.dump()))[15], 0.001079237741676554,
              0.001079237741676554 * 2e-6);
  // attention_factor given: the scale's gain; DeepSeek's mscale pair: their ratio.
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_FLOAT_EQ(parse(j.dump()).attention_scale(), static_cast<float>(1.5 * 1.5 / 8.0));
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["mscale"] = 2.0;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  const double ratio = (0.2 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1);
  EXPECT_FLOAT_EQ(parse(j.dump()).attention_scale(), static_cast<float>(ratio * ratio / 8.0));
  // Without original_max_position_embeddings, the config's max_position_embeddings.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(parse(j.dump()).rope_scaling->original_max_position_embeddings, 32768);
  EXPECT_EQ(rope_inv_freq(parse(j.dump())), f);
}

// The context a model serves: YaRN and linear scaling stretch it, as vLLM reads them.
TEST(ModelConfig, RopeScalingStretchesTheContextLength) {
  json j = json::parse(kQwen3_06B);  // max_position_embeddings 40960
  EXPECT_EQ(parse(j.dump()).context_length(), 40960);
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_EQ(parse(j.dump()).context_length(), 131072);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(j.dump()).context_length(), 81920);
  EXPECT_EQ(parse(kLlama31_8B).context_length(), 131072);  // llama3: as written
}

TEST(RopeInvFreq, LinearScalingDividesEveryFrequency) {
  json j = json::parse(kTinyLlama);
  const std::vector<float> plain = rope_inv_freq(parse(j.dump()));
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const ModelConfig c = parse(j.dump());
  EXPECT_EQ(c.rope_scaling->type, RopeScaling::Type::kLinear);
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), plain.size());
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_EQ(f[i], plain[i] / 2.0f) << i;
  EXPECT_EQ(c.attention_scale(), parse(kTinyLlama).attention_scale());
}

TEST(RopeInvFreq, UnsupportedScalingsAreRefused) {
  json j = json::parse(kTinyLlama);
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THAT(error_of(j.dump()), HasSubstr("'llama3', 'linear' and 'yarn'"));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 0.5}};
  EXPECT_THAT(error_of(j.dump()), HasSubstr("at least 1"));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"attn_factor", 2.0}};
  EXPECT_THAT(error_of(j.dump()), HasSubstr("attn_factor"));
  j["rope_scaling"] = {{"type", "linear"}};
  EXPECT_THAT(error_of(j.dump()), HasSubstr("factor"));
}

TEST(RopeInvFreq, Llama3ScalingOnASmallHead) {
  json j = json::parse(kLlama31_8B);
  j["hidden_size"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["rope_scaling"]["factor"] = 32.0;
  j["rope_scaling"]["high_freq_factor"] = 2.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 64;
  const std::vector<float> f = rope_inv_freq(parse(j.dump()));
  const std::vector<double> want = llama3_inv_freq_reference(500000.0, 16, 32.0, 1.0, 2.0, 64);
  ASSERT_EQ(f.size(), 8u);
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_NEAR(f[i], want[i], want[i] * 2e-6) << "i=" << i;
}

}  // namespace
}  // namespace pagellm::engine
