#include "engine/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "engine/jinja_unicode.h"
#include "engine/jinja_value.h"

namespace pagellm::engine::jinja {
namespace {

// Bytes of the last code point of `text` starting at or before `end`.
size_t last_code_point_start(const std::string& text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
    --start;
  return start;
}

// Python's `\s`: Unicode whitespace.
size_t space_length_at(const std::string& text, size_t pos) {
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c < 0x80) return is_python_space(c) ? 1 : 0;
  size_t len = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : 2;
  len = std::min(len, text.size() - pos);
  const std::u32string cp = utf8_decode(std::string_view(text).substr(pos, len));
  return (!cp.empty() && is_python_space(cp[0])) ? len : 0;
}

size_t skip_spaces(const std::string& text, size_t pos) {
  while (pos < text.size()) {
    const size_t n = space_length_at(text, pos);
    if (n == 0) break;
    pos += n;
  }
  return pos;
}

// Length of `text` without its trailing whitespace.
size_t rstrip_length(const std::string& text, size_t begin, size_t end) {
  while (end > begin) {
    const size_t start = std::max(begin, last_code_point_start(text, end));
    if (space_length_at(text, start) != end - start) break;
    end = start;
  }
  return end;
}

bool only_spaces(const std::string& text, size_t begin, size_t end) {
  return skip_spaces(text.substr(0, end), begin) == end;
}

std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_unescaped(std::string& out, const std::string& body, int line) {
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t digits) {
      const std::string h = body.substr(i + 1, digits);
      if (h.size() != digits ||
          h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        fail("truncated \\x, \\u or \\U escape in string literal", line);
      }
      i += digits;
      utf8_append(out, static_cast<char32_t>(std::stoul(h, nullptr, 16)));
    };
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (e >= '0' && e <= '7') {
          int value = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            value = value * 8 + (body[++i] - '0');
          }
          utf8_append(out, static_cast<char32_t>(value));
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
}

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit_char(char c) {
  return c >= '0' && c <= '9';
}

