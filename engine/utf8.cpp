#include "engine/utf8.h"

#include <cstring>

namespace pagellm::engine::utf8 {

SequenceInfo inspect(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return {SequenceInfo::kValid, 1};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {SequenceInfo::kInvalid, 1};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return {SequenceInfo::kIncomplete, i};
    const unsigned char b = s[i];
    const unsigned char min = i == 1 ? lo : 0x80;
    const unsigned char max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return {SequenceInfo::kInvalid, i};
  }
  return {SequenceInfo::kValid, need};
}

bool is_valid(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // Runs of ASCII eight bytes at a time.
    uint64_t word;
    while (i + 8 <= text.size() &&
           (std::memcpy(&word, text.data() + i, 8), (word & 0x8080808080808080ull) == 0)) {
      i += 8;
    }
    if (i >= text.size()) break;
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const SequenceInfo info = inspect(text.substr(i));
    if (info.kind != SequenceInfo::kValid) return false;
    i += info.length;
  }
  return true;
}

size_t decode_lossy(std::string_view bytes, std::string& out, bool final) {
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes, copied in one go
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const SequenceInfo info = inspect(bytes.substr(i));
    if (info.kind == SequenceInfo::kValid) {
      i += info.length;
      continue;
    }
    out.append(bytes.substr(run, i - run));
    if (info.kind == SequenceInfo::kIncomplete && !final) return i;
    out.append(kReplacement);
    i += info.length;
    run = i;
  }
  out.append(bytes.substr(run, i - run));
  return i;
}

std::string sanitize(std::string_view text) {
  if (is_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  decode_lossy(text, out, true);
  return out;
}

char32_t next_codepoint(std::string_view text, size_t& pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char b0 = s[pos];
  const size_t len = char_length(b0);
  if (len == 1 || pos + len > text.size()) {
    ++pos;
    return b0;
  }
  char32_t cp = b0 & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; ++i)
    cp = (cp << 6) | (s[pos + i] & 0x3F);
  pos += len;
  return cp;
}

void append_codepoint(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_whitespace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace pagellm::engine::utf8
