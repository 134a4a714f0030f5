#include "engine/demo_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/chat_template.h"
#include "engine/demo_tokenizer.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_config.h"

#if __has_include("support/reference_llama.h")
#include "support/reference_llama.h"
#define PAGELLM_HAVE_REFERENCE_LLAMA 1
#endif

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("pagellm_demo_model_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

float value_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case kernels::DType::kF32:
      return static_cast<const float*>(t.data)[i];
    case kernels::DType::kF16:
      return kernels::f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case kernels::DType::kBF16:
      return kernels::bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
  }
  return 0;
}

struct Stats {
  double mean = 0, std = 0;
  bool finite = true;
};
Stats stats(const TensorView& t) {
  double sum = 0, sq = 0;
  Stats s;
  const int64_t n = t.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    const double v = value_at(t, i);
    s.finite = s.finite && std::isfinite(v);
    sum += v;
    sq += v * v;
  }
  s.mean = sum / n;
  s.std = std::sqrt(std::max(0.0, sq / n - s.mean * s.mean));
  return s;
}

// Loads DIR the way the server does and checks it against the spec that wrote it.
void expect_loads(const fs::path& dir, const DemoModelSpec& spec) {
  const ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.architecture, spec.architecture);
  EXPECT_EQ(c.vocab_size, spec.vocab_size);
  EXPECT_EQ(c.hidden_size, spec.hidden_size);
  EXPECT_EQ(c.intermediate_size, spec.intermediate_size);
  EXPECT_EQ(c.num_layers, spec.num_layers);
  EXPECT_EQ(c.num_heads, spec.num_heads);
  EXPECT_EQ(c.num_kv_heads, spec.num_kv_heads);
  EXPECT_EQ(c.head_dim, spec.head_dim);
  EXPECT_EQ(c.max_position_embeddings, spec.max_position_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, spec.rope_theta);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, spec.rms_norm_eps);
  EXPECT_EQ(c.sliding_window, spec.sliding_window);
  EXPECT_EQ(c.tie_word_embeddings, spec.tie_word_embeddings);
  EXPECT_EQ(c.dtype, spec.dtype);
  EXPECT_EQ(c.rope_scaling.has_value(), spec.rope_scaling.has_value());
  if (c.rope_scaling && spec.rope_scaling) {
    EXPECT_DOUBLE_EQ(c.rope_scaling->factor, spec.rope_scaling->factor);
    EXPECT_EQ(c.rope_scaling->original_max_position_embeddings,
              spec.rope_scaling->original_max_position_embeddings);
  }
  EXPECT_EQ(c.attention_bias, spec.architecture == Architecture::kQwen2);
  EXPECT_EQ(c.qk_norm, spec.architecture == Architecture::kQwen3);
  const int64_t specials = static_cast<int64_t>(kDemoSpecialTokens.size());
  EXPECT_EQ(c.bos_token_id, spec.vocab_size - specials);
  EXPECT_EQ(c.eos_token_ids,
            (std::vector<int64_t>{spec.vocab_size - specials + 1, spec.vocab_size - specials + 3}));

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  const ModelWeights w = bind_weights(c, ckpt);
  EXPECT_EQ(ckpt.num_parameters(), demo_model_num_parameters(spec));
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_EQ(w.layers.size(), static_cast<size_t>(spec.num_layers));
  EXPECT_EQ(ckpt.contains("lm_head.weight"), !spec.tie_word_embeddings);
  for (const auto& [name, view] : ckpt.tensors())
    EXPECT_EQ(view.dtype, spec.dtype) << name;
  EXPECT_EQ(w.layers[0].q_bias.has_value(), spec.architecture == Architecture::kQwen2);
  EXPECT_EQ(w.layers[0].q_norm.has_value(), spec.architecture == Architecture::kQwen3);
}

