#include "engine/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/jinja_eval.h"
#include "engine/jinja_parser.h"

namespace pagellm::engine {

struct ChatTemplate::Parsed {
  jinja::Body body;
};

ChatRenderOptions& ChatRenderOptions::set(std::string name, const nlohmann::json& value) {
  variables.emplace_back(std::move(name), jinja::from_json(value));
  return *this;
}

ChatRenderOptions& ChatRenderOptions::set(std::string name, const nlohmann::ordered_json& value) {
  variables.emplace_back(std::move(name), jinja::from_json(value));
  return *this;
}

ChatRenderOptions chat_render_options(const TokenizerConfig& config) {
  ChatRenderOptions options;
  options.bos_token = config.bos_token;
  options.eos_token = config.eos_token;
  return options;
}

ChatTemplate ChatTemplate::parse(std::string source) {
  auto parsed = std::make_shared<Parsed>();
  parsed->body = jinja::parse_template(source);
  return ChatTemplate(std::move(source), std::move(parsed));
}

std::string ChatTemplate::render(const nlohmann::json& messages,
                                 const ChatRenderOptions& options) const {
  return render(jinja::from_json(messages), options);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                 const ChatRenderOptions& options) const {
  return render(jinja::from_json(messages), options);
}

std::string ChatTemplate::render(const jinja::Value& messages,
                                 const ChatRenderOptions& options) const {
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.reserve(6 + options.variables.size());
  vars.emplace_back("messages", messages);
  vars.emplace_back("add_generation_prompt", jinja::Value(options.add_generation_prompt));
  if (options.bos_token) vars.emplace_back("bos_token", jinja::Value(*options.bos_token));
  if (options.eos_token) vars.emplace_back("eos_token", jinja::Value(*options.eos_token));
  vars.emplace_back("tools", jinja::Value::none());
  vars.emplace_back("documents", jinja::Value::none());
  // Later entries win: the caller's variables override the defaults above.
  for (const auto& variable : options.variables)
    vars.push_back(variable);
  return jinja::render(parsed_->body, std::move(vars));
}

namespace {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ChatTemplateError(path.string() + ": cannot open chat template file");
  // A folder opens as a stream and reads as nothing.
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw ChatTemplateError(path.string() + ": cannot read chat template file (a folder)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ChatTemplateError(path.string() + ": cannot read chat template file");
  return text.str();
}

ChatTemplate parse_from(std::string source, const std::string& origin) {
  try {
    return ChatTemplate::parse(std::move(source));
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(origin + ": " + e.what());
  }
}

}  // namespace

ChatTemplate load_chat_template(const std::filesystem::path& model_dir,
                                const std::optional<std::filesystem::path>& override_path) {
  if (override_path) return parse_from(read_text_file(*override_path), override_path->string());
  if (!std::filesystem::is_directory(model_dir)) {
    throw ChatTemplateError("model directory " + model_dir.string() + " not found");
  }
  TokenizerConfig config;
  try {
    config = load_tokenizer_config(model_dir);
  } catch (const ConfigError& e) {
    throw ChatTemplateError(e.what());
  }
  if (!config.chat_template) {
    throw ChatTemplateError("model " + model_dir.string() +
                            " has no chat template (no 'chat_template' in tokenizer_config.json "
                            "and no chat_template.jinja); pass --chat-template FILE");
  }
  return parse_from(*config.chat_template, "chat template of model " + model_dir.string());
}

}  // namespace pagellm::engine
