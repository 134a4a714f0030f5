#include "engine/demo_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "engine/demo_tokenizer.h"
#include "engine/safetensors.h"
#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

constexpr const char* kTransformersVersion = "4.46.0";

// Weight scales. Projections get 1/sqrt(fan_in), so every matmul keeps its input's RMS
// and each layer adds O(1) to the residual stream. The output head gets
// kLogitStd / sqrt(hidden): with the final norm's output at RMS 1, logits spread with a
// standard deviation of about kLogitStd, so the argmax stands clear of rounding noise
// and greedy decoding still moves from token to token.
constexpr float kLogitStd = 6.0f;
constexpr float kEmbedStd = 1.0f;  // untied embeddings
// Tied embeddings: a token's logit includes e_t . norm(x), and x starts as e_t. Measured
// against the other logits' spread, that self term is about |e_t| / rms(x); were the
// embedding as large as the head needs, it would win every step and greedy decoding
// would repeat the last token forever. So the embedding keeps transformers' init scale
// (initializer_range 0.02, yet far above the norms' epsilon), and the final norm's
// weight, large in trained tied models too, supplies the logit scale. With so small an
// embedding, full-size attention outputs would drown the current token in an average
// over the context, and generation would settle on one token; attention therefore
// writes to the residual stream at a tenth of the usual scale.
constexpr float kTiedEmbedStd = 0.02f;
constexpr float kTiedAttentionOutputScale = 0.1f;
constexpr float kNormNoise = 0.05f;  // norm weights: 1 + noise
constexpr float kBiasStd = 0.1f;
// Rows of special tokens and of byte tokens that are not printable text are scaled
// down, so that a random model rarely emits them: its output reads as word salad
// rather than stopping early or printing broken UTF-8.
constexpr float kQuietRowScale = 0.25f;

constexpr int64_t kChunkElements = int64_t{1} << 18;

struct TensorRecipe {
  TensorLayout layout;
  float mean = 0.0f;
  float std = 0.0f;
  bool vocab_rows = false;  // rows are token ids: scaled by row_scale
};

void check_spec(const DemoModelSpec& s) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("demo model spec: " + what);
  };
  for (auto [name, value] : {std::pair<const char*, int64_t>{"vocab_size", s.vocab_size},
                             {"hidden_size", s.hidden_size},
                             {"intermediate_size", s.intermediate_size},
                             {"num_layers", s.num_layers},
                             {"num_heads", s.num_heads},
                             {"num_kv_heads", s.num_kv_heads},
                             {"head_dim", s.head_dim},
                             {"max_position_embeddings", s.max_position_embeddings}}) {
    if (value <= 0) fail(std::string(name) + " must be positive");
  }
  if (s.num_heads % s.num_kv_heads != 0) fail("num_kv_heads must divide num_heads");
  if (s.head_dim % 2 != 0) fail("head_dim must be even");
  if (s.sliding_window < 0) fail("sliding_window must not be negative");
  if (s.architecture == Architecture::kLlama && s.sliding_window != 0) {
    fail("Llama has no sliding window");
  }
  if (s.rope_scaling && s.architecture != Architecture::kLlama) {
    fail("rope_scaling is for Llama only");
  }
  if (s.architecture == Architecture::kQwen2 && s.head_dim * s.num_heads != s.hidden_size) {
    fail("Qwen2 needs head_dim * num_heads == hidden_size");
  }
  if (!(s.rope_theta > 0) || !(s.rms_norm_eps > 0)) {
    fail("rope_theta and rms_norm_eps must be positive");
  }
}