// tokenizer.json is plain Hugging Face JSON: ids 0..V-1 without gaps, the 256 byte
// tokens first, every merge made of vocabulary tokens, special tokens last.
void expect_consistent_tokenizer_json(const json& t, int64_t vocab_size) {
  const json& model = t["model"];
  EXPECT_EQ(model["type"], "BPE");
  const int64_t total = static_cast<int64_t>(model["vocab"].size() + t["added_tokens"].size());
  EXPECT_EQ(total, vocab_size);
  std::vector<bool> seen(vocab_size, false);
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    ASSERT_TRUE(id >= 0 && id < vocab_size);
    EXPECT_FALSE(seen[id]);
    seen[id] = true;
  }
  for (const json& added : t["added_tokens"]) {
    const int64_t id = added["id"].get<int64_t>();
    EXPECT_FALSE(seen[id]);
    seen[id] = true;
    EXPECT_TRUE(added["special"].get<bool>());
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), vocab_size);
  EXPECT_EQ(model["vocab"][byte_level_encode(" ")], 32);
  EXPECT_EQ(model["vocab"][byte_level_encode("A")], 65);
  EXPECT_EQ(model["merges"].size(), model["vocab"].size() - 256);
  for (const json& merge : model["merges"]) {
    const std::string m = merge.get<std::string>();
    const size_t space = m.find(' ');
    ASSERT_NE(space, std::string::npos);
    EXPECT_TRUE(model["vocab"].contains(m.substr(0, space))) << m;
    EXPECT_TRUE(model["vocab"].contains(m.substr(space + 1))) << m;
    EXPECT_TRUE(model["vocab"].contains(m.substr(0, space) + m.substr(space + 1))) << m;
  }
  EXPECT_EQ(t["added_tokens"][0]["content"], "<|begin_of_text|>");
  EXPECT_EQ(t["added_tokens"][0]["id"], vocab_size - 5);
}

TEST(DemoModel, PresetsHaveTheDocumentedShapes) {
  const DemoModelSpec tiny = demo_model_preset("tiny");
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.num_heads, 4);
  EXPECT_EQ(tiny.num_kv_heads, 2);
  EXPECT_EQ(tiny.head_dim, 16);
  EXPECT_EQ(tiny.intermediate_size, 128);
  EXPECT_EQ(tiny.vocab_size, 512);
  const DemoModelSpec small = demo_model_preset("small");
  EXPECT_EQ(small.num_layers, 4);
  EXPECT_EQ(small.hidden_size, 256);
  EXPECT_EQ(small.vocab_size, 4096);
  const DemoModelSpec bench = demo_model_preset("bench");
  EXPECT_EQ(bench.num_layers, 12);
  EXPECT_EQ(bench.hidden_size, 768);
  EXPECT_EQ(bench.num_heads, 12);
  EXPECT_EQ(bench.num_kv_heads, 4);
  EXPECT_EQ(bench.head_dim, 64);
  EXPECT_EQ(bench.intermediate_size, 2048);
  EXPECT_EQ(bench.vocab_size, 32000);
  EXPECT_FALSE(bench.tie_word_embeddings);
  EXPECT_EQ(bench.dtype, kernels::DType::kBF16);
  EXPECT_EQ(demo_model_preset("tiny", Architecture::kMistral).sliding_window, 32);
  EXPECT_THROW(demo_model_preset("huge"), std::invalid_argument);
}

