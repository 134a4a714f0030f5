#include "engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>

#include "engine/config_file.h"
#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

// Reads fields of one config object; every error names the file and the field.
class FieldReader {
 public:
  FieldReader(const json& object, std::string origin, std::string prefix = "")
      : object_(object), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ConfigError(origin_ + ": field '" + prefix_ + key + "' " + problem);
  }

  // nullptr when absent or null.
  const json* find(const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  int64_t integer(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "is missing");
    return as_integer(key, *v);
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const {
    const json* v = find(key);
    return v ? as_integer(key, *v) : fallback;
  }
  std::optional<int64_t> optional_integer(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return as_integer(key, *v);
  }
  double number(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "is missing");
    return as_number(key, *v);
  }
  double number_or(const std::string& key, double fallback) const {
    const json* v = find(key);
    return v ? as_number(key, *v) : fallback;
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, "must be a boolean, not " + describe(*v));
    return v->get<bool>();
  }
  // nullptr when absent or null.
  const json* optional_object(const std::string& key) const {
    const json* v = find(key);
    if (v && !v->is_object()) fail(key, "must be an object or null, not " + describe(*v));
    return v;
  }
  std::optional<std::string> optional_string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, "must be a string, not " + describe(*v));
    return v->get<std::string>();
  }

  int64_t as_integer(const std::string& key, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some exporters write integral values as floats (2048.0).
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        return static_cast<int64_t>(d);
      }
    }
    fail(key, "must be an integer, not " + describe(v));
  }
  double as_number(const std::string& key, const json& v) const {
    if (!v.is_number()) fail(key, "must be a number, not " + describe(v));
    return v.get<double>();
  }

  static std::string describe(const json& v) {
    std::string text = v.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + text;
  }

 private:
  const json& object_;
  std::string origin_;
  std::string prefix_;
};

struct ArchitectureName {
  const char* class_name;
  const char* model_type;
  Architecture architecture;
};
constexpr ArchitectureName kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Architecture::kLlama},
    {"MistralForCausalLM", "mistral", Architecture::kMistral},
    {"Qwen2ForCausalLM", "qwen2", Architecture::kQwen2},
    {"Qwen3ForCausalLM", "qwen3", Architecture::kQwen3},
};

std::string supported_list() {
  std::string list;
  for (const ArchitectureName& a : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += a.class_name;
  }
  return list;
}

// `architectures` (a list of class names) decides; `model_type` is the fallback for
// configs written without it.
Architecture read_architecture(const json& config, const FieldReader& fields) {
  if (const json* list = fields.find("architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) {
      fields.fail("architectures",
                  "must be a non-empty list of class names, not " + FieldReader::describe(*list));
    }
    const std::string name = (*list)[0].get<std::string>();
    for (const ArchitectureName& a : kArchitectures) {
      if (name == a.class_name) return a.architecture;
    }
    fields.fail("architectures", "names '" + name + "', which is not supported (supported: " +
                                     supported_list() + ")");
  }
  const std::optional<std::string> model_type = fields.optional_string("model_type");
  if (!model_type) fields.fail("architectures", "is missing (and so is 'model_type')");
  for (const ArchitectureName& a : kArchitectures) {
    if (*model_type == a.model_type) return a.architecture;
  }
  fields.fail("model_type", "is '" + *model_type +
                                "', which is not supported (supported: " + supported_list() + ")");
}

// nullopt when the config names no dtype.
std::optional<kernels::DType> read_dtype(const FieldReader& fields) {
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  const char* key = fields.find("torch_dtype") ? "torch_dtype" : "dtype";
  const std::optional<std::string> name = fields.optional_string(key);
  if (!name) return std::nullopt;
  if (*name == "bfloat16") return kernels::DType::kBF16;
  if (*name == "float16" || *name == "half") return kernels::DType::kF16;
  if (*name == "float32" || *name == "float") return kernels::DType::kF32;
  fields.fail(key, "is '" + *name + "'; supported: bfloat16, float16, float32");
}

