#include "server/tool_call_parser.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "server/json_scan.h"
#include "server/text_markers.h"

namespace pagellm::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// Where the JSON array or object that opens at `begin` ends (one past its closing
// bracket), outside strings; npos when it does not close or nests past kMaxJsonDepth.
size_t json_value_end(std::string_view text, size_t begin) {
  size_t end = std::string_view::npos;
  scan_json_brackets(text, begin, [&](size_t at, int depth) {
    if (depth == 0) end = at + 1;
    return depth > 0 && depth <= kMaxJsonDepth;  // deeper, the call stays text
  });
  return end;
}

// Arguments as the reply gives them: compact JSON text.
std::string json_text(const ordered_json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<ParsedToolCall> call_of(const ordered_json& value) {
  if (!value.is_object()) return std::nullopt;
  auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  ParsedToolCall call;
  call.name = name->get<std::string>();
  auto arguments = value.find("arguments");
  if (arguments == value.end()) arguments = value.find("parameters");  // Llama 3's word
  if (arguments == value.end() || arguments->is_null()) {
    call.arguments = "{}";
  } else if (arguments->is_string() &&
             ordered_json::parse(arguments->get_ref<const std::string&>(), nullptr, false)
                 .is_object()) {
    call.arguments = arguments->get<std::string>();  // already JSON text, as OpenAI sends it
  } else {
    call.arguments = json_text(*arguments);
  }
  return call;
}

// The calls a body holds: JSON objects, or lists of them, separated by whitespace or
// ';'. nullopt unless every value is a call and there is at least one.
std::optional<std::vector<ParsedToolCall>> json_calls_in(std::string_view body) {
  std::vector<ParsedToolCall> calls;
  size_t pos = 0;
  while (true) {
    pos = body.find_first_not_of(" \t\r\n;", pos);
    if (pos == std::string_view::npos) break;
    if (body[pos] != '{' && body[pos] != '[') return std::nullopt;
    const size_t end = json_value_end(body, pos);
    if (end == std::string_view::npos) return std::nullopt;
    const ordered_json value = ordered_json::parse(body.substr(pos, end - pos), nullptr, false);
    if (value.is_discarded()) return std::nullopt;
    if (value.is_array()) {
      if (value.empty()) return std::nullopt;
      for (const ordered_json& item : value) {
        std::optional<ParsedToolCall> call = call_of(item);
        if (!call) return std::nullopt;
        calls.push_back(std::move(*call));
      }
    } else {
      std::optional<ParsedToolCall> call = call_of(value);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    pos = end;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

std::string_view trimmed(std::string_view s) {
  const size_t first = s.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kWhitespace) - first + 1);
}

// Mistral's tokenizers from v11 on write each call as NAME[ARGS]{...}, and a further
// call after [TOOL_CALLS] again.
std::optional<std::vector<ParsedToolCall>> named_calls_in(std::string_view body) {
  constexpr std::string_view kArgs = "[ARGS]";
  std::vector<ParsedToolCall> calls;
  for (size_t pos = 0; pos <= body.size();) {
    size_t next = body.find(kMistralStart, pos);
    if (next == std::string_view::npos) next = body.size();
    const std::string_view one = body.substr(pos, next - pos);
    pos = next + kMistralStart.size();
    const size_t args = one.find(kArgs);
    if (args == std::string_view::npos) return std::nullopt;
    const std::string_view name = trimmed(one.substr(0, args));
    const bool plain_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
    if (!plain_name) return std::nullopt;
    const std::string_view arguments = trimmed(one.substr(args + kArgs.size()));
    if (arguments.empty() || arguments[0] != '{' ||
        json_value_end(arguments, 0) != arguments.size()) {
      return std::nullopt;
    }
    const ordered_json value = ordered_json::parse(arguments, nullptr, false);
    if (value.is_discarded()) return std::nullopt;
    calls.push_back({std::string(name), json_text(value)});
  }
  return calls;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                           ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    if (name == tool_call_format_name(f)) return f;
  }
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

ToolCallFormat tool_call_format_of_template(std::string_view source) {
  const auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  // Qwen3-Coder's template teaches <tool_call> around XML (<function=NAME>), not JSON.
  if (has(kHermesStart)) return has("<function=") ? ToolCallFormat::kNone : ToolCallFormat::kHermes;
  if (has(kMistralStart)) return ToolCallFormat::kMistral;
  // Llama 3.1 and 3.2 name the tag, or describe the object in words.
  if (has(kPythonTag) || has("dictionary of argument name and its value")) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

ToolCallStream::ToolCallStream(ToolCallFormat format)
    : format_(format), plain_(format == ToolCallFormat::kNone) {}

void ToolCallDelta::append(ToolCallDelta&& more) {
  content += more.content;
  for (ParsedToolCall& c : more.calls)
    calls.push_back(std::move(c));
}

ToolCallDelta ToolCallStream::feed(std::string_view text) {
  ToolCallDelta out;
  pending_ += text;
  take(out);
  return out;
}

ToolCallDelta ToolCallStream::finish() {
  ToolCallDelta out;
  if (in_call_) {
    end_call(out, pending_, "");  // open to the end, or cut short
  } else {
    add_content(out, pending_);  // a partial marker is text after all
  }
  pending_.clear();
  if (calls_ == 0) out.content += blank_;  // without calls, the content is all the text
  blank_.clear();
  return out;
}

void ToolCallStream::take(ToolCallDelta& out) {
  while (!pending_.empty()) {
    if (plain_) {
      add_content(out, pending_);
      pending_.clear();
      return;
    }
    if (in_call_) {
      // hermes closes each call; the others run to the end of the text.
      if (format_ != ToolCallFormat::kHermes) return;
      // Each byte of a long body is looked at once, not again with every piece.
      const size_t end = pending_.find(kHermesEnd, searched_);
      if (end == std::string::npos) {
        searched_ = pending_.size() - std::min(pending_.size(), kHermesEnd.size() - 1);
        return;
      }
      end_call(out, std::string_view(pending_).substr(0, end), kHermesEnd);
      pending_.erase(0, end + kHermesEnd.size());
      continue;
    }
    if (format_ == ToolCallFormat::kLlama3Json) {
      // Calls only as the whole reply: after whitespace, the tag or an object.
      const size_t first = pending_.find_first_not_of(kWhitespace);
      add_content(out, std::string_view(pending_).substr(0, first));
      pending_.erase(0, first);
      if (pending_.empty()) return;
      if (pending_.starts_with(kPythonTag)) {
        call_marker_ = kPythonTag;
        pending_.erase(0, kPythonTag.size());
        in_call_ = true;
      } else if (pending_[0] == '{') {
        call_marker_.clear();  // the brace is the call's own
        in_call_ = true;
      } else if (kPythonTag.starts_with(pending_)) {
        return;  // maybe the tag, cut
      } else {
        plain_ = true;
      }
      continue;
    }
    const std::string_view start =
        format_ == ToolCallFormat::kHermes ? kHermesStart : kMistralStart;
    const size_t at = pending_.find(start);
    if (at != std::string::npos) {
      add_content(out, std::string_view(pending_).substr(0, at));
      pending_.erase(0, at + start.size());
      call_marker_ = start;
      in_call_ = true;
      continue;
    }
    const size_t sure = pending_.size() - partial_marker(pending_, start);
    add_content(out, std::string_view(pending_).substr(0, sure));
    pending_.erase(0, sure);
    return;
  }
}

void ToolCallStream::end_call(ToolCallDelta& out, std::string_view body,
                              std::string_view end_marker) {
  in_call_ = false;
  searched_ = 0;
  std::optional<std::vector<ParsedToolCall>> calls = json_calls_in(body);
  if (!calls && format_ == ToolCallFormat::kMistral) calls = named_calls_in(body);
  if (calls) {
    calls_ += static_cast<int>(calls->size());
    for (ParsedToolCall& c : *calls)
      out.calls.push_back(std::move(c));
  } else {
    add_content(out, call_marker_ + std::string(body) + std::string(end_marker));
  }
  call_marker_.clear();
  // After a call, llama3_json has nothing more to find: what follows is text.
  if (format_ == ToolCallFormat::kLlama3Json) plain_ = true;
}

void ToolCallStream::add_content(ToolCallDelta& out, std::string_view text) {
  const size_t last = text.find_last_not_of(kWhitespace);
  if (last == std::string_view::npos) {
    blank_ += text;
    return;
  }
  out.content += blank_;
  out.content += text.substr(0, last + 1);
  blank_ = text.substr(last + 1);
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text) {
  ToolCallStream stream(format);
  ToolCallDelta all = stream.feed(text);
  all.append(stream.finish());
  ParsedToolCalls out;
  out.calls = std::move(all.calls);
  if (out.calls.empty() || !all.content.empty()) out.content = std::move(all.content);
  return out;
}

}  // namespace pagellm::server
