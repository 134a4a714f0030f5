#pragma once
// UTF-8 helpers for the tokenizer. Invalid input is handled the way Rust's
// String::from_utf8_lossy (and so Hugging Face's decoders) handle it: each maximal
// invalid subpart becomes one U+FFFD.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagellm::engine::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// What sits at the start of `bytes`.
struct SequenceInfo {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  size_t length;  // kValid: bytes of the character; kInvalid: bytes one U+FFFD replaces;
                  // kIncomplete: bytes present (a valid prefix cut off by the end)
};
SequenceInfo inspect(std::string_view bytes);

bool is_valid(std::string_view text);

// Appends the lossy decode of `bytes` to `out`. With `final` false, a valid but
// incomplete sequence at the end is left undecoded; returns the bytes consumed.
size_t decode_lossy(std::string_view bytes, std::string& out, bool final);

// Valid text unchanged; otherwise a copy with invalid subparts replaced by U+FFFD.
std::string sanitize(std::string_view text);

// Decodes the character at `pos` of valid UTF-8 text and advances `pos`.
char32_t next_codepoint(std::string_view text, size_t& pos);

// Byte length of the character starting with `lead` (1 for stray continuation bytes).
inline size_t char_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void append_codepoint(std::string& out, char32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t cp);

}  // namespace pagellm::engine::utf8
