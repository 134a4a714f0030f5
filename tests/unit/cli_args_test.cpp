// The command-line reader and the number parsing every subcommand's flags share.

#include "server/cli_args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace pagellm::cli {
namespace {

TEST(WholeInteger, TakesOnlyAWholeBase10Integer) {
  EXPECT_EQ(whole_integer("0"), 0);
  EXPECT_EQ(whole_integer("8000"), 8000);
  EXPECT_EQ(whole_integer("-12"), -12);
  EXPECT_EQ(whole_integer("9223372036854775807"), 9223372036854775807LL);
  EXPECT_EQ(whole_integer("010"), 10);  // base 10, not octal
  for (const char* bad : {"", " ", "x", "12x", "1.5", "1e3", "0x10", "9223372036854775808"})
    EXPECT_FALSE(whole_integer(bad).has_value()) << "'" << bad << "'";
}

TEST(WholeNumber, TakesOnlyAWholeNumber) {
  EXPECT_EQ(whole_number("0.5"), 0.5);
  EXPECT_EQ(whole_number("4"), 4.0);
  EXPECT_EQ(whole_number("-2.5e3"), -2500.0);
  ASSERT_TRUE(whole_number("inf").has_value());
  EXPECT_TRUE(std::isinf(*whole_number("inf")));
  for (const char* bad : {"", "x", "0.5x", "1e999", ". 5"})
    EXPECT_FALSE(whole_number(bad).has_value()) << "'" << bad << "'";
}

TEST(ArgReader, ReadsOptionsFlagsAndPositionals) {
  const std::vector<std::string_view> args = {"--port", "8000", "--api-key=k", "--verbose", "dir"};
  const ArgReader r(args, {"--port", "--api-key"}, {"--verbose"});
  EXPECT_EQ(r.option("--port"), "8000");
  EXPECT_EQ(r.option("--api-key"), "k");
  EXPECT_FALSE(r.option("--missing").has_value());
  EXPECT_TRUE(r.flag("--verbose"));
  EXPECT_EQ(r.positional(), std::vector<std::string>{"dir"});
}

TEST(ArgReader, RejectsWhatItDoesNotKnow) {
  const std::vector<std::string_view> unknown = {"--nope", "1"};
  EXPECT_THROW(ArgReader(unknown, {"--port"}, {}), UsageError);
  const std::vector<std::string_view> no_value = {"--port"};
  EXPECT_THROW(ArgReader(no_value, {"--port"}, {}), UsageError);
  const std::vector<std::string_view> flag_value = {"--verbose=1"};
  EXPECT_THROW(ArgReader(flag_value, {}, {"--verbose"}), UsageError);
}

}  // namespace
}  // namespace pagellm::cli
