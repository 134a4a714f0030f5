#include "engine/stop_strings.h"

#include <gtest/gtest.h>

namespace pagellm::engine {
namespace {

// Streams `pieces` and returns everything emitted plus the flush.
std::string stream(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces)
    out += m.push(p);
  return out + m.flush();
}

TEST(StopStringMatcher, WithoutStopsEverythingPassesAtOnce) {
  StopStringMatcher m({});
  EXPECT_EQ(m.push("hello"), "hello");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, StopsBeforeTheStopStringAcrossPieces) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(stream(m, {"one two E", "N", "D three"}), "one two ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopStringMatcher, HoldsBackOnlyWhatCouldStartAStop) {
  StopStringMatcher m({"\n\n", "###"});
  EXPECT_EQ(m.push("abc"), "a");  // "bc" could start "###"? no, but 2 bytes are held
  EXPECT_EQ(m.push("def"), "bcd");
  EXPECT_EQ(m.flush(), "ef");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, EarliestStopWins) {
  StopStringMatcher m({"world", "lo"});
  EXPECT_EQ(stream(m, {"hello world"}), "hel");
}

// Text pushed unchecked (min_tokens) ends no stop string; one that ends later may begin
// in it.
TEST(StopStringMatcher, UncheckedTextEndsNoStopString) {
  StopStringMatcher m({"ab"});
  std::string out = m.push("xab", /*checked=*/false);
  out += m.push("yyab", true);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "xabyy");
  StopStringMatcher across({"abc"});
  out = across.push("xxab", false);
  out += across.push("cz", true);
  EXPECT_TRUE(across.stopped());
  EXPECT_EQ(out, "xx");
  StopStringMatcher never({"ab"});
  out = never.push("ab", false);
  out += never.push("ab", false);
  EXPECT_EQ(out + never.flush(), "abab");
  EXPECT_FALSE(never.stopped());
}

TEST(StopStringMatcher, TheStopStringCanBeKept) {
  StopStringMatcher m({"world", "lo"}, /*include_stop=*/true);
  EXPECT_TRUE(m.includes_stop());
  EXPECT_EQ(stream(m, {"hel", "lo wor", "ld"}), "hello");
  // Of two found at one place, the first listed.
  StopStringMatcher both({"ab", "abc"}, true);
  EXPECT_EQ(stream(both, {"xxabcd"}), "xxab");
  StopStringMatcher other({"abc", "ab"}, true);
  EXPECT_EQ(stream(other, {"xxabcd"}), "xxabc");
}

TEST(StopStringMatcher, NeverSplitsAUtf8Character) {
  StopStringMatcher m({"xy"});
  // "é" is 2 bytes; holding back 1 byte must not cut it in half: all of it waits.
  EXPECT_EQ(m.push("ab\xC3\xA9"), "ab");
  EXPECT_EQ(m.flush(), "\xC3\xA9");
}

TEST(StopStringMatcher, EmptyStopStringsAreIgnored) {
  StopStringMatcher m({""});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("abc"), "abc");
}

}  // namespace
}  // namespace pagellm::engine