// The YaRN paper's attention factor for a context stretched `factor` times (transformers'
// get_mscale).
double yarn_mscale(double factor, double m = 1.0) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// The scaling that `sub` (rope_scaling, or rope_parameters) describes; nullopt for the
// default RoPE. rope_parameters may leave rope_type out for the default. A yarn
// original_max_position_embeddings left out is 0 here: max_position_embeddings, filled
// in by the caller.
std::optional<RopeScaling> read_rope_scaling(const FieldReader& sub, const FieldReader& fields,
                                             const char* key, bool type_required) {
  // Newer configs say rope_type, older ones type.
  std::optional<std::string> type = sub.optional_string("rope_type");
  const char* type_key = "rope_type";
  if (!type) {
    type = sub.optional_string("type");
    type_key = "type";
  }
  if (!type) {
    if (type_required) fields.fail(key, "has neither 'rope_type' nor 'type'");
    return std::nullopt;
  }
  if (*type == "default") return std::nullopt;
  RopeScaling out;
  if (*type == "llama3") {
    out.type = RopeScaling::Type::kLlama3;
  } else if (*type == "linear") {
    out.type = RopeScaling::Type::kLinear;
  } else if (*type == "yarn") {
    out.type = RopeScaling::Type::kYarn;
  } else {
    sub.fail(type_key,
             "is '" + *type + "'; the RoPE scalings supported are 'llama3', 'linear' and 'yarn'");
  }
  out.factor = sub.number("factor");
  if (!(out.factor > 0)) sub.fail("factor", "must be positive");
  if (out.type == RopeScaling::Type::kLlama3) {
    out.low_freq_factor = sub.number("low_freq_factor");
    out.high_freq_factor = sub.number("high_freq_factor");
    out.original_max_position_embeddings = sub.integer("original_max_position_embeddings");
    if (!(out.high_freq_factor > out.low_freq_factor) || !(out.low_freq_factor > 0)) {
      sub.fail("high_freq_factor", "must be greater than low_freq_factor (both positive)");
    }
  } else if (out.type == RopeScaling::Type::kYarn) {
    if (out.factor < 1) sub.fail("factor", "must be at least 1 for yarn");
    out.original_max_position_embeddings = sub.integer_or("original_max_position_embeddings", 0);
    if (out.original_max_position_embeddings < 0) {
      sub.fail("original_max_position_embeddings", "must be positive");
    }
    // transformers reads 0 or null betas as the defaults ("or 32").
    if (const double b = sub.number_or("beta_fast", 0); b != 0) out.beta_fast = b;
    if (const double b = sub.number_or("beta_slow", 0); b != 0) out.beta_slow = b;
    out.truncate = sub.boolean_or("truncate", true);
    if (const json* v = sub.find("attention_factor")) {
      out.attention_factor = sub.as_number("attention_factor", *v);
      if (!(*out.attention_factor > 0)) sub.fail("attention_factor", "must be positive");
    } else if (sub.find("mscale") && sub.find("mscale_all_dim")) {
      // DeepSeek's form: the ratio of two of the paper's factors.
      const double m = sub.number("mscale"), all = sub.number("mscale_all_dim");
      if (m != 0 && all != 0) {
        out.attention_factor = yarn_mscale(out.factor, m) / yarn_mscale(out.factor, all);
      }
    }
    // vLLM's own knobs, which transformers does not read: refused rather than ignored.
    for (const char* knob : {"attn_factor", "extrapolation_factor"}) {
      if (sub.find(knob) && sub.number(knob) != 1.0) {
        sub.fail(knob,
                 "is not 1; transformers has no such YaRN parameter (attention_factor "
                 "sets the scaling)");
      }
    }
  }
  if (out.type == RopeScaling::Type::kLlama3 && out.original_max_position_embeddings <= 0) {
    sub.fail("original_max_position_embeddings", "must be positive");
  }
  return out;
}

