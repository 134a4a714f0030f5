#include "engine/jinja_unicode.h"

#include <utf8proc.h>

#include "engine/utf8.h"

namespace pagellm::engine::jinja {

std::u32string utf8_decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t pos = 0;
  const auto size = static_cast<utf8proc_ssize_t>(text.size());
  while (pos < size) {
    utf8proc_int32_t c = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(bytes + pos, size - pos, &c);
    if (n <= 0) {
      out.push_back(0xFFFD);
      pos += 1;
    } else {
      out.push_back(static_cast<char32_t>(c));
      pos += n;
    }
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text)
    utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text)
    n += (c & 0xC0) != 0x80;
  return n;
}

bool is_python_space(char32_t c) {
  // str.isspace() is Unicode White_Space plus the four information separators.
  return utf8::is_whitespace(c) || (c >= 0x1C && c <= 0x1F);
}

bool is_python_printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
bool is_cased(char32_t c) {
  return to_upper(c) != c || to_lower(c) != c;
}

bool is_alpha(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_digit(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

namespace {
template <typename Map>
std::string map_chars(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  bool ascii = true;
  for (unsigned char c : text)
    ascii = ascii && c < 0x80;
  if (ascii) {
    for (char c : text)
      out.push_back(static_cast<char>(map(static_cast<char32_t>(c))));
    return out;
  }
  for (char32_t c : utf8_decode(text))
    utf8_append(out, map(c));
  return out;
}
}  // namespace

std::string str_upper(std::string_view text) {
  return map_chars(text, to_upper);
}
std::string str_lower(std::string_view text) {
  return map_chars(text, to_lower);
}

}  // namespace pagellm::engine::jinja
