// The OpenAI protocol: request parsing and validation, response and error bodies.

#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/chat_template.h"

namespace pagellm::server {
namespace {

using nlohmann::json;

// The error a body is refused with; fails the test when it is accepted.
ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(body);
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

ApiError completion_error(const std::string& body) {
  try {
    parse_completion_request(body);
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

constexpr const char* kUser = R"({"role": "user", "content": "hi"})";

std::string chat_with(const std::string& fields) {
  return std::string(R"({"messages": [)") + kUser + "]" + (fields.empty() ? "" : ", " + fields) +
         "}";
}

TEST(OpenAIProtocol, ParsesChatSamplingParameters) {
  const CompletionRequest r = parse_chat_request(chat_with(
      R"("model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
         "min_p": 0.1, "seed": 42, "stop": ["a", "b"], "stop_token_ids": [3], "n": 3,
         "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
         "logprobs": true, "top_logprobs": 5, "ignore_eos": true, "priority": 2, "user": "u",
         "stream": true, "stream_options": {"include_usage": true})"));
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.max_tokens_set);
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.1f);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.params.n, 3);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 5);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.priority, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.continuous_usage);
  // continuous_usage_stats counts only with include_usage, as in vLLM.
  auto continuous = [](const char* options) {
    return parse_chat_request(
               chat_with(std::string(R"("stream": true, "stream_options": )") + options))
        .continuous_usage;
  };
  EXPECT_TRUE(continuous(R"({"include_usage": true, "continuous_usage_stats": true})"));
  EXPECT_FALSE(continuous(R"({"continuous_usage_stats": true})"));
  EXPECT_FALSE(continuous(R"({"include_usage": true, "continuous_usage_stats": false})"));
  EXPECT_EQ(chat_error(chat_with(R"("stream_options": {"continuous_usage_stats": 1})")).param,
            "continuous_usage_stats");
}

TEST(OpenAIProtocol, DefaultsAndNullsLeaveParametersUnset) {
  const CompletionRequest r =
      parse_chat_request(chat_with(R"("max_tokens": null, "temperature": null, "stop": "x")"));
  EXPECT_FALSE(r.max_tokens_set);
  EXPECT_FLOAT_EQ(r.params.temperature, 1.0f);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(r.params.n, 1);
  EXPECT_FALSE(r.stream);
  const CompletionRequest m = parse_chat_request(chat_with(R"("max_completion_tokens": 9)"));
  EXPECT_EQ(m.params.max_tokens, 9);
}

TEST(OpenAIProtocol, MessagesKeepTheirKeyOrderAndTextPartsAreJoined) {
  const CompletionRequest r = parse_chat_request(
      R"({"messages": [{"role": "system", "content": "s"},
                       {"role": "user", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]}]})");
  EXPECT_EQ(r.messages_json,
            R"([{"role":"system","content":"s"},{"role":"user","content":"a\nb"}])");
}

// An assistant turn of tool calls has no content (null, or left out): templates get empty
// text, as vLLM gives them, not None (which Qwen3's searches and Llama 3's prints). An
// empty list of calls is no calls.
TEST(OpenAIProtocol, MissingOrNullContentIsEmptyText) {
  const CompletionRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": null, "tool_calls": []},
                       {"role": "assistant", "tool_calls": []}]})");
  EXPECT_EQ(r.messages_json, R"([{"role":"user","content":"hi"},{"role":"assistant","content":""},)"
                             R"({"role":"assistant","content":""}])");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user"}]})").param, "messages[0]");
}

// Templates take a call's arguments as the object its JSON text holds, as vLLM gives them
// (Llama 3.1's writes them with tojson, which would quote the text).
TEST(OpenAIProtocol, ToolCallArgumentsReachTemplatesAsObjects) {
  const CompletionRequest r = parse_chat_request(R"({"messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": [1]}"}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
        {"id": "c", "type": "function", "function": {"name": "h"}},
        {"id": "d", "type": "function", "function": {"name": "k", "arguments": "not json"}},
        {"id": "e", "type": "function", "function": {"name": "m", "arguments": {"y": 2}}}]}]})");
  const json messages = json::parse(r.messages_json);
  const json& calls = messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], json::parse(R"({"x": [1]})"));
  EXPECT_EQ(calls[1]["function"]["arguments"], json::object());
  EXPECT_EQ(calls[2]["function"]["arguments"], json::object());
  EXPECT_EQ(calls[3]["function"]["arguments"], "not json");
  EXPECT_EQ(calls[4]["function"]["arguments"], json::parse(R"({"y": 2})"));
  EXPECT_EQ(calls[0]["id"], "a");
  auto bad = [](const std::string& calls) {
    return chat_error(R"({"messages": [{"role": "assistant", "tool_calls": )" + calls + "}]}")
        .param;
  };
  EXPECT_EQ(bad("3"), "messages[0].tool_calls");
  EXPECT_EQ(bad("[3]"), "messages[0].tool_calls[0]");
  EXPECT_EQ(bad(R"([{"id": "a"}])"), "messages[0].tool_calls[0].function");
}

