#pragma once
// Small helpers for finding markers (<tool_call>, </think>, ...) in text that arrives in
// pieces, where a piece may end partway into one.

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace pagellm::server {

constexpr std::string_view kWhitespace = " \t\r\n";

// The length of the longest end of `text` that `marker` starts with (and is shorter):
// what must wait for the next piece before it is known not to be the marker.
inline size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace pagellm::server
