#include "engine/token_decoder.h"

#include "engine/byte_level.h"
#include "engine/utf8.h"

namespace pagellm::engine {

using nlohmann::json;

int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

std::string strip_chars(const std::string& text, const std::string& content, size_t start,
                        size_t stop) {
  size_t begin = 0, end = text.size();
  for (size_t i = 0; i < start && text.compare(begin, content.size(), content) == 0 &&
                     begin + content.size() <= end;
       ++i) {
    begin += content.size();
  }
  for (size_t i = 0; i < stop && end >= begin + content.size() &&
                     text.compare(end - content.size(), content.size(), content) == 0;
       ++i) {
    end -= content.size();
  }
  return text.substr(begin, end - begin);
}

std::string metaspace_token(const std::string& token, const std::string& replacement, bool first) {
  std::string out;
  out.reserve(token.size());
  size_t prev = 0;
  for (size_t at = token.find(replacement); at != std::string::npos;
       at = token.find(replacement, prev)) {
    out.append(token, prev, at - prev);
    if (!first) out.push_back(' ');
    prev = at + replacement.size();
  }
  out.append(token, prev, std::string::npos);
  return out;
}

std::string clean_up_tokenization(std::string text) {
  for (const auto& [from, to] : kCleanupReplacements) {
    if (text.find(from) == std::string::npos) continue;
    std::string out;
    out.reserve(text.size());
    size_t prev = 0;
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, prev)) {
      out.append(text, prev, at - prev);
      out.append(to);
      prev = at + from.size();
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }
  return text;
}

TokenDecoder::TokenDecoder(const json& spec, const std::string& where, const SpecReader& reader) {
  if (spec.is_null()) return;
  present_ = true;
  add(spec, where, reader);
}

void TokenDecoder::add(const json& spec, const std::string& where, const SpecReader& reader) {
  const std::string type = reader.type_of(spec, where);
  DecoderStep step{};
  if (type == "Sequence") {
    const json& list = reader.require(spec, where, "decoders");
    if (!list.is_array()) reader.fail(where + ".decoders", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) {
      add(list[i], where + ".decoders[" + std::to_string(i) + "]", reader);
    }
    return;
  }
  if (type == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::kMetaspace;
    step.content = reader.string_or(spec, where, "replacement", "\xE2\x96\x81");
    if (step.content.empty()) reader.fail(where + ".replacement", "must not be empty");
    if (auto it = spec.find("prepend_scheme"); it != spec.end() && !it->is_null()) {
      step.strip_first = reader.string_field(spec, where, "prepend_scheme") != "never";
    } else {
      step.strip_first = reader.bool_or(spec, where, "add_prefix_space", true);
    }
  } else if (type == "Replace") {
    step.kind = DecoderStep::kReplace;
    step.pattern = make_pattern(reader.require(spec, where, "pattern"), where + ".pattern", reader);
    step.content = reader.string_field(spec, where, "content");
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::kStrip;
    step.content = reader.string_field(spec, where, "content");
    if (step.content.empty() ||
        utf8::char_length(static_cast<unsigned char>(step.content[0])) != step.content.size()) {
      reader.fail(where + ".content", "expected one character");
    }
    const int64_t start = reader.int_or(spec, where, "start", 0);
    const int64_t stop = reader.int_or(spec, where, "stop", 0);
    if (start < 0 || stop < 0) reader.fail(where, "start and stop must not be negative");
    step.start = static_cast<size_t>(start);
    step.stop = static_cast<size_t>(stop);
  } else {
    reader.fail(where + ".type", "unsupported decoder '" + type + "'");
  }
  steps_.push_back(std::move(step));
}

std::string TokenDecoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        // All tokens' bytes together, then one lossy UTF-8 decode.
        std::string bytes;
        for (const std::string& token : tokens) {
          const size_t mark = bytes.size();
          if (!byte_level::decode(token, bytes)) {
            bytes.resize(mark);
            bytes += token;
          }
        }
        std::string text;
        utf8::decode_lossy(bytes, text, true);
        tokens.assign(1, std::move(text));
        break;
      }
      case DecoderStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = metaspace_token(tokens[i], step.content, i == 0 && step.strip_first);
        }
        break;
      case DecoderStep::kReplace:
        for (std::string& token : tokens)
          token = replace_all(token, step.pattern, step.content);
        break;
      case DecoderStep::kByteFallback: {
        // A run of <0xNN> tokens becomes its text if it is valid UTF-8, else one
        // U+FFFD per byte.
        std::vector<std::string> out;
        out.reserve(tokens.size());
        std::string run;
        auto flush = [&] {
          if (run.empty()) return;
          if (utf8::is_valid(run)) {
            out.push_back(run);
          } else {
            for (size_t i = 0; i < run.size(); ++i)
              out.emplace_back(utf8::kReplacement);
          }
          run.clear();
        };
        for (std::string& token : tokens) {
          const int byte = byte_fallback_value(token);
          if (byte >= 0) {
            run.push_back(static_cast<char>(byte));
          } else {
            flush();
            out.push_back(std::move(token));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::kFuse: {
        std::string joined;
        for (const std::string& token : tokens)
          joined += token;
        tokens.assign(1, std::move(joined));
        break;
      }
      case DecoderStep::kStrip:
        for (std::string& token : tokens)
          token = strip_chars(token, step.content, step.start, step.stop);
        break;
    }
  }
  std::string out;
  for (const std::string& token : tokens)
    out += token;
  return out;
}

}  // namespace pagellm::engine