// DeepSeek's templates join the arguments to strings, and fail on objects: for such a
// template they go back to JSON text; one that prints objects keeps them.
TEST(OpenAIProtocol, TemplatesThatJoinArgumentsToTextGetText) {
  const auto joins = engine::ChatTemplate::parse(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}"
      "{{ '<call>' + c.function.arguments + '</call>' }}{% endfor %}{% endfor %}");
  const auto prints = engine::ChatTemplate::parse(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}"
      "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}");
  EXPECT_FALSE(chat_template_takes_argument_objects(joins, {}));
  EXPECT_TRUE(chat_template_takes_argument_objects(prints, {}));
  // One that fails either way keeps objects, as vLLM gives them.
  EXPECT_TRUE(chat_template_takes_argument_objects(
      engine::ChatTemplate::parse("{{ raise_exception('no tools') }}"), {}));
  const CompletionRequest r = parse_chat_request(R"({"messages": [{"role": "assistant",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": [1]}"}}]}]})");
  EXPECT_EQ(render_chat_prompt(joins, {}, r.messages_json, false, "", true),
            R"(<call>{"a":[1]}</call>)");
  EXPECT_EQ(render_chat_prompt(prints, {}, r.messages_json, false), R"({"a": [1]})");
}

// The reply's tool calls are read when the request offers tools and lets the model
// choose (tool_choice "auto", the default).
TEST(OpenAIProtocol, ToolCallsAreReadWhenTheModelMayCallATool) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  EXPECT_TRUE(parse_chat_request(chat_with(tools)).tool_calls_allowed);
  EXPECT_TRUE(
      parse_chat_request(chat_with(tools + R"(, "tool_choice": "auto")")).tool_calls_allowed);
  EXPECT_FALSE(
      parse_chat_request(chat_with(tools + R"(, "tool_choice": "none")")).tool_calls_allowed);
  EXPECT_FALSE(parse_chat_request(chat_with(R"("tools": [])")).tool_calls_allowed);
  EXPECT_FALSE(parse_chat_request(chat_with(R"("max_tokens": 3)")).tool_calls_allowed);
  EXPECT_TRUE(parse_chat_request(chat_with(tools)).parallel_tool_calls);
  EXPECT_FALSE(parse_chat_request(chat_with(tools + R"(, "parallel_tool_calls": false)"))
                   .parallel_tool_calls);
  EXPECT_EQ(chat_error(chat_with(R"("parallel_tool_calls": "no")")).param, "parallel_tool_calls");
}

