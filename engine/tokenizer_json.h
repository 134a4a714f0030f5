#pragma once
// Reading tokenizer.json. The file is mostly the BPE vocabulary and merge list (9 MB
// for Llama 3); those two are streamed straight into flat vectors, and only the small
// rest becomes a JSON document.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagellm::engine {

struct TokenizerJson {
  nlohmann::json doc;  // the file without model.vocab and model.merges
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab, in file order
  bool has_merges = false;
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, in rank order
};

// Throws TokenizerError naming `origin` for malformed JSON or a malformed vocab/merges.
TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& origin);

// Field access for the pipeline parts of tokenizer.json. `where` is the dotted path of
// `object` (e.g. "pre_tokenizer.pretokenizers[0]"); errors name origin and field.
class SpecReader {
 public:
  explicit SpecReader(std::string origin) : origin_(std::move(origin)) {}
  const std::string& origin() const { return origin_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  const nlohmann::json& require(const nlohmann::json& object, const std::string& where,
                                const char* key) const;
  std::string string_field(const nlohmann::json& object, const std::string& where,
                           const char* key) const;
  // Absent or null gives `fallback`.
  std::string string_or(const nlohmann::json& object, const std::string& where, const char* key,
                        const std::string& fallback) const;
  bool bool_or(const nlohmann::json& object, const std::string& where, const char* key,
               bool fallback) const;
  int64_t int_or(const nlohmann::json& object, const std::string& where, const char* key,
                 int64_t fallback) const;
  // The "type" string of a pipeline component.
  std::string type_of(const nlohmann::json& object, const std::string& where) const;

 private:
  std::string origin_;
};

}  // namespace pagellm::engine
