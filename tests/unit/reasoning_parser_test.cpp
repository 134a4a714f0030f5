#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

namespace pagellm::server {
namespace {

using Split = std::pair<std::string, std::string>;  // reasoning, answer

Split split(const std::vector<std::string>& pieces, bool in_reasoning = false,
            std::vector<ReasoningDelta>* deltas = nullptr) {
  ReasoningStream stream(in_reasoning);
  Split out;
  auto add = [&](ReasoningDelta d) {
    out.first += d.reasoning;
    out.second += d.content;
    if (deltas) deltas->push_back(std::move(d));
  };
  for (const std::string& piece : pieces)
    add(stream.feed(piece));
  add(stream.finish());
  return out;
}

Split whole(const std::string& text, bool in_reasoning = false) {
  const ReasoningDelta d = split_reasoning(in_reasoning, text);
  return {d.reasoning, d.content};
}

TEST(ReasoningFormat, NamesAndTemplates) {
  EXPECT_EQ(reasoning_format_named("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(reasoning_format_named("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(reasoning_format_named("none"), ReasoningFormat::kNone);
  EXPECT_EQ(reasoning_format_named("o1"), std::nullopt);
  EXPECT_EQ(reasoning_format_of_template("{{- '<|im_start|>assistant\\n<think>\\n' }}"),
            ReasoningFormat::kQwen3);
  EXPECT_EQ(reasoning_format_of_template("{{ messages[0].content }}"), ReasoningFormat::kNone);
}

TEST(ReasoningFormat, APromptThatLeavesThinkOpenStartsTheReplyInIt) {
  const auto think = ReasoningFormat::kQwen3;
  EXPECT_TRUE(reply_starts_in_reasoning(think, "<|Assistant|><think>\n"));
  EXPECT_TRUE(reply_starts_in_reasoning(think, "<think>"));
  EXPECT_TRUE(reply_starts_in_reasoning(think, "<think>a</think>b<think>\nI started"));
  // enable_thinking=false closes it in the prompt; earlier turns close theirs.
  EXPECT_FALSE(reply_starts_in_reasoning(think, "assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(reply_starts_in_reasoning(think, "<think>a</think>b<|im_start|>assistant\n"));
  EXPECT_FALSE(reply_starts_in_reasoning(think, "<|im_start|>assistant\n"));
  EXPECT_FALSE(reply_starts_in_reasoning(think, ""));
  // deepseek_r1: in its reasoning unless the prompt closed it.
  const auto r1 = ReasoningFormat::kDeepSeekR1;
  EXPECT_TRUE(reply_starts_in_reasoning(r1, "<｜Assistant｜>"));
  EXPECT_TRUE(reply_starts_in_reasoning(r1, "<｜Assistant｜><think>\n"));
  EXPECT_FALSE(reply_starts_in_reasoning(r1, "<think>\n\n</think>\n\n"));
}

TEST(ReasoningStream, ThinkingThenTheAnswer) {
  // Qwen3: the reply opens the tag itself.
  EXPECT_EQ(whole("<think>\nLet me see.\n\nIt is 4.\n</think>\n\nThe answer is 4."),
            Split("Let me see.\n\nIt is 4.", "The answer is 4."));
  // DeepSeek-R1: the prompt opened it.
  EXPECT_EQ(whole("Hmm, 2+2.\n</think>\n\n4", true), Split("Hmm, 2+2.", "4"));
  // Cut short while thinking: all reasoning.
  EXPECT_EQ(whole("<think>\nstill thinking\n", false), Split("still thinking", ""));
  // Started in its reasoning, the reply may open the tag again.
  EXPECT_EQ(whole("<think>\nHm.</think>4", true), Split("Hm.", "4"));
  EXPECT_EQ(whole("Hm.", true), Split("Hm.", ""));
  // Only line breaks go at the ends: the answer's indentation stays.
  EXPECT_EQ(whole("<think>\n  a plan  \n</think>\n    def f():\n        pass"),
            Split("  a plan  ", "    def f():\n        pass"));
  // An empty think block (Qwen3 with thinking off, written by the model).
  EXPECT_EQ(whole("<think>\n\n</think>\n\nHello"), Split("", "Hello"));
}

TEST(ReasoningStream, AReplyWithoutThinkIsAllAnswer) {
  for (std::string text : {"Hello", "  Hello  ", "", "\n", "<thin", "<b>bold</b>",
                           "x <think>not at the start</think> y", "</think> stray"}) {
    EXPECT_EQ(whole(text), Split("", text)) << text;
  }
  // Only the first </think> ends the reasoning.
  EXPECT_EQ(whole("<think>a</think>b</think>c"), Split("a", "b</think>c"));
}

TEST(ReasoningStream, ReasoningGoesOutAsItComes) {
  std::vector<ReasoningDelta> d;
  split({"<th", "ink>", "\nStep 1", ".\n", "</thi", "nk>", "\n\nDone", " now"}, false, &d);
  ASSERT_EQ(d.size(), 9u);
  EXPECT_EQ(d[0].reasoning + d[0].content, "");  // "<th" may open the tag
  EXPECT_EQ(d[2].reasoning, "Step 1");
  EXPECT_EQ(d[3].reasoning, ".");  // its newline waits: it may end the reasoning
  EXPECT_EQ(d[4].reasoning, "");   // "</thi" may close it
  EXPECT_EQ(d[6].content, "Done");
  EXPECT_EQ(d[7].content, " now");
}

TEST(ReasoningStream, AnySplitGivesWhatTheWholeTextGives) {
  const std::vector<std::string> parts = {"<think>", "</think>", "<", "</",  "<th", "think>",
                                          "\n",      " ",        "a", "b c", "é",   "\n\n"};
  std::mt19937 rng(3);
  int reasoned = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    for (int n = std::uniform_int_distribution<int>(0, 9)(rng); n > 0; --n)
      text += parts[rng() % parts.size()];
    const bool in_reasoning = rng() % 3 == 0;
    const Split expected = whole(text, in_reasoning);
    if (!expected.first.empty()) ++reasoned;
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      ASSERT_EQ(split({text.substr(0, cut), text.substr(cut)}, in_reasoning), expected) << text;
    }
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size(); ++at)
      pieces.push_back(text.substr(at, 1));
    ASSERT_EQ(split(pieces, in_reasoning), expected) << text;
  }
  EXPECT_GT(reasoned, 500);
}

}  // namespace
}  // namespace pagellm::server
