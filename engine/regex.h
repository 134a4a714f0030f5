#pragma once
// A compiled Unicode regular expression (PCRE2 with its JIT, UTF and UCP modes),
// used for the Split pre-tokenizer and regex Replace steps of tokenizer.json.
// Patterns are written for Oniguruma, which Hugging Face uses; `\s` is rewritten to
// Oniguruma's set (the Unicode White_Space property), which is narrower than PCRE2's.
// Characters Unicode added after the Unicode 14 of Debian 12's PCRE2 match as their
// Unicode 16 categories, as in Hugging Face's Oniguruma (engine/unicode_additions.inc).

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagellm::engine {

class RegexError : public std::runtime_error {
 public:
  explicit RegexError(const std::string& what) : std::runtime_error(what) {}
};

class Regex {
 public:
  explicit Regex(std::string_view pattern);  // throws RegexError
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Appends [start, end) byte offsets of the non-empty, non-overlapping matches in
  // `text`, left to right. `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The code point PCRE2 matches in place of `c`: for one Unicode assigned after 14.0, one
// of the same category and UTF-8 length it knows; else `c` (exposed for tests).
char32_t pcre2_stand_in(char32_t c);

// The pattern with `\s` / `\S` replaced by Oniguruma's whitespace set (exposed for tests).
std::string translate_oniguruma_pattern(std::string_view pattern);

}  // namespace pagellm::engine
