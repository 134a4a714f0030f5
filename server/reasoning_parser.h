#pragma once
// A thinking model's reasoning, given apart from its answer: the text it writes between
// <think> and </think> before the answer (Qwen3, QwQ, DeepSeek-R1, SmolLM3). The reply
// is in its reasoning from the start when the prompt leaves a <think> open (DeepSeek-R1's
// and Qwen3.5's templates end the generation prompt with one), or when the reply itself
// opens with <think>; it leaves it at the first </think>, and everything after is the
// answer. A model that does not think writes no <think>, and its reply is all answer.

#include <optional>
#include <string>
#include <string_view>

namespace pagellm::server {

enum class ReasoningFormat { kNone, kThink };

// "none", or "qwen3" / "deepseek_r1" (the same tags); nullopt for another name.
std::optional<ReasoningFormat> reasoning_format_named(std::string_view name);
// kThink when the chat template knows <think> (it renders or strips reasoning).
ReasoningFormat reasoning_format_of_template(std::string_view chat_template_source);
// Whether the prompt ends inside an open <think> (whitespace aside).
bool prompt_opens_reasoning(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

// Splits a reply, as it arrives in pieces, into reasoning and answer. The reasoning
// leaves out the whitespace at its two ends, and the answer the whitespace after
// </think>; text is held back only while it may be a cut tag, and whitespace at the end
// of the reasoning until more of it follows. Whatever the pieces, they add up to what
// the whole text gives.
class ReasoningStream;

// The whole text at once.
ReasoningDelta split_reasoning(bool starts_in_reasoning, std::string_view text);

class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_in_reasoning);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();  // the end of the text: whatever was held back

 private:
  void take(ReasoningDelta& out);
  void add_reasoning(ReasoningDelta& out, std::string_view text);

  enum class State { kStart, kReasoning, kAfterReasoning, kAnswer };
  State state_;
  std::string pending_;  // text not yet placed
  // Whitespace held: before anything else (kStart), or at the end of the reasoning so far.
  std::string blank_;
  bool reasoning_started_ = false;
};

}  // namespace pagellm::server