// rope_theta and rope_scaling at the top level (transformers 4), or both inside one
// rope_parameters object (transformers 5), which wins when a config has both.
void read_rope(const FieldReader& fields, const std::string& origin, ModelConfig& out) {
  out.rope_theta = fields.number_or("rope_theta", 10000.0);
  if (!(out.rope_theta > 0)) fields.fail("rope_theta", "must be positive");
  if (const json* scaling = fields.optional_object("rope_scaling")) {
    out.rope_scaling = read_rope_scaling(FieldReader(*scaling, origin, "rope_scaling."), fields,
                                         "rope_scaling", true);
  }
  if (const json* params = fields.optional_object("rope_parameters")) {
    for (const auto& item : params->items()) {
      if (item.value().is_object()) {
        fields.fail("rope_parameters", "gives parameters per layer type ('" + item.key() +
                                           "'), which is not supported");
      }
    }
    const FieldReader sub(*params, origin, "rope_parameters.");
    out.rope_theta = sub.number_or("rope_theta", out.rope_theta);
    if (!(out.rope_theta > 0)) sub.fail("rope_theta", "must be positive");
    const double partial = sub.number_or("partial_rotary_factor", 1.0);
    if (partial != 1.0) {
      sub.fail("partial_rotary_factor",
               "is " + FieldReader::describe(*sub.find("partial_rotary_factor")) +
                   "; only RoPE over the whole head (1.0) is supported");
    }
    out.rope_scaling = read_rope_scaling(sub, fields, "rope_parameters", false);
  }
}

// eos_token_id: one id or a list, each inside the vocabulary.
std::vector<int64_t> read_eos(const FieldReader& fields, int64_t vocab_size) {
  const json* v = fields.find("eos_token_id");
  if (!v) return {};
  std::vector<int64_t> ids;
  if (v->is_array()) {
    for (const json& id : *v)
      ids.push_back(fields.as_integer("eos_token_id", id));
  } else {
    ids.push_back(fields.as_integer("eos_token_id", *v));
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      fields.fail("eos_token_id", "holds " + std::to_string(id) + ", outside the vocabulary of " +
                                      std::to_string(vocab_size));
    }
  }
  return ids;
}

GenerationDefaults read_generation_defaults(const FieldReader& fields) {
  GenerationDefaults d;
  auto number = [&](const char* key, double lo, double hi, bool open_lo) -> std::optional<double> {
    const json* v = fields.find(key);
    if (!v) return std::nullopt;
    const double x = fields.as_number(key, *v);
    if (!(open_lo ? x > lo : x >= lo) || !(x <= hi)) {
      fields.fail(key, "is " + FieldReader::describe(*v) + ", outside " + (open_lo ? "(" : "[") +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return x;
  };
  d.temperature = number("temperature", 0.0, 100.0, false);
  d.top_p = number("top_p", 0.0, 1.0, true);
  d.min_p = number("min_p", 0.0, 1.0, false);
  d.repetition_penalty = number("repetition_penalty", 0.0, 100.0, true);
  d.top_k = fields.optional_integer("top_k");
  return d;
}

// Qwen2/Qwen3 keep a sliding_window value even when it is off, as transformers reads
// them: without use_sliding_window, or with a null window, every layer attends to the
// whole context; else the layers that `layer_types` calls "sliding_attention" use the
// window, or without layer_types those from max_window_layers on.
int64_t read_qwen_sliding_window(const FieldReader& fields, const json& config,
                                 int64_t num_layers) {
  if (!fields.boolean_or("use_sliding_window", false)) return 0;
  if (auto it = config.find("sliding_window"); it != config.end() && it->is_null()) return 0;
  const int64_t window = fields.integer_or("sliding_window", 4096);
  int64_t sliding = 0;
  if (const json* types = fields.find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != num_layers) {
      fields.fail("layer_types",
                  "must list one type for each of the " + std::to_string(num_layers) + " layers");
    }
    for (const json& t : *types) {
      if (t == "sliding_attention") {
        ++sliding;
      } else if (t != "full_attention") {
        fields.fail(
            "layer_types",
            "holds " + t.dump() + "; only \"full_attention\" and \"sliding_attention\" are known");
      }
    }
    if (sliding > 0 && sliding < num_layers) {
      fields.fail("layer_types",
                  "mixes sliding-window and full-attention layers, which is not "
                  "supported");
    }
  } else {
    const int64_t first = fields.integer_or("max_window_layers", 28);
    if (first > 0 && first < num_layers) {
      fields.fail("max_window_layers", "is " + std::to_string(first) +
                                           ": a mix of sliding-window and full-attention " +
                                           "layers is not supported");
    }
    sliding = first >= num_layers ? 0 : num_layers;
  }
  return sliding == 0 ? 0 : window;
}

void check_positive(const FieldReader& fields, const char* key, int64_t value) {
  if (value <= 0) fields.fail(key, "must be positive, not " + std::to_string(value));
}

// A size: positive, and at most `max` (sizes are ints in the kernels, and layer and head
// counts size allocations before any tensor is read).
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxCount = int64_t{1} << 16;
void check_size(const FieldReader& fields, const char* key, int64_t value, int64_t max) {
  check_positive(fields, key, value);
  if (value > max) {
    fields.fail(
        key, "is " + std::to_string(value) + "; at most " + std::to_string(max) + " is supported");
  }
}

// The context RoPE scaling gives, in double (checked before it becomes an integer).
double scaled_context(const ModelConfig& c) {
  if (!c.rope_scaling) return static_cast<double>(c.max_position_embeddings);
  const RopeScaling& s = *c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kYarn:
      return static_cast<double>(s.original_max_position_embeddings) * s.factor;
    case RopeScaling::Type::kLinear:
      return static_cast<double>(c.max_position_embeddings) * s.factor;
    case RopeScaling::Type::kLlama3:
      break;
  }
  return static_cast<double>(c.max_position_embeddings);
}

}  // namespace