TEST(DemoModel, BenchPresetIs124_7MParameters) {
  // 2 x 32000 x 768 (embedding, head) + 12 x (768 x 768 x 2 + 256 x 768 x 2 q/k/v/o +
  // 3 x 2048 x 768 MLP + 2 x 768 norms) + 768 final norm.
  const DemoModelSpec bench = demo_model_preset("bench");
  const int64_t expected =
      2 * 32000 * 768 + 12 * (2 * 768 * 768 + 2 * 256 * 768 + 3 * 2048 * 768 + 2 * 768) + 768;
  EXPECT_EQ(expected, 124'668'672);
  EXPECT_EQ(demo_model_num_parameters(bench), expected);
  EXPECT_EQ(std::lround(demo_model_num_parameters(bench) / 1e5), 1247);  // 124.7M

  const fs::path dir = temp_dir("bench");
  const auto start = std::chrono::steady_clock::now();
  write_demo_model(dir, bench);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ bench ] %lld parameters, %.1f MB, written in %.2f s\n",
              static_cast<long long>(demo_model_num_parameters(bench)),
              fs::file_size(dir / "model.safetensors") / 1e6, seconds);
  RecordProperty("write_seconds", std::to_string(seconds));
  EXPECT_LT(seconds, 30.0);  // about 2 s; generous for a loaded machine
  expect_loads(dir, bench);
  EXPECT_GT(fs::file_size(dir / "model.safetensors"), 2u * 124'668'672);
  expect_consistent_tokenizer_json(json::parse(read(dir / "tokenizer.json")), 32000);
  const Tokenizer tokenizer = Tokenizer::from_dir(dir);
  EXPECT_EQ(tokenizer.vocab_size(), 32000u);
  const std::string text = "Every Saturday morning the square fills with market stalls.";
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
  fs::remove_all(dir);
}

TEST(DemoModel, TinyAndSmallPresetsLoad) {
  for (const char* preset : {"tiny", "small"}) {
    SCOPED_TRACE(preset);
    const DemoModelSpec spec = demo_model_preset(preset);
    const fs::path dir = temp_dir(preset);
    write_demo_model(dir, spec);
    for (const char* file : {"config.json", "model.safetensors", "tokenizer.json",
                             "tokenizer_config.json", "generation_config.json"}) {
      EXPECT_TRUE(fs::exists(dir / file)) << file;
    }
    expect_loads(dir, spec);
    fs::remove_all(dir);
  }
}

// Without torch_dtype in config.json the model (and so its KV cache) takes the dtype of
// its weights.
TEST(DemoModel, ConfigWithoutDtypeTakesTheWeightsDtype) {
  const fs::path dir = temp_dir("no_dtype");
  DemoModelSpec spec = demo_model_preset("tiny");
  for (kernels::DType dtype : {kernels::DType::kBF16, kernels::DType::kF16}) {
    spec.dtype = dtype;
    write_demo_model(dir, spec);
    json config = json::parse(read(dir / "config.json"));
    config.erase("torch_dtype");
    std::ofstream(dir / "config.json") << config.dump();
    EXPECT_EQ(LlamaModel::load(dir)->config().dtype, dtype);
    EXPECT_EQ(default_kv_dtype(LlamaModel::load(dir)->config()), dtype);
    config["torch_dtype"] = "float32";
    std::ofstream(dir / "config.json") << config.dump();
    EXPECT_EQ(LlamaModel::load(dir)->config().dtype, kernels::DType::kF32);
  }
  fs::remove_all(dir);
}

