#pragma once
// The decoder of tokenizer.json (ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
// Strip, Sequence): token strings back to text, step by step as Hugging Face's
// decode_chain does it, then joined.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/normalizer.h"
#include "engine/tokenizer_json.h"

namespace pagellm::engine {

struct DecoderStep {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  // kMetaspace: `content` is the replacement character, `strip_first` whether the
  // first token loses it (any prepend scheme but "never").
  // kReplace: `pattern` -> `content`. kStrip: `content` is the character, start/stop.
  Pattern pattern;
  std::string content;
  bool strip_first = false;
  size_t start = 0, stop = 0;
};

class TokenDecoder {
 public:
  TokenDecoder() = default;  // no decoder: tokens are joined with spaces
  TokenDecoder(const nlohmann::json& spec, const std::string& where, const SpecReader& reader);

  std::string decode(std::vector<std::string> tokens) const;

  bool present() const { return present_; }
  const std::vector<DecoderStep>& steps() const { return steps_; }

 private:
  void add(const nlohmann::json& spec, const std::string& where, const SpecReader& reader);

  bool present_ = false;
  std::vector<DecoderStep> steps_;  // Sequences flattened
};

// A byte fallback token "<0xNN>": its byte, or -1.
int byte_fallback_value(std::string_view token);

// Strip decoder on one string: up to `start` leading and `stop` trailing `content`.
std::string strip_chars(const std::string& text, const std::string& content, size_t start,
                        size_t stop);

// Metaspace decoder on one token.
std::string metaspace_token(const std::string& token, const std::string& replacement, bool first);

// transformers' clean_up_tokenization: spaces before punctuation and contractions.
std::string clean_up_tokenization(std::string text);

// The replacements clean_up_tokenization applies, in order.
inline constexpr std::pair<std::string_view, std::string_view> kCleanupReplacements[] = {
    {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

}  // namespace pagellm::engine
