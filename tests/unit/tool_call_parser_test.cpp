#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace pagellm::server {
namespace {

using F = ToolCallFormat;

std::vector<std::pair<std::string, std::string>> calls_of(const ParsedToolCalls& p) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ParsedToolCall& c : p.calls)
    out.emplace_back(c.name, c.arguments);
  return out;
}

using Calls = std::vector<std::pair<std::string, std::string>>;

TEST(ToolCallFormat, NamesRoundTrip) {
  for (F f : {F::kNone, F::kHermes, F::kLlama3Json, F::kMistral}) {
    EXPECT_EQ(tool_call_format_named(tool_call_format_name(f)), f);
  }
  EXPECT_EQ(tool_call_format_named("qwen"), std::nullopt);
}

TEST(ToolCallFormat, ComesFromWhatTheTemplateTeaches) {
  // Fragments of the real templates.
  EXPECT_EQ(tool_call_format_of_template(
                "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "),
            F::kHermes);
  EXPECT_EQ(tool_call_format_of_template("{{- \"<|python_tag|>\" + tool_call.name }}"),
            F::kLlama3Json);
  EXPECT_EQ(tool_call_format_of_template(
                "Respond in the format {\\\"name\\\": function name, \\\"parameters\\\": "
                "dictionary of argument name and its value}."),
            F::kLlama3Json);
  EXPECT_EQ(tool_call_format_of_template("{{- '[TOOL_CALLS][' }}"), F::kMistral);
  // Qwen3-Coder: XML inside the tags, which no format here reads.
  EXPECT_EQ(tool_call_format_of_template(
                "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"),
            F::kNone);
  EXPECT_EQ(tool_call_format_of_template("{% for message in messages %}{{ message.content }}"),
            F::kNone);
}

TEST(ParseToolCalls, HermesCallsBecomeCallsAndTheTextBeforeThemContent) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kHermes,
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(p.content, "Let me look.");
  EXPECT_EQ(calls_of(p),
            (Calls{{"get_weather", R"({"city":"Paris","days":[1,2]})"}, {"get_time", "{}"}}));
}

TEST(ParseToolCalls, OnlyCallsMeansNoContent) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kHermes,
      "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"é\"}}\n</tool_call>\n");
  EXPECT_EQ(p.content, std::nullopt);
  EXPECT_EQ(calls_of(p), (Calls{{"f", "{\"x\":\"é\"}"}}));
}

TEST(ParseToolCalls, TextWithoutCallsIsKeptExactly) {
  for (F f : {F::kNone, F::kHermes, F::kLlama3Json, F::kMistral}) {
    for (std::string text : {"", "  ", "Hello, world!\n\n", "\n a < b [ c { d", "<tool_c", "[TOOL_",
                             "<|python", "{\"answer\": 42}"}) {
      const ParsedToolCalls p = parse_tool_calls(f, text);
      EXPECT_EQ(p.content, text) << tool_call_format_name(f) << ": " << text;
      EXPECT_TRUE(p.calls.empty());
    }
  }
}

