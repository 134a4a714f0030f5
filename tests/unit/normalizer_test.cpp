// The Unicode normalizers of tokenizer.json against utf8proc's own whole-string mapping,
// and on long runs of combining marks.

#include "engine/normalizer.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

std::unique_ptr<Normalizer> normalizer(const std::string& type) {
  return make_normalizer(nlohmann::json{{"type", type}}, "normalizer", SpecReader("test"));
}

std::string utf8proc_mapped(const std::string& text, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  EXPECT_GE(n, 0);
  std::string result(reinterpret_cast<const char*>(out), n < 0 ? 0 : static_cast<size_t>(n));
  std::free(out);
  return result;
}

// Letters, precomposed letters, combining marks of many classes (in and out of order,
// with blocked and unblocked compositions), Hangul syllables and jamo, compatibility
// characters, singletons and characters that decompose to several marks.
const std::vector<char32_t> kAlphabet = {
    U'a',          U'e',          U'o',          U'A',      U' ',      U'.',      U'\u00e9',
    U'\u00c5',     U'\u1ea1',     U'\u0301',     U'\u0300', U'\u0302', U'\u0303', U'\u0308',
    U'\u0323',     U'\u0327',     U'\u031b',     U'\u0345', U'\u05b0', U'\u05b4', U'\u0e48',
    U'\u0e38',     U'\u1df7',     U'\u0359',     U'\u0344', U'\u0f73', U'\u0f71', U'\u0f72',
    U'\u0958',     U'\u093c',     U'\u0915',     U'\uac00', U'\uac01', U'\u1100', U'\u1161',
    U'\u11a8',     U'\u212b',     U'\u2126',     U'\ufb01', U'\u00bd', U'\u2460', U'\uff21',
    U'\u03b1',     U'\u0391',     U'\u1f00',     U'\u0386', U'\u3099', U'\u304b', U'\u30cf',
    U'\U0001d15e', U'\U0001d165', U'\U0001d16e', U'\u0041', U'\u030a'};

TEST(UnicodeNormalizer, EveryFormMatchesUtf8procOnRandomText) {
  struct Form {
    const char* type;
    int options;
  };
  const Form forms[] = {
      {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
      {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
      {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
      {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
  };
  std::mt19937 rng(7);
  for (const Form& form : forms) {
    const auto n = normalizer(form.type);
    for (int round = 0; round < 3000; ++round) {
      std::string text;
      const int length = 1 + static_cast<int>(rng() % 24);
      for (int i = 0; i < length; ++i)
        utf8::append_codepoint(text, kAlphabet[rng() % kAlphabet.size()]);
      std::string normalized = text;
      n->normalize(normalized);
      ASSERT_EQ(normalized, utf8proc_mapped(text, form.options)) << form.type << " of " << text;
    }
  }
}

// Canonical reordering sorts each run of marks by combining class, stably: a run of
// 2 x 20000 marks in reverse order is reordered (and the first dot below composes with
// the letter) without going quadratic in the run.
TEST(UnicodeNormalizer, ReordersLongRunsOfCombiningMarks) {
  constexpr int kRun = 20000;
  std::string text = "a", acutes, dots;
  for (int i = 0; i < kRun; ++i) {
    acutes += "\u0301";
    dots += "\u0323";
  }
  text += acutes + dots + "b\u0323\u0301";
  std::string expected = "\u1ea1" + dots.substr(2) + acutes + "\u1e05\u0301";
  auto nfc = normalizer("NFC");
  nfc->normalize(text);
  EXPECT_EQ(text, expected);

  std::string decomposed = "\u00e1" + acutes + dots;
  normalizer("NFD")->normalize(decomposed);
  EXPECT_EQ(decomposed, "a" + dots + "\u0301" + acutes);
}

}  // namespace
}  // namespace pagellm::engine
