#pragma once
// A thinking model's reasoning, given apart from its answer: the text it writes between
// <think> and </think> before the answer (Qwen3, QwQ, DeepSeek-R1, SmolLM3). The reply
// is in its reasoning from the start when the prompt leaves a <think> open (DeepSeek-R1's
// and Qwen3.5's templates end the generation prompt with one), or when the reply itself
// opens with <think>; it leaves it at the first </think>, and everything after is the
// answer. A model that does not think writes no <think>, and its reply is all answer.
// deepseek_r1, as in vLLM, takes every reply to start in its reasoning unless the prompt
// closed it (its template opens the tag only for some turns).

#include <optional>
#include <string>
#include <string_view>

namespace pagellm::server {

enum class ReasoningFormat { kNone, kQwen3, kDeepSeekR1 };

// "none", "qwen3" or "deepseek_r1"; nullopt for another name.
std::optional<ReasoningFormat> reasoning_format_named(std::string_view name);
const char* reasoning_format_name(ReasoningFormat format);
// kQwen3 when the chat template knows <think> (it renders or strips reasoning).
ReasoningFormat reasoning_format_of_template(std::string_view chat_template_source);
// Whether the reply to `prompt` starts in its reasoning: the prompt's last think tag is
// an open <think> (or, for deepseek_r1, is not a </think>).
bool reply_starts_in_reasoning(ReasoningFormat format, std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  void append(const ReasoningDelta& more);
};

// Splits a reply, as it arrives in pieces, into reasoning and answer. The reasoning
// leaves out the line breaks at its two ends, and the answer those after </think> (as
// Qwen3's template strips them); a <think> that opens the reply is dropped, also when it
// starts in its reasoning. Text is held back only while it may be a cut tag, and line
// breaks at the end of the reasoning until more of it follows. Whatever the pieces,
// they add up to what the whole text gives.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_in_reasoning);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();  // the end of the text: whatever was held back

 private:
  void take(ReasoningDelta& out);
  void add_reasoning(ReasoningDelta& out, std::string_view text);

  enum class State { kStart, kReasoning, kAfterReasoning, kAnswer };
  State state_ = State::kStart;
  bool starts_in_reasoning_;     // where kStart goes when the reply does not open <think>
  std::string pending_;          // text not yet placed
  std::string leading_;          // kStart: the whitespace so far
  std::string trailing_breaks_;  // line breaks at the end of the reasoning so far
  bool reasoning_started_ = false;
};

// The whole text at once.
ReasoningDelta split_reasoning(bool starts_in_reasoning, std::string_view text);

}  // namespace pagellm::server
