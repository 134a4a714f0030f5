#include "engine/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>

#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

// Regex \w: letters, marks, digits and connector punctuation.
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

size_t previous_char_start(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
    --start;
  return start;
}

char32_t char_before(std::string_view text, size_t pos) {
  size_t start = previous_char_start(text, pos);
  return utf8::next_codepoint(text, start);
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens,
                              const std::vector<std::string>& patterns) {
  tokens_ = &tokens;
  nodes_.assign(1, Node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t t = 0; t < patterns.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (unsigned char byte : pattern) {
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
            {byte, next});
        nodes_.push_back(Node{});
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

std::pair<int, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  int best = -1;
  size_t best_end = pos;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      best_end = i + 1;
    }
  }
  return {best, best_end};
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  size_t done = 0;  // end of the last emitted segment
  size_t pos = 0;
  while (!empty() && pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [token, end] = longest_at(text, pos);
    if (token < 0) {
      ++pos;
      continue;
    }
    const AddedToken& added = (*tokens_)[token];
    size_t start = pos;
    pos = end;  // the next search starts after this match, taken or not
    if (added.single_word) {
      const bool word_before = start > 0 && is_word_char(char_before(text, start));
      size_t after = end;
      const bool word_after = end < text.size() && is_word_char(utf8::next_codepoint(text, after));
      if (word_before || word_after) continue;
    }
    if (added.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = previous_char_start(text, new_start);
        size_t at = prev;
        if (!utf8::is_whitespace(utf8::next_codepoint(text, at))) break;
        new_start = prev;
      }
      start = std::max(new_start, done);
    }
    if (added.rstrip) {
      while (end < text.size()) {
        size_t at = end;
        if (!utf8::is_whitespace(utf8::next_codepoint(text, at))) break;
        end = at;
      }
    }
    if (start > done) out.push_back({done, start, -1});
    out.push_back({start, end, token});
    done = end;
    pos = std::max(pos, end);
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

}  // namespace pagellm::engine
