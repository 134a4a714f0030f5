#include "engine/request_stream.h"

#include <algorithm>

namespace pagellm::engine {

void merge_chunk(GenerationChunk& into, GenerationChunk&& from) {
  into.text += from.text;
  for (SampledToken& t : from.tokens)
    into.tokens.push_back(std::move(t));
  into.token_times.insert(into.token_times.end(), from.token_times.begin(), from.token_times.end());
  if (from.finished) {
    into.finished = true;
    into.finish_reason = from.finish_reason;
    into.error = std::move(from.error);
    into.usage = from.usage;
    into.times = from.times;
  }
}

std::optional<GenerationChunk> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !chunks_.empty() || finished_taken_; })) {
    return std::nullopt;
  }
  if (chunks_.empty()) return std::nullopt;
  GenerationChunk out = std::move(chunks_.front());
  chunks_.pop_front();
  while (!chunks_.empty()) {
    merge_chunk(out, std::move(chunks_.front()));
    chunks_.pop_front();
  }
  if (out.finished) finished_taken_ = true;
  return out;
}

GenerationChunk RequestStream::collect(std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  GenerationChunk all;
  while (!all.finished) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    auto chunk = next(std::clamp(left, milliseconds(0), milliseconds(1000)));
    if (chunk) {
      merge_chunk(all, std::move(*chunk));
    } else if (finished() || left <= milliseconds(0)) {
      break;
    }
  }
  return all;
}

void RequestStream::push(GenerationChunk chunk) {
  {
    std::lock_guard lock(mutex_);
    if (finished_pushed_) return;  // nothing after the end
    finished_pushed_ = chunk.finished;
    chunks_.push_back(std::move(chunk));
  }
  ready_.notify_all();
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_taken_;
}

}  // namespace pagellm::engine
