#pragma once
// Sampler: turns one sequence's logits into its next token, as the request asked.
//
// Order of operations (as vLLM does it): penalties on the raw logits (repetition over
// prompt and output; presence and frequency over output), then greedy argmax, or
// temperature, min-p, top-k and top-p followed by a seeded draw. Reported logprobs are
// those of the model's own distribution (log-softmax of the raw logits), so they do not
// change with the sampling settings.
//
// One Sampler per sequence: it holds the request's random generator (same seed, same
// tokens) and the token counts the penalties need, as the list kernels' apply_penalties
// reads, so that a backend can apply them where the logits are.

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/forward_batch.h"
#include "kernels/cpu/kernels.h"
#include "kernels/penalties.h"
#include "scheduler/sampling_params.h"

namespace pagellm::engine {

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;           // set when params.logprobs
  std::vector<TokenLogprob> top;  // params.top_logprobs entries, most likely first
};

class Sampler {
 public:
  // `seed` is used when the params carry none (the engine draws it per request).
  // `eos_token_ids`: the model's end-of-sequence tokens, held back with the stop token ids
  // for the first params.min_tokens tokens (unless params.ignore_eos).
  Sampler(const scheduler::SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed,
          std::span<const int32_t> eos_token_ids = {});

  // Chooses the next token from `logits` ([vocab]) and records it for the penalties.
  SampledToken sample(std::span<const float> logits);

  // Records a token chosen elsewhere (by the backend) for the penalties.
  void observe(int32_t token);

  // The random number the next draw would use, taken now, for a draw made elsewhere
  // with the same kernel (a backend sampling where the logits are). Then observe() the
  // token it chose.
  double next_uniform();

  // Whether the request has penalties or a logit_bias; then penalty_tokens() and
  // penalty_row() say what kernels' apply_penalties must do to its next logits.
  bool has_penalties() const { return has_penalties_; }
  // Every token the penalties and the bias touch, each once, with its current counts.
  const std::vector<kernels::PenaltyToken>& penalty_tokens() const { return penalty_tokens_; }
  // This request's row for a list whose penalty_tokens() start at `begin`.
  kernels::PenaltyRow penalty_row(int32_t begin) const;

  // Appends the request's next logit row to a batch whose backend picks the token: the
  // draw to batch.sampling (its random number taken now; temperature 0 when greedy) and
  // the penalty list to batch.penalty_rows and penalty_tokens (an empty range without
  // penalties). Then observe() the token the backend chose.
  void append_backend_row(ForwardBatch& batch);

 private:
  kernels::PenaltyToken& penalty_token(int32_t token);
  int32_t draw(const std::vector<float>& logits);
  // Gives the tokens held for min_tokens their own bias (or none) again.
  void release_held();

  // A token held for min_tokens: its place in penalty_tokens_, and its bias and flags
  // without the hold.
  struct Held {
    int32_t index;
    float bias;
    uint32_t flags;
  };

  scheduler::SamplingParams params_;
  std::mt19937_64 rng_;
  bool has_penalties_ = false;
  bool counts_output_ = false;  // a penalty reads the output counts
  std::vector<kernels::PenaltyToken> penalty_tokens_;
  std::unordered_map<int32_t, int32_t> penalty_index_;  // token -> its place in the list
  std::vector<Held> held_;                              // until min_tokens tokens have been chosen
  int32_t num_chosen_ = 0;
  std::vector<float> scratch_;
};

// log-softmax of `logits` into `out` (both [vocab]), in float32 with a double sum.
void log_softmax(std::span<const float> logits, std::vector<float>& out);

}  // namespace pagellm::engine
