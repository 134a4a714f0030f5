#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "engine/chat_template.h"
#include "engine/utf8.h"
#include "server/json_scan.h"

namespace pagellm::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string dump(const ordered_json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] void fail(std::string message, std::string param) {
  throw ApiException(invalid_request(std::move(message), std::move(param)));
}

// The deepest nesting of arrays and objects in `text`, outside strings; stops counting
// past kMaxJsonDepth. Malformed text is the parser's to refuse.
int json_depth(const std::string& text) {
  int deepest = 0;
  scan_json_brackets(text, 0, [&](size_t, int depth) {
    deepest = std::max(deepest, depth);
    return deepest <= kMaxJsonDepth;
  });
  return deepest;
}

ordered_json parse_body(const std::string& body) {
  if (json_depth(body) > kMaxJsonDepth) {
    fail("the request body nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
             " deep",
         "");
  }
  ordered_json value;
  try {
    value = ordered_json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past a double's range (1e400).
    fail(std::string("the request body is not valid JSON: ") + e.what(), "");
  }
  if (!value.is_object()) fail("the request body must be a JSON object", "");
  return value;
}

// A field, or nullptr when absent or null (OpenAI clients send null for "unset").
const ordered_json* field(const ordered_json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// What a refused field held, for its error: a number as written, anything else by kind.
std::string describe(const ordered_json& v) {
  if (v.is_number()) return v.dump();
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  return v.is_array() ? "an array" : "an object";
}

std::optional<double> number_field(const ordered_json& body, const char* name, double lo, double hi,
                                   bool lo_open = false) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  const double x = v->is_number() ? v->get<double>() : 0.0;
  if (!v->is_number() || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    fail(std::string("'") + name + "' must be a number in " + range + ", got " + describe(*v),
         name);
  }
  return x;
}

std::optional<int64_t> int_field(const ordered_json& body, const char* name, int64_t lo,
                                 int64_t hi) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  // Unsigned values over int64 would wrap in get<int64_t>(); they are out of range anyway.
  const bool in_range = v->is_number_integer() &&
                        !(v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi)) &&
                        v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
  if (!in_range) {
    fail(std::string("'") + name + "' must be an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got " + describe(*v),
         name);
  }
  return v->get<int64_t>();
}