TEST(OpenAIProtocol, ToolsAndTemplateArgumentsBecomeTemplateVariables) {
  const CompletionRequest r = parse_chat_request(
      chat_with(R"("tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1})"));
  EXPECT_EQ(r.template_variables_json, R"({"tools":[{"type":"function"}],"x":1})");
  EXPECT_EQ(parse_chat_request(chat_with("")).template_variables_json, "");
  EXPECT_EQ(chat_error(chat_with(R"("tools": 3)")).param, "tools");
  // tool_choice: "auto" and "none" show the tools (as vLLM does); a forced call is refused.
  EXPECT_EQ(
      parse_chat_request(chat_with(R"("tools": [{"type": "function"}], "tool_choice": "auto")"))
          .template_variables_json,
      R"({"tools":[{"type":"function"}]})");
  EXPECT_EQ(
      parse_chat_request(chat_with(R"("tools": [{"type": "function"}], "tool_choice": "none")"))
          .template_variables_json,
      R"({"tools":[{"type":"function"}]})");
  EXPECT_EQ(chat_error(chat_with(R"("tool_choice": "required")")).param, "tool_choice");
  // documents reach the template too; the kwargs may not set the request's own fields.
  EXPECT_EQ(
      parse_chat_request(chat_with(R"("documents": [{"title": "t"}])")).template_variables_json,
      R"({"documents":[{"title":"t"}]})");
  for (const char* own : {"messages", "add_generation_prompt", "tools", "documents"}) {
    const ApiError e =
        chat_error(chat_with(std::string(R"("chat_template_kwargs": {")") + own + R"(": []})"));
    EXPECT_EQ(e.param, "chat_template_kwargs") << own;
  }
  EXPECT_EQ(
      chat_error(chat_with(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"))
          .param,
      "tool_choice");
}

// What the template cannot take from the tools (an integer past int64) is the client's
// 400, as any other render error, not a 500.
TEST(OpenAIProtocol, ATemplateVariableTheTemplateCannotHoldIsABadRequest) {
  const auto tmpl = engine::ChatTemplate::parse("{{ tools | tojson }}{{ messages[0].content }}");
  const CompletionRequest ok =
      parse_chat_request(chat_with(R"("tools": [{"type": "function", "n": 9223372036854775807}])"));
  EXPECT_EQ(render_chat_prompt(tmpl, {}, ok.messages_json, true, ok.template_variables_json),
            R"([{"type": "function", "n": 9223372036854775807}]hi)");
  const CompletionRequest big = parse_chat_request(
      chat_with(R"("tools": [{"type": "function", "n": 18446744073709551615}])"));
  try {
    render_chat_prompt(tmpl, {}, big.messages_json, true, big.template_variables_json);
    ADD_FAILURE() << "rendered";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_NE(e.error().message.find("integer overflow"), std::string::npos) << e.error().message;
  }
}

TEST(OpenAIProtocol, MinTokensAndKeepingTheStopString) {
  const CompletionRequest r = parse_completion_request(
      R"({"prompt": "a", "max_tokens": 8, "min_tokens": 8, "include_stop_str_in_output": true})",
      {});
  EXPECT_EQ(r.params.min_tokens, 8);
  EXPECT_TRUE(r.params.include_stop_str_in_output);
  const CompletionRequest d = parse_completion_request(R"({"prompt": "a"})", {});
  EXPECT_EQ(d.params.min_tokens, 0);
  EXPECT_FALSE(d.params.include_stop_str_in_output);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "max_tokens": 8, "min_tokens": 9})").param,
            "min_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "a", "min_tokens": -1})").param, "min_tokens");
  // Completions' default max_tokens (16) counts too.
  EXPECT_EQ(completion_error(R"({"prompt": "a", "min_tokens": 17})").param, "min_tokens");
  EXPECT_EQ(parse_completion_request(R"({"prompt": "a", "min_tokens": 16})", {}).params.min_tokens,
            16);
  // add_special_tokens: unset unless given (serving picks the default per endpoint).
  EXPECT_FALSE(d.add_special_tokens.has_value());
  EXPECT_EQ(parse_completion_request(R"({"prompt": "a", "add_special_tokens": false})", {})
                .add_special_tokens,
            false);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "include_stop_str_in_output": 1})").param,
            "include_stop_str_in_output");
}

// Options that would change the output in ways this server does not do are refused, not
// ignored; their neutral values are accepted.
TEST(OpenAIProtocol, RefusesOptionsItDoesNotHonour) {
  for (const char* field : {R"("prompt_logprobs": 1)",
                            R"("guided_json": {"type": "object"})",
                            R"("guided_regex": "a+")",
                            R"("guided_choice": ["a"])",
                            R"("guided_grammar": "g")",
                            R"("use_beam_search": true)",
                            R"("length_penalty": 0.5)",
                            R"("truncate_prompt_tokens": 4)",
                            R"("modalities": ["text", "audio"])",
                            R"("audio": {"voice": "x"})",
                            R"("allowed_token_ids": [1, 2])",
                            R"("bad_words": ["x"])",
                            R"("functions": [{"name": "f"}])",
                            R"("function_call": "auto")",
                            R"("return_tokens_as_token_ids": true)",
                            R"("continue_final_message": true)",
                            R"("chat_template": "{{ 1 }}")",
                            R"("echo": true)",
                            R"("structured_outputs": {})",
                            R"("prompt_embeds": "AAAA")"}) {
    const ApiError e = chat_error(chat_with(field));
    EXPECT_EQ(e.status, 400) << field;
    EXPECT_NE(e.message.find("not supported"), std::string::npos) << field << ": " << e.message;
  }
  for (const char* field :
       {R"("prompt_logprobs": null)", R"("use_beam_search": false)", R"("length_penalty": 1.0)",
        R"("modalities": ["text"])", R"("prediction": {"type": "content", "content": "x"})",
        R"("continue_final_message": false)", R"("echo": false)"}) {
    EXPECT_NO_THROW(parse_chat_request(chat_with(field))) << field;
  }
  // And on the completions route.
  for (const char* body : {R"({"prompt": "a", "echo": true})", R"({"prompt": "a", "suffix": "b"})",
                           R"({"prompt": "a", "prompt_embeds": "AAAA"})"}) {
    EXPECT_EQ(completion_error(body).status, 400) << body;
  }
}

