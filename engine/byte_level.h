#pragma once
// GPT-2's reversible byte <-> character map used by ByteLevel pre-tokenizers and
// decoders: printable Latin-1 bytes stand for themselves, the other 68 bytes are
// shifted to U+0100..U+0143 so that every token is printable text.

#include <array>
#include <string>

namespace pagellm::engine::byte_level {

struct Tables {
  std::array<std::string, 256> byte_to_text;  // UTF-8 of each byte's character
  std::array<char32_t, 256> byte_to_char;
  std::array<int16_t, 324> char_to_byte;  // -1 where a character stands for no byte
};

inline const Tables& tables() {
  static const Tables t = [] {
    Tables out{};
    out.char_to_byte.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c =
          printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + shifted++);
      out.byte_to_char[b] = c;
      out.char_to_byte[c] = static_cast<int16_t>(b);
      std::string& text = out.byte_to_text[b];
      if (c < 0x80) {
        text.push_back(static_cast<char>(c));
      } else {
        text.push_back(static_cast<char>(0xC0 | (c >> 6)));
        text.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
    return out;
  }();
  return t;
}

// Maps raw bytes to their characters.
inline std::string encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes)
    out += t.byte_to_text[b];
  return out;
}

// Maps a token's characters back to bytes; false if some character is not in the map
// (then `out` is unspecified).
bool decode(std::string_view text, std::string& out);

}  // namespace pagellm::engine::byte_level