struct ArchCase {
  std::string name;
  DemoModelSpec spec;
};
void PrintTo(const ArchCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<ArchCase> arch_cases() {
  std::vector<ArchCase> out;
  DemoModelSpec llama = demo_model_preset("tiny", Architecture::kLlama);
  llama.rope_scaling = RopeScaling{.factor = 8.0,
                                   .low_freq_factor = 1.0,
                                   .high_freq_factor = 4.0,
                                   .original_max_position_embeddings = 256};
  llama.tie_word_embeddings = true;
  out.push_back({"llama3_scaled_tied", llama});
  DemoModelSpec mistral = demo_model_preset("tiny", Architecture::kMistral);
  mistral.sliding_window = 32;
  out.push_back({"mistral_window32", mistral});
  out.push_back({"qwen2_bias", demo_model_preset("tiny", Architecture::kQwen2)});
  DemoModelSpec qwen3 = demo_model_preset("tiny", Architecture::kQwen3);
  qwen3.dtype = kernels::DType::kF16;
  out.push_back({"qwen3_qk_norm_f16", qwen3});
  DemoModelSpec qwen3_window = demo_model_preset("tiny", Architecture::kQwen3);
  qwen3_window.sliding_window = 16;
  qwen3_window.dtype = kernels::DType::kF32;
  out.push_back({"qwen3_window16_f32", qwen3_window});
  DemoModelSpec small = demo_model_preset("small", Architecture::kLlama);
  out.push_back({"llama_small", small});
  return out;
}

class DemoModelArchitectures : public ::testing::TestWithParam<ArchCase> {};

TEST_P(DemoModelArchitectures, WritesALoadableModel) {
  const ArchCase& c = GetParam();
  const fs::path dir = temp_dir(c.name);
  write_demo_model(dir, c.spec);
  expect_loads(dir, c.spec);

  const json config = json::parse(read(dir / "config.json"));
  EXPECT_EQ(config["architectures"][0], architecture_name(c.spec.architecture));
  EXPECT_TRUE(config.contains("model_type"));
  EXPECT_EQ(config["hidden_act"], "silu");
  if (c.spec.architecture == Architecture::kQwen2 || c.spec.architecture == Architecture::kQwen3) {
    EXPECT_EQ(config["use_sliding_window"], c.spec.sliding_window > 0);
  }
  if (c.spec.rope_scaling) {
    EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  }
  fs::remove_all(dir);
}

// Random weights, but shaped for sane activations: norms near 1, projections with a
// standard deviation of 1/sqrt(fan_in), the output head giving logits of spread ~4.
TEST_P(DemoModelArchitectures, WeightScales) {
  const ArchCase& c = GetParam();
  const fs::path dir = temp_dir(c.name + "_scales");
  write_demo_model(dir, c.spec);
  const ModelConfig config = load_model_config(dir);
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  const ModelWeights w = bind_weights(config, ckpt);
  for (const auto& [name, view] : ckpt.tensors())
    EXPECT_TRUE(stats(view).finite) << name;
  const LayerWeights& l = w.layers[0];
  for (const TensorView* norm : {&l.input_norm, &l.post_attention_norm}) {
    const Stats s = stats(*norm);
    EXPECT_NEAR(s.mean, 1.0, 0.05) << norm->name;
    EXPECT_GT(s.std, 0.0) << norm->name;
    EXPECT_LT(s.std, 0.1) << norm->name;
  }
  const double h = static_cast<double>(config.hidden_size);
  EXPECT_NEAR(stats(l.q_proj).std * std::sqrt(h), 1.0, 0.1);
  EXPECT_NEAR(stats(l.gate_proj).std * std::sqrt(h), 1.0, 0.1);
  EXPECT_NEAR(stats(l.down_proj).std * std::sqrt(double(config.intermediate_size)), 1.0, 0.1);
  EXPECT_NEAR(stats(l.q_proj).mean, 0.0, 0.01);
  // The logits' spread: an ordinary text token's head row times the final norm's
  // weight (which carries the scale when the embeddings are tied).
  const int64_t row = 300;
  double sq = 0;
  for (int64_t j = 0; j < config.hidden_size; ++j) {
    const double v = value_at(w.lm_head, row * config.hidden_size + j);
    sq += v * v;
  }
  const Stats final_norm = stats(w.final_norm);
  EXPECT_NEAR(std::sqrt(sq) * final_norm.mean, 6.0, 1.5);
  EXPECT_LT(final_norm.std, 0.1 * final_norm.mean);
  if (!config.tie_word_embeddings) {
    EXPECT_NEAR(final_norm.mean, 1.0, 0.05);
  }
  fs::remove_all(dir);
}

#ifdef PAGELLM_HAVE_REFERENCE_LLAMA
// Greedy decoding of a random model must not be degenerate: it should move through
// many different tokens, and each step's winner should stand clear of the runner-up so
// that rounding differences between implementations do not flip it.
TEST_P(DemoModelArchitectures, GreedyDecodingIsNotDegenerate) {
  const ArchCase& c = GetParam();
  const fs::path dir = temp_dir(c.name + "_greedy");
  write_demo_model(dir, c.spec);
  const ModelConfig config = load_model_config(dir);
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  const testing::ReferenceLlama reference(config, bind_weights(config, ckpt), kernels::DType::kF32);
  const Tokenizer tokenizer = Tokenizer::from_dir(dir);
  std::vector<int32_t> tokens = tokenizer.encode("The lighthouse keeper", true);
  const int steps = c.spec.hidden_size > 64 ? 12 : 24;
  std::vector<double> gaps;
  std::vector<int32_t> generated;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits = reference.next_logits(tokens);
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    gaps.push_back(sorted[0] - sorted[1]);
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    tokens.push_back(next);
  }
  const std::set<int32_t> distinct(generated.begin(), generated.end());
  std::sort(gaps.begin(), gaps.end());
  std::printf("[ %s ] %zu distinct of %d greedy tokens, median top-2 gap %.3f: %s\n",
              c.name.c_str(), distinct.size(), steps, gaps[gaps.size() / 2],
              tokenizer.decode(generated).c_str());
  EXPECT_GE(distinct.size(), static_cast<size_t>(steps / 3));
  EXPECT_GT(gaps[gaps.size() / 2], 0.2);
  for (int32_t t : generated)
    EXPECT_FALSE(tokenizer.is_special(t)) << t;
  fs::remove_all(dir);
}
#endif