TEST(OpenAIProtocol, RefusesBadChatRequests) {
  EXPECT_EQ(chat_error("{not json").status, 400);
  EXPECT_EQ(chat_error("[1, 2]").status, 400);
  EXPECT_EQ(chat_error("{}").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": []})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": "hi"})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "wizard", "content": "x"}]})").param,
            "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages": [{"content": "x"}]})").param, "messages[0]");
  EXPECT_EQ(chat_error(chat_with(R"("max_tokens": -1)")).param, "max_tokens");
  EXPECT_EQ(chat_error(chat_with(R"("max_tokens": 0)")).param, "max_tokens");
  EXPECT_EQ(chat_error(chat_with(R"("max_tokens": "5")")).param, "max_tokens");
  EXPECT_EQ(chat_error(chat_with(R"("max_tokens": 1.5)")).param, "max_tokens");
  EXPECT_EQ(chat_error(chat_with(R"("temperature": -0.1)")).param, "temperature");
  EXPECT_EQ(chat_error(chat_with(R"("temperature": 2.5)")).param, "temperature");
  EXPECT_EQ(chat_error(chat_with(R"("top_p": 0)")).param, "top_p");
  EXPECT_EQ(chat_error(chat_with(R"("top_p": 1.5)")).param, "top_p");
  EXPECT_EQ(chat_error(chat_with(R"("n": 0)")).param, "n");
  EXPECT_EQ(chat_error(chat_with(R"("n": 17)")).param, "n");
  EXPECT_EQ(chat_error(chat_with(R"("logprobs": true, "top_logprobs": 21)")).param, "top_logprobs");
  EXPECT_EQ(chat_error(chat_with(R"("top_logprobs": 2)")).param, "top_logprobs");
  EXPECT_EQ(chat_error(chat_with(R"("stop": 5)")).param, "stop");
  EXPECT_EQ(chat_error(chat_with(R"("stop": ["a", 1])")).param, "stop");
  EXPECT_EQ(chat_error(chat_with(R"("stream": "yes")")).param, "stream");
  EXPECT_EQ(chat_error(chat_with(R"("seed": "x")")).param, "seed");
  EXPECT_EQ(chat_error(chat_with(R"("presence_penalty": 3)")).param, "presence_penalty");
  EXPECT_EQ(chat_error(chat_with(R"("stop_token_ids": [-1])")).param, "stop_token_ids");
  const ApiError e = chat_error(chat_with(R"("temperature": 3)"));
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_NE(e.message.find("temperature"), std::string::npos) << e.message;
}

// An integer field out of range reads the same whatever the number's JSON form: within
// int64, past it as an unsigned integer, or past both (which JSON parsing makes a double).
TEST(OpenAIProtocol, RangeErrorsNameTheRangeAndWhatCame) {
  const auto message = [](const std::string& fields) {
    return chat_error(chat_with(fields)).message;
  };
  const std::string priority = "'priority' must be an integer in [-2147483647, 2147483647], got ";
  EXPECT_EQ(message(R"("priority": 3000000000)"), priority + "3000000000");
  EXPECT_EQ(message(R"("priority": 18446744073709551615)"), priority + "18446744073709551615");
  EXPECT_EQ(message(R"("priority": -9223372036854775808)"), priority + "-9223372036854775808");
  EXPECT_EQ(message(R"("priority": -10000000000000000000)"), priority + "-1e+19");
  EXPECT_EQ(message(R"("priority": 1.5)"), priority + "1.5");
  EXPECT_EQ(message(R"("max_tokens": "5")"),
            "'max_tokens' must be an integer in [1, 2147483647], got a string");
  EXPECT_EQ(message(R"("n": [2])"), "'n' must be an integer in [1, 16], got an array");
  EXPECT_EQ(message(R"("temperature": 3)"), "'temperature' must be a number in [0, 2], got 3");
  EXPECT_EQ(message(R"("top_p": 0)"), "'top_p' must be a number in (0, 1], got 0");
  EXPECT_EQ(message(R"("temperature": true)"),
            "'temperature' must be a number in [0, 2], got a boolean");
  EXPECT_EQ(message(R"("seed": {"a": 1})"), "'seed' must be an integer, got an object");
  EXPECT_EQ(message(R"("seed": 1.0)"), "'seed' must be an integer, got 1.0");
}

