#include "engine/tokenizer_json.h"

#include <charconv>

#include "engine/tokenizer.h"
#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

// A small recursive-descent JSON reader. nlohmann's parser (even through SAX) needs
// ~150 ms for Llama 3's 9 MB file; this one copies strings once and streams the
// vocabulary and merges into flat vectors, building a DOM only for the rest.
class Reader {
 public:
  Reader(std::string_view text, TokenizerJson& out) : text_(text), out_(out) {}

  void parse_document() {
    skip_ws();
    if (peek() != '{') fail("expected a JSON object at the top level");
    ++pos_;
    out_.doc = json::object();
    parse_members([&](std::string&& key) {
      if (key == "model") {
        parse_model(out_.doc["model"]);
      } else {
        parse_value(out_.doc[key], 1);
      }
    });
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected data after the top-level object");
  }

 private:
  static constexpr int kMaxDepth = 256;

  [[noreturn]] void fail(const std::string& what) const {
    const std::string where = pos_ >= text_.size() ? "at the end of the file (truncated?)"
                                                   : "at byte " + std::to_string(pos_);
    throw TokenizerError("not valid JSON " + where + ": " + what);
  }
  [[noreturn]] void fail_field(const std::string& field, const std::string& what) const {
    throw TokenizerError("field '" + field + "': " + what);
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
      ++pos_;
    }
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  // Calls on_key(key) for each member of an object whose '{' was consumed; on_key
  // parses the value.
  template <typename OnKey>
  void parse_members(OnKey&& on_key) {
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      expect(':');
      on_key(std::move(key));
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') {
        --pos_;
        fail("expected ',' or '}'");
      }
    }
  }
  template <typename OnItem>
  void parse_items(OnItem&& on_item) {
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      on_item();
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == ']') return;
      if (c != ',') {
        --pos_;
        fail("expected ',' or ']'");
      }
    }
  }

  void parse_model(json& model) {
    skip_ws();
    if (peek() != '{') {
      parse_value(model, 1);
      return;
    }
    ++pos_;
    model = json::object();
    parse_members([&](std::string&& key) {
      if (key == "vocab") {
        parse_vocab();
      } else if (key == "merges") {
        parse_merges();
      } else {
        parse_value(model[key], 2);
      }
    });
  }

  void parse_vocab() {
    expect('{');
    out_.has_vocab = true;
    out_.vocab.reserve(1 << 17);
    parse_members([&](std::string&& key) {
      skip_ws();
      const size_t start = pos_;
      if (peek() == '-') ++pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')
        ++pos_;
      int64_t id = 0;
      const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, id);
      if (ec != std::errc() || pos_ == start ||
          (pos_ < text_.size() &&
           (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))) {
        fail_field("model.vocab", "the id of '" + key + "' is not an integer");
      }
      out_.vocab.emplace_back(std::move(key), id);
    });
  }

  void parse_merges() {
    expect('[');
    out_.has_merges = true;
    out_.merges.reserve(1 << 18);
    parse_items([&] {
      skip_ws();
      const std::string field = "model.merges[" + std::to_string(out_.merges.size()) + "]";
      if (peek() == '"') {
        std::string merge = parse_string();
        const size_t space = merge.find(' ');
        if (space == std::string::npos) fail_field(field, "expected \"a b\" with a space");
        out_.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
      } else if (peek() == '[') {
        ++pos_;
        std::vector<std::string> parts;
        parse_items([&] {
          skip_ws();
          if (peek() != '"') fail_field(field, "a pair must hold two strings");
          parts.push_back(parse_string());
        });
        if (parts.size() != 2) fail_field(field, "a pair must hold exactly two strings");
        out_.merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
      } else {
        fail_field(field, "expected \"a b\" or [\"a\", \"b\"]");
      }
    });
  }

  void parse_value(json& out, int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    skip_ws();
    const char c = peek();
    if (c == '{') {
      ++pos_;
      out = json::object();
      parse_members([&](std::string&& key) { parse_value(out[key], depth + 1); });
    } else if (c == '[') {
      ++pos_;
      out = json::array();
      parse_items([&] {
        out.push_back(nullptr);
        parse_value(out.back(), depth + 1);
      });
    } else if (c == '"') {
      out = parse_string();
    } else if (c == 't' && text_.substr(pos_, 4) == "true") {
      pos_ += 4;
      out = true;
    } else if (c == 'f' && text_.substr(pos_, 5) == "false") {
      pos_ += 5;
      out = false;
    } else if (c == 'n' && text_.substr(pos_, 4) == "null") {
      pos_ += 4;
      out = nullptr;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      out = parse_number();
    } else {
      fail("expected a value");
    }
  }

  json parse_number() {
    const size_t start = pos_;
    bool is_float = false;
    if (peek() == '-') ++pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (!is_float) {
      int64_t value = 0;
      if (auto [end, ec] = std::from_chars(first, last, value); ec == std::errc() && end == last) {
        return value;
      }
    }
    double value = 0;
    if (auto [end, ec] = std::from_chars(first, last, value); ec == std::errc() && end == last) {
      return value;
    }
    pos_ = start;
    fail("malformed number");
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else {
        fail("bad \\u escape");
      }
    }
    return value;
  }

  // At the opening quote.
  std::string parse_string() {
    ++pos_;
    std::string out;
    while (true) {
      size_t run = pos_;
      while (run < text_.size()) {
        const unsigned char c = static_cast<unsigned char>(text_[run]);
        if (c == '"' || c == '\\' || c < 0x20) break;
        ++run;
      }
      out.append(text_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        --pos_;
        fail("control character in a string");
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          char32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t mark = pos_;
            pos_ += 2;
            const unsigned low = parse_hex4();
            if (low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = mark;
            }
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // a lone surrogate
          utf8::append_codepoint(out, cp);
          break;
        }
        default:
          --pos_;
          fail("bad escape in a string");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  TokenizerJson& out_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& origin) {
  if (!utf8::is_valid(text)) throw TokenizerError(origin + ": not valid UTF-8");
  TokenizerJson out;
  try {
    Reader(text, out).parse_document();
  } catch (const TokenizerError& e) {
    throw TokenizerError(origin + ": " + e.what());
  }
  return out;
}

namespace {
std::string join_path(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + "." + key;
}
}  // namespace

void SpecReader::fail(const std::string& where, const std::string& what) const {
  throw TokenizerError(origin_ + ": field '" + where + "': " + what);
}

const json& SpecReader::require(const json& object, const std::string& where,
                                const char* key) const {
  if (!object.is_object()) fail(where, "expected an object");
  auto it = object.find(key);
  if (it == object.end()) fail(join_path(where, key), "missing");
  return *it;
}

std::string SpecReader::string_field(const json& object, const std::string& where,
                                     const char* key) const {
  const json& value = require(object, where, key);
  if (!value.is_string()) fail(join_path(where, key), "expected a string");
  return value.get<std::string>();
}

std::string SpecReader::string_or(const json& object, const std::string& where, const char* key,
                                  const std::string& fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(join_path(where, key), "expected a string");
  return it->get<std::string>();
}

bool SpecReader::bool_or(const json& object, const std::string& where, const char* key,
                         bool fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(join_path(where, key), "expected a boolean");
  return it->get<bool>();
}

int64_t SpecReader::int_or(const json& object, const std::string& where, const char* key,
                           int64_t fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail(join_path(where, key), "expected an integer");
  return it->get<int64_t>();
}

std::string SpecReader::type_of(const json& object, const std::string& where) const {
  return string_field(object, where, "type");
}

}  // namespace pagellm::engine