const char* architecture_name(Architecture a) {
  for (const ArchitectureName& entry : kArchitectures) {
    if (entry.architecture == a) return entry.class_name;
  }
  return "?";
}

std::string GenerationDefaults::describe() const {
  std::string out;
  auto add = [&](const char* name, const std::string& value) {
    if (!out.empty()) out += ", ";
    out += std::string(name) + " " + value;
  };
  auto text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (temperature) add("temperature", text(*temperature));
  if (top_p) add("top_p", text(*top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", text(*min_p));
  if (repetition_penalty) add("repetition_penalty", text(*repetition_penalty));
  return out;
}

int64_t ModelConfig::kv_bytes_per_token(kernels::DType cache_dtype) const {
  return 2 * num_layers * num_kv_heads * head_dim * kernels::dtype_size(cache_dtype);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& origin) {
  const json config = parse_config_object(json_text, origin);
  const FieldReader fields(config, origin);

  ModelConfig out;
  out.architecture = read_architecture(config, fields);
  const bool is_qwen =
      out.architecture == Architecture::kQwen2 || out.architecture == Architecture::kQwen3;

  out.vocab_size = fields.integer("vocab_size");
  out.hidden_size = fields.integer("hidden_size");
  out.intermediate_size = fields.integer("intermediate_size");
  out.num_layers = fields.integer("num_hidden_layers");
  out.num_heads = fields.integer("num_attention_heads");
  check_size(fields, "vocab_size", out.vocab_size, kMaxSize);
  check_size(fields, "hidden_size", out.hidden_size, kMaxSize);
  check_size(fields, "intermediate_size", out.intermediate_size, kMaxSize);
  check_size(fields, "num_hidden_layers", out.num_layers, kMaxCount);
  check_size(fields, "num_attention_heads", out.num_heads, kMaxCount);

  out.num_kv_heads = fields.integer_or("num_key_value_heads", out.num_heads);
  check_size(fields, "num_key_value_heads", out.num_kv_heads, kMaxCount);
  if (out.num_heads % out.num_kv_heads != 0) {
    fields.fail("num_key_value_heads", "(" + std::to_string(out.num_kv_heads) +
                                           ") must divide num_attention_heads (" +
                                           std::to_string(out.num_heads) + ")");
  }

  // Qwen3Config defaults head_dim to 128; the others derive it from the hidden size.
  if (const std::optional<int64_t> head_dim = fields.optional_integer("head_dim")) {
    out.head_dim = *head_dim;
  } else if (out.architecture == Architecture::kQwen3) {
    out.head_dim = 128;
  } else {
    if (out.hidden_size % out.num_heads != 0) {
      fields.fail("num_attention_heads",
                  "(" + std::to_string(out.num_heads) + ") must divide hidden_size (" +
                      std::to_string(out.hidden_size) + ") when head_dim is not given");
    }
    out.head_dim = out.hidden_size / out.num_heads;
  }
  check_size(fields, "head_dim", out.head_dim, kMaxCount);
  if (out.head_dim % 2 != 0) fields.fail("head_dim", "must be even for rotary embeddings");
  if (out.num_heads * out.head_dim > kMaxSize) {  // both at most 2^16: no overflow
    fields.fail("head_dim", "(" + std::to_string(out.head_dim) + ") times num_attention_heads (" +
                                std::to_string(out.num_heads) + ") must be at most " +
                                std::to_string(kMaxSize));
  }

  out.rms_norm_eps = fields.number_or("rms_norm_eps", 1e-6);
  if (!(out.rms_norm_eps >= 0)) fields.fail("rms_norm_eps", "must not be negative");
  read_rope(fields, origin, out);
  if (out.rope_scaling && out.rope_scaling->type == RopeScaling::Type::kYarn &&
      !(out.rope_theta > 1)) {
    fields.fail("rope_theta",
                "must be above 1 with yarn RoPE scaling, whose correction "
                "divides by log(rope_theta)");
  }
  const int64_t default_max_positions = out.architecture == Architecture::kLlama     ? 2048
                                        : out.architecture == Architecture::kMistral ? 4096 * 32
                                                                                     : 32768;
  out.max_position_embeddings = fields.integer_or("max_position_embeddings", default_max_positions);
  check_size(fields, "max_position_embeddings", out.max_position_embeddings, kMaxSize);
  if (out.rope_scaling && out.rope_scaling->type == RopeScaling::Type::kYarn &&
      out.rope_scaling->original_max_position_embeddings == 0) {
    out.rope_scaling->original_max_position_embeddings = out.max_position_embeddings;
  }
  if (const double context = scaled_context(out); !(context >= 1 && context <= kMaxSize)) {
    char text[160];
    std::snprintf(
        text, sizeof text,
        "with the RoPE scaling factor %g, gives a context of %g tokens, outside [1, %lld]",
        out.rope_scaling ? out.rope_scaling->factor : 1.0, context,
        static_cast<long long>(kMaxSize));
    fields.fail("max_position_embeddings", text);
  }

  if (out.architecture == Architecture::kMistral) {
    // MistralConfig defaults to 4096; an explicit null (v0.2 and later) turns it off.
    auto it = config.find("sliding_window");
    out.sliding_window = it == config.end() ? 4096 : fields.integer_or("sliding_window", 0);
  } else if (is_qwen) {
    out.sliding_window = read_qwen_sliding_window(fields, config, out.num_layers);
  }
  if (out.sliding_window < 0) fields.fail("sliding_window", "must not be negative");

  out.tie_word_embeddings = fields.boolean_or("tie_word_embeddings", false);
  // Qwen2 always has q/k/v biases. Llama's, Mistral's and Qwen3's attention_bias
  // would put one on o_proj too, which no supported checkpoint uses.
  if (out.architecture == Architecture::kQwen2) {
    out.attention_bias = true;
  } else if (fields.boolean_or("attention_bias", false)) {
    fields.fail("attention_bias", "is true (biases on q/k/v/o_proj), which is not supported");
  }
  if (fields.boolean_or("mlp_bias", false)) {
    fields.fail("mlp_bias", "is true, which is not supported");
  }
  out.qk_norm = out.architecture == Architecture::kQwen3;
  if (const std::optional<std::string> act = fields.optional_string("hidden_act")) {
    if (*act != "silu") fields.fail("hidden_act", "is '" + *act + "'; only 'silu' is supported");
  }

  const std::optional<kernels::DType> dtype = read_dtype(fields);
  out.dtype = dtype.value_or(kernels::DType::kF32);  // what transformers loads without one
  out.dtype_given = dtype.has_value();
  out.bos_token_id = fields.optional_integer("bos_token_id");
  out.eos_token_ids = read_eos(fields, out.vocab_size);
  if (out.bos_token_id && (*out.bos_token_id < 0 || *out.bos_token_id >= out.vocab_size)) {
    fields.fail("bos_token_id", "is " + std::to_string(*out.bos_token_id) +
                                    ", outside the vocabulary of " +
                                    std::to_string(out.vocab_size));
  }
  return out;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const std::filesystem::path file = model_dir / "config.json";
  ModelConfig config = parse_model_config(read_config_file(file), file.string());
  // Chat checkpoints often name their end-of-turn token only in generation_config.json
  // (Llama 3 Instruct's <|eot_id|>): generation stops on those ids too.
  const std::filesystem::path generation = model_dir / "generation_config.json";
  if (std::filesystem::exists(generation)) {
    const json g = parse_config_object(read_config_file(generation), generation.string());
    const FieldReader fields(g, generation.string());
    config.generation_defaults = read_generation_defaults(fields);
    for (int64_t id : read_eos(fields, config.vocab_size)) {
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) ==
          config.eos_token_ids.end()) {
        config.eos_token_ids.push_back(id);
      }
    }
  }
  return config;
}

