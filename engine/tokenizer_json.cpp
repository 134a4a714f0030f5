#include "engine/tokenizer_json.h"

#include "engine/tokenizer.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

class TokenizerJsonSax {
 public:
  explicit TokenizerJsonSax(TokenizerJson& out) : out_(out) {}

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) {
    if (top_mode() == Mode::kVocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (top_mode() == Mode::kVocab) return vocab_id(static_cast<int64_t>(v));
    return value(json(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) {
    if (top_mode() == Mode::kVocab) return fail("model.vocab: token ids must be integers");
    return value(json(v));
  }
  bool string(json::string_t& v) {
    switch (top_mode()) {
      case Mode::kVocab:
        return fail("model.vocab: token ids must be integers");
      case Mode::kMerges: {
        const size_t space = v.find(' ');
        if (space == std::string::npos) {
          return fail("model.merges[" + std::to_string(out_.merges.size()) +
                      "]: expected \"a b\" with a space");
        }
        out_.merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_count_ >= 2) return fail(pair_error());
        (pair_count_ == 0 ? out_.merges.back().first : out_.merges.back().second) = std::move(v);
        ++pair_count_;
        return true;
      default:
        return value(json(std::move(v)));
    }
  }
  bool binary(json::binary_t&) { return fail("unexpected binary value"); }

  bool start_object(std::size_t) {
    if (in_special()) return fail(special_error());
    if (is_model_child("vocab")) {
      out_.has_vocab = true;
      out_.vocab.reserve(1 << 17);
      frames_.push_back({nullptr, Mode::kVocab});
      return true;
    }
    const bool is_model = frames_.size() == 1 && key_ == "model";
    json* node = place(json::object());
    frames_.push_back({node, is_model ? Mode::kModel : Mode::kDom});
    return true;
  }
  bool key(json::string_t& k) {
    if (top_mode() == Mode::kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (top_mode() == Mode::kMerges) {
      out_.merges.emplace_back();
      pair_count_ = 0;
      frames_.push_back({nullptr, Mode::kMergePair});
      return true;
    }
    if (in_special()) return fail(special_error());
    if (is_model_child("merges")) {
      out_.has_merges = true;
      out_.merges.reserve(1 << 18);
      frames_.push_back({nullptr, Mode::kMerges});
      return true;
    }
    json* node = place(json::array());
    frames_.push_back({node, Mode::kDom});
    return true;
  }
  bool end_array() {
    if (top_mode() == Mode::kMergePair && pair_count_ != 2) return fail(pair_error());
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = "not valid JSON (truncated or corrupt?) near byte " + std::to_string(position) + ": " +
             e.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Mode { kDom, kModel, kVocab, kMerges, kMergePair };
  struct Frame {
    json* node;
    Mode mode;
  };

  Mode top_mode() const { return frames_.empty() ? Mode::kDom : frames_.back().mode; }
  bool in_special() const {
    const Mode m = top_mode();
    return m == Mode::kVocab || m == Mode::kMerges || m == Mode::kMergePair;
  }
  bool is_model_child(const char* name) const { return top_mode() == Mode::kModel && key_ == name; }
  std::string special_error() const {
    switch (top_mode()) {
      case Mode::kVocab:
        return "model.vocab: token ids must be integers";
      case Mode::kMergePair:
        return pair_error();
      default:
        return "model.merges: entries must be \"a b\" strings or [\"a\", \"b\"] pairs";
    }
  }
  std::string pair_error() const {
    return "model.merges[" + std::to_string(out_.merges.size() - 1) +
           "]: a pair must hold exactly two strings";
  }

  bool vocab_id(int64_t id) {
    out_.vocab.emplace_back(std::move(vocab_key_), id);
    return true;
  }

  // Inserts a finished value into the current container; returns where it lives.
  json* place(json&& v) {
    if (frames_.empty()) {
      out_.doc = std::move(v);
      return &out_.doc;
    }
    json& parent = *frames_.back().node;
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(v);
      return &slot;
    }
    parent.push_back(std::move(v));
    return &parent.back();
  }
  bool value(json&& v) {
    if (in_special()) return fail(special_error());
    place(std::move(v));
    return true;
  }
  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  TokenizerJson& out_;
  std::vector<Frame> frames_;
  std::string key_;
  std::string vocab_key_;
  int pair_count_ = 0;
  std::string error_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& origin) {
  TokenizerJson out;
  TokenizerJsonSax sax(out);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    throw TokenizerError(origin + ": not valid JSON: " + e.what());
  }
  if (!ok) throw TokenizerError(origin + ": " + sax.error());
  if (!out.doc.is_object())
    throw TokenizerError(origin + ": expected a JSON object at the top level");
  return out;
}

void SpecReader::fail(const std::string& where, const std::string& what) const {
  throw TokenizerError(origin_ + ": field '" + where + "': " + what);
}

const json& SpecReader::require(const json& object, const std::string& where,
                                const char* key) const {
  if (!object.is_object()) fail(where, "expected an object");
  auto it = object.find(key);
  if (it == object.end()) fail(where + "." + key, "missing");
  return *it;
}

std::string SpecReader::string_field(const json& object, const std::string& where,
                                     const char* key) const {
  const json& value = require(object, where, key);
  if (!value.is_string()) fail(where + "." + key, "expected a string");
  return value.get<std::string>();
}

std::string SpecReader::string_or(const json& object, const std::string& where, const char* key,
                                  const std::string& fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(where + "." + key, "expected a string");
  return it->get<std::string>();
}

bool SpecReader::bool_or(const json& object, const std::string& where, const char* key,
                         bool fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(where + "." + key, "expected a boolean");
  return it->get<bool>();
}

int64_t SpecReader::int_or(const json& object, const std::string& where, const char* key,
                           int64_t fallback) const {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail(where + "." + key, "expected an integer");
  return it->get<int64_t>();
}

std::string SpecReader::type_of(const json& object, const std::string& where) const {
  return string_field(object, where, "type");
}

}  // namespace pagellm::engine