// Digits with single '_' separators, as Python number literals allow.
size_t scan_digits(const std::string& s, size_t pos) {
  if (pos >= s.size() || !is_digit_char(s[pos])) return pos;
  ++pos;
  while (pos < s.size()) {
    if (is_digit_char(s[pos])) {
      ++pos;
    } else if (s[pos] == '_' && pos + 1 < s.size() && is_digit_char(s[pos + 1])) {
      pos += 2;
    } else {
      break;
    }
  }
  return pos;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size())
      lex_root();
    tokens_.push_back(Token{TokenType::End, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit(TokenType type, std::string value, int line) {
    tokens_.push_back(Token{type, std::move(value), line});
  }

  void advance_to(size_t pos) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
    pos_ = pos;
  }

  // Text before a tag, after the tag's `-` or lstrip_blocks rule.
  void emit_text(size_t begin, size_t end, char sign, bool lstrip_applies) {
    const bool line_starting = begin == 0 || src_[begin - 1] == '\n';
    if (sign == '-') {
      end = rstrip_length(src_, begin, end);
    } else if (sign != '+' && lstrip_applies) {
      const size_t nl = src_.rfind('\n', end == 0 ? 0 : end - 1);
      const size_t l_pos = (nl == std::string::npos || nl < begin) ? begin : nl + 1;
      if ((l_pos > begin || line_starting) && l_pos < end && only_spaces(src_, l_pos, end)) {
        end = l_pos;
      }
    }
    if (end > begin) emit(TokenType::Text, src_.substr(begin, end - begin), line_);
  }

  // After `%}` or `#}`: `-` strips all following whitespace, trim_blocks one newline.
  size_t after_tag_end(size_t pos, char sign) {
    if (sign == '-') return skip_spaces(src_, pos);
    if (sign != '+' && pos < src_.size() && src_[pos] == '\n') return pos + 1;
    return pos;
  }

  void lex_root() {
    size_t tag = pos_;
    while (true) {
      tag = src_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        emit(TokenType::Text, src_.substr(pos_), line_);
        advance_to(src_.size());
        return;
      }
      const char kind = src_[tag + 1];
      if (kind == '{' || kind == '%' || kind == '#') break;
      ++tag;
    }
    const char kind = src_[tag + 1];
    const char sign = (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+'))
                          ? src_[tag + 2]
                          : '\0';
    emit_text(pos_, tag, sign, kind != '{');
    advance_to(tag);
    const size_t inner = tag + 2 + (sign ? 1 : 0);
    if (kind == '#') return lex_comment(inner);
    if (kind == '%' && lex_raw(inner)) return;
    const int line = line_;
    emit(kind == '%' ? TokenType::BlockBegin : TokenType::VarBegin, "", line);
    advance_to(inner);
    lex_tag(kind == '%');
  }

  void lex_comment(size_t pos) {
    const int line = line_;
    for (size_t j = pos; j + 1 < src_.size(); ++j) {
      if ((src_[j] == '-' || src_[j] == '+') && src_.compare(j + 1, 2, "#}") == 0) {
        advance_to(after_tag_end(j + 3, src_[j]));
        return;
      }
      if (src_.compare(j, 2, "#}") == 0) {
        advance_to(after_tag_end(j + 2, '\0'));
        return;
      }
    }
    fail("missing end of comment tag", line);
  }

  // `{% raw %}...{% endraw %}`: the content is text, tags inside it are not parsed.
  bool lex_raw(size_t pos) {
    size_t p = skip_spaces(src_, pos);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) {
      return false;
    }
    p = skip_spaces(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      p = skip_spaces(src_, p + 3);
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    const int line = line_;
    for (size_t j = p; j + 1 < src_.size(); ++j) {
      if (src_.compare(j, 2, "{%") != 0) continue;
      const char sign = (src_[j + 2] == '-' || src_[j + 2] == '+') ? src_[j + 2] : '\0';
      size_t q = skip_spaces(src_, j + 2 + (sign ? 1 : 0));
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_spaces(src_, q + 6);
      char end_sign = '\0';
      if (src_[q] == '-' || src_[q] == '+') end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      advance_to(p);
      emit_text(p, j, sign, true);
      advance_to(after_tag_end(q + 2, end_sign));
      return true;
    }
    fail("missing end of raw directive", line);
  }

  bool at_tag_end(bool block, std::vector<char>& balance) {
    if (!balance.empty()) return false;
    if (block) {
      if (src_.compare(pos_, 3, "+%}") == 0 || src_.compare(pos_, 3, "-%}") == 0 ||
          src_.compare(pos_, 2, "%}") == 0) {
        const char sign = src_[pos_] == '%' ? '\0' : src_[pos_];
        emit(TokenType::BlockEnd, "", line_);
        advance_to(after_tag_end(pos_ + (sign ? 3 : 2), sign));
        return true;
      }
      return false;
    }
    if (src_.compare(pos_, 3, "-}}") == 0) {
      emit(TokenType::VarEnd, "", line_);
      advance_to(skip_spaces(src_, pos_ + 3));
      return true;
    }
    if (src_.compare(pos_, 2, "}}") == 0) {
      emit(TokenType::VarEnd, "", line_);
      advance_to(pos_ + 2);
      return true;
    }
    return false;
  }

  void lex_tag(bool block) {
    const int start_line = line_;
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size()) {
        fail(std::string("unexpected end of template, missing '") + (block ? "%}" : "}}") + "'",
             start_line);
      }
      if (at_tag_end(block, balance)) return;
      const size_t space_end = skip_spaces(src_, pos_);
      if (space_end != pos_) {
        advance_to(space_end);
        continue;
      }
      const char c = src_[pos_];
      if (is_digit_char(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t end = pos_ + 1;
        while (end < src_.size() && is_name_char(src_[end]))
          ++end;
        emit(TokenType::Name, src_.substr(pos_, end - pos_), line_);
        advance_to(end);
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(balance);
      }
    }
  }

  void lex_number() {
    size_t end = scan_digits(src_, pos_);
    bool is_float = false;
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot) {
      size_t p = end;
      if (p + 1 < src_.size() && src_[p] == '.' && is_digit_char(src_[p + 1])) {
        p = scan_digits(src_, p + 1);
        is_float = true;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        const size_t exp_end = scan_digits(src_, q);
        if (exp_end > q) {
          p = exp_end;
          is_float = true;
        }
      }
      if (is_float) end = p;
    }
    std::string text = src_.substr(pos_, end - pos_);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token token{is_float ? TokenType::Float : TokenType::Int, text, line_};
    if (is_float) {
      token.float_value = std::stod(text);
    } else {
      try {
        token.int_value = std::stoll(text);
      } catch (const std::out_of_range&) {
        fail("integer literal " + text + " is too large", line_);
      }
    }
    tokens_.push_back(std::move(token));
    advance_to(end);
  }

  void lex_string() {
    const char quote = src_[pos_];
    size_t j = pos_ + 1;
    while (j < src_.size() && src_[j] != quote)
      j += (src_[j] == '\\') ? 2 : 1;
    if (j >= src_.size()) fail("unterminated string literal", line_);
    std::string value;
    append_unescaped(value, src_.substr(pos_ + 1, j - pos_ - 1), line_);
    emit(TokenType::String, std::move(value), line_);
    advance_to(j + 1);
  }

  void lex_operator(std::vector<char>& balance) {
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos_, 2, op) == 0) {
        emit(TokenType::Op, op, line_);
        advance_to(pos_ + 2);
        return;
      }
    }
    const char c = src_[pos_];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr) {
      fail(std::string("unexpected character '") + c + "'", line_);
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(std::string("unexpected '") + c + "'", line_);
      if (balance.back() != c) {
        fail(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", line_);
      }
      balance.pop_back();
    }
    emit(TokenType::Op, std::string(1, c), line_);
    advance_to(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace pagellm::engine::jinja
