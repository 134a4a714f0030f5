#pragma once
// One step's input to a backend's forward pass.

#include <cstdint>
#include <vector>

#include "kernels/penalties.h"

namespace pagellm::engine {

// A draw the backend makes itself for one logit row: engine/Sampler's draw when the
// request wants no logprobs (the kernels' sample_top_k_top_p, after apply_penalties).
struct RowSampling {
  float temperature = 0.0f;  // <= 0: this row is not sampled by the backend
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;  // the request's random draw for this token, in [0, 1)
};

// One step's work, flattened: the new tokens of every scheduled sequence, in order.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int64_t> slots;         // [num_tokens] KV slot of each new token
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> context_lens;  // [num_seqs] cached tokens after this step
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;  // token rows whose next-token logits are wanted
  // [logit_rows.size()] or empty: 1 where the row's logits must reach the host (its
  // sampler needs more than the argmax); empty means every row's.
  std::vector<uint8_t> host_logits;
  // [logit_rows.size()] or empty: rows to sample on the backend (temperature > 0).
  std::vector<RowSampling> sampling;
  // [logit_rows.size()] or empty: penalties and logit biases the backend applies to a
  // row's logits before its argmax and draw (the kernels' apply_penalties), over
  // penalty_tokens. Only rows whose logits stay on the backend have any: the logits the
  // host receives are the model's own.
  std::vector<kernels::PenaltyRow> penalty_rows;
  std::vector<kernels::PenaltyToken> penalty_tokens;
  std::vector<int32_t> copy_src;  // blocks to copy before the pass (copy-on-write)
  std::vector<int32_t> copy_dst;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
};

// What a forward pass returns, per logit row.
struct ForwardOutput {
  // [logit rows] the most likely token (first on ties), after the row's penalties
  std::vector<int32_t> argmax;
  // [logit rows] when ForwardBatch::sampling is given: the token drawn for each row it
  // samples (the others hold the argmax).
  std::vector<int32_t> sampled;
  // [logit rows, vocab]: the rows ForwardBatch::host_logits asks for hold the logits;
  // the others may hold anything.
  std::vector<float> logits;
};

}  // namespace pagellm::engine