TEST(ParseToolCalls, WhatDoesNotReadAsACallStaysText) {
  for (std::string bad : {
           "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",  // malformed
           "<tool_call>{\"arguments\": {}}</tool_call>",                 // no name
           "<tool_call>{\"name\": 3}</tool_call>",                       // not a string
           "<tool_call>{\"name\": \"\"}</tool_call>",                    // empty
           "<tool_call>[]</tool_call>",                                  // no call
           "<tool_call>\"f\"</tool_call>",                               // not an object
           "<tool_call>{\"name\": \"f\"} and more</tool_call>",          // trailing text
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"b\"",  // cut short
           "<tool_call></tool_call>",                                    // empty
       }) {
    const ParsedToolCalls p = parse_tool_calls(F::kHermes, "Hi " + bad);
    EXPECT_EQ(p.content, "Hi " + bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
  }
  // A bad call among good ones: the good ones are calls, the bad one text.
  const ParsedToolCalls p = parse_tool_calls(
      F::kHermes, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{oops}</tool_call>");
  EXPECT_EQ(p.content, "<tool_call>{oops}</tool_call>");
  EXPECT_EQ(calls_of(p), (Calls{{"a", "{}"}}));
}

TEST(ParseToolCalls, AnUnclosedLastHermesCallCountsWhenItsJsonIsWhole) {
  // A stop string at </tool_call> leaves the call open.
  const ParsedToolCalls p =
      parse_tool_calls(F::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  EXPECT_EQ(p.content, std::nullopt);
  EXPECT_EQ(calls_of(p), (Calls{{"f", "{\"a\":1}"}}));
}

// Arguments written as JSON text pass through; other text becomes a JSON string, so
// that clients can always parse them.
TEST(ParseToolCalls, ArgumentsGivenAsTextAreJsonAfterAll) {
  const ParsedToolCalls p =
      parse_tool_calls(F::kHermes,
                       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                       "<tool_call>{\"name\": \"g\", \"arguments\": \"hello\"}</tool_call>"
                       "<tool_call>{\"name\": \"h\", \"arguments\": \"[1]\"}</tool_call>");
  EXPECT_EQ(calls_of(p), (Calls{{"f", "{\"a\": 1}"}, {"g", "\"hello\""}, {"h", "\"[1]\""}}));
}

TEST(ParseToolCalls, MarkersInsideJsonStringsDoNotEndTheCall) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kLlama3Json, "{\"name\": \"echo\", \"parameters\": {\"s\": \"} ; {\\\"\"}}");
  EXPECT_EQ(calls_of(p), (Calls{{"echo", R"({"s":"} ; {\""})"}}));
}

TEST(ParseToolCalls, Llama3CallsAreTheWholeReply) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kLlama3Json,
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"g\", "
      "\"parameters\": {}}");
  EXPECT_EQ(p.content, std::nullopt);
  EXPECT_EQ(calls_of(p), (Calls{{"get_weather", R"({"city":"Paris"})"}, {"g", "{}"}}));

  const ParsedToolCalls tagged =
      parse_tool_calls(F::kLlama3Json, "<|python_tag|>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_EQ(calls_of(tagged), (Calls{{"f", "{}"}}));

  // Text first: all of it is text.
  const std::string prose = "Sure: {\"name\": \"f\", \"parameters\": {}}";
  EXPECT_EQ(parse_tool_calls(F::kLlama3Json, prose).content, prose);
  // One bad object: the whole reply is text.
  const std::string half = "{\"name\": \"f\"}; {\"nome\": \"g\"}";
  EXPECT_EQ(parse_tool_calls(F::kLlama3Json, half).content, half);
  EXPECT_TRUE(parse_tool_calls(F::kLlama3Json, half).calls.empty());
}

TEST(ParseToolCalls, MistralCallsAreAListAfterTheMarker) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kMistral,
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
      "\"arguments\": {}}]");
  EXPECT_EQ(p.content, std::nullopt);
  EXPECT_EQ(calls_of(p), (Calls{{"a", "{\"x\":1}"}, {"b", "{}"}}));
}

