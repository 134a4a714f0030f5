#pragma once
// Sequence: one stream of tokens being generated, and where it stands.
//
//   waiting --admit--> running --finish--> finished
//      ^                  |
//      +---- preempt -----+   (blocks freed; recomputed from the prefix cache on resume)
//
// Any state can go to finished by abort.

#include <cstdint>
#include <string>
#include <vector>

#include "paging/types.h"
#include "scheduler/sampling_params.h"

namespace pagellm::scheduler {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kFinished };

enum class FinishReason : uint8_t {
  kNone,
  kStop,    // EOS, a stop token or a stop string
  kLength,  // max_tokens or the context window
  kAbort,   // cancelled by the client or the server
};

const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort"

// Times of one sequence's life, in seconds on one monotonic clock (0: not yet).
struct SequenceTimes {
  double arrival = 0;
  double first_scheduled = 0;
  double first_token = 0;
  double last_token = 0;
  double finished = 0;
};

struct Sequence {
  paging::SeqId id = 0;
  std::vector<int32_t> tokens;  // prompt, then output
  int32_t prompt_len = 0;
  int32_t num_computed = 0;  // leading tokens whose KV is in the cache
  SamplingParams params;
  int32_t priority = 0;  // lower runs first under the priority policy (as vLLM)
  uint64_t cache_salt = 0;
  std::vector<int32_t> eos_token_ids;  // the model's; ignored with params.ignore_eos

  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  uint64_t arrival_order = 0;  // FCFS order, assigned by the scheduler
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt_tokens = 0;  // prefix-cache hit at the first admission
  int64_t resumed_at_step = -1;          // the step it last came back after a preemption
  int64_t last_scheduled_step = -1;      // scheduler bookkeeping
  SequenceTimes times;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - prompt_len; }
  bool is_prefilling() const { return num_computed < prompt_len; }
  bool finished() const { return status == SequenceStatus::kFinished; }
};

}  // namespace pagellm::scheduler
