#pragma once
// Comma-separated list options of the benchmark programs ("--batches 1,8,32").

#include <sstream>
#include <string>
#include <vector>

namespace pagellm::bench {

// "a,b,c" as {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');)
    out.push_back(item);
  return out;
}

// "1,8,32" as {1, 8, 32}.
inline std::vector<int> parse_int_list(const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : split_list(text))
    out.push_back(std::stoi(item));
  return out;
}

}  // namespace pagellm::bench
