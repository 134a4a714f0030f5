#include "engine/jinja_unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <optional>
#include <utility>

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

namespace {

// Cased (Unicode D135) is Lu, Ll and Lt, and Other_Lowercase and Other_Uppercase. Those
// two are mostly letters and symbols with case mappings; these ranges hold the rest
// (modifier letters like U+02B0, the ordinals U+00AA and U+00BA, squared letters).
constexpr char32_t kCasedWithoutMapping[][2] = {
    {0xAA, 0xAA},       {0xBA, 0xBA},       {0x2B0, 0x2B8},     {0x2C0, 0x2C1},
    {0x2E0, 0x2E4},     {0x37A, 0x37A},     {0x1D2C, 0x1D6A},   {0x1D78, 0x1D78},
    {0x1D9B, 0x1DBF},   {0x2071, 0x2071},   {0x207F, 0x207F},   {0x2090, 0x209C},
    {0x2C7C, 0x2C7D},   {0xA69C, 0xA69D},   {0xA770, 0xA770},   {0xA7F8, 0xA7F9},
    {0xAB5C, 0xAB5F},   {0x10780, 0x10780}, {0x10783, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189}};

bool is_letter_case(int category) {
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL ||
         category == UTF8PROC_CATEGORY_LT;
}

// Cased, for a code point outside Lu, Ll and Lt.
bool is_cased_other(char32_t c) {
  if (to_upper(c) != c || to_lower(c) != c) return true;
  for (const auto& r : kCasedWithoutMapping)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

bool is_squared_letter(char32_t c) {
  return c >= 0x1F130 && c <= 0x1F189;
}

int category_of(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

}  // namespace

bool is_cased(char32_t c) {
  return is_letter_case(category_of(c)) || is_cased_other(c);
}

// Lowercase and Uppercase (Ll and Lu, and Other_Lowercase and Other_Uppercase): outside
// the letter categories, a cased code point is uppercase when it has a lowercase mapping
// (circled letters) or is a squared letter, and lowercase otherwise.
bool is_lowercase(char32_t c) {
  const int category = category_of(c);
  if (is_letter_case(category)) return category == UTF8PROC_CATEGORY_LL;
  return is_cased_other(c) && !is_squared_letter(c) && to_lower(c) == c;
}
bool is_uppercase(char32_t c) {
  const int category = category_of(c);
  if (is_letter_case(category)) return category == UTF8PROC_CATEGORY_LU;
  return is_cased_other(c) && (is_squared_letter(c) || to_lower(c) != c);
}
bool is_titlecase(char32_t c) {
  return category_of(c) == UTF8PROC_CATEGORY_LT;
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

// Unicode's unconditional mappings of one code point to several (SpecialCasing.txt),
// which Python's str.upper(), title() and lower() apply and the one-to-one mappings of
// utf8proc leave out. Sorted by code point.
struct FullMapping {
  char32_t from;
  char32_t to[3];  // 0 past the end
};

constexpr FullMapping kFullUpper[] = {
    {0x00DF, {0x0053, 0x0053}},         {0x0149, {0x02BC, 0x004E}},
    {0x01F0, {0x004A, 0x030C}},         {0x0390, {0x0399, 0x0308, 0x0301}},
    {0x03B0, {0x03A5, 0x0308, 0x0301}}, {0x0587, {0x0535, 0x0552}},
    {0x1E96, {0x0048, 0x0331}},         {0x1E97, {0x0054, 0x0308}},
    {0x1E98, {0x0057, 0x030A}},         {0x1E99, {0x0059, 0x030A}},
    {0x1E9A, {0x0041, 0x02BE}},         {0x1F50, {0x03A5, 0x0313}},
    {0x1F52, {0x03A5, 0x0313, 0x0300}}, {0x1F54, {0x03A5, 0x0313, 0x0301}},
    {0x1F56, {0x03A5, 0x0313, 0x0342}}, {0x1F80, {0x1F08, 0x0399}},
    {0x1F81, {0x1F09, 0x0399}},         {0x1F82, {0x1F0A, 0x0399}},
    {0x1F83, {0x1F0B, 0x0399}},         {0x1F84, {0x1F0C, 0x0399}},
    {0x1F85, {0x1F0D, 0x0399}},         {0x1F86, {0x1F0E, 0x0399}},
    {0x1F87, {0x1F0F, 0x0399}},         {0x1F88, {0x1F08, 0x0399}},
    {0x1F89, {0x1F09, 0x0399}},         {0x1F8A, {0x1F0A, 0x0399}},
    {0x1F8B, {0x1F0B, 0x0399}},         {0x1F8C, {0x1F0C, 0x0399}},
    {0x1F8D, {0x1F0D, 0x0399}},         {0x1F8E, {0x1F0E, 0x0399}},
    {0x1F8F, {0x1F0F, 0x0399}},         {0x1F90, {0x1F28, 0x0399}},
    {0x1F91, {0x1F29, 0x0399}},         {0x1F92, {0x1F2A, 0x0399}},
    {0x1F93, {0x1F2B, 0x0399}},         {0x1F94, {0x1F2C, 0x0399}},
    {0x1F95, {0x1F2D, 0x0399}},         {0x1F96, {0x1F2E, 0x0399}},
    {0x1F97, {0x1F2F, 0x0399}},         {0x1F98, {0x1F28, 0x0399}},
    {0x1F99, {0x1F29, 0x0399}},         {0x1F9A, {0x1F2A, 0x0399}},
    {0x1F9B, {0x1F2B, 0x0399}},         {0x1F9C, {0x1F2C, 0x0399}},
    {0x1F9D, {0x1F2D, 0x0399}},         {0x1F9E, {0x1F2E, 0x0399}},
    {0x1F9F, {0x1F2F, 0x0399}},         {0x1FA0, {0x1F68, 0x0399}},
    {0x1FA1, {0x1F69, 0x0399}},         {0x1FA2, {0x1F6A, 0x0399}},
    {0x1FA3, {0x1F6B, 0x0399}},         {0x1FA4, {0x1F6C, 0x0399}},
    {0x1FA5, {0x1F6D, 0x0399}},         {0x1FA6, {0x1F6E, 0x0399}},
    {0x1FA7, {0x1F6F, 0x0399}},         {0x1FA8, {0x1F68, 0x0399}},
    {0x1FA9, {0x1F69, 0x0399}},         {0x1FAA, {0x1F6A, 0x0399}},
    {0x1FAB, {0x1F6B, 0x0399}},         {0x1FAC, {0x1F6C, 0x0399}},
    {0x1FAD, {0x1F6D, 0x0399}},         {0x1FAE, {0x1F6E, 0x0399}},
    {0x1FAF, {0x1F6F, 0x0399}},         {0x1FB2, {0x1FBA, 0x0399}},
    {0x1FB3, {0x0391, 0x0399}},         {0x1FB4, {0x0386, 0x0399}},
    {0x1FB6, {0x0391, 0x0342}},         {0x1FB7, {0x0391, 0x0342, 0x0399}},
    {0x1FBC, {0x0391, 0x0399}},         {0x1FC2, {0x1FCA, 0x0399}},
    {0x1FC3, {0x0397, 0x0399}},         {0x1FC4, {0x0389, 0x0399}},
    {0x1FC6, {0x0397, 0x0342}},         {0x1FC7, {0x0397, 0x0342, 0x0399}},
    {0x1FCC, {0x0397, 0x0399}},         {0x1FD2, {0x0399, 0x0308, 0x0300}},
    {0x1FD3, {0x0399, 0x0308, 0x0301}}, {0x1FD6, {0x0399, 0x0342}},
    {0x1FD7, {0x0399, 0x0308, 0x0342}}, {0x1FE2, {0x03A5, 0x0308, 0x0300}},
    {0x1FE3, {0x03A5, 0x0308, 0x0301}}, {0x1FE4, {0x03A1, 0x0313}},
    {0x1FE6, {0x03A5, 0x0342}},         {0x1FE7, {0x03A5, 0x0308, 0x0342}},
    {0x1FF2, {0x1FFA, 0x0399}},         {0x1FF3, {0x03A9, 0x0399}},
    {0x1FF4, {0x038F, 0x0399}},         {0x1FF6, {0x03A9, 0x0342}},
    {0x1FF7, {0x03A9, 0x0342, 0x0399}}, {0x1FFC, {0x03A9, 0x0399}},
    {0xFB00, {0x0046, 0x0046}},         {0xFB01, {0x0046, 0x0049}},
    {0xFB02, {0x0046, 0x004C}},         {0xFB03, {0x0046, 0x0046, 0x0049}},
    {0xFB04, {0x0046, 0x0046, 0x004C}}, {0xFB05, {0x0053, 0x0054}},
    {0xFB06, {0x0053, 0x0054}},         {0xFB13, {0x0544, 0x0546}},
    {0xFB14, {0x0544, 0x0535}},         {0xFB15, {0x0544, 0x053B}},
    {0xFB16, {0x054E, 0x0546}},         {0xFB17, {0x0544, 0x053D}},
};

constexpr FullMapping kFullTitle[] = {
    {0x00DF, {0x0053, 0x0073}},         {0x0149, {0x02BC, 0x004E}},
    {0x01F0, {0x004A, 0x030C}},         {0x0390, {0x0399, 0x0308, 0x0301}},
    {0x03B0, {0x03A5, 0x0308, 0x0301}}, {0x0587, {0x0535, 0x0582}},
    {0x1E96, {0x0048, 0x0331}},         {0x1E97, {0x0054, 0x0308}},
    {0x1E98, {0x0057, 0x030A}},         {0x1E99, {0x0059, 0x030A}},
    {0x1E9A, {0x0041, 0x02BE}},         {0x1F50, {0x03A5, 0x0313}},
    {0x1F52, {0x03A5, 0x0313, 0x0300}}, {0x1F54, {0x03A5, 0x0313, 0x0301}},
    {0x1F56, {0x03A5, 0x0313, 0x0342}}, {0x1FB2, {0x1FBA, 0x0345}},
    {0x1FB4, {0x0386, 0x0345}},         {0x1FB6, {0x0391, 0x0342}},
    {0x1FB7, {0x0391, 0x0342, 0x0345}}, {0x1FC2, {0x1FCA, 0x0345}},
    {0x1FC4, {0x0389, 0x0345}},         {0x1FC6, {0x0397, 0x0342}},
    {0x1FC7, {0x0397, 0x0342, 0x0345}}, {0x1FD2, {0x0399, 0x0308, 0x0300}},
    {0x1FD3, {0x0399, 0x0308, 0x0301}}, {0x1FD6, {0x0399, 0x0342}},
    {0x1FD7, {0x0399, 0x0308, 0x0342}}, {0x1FE2, {0x03A5, 0x0308, 0x0300}},
    {0x1FE3, {0x03A5, 0x0308, 0x0301}}, {0x1FE4, {0x03A1, 0x0313}},
    {0x1FE6, {0x03A5, 0x0342}},         {0x1FE7, {0x03A5, 0x0308, 0x0342}},
    {0x1FF2, {0x1FFA, 0x0345}},         {0x1FF4, {0x038F, 0x0345}},
    {0x1FF6, {0x03A9, 0x0342}},         {0x1FF7, {0x03A9, 0x0342, 0x0345}},
    {0xFB00, {0x0046, 0x0066}},         {0xFB01, {0x0046, 0x0069}},
    {0xFB02, {0x0046, 0x006C}},         {0xFB03, {0x0046, 0x0066, 0x0069}},
    {0xFB04, {0x0046, 0x0066, 0x006C}}, {0xFB05, {0x0053, 0x0074}},
    {0xFB06, {0x0053, 0x0074}},         {0xFB13, {0x0544, 0x0576}},
    {0xFB14, {0x0544, 0x0565}},         {0xFB15, {0x0544, 0x056B}},
    {0xFB16, {0x054E, 0x0576}},         {0xFB17, {0x0544, 0x056D}},
};

// U+0130 (capital I with dot above) is the one code point whose lowercase is two.
constexpr char32_t kCapitalIWithDot = 0x130, kCapitalSigma = 0x3A3;

void append_mapped(std::string& out, char32_t c, const FullMapping* begin, const FullMapping* end,
                   char32_t (*simple)(char32_t)) {
  const FullMapping* m =
      std::lower_bound(begin, end, c, [](const FullMapping& f, char32_t x) { return f.from < x; });
  if (m == end || m->from != c) {
    utf8_append(out, simple(c));
    return;
  }
  for (char32_t t : m->to)
    if (t != 0) utf8_append(out, t);
}

void append_upper(std::string& out, char32_t c) {
  append_mapped(out, c, std::begin(kFullUpper), std::end(kFullUpper), to_upper);
}

void append_title(std::string& out, char32_t c) {
  append_mapped(out, c, std::begin(kFullTitle), std::end(kFullTitle), [](char32_t x) {
    return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(x)));
  });
}

// Word_Break's MidLetter, MidNumLet and Single_Quote (apostrophes, dots, colons), sorted.
constexpr char32_t kWordInnerPunctuation[] = {0x0027, 0x002E, 0x003A, 0x00B7, 0x0387, 0x055F,
                                              0x05F4, 0x2018, 0x2019, 0x2024, 0x2027, 0xFE13,
                                              0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A};

// Case_Ignorable (Unicode D136): marks, format characters, modifier letters and symbols,
// and the punctuation that Word_Break counts as inside a word.
bool is_case_ignorable(char32_t c) {
  if (std::binary_search(std::begin(kWordInnerPunctuation), std::end(kWordInnerPunctuation), c))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return false;
  }
}

