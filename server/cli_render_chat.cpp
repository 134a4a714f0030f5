// `pagellm render-chat`: renders conversations with a model's chat template, one JSON
// object per input line, one JSON string (the prompt) per output line.

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/chat_template.h"
#include "server/cli.h"
#include "server/cli_args.h"

namespace pagellm::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagellm render-chat --model DIR [--chat-template FILE]\n"
    "\n"
    "Reads one JSON object per line from stdin, e.g.\n"
    "  {\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": "
    "true}\n"
    "and writes the rendered prompt as one JSON string per line. Other keys of the object\n"
    "(tools, documents, enable_thinking, ...) become template variables. A line that fails\n"
    "is reported on stderr and answered with null; the exit status is then 1.\n"
    "The messages reach the template as given, as transformers' apply_chat_template has\n"
    "them; the server's /tokenize shows what a chat request renders to (its tool call\n"
    "arguments made objects, an assistant's reasoning as reasoning_content).\n"
    "\n"
    "  --model DIR           model folder; only tokenizer_config.json is read\n"
    "  --chat-template FILE  use this Jinja template instead of the model's own\n";

// JSON allows U+2028, U+2029 and U+0085 raw, but tools that split lines on Unicode
// line breaks would cut the output there; escape them.
std::string json_line(const std::string& text) {
  std::string out =
      nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 3, "\xE2\x80\xA8") == 0 || out.compare(i, 3, "\xE2\x80\xA9") == 0) {
      escaped += out[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else if (out.compare(i, 2, "\xC2\x85") == 0) {
      escaped += "\\u0085";
      i += 1;
    } else {
      escaped.push_back(out[i]);
    }
  }
  return escaped;
}

// Renders one input line; throws on bad input or a template error.
std::string render_line(const engine::ChatTemplate& chat_template,
                        const engine::ChatRenderOptions& defaults, const std::string& line) {
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(std::string("not valid JSON: ") + e.what());
  }
  if (!request.is_object()) throw std::runtime_error("expected a JSON object");
  auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) {
    throw std::runtime_error("field 'messages' must be a list of messages");
  }
  engine::ChatRenderOptions options = defaults;
  for (auto it = request.begin(); it != request.end(); ++it) {
    if (it.key() == "messages") continue;
    if (it.key() == "add_generation_prompt") {
      if (!it->is_boolean())
        throw std::runtime_error("field 'add_generation_prompt' must be a boolean");
      options.add_generation_prompt = it->get<bool>();
      continue;
    }
    options.set(it.key(), *it);
  }
  return chat_template.render(*messages, options);
}

}  // namespace

int run_render_chat(Args args) {
  std::optional<std::string> model_dir;
  std::optional<std::string> template_path;
  try {
    ArgReader reader(args, {"--model", "--chat-template"}, {});
    if (reader.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!reader.positional().empty()) {
      throw UsageError("unexpected argument '" + reader.positional().front() + "'");
    }
    model_dir = reader.required_option("--model");
    template_path = reader.option("--chat-template");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagellm render-chat: %s\n\n%s", e.what(), kUsage);
    return 2;
  }

  std::optional<engine::ChatTemplate> chat_template;
  engine::ChatRenderOptions defaults;
  try {
    defaults = engine::chat_render_options(engine::load_tokenizer_config(*model_dir));
    std::optional<std::filesystem::path> override_path;
    if (template_path) override_path = *template_path;
    chat_template = engine::load_chat_template(*model_dir, override_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm render-chat: %s\n", e.what());
    return 1;
  }

  int failed = 0;
  std::string line;
  for (size_t line_number = 1; std::getline(std::cin, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A blank line is a bad line too, as in `pagellm tokenize`: one output line per input
    // line keeps the two streams in step.
    try {
      const std::string prompt = render_line(*chat_template, defaults, line);
      std::cout << json_line(prompt) << '\n';
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "null\n";
      std::cerr << "pagellm render-chat: line " << line_number << ": " << e.what() << '\n';
    }
    std::cout.flush();
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace pagellm::cli
