#include "engine/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <vector>

#include "engine/byte_level.h"
#include "engine/regex.h"
#include "engine/utf8.h"

namespace pagellm::engine {

bool byte_level::decode(std::string_view text, std::string& out) {
  const Tables& t = tables();
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = utf8::next_codepoint(text, pos);
    if (c >= t.char_to_byte.size() || t.char_to_byte[c] < 0) return false;
    out.push_back(static_cast<char>(t.char_to_byte[c]));
  }
  return true;
}

namespace {

using nlohmann::json;

class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(utf8proc_option_t options, bool nfc) : options_(options), nfc_(nfc) {}
  void normalize(std::string& text) const override {
    // ASCII is stable under every form, and below U+0300 NFC changes nothing (no
    // combining marks): most text needs no work.
    const unsigned char limit = nfc_ ? 0xCC : 0x80;
    bool unchanged = true;
    for (unsigned char c : text) {
      if (c >= limit) {
        unchanged = false;
        break;
      }
    }
    if (unchanged) return;
    // What utf8proc_map does, but for the canonical ordering: its swaps of neighbours are
    // quadratic in a run of combining marks (a 160 KB run took 24 s), a stable sort of
    // each run by combining class gives the same order in n log n.
    std::vector<utf8proc_int32_t> points;
    points.reserve(text.size());
    utf8proc_int32_t one[32];  // a decomposition has at most 18 code points (U+FDFA)
    const auto combining_class = [](utf8proc_int32_t c) {
      return utf8proc_get_property(c)->combining_class;
    };
    size_t run = 0;  // where the run of marks that ends the points so far starts
    const auto end_run = [&] {
      if (points.size() - run > 1) {
        std::stable_sort(points.begin() + static_cast<std::ptrdiff_t>(run), points.end(),
                         [&](utf8proc_int32_t a, utf8proc_int32_t b) {
                           return combining_class(a) < combining_class(b);
                         });
      }
    };
    size_t pos = 0;
    while (pos < text.size()) {
      const auto c = static_cast<utf8proc_int32_t>(utf8::next_codepoint(text, pos));
      one[0] = c;  // ASCII: no decomposition
      const utf8proc_ssize_t n =
          c < 0x80 ? 1 : utf8proc_decompose_char(c, one, 32, options_, nullptr);
      // Input is valid UTF-8 by now; keep it unchanged if utf8proc disagrees.
      if (n < 0 || n > 32) return;
      for (utf8proc_ssize_t i = 0; i < n; ++i) {
        if (combining_class(one[i]) == 0) {
          end_run();
          points.push_back(one[i]);
          run = points.size();
        } else {
          points.push_back(one[i]);
        }
      }
    }
    end_run();
    utf8proc_ssize_t length = static_cast<utf8proc_ssize_t>(points.size());
    if (options_ & UTF8PROC_COMPOSE) {
      length = utf8proc_normalize_utf32(points.data(), length, options_);
      if (length < 0) return;
    }
    std::string out;
    out.reserve(text.size());
    for (utf8proc_ssize_t i = 0; i < length; ++i)
      utf8::append_codepoint(out, static_cast<char32_t>(points[static_cast<size_t>(i)]));
    text = std::move(out);
  }

 private:
  utf8proc_option_t options_;
  bool nfc_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      utf8::append_codepoint(out,
                             static_cast<char32_t>(utf8proc_tolower(
                                 static_cast<utf8proc_int32_t>(utf8::next_codepoint(text, pos)))));
    }
    text = std::move(out);
  }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = replace_all(text, pattern_, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!utf8::is_whitespace(utf8::next_codepoint(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          --start;
        size_t pos = start;
        if (!utf8::is_whitespace(utf8::next_codepoint(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_)
      step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

Pattern make_pattern(const json& spec, const std::string& where, const SpecReader& reader) {
  Pattern out;
  if (!spec.is_object()) reader.fail(where, "expected {\"String\": ...} or {\"Regex\": ...}");
  if (auto it = spec.find("String"); it != spec.end() && it->is_string()) {
    out.literal = it->get<std::string>();
    if (out.literal.empty()) reader.fail(where + ".String", "empty pattern");
    return out;
  }
  if (auto it = spec.find("Regex"); it != spec.end() && it->is_string()) {
    try {
      out.regex = std::make_shared<const Regex>(it->get<std::string>());
    } catch (const RegexError& e) {
      reader.fail(where + ".Regex", e.what());
    }
    return out;
  }
  reader.fail(where, "expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string replace_all(const std::string& text, const Pattern& pattern,
                        const std::string& content) {
  std::string out;
  if (pattern.regex) {
    std::vector<std::pair<size_t, size_t>> matches;
    pattern.regex->find_all(text, matches);
    if (matches.empty()) return text;
    size_t prev = 0;
    for (auto [start, end] : matches) {
      out.append(text, prev, start - prev);
      out += content;
      prev = end;
    }
    out.append(text, prev, std::string::npos);
    return out;
  }
  size_t prev = 0;
  size_t found = text.find(pattern.literal);
  if (found == std::string::npos) return text;
  while (found != std::string::npos) {
    out.append(text, prev, found - prev);
    out += content;
    prev = found + pattern.literal.size();
    found = text.find(pattern.literal, prev);
  }
  out.append(text, prev, std::string::npos);
  return out;
}

std::unique_ptr<Normalizer> make_normalizer(const json& spec, const std::string& where,
                                            const SpecReader& reader) {
  if (spec.is_null()) return nullptr;
  const std::string type = reader.type_of(spec, where);
  if (type == "NFC")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE), true);
  if (type == "NFD")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE), false);
  if (type == "NFKC")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT),
        false);
  if (type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT),
        false);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(reader.string_field(spec, where, "prepend"));
  }
  if (type == "Replace") {
    Pattern pattern =
        make_pattern(reader.require(spec, where, "pattern"), where + ".pattern", reader);
    return std::make_unique<ReplaceNormalizer>(std::move(pattern),
                                               reader.string_field(spec, where, "content"));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(reader.bool_or(spec, where, "strip_left", true),
                                             reader.bool_or(spec, where, "strip_right", true));
  }
  if (type == "Sequence") {
    const json& list = reader.require(spec, where, "normalizers");
    if (!list.is_array()) reader.fail(where + ".normalizers", "expected a list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step =
          make_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", reader);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  reader.fail(where + ".type", "unsupported normalizer '" + type + "'");
}

}  // namespace pagellm::engine
