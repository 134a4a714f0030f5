#pragma once
// The OpenAI protocol as plain structs: request bodies parsed and validated into
// CompletionRequest, and response bodies (whole responses, stream chunks, errors)
// written from plain results. Pure functions, no sockets; the JSON library stays in
// the .cpp so that this header is cheap to include.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/sampling_params.h"

namespace pagellm::engine {
class ChatTemplate;
struct ChatRenderOptions;
}  // namespace pagellm::engine

namespace pagellm::server {

// An error for the client, in OpenAI's shape: {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

class ApiException : public std::runtime_error {
 public:
  explicit ApiException(ApiError error) : std::runtime_error(error.message), error_(error) {}
  const ApiError& error() const { return error_; }

 private:
  ApiError error_;
};

ApiError invalid_request(std::string message, std::string param = "");
ApiError error_for_status(int status, std::string message);  // type from the status
std::string error_body(const ApiError& error);

// One prompt of /v1/completions: text, or token ids given directly.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;  // when text is unset
};

struct CompletionRequest {
  bool chat = false;
  std::string model;  // empty: the served model
  // Chat: the validated messages as JSON text (rendered by render_chat_prompt).
  std::string messages_json;
  bool add_generation_prompt = true;
  // Chat: further template variables as a JSON object (tools, chat_template_kwargs).
  std::string template_variables_json;
  // Chat: the request offers tools and lets the model call them (tool_choice "auto",
  // the default): the reply's tool calls are taken out of its text.
  bool tool_calls_allowed = false;
  bool parallel_tool_calls = true;  // false: the reply's first call only
  // Chat: whether the reply gives the model's reasoning (vLLM's include_reasoning).
  bool include_reasoning = true;
  // Completions: one or more prompts.
  std::vector<PromptInput> prompts;
  scheduler::SamplingParams params;
  bool max_tokens_set = false;                  // unset (chat): the rest of the context window
  std::string max_tokens_param = "max_tokens";  // or max_completion_tokens, as sent
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats, with include_usage: each chunk carries its
  // choice's usage so far.
  bool continuous_usage = false;
  int32_t priority = 0;
  bool skip_special_tokens = true;
  // Whether the tokenizer adds its special tokens (BOS) to the prompt text: by default
  // for completions, not for chat (whose template writes them), as vLLM has it.
  std::optional<bool> add_special_tokens;
};

// Parse and validate a body. Throws ApiException (status 400) with the parameter at fault.
// Sampling parameters the body leaves out keep their values in `defaults` (the model's
// generation_config.json, when serving takes it).
CompletionRequest parse_chat_request(const std::string& body,
                                     const scheduler::SamplingParams& defaults = {});
CompletionRequest parse_completion_request(const std::string& body,
                                           const scheduler::SamplingParams& defaults = {});
// Throws ApiException (400, param min_tokens) when min_tokens is above max_tokens: the
// parsers check what the body gives; serving checks the default it gives chat.
void check_min_tokens(const scheduler::SamplingParams& params);

// Maximum n accepted; each choice is a sequence of its own.
constexpr int32_t kMaxChoices = 16;
constexpr int32_t kMaxTopLogprobs = 20;

// One token's log-probability, with the token text already decoded.
// A token is given by its raw bytes (IncrementalDetokenizer::token_bytes); the response
// shows them as text when they are valid UTF-8, else as "bytes:\xNN...".
struct TokenLogprobEntry {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

// Characters of a text that arrives as raw bytes, token by token, as its lossy decode has
// them (each maximal invalid subpart one U+FFFD, as the text sent is decoded): completions'
// text_offset. A character counts with the token that holds its first byte.
class CharacterCounter {
 public:
  int64_t count() const { return count_; }
  void add(std::string_view bytes);

 private:
  int64_t count_ = 0;
  std::string pending_;  // a valid but incomplete sequence at the end (counted already)
};

// A function call the model made (see tool_call_parser.h), with the id the reply gives it.
struct ToolCallResult {
  int32_t index = 0;  // among the reply's calls
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChoiceResult {
  int32_t index = 0;
  std::string text;
  // Chat, with the model's tool calls taken out of the text: the calls, and whether the
  // content is null (a reply of calls only).
  std::vector<ToolCallResult> tool_calls;
  bool null_content = false;
  // Chat, from a thinking model: its reasoning, apart from the content.
  std::string reasoning;
  std::string finish_reason;  // empty: null (stream chunks before the end)
  bool has_logprobs = false;
  std::vector<TokenLogprobEntry> logprobs;
  // The characters before the first of `logprobs` (completions' text_offset): the
  // stream's earlier chunks.
  CharacterCounter text_offset;
};

struct UsageResult {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// Whole (non-streaming) responses.
std::string completion_response(bool chat, const ResponseMeta& meta,
                                const std::vector<ChoiceResult>& choices, const UsageResult& usage);

// One SSE data payload: a chunk with one choice. Chat chunks with `role_delta` carry
// delta.role = "assistant".
// `usage`, when given: the choice's usage so far (continuous usage stats).
std::string stream_chunk(bool chat, const ResponseMeta& meta, const ChoiceResult& choice,
                         bool role_delta, const UsageResult* usage = nullptr);
// The final usage chunk of stream_options.include_usage (choices empty).
std::string stream_usage_chunk(bool chat, const ResponseMeta& meta, const UsageResult& usage);

// Renders validated messages with a chat template. Template errors become
// ApiException 400. The messages' tool call arguments are objects (as transformers asks
// of templates); with `tool_arguments_as_text`, JSON text again, for templates that
// only take that (see chat_template_takes_argument_objects).
std::string render_chat_prompt(const engine::ChatTemplate& chat_template,
                               const engine::ChatRenderOptions& defaults,
                               const std::string& messages_json, bool add_generation_prompt,
                               const std::string& template_variables_json = "",
                               bool tool_arguments_as_text = false);

// Whether a template renders a conversation whose tool call has its arguments as an
// object; false when it fails on that and renders them as JSON text instead (DeepSeek's
// templates join them to strings with '+').
bool chat_template_takes_argument_objects(const engine::ChatTemplate& chat_template,
                                          const engine::ChatRenderOptions& defaults);

// /tokenize and /detokenize bodies.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  std::string messages_json;            // when prompt is unset
  std::string template_variables_json;  // with messages: tools, chat_template_kwargs
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
  std::string model;  // empty: any
};
TokenizeRequest parse_tokenize_request(const std::string& body);
std::string tokenize_response(const std::vector<int32_t>& tokens, int64_t max_model_len);
struct DetokenizeRequest {
  std::vector<int32_t> tokens;
  std::string model;  // empty: any
};
DetokenizeRequest parse_detokenize_request(const std::string& body);
std::string detokenize_response(const std::string& prompt);

// /v1/models.
struct ModelInfo {
  std::string id;
  int64_t created = 0;
  int64_t max_model_len = 0;
  int64_t kv_cache_blocks = 0;
  int64_t kv_cache_tokens = 0;
};
std::string models_response(const ModelInfo& model);  // the list
std::string model_response(const ModelInfo& model);   // one, for /v1/models/{id}

}  // namespace pagellm::server
