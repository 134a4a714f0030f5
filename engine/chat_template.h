#pragma once
// Chat templates: a model's Jinja `chat_template`, rendered byte for byte as Python
// jinja2 renders it under transformers' apply_chat_template (trim_blocks, lstrip_blocks,
// loopcontrols, lenient Undefined, tojson = json.dumps(ensure_ascii=False)).
//
// Parse once per model; render() is const and safe to call from many threads.

#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_template_error.h"
#include "engine/jinja_value.h"
#include "engine/tokenizer_config.h"

namespace pagellm::engine {

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  std::optional<std::string> bos_token;  // unset: the variable is undefined
  std::optional<std::string> eos_token;
  // Further template variables (tools, documents, enable_thinking, ...). `tools` and
  // `documents` are None unless set here, as transformers passes them.
  std::vector<std::pair<std::string, jinja::Value>> variables;

  ChatRenderOptions& set(std::string name, const nlohmann::json& value);
  ChatRenderOptions& set(std::string name, const nlohmann::ordered_json& value);
};

// Options carrying the config's bos_token and eos_token.
ChatRenderOptions chat_render_options(const TokenizerConfig& config);

class ChatTemplate {
 public:
  // Throws ChatTemplateError for a syntax error or an unsupported construct.
  static ChatTemplate parse(std::string source);

  // `messages` is the list of message objects. An ordered_json keeps the keys' order
  // as the client sent them, which matters where a template prints a whole object.
  // Throws ChatTemplateError (including the message of raise_exception()).
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& options) const;
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatRenderOptions& options) const;
  std::string render(const jinja::Value& messages, const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  struct Parsed;
  ChatTemplate(std::string source, std::shared_ptr<const Parsed> parsed)
      : source_(std::move(source)), parsed_(std::move(parsed)) {}

  std::string source_;
  std::shared_ptr<const Parsed> parsed_;
};

// Decides which template applies: the file at `override_path` when given, else the
// model's own (`chat_template` of DIR/tokenizer_config.json, or DIR/chat_template.jinja).
// Throws ChatTemplateError naming the file when it cannot be read or parsed, or when
// neither exists.
ChatTemplate load_chat_template(const std::filesystem::path& model_dir,
                                const std::optional<std::filesystem::path>& override_path);

}  // namespace pagellm::engine
