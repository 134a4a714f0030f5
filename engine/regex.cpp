#include "engine/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>

#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

// Unicode White_Space, as PCRE2 class contents.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// The code points Unicode 16 (the Oniguruma of Hugging Face's tokenizers) assigns that
// Unicode 14 (Debian 12's PCRE2) does not, each with a stand-in PCRE2 knows, of the same
// general category and UTF-8 length.
struct Addition {
  char32_t first, last, stand_in;
};
constexpr Addition kAdditions[] = {
#include "engine/unicode_additions.inc"
};

// Which blocks of 256 code points hold an addition: most text never looks further.
const std::array<bool, 0x1100>& blocks_with_additions() {
  static const std::array<bool, 0x1100> blocks = [] {
    std::array<bool, 0x1100> b{};
    for (const Addition& a : kAdditions) {
      for (char32_t block = a.first >> 8; block <= a.last >> 8; ++block)
        b[block] = true;
    }
    return b;
  }();
  return blocks;
}

}  // namespace

char32_t pcre2_stand_in(char32_t c) {
  const auto* a = std::upper_bound(std::begin(kAdditions), std::end(kAdditions), c,
                                   [](char32_t x, const Addition& r) { return x < r.first; });
  if (a == std::begin(kAdditions) || c > (--a)->last) return c;
  return a->stand_in;
}

namespace {

// Puts in `shadow` a copy of `text` with the stand-ins in place of the additions, and
// says whether there were any. Same length, same offsets: the matches on the copy are
// those Unicode 16 gives on the text.
bool with_stand_ins(std::string_view text, std::string& shadow) {
  const auto& blocks = blocks_with_additions();
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  bool any = false;
  for (size_t i = 0; i < text.size();) {
    // Every addition takes 3 or 4 bytes, so starts with a byte from 0xE0 up, which is
    // always a lead byte: skip the rest 32 at a time (a loop the compiler vectorizes).
    if (bytes[i] < 0xE0) {
      ++i;
      while (i + 32 <= text.size()) {
        bool lead = false;
        for (size_t k = 0; k < 32; ++k)
          lead |= bytes[i + k] >= 0xE0;
        if (lead) break;
        i += 32;
      }
      while (i < text.size() && bytes[i] < 0xE0)
        ++i;
      continue;
    }
    size_t pos = i;
    const char32_t c = utf8::next_codepoint(text, pos);
    if (c < 0x110000 && blocks[c >> 8]) {
      const char32_t stand_in = pcre2_stand_in(c);
      if (stand_in != c) {
        if (!any) shadow.assign(text);
        any = true;
        std::string encoded;
        utf8::append_codepoint(encoded, stand_in);
        shadow.replace(i, encoded.size(), encoded);
      }
    }
    i = pos;
  }
  return any;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string translate_oniguruma_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
        ++i;
        continue;
      }
      if (next == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpace;
        out += ']';
        ++i;
        continue;
      }
      out += c;
      out += next;
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern) : impl_(std::make_unique<Impl>()) {
  const std::string translated = translate_oniguruma_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    throw RegexError("invalid regex '" + std::string(pattern) + "': " + pcre2_message(error) +
                     " at offset " + std::to_string(offset));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  std::string shadow;
  if (with_stand_ins(text, shadow)) text = shadow;
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  if (data == nullptr) throw RegexError("out of memory creating regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Deep backtracking on huge inputs: the interpreter keeps its frames on the heap.
      rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(data);
      throw RegexError("regex match failed: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    const size_t start = ov[0], end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      pos = end;
    } else {
      // Empty match: step over one character, as Hugging Face's iterator does.
      if (start >= text.size()) break;
      pos = start + utf8::char_length(static_cast<unsigned char>(text[start]));
    }
  }
  pcre2_match_data_free(data);
}

}  // namespace pagellm::engine