// Python's lowercase of text[i]: capital sigma becomes final sigma (U+03C2) after a
// cased letter and not before one, case-ignorable characters between them skipped.
void append_lower(std::string& out, std::u32string_view text, size_t i) {
  const char32_t c = text[i];
  if (c == kCapitalIWithDot) {
    utf8_append(out, 'i');
    utf8_append(out, 0x307);
    return;
  }
  if (c != kCapitalSigma) {
    utf8_append(out, to_lower(c));
    return;
  }
  const auto cased_beside = [&](ptrdiff_t j, ptrdiff_t step) {
    for (; j >= 0 && j < static_cast<ptrdiff_t>(text.size()); j += step)
      if (!is_case_ignorable(text[j])) return is_cased(text[j]);
    return false;
  };
  const auto at = static_cast<ptrdiff_t>(i);
  const bool final = cased_beside(at - 1, -1) && !cased_beside(at + 1, 1);
  utf8_append(out, final ? 0x3C2 : 0x3C3);
}

// The ASCII text's one-to-one mapping, or nullopt when the text is not ASCII.
std::optional<std::string> map_ascii(std::string_view text, char32_t (*map)(char32_t)) {
  for (unsigned char c : text)
    if (c >= 0x80) return std::nullopt;
  std::string out(text);
  for (char& c : out)
    c = static_cast<char>(map(static_cast<char32_t>(c)));
  return out;
}

}  // namespace

std::string str_upper(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text)
    append_upper(out, c);
  return out;
}
std::string str_upper(std::string_view text) {
  if (auto ascii = map_ascii(text, to_upper)) return std::move(*ascii);
  return str_upper(utf8_decode(text));
}

std::string str_lower(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    append_lower(out, text, i);
  return out;
}
std::string str_lower(std::string_view text) {
  if (auto ascii = map_ascii(text, to_lower)) return std::move(*ascii);
  return str_lower(utf8_decode(text));
}

std::string str_title(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const std::u32string u = utf8_decode(text);
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased) {
      append_lower(out, u, i);
    } else {
      append_title(out, u[i]);
    }
    previous_cased = is_cased(u[i]);
  }
  return out;
}

std::string str_capitalize(std::string_view text) {
  const std::u32string u = utf8_decode(text);
  if (u.empty()) return {};
  std::string out;
  out.reserve(text.size());
  append_title(out, u[0]);
  for (size_t i = 1; i < u.size(); ++i)
    append_lower(out, u, i);
  return out;
}

}  // namespace pagellm::engine::jinja