std::optional<bool> bool_field(const ordered_json& body, const char* name) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) fail(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

std::optional<std::string> string_field(const ordered_json& body, const char* name) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail(std::string("'") + name + "' must be a string", name);
  return v->get<std::string>();
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

void check_min_tokens(const scheduler::SamplingParams& p) {
  if (p.min_tokens > p.max_tokens) {
    fail("'min_tokens' (" + std::to_string(p.min_tokens) + ") must not be above 'max_tokens' (" +
             std::to_string(p.max_tokens) + ")",
         "min_tokens");
  }
}

namespace {

// The fields chat and completions share.
void parse_common(const ordered_json& body, CompletionRequest& r) {
  r.model = string_field(body, "model").value_or("");
  scheduler::SamplingParams& p = r.params;
  auto max_tokens = int_field(body, "max_tokens", 1, kMaxInt32);
  if (auto v = int_field(body, "max_completion_tokens", 1, kMaxInt32)) {
    max_tokens = v;
    r.max_tokens_param = "max_completion_tokens";
  }
  if (max_tokens) {
    p.max_tokens = static_cast<int32_t>(*max_tokens);
    r.max_tokens_set = true;
  }
  if (auto v = number_field(body, "temperature", 0.0, 2.0)) p.temperature = float(*v);
  if (auto v = number_field(body, "top_p", 0.0, 1.0, true)) p.top_p = float(*v);
  if (auto v = int_field(body, "top_k", -1, kMaxInt32))
    p.top_k = static_cast<int32_t>(std::max<int64_t>(*v, 0));
  if (auto v = number_field(body, "min_p", 0.0, 1.0)) p.min_p = float(*v);
  if (const ordered_json* v = field(body, "seed")) {
    if (!v->is_number_integer()) fail("'seed' must be an integer, got " + describe(*v), "seed");
    p.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  if (auto v = number_field(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = float(*v);
  if (auto v = number_field(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = float(*v);
  if (auto v = number_field(body, "repetition_penalty", 0.0, 10.0, true)) {
    p.repetition_penalty = float(*v);
  }
  if (auto v = int_field(body, "n", 1, kMaxChoices)) p.n = static_cast<int32_t>(*v);
  if (const ordered_json* v = field(body, "logit_bias")) {
    if (!v->is_object()) fail("'logit_bias' must map token ids to numbers", "logit_bias");
    std::unordered_set<int64_t> named;  // ("5" and "05" name one token)
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      // At most 10 digits: stoll cannot overflow.
      const bool digits = !key.empty() && key.size() <= 10 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      const long long id = digits ? std::stoll(key) : -1;
      if (id < 0 || id > kMaxInt32) {
        fail("'logit_bias' keys must be token ids, not '" + key + "'", "logit_bias");
      }
      if (!it.value().is_number() || !(std::fabs(it.value().get<double>()) <= 100.0)) {
        fail("'logit_bias' values must be numbers from -100 to 100", "logit_bias");
      }
      if (!named.insert(id).second) {
        fail("'logit_bias' names token " + std::to_string(id) + " twice", "logit_bias");
      }
      p.logit_bias.emplace_back(static_cast<int32_t>(id),
                                static_cast<float>(it.value().get<double>()));
    }
  }
  // Accepted only in the forms that ask for nothing this server does not do.
  if (const ordered_json* v = field(body, "response_format")) {
    const ordered_json* type = v->is_object() ? field(*v, "type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      fail("only 'response_format' {\"type\": \"text\"} is supported (no structured output)",
           "response_format");
    }
  }
  if (auto v = int_field(body, "best_of", 1, kMaxChoices); v && *v != p.n) {
    fail("'best_of' other than n is not supported", "best_of");
  }
  // vLLM's and OpenAI's options for what this server does not do: refused unless null
  // (and, below, the ones with a neutral value: false, 1, text).
  for (const char* name :
       {"prompt_logprobs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "structured_outputs", "truncate_prompt_tokens", "audio", "allowed_token_ids", "bad_words",
        "functions", "function_call", "prompt_embeds"}) {
    if (field(body, name) != nullptr) fail(std::string("'") + name + "' is not supported", name);
  }
  for (const char* name : {"return_tokens_as_token_ids", "continue_final_message", "echo"}) {
    if (auto v = bool_field(body, name); v && *v) {
      fail(std::string("'") + name + "' is not supported", name);
    }
  }
  if (field(body, "chat_template") != nullptr) {
    fail("'chat_template' is not supported in a request: serve with --chat-template FILE",
         "chat_template");
  }
  if (auto v = bool_field(body, "use_beam_search"); v && *v) {
    fail("beam search is not supported", "use_beam_search");
  }
  if (auto v = number_field(body, "length_penalty", -1e9, 1e9); v && *v != 1.0) {
    fail("'length_penalty' (of beam search) is not supported", "length_penalty");
  }
  if (const ordered_json* v = field(body, "modalities")) {
    const bool text_only = v->is_array() && std::all_of(v->begin(), v->end(), [](const auto& m) {
                             return m.is_string() && m.template get<std::string>() == "text";
                           });
    if (!text_only) fail("modalities other than 'text' are not supported", "modalities");
  }
  if (const ordered_json* v = field(body, "stop")) {
    if (v->is_string()) {
      p.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const ordered_json& s : *v) {
        if (!s.is_string()) fail("'stop' must be a string or a list of strings", "stop");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      fail("'stop' must be a string or a list of strings", "stop");
    }
    std::erase_if(p.stop, [](const std::string& s) { return s.empty(); });
  }
  if (const ordered_json* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) fail("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    for (const ordered_json& id : *v) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxInt32) {
        fail("'stop_token_ids' must be a list of non-negative token ids", "stop_token_ids");
      }
      p.stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (auto v = bool_field(body, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = int_field(body, "min_tokens", 0, kMaxInt32)) p.min_tokens = static_cast<int32_t>(*v);
  if (auto v = bool_field(body, "add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = bool_field(body, "include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (auto v = bool_field(body, "skip_special_tokens")) r.skip_special_tokens = *v;
  if (auto v = int_field(body, "priority", -kMaxInt32, kMaxInt32)) {
    r.priority = static_cast<int32_t>(*v);
  }
  string_field(body, "user");  // accepted (and type-checked), not used
  if (auto v = bool_field(body, "stream")) r.stream = *v;
  if (const ordered_json* v = field(body, "stream_options")) {
    if (!v->is_object()) fail("'stream_options' must be an object", "stream_options");
    if (auto u = bool_field(*v, "include_usage")) r.include_usage = *u;
    auto continuous = bool_field(*v, "continuous_usage_stats");
    r.continuous_usage = r.include_usage && continuous.value_or(false);
  }
}

const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool"};

// Content as a string: text parts are joined, as templates for text models expect.
ordered_json normalize_content(const ordered_json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content;
  if (!content.is_array()) fail("message content must be a string or a list of parts", param);
  std::string text;
  for (const ordered_json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      fail("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", param);
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant turn's tool calls as templates take them (as vLLM gives them): each
// call's arguments, JSON text in OpenAI's API, as the object it holds ({} when empty or
// absent; text that is not JSON stays text), and no `tool_calls` when the list is empty
// (Llama 3.1's template refuses an empty one).
void normalize_tool_calls(ordered_json& message, const std::string& param) {
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return;
  if (!calls->is_array()) fail("'tool_calls' must be a list", param + ".tool_calls");
  if (calls->empty()) {
    message.erase(calls);
    return;
  }
  for (size_t j = 0; j < calls->size(); ++j) {
    ordered_json& call = (*calls)[j];
    const std::string at = param + ".tool_calls[" + std::to_string(j) + "]";
    if (!call.is_object()) fail("each tool call must be an object", at);
    auto function = call.find("function");
    if (function == call.end() || !function->is_object()) {
      fail("each tool call needs a 'function' object", at + ".function");
    }
    ordered_json& arguments = (*function)["arguments"];
    if (arguments.is_null() ||
        (arguments.is_string() && arguments.get_ref<const std::string&>().empty())) {
      arguments = ordered_json::object();
    } else if (arguments.is_string()) {
      ordered_json parsed =
          ordered_json::parse(arguments.get_ref<const std::string&>(), nullptr, false);
      if (!parsed.is_discarded()) arguments = std::move(parsed);
    }
  }
}

// Each tool call's object arguments back as JSON text.
void tool_arguments_to_text(ordered_json& messages) {
  for (ordered_json& m : messages) {
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (ordered_json& call : *calls) {
      ordered_json& arguments = call["function"]["arguments"];
      if (arguments.is_structured()) arguments = dump(arguments);
    }
  }
}

ordered_json parse_messages(const ordered_json& messages) {
  if (!messages.is_array()) fail("'messages' must be a list of messages", "messages");
  if (messages.empty()) fail("'messages' must not be empty", "messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) fail("each message must be an object", param);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) fail("each message needs a string 'role'", param);
    const std::string name = role->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), name) == std::end(kRoles)) {
      fail("unknown role '" + name + "' (system, developer, user, assistant, tool)",
           param + ".role");
    }
    ordered_json copy = m;
    if (name == "assistant") {
      normalize_tool_calls(copy, param);
      // Templates (Qwen3's) read an earlier turn's reasoning as reasoning_content.
      if (auto r = m.find("reasoning"); r != m.end() && !m.contains("reasoning_content")) {
        copy["reasoning_content"] = *r;
      }
    }
    auto content = m.find("content");
    if (content == m.end() && name != "assistant") fail("message needs 'content'", param);
    // No content (an assistant turn of tool calls: null, or left out) is empty text, as
    // vLLM gives it to templates: templates test it, search it, or print it.
    copy["content"] = content == m.end() ? ordered_json("") : normalize_content(*content, i);
    out.push_back(std::move(copy));
  }
  return out;
}

// The chat template's variables beside the messages, as JSON (empty when none): `tools`,
// `documents` and the keys of `chat_template_kwargs`.
std::string template_variables(const ordered_json& body) {
  ordered_json variables = ordered_json::object();
  if (const ordered_json* tools = field(body, "tools")) {
    if (!tools->is_array()) fail("'tools' must be a list", "tools");
    // Also with tool_choice "none", as vLLM renders them by default.
    variables["tools"] = *tools;
  }
  if (const ordered_json* documents = field(body, "documents")) {
    if (!documents->is_array()) fail("'documents' must be a list", "documents");
    variables["documents"] = *documents;
  }
  if (const ordered_json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      // What the request gives in its own fields (transformers refuses them twice).
      for (const char* own : {"messages", "add_generation_prompt", "tools", "documents"}) {
        if (it.key() == own) {
          fail(std::string("'chat_template_kwargs' may not set '") + own +
                   "': it is the request's own field",
               "chat_template_kwargs");
        }
      }
      variables[it.key()] = it.value();
    }
  }
  return variables.empty() ? std::string() : dump(variables);
}

std::vector<int32_t> token_list(const ordered_json& value, const std::string& param) {
  std::vector<int32_t> ids;
  for (const ordered_json& id : value) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxInt32) {
      fail("token ids must be non-negative integers", param);
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

std::vector<PromptInput> parse_prompts(const ordered_json& body) {
  const ordered_json* v = field(body, "prompt");
  if (!v) fail("'prompt' is required", "prompt");
  std::vector<PromptInput> prompts;
  const char* kShape =
      "'prompt' must be a string, a list of strings, a list of token ids or a "
      "list of token id lists";
  if (v->is_string()) {
    prompts.push_back({v->get<std::string>(), {}});
  } else if (v->is_array() && !v->empty() && (*v)[0].is_number()) {
    prompts.push_back({std::nullopt, token_list(*v, "prompt")});
  } else if (v->is_array() && !v->empty()) {
    for (const ordered_json& item : *v) {
      if (item.is_string()) {
        prompts.push_back({item.get<std::string>(), {}});
      } else if (item.is_array() && !item.empty()) {
        prompts.push_back({std::nullopt, token_list(item, "prompt")});
      } else {
        fail(kShape, "prompt");
      }
    }
  } else {
    fail(kShape, "prompt");
  }
  return prompts;
}

ordered_json usage_json(const UsageResult& usage) {
  ordered_json u;
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_tokens}};
  return u;
}

ordered_json bytes_of(const std::string& s) {
  ordered_json bytes = ordered_json::array();
  for (unsigned char c : s)
    bytes.push_back(int(c));
  return bytes;
}

// A token's bytes as text: themselves when valid UTF-8 (a part of a character is not),
// else "bytes:" and an escape per byte, as OpenAI writes them.
std::string token_display(const std::string& bytes) {
  if (engine::utf8::is_valid(bytes)) return bytes;
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

ordered_json logprobs_json(bool chat, const ChoiceResult& choice) {
  if (!choice.has_logprobs) return nullptr;
  if (chat) {
    ordered_json content = ordered_json::array();
    for (const TokenLogprobEntry& e : choice.logprobs) {
      ordered_json top = ordered_json::array();
      for (const auto& [token, logprob] : e.top) {
        top.push_back(
            {{"token", token_display(token)}, {"logprob", logprob}, {"bytes", bytes_of(token)}});
      }
      content.push_back({{"token", token_display(e.token)},
                         {"logprob", e.logprob},
                         {"bytes", bytes_of(e.token)},
                         {"top_logprobs", std::move(top)}});
    }
    ordered_json out;
    out["content"] = std::move(content);
    return out;
  }
  ordered_json tokens = ordered_json::array(), token_logprobs = ordered_json::array(),
               top_logprobs = ordered_json::array(), offsets = ordered_json::array();
  CharacterCounter offset = choice.text_offset;
  for (const TokenLogprobEntry& e : choice.logprobs) {
    tokens.push_back(token_display(e.token));
    token_logprobs.push_back(e.logprob);
    ordered_json top = ordered_json::object();
    for (const auto& [token, logprob] : e.top)
      top[token_display(token)] = logprob;
    // The legacy API always gives the chosen token's logprob among them (up to
    // logprobs + 1 entries), even when it was not one of the most likely.
    if (const std::string chosen = token_display(e.token); !top.contains(chosen)) {
      top[chosen] = e.logprob;
    }
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset.count());
    offset.add(e.token);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

// A thinking model's reasoning, under both names clients read: vLLM's and OpenAI's
// `reasoning`, and DeepSeek's `reasoning_content` (llama.cpp's server, the AI SDK).
void add_reasoning(ordered_json& message, const ChoiceResult& choice) {
  if (choice.reasoning.empty()) return;
  message["reasoning"] = choice.reasoning;
  message["reasoning_content"] = choice.reasoning;
}

// A chat choice's tool calls: in a stream chunk, each names its index in the reply.
ordered_json tool_calls_json(const ChoiceResult& choice, bool delta) {
  ordered_json calls = ordered_json::array();
  for (const ToolCallResult& t : choice.tool_calls) {
    ordered_json call;
    if (delta) call["index"] = t.index;
    call["id"] = t.id;
    call["type"] = "function";
    call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
    calls.push_back(std::move(call));
  }
  return calls;
}

ordered_json finish_json(const ChoiceResult& choice) {
  if (choice.finish_reason.empty()) return nullptr;
  return choice.finish_reason;
}

ordered_json header(bool chat, const ResponseMeta& meta, const char* chat_object,
                    const char* completion_object) {
  ordered_json out;
  out["id"] = meta.id;
  out["object"] = chat ? chat_object : completion_object;
  out["created"] = meta.created;
  out["model"] = meta.model;
  return out;
}

}  // namespace

ApiError invalid_request(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError error_for_status(int status, std::string message) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  switch (status) {
    case 401:
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case 404:
      e.type = "not_found_error";
      break;
    case 413:
      e.type = "invalid_request_error";
      e.code = "request_too_large";
      break;
    case 429:
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case 503:
      e.type = "service_unavailable_error";
      break;
    default:
      e.type = status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
  return e;
}

std::string error_body(const ApiError& error) {
  ordered_json e;
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? ordered_json(nullptr) : ordered_json(error.param);
  e["code"] = error.code.empty() ? ordered_json(nullptr) : ordered_json(error.code);
  return dump({{"error", std::move(e)}});
}

CompletionRequest parse_chat_request(const std::string& body_text,
                                     const scheduler::SamplingParams& defaults) {
  const ordered_json body = parse_body(body_text);
  CompletionRequest r;
  r.params = defaults;
  r.chat = true;
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) fail("'messages' is required", "messages");
  // Keys keep the client's order: templates that print whole messages depend on it.
  r.messages_json = dump(parse_messages(*messages));
  parse_common(body, r);
  if (auto v = bool_field(body, "add_generation_prompt")) r.add_generation_prompt = *v;
  r.template_variables_json = template_variables(body);
  if (r.max_tokens_set) check_min_tokens(r.params);
  // The tools reach the template, and the model may call one or not: "auto" (the
  // default) takes its calls out of the text, "none" leaves the text as it is. Forcing a
  // call would need constrained decoding, which this server does not do.
  std::string tool_choice = "auto";
  if (const ordered_json* v = field(body, "tool_choice")) {
    if (!v->is_string() || (v->get<std::string>() != "auto" && v->get<std::string>() != "none")) {
      fail("only 'tool_choice' \"auto\" or \"none\" is supported (no forced tool calls)",
           "tool_choice");
    }
    tool_choice = v->get<std::string>();
  }
  const ordered_json* tools = field(body, "tools");
  r.tool_calls_allowed = tools && !tools->empty() && tool_choice == "auto";
  if (auto v = bool_field(body, "include_reasoning")) r.include_reasoning = *v;
  if (auto v = bool_field(body, "parallel_tool_calls")) r.parallel_tool_calls = *v;
  if (auto v = bool_field(body, "logprobs")) r.params.logprobs = *v;
  if (auto v = int_field(body, "top_logprobs", 0, kMaxTopLogprobs)) {
    if (!r.params.logprobs && *v > 0) {
      fail("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    }
    r.params.top_logprobs = static_cast<int32_t>(*v);
  }
  return r;
}

CompletionRequest parse_completion_request(const std::string& body_text,
                                           const scheduler::SamplingParams& defaults) {
  const ordered_json body = parse_body(body_text);
  CompletionRequest r;
  r.params = defaults;
  r.prompts = parse_prompts(body);
  parse_common(body, r);
  if (!r.max_tokens_set) {
    // OpenAI's default for text completions; chat takes the rest of the context.
    r.params.max_tokens = 16;
    r.max_tokens_set = true;
  }
  check_min_tokens(r.params);
  if (auto v = int_field(body, "logprobs", 0, kMaxTopLogprobs)) {
    r.params.logprobs = true;
    r.params.top_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = string_field(body, "suffix"); v && !v->empty()) {
    fail("'suffix' is not supported", "suffix");
  }
  return r;
}

std::string completion_response(bool chat, const ResponseMeta& meta,
                                const std::vector<ChoiceResult>& choices,
                                const UsageResult& usage) {
  ordered_json out = header(chat, meta, "chat.completion", "text_completion");
  ordered_json list = ordered_json::array();
  for (const ChoiceResult& c : choices) {
    ordered_json choice;
    choice["index"] = c.index;
    if (chat) {
      ordered_json message = {{"role", "assistant"}};
      message["content"] = c.null_content ? ordered_json(nullptr) : ordered_json(c.text);
      add_reasoning(message, c);
      if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c, false);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = logprobs_json(chat, c);
    choice["finish_reason"] = finish_json(c);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string stream_chunk(bool chat, const ResponseMeta& meta, const ChoiceResult& c,
                         bool role_delta, const UsageResult* usage) {
  ordered_json out = header(chat, meta, "chat.completion.chunk", "text_completion");
  ordered_json choice;
  choice["index"] = c.index;
  if (chat) {
    ordered_json delta = ordered_json::object();
    if (role_delta) delta["role"] = "assistant";
    if (role_delta || !c.text.empty() ||
        (c.finish_reason.empty() && c.tool_calls.empty() && c.reasoning.empty())) {
      delta["content"] = c.text;
    }
    add_reasoning(delta, c);
    if (!c.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(c, true);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = logprobs_json(chat, c);
  choice["finish_reason"] = finish_json(c);
  out["choices"] = ordered_json::array({std::move(choice)});
  if (usage) {
    // The cached-token count is known at the end only: the last chunk has it.
    out["usage"] = {{"prompt_tokens", usage->prompt_tokens},
                    {"completion_tokens", usage->completion_tokens},
                    {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
  }
  return dump(out);
}

std::string stream_usage_chunk(bool chat, const ResponseMeta& meta, const UsageResult& usage) {
  ordered_json out = header(chat, meta, "chat.completion.chunk", "text_completion");
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string render_chat_prompt(const engine::ChatTemplate& chat_template,
                               const engine::ChatRenderOptions& defaults,
                               const std::string& messages_json, bool add_generation_prompt,
                               const std::string& template_variables_json,
                               bool tool_arguments_as_text) {
  engine::ChatRenderOptions options = defaults;
  options.add_generation_prompt = add_generation_prompt;
  try {
    if (!template_variables_json.empty()) {
      const ordered_json variables = ordered_json::parse(template_variables_json);
      for (auto it = variables.begin(); it != variables.end(); ++it)
        options.set(it.key(), it.value());
    }
    ordered_json messages = ordered_json::parse(messages_json);
    if (tool_arguments_as_text) tool_arguments_to_text(messages);
    return chat_template.render(messages, options);
  } catch (const engine::ChatTemplateError& e) {
    fail(std::string("the chat template could not render these messages: ") + e.what(), "messages");
  }
}

bool chat_template_takes_argument_objects(const engine::ChatTemplate& chat_template,
                                          const engine::ChatRenderOptions& defaults) {
  // A turn that calls a tool and gets its result; the id has 9 letters and digits, which
  // Mistral's templates ask for.
  const std::string messages = R"([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "probe0001", "type": "function",
       "function": {"name": "probe", "arguments": {"probe_argument": 1}}}]},
      {"role": "tool", "tool_call_id": "probe0001", "content": "y"}])";
  const std::string variables =
      R"({"tools": [{"type": "function", "function": {"name": "probe", "parameters": {}}}]})";
  auto renders = [&](bool as_text) {
    try {
      render_chat_prompt(chat_template, defaults, messages, true, variables, as_text);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  return renders(false) || !renders(true);
}

TokenizeRequest parse_tokenize_request(const std::string& body_text) {
  const ordered_json body = parse_body(body_text);
  TokenizeRequest r;
  if (auto prompt = string_field(body, "prompt")) {
    r.prompt = *prompt;
  } else if (auto messages = body.find("messages"); messages != body.end()) {
    r.messages_json = dump(parse_messages(*messages));
    r.template_variables_json = template_variables(body);
    r.add_special_tokens = false;  // the template writes its own
  } else {
    fail("give 'prompt' (a string) or 'messages'", "prompt");
  }
  if (auto v = bool_field(body, "add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = bool_field(body, "add_generation_prompt")) r.add_generation_prompt = *v;
  r.model = string_field(body, "model").value_or("");
  return r;
}

std::string tokenize_response(const std::vector<int32_t>& tokens, int64_t max_model_len) {
  ordered_json out;
  out["tokens"] = tokens;
  out["count"] = tokens.size();
  out["max_model_len"] = max_model_len;
  return dump(out);
}

DetokenizeRequest parse_detokenize_request(const std::string& body_text) {
  const ordered_json body = parse_body(body_text);
  const ordered_json* tokens = field(body, "tokens");
  if (!tokens || !tokens->is_array()) fail("'tokens' must be a list of token ids", "tokens");
  return {token_list(*tokens, "tokens"), string_field(body, "model").value_or("")};
}

std::string detokenize_response(const std::string& prompt) {
  return dump({{"prompt", prompt}});
}

namespace {
ordered_json model_json(const ModelInfo& model) {
  ordered_json m;
  m["id"] = model.id;
  m["object"] = "model";
  m["created"] = model.created;
  m["owned_by"] = "pagellm";
  m["root"] = model.id;
  m["max_model_len"] = model.max_model_len;
  m["kv_cache_blocks"] = model.kv_cache_blocks;
  m["kv_cache_tokens"] = model.kv_cache_tokens;
  return m;
}
}  // namespace

std::string models_response(const ModelInfo& model) {
  ordered_json out;
  out["object"] = "list";
  out["data"] = ordered_json::array({model_json(model)});
  return dump(out);
}

std::string model_response(const ModelInfo& model) {
  return dump(model_json(model));
}

void CharacterCounter::add(std::string_view bytes) {
  // The pending bytes are a valid prefix, so the one character or U+FFFD they start
  // covers them all: what starts in `bytes` is new.
  const std::string data = pending_ + std::string(bytes);
  const size_t old = pending_.size();
  pending_.clear();
  for (size_t pos = 0; pos < data.size();) {
    const engine::utf8::SequenceInfo s = engine::utf8::inspect(std::string_view(data).substr(pos));
    if (pos >= old) ++count_;
    if (s.kind == engine::utf8::SequenceInfo::kIncomplete) {
      pending_ = data.substr(pos);
      break;
    }
    pos += s.length;
  }
}

}  // namespace pagellm::server
