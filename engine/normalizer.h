#pragma once
// Normalizers of tokenizer.json (NFC and friends, Prepend, Replace, Lowercase, Strip,
// Sequence). They rewrite a piece of text in place.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/tokenizer_json.h"

namespace pagellm::engine {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Null `spec` gives nullptr. Throws TokenizerError for unknown or malformed normalizers.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where,
                                            const SpecReader& reader);

// Shared with the Replace decoder: a literal or regex pattern from tokenizer.json.
class Regex;
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;  // set for {"Regex": ...}
};
Pattern make_pattern(const nlohmann::json& spec, const std::string& where,
                     const SpecReader& reader);
std::string replace_all(const std::string& text, const Pattern& pattern,
                        const std::string& content);

}  // namespace pagellm::engine
