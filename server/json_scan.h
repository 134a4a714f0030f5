#pragma once
// A walk over the brackets of JSON text outside its strings, for what a parser does not
// say: how deep a body nests (before it is parsed, since parsed values are walked
// recursively), and where a value ends in text that goes on after it.

#include <cstddef>
#include <string_view>

namespace pagellm::server {

// Arrays and objects nest at most this deep in JSON the server parses (a request body,
// a tool call a model wrote): parsed values are walked, and written back, recursively.
constexpr int kMaxJsonDepth = 128;

// Calls `on_bracket(position, depth)` for each '[', '{', ']' and '}' of `text` from
// `begin` that is not inside a string, with the nesting depth after it (an opening
// bracket of the outermost value gives 1, its closing one 0), until it returns false.
// Malformed text is walked all the same: the parser refuses it afterwards.
template <class OnBracket>
void scan_json_brackets(std::string_view text, size_t begin, OnBracket on_bracket) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (!on_bracket(i, ++depth)) return;
    } else if (c == ']' || c == '}') {
      if (!on_bracket(i, --depth)) return;
    }
  }
}

}  // namespace pagellm::server