// A number past a double's range is not valid JSON here, and nesting deeper than 128
// levels is refused before the body is walked (the chat path recurses into messages).
TEST(OpenAIProtocol, RefusesOverflowingNumbersAndDeepNesting) {
  EXPECT_EQ(completion_error(R"({"prompt": "a", "foo": 1e400})").status, 400);
  EXPECT_EQ(chat_error(chat_with(R"("temperature": -1e400)")).status, 400);
  const auto message_with = [](const std::string& x) {
    return R"({"messages": [{"role": "user", "content": "hi", "x": )" + x + "}]}";
  };
  const auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  // The body, messages and the message are 3 levels.
  EXPECT_NO_THROW(parse_chat_request(message_with(nested(125))));
  const ApiError deep = chat_error(message_with(nested(126)));
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(deep.message.find("128"), std::string::npos) << deep.message;
  EXPECT_EQ(chat_error(message_with(nested(100000))).status, 400);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "x": )" + nested(200) + "}").status, 400);
  // Brackets inside strings, escaped quotes too, are text.
  EXPECT_NO_THROW(parse_chat_request(message_with("\"\\\"" + std::string(500, '[') + "\"")));
  EXPECT_NO_THROW(parse_completion_request(R"({"prompt": ")" + std::string(500, '{') + "\"}"));
}

// logit_bias maps token ids to biases; options this server cannot honour are refused
// rather than ignored, except in the forms that ask for nothing.
TEST(OpenAIProtocol, LogitBiasAndUnsupportedOptions) {
  const CompletionRequest r =
      parse_chat_request(chat_with(R"("logit_bias": {"5": 10, "7": -100})"));
  EXPECT_EQ(r.params.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{5, 10.0f}, {7, -100.0f}}));
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": {"x": 1})")).param, "logit_bias");
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": {"-1": 1})")).param, "logit_bias");
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": {"5": 101})")).param, "logit_bias");
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": {"5": "1"})")).param, "logit_bias");
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": [1])")).param, "logit_bias");
  EXPECT_EQ(chat_error(chat_with(R"("logit_bias": {"5": 1, "05": 2})")).param, "logit_bias");
  EXPECT_TRUE(parse_chat_request(chat_with(R"("logit_bias": {})")).params.logit_bias.empty());

  parse_chat_request(chat_with(R"("response_format": {"type": "text"}, "best_of": 1)"));
  EXPECT_EQ(chat_error(chat_with(R"("response_format": {"type": "json_object"})")).param,
            "response_format");
  EXPECT_EQ(chat_error(chat_with(R"("response_format": "json")")).param, "response_format");
  EXPECT_EQ(chat_error(chat_with(R"("best_of": 3)")).param, "best_of");
  parse_completion_request(R"({"prompt": "x", "n": 2, "best_of": 2, "suffix": ""})");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "suffix": " end"})").param, "suffix");
}

// Parameters a body leaves out keep the serving defaults; those it gives replace them.
TEST(OpenAIProtocol, ServingDefaultsFillWhatTheBodyLeavesOut) {
  scheduler::SamplingParams defaults;
  defaults.temperature = 0.6f;
  defaults.top_p = 0.9f;
  defaults.top_k = 20;
  const CompletionRequest r = parse_chat_request(chat_with(R"("top_p": 0.5)"), defaults);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.6f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.5f);
  EXPECT_EQ(r.params.top_k, 20);
  const CompletionRequest c =
      parse_completion_request(R"({"prompt": "x", "temperature": 0})", defaults);
  EXPECT_FLOAT_EQ(c.params.temperature, 0.0f);
  EXPECT_EQ(c.params.top_k, 20);
  EXPECT_EQ(c.params.max_tokens, 16);
  EXPECT_FLOAT_EQ(parse_chat_request(chat_with("")).params.temperature, 1.0f);
}