std::vector<TensorRecipe> recipes(const DemoModelSpec& s) {
  const int64_t h = s.hidden_size, q_dim = s.num_heads * s.head_dim;
  const int64_t kv_dim = s.num_kv_heads * s.head_dim, ffn = s.intermediate_size;
  const auto dt = s.dtype;
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(h));
  const float head_std = kLogitStd * inv_sqrt_h;
  std::vector<TensorRecipe> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, float mean, float std,
                 bool vocab_rows = false) {
    out.push_back({{std::move(name), dt, std::move(shape)}, mean, std, vocab_rows});
  };
  add("model.embed_tokens.weight", {s.vocab_size, h}, 0.0f,
      s.tie_word_embeddings ? kTiedEmbedStd : kEmbedStd, true);
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, 1.0f, kNormNoise);
    add(p + "self_attn.q_proj.weight", {q_dim, h}, 0.0f, inv_sqrt_h);
    add(p + "self_attn.k_proj.weight", {kv_dim, h}, 0.0f, inv_sqrt_h);
    add(p + "self_attn.v_proj.weight", {kv_dim, h}, 0.0f, inv_sqrt_h);
    if (s.architecture == Architecture::kQwen2) {
      add(p + "self_attn.q_proj.bias", {q_dim}, 0.0f, kBiasStd);
      add(p + "self_attn.k_proj.bias", {kv_dim}, 0.0f, kBiasStd);
      add(p + "self_attn.v_proj.bias", {kv_dim}, 0.0f, kBiasStd);
    }
    if (s.architecture == Architecture::kQwen3) {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, 1.0f, kNormNoise);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, 1.0f, kNormNoise);
    }
    add(p + "self_attn.o_proj.weight", {h, q_dim}, 0.0f,
        (s.tie_word_embeddings ? kTiedAttentionOutputScale : 1.0f) /
            std::sqrt(static_cast<float>(q_dim)));
    add(p + "post_attention_layernorm.weight", {h}, 1.0f, kNormNoise);
    add(p + "mlp.gate_proj.weight", {ffn, h}, 0.0f, inv_sqrt_h);
    add(p + "mlp.up_proj.weight", {ffn, h}, 0.0f, inv_sqrt_h);
    add(p + "mlp.down_proj.weight", {h, ffn}, 0.0f, 1.0f / std::sqrt(static_cast<float>(ffn)));
  }
  const float final_norm = s.tie_word_embeddings ? head_std / kTiedEmbedStd : 1.0f;
  add("model.norm.weight", {h}, final_norm, kNormNoise * final_norm);
  if (!s.tie_word_embeddings) add("lm_head.weight", {s.vocab_size, h}, 0.0f, head_std, true);
  return out;
}

// Per token: 1, or kQuietRowScale for special tokens and non-printable byte tokens.
std::vector<float> vocab_row_scales(const DemoVocabulary& vocab) {
  std::vector<float> scale(static_cast<size_t>(vocab.vocab_size), kQuietRowScale);
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    const std::string& t = vocab.tokens[id];
    const bool printable = std::all_of(t.begin(), t.end(),
                                       [](char c) { return c == '\n' || (c >= 0x20 && c < 0x7f); });
    if (printable) scale[id] = 1.0f;
  }
  return scale;
}

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A standard normal, approximately: the sum of four 16-bit uniforms (Irwin-Hall),
// centred and scaled. Integer arithmetic up to one float multiply, so the weights are
// the same on every machine, and cheap enough to fill 125M weights in well under a
// second.
inline float unit_normal(uint64_t r) {
  const int32_t sum =
      static_cast<int32_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
  constexpr float kInvStd = 1.0f / 37837.2259f;  // sqrt(4 * (65536^2 - 1) / 12)
  return static_cast<float>(sum - 131070) * kInvStd;
}

inline void store(float value, kernels::DType dtype, uint8_t* out) {
  switch (dtype) {
    case kernels::DType::kF32:
      std::memcpy(out, &value, 4);
      return;
    case kernels::DType::kF16: {
      const uint16_t v = kernels::f32_to_f16(value);
      out[0] = static_cast<uint8_t>(v);
      out[1] = static_cast<uint8_t>(v >> 8);
      return;
    }
    case kernels::DType::kBF16: {
      const uint16_t v = kernels::f32_to_bf16(value);
      out[0] = static_cast<uint8_t>(v);
      out[1] = static_cast<uint8_t>(v >> 8);
      return;
    }
  }
}