TEST(ParseToolCalls, MistralV11CallsNameTheirFunctionBeforeTheArguments) {
  const ParsedToolCalls p = parse_tool_calls(
      F::kMistral,
      "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}");
  EXPECT_EQ(p.content, std::nullopt);
  EXPECT_EQ(calls_of(p), (Calls{{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}));
  for (std::string bad :
       {"[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS]f[ARGS]{} tail",
        "[TOOL_CALLS]f{}", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]"}) {
    EXPECT_EQ(parse_tool_calls(F::kMistral, bad).content, bad);
  }
}

TEST(ParseToolCalls, NestingPastTheLimitStaysText) {
  const std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(200, '[') +
                           std::string(200, ']') + "}</tool_call>";
  EXPECT_EQ(parse_tool_calls(F::kHermes, deep).content, deep);
}

// The stream's pieces, gathered.
ParsedToolCalls streamed(F format, const std::vector<std::string>& pieces,
                         std::vector<ToolCallDelta>* deltas = nullptr) {
  ToolCallStream stream(format);
  std::string content;
  ParsedToolCalls out;
  auto add = [&](ToolCallDelta d) {
    content += d.content;
    out.calls.insert(out.calls.end(), d.calls.begin(), d.calls.end());
    if (deltas) deltas->push_back(std::move(d));
  };
  for (const std::string& piece : pieces)
    add(stream.feed(piece));
  add(stream.finish());
  EXPECT_EQ(stream.calls(), static_cast<int>(out.calls.size()));
  if (out.calls.empty() || !content.empty()) out.content = content;
  return out;
}

TEST(ToolCallStream, ContentGoesOutAsSoonAsItCannotBeACall) {
  std::vector<ToolCallDelta> d;
  streamed(F::kHermes,
           {"Hello", " <tool", "_c", "x", " world\n", "<tool_call>{\"name\": ", "\"f\"}",
            "</tool_call>", "\n"},
           &d);
  ASSERT_EQ(d.size(), 10u);
  EXPECT_EQ(d[0].content, "Hello");
  EXPECT_EQ(d[1].content, "");  // " <tool" may open a call
  EXPECT_EQ(d[2].content, "");
  EXPECT_EQ(d[3].content, " <tool_cx");
  EXPECT_EQ(d[4].content, " world");  // the newline waits for what follows
  EXPECT_EQ(d[5].content, "");
  EXPECT_TRUE(d[6].calls.empty());
  ASSERT_EQ(d[7].calls.size(), 1u);  // out when the call closes
  EXPECT_EQ(d[7].calls[0].name, "f");
  EXPECT_EQ(d[9].content, "");  // a reply with calls drops the whitespace at its end
}

TEST(ToolCallStream, Llama3HoldsAReplyThatOpensWithABraceToTheEnd) {
  std::vector<ToolCallDelta> d;
  streamed(F::kLlama3Json, {"{\"answer\"", ": 42}"}, &d);
  EXPECT_EQ(d[0].content, "");
  EXPECT_EQ(d[1].content, "");
  EXPECT_EQ(d[2].content, "{\"answer\": 42}");
  d.clear();
  streamed(F::kLlama3Json, {"The", " answer"}, &d);
  EXPECT_EQ(d[0].content, "The");
}

// Texts made of pieces that exercise every state: markers whole and cut, calls good and
// bad, whitespace, and text that looks like a marker.
std::string random_reply(std::mt19937& rng, F format) {
  static const std::vector<std::string> common = {
      "Hi",
      " ",
      "\n",
      "\n\n",
      "text",
      "<",
      "<tool",
      "[",
      "[TOOL",
      "{",
      "}",
      "\"",
      ";",
      "<|py",
      "{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}",
      "{\"name\": \"g\"}",
      "{\"nom\": 1}",
      "[{\"name\": \"h\", \"arguments\": {}}]",
      "é",
      "\xF0\x9F\x98\x80"};
  std::vector<std::string> parts = common;
  switch (format) {
    case F::kHermes:
      parts.insert(parts.end(), {"<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>"});
      break;
    case F::kMistral:
      parts.insert(parts.end(), {"[TOOL_CALLS]", "[TOOL_CALLS] ", "f[ARGS]", "[ARGS]"});
      break;
    case F::kLlama3Json:
      parts.insert(parts.end(), {"<|python_tag|>", "; "});
      break;
    case F::kNone:
      break;
  }
  auto any = [&](int most) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, most)(rng);
    for (int i = 0; i < n; ++i)
      text += parts[std::uniform_int_distribution<size_t>(0, parts.size() - 1)(rng)];
    return text;
  };
  if (rng() % 2) return any(8);
  // Half of them in the shape a model writes: text, calls, text.
  static const std::vector<std::string> bodies = {
      "{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}", "{\"name\": \"g\"}",
      "[{\"name\": \"h\", \"arguments\": {}}]", "{\"nom\": 1}", "{\"name\": "};
  auto body = [&] { return bodies[rng() % bodies.size()]; };
  std::string text = any(3);
  switch (format) {
    case F::kHermes:
      for (int i = rng() % 3; i >= 0; --i)
        text += "<tool_call>\n" + body() + "\n</tool_call>" + any(1);
      break;
    case F::kMistral:
      if (rng() % 2) {
        text += "[TOOL_CALLS]" + body();
      } else {
        for (int i = rng() % 2; i >= 0; --i)
          text += "[TOOL_CALLS]f" + std::string(rng() % 4 ? "[ARGS]" : "") + body();
      }
      break;
    case F::kLlama3Json:
      text = std::string(rng() % 2 ? "<|python_tag|>" : " ") + body() + "; " + body();
      break;
    case F::kNone:
      break;
  }
  return text + any(1);
}

TEST(ToolCallStream, AnySplitGivesWhatTheWholeTextGives) {
  std::mt19937 rng(7);
  int with_calls = 0, checked = 0;
  for (F format : {F::kHermes, F::kLlama3Json, F::kMistral, F::kNone}) {
    for (int round = 0; round < 1500; ++round) {
      const std::string text = random_reply(rng, format);
      const ParsedToolCalls whole = parse_tool_calls(format, text);
      if (!whole.calls.empty()) ++with_calls;
      // Without calls, the content is the text itself.
      if (whole.calls.empty()) {
        EXPECT_EQ(whole.content, text);
      }
      // Every split in two, and random splits into many.
      std::vector<std::vector<std::string>> splits;
      for (size_t cut = 0; cut <= text.size(); ++cut)
        splits.push_back({text.substr(0, cut), text.substr(cut)});
      for (int r = 0; r < 4; ++r) {
        std::vector<std::string> pieces;
        for (size_t at = 0; at < text.size();) {
          const size_t len = std::uniform_int_distribution<size_t>(1, 6)(rng);
          pieces.push_back(text.substr(at, len));
          at += len;
        }
        splits.push_back(pieces);
      }
      for (const auto& pieces : splits) {
        const ParsedToolCalls s = streamed(format, pieces);
        ++checked;
        ASSERT_EQ(s.content, whole.content) << tool_call_format_name(format) << ": " << text;
        ASSERT_EQ(calls_of(s), calls_of(whole)) << text;
      }
    }
  }
  EXPECT_GT(with_calls, 800);  // the inputs do reach the calls
  EXPECT_GT(checked, 50000);
}

}  // namespace
}  // namespace pagellm::server