int64_t ModelConfig::context_length() const {
  // parse_model_config checked that it lies in [1, 2^31).
  return static_cast<int64_t>(scaled_context(*this));
}

float ModelConfig::attention_scale() const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (!rope_scaling || rope_scaling->type != RopeScaling::Type::kYarn) return scale;
  const RopeScaling& s = *rope_scaling;
  const double factor = s.attention_factor.value_or(yarn_mscale(s.factor));
  return static_cast<float>(scale * factor * factor);
}

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  // Float32 throughout, step by step, as transformers' _compute_default_rope_parameters
  // and _compute_llama3_parameters do on float tensors.
  const int64_t half = config.head_dim / 2;
  const float dim = static_cast<float>(config.head_dim);
  const float base = static_cast<float>(config.rope_theta);
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  if (!config.rope_scaling) return inv_freq;

  const RopeScaling& s = *config.rope_scaling;
  const float factor = static_cast<float>(s.factor);
  if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq)
      f = f / factor;
    return inv_freq;
  }
  if (s.type == RopeScaling::Type::kYarn) {
    // _compute_yarn_parameters: the band of dimensions between beta_fast and beta_slow
    // rotations over the original context (in double, as Python's math), then a ramp
    // from the kept frequencies (below it) to the divided ones (above it), in float32.
    // `factor` is the config's: vLLM's and llama.cpp's reading (transformers 4.5x takes
    // max_position_embeddings / original_max_position_embeddings instead when both are
    // given, which differs from it when a config sets the factor but not the length).
    const double old_context = static_cast<double>(s.original_max_position_embeddings);
    const auto correction_dim = [&](double rotations) {
      return (static_cast<double>(config.head_dim) *
              std::log(old_context / (rotations * 2.0 * std::numbers::pi))) /
             (2.0 * std::log(config.rope_theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(config.head_dim - 1));
    if (low == high) high += 0.001;
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    for (int64_t i = 0; i < half; ++i) {
      const float pos_freq = std::pow(base, static_cast<float>(2 * i) / dim);
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
      const float keep = 1.0f - ramp;
      inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
    }
    return inv_freq;
  }

  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(old_context / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / s.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (float& f : inv_freq) {
    const float wavelen = two_pi / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_freq_wavelen) {           // low frequencies: divided
      f = f / factor;
      continue;
    }
    const float smooth =
        (static_cast<float>(old_context) / wavelen - static_cast<float>(s.low_freq_factor)) /
        static_cast<float>(s.high_freq_factor - s.low_freq_factor);
    f = (1.0f - smooth) * f / factor + smooth * f;
  }
  return inv_freq;
}

}  // namespace pagellm::engine
