#include "engine/tokenizer_config.h"

#include <nlohmann/json.hpp>

#include "engine/config_file.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

// A special token is written either as a string or as an AddedToken object.
std::optional<std::string> token_string(const json& config, const char* key,
                                        const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  throw ConfigError(origin + ": field '" + key +
                    "' must be a string, null or an object with a string 'content'");
}

std::optional<bool> optional_bool(const json& config, const char* key, const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw ConfigError(origin + ": field '" + key + "' must be a boolean");
  return it->get<bool>();
}

// chat_template is a string, or a list of {"name", "template"} of which "default" is used.
std::optional<std::string> chat_template(const json& config, const std::string& origin) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    throw ConfigError(origin + ": 'chat_template' is a list without a template named 'default'");
  }
  throw ConfigError(origin + ": field 'chat_template' must be a string or a list of templates");
}

}  // namespace

TokenizerConfig parse_tokenizer_config(const std::string& json_text, const std::string& origin) {
  const json config = parse_config_object(json_text, origin);

  TokenizerConfig out;
  out.bos_token = token_string(config, "bos_token", origin);
  out.eos_token = token_string(config, "eos_token", origin);
  out.pad_token = token_string(config, "pad_token", origin);
  out.unk_token = token_string(config, "unk_token", origin);
  out.add_bos_token = optional_bool(config, "add_bos_token", origin);
  out.add_eos_token = optional_bool(config, "add_eos_token", origin);
  out.clean_up_tokenization_spaces =
      optional_bool(config, "clean_up_tokenization_spaces", origin).value_or(false);
  out.chat_template = chat_template(config, origin);
  if (auto it = config.find("model_max_length"); it != config.end() && it->is_number()) {
    // transformers writes 1e30 for "no limit".
    const double value = it->get<double>();
    if (value > 0 && value < 1e15) out.model_max_length = static_cast<int64_t>(value);
  }
  return out;
}

TokenizerConfig load_tokenizer_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "tokenizer_config.json";
  TokenizerConfig out;
  if (std::filesystem::exists(path))
    out = parse_tokenizer_config(read_config_file(path), path.string());
  if (!out.chat_template) {
    const auto jinja = model_dir / "chat_template.jinja";
    if (std::filesystem::exists(jinja)) out.chat_template = read_config_file(jinja);
  }
  return out;
}

}  // namespace pagellm::engine
