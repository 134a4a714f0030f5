#pragma once
// The loaded pipeline behind Tokenizer, shared with the incremental detokenizer.

#include <memory>
#include <string>
#include <vector>

#include "engine/added_vocabulary.h"
#include "engine/bpe.h"
#include "engine/normalizer.h"
#include "engine/pretokenizer.h"
#include "engine/token_decoder.h"
#include "engine/tokenizer.h"

namespace pagellm::engine {

struct Tokenizer::Impl {
  std::string origin;  // the tokenizer.json path, for messages
  std::vector<AddedToken> added;
  std::vector<int32_t> added_index;      // id -> index into `added`, -1 for model tokens
  AddedTokenMatcher raw_matcher;         // tokens with normalized=false, on raw text
  AddedTokenMatcher normalized_matcher;  // tokens with normalized=true, after normalizing
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  TokenDecoder decoder;
  std::vector<TokenId> prefix, suffix;  // what add_special_tokens puts around the ids
  std::optional<TokenId> bos, eos;
  bool cleanup = false;
  size_t vocab_size = 0;

  // The token's string (added content first, as Hugging Face looks it up), or null.
  const std::string* token_string(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= added_index.size()) return nullptr;
    if (added_index[id] >= 0) return &added[added_index[id]].content;
    return model->id_to_token(id);
  }
  bool is_special(TokenId id) const {
    return id >= 0 && static_cast<size_t>(id) < added_index.size() && added_index[id] >= 0 &&
           added[added_index[id]].special;
  }

  // Normalized, pre-tokenized and BPE-encoded text with no added tokens in it.
  void encode_text(std::string text, bool at_origin, std::vector<TokenId>& out) const;
};

}  // namespace pagellm::engine
