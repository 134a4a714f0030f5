#pragma once
// Streaming detokenization for one request: feed generated token ids one at a time and
// get back the text they complete. Every character is returned exactly once, and never
// as a broken UTF-8 sequence: a byte token ending mid-character waits for the rest.
// Bytes that can never form a character come out as U+FFFD, as in the full decode.
//
// The work per token is proportional to that token, not to the sequence: the decoder
// of tokenizer.json is compiled into per-token steps plus small streaming stages for
// what applies to the joined text (Strip, Replace, cleanup of tokenization spaces).
// Concatenating everything add() and finish() return equals Tokenizer::decode of the
// same ids, with one documented exception: a run of <0xNN> byte-fallback tokens that
// mixes valid characters with invalid bytes. Hugging Face turns the whole run into
// U+FFFDs; here the characters already streamed stay and only the invalid bytes
// become U+FFFD. Decoders outside the supported shapes fall back to re-decoding the
// sequence on each token (correct, but not cheap).

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/tokenizer.h"

namespace pagellm::engine {

struct DetokenizeOptions {
  bool skip_special_tokens = false;
  std::optional<bool> clean_up_tokenization_spaces;  // unset: the tokenizer's default
};

class IncrementalDetokenizer {
 public:
  // `context` ids (for example the end of the prompt) are decoded silently first, so
  // that the generated text starts as it would inside the whole sequence (SentencePiece
  // decoders drop the leading space of the very first token only).
  IncrementalDetokenizer(const Tokenizer& tokenizer, DetokenizeOptions options = {},
                         std::span<const TokenId> context = {});
  ~IncrementalDetokenizer();
  IncrementalDetokenizer(IncrementalDetokenizer&&) noexcept;
  IncrementalDetokenizer& operator=(IncrementalDetokenizer&&) noexcept;

  // The text completed by `id` (often empty while a character is still incomplete).
  std::string add(TokenId id);
  std::string add(std::span<const TokenId> ids);
  // The end of the sequence: flushes held-back text; incomplete bytes become U+FFFD.
  // Afterwards the object accepts no more tokens.
  std::string finish();

  // The bytes token `id` adds to a text after its first token, on its own: what logprobs
  // report for it. A SentencePiece word keeps its leading space, and a token holding part
  // of a character gives only those bytes (not valid UTF-8 alone). For the rare decoders
  // that cannot be streamed token by token (see the .cpp), the token decoded alone.
  // Changes no state.
  std::string token_bytes(TokenId id) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagellm::engine