TEST(OpenAIProtocol, ParsesEveryPromptShape) {
  auto prompts = [](const std::string& prompt) {
    return parse_completion_request(R"({"prompt": )" + prompt + "}").prompts;
  };
  auto one = prompts(R"("hello")");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].text, "hello");
  auto ids = prompts("[1, 2, 3]");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_FALSE(ids[0].text);
  EXPECT_EQ(ids[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  auto batch = prompts(R"(["a", [4, 5]])");
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].text, "a");
  EXPECT_EQ(batch[1].tokens, (std::vector<int32_t>{4, 5}));

  EXPECT_EQ(completion_error("{}").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": []})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": 5})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": [1, -2]})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "logprobs": 21})").param, "logprobs");
  EXPECT_EQ(parse_completion_request(R"({"prompt": "x"})").params.max_tokens, 16);
  const CompletionRequest r = parse_completion_request(R"({"prompt": "x", "logprobs": 3})");
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 3);
}

TEST(OpenAIProtocol, ErrorBodiesHaveOpenAIShape) {
  const json body = json::parse(error_body(invalid_request("bad", "n")));
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(error_for_status(401, "x").type, "authentication_error");
  EXPECT_EQ(error_for_status(429, "x").type, "rate_limit_error");
  EXPECT_EQ(error_for_status(404, "x").type, "not_found_error");
  EXPECT_EQ(error_for_status(500, "x").type, "internal_server_error");
}

TEST(OpenAIProtocol, WholeChatResponse) {
  ChoiceResult c;
  c.index = 0;
  c.text = "hello";
  c.finish_reason = "stop";
  c.has_logprobs = true;
  c.logprobs.push_back({"he", -0.5f, {{"he", -0.5f}, {"ha", -1.5f}}});
  const json r = json::parse(completion_response(true, {"chatcmpl-1", 7, "m"}, {c}, {5, 2, 1}));
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 7);
  EXPECT_EQ(r["model"], "m");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  const json& lp = r["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "he");
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["bytes"], json({104, 101}));
  EXPECT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][1]["token"], "ha");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r["usage"]["completion_tokens"], 2);
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
}

TEST(OpenAIProtocol, ReasoningInResponsesAndChunks) {
  ChoiceResult c;
  c.text = "4";
  c.reasoning = "2+2";
  const json r = json::parse(completion_response(true, {"chatcmpl-1", 7, "m"}, {c}, {}));
  EXPECT_EQ(r["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "content": "4", "reasoning": "2+2",
                            "reasoning_content": "2+2"})"));
  c.text.clear();
  const json chunk = json::parse(stream_chunk(true, {"chatcmpl-1", 7, "m"}, c, false));
  EXPECT_EQ(chunk["choices"][0]["delta"],
            json::parse(R"({"reasoning": "2+2", "reasoning_content": "2+2"})"));
  // Without reasoning, neither key.
  c.reasoning.clear();
  c.text = "x";
  EXPECT_FALSE(
      json::parse(completion_response(true, {"c", 1, "m"}, {c}, {}))["choices"][0]["message"]
          .contains("reasoning"));
}

TEST(OpenAIProtocol, EarlierReasoningReachesTemplatesAsReasoningContent) {
  const CompletionRequest r = parse_chat_request(R"({"messages": [
      {"role": "assistant", "content": "a", "reasoning": "r1"},
      {"role": "assistant", "content": "b", "reasoning": "r2", "reasoning_content": "own"}],
      "include_reasoning": false})");
  const json messages = json::parse(r.messages_json);
  EXPECT_EQ(messages[0]["reasoning_content"], "r1");
  EXPECT_EQ(messages[1]["reasoning_content"], "own");
  EXPECT_FALSE(r.include_reasoning);
  EXPECT_TRUE(parse_chat_request(chat_with(R"("max_tokens": 1)")).include_reasoning);
  EXPECT_EQ(chat_error(chat_with(R"("include_reasoning": 1)")).param, "include_reasoning");
}