INSTANTIATE_TEST_SUITE_P(All, DemoModelArchitectures, ::testing::ValuesIn(arch_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(DemoModel, SameSeedSameBytesOtherSeedOtherWeights) {
  DemoModelSpec spec = demo_model_preset("tiny", Architecture::kQwen2);
  spec.seed = 1234;
  const fs::path a = temp_dir("seed_a"), b = temp_dir("seed_b"), other = temp_dir("seed_c");
  write_demo_model(a, spec);
  write_demo_model(b, spec);
  spec.seed = 1235;
  write_demo_model(other, spec);
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_EQ(read(a / file), read(b / file)) << file;
  }
  EXPECT_NE(read(a / "model.safetensors"), read(other / "model.safetensors"));
  EXPECT_EQ(read(a / "tokenizer.json"), read(other / "tokenizer.json"));
  EXPECT_EQ(read(a / "model.safetensors").size(), read(other / "model.safetensors").size());
  for (const fs::path& d : {a, b, other})
    fs::remove_all(d);
}

TEST(DemoModel, RewritesAnExistingDirectory) {
  const fs::path dir = temp_dir("rewrite");
  write_demo_model(dir, demo_model_preset("small"));
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {}}";
  const DemoModelSpec tiny = demo_model_preset("tiny", Architecture::kMistral);
  write_demo_model(dir, tiny);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
  }
  expect_loads(dir, tiny);
  fs::remove_all(dir);
}

TEST(DemoModel, RejectsInconsistentSpecs) {
  const fs::path dir = temp_dir("bad");
  DemoModelSpec spec = demo_model_preset("tiny");
  spec.num_kv_heads = 3;
  EXPECT_THROW(write_demo_model(dir, spec), std::invalid_argument);
  spec = demo_model_preset("tiny");
  spec.sliding_window = 16;  // Llama has none
  EXPECT_THROW(write_demo_model(dir, spec), std::invalid_argument);
  spec = demo_model_preset("tiny");
  spec.vocab_size = 100;
  EXPECT_THROW(write_demo_model(dir, spec), std::invalid_argument);
  spec = demo_model_preset("tiny", Architecture::kQwen2);
  spec.head_dim = 32;
  EXPECT_THROW(write_demo_model(dir, spec), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "config.json"));
  EXPECT_EQ(parse_architecture_name("qwen3"), Architecture::kQwen3);
  EXPECT_EQ(parse_architecture_name("MistralForCausalLM"), Architecture::kMistral);
  EXPECT_FALSE(parse_architecture_name("gpt2").has_value());
}

