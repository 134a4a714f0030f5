#pragma once
// Tool calls in a model's text, as OpenAI's API returns them: the chat reply's
// `tool_calls`, each a function name and its arguments as JSON text, and the text
// around them as `content`. Models write calls in a syntax their chat template teaches:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number,
//                anywhere (Qwen 2.5 and 3, Hermes, SmolLM3)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole reply, several
//                separated by ';', after an optional <|python_tag|> (Llama 3.1, 3.2)
//   mistral      [TOOL_CALLS] then a JSON list of {"name", "arguments"} to the end, or
//                (tokenizers v11 on) [TOOL_CALLS]NAME[ARGS]{...}, once for each call
// A call whose JSON does not read as one (no string "name", malformed, cut short) stays
// in the content as the model wrote it, so that nothing the model wrote is lost.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::server {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// "none", "hermes", "llama3_json", "mistral"; nullopt for another name.
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// The syntax a chat template teaches its model, from the template's source; kNone when
// it teaches none of them.
ToolCallFormat tool_call_format_of_template(std::string_view chat_template_source);

struct ParsedToolCall {
  std::string name;
  // JSON text: the object the model wrote ({} when it wrote none; as a JSON string when
  // it wrote a string that does not hold an object)
  std::string arguments;
};

// What a piece of the model's text adds to the reply.
struct ToolCallDelta {
  std::string content;
  std::vector<ParsedToolCall> calls;
  void append(ToolCallDelta&& more);
};

// Splits a reply's text, as it arrives in pieces, into content and calls. The content
// is held back while it could still be the start of a call (a partial marker; for
// llama3_json, the whole reply once it opens with '{'), and whitespace until other text
// follows it: a reply with calls leaves out the whitespace at the end of its content,
// and has no content when nothing else is left. Whatever the pieces, they add up to
// what the whole text gives (parse_tool_calls).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format);

  ToolCallDelta feed(std::string_view text);
  // The end of the text: whatever was held back.
  ToolCallDelta finish();

  int calls() const { return calls_; }

 private:
  void take(ToolCallDelta& out);
  void end_call(ToolCallDelta& out, std::string_view body, std::string_view end_marker);
  void add_content(ToolCallDelta& out, std::string_view text);

  ToolCallFormat format_;
  std::string pending_;      // text not yet placed
  bool in_call_ = false;     // pending_ is a call's body
  size_t searched_ = 0;      // in a call: where the end marker may start, at the earliest
  std::string call_marker_;  // inside a call: the marker that opened it (it goes back
                             // into the content when the body is not a call)
  std::string blank_;        // whitespace after the content so far, held
  bool plain_;  // no more calls are looked for (kNone; llama3_json once the reply is text)
  int calls_ = 0;
};

struct ParsedToolCalls {
  std::optional<std::string> content;  // null when there are calls and no other text
  std::vector<ParsedToolCall> calls;
};

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text);

}  // namespace pagellm::server
