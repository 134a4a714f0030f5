// Tool calls and reasoning end to end: the real server reads the calls a model writes
// into the reply's `tool_calls`, and a thinking model's <think> block into `reasoning`,
// whole and streamed. The model is the tiny demo model whose unused token <|pad|> decodes
// to a whole reply (a hermes call, a think block, ...), and logit_bias makes it write it.

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "support/server_process.h"
#include "support/sse_client.h"
#include "support/temp_model.h"

namespace pagellm {
namespace {

using nlohmann::json;

constexpr const char* kCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
constexpr int kCallToken = 511;  // the demo tokenizer's <|pad|>

// A template that teaches the <tool_call> syntax, and gives earlier turns' reasoning
// back when `thinking` (and then knows <think>); with `prompt_thinks`, the generation
// prompt opens <think>, as DeepSeek-R1's does.
std::string chat_template(bool thinking = false, bool prompt_thinks = false) {
  return std::string(
             "{% if tools %}<|im_start|>system\nCall a tool as <tool_call>{\"name\": ..., "
             "\"arguments\": ...}</tool_call>: {{ tools | tojson }}<|im_end|>\n{% endif %}"
             "{% for m in messages %}<|im_start|>{{ m.role }}\n") +
         (thinking ? "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
                     "{% endif %}"
                   : "") +
         "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': "
         "c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
         "{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n" +
         (prompt_thinks ? "<think>\n" : "");
}

// A copy of the tiny model in which token kCallToken is the text `call` (a special token
// or not), with `chat_template`. (tests/integration/openai_js/run.sh does the same.)
class ScriptedReplyModel : public testing::TempDir {
 public:
  explicit ScriptedReplyModel(const std::string& call = kCall, bool special = false,
                              const std::string& chat_template = ::pagellm::chat_template())
      : TempDir("pagellm_reply_parsing_test") {
    std::filesystem::copy(test::tiny_demo_model(), model());
    json tokenizer = json::parse(test::read_text_file(model() / "tokenizer.json"));
    for (json& token : tokenizer["added_tokens"]) {
      if (token["id"] == kCallToken) {
        token["content"] = call;
        token["special"] = special;
      }
    }
    std::ofstream(model() / "tokenizer.json") << tokenizer.dump();
    json config = json::parse(test::read_text_file(model() / "tokenizer_config.json"));
    config["added_tokens_decoder"][std::to_string(kCallToken)]["content"] = call;
    config["added_tokens_decoder"][std::to_string(kCallToken)]["special"] = special;
    config["chat_template"] = chat_template;
    std::ofstream(model() / "tokenizer_config.json") << config.dump();
  }
  std::filesystem::path model() const { return path() / "model"; }
};

const json kTools = json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}}}}])");

// A chat request whose model writes the call token `tokens` times.
json calling(int tokens, json extra = json::object()) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"tools", kTools},
               {"temperature", 0},
               {"logit_bias", {{std::to_string(kCallToken), 100}}},
               {"max_tokens", tokens}};
  body.update(extra);
  return body;
}

json post(httplib::Client& client, const json& body) {
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  EXPECT_TRUE(res);
  if (!res) return json();
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body)["choices"][0];
}

// The prompt a chat body renders to, through /tokenize and /detokenize.
std::string rendered_prompt(httplib::Client& client, const json& body) {
  auto tokens = client.Post("/tokenize", body.dump(), "application/json");
  EXPECT_TRUE(tokens && tokens->status == 200);
  if (!tokens || tokens->status != 200) return "";
  auto text =
      client.Post("/detokenize", json({{"tokens", json::parse(tokens->body)["tokens"]}}).dump(),
                  "application/json");
  EXPECT_TRUE(text && text->status == 200);
  if (!text || text->status != 200) return "";
  return json::parse(text->body)["prompt"];
}

void expect_weather_call(const json& call) {
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u) << call;
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
}

// A stream's single choice, gathered: its content, its calls by index (arguments
// joined, as clients join them), and its finish reason.
struct StreamedChoice {
  std::string content;
  std::map<int, json> calls;
  json finish_reason;
};

StreamedChoice gather(const test::Sse& sse) {
  StreamedChoice out;
  for (const json& event : sse.events) {
    if (event["choices"].empty()) continue;
    const json& choice = event["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      out.content += delta["content"].get<std::string>();
    }
    for (const json& call : delta.value("tool_calls", json::array())) {
      json& whole = out.calls[call["index"].get<int>()];
      if (whole.is_null()) {
        whole = call;
        whole.erase("index");
      } else {
        whole["function"]["arguments"] = whole["function"]["arguments"].get<std::string>() +
                                         call["function"]["arguments"].get<std::string>();
      }
    }
    if (!choice["finish_reason"].is_null()) out.finish_reason = choice["finish_reason"];
  }
  return out;
}

