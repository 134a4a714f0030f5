#pragma once
// How one request wants its tokens chosen and when it stops: the OpenAI parameters
// after validation, in one plain struct.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagellm::scheduler {

struct SamplingParams {
  // Choosing: a temperature below 1e-5, or top-k 1, is greedy; then top-k (0 = off),
  // top-p (1 = off) and min-p (0 = off) narrow the candidates before the draw.
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  // The same seed gives the same tokens; unset draws a fresh seed.
  std::optional<uint64_t> seed;

  // Penalties: repetition (Hugging Face/vLLM style, over prompt and output, 1 = off),
  // presence and frequency (OpenAI style, over output tokens, 0 = off).
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the logits of these token ids before anything else chooses (OpenAI's
  // logit_bias, -100 to 100).
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Log-probabilities: of each chosen token, and of the `top_logprobs` most likely.
  bool logprobs = false;
  int32_t top_logprobs = 0;

  // Stopping.
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (matched on the detokenized text)
  bool ignore_eos = false;
  // Tokens generated before a stop token id or end of sequence may be chosen (they are
  // held at -inf until then) or a stop string may end (one may begin in them, as in
  // vLLM); max_tokens still ends the text sooner.
  int32_t min_tokens = 0;
  // Whether the text keeps the stop string (or the stop token's text) that ended it.
  bool include_stop_str_in_output = false;
  int32_t n = 1;  // completions per prompt

  // Below 1e-5 (as vLLM has it) the temperature would only scale logits toward overflow.
  bool greedy() const { return temperature < 1e-5f || top_k == 1; }
};

}  // namespace pagellm::scheduler