TEST(DemoTokenizer, JsonIsCompleteAndConsistent) {
  for (int64_t vocab_size : {512, 4096}) {
    SCOPED_TRACE(vocab_size);
    expect_consistent_tokenizer_json(
        json::parse(demo_tokenizer_json(train_demo_vocabulary(vocab_size))), vocab_size);
  }
  EXPECT_THROW(train_demo_vocabulary(260), std::invalid_argument);
  EXPECT_THROW(train_demo_vocabulary(1 << 20), std::invalid_argument);
  EXPECT_EQ(train_demo_vocabulary(261).merges.size(), 0u);
}

TEST(DemoTokenizer, LoadsAndRoundTripsText) {
  const fs::path dir = temp_dir("tokenizer");
  write_demo_model(dir, demo_model_preset("small"));
  const Tokenizer tokenizer = Tokenizer::from_dir(dir);
  EXPECT_EQ(tokenizer.vocab_size(), 4096u);
  EXPECT_EQ(tokenizer.bos_id(), 4091);
  EXPECT_EQ(tokenizer.eos_id(), 4094);  // <|im_end|>, the end of a chat turn
  for (size_t i = 0; i < kDemoSpecialTokens.size(); ++i) {
    EXPECT_EQ(tokenizer.token_to_id(kDemoSpecialTokens[i]), 4091 + static_cast<int>(i));
    EXPECT_TRUE(tokenizer.is_special(4091 + static_cast<int>(i)));
  }
  const std::string texts[] = {
      "The lighthouse keeper climbs the 112 steps every evening.",
      "  Leading spaces, trailing spaces  \n\nand blank lines\r\n",
      "Unicode: caf\xC3\xA9, na\xC3\xAFve, \xE6\x97\xA5\xE6\x9C\xAC, emoji \xF0\x9F\x8C\x8D!",
      "It's what they'll do; we've seen I'd",
      "",
  };
  for (const std::string& text : texts) {
    const std::vector<TokenId> ids = tokenizer.encode(text);
    EXPECT_EQ(tokenizer.decode(ids), text);
    const std::vector<TokenId> with_bos = tokenizer.encode(text, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], 4091);
    EXPECT_EQ(tokenizer.decode(with_bos, true), text);
  }
  // The merges were learned on English: such text takes far fewer tokens than bytes.
  const std::string english =
      "On the way down it started to rain, and by the time we reached the bridge we were "
      "wet through, but nobody minded.";
  EXPECT_LT(tokenizer.encode(english).size() * 3, english.size());
  const std::vector<TokenId> chat = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(chat.front(), 4093);
  EXPECT_NE(std::find(chat.begin(), chat.end(), 4094), chat.end());
  fs::remove_all(dir);
}

TEST(DemoTokenizer, ConfigHasChatMLTemplateAndGenerationConfigMatches) {
  const fs::path dir = temp_dir("tokenizer_config");
  write_demo_model(dir, demo_model_preset("tiny"));
  const TokenizerConfig tc = load_tokenizer_config(dir);
  EXPECT_EQ(tc.bos_token, "<|begin_of_text|>");
  EXPECT_EQ(tc.eos_token, "<|im_end|>");
  EXPECT_EQ(tc.pad_token, "<|pad|>");
  ASSERT_TRUE(tc.chat_template.has_value());
  EXPECT_THAT(*tc.chat_template, HasSubstr("<|im_start|>"));

  const ChatTemplate chat = ChatTemplate::parse(*tc.chat_template);
  ChatRenderOptions options = chat_render_options(tc);
  options.add_generation_prompt = true;
  const json messages = json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello!"}}});
  EXPECT_EQ(chat.render(messages, options),
            "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");

  const json gen = json::parse(read(dir / "generation_config.json"));
  const json config = json::parse(read(dir / "config.json"));
  EXPECT_EQ(gen["eos_token_id"], config["eos_token_id"]);
  EXPECT_EQ(gen["bos_token_id"], config["bos_token_id"]);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagellm::engine
