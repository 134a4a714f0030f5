#pragma once
// What apply_penalties (kernels/cpu and kernels/cuda) reads: a request's repetition,
// presence and frequency penalties and its logit_bias, as one list of the tokens they
// touch per logit row. The engine fills these on the host and the CUDA backend copies
// them to the device as they are, so both twins read the same bytes.

#include <cstdint>

namespace pagellm::kernels {

inline constexpr uint32_t kPenaltyHasBias = 1;   // PenaltyToken::bias applies
inline constexpr uint32_t kPenaltyInPrompt = 2;  // the prompt holds the token

// One token of a row's list; a row lists each token at most once.
struct PenaltyToken {
  int32_t token;         // outside [0, vocab): ignored
  int32_t output_count;  // times the output holds it so far
  float bias;            // logit_bias, with kPenaltyHasBias
  uint32_t flags;        // kPenaltyHasBias | kPenaltyInPrompt
};

// One logit row's penalties: its tokens are PenaltyToken[begin, end).
struct PenaltyRow {
  int32_t begin = 0;
  int32_t end = 0;
  float repetition = 1.0f;  // 1: none
  float presence = 0.0f;
  float frequency = 0.0f;
};

}  // namespace pagellm::kernels