TEST(OpenAIProtocol, ToolCallsInResponsesAndChunks) {
  ChoiceResult c;
  c.null_content = true;
  c.finish_reason = "tool_calls";
  c.tool_calls = {{0, "call_1", "f", R"({"a":1})"}, {1, "call_2", "g", "{}"}};
  const json r = json::parse(completion_response(true, {"chatcmpl-1", 7, "m"}, {c}, {}));
  const json& message = r["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"], json::parse(R"([
      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
      {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}])"));
  // A chunk's calls carry their index; it has no content unless it has text.
  c.finish_reason.clear();
  c.tool_calls.erase(c.tool_calls.begin());
  const json chunk = json::parse(stream_chunk(true, {"chatcmpl-1", 7, "m"}, c, false));
  EXPECT_EQ(chunk["choices"][0]["delta"], json::parse(R"({"tool_calls": [
      {"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]})"));
  c.text = "ok";
  const json both = json::parse(stream_chunk(true, {"chatcmpl-1", 7, "m"}, c, false));
  EXPECT_EQ(both["choices"][0]["delta"]["content"], "ok");
}

TEST(OpenAIProtocol, WholeCompletionResponseWithLegacyLogprobs) {
  ChoiceResult c;
  c.index = 1;
  c.text = "ab";
  c.finish_reason = "length";
  c.has_logprobs = true;
  c.logprobs.push_back({"a", -1.0f, {{"a", -1.0f}}});
  c.logprobs.push_back({"b", -2.0f, {{"b", -2.0f}}});
  const json r = json::parse(completion_response(false, {"cmpl-1", 7, "m"}, {c}, {3, 2, 0}));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["index"], 1);
  EXPECT_EQ(r["choices"][0]["text"], "ab");
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["b"].get<float>(), -2.0f);
  EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);
  // A chosen token outside the most likely is among them too (logprobs + 1 entries), and
  // with logprobs 0 it is the only one.
  c.logprobs = {{"c", -5.0f, {{"a", -0.5f}}}, {"d", -0.25f, {}}};
  const json other = json::parse(completion_response(false, {"cmpl-2", 7, "m"}, {c}, {3, 2, 0}));
  EXPECT_EQ(other["choices"][0]["logprobs"]["top_logprobs"],
            json::parse(R"([{"a": -0.5, "c": -5.0}, {"d": -0.25}])"));
  EXPECT_TRUE(json::parse(completion_response(false, {"c", 1, "m"}, {ChoiceResult{}},
                                              {}))["choices"][0]["logprobs"]
                  .is_null());
}

// Tokens arrive as raw bytes: a part of a character shows as "bytes:\xNN", keeps its
// bytes, and its character counts in text_offset with the token of its first byte.
TEST(OpenAIProtocol, LogprobTokensFromRawBytes) {
  ChoiceResult c;
  c.has_logprobs = true;
  c.logprobs.push_back({" caf", -0.1f, {{" caf", -0.1f}, {"\xC3", -3.0f}}});
  c.logprobs.push_back({"\xC3", -0.2f, {}});
  c.logprobs.push_back({"\xA9", -0.3f, {}});
  c.logprobs.push_back({"!", -0.4f, {}});
  const json chat = json::parse(completion_response(true, {"c", 1, "m"}, {c}, {}));
  const json& content = chat["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content[0]["token"], " caf");
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "bytes:\\xc3");
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json({0xC3}));
  EXPECT_EQ(content[1]["token"], "bytes:\\xc3");
  EXPECT_EQ(content[1]["bytes"], json({0xC3}));
  EXPECT_EQ(content[2]["bytes"], json({0xA9}));

  c.text_offset.add("0123456789");  // a later chunk of a stream
  const json legacy = json::parse(completion_response(false, {"c", 1, "m"}, {c}, {}));
  const json& lp = legacy["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({" caf", "bytes:\\xc3", "bytes:\\xa9", "!"}));
  EXPECT_EQ(lp["text_offset"], json({10, 14, 15, 15}));
  EXPECT_TRUE(lp["top_logprobs"][0].contains("bytes:\\xc3"));
}

