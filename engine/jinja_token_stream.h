#pragma once
// A cursor over the lexer's tokens with the lookahead and expect helpers shared by the
// statement and expression parsers.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/jinja_lexer.h"
#include "engine/jinja_value.h"

namespace pagellm::engine::jinja {

struct TokenStream {
  std::vector<Token> tokens;  // ends with a TokenType::End token
  size_t pos = 0;
};

class TokenCursor {
 protected:
  explicit TokenCursor(TokenStream& stream) : stream_(stream) {}

  const Token& cur() const { return stream_.tokens[stream_.pos]; }
  const Token& look(size_t ahead = 1) const {
    return stream_.tokens[std::min(stream_.pos + ahead, stream_.tokens.size() - 1)];
  }
  void advance() {
    if (stream_.pos + 1 < stream_.tokens.size()) ++stream_.pos;
  }
  Token next() {
    Token t = cur();
    advance();
    return t;
  }
  bool is_name(const char* v) const { return cur().type == TokenType::Name && cur().value == v; }
  bool is_op(const char* v) const { return cur().type == TokenType::Op && cur().value == v; }
  bool skip_name(const char* v) {
    if (!is_name(v)) return false;
    advance();
    return true;
  }
  bool skip_op(const char* v) {
    if (!is_op(v)) return false;
    advance();
    return true;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail("syntax error: expected " + expected + ", got " + describe(cur()), cur().line);
  }
  void expect_op(const char* v) {
    if (!skip_op(v)) unexpected(std::string("'") + v + "'");
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) unexpected("a name");
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) unexpected("'%}'");
    advance();
  }

 private:
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::Text:
        return "text";
      case TokenType::VarBegin:
        return "'{{'";
      case TokenType::VarEnd:
        return "'}}'";
      case TokenType::BlockBegin:
        return "'{%'";
      case TokenType::BlockEnd:
        return "'%}'";
      case TokenType::End:
        return "end of template";
      case TokenType::String:
        return "string literal";
      default:
        return "'" + t.value + "'";
    }
  }

  TokenStream& stream_;
};

}  // namespace pagellm::engine::jinja
