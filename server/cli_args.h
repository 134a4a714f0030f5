#pragma once
// A small command-line reader for the subcommands: `--name VALUE`, `--name=VALUE`,
// boolean `--flag`s and positional arguments. Unknown options are errors.

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "server/cli.h"

namespace pagellm::cli {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

// The whole of `text` as a base-10 integer, or as a decimal number (std::stod's syntax,
// "inf" included); nullopt when it is not one: empty, trailing characters, out of range.
std::optional<long long> whole_integer(const std::string& text);
std::optional<double> whole_number(const std::string& text);
// The value of option `name`, an integer in [lo, hi]; UsageError otherwise.
long long integer_in(const std::string& name, const std::string& text, long long lo, long long hi);

class ArgReader {
 public:
  // `options` take a value; `flags` do not. Names include the leading dashes.
  // Throws UsageError for an unknown option or a missing value.
  ArgReader(Args args, std::set<std::string> options, std::set<std::string> flags);

  std::optional<std::string> option(const std::string& name) const;
  std::string required_option(const std::string& name) const;  // UsageError if absent
  bool flag(const std::string& name) const { return set_flags_.count(name) > 0; }
  bool help() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> set_flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace pagellm::cli