// Each chunk of each tensor has its own random stream, keyed by seed, tensor name and
// chunk index, so the bytes do not depend on the number of threads or their timing.
void fill_chunk(const TensorRecipe& r, int64_t chunk, uint64_t seed,
                const std::vector<float>& row_scale, std::span<uint8_t> bytes) {
  int64_t elements = 1;
  for (int64_t d : r.layout.shape)
    elements *= d;
  const int64_t begin = chunk * kChunkElements;
  const int64_t end = std::min(elements, begin + kChunkElements);
  const int64_t cols = r.layout.shape.back();
  const int64_t size = kernels::dtype_size(r.layout.dtype);
  uint64_t state =
      seed * 0x9e3779b97f4a7c15ull ^ fnv1a(r.layout.name) ^ (static_cast<uint64_t>(chunk) << 40);
  splitmix64(state);
  for (int64_t i = begin; i < end; ++i) {
    const float scale = r.vocab_rows ? r.std * row_scale[i / cols] : r.std;
    const float value = r.mean + scale * unit_normal(splitmix64(state));
    store(value, r.layout.dtype, bytes.data() + i * size);
  }
}

void write_weights(const std::filesystem::path& file, const std::vector<TensorRecipe>& tensors,
                   uint64_t seed, const std::vector<float>& row_scale) {
  std::vector<TensorLayout> layout;
  std::vector<std::pair<size_t, int64_t>> jobs;  // (tensor, chunk)
  for (size_t t = 0; t < tensors.size(); ++t) {
    layout.push_back(tensors[t].layout);
    int64_t elements = 1;
    for (int64_t d : tensors[t].layout.shape)
      elements *= d;
    for (int64_t c = 0; c * kChunkElements < elements; ++c)
      jobs.emplace_back(t, c);
  }
  SafetensorsWriter writer(file, std::move(layout), {{"format", "pt"}});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t j = next++; j < jobs.size(); j = next++) {
      const auto [t, chunk] = jobs[j];
      fill_chunk(tensors[t], chunk, seed, row_scale, writer.data(t));
    }
  };
  const size_t threads =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, std::min<size_t>(8, jobs.size()));
  std::vector<std::jthread> pool;
  for (size_t i = 1; i < threads; ++i)
    pool.emplace_back(work);
  work();
  pool.clear();  // joins
  writer.commit();
}

void write_text_file(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::path temp = file;
  temp += ".partial";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw ConfigError(temp.string() + ": cannot write file");
  }
  std::error_code ec;
  std::filesystem::rename(temp, file, ec);
  if (ec) throw ConfigError(file.string() + ": cannot rename into place: " + ec.message());
}

const char* torch_dtype_name(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return "float32";
    case kernels::DType::kF16:
      return "float16";
    case kernels::DType::kBF16:
      return "bfloat16";
  }
  return "?";
}

// config.json as transformers writes it for each architecture (keys sorted, as
// save_pretrained does).
std::string config_json(const DemoModelSpec& s, const DemoVocabulary& vocab) {
  json c;
  c["architectures"] = {architecture_name(s.architecture)};
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = vocab.bos_id();
  c["eos_token_id"] = {vocab.end_of_text_id(), vocab.im_end_id()};
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden_size;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = s.intermediate_size;
  c["max_position_embeddings"] = s.max_position_embeddings;
  c["num_attention_heads"] = s.num_heads;
  c["num_hidden_layers"] = s.num_layers;
  c["num_key_value_heads"] = s.num_kv_heads;
  c["rms_norm_eps"] = s.rms_norm_eps;
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tie_word_embeddings;
  c["torch_dtype"] = torch_dtype_name(s.dtype);
  c["transformers_version"] = kTransformersVersion;
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab_size;
  switch (s.architecture) {
    case Architecture::kLlama:
      c["model_type"] = "llama";
      c["attention_bias"] = false;
      c["head_dim"] = s.head_dim;
      c["mlp_bias"] = false;
      c["pretraining_tp"] = 1;
      if (s.rope_scaling) {
        const RopeScaling& r = *s.rope_scaling;
        json& out = c["rope_scaling"];
        out = {{"factor", r.factor}};
        switch (r.type) {
          case RopeScaling::Type::kLlama3:
            out["rope_type"] = "llama3";
            out["high_freq_factor"] = r.high_freq_factor;
            out["low_freq_factor"] = r.low_freq_factor;
            out["original_max_position_embeddings"] = r.original_max_position_embeddings;
            break;
          case RopeScaling::Type::kLinear:
            out["rope_type"] = "linear";
            break;
          case RopeScaling::Type::kYarn:
            out["rope_type"] = "yarn";
            out["beta_fast"] = r.beta_fast;
            out["beta_slow"] = r.beta_slow;
            out["original_max_position_embeddings"] = r.original_max_position_embeddings;
            if (r.attention_factor) out["attention_factor"] = *r.attention_factor;
            break;
        }
      } else {
        c["rope_scaling"] = nullptr;
      }
      break;
    case Architecture::kMistral:
      c["model_type"] = "mistral";
      c["head_dim"] = s.head_dim;
      c["sliding_window"] = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
      break;
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      if (s.architecture == Architecture::kQwen2) {
        c["model_type"] = "qwen2";
      } else {
        c["model_type"] = "qwen3";
        c["attention_bias"] = false;
        c["head_dim"] = s.head_dim;
      }
      c["rope_scaling"] = nullptr;
      // Qwen configs keep max_window_layers; 0 puts every layer in the window.
      c["use_sliding_window"] = s.sliding_window > 0;
      c["sliding_window"] = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
      c["max_window_layers"] = s.sliding_window > 0 ? 0 : s.num_layers;
      break;
  }
  return c.dump(2) + "\n";
}

