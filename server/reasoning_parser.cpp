#include "server/reasoning_parser.h"

#include <algorithm>

#include "server/text_markers.h"

namespace pagellm::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
constexpr std::string_view kLineBreaks = "\r\n";

}  // namespace

std::optional<ReasoningFormat> reasoning_format_named(std::string_view name) {
  for (ReasoningFormat f :
       {ReasoningFormat::kNone, ReasoningFormat::kQwen3, ReasoningFormat::kDeepSeekR1}) {
    if (name == reasoning_format_name(f)) return f;
  }
  return std::nullopt;
}

const char* reasoning_format_name(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kQwen3:
      return "qwen3";
    case ReasoningFormat::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningFormat::kNone:
      break;
  }
  return "none";
}

ReasoningFormat reasoning_format_of_template(std::string_view source) {
  return source.find(kOpen) != std::string_view::npos ? ReasoningFormat::kQwen3
                                                      : ReasoningFormat::kNone;
}

bool reply_starts_in_reasoning(ReasoningFormat format, std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen), close = prompt.rfind(kClose);
  const bool closed =
      close != std::string_view::npos && (open == std::string_view::npos || close > open);
  if (format == ReasoningFormat::kDeepSeekR1) return !closed;
  return open != std::string_view::npos && !closed;
}

void ReasoningDelta::append(const ReasoningDelta& more) {
  reasoning += more.reasoning;
  content += more.content;
}

ReasoningDelta split_reasoning(bool starts_in_reasoning, std::string_view text) {
  ReasoningStream stream(starts_in_reasoning);
  ReasoningDelta all = stream.feed(text);
  all.append(stream.finish());
  return all;
}

ReasoningStream::ReasoningStream(bool starts_in_reasoning)
    : starts_in_reasoning_(starts_in_reasoning) {}

ReasoningDelta ReasoningStream::feed(std::string_view text) {
  ReasoningDelta out;
  pending_ += text;
  take(out);
  return out;
}

ReasoningDelta ReasoningStream::finish() {
  ReasoningDelta out;
  if (state_ == State::kReasoning) {
    add_reasoning(out, pending_);  // cut short: a partial </think> is reasoning after all
  } else if (state_ == State::kStart) {
    // Whitespace, or a partial <think>: the answer, or the reasoning it was in.
    if (starts_in_reasoning_) {
      add_reasoning(out, leading_ + pending_);
    } else {
      out.content += leading_ + pending_;
    }
  }
  pending_.clear();
  leading_.clear();
  trailing_breaks_.clear();
  return out;
}

void ReasoningStream::take(ReasoningDelta& out) {
  while (!pending_.empty()) {
    switch (state_) {
      case State::kStart: {
        // A reply may open with <think>, after whitespace, which is dropped; anything else
        // is the answer, or the reasoning the prompt left open.
        const size_t first = std::min(pending_.find_first_not_of(kWhitespace), pending_.size());
        leading_.append(pending_, 0, first);
        pending_.erase(0, first);
        if (pending_.empty()) return;
        if (pending_.starts_with(kOpen)) {
          pending_.erase(0, kOpen.size());
          leading_.clear();
          state_ = State::kReasoning;
        } else if (kOpen.starts_with(pending_)) {
          return;  // maybe <think>, cut
        } else if (starts_in_reasoning_) {
          pending_.insert(0, leading_);
          leading_.clear();
          state_ = State::kReasoning;
        } else {
          out.content += leading_;
          leading_.clear();
          state_ = State::kAnswer;
        }
        break;
      }
      case State::kReasoning: {
        const size_t close = pending_.find(kClose);
        if (close != std::string::npos) {
          add_reasoning(out, std::string_view(pending_).substr(0, close));
          pending_.erase(0, close + kClose.size());
          trailing_breaks_.clear();  // the whitespace at the reasoning's end
          state_ = State::kAfterReasoning;
          break;
        }
        const size_t sure = pending_.size() - partial_marker(pending_, kClose);
        add_reasoning(out, std::string_view(pending_).substr(0, sure));
        pending_.erase(0, sure);
        return;
      }
      case State::kAfterReasoning: {
        const size_t first = pending_.find_first_not_of(kLineBreaks);
        if (first == std::string::npos) {
          pending_.clear();
          return;
        }
        pending_.erase(0, first);
        state_ = State::kAnswer;
        break;
      }
      case State::kAnswer:
        out.content += pending_;
        pending_.clear();
        return;
    }
  }
}

void ReasoningStream::add_reasoning(ReasoningDelta& out, std::string_view text) {
  const size_t last = text.find_last_not_of(kLineBreaks);
  if (last == std::string_view::npos) {
    if (reasoning_started_) trailing_breaks_ += text;  // leading line breaks are dropped
    return;
  }
  if (!reasoning_started_) {
    text.remove_prefix(text.find_first_not_of(kLineBreaks));
    reasoning_started_ = true;
  } else {
    out.reasoning += trailing_breaks_;
  }
  const size_t end = text.find_last_not_of(kLineBreaks) + 1;
  out.reasoning += text.substr(0, end);
  trailing_breaks_ = text.substr(end);
}

}  // namespace pagellm::server
