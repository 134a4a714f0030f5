#pragma once
// The parts of a Hugging Face `tokenizer_config.json` that serving needs: special
// token strings, BOS/EOS insertion, decode cleanup and the chat template.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace pagellm::engine {

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

struct TokenizerConfig {
  std::optional<std::string> bos_token;  // unset when null or absent
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;  // unset: the tokenizer.json post-processor decides
  std::optional<bool> add_eos_token;
  bool clean_up_tokenization_spaces = false;
  std::optional<std::string> chat_template;
  std::optional<int64_t> model_max_length;  // unset when absent or a "very large" sentinel
};

// Parses tokenizer_config.json text; `origin` names the file in error messages.
TokenizerConfig parse_tokenizer_config(const std::string& json_text, const std::string& origin);

// Reads DIR/tokenizer_config.json (an absent file gives the defaults). When the config
// has no chat_template, DIR/chat_template.jinja is used if present, as newer models ship it.
TokenizerConfig load_tokenizer_config(const std::filesystem::path& model_dir);

}  // namespace pagellm::engine
