#pragma once
// A small, synthetic SentencePiece-style tokenizer.json in the exact Hugging Face
// format Llama 2 / TinyLlama / Mistral ship (no real file of that family is in the
// shared data): <unk>/<s>/</s>, the 256 byte-fallback tokens <0x00>..<0xFF> at ids
// 3..258, then a few pieces with ranked merges that spell "hello" and "world".

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pagellm::testing {

inline constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Byte-fallback id of a byte.
inline int byte_token_id(unsigned char byte) {
  return 3 + byte;
}

enum class SentencePieceStyle {
  kLegacy,     // Llama 2: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer
  kMetaspace,  // newer conversions: Metaspace pre-tokenizer, prepend_scheme "first"
};

inline nlohmann::json sentencepiece_tokenizer_json(SentencePieceStyle style) {
  using nlohmann::json;
  const std::string sp = kSpace;
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const char* pieces[] = {"",   "h",   "e",     "l",  "o", "w",   "r",  "d",     "h",       "ll",
                          "he", "llo", "hello", "or", "w", "wor", "ld", "world", "\xC3\xA9"};
  // Pieces that start a word carry the ▁ prefix.
  const bool with_space[] = {true, false, false, false, false, false, false, false, true, false,
                             true, false, true,  false, true,  true,  false, true,  false};
  for (size_t i = 0; i < std::size(pieces); ++i) {
    vocab[(with_space[i] ? sp : std::string()) + pieces[i]] = 259 + static_cast<int>(i);
  }
  json merges = json::array({sp + " h", "l l", sp + "h e", "ll o", sp + "he llo", "o r", sp + " w",
                             sp + "w or", "l d", sp + "wor ld"});
  auto added = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")})},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  if (style == SentencePieceStyle::kLegacy) {
    tokenizer["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", sp}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}};
    tokenizer["pre_tokenizer"] = nullptr;
  } else {
    tokenizer["normalizer"] = nullptr;
    tokenizer["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "first"}, {"split", false}};
  }
  return tokenizer;
}

// Writes `content` to DIR/NAME, creating DIR; returns the file's path.
inline std::filesystem::path write_file(const std::filesystem::path& dir, const std::string& name,
                                        const std::string& content) {
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// A fresh folder under the system temp folder, removed when the test program exits.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  struct Cleanup {
    std::vector<std::filesystem::path> dirs;
    ~Cleanup() {
      for (const auto& dir : dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    }
  };
  static Cleanup cleanup;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagellm_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  cleanup.dirs.push_back(dir);
  return dir;
}

}  // namespace pagellm::testing
