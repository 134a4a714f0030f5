#pragma once
// RequestStream: the output of one request, handed from the engine thread to whoever
// submitted it (an HTTP handler). Thread-safe; the engine pushes, the client pulls.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "scheduler/sequence.h"

namespace pagellm::engine {

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

// New output since the previous chunk. The last chunk of a stream has `finished` set,
// with the reason, usage and times filled in.
struct GenerationChunk {
  std::string text;                  // newly completed text (stop strings held back)
  std::vector<SampledToken> tokens;  // new tokens, with logprobs when asked for
  std::vector<double> token_times;   // when each token was sampled (engine clock)
  bool finished = false;
  scheduler::FinishReason finish_reason = scheduler::FinishReason::kNone;
  std::string error;  // set when the request failed inside the engine
  Usage usage;
  scheduler::SequenceTimes times;  // seconds on the engine's monotonic clock
};

// Appends `from` to `into`: text, tokens and their times; the end fields when `from` is
// the finished chunk.
void merge_chunk(GenerationChunk& into, GenerationChunk&& from);

class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Waits up to `timeout` for output; nullopt on timeout, or once the finished chunk
  // has been taken. Chunks waiting together are merged into one.
  std::optional<GenerationChunk> next(std::chrono::milliseconds timeout);
  // Waits for the end, or until `deadline` (past it, takes only what has come), and
  // returns everything merged into one chunk: finished unless the deadline cut it short.
  GenerationChunk collect(std::chrono::steady_clock::time_point deadline =
                              std::chrono::steady_clock::time_point::max());

  // Engine side.
  void push(GenerationChunk chunk);
  bool finished() const;

 private:
  const uint64_t id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<GenerationChunk> chunks_;
  bool finished_pushed_ = false;
  bool finished_taken_ = false;
};

}  // namespace pagellm::engine
