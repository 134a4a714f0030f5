#pragma once
// The tokenizer of demo models: byte-level BPE in the style of GPT-2 and Llama 3. The
// 256 byte tokens come first (id = byte value), then merges learned by a small,
// deterministic BPE training over the built-in English text, then the special tokens.
// The result depends only on the vocabulary size.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pagellm::engine {

// In id order after the learned tokens; the last ids of the vocabulary.
inline constexpr std::array<const char*, 5> kDemoSpecialTokens = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"};

struct DemoVocabulary {
  std::vector<std::string> tokens;  // model vocabulary in id order, as raw bytes
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, by rank
  int64_t vocab_size = 0;                                   // tokens plus special tokens

  int64_t special_id(size_t index) const {  // index into kDemoSpecialTokens
    return static_cast<int64_t>(tokens.size() + index);
  }
  int64_t bos_id() const { return special_id(0); }
  int64_t end_of_text_id() const { return special_id(1); }
  int64_t im_start_id() const { return special_id(2); }
  int64_t im_end_id() const { return special_id(3); }
  int64_t pad_id() const { return special_id(4); }
};

// Learns merges until the vocabulary holds exactly `vocab_size` ids. Throws
// std::invalid_argument when vocab_size is below 256 + the special tokens or too large
// for the built-in text (over 262144).
DemoVocabulary train_demo_vocabulary(int64_t vocab_size);

// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for
// code points from U+0100 on. Returns the UTF-8 of the mapped string.
std::string byte_level_encode(const std::string& bytes);

// tokenizer.json and tokenizer_config.json texts (a ChatML chat template; BOS
// <|begin_of_text|>, EOS <|im_end|>).
std::string demo_tokenizer_json(const DemoVocabulary& vocab);
std::string demo_tokenizer_config_json(const DemoVocabulary& vocab, int64_t model_max_length);

}  // namespace pagellm::engine