TEST(ToolCalls, CallsTheModelWritesComeBackAsToolCalls) {
  const ScriptedReplyModel model;
  test::ServerProcess server({"--num-kv-blocks", "64"}, model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("read as hermes"), std::string::npos) << server.log();
  httplib::Client client = server.client();

  // Two calls, cut by max_tokens: the reason stays "length".
  const json two = post(client, calling(2));
  EXPECT_TRUE(two["message"]["content"].is_null()) << two;
  ASSERT_EQ(two["message"]["tool_calls"].size(), 2u) << two;
  expect_weather_call(two["message"]["tool_calls"][0]);
  expect_weather_call(two["message"]["tool_calls"][1]);
  EXPECT_NE(two["message"]["tool_calls"][0]["id"], two["message"]["tool_calls"][1]["id"]);
  EXPECT_EQ(two["finish_reason"], "length");

  // parallel_tool_calls false: the first call only, whole and streamed.
  const json first = post(client, calling(2, {{"parallel_tool_calls", false}}));
  ASSERT_EQ(first["message"]["tool_calls"].size(), 1u) << first;
  expect_weather_call(first["message"]["tool_calls"][0]);
  EXPECT_EQ(
      gather(test::post_stream(client, "/v1/chat/completions",
                               calling(2, {{"stream", true}, {"parallel_tool_calls", false}})))
          .calls.size(),
      1u);

  // A stop string at the end of the call: it ends for the call.
  const json one = post(client, calling(4, {{"stop", {"</tool_call>"}}}));
  ASSERT_EQ(one["message"]["tool_calls"].size(), 1u) << one;
  expect_weather_call(one["message"]["tool_calls"][0]);
  EXPECT_EQ(one["finish_reason"], "tool_calls");

  // Streamed: the same calls, each whole in a delta with its index.
  const StreamedChoice streamed =
      gather(test::post_stream(client, "/v1/chat/completions", calling(2, {{"stream", true}})));
  EXPECT_EQ(streamed.content, "");
  ASSERT_EQ(streamed.calls.size(), 2u);
  expect_weather_call(streamed.calls.at(0));
  expect_weather_call(streamed.calls.at(1));
  EXPECT_EQ(streamed.finish_reason, "length");
  // Each of n choices numbers its own calls.
  const test::Sse both_choices =
      test::post_stream(client, "/v1/chat/completions", calling(1, {{"stream", true}, {"n", 2}}));
  std::map<int, std::vector<json>> calls_of_choice;
  for (const json& event : both_choices.events) {
    for (const json& choice : event["choices"]) {
      for (const json& call : choice["delta"].value("tool_calls", json::array()))
        calls_of_choice[choice["index"].get<int>()].push_back(call);
    }
  }
  ASSERT_EQ(calls_of_choice.size(), 2u);
  for (const auto& [index, calls] : calls_of_choice) {
    ASSERT_EQ(calls.size(), 1u) << index;
    EXPECT_EQ(calls[0]["index"], 0);
    expect_weather_call(calls[0]);
  }
  const StreamedChoice stopped = gather(test::post_stream(
      client, "/v1/chat/completions", calling(4, {{"stream", true}, {"stop", {"</tool_call>"}}})));
  ASSERT_EQ(stopped.calls.size(), 1u);
  EXPECT_EQ(stopped.finish_reason, "tool_calls");

  // tool_choice "none", or no tools: the text as the model wrote it.
  const std::string both = std::string(kCall) + kCall;
  for (const json& body : {calling(2, {{"tool_choice", "none"}}), [] {
                             json b = calling(2);
                             b.erase("tools");
                             return b;
                           }()}) {
    const json text = post(client, body);
    EXPECT_EQ(text["message"]["content"], both) << body;
    EXPECT_FALSE(text["message"].contains("tool_calls")) << text;
    const StreamedChoice s = gather(test::post_stream(client, "/v1/chat/completions", [&] {
      json b = body;
      b["stream"] = true;
      return b;
    }()));
    EXPECT_EQ(s.content, both);
    EXPECT_TRUE(s.calls.empty());
  }

  // The call goes back to the model with its arguments as the object they hold.
  json turn = calling(1);
  turn["messages"].push_back(
      {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", two["message"]["tool_calls"]}});
  turn["messages"].push_back({{"role", "tool"},
                              {"tool_call_id", two["message"]["tool_calls"][0]["id"]},
                              {"content", "sunny"}});
  const std::string text = rendered_prompt(client, turn);
  EXPECT_NE(text.find(R"("arguments": {"city": "Paris"}})"), std::string::npos) << text;
}

// Mistral's calls: a list after [TOOL_CALLS], and ids its template takes back (9 letters
// and digits).
TEST(ToolCalls, MistralCallsGetIdsItsTemplateTakes) {
  const ScriptedReplyModel model(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
      "{\"name\": \"get_time\", \"arguments\": {}}]");
  test::ServerProcess server({"--num-kv-blocks", "64", "--tool-call-parser", "mistral"},
                             model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client();
  const json reply = post(client, calling(1));
  const json& calls = reply["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << reply;
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  for (const json& call : calls) {
    const std::string id = call["id"];
    EXPECT_EQ(id.size(), 9u) << id;
    EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(c); })) << id;
  }
}

// Some tokenizers make <tool_call> a special token, which text leaves out by default:
// with tools, the reply keeps it, so that its calls are read.
TEST(ToolCalls, CallsInSpecialTokensAreRead) {
  const ScriptedReplyModel model(kCall, true);
  test::ServerProcess server({"--num-kv-blocks", "64", "--tool-call-parser", "hermes"},
                             model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client();
  const json reply = post(client, calling(1));
  ASSERT_EQ(reply["message"]["tool_calls"].size(), 1u) << reply;
  expect_weather_call(reply["message"]["tool_calls"][0]);
  json plain = calling(1);
  plain.erase("tools");
  EXPECT_EQ(post(client, plain)["message"]["content"], "");  // skipped as special
}

// A thinking model's <think> block comes back as `reasoning` (and `reasoning_content`),
// whole and streamed, its calls as tool_calls; include_reasoning false leaves it out.
TEST(Reasoning, ThinkingComesBackApartFromTheAnswer) {
  const ScriptedReplyModel model("<think>\nI need the weather.\n</think>\n\n" + std::string(kCall),
                                 false, chat_template(true));
  test::ServerProcess server({"--num-kv-blocks", "64"}, model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("knows <think>"), std::string::npos) << server.log();
  httplib::Client client = server.client();

  const json reply = post(client, calling(1));
  EXPECT_EQ(reply["message"]["reasoning"], "I need the weather.") << reply;
  EXPECT_EQ(reply["message"]["reasoning_content"], "I need the weather.");
  EXPECT_TRUE(reply["message"]["content"].is_null());
  ASSERT_EQ(reply["message"]["tool_calls"].size(), 1u);
  expect_weather_call(reply["message"]["tool_calls"][0]);
  EXPECT_EQ(reply["finish_reason"], "length");

  // Streamed: the reasoning in deltas of its own, then the call.
  const test::Sse sse =
      test::post_stream(client, "/v1/chat/completions", calling(1, {{"stream", true}}));
  std::string reasoning;
  for (const json& event : sse.events) {
    for (const json& choice : event["choices"])
      reasoning += choice["delta"].value("reasoning", "");
  }
  EXPECT_EQ(reasoning, "I need the weather.");
  const StreamedChoice streamed = gather(sse);
  EXPECT_EQ(streamed.content, "");
  ASSERT_EQ(streamed.calls.size(), 1u);

  // Without tools, the call is text after the reasoning.
  json plain = calling(1, {{"include_reasoning", false}});
  plain.erase("tools");
  const json text = post(client, plain);
  EXPECT_EQ(text["message"]["content"], kCall);
  EXPECT_FALSE(text["message"].contains("reasoning"));

  // An earlier turn's reasoning reaches the template as reasoning_content.
  json turn = calling(1);
  turn["messages"].push_back(
      {{"role", "assistant"}, {"content", "Sunny."}, {"reasoning", "Looked it up."}});
  const std::string prompt = rendered_prompt(client, turn);
  EXPECT_NE(prompt.find("<think>Looked it up.</think>Sunny."), std::string::npos) << prompt;
}

// DeepSeek-R1's template opens <think> in the prompt: the reply starts in its reasoning.
TEST(Reasoning, APromptThatOpensThinkStartsTheReplyInIt) {
  const ScriptedReplyModel model("Two and two.\n</think>\n\nFour.", false,
                                 chat_template(true, true));
  test::ServerProcess server({"--num-kv-blocks", "64"}, model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client();
  json body = calling(1);
  body.erase("tools");
  const json reply = post(client, body);
  EXPECT_EQ(reply["message"]["reasoning"], "Two and two.") << reply;
  EXPECT_EQ(reply["message"]["content"], "Four.");
  body["stream"] = true;
  const StreamedChoice streamed = gather(test::post_stream(client, "/v1/chat/completions", body));
  EXPECT_EQ(streamed.content, "Four.");
}

TEST(ToolCalls, ParserNoneLeavesTheText) {
  const ScriptedReplyModel model;
  test::ServerProcess server({"--num-kv-blocks", "64", "--tool-call-parser", "none"},
                             model.model());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client();
  const json text = post(client, calling(1));
  EXPECT_EQ(text["message"]["content"], kCall);
  EXPECT_FALSE(text["message"].contains("tool_calls"));
  EXPECT_EQ(text["finish_reason"], "length");
}

}  // namespace
}  // namespace pagellm
