#pragma once
// Pre-tokenizers of tokenizer.json (Split, ByteLevel, Metaspace, Sequence): they cut a
// normalized piece of text into the words the model encodes one by one.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer_json.h"

namespace pagellm::engine {

struct PreToken {
  std::string text;
  bool at_origin;  // starts at byte 0 of the original input (Metaspace "first" needs it)
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// Null `spec` gives nullptr. Throws TokenizerError for unknown or malformed ones.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& where,
                                                 const SpecReader& reader);

}  // namespace pagellm::engine