std::string generation_config_json(const DemoVocabulary& vocab) {
  json g;
  g["bos_token_id"] = vocab.bos_id();
  g["eos_token_id"] = {vocab.end_of_text_id(), vocab.im_end_id()};
  g["pad_token_id"] = vocab.pad_id();
  g["transformers_version"] = kTransformersVersion;
  return g.dump(2) + "\n";
}

}  // namespace

std::optional<Architecture> parse_architecture_name(std::string_view name) {
  for (Architecture a :
       {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    std::string lower = architecture_name(a);
    lower = lower.substr(0, lower.find("ForCausalLM"));
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name == lower || name == architecture_name(a)) return a;
  }
  return std::nullopt;
}

DemoModelSpec demo_model_preset(std::string_view preset, Architecture architecture) {
  DemoModelSpec s;  // the defaults are the tiny preset
  if (preset == "small") {
    s.vocab_size = 4096;
    s.hidden_size = 256;
    s.intermediate_size = 768;
    s.num_layers = 4;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 64;
    s.max_position_embeddings = 4096;
  } else if (preset == "bench") {
    s.vocab_size = 32000;
    s.hidden_size = 768;
    s.intermediate_size = 2048;
    s.num_layers = 12;
    s.num_heads = 12;
    s.num_kv_heads = 4;
    s.head_dim = 64;
    s.max_position_embeddings = 4096;
  } else if (preset != "tiny") {
    throw std::invalid_argument("unknown demo model preset '" + std::string(preset) +
                                "' (tiny, small, bench)");
  }
  s.architecture = architecture;
  switch (architecture) {
    case Architecture::kLlama:
      s.rope_theta = 500000.0;
      s.rms_norm_eps = 1e-5;
      break;
    case Architecture::kMistral:
      s.rope_theta = 10000.0;
      s.rms_norm_eps = 1e-5;
      // Shorter than typical prompts of its preset, so the window is exercised.
      s.sliding_window = preset == "tiny" ? 32 : preset == "small" ? 256 : 1024;
      break;
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      s.rope_theta = 1000000.0;
      s.rms_norm_eps = 1e-6;
      break;
  }
  return s;
}

int64_t demo_model_num_parameters(const DemoModelSpec& spec) {
  int64_t n = 0;
  for (const TensorRecipe& r : recipes(spec)) {
    int64_t elements = 1;
    for (int64_t d : r.layout.shape)
      elements *= d;
    n += elements;
  }
  return n;
}

void write_demo_model(const std::filesystem::path& dir, const DemoModelSpec& spec) {
  check_spec(spec);
  const DemoVocabulary vocab = train_demo_vocabulary(spec.vocab_size);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError(dir.string() + ": cannot create directory: " + ec.message());
  // A leftover index would make loaders look for shards instead of model.safetensors.
  std::filesystem::remove(dir / "model.safetensors.index.json", ec);

  write_text_file(dir / "tokenizer.json", demo_tokenizer_json(vocab));
  write_text_file(dir / "tokenizer_config.json",
                  demo_tokenizer_config_json(vocab, spec.max_position_embeddings));
  write_text_file(dir / "generation_config.json", generation_config_json(vocab));
  write_weights(dir / "model.safetensors", recipes(spec), spec.seed, vocab_row_scales(vocab));
  write_text_file(dir / "config.json", config_json(spec, vocab));
}

}  // namespace pagellm::engine
