#include "engine/pretokenizer.h"

#include <algorithm>

#include "engine/byte_level.h"
#include "engine/normalizer.h"
#include "engine/regex.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;
using Span = std::pair<size_t, size_t>;

// GPT-2's split, used by ByteLevel when use_regex is on.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Hugging Face's SplitDelimiterBehavior applied to (span, is_match) runs covering a text.
std::vector<Span> apply_behavior(const std::vector<std::pair<Span, bool>>& runs,
                                 Behavior behavior) {
  std::vector<Span> out;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const auto& [span, is_match] : runs) {
        if (!is_match) out.push_back(span);
      }
      break;
    case Behavior::kIsolated:
      for (const auto& run : runs)
        out.push_back(run.first);
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [span, is_match] : runs) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
        const auto& [span, is_match] = *it;
        if (is_match && !previous_match && !out.empty()) {
          out.back().first = span.first;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [span, is_match] : runs) {
        if (!out.empty() && is_match == previous_match) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
  }
  return out;
}

// Matches -> runs covering the whole text, flagged as match or gap.
std::vector<std::pair<Span, bool>> to_runs(const std::vector<Span>& matches, size_t size,
                                           bool invert) {
  std::vector<std::pair<Span, bool>> runs;
  runs.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const Span& m : matches) {
    if (m.first > prev) runs.push_back({{prev, m.first}, invert});
    runs.push_back({m, !invert});
    prev = m.second;
  }
  if (prev < size) runs.push_back({{prev, size}, invert});
  return runs;
}

void split_pieces(std::vector<PreToken>& pieces, const Pattern& pattern, Behavior behavior,
                  bool invert) {
  std::vector<PreToken> out;
  out.reserve(pieces.size() * 4);
  std::vector<Span> matches;
  for (PreToken& piece : pieces) {
    matches.clear();
    const std::string& text = piece.text;
    if (pattern.regex) {
      pattern.regex->find_all(text, matches);
    } else {
      for (size_t at = text.find(pattern.literal); at != std::string::npos;
           at = text.find(pattern.literal, at + pattern.literal.size())) {
        matches.emplace_back(at, at + pattern.literal.size());
      }
    }
    if (behavior == Behavior::kIsolated && !invert) {
      // The common case (every GPT-style tokenizer), without the intermediate lists.
      size_t prev = 0;
      for (const Span& m : matches) {
        if (m.first > prev)
          out.push_back({text.substr(prev, m.first - prev), piece.at_origin && prev == 0});
        out.push_back({text.substr(m.first, m.second - m.first), piece.at_origin && m.first == 0});
        prev = m.second;
      }
      if (prev < text.size()) out.push_back({text.substr(prev), piece.at_origin && prev == 0});
      continue;
    }
    for (const Span& span : apply_behavior(to_runs(matches, text.size(), invert), behavior)) {
      if (span.second > span.first) {
        out.push_back({text.substr(span.first, span.second - span.first),
                       piece.at_origin && span.first == 0});
      }
    }
  }
  pieces = std::move(out);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) gpt2_.regex = std::make_shared<const Regex>(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, " ");
      }
    }
    if (gpt2_.regex) split_pieces(pieces, gpt2_, Behavior::kIsolated, false);
    for (PreToken& piece : pieces)
      piece.text = byte_level::encode(piece.text);
  }

 private:
  bool add_prefix_space_;
  Pattern gpt2_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : prepend_(prepend), split_(split) {
    replacement_.literal = std::move(replacement);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    static const Pattern space{" ", nullptr};
    const std::string& rep = replacement_.literal;
    for (PreToken& piece : pieces) {
      piece.text = replace_all(piece.text, space, rep);
      const bool starts = piece.text.compare(0, rep.size(), rep) == 0;
      if (!starts &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_origin))) {
        piece.text.insert(0, rep);
      }
    }
    if (split_) split_pieces(pieces, replacement_, Behavior::kMergedWithNext, false);
  }

 private:
  Pattern replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_)
      step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Behavior parse_behavior(const std::string& name, const std::string& where,
                        const SpecReader& reader) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  reader.fail(where, "unknown split behavior '" + name + "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec, const std::string& where,
                                                 const SpecReader& reader) {
  if (spec.is_null()) return nullptr;
  const std::string type = reader.type_of(spec, where);
  if (type == "Sequence") {
    const json& list = reader.require(spec, where, "pretokenizers");
    if (!list.is_array()) reader.fail(where + ".pretokenizers", "expected a list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step =
          make_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", reader);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    Pattern pattern =
        make_pattern(reader.require(spec, where, "pattern"), where + ".pattern", reader);
    const Behavior behavior =
        parse_behavior(reader.string_field(spec, where, "behavior"), where + ".behavior", reader);
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior,
                                               reader.bool_or(spec, where, "invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        reader.bool_or(spec, where, "add_prefix_space", true),
        reader.bool_or(spec, where, "use_regex", true));
  }
  if (type == "Metaspace") {
    std::string replacement = reader.string_or(spec, where, "replacement", "\xE2\x96\x81");
    if (replacement.empty()) reader.fail(where + ".replacement", "must not be empty");
    MetaspacePreTokenizer::Prepend prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (auto it = spec.find("prepend_scheme"); it != spec.end() && !it->is_null()) {
      const std::string scheme = reader.string_field(spec, where, "prepend_scheme");
      if (scheme == "always") {
        prepend = MetaspacePreTokenizer::Prepend::kAlways;
      } else if (scheme == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else {
        reader.fail(where + ".prepend_scheme", "unknown scheme '" + scheme + "'");
      }
    } else if (!reader.bool_or(spec, where, "add_prefix_space", true)) {
      prepend = MetaspacePreTokenizer::Prepend::kNever;  // the older spelling
    }
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), prepend,
                                                   reader.bool_or(spec, where, "split", true));
  }
  reader.fail(where + ".type", "unsupported pre_tokenizer '" + type + "'");
}

}  // namespace pagellm::engine
