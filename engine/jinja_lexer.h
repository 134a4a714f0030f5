#pragma once
// Splits a template into tokens the way jinja2's lexer does with trim_blocks,
// lstrip_blocks and keep_trailing_newline=False: text between tags (already stripped
// by the whitespace-control rules), tag delimiters, and expression tokens inside tags.

#include <cstdint>
#include <string>
#include <vector>

namespace pagellm::engine::jinja {

enum class TokenType {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  End
};

struct Token {
  TokenType type;
  std::string value;  // text, name, operator, or the unescaped string literal
  int line = 0;
  int64_t int_value = 0;
  double float_value = 0;
};

std::vector<Token> tokenize(const std::string& source);

}  // namespace pagellm::engine::jinja
