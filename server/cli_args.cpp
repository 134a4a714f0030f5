#include "server/cli_args.h"

namespace pagellm::cli {

std::optional<long long> whole_integer(const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return value;
}

long long integer_in(const std::string& name, const std::string& text, long long lo, long long hi) {
  const std::optional<long long> v = whole_integer(text);
  if (!v || *v < lo || *v > hi) {
    throw UsageError(name + " must be an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], not '" + text + "'");
  }
  return *v;
}

std::optional<double> whole_number(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return value;
}

ArgReader::ArgReader(Args args, std::set<std::string> options, std::set<std::string> flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string arg(args[i]);
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.size() < 2 || arg.compare(0, 2, "--") != 0) {
      positional_.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (options.count(name)) {
      if (eq != std::string::npos) {
        values_[name] = arg.substr(eq + 1);
      } else if (i + 1 < args.size()) {
        values_[name] = std::string(args[++i]);
      } else {
        throw UsageError("option " + name + " needs a value");
      }
    } else if (flags.count(name) && eq == std::string::npos) {
      set_flags_.insert(name);
    } else if (flags.count(name)) {
      throw UsageError("flag " + name + " takes no value");
    } else {
      throw UsageError("unknown option " + name);
    }
  }
}

std::optional<std::string> ArgReader::option(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string ArgReader::required_option(const std::string& name) const {
  auto value = option(name);
  if (!value) throw UsageError("missing required option " + name);
  return *value;
}

}  // namespace pagellm::cli
