#pragma once
// Added tokens of tokenizer.json ("added_tokens"): strings such as <|eot_id|> that are
// cut out of the text before normalization and pre-tokenization and become one id
// each, whether special or not (Hugging Face's default, split_special_tokens=false).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer.h"

namespace pagellm::engine {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // also swallow whitespace on the left
  bool rstrip = false;       // ... and on the right
  bool single_word = false;  // only match when not inside a word
  bool normalized = false;   // matched in normalized text rather than raw text
};

// A piece of text, or an occurrence of added token `token` (an index into the list).
struct TextSegment {
  size_t start, end;
  int token = -1;
};

// Leftmost-longest matching of a set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what token i looks like in the text it is matched against; empty
  // patterns (tokens matched by the other matcher) are left out.
  void build(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return nodes_.size() <= 1; }

  // Covers `text` with text segments and token matches, in order.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;
  };
  int32_t child(int32_t node, unsigned char byte) const;
  // Longest token starting at `pos`: (index, end) or (-1, pos).
  std::pair<int, size_t> longest_at(std::string_view text, size_t pos) const;

  const std::vector<AddedToken>* tokens_ = nullptr;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace pagellm::engine
