// The tokenizers' regexes: Oniguruma's \s, and characters newer than PCRE2's Unicode.

#include "engine/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

std::vector<std::string> matches(const std::string& pattern, const std::string& text) {
  std::vector<std::pair<size_t, size_t>> spans;
  Regex(pattern).find_all(text, spans);
  std::vector<std::string> out;
  for (auto [start, end] : spans)
    out.push_back(text.substr(start, end - start));
  return out;
}

std::string u8(char32_t c) {
  std::string s;
  utf8::append_codepoint(s, c);
  return s;
}

// Unicode 15 and 16 letters and digits (CJK Extension H U+31350, Garay U+10D50, the
// outlined digit U+1CCF0, Ol Onal U+1E5F1) are letters and digits to \p{L} and \p{N}, as
// in Hugging Face's Oniguruma, and the matches are slices of the original text.
TEST(Regex, CharactersNewerThanPcre2MatchTheirCategories) {
  const std::string word = "a" + u8(0x31350) + u8(0x10D50) + "b";
  EXPECT_EQ(matches("\\p{L}+", word + " x"), (std::vector<std::string>{word, "x"}));
  EXPECT_EQ(matches("\\p{N}", "1" + u8(0x1CCF0) + u8(0x1E5F1)),
            (std::vector<std::string>{"1", u8(0x1CCF0), u8(0x1E5F1)}));
  // And not to the complement the byte-level pattern gives punctuation.
  EXPECT_EQ(matches("[^\\s\\p{L}\\p{N}]+", "." + u8(0x31350) + "!"),
            (std::vector<std::string>{".", "!"}));
  // U+323B0 (CJK Extension J) came in Unicode 17: unassigned to both, not a letter.
  EXPECT_EQ(matches("\\p{L}+", "a" + u8(0x323B0) + "b"), (std::vector<std::string>{"a", "b"}));
}

// Every stand-in has the category-preserving shape the copy of the text needs: the
// same UTF-8 length, and a code point PCRE2 already knows (its own stand-in).
TEST(Regex, StandInsKeepTheByteLengthAndAreKnownToPcre2) {
  size_t replaced = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const char32_t s = pcre2_stand_in(c);
    if (s == c) continue;
    ++replaced;
    ASSERT_EQ(u8(s).size(), u8(c).size()) << std::hex << uint32_t(c);
    ASSERT_EQ(pcre2_stand_in(s), s) << std::hex << uint32_t(c);
  }
  EXPECT_EQ(replaced, 10301u);  // what Unicode 15.0, 15.1 and 16.0 assigned
  EXPECT_EQ(pcre2_stand_in(U'a'), U'a');
  EXPECT_EQ(pcre2_stand_in(0x4E00), char32_t{0x4E00});
}

TEST(Regex, WhitespaceIsOnigurumasSet) {
  // U+001C..U+001F are whitespace to PCRE2's \s under UCP but not to Oniguruma's.
  EXPECT_EQ(matches("\\s+", "a \t\u3000b\x1c"), (std::vector<std::string>{" \t\u3000"}));
}

}  // namespace
}  // namespace pagellm::engine