// text_offset counts the characters of the text as it is sent, bytes that are not valid
// UTF-8 decoded one U+FFFD per maximal invalid subpart; a character counts with the
// token of its first byte, also across the chunks of a stream.
TEST(OpenAIProtocol, TextOffsetsCountTheCharactersOfTheDecodedText) {
  const auto offsets = [](CharacterCounter start, const std::vector<std::string>& tokens) {
    std::vector<int64_t> out;
    for (const std::string& t : tokens) {
      out.push_back(start.count());
      start.add(t);
    }
    out.push_back(start.count());
    return out;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(offsets({}, {" caf\xC3\xA9!"}), V({0, 6}));
  // Lone continuation bytes: one U+FFFD each.
  EXPECT_EQ(offsets({}, {"\xA9", "\xA9", "\xA9"}), V({0, 1, 2, 3}));
  // A lead byte whose next byte cannot continue it, and a byte never valid (C0, FF).
  EXPECT_EQ(offsets({}, {"\xE0", "\x80", "a"}), V({0, 1, 2, 3}));
  EXPECT_EQ(offsets({}, {"\xC0\xFF"
                         "a"}),
            V({0, 3}));
  // A 4-byte character in three tokens, then one cut short by "a": the cut one is one
  // U+FFFD for its three bytes.
  EXPECT_EQ(offsets({}, {"\xF0\x9F", "\x98", "\x80", "\xF0\x9F\x98", "a"}), V({0, 1, 1, 1, 2, 3}));
  // A character split across two chunks of a stream.
  CharacterCounter earlier;
  earlier.add("ab\xC3");
  EXPECT_EQ(earlier.count(), 3);
  EXPECT_EQ(offsets(earlier, {"\xA9", "!"}), V({3, 3, 4}));
}

TEST(OpenAIProtocol, StreamChunks) {
  const ResponseMeta meta{"chatcmpl-1", 7, "m"};
  ChoiceResult role;
  const json first = json::parse(stream_chunk(true, meta, role, true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  ChoiceResult text;
  text.text = "hi";
  const json middle = json::parse(stream_chunk(true, meta, text, false));
  EXPECT_EQ(middle["choices"][0]["delta"], json({{"content", "hi"}}));
  ChoiceResult end;
  end.finish_reason = "length";
  const json last = json::parse(stream_chunk(true, meta, end, false));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = json::parse(stream_usage_chunk(true, meta, {4, 2, 0}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 6);
  const json completion = json::parse(stream_chunk(false, {"cmpl-1", 7, "m"}, text, false));
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["choices"][0]["text"], "hi");
  EXPECT_FALSE(completion.contains("usage"));
  // With continuous usage: the choice's counts so far.
  const UsageResult so_far{4, 1, 0};
  const json counted = json::parse(stream_chunk(true, meta, text, false, &so_far));
  EXPECT_EQ(counted["usage"],
            json({{"prompt_tokens", 4}, {"completion_tokens", 1}, {"total_tokens", 5}}));
}

TEST(OpenAIProtocol, TokenizeAndDetokenizeBodies) {
  const TokenizeRequest prompt = parse_tokenize_request(R"({"prompt": "hi"})");
  EXPECT_EQ(prompt.prompt, "hi");
  EXPECT_TRUE(prompt.add_special_tokens);
  const TokenizeRequest chat =
      parse_tokenize_request(std::string(R"({"messages": [)") + kUser + "]}");
  EXPECT_FALSE(chat.prompt);
  EXPECT_FALSE(chat.add_special_tokens);
  EXPECT_EQ(chat.template_variables_json, "");
  // The chat request's template variables, so that the count is the chat prompt's.
  const TokenizeRequest tools = parse_tokenize_request(
      std::string(R"({"messages": [)") + kUser +
      R"(], "tools": [{"type": "function"}], "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(tools.template_variables_json,
            R"({"tools":[{"type":"function"}],"enable_thinking":false})");
  EXPECT_THROW(parse_tokenize_request("{}"), ApiException);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, 2]})").tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1], "model": "m"})").model, "m");
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "a", "model": "m"})").model, "m");
  EXPECT_THROW(parse_detokenize_request(R"({"tokens": "x"})"), ApiException);
  const json t = json::parse(tokenize_response({1, 2, 3}, 128));
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["max_model_len"], 128);
  EXPECT_EQ(json::parse(detokenize_response("ab"))["prompt"], "ab");
}

TEST(OpenAIProtocol, ModelsList) {
  const json m = json::parse(models_response({"demo", 5, 2048, 100, 1600}));
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "demo");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["owned_by"], "pagellm");
  EXPECT_EQ(m["data"][0]["max_model_len"], 2048);
  EXPECT_EQ(m["data"][0]["kv_cache_tokens"], 1600);
}

}  // namespace
}  // namespace pagellm::server
