#pragma once
// A Hugging Face `tokenizers` compatible tokenizer, loaded from tokenizer.json (and
// tokenizer_config.json). Encoding and decoding give the same ids and text as the
// Hugging Face library for the pipelines LLMs ship:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2/3): regex Split + ByteLevel pre-tokenizers,
//     optional NFC normalizer, ByteLevel decoder;
//   - SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): Prepend/Replace normalizer
//     or Metaspace pre-tokenizer, byte fallback to <0xNN> tokens, and the
//     Replace/ByteFallback/Fuse/Strip (or Metaspace) decoders.
// Added tokens (special or not) written literally in the text are matched as their
// single ids, honouring their lstrip/rstrip/single_word/normalized flags.
//
// Input text that is not valid UTF-8 is not rejected: each invalid byte sequence is
// replaced by U+FFFD before encoding. Decoding never produces invalid UTF-8 either.
//
// A Tokenizer is immutable after loading, cheap to copy (shared state) and safe to use
// from several threads at once.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer_config.h"

namespace pagellm::engine {

using TokenId = int32_t;

// A tokenizer file that cannot be read or used; the message names the file and the
// field at fault.
class TokenizerError : public std::runtime_error {
 public:
  explicit TokenizerError(const std::string& what) : std::runtime_error(what) {}
};

class Tokenizer {
 public:
  // Loads a tokenizer.json. `config` supplies BOS/EOS strings, add_bos/add_eos overrides
  // and the decode cleanup default. Throws TokenizerError.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json,
                             const TokenizerConfig& config = {});
  // Loads DIR/tokenizer.json with DIR/tokenizer_config.json (optional).
  static Tokenizer from_dir(const std::filesystem::path& model_dir);

  // Token ids of `text`. With `add_special_tokens`, the BOS/EOS the model's
  // post-processor (or the config's add_bos_token/add_eos_token) asks for are added.
  // Throws TokenizerError only if the regex engine runs out of resources (not seen
  // even on megabyte-long single words).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`; unknown ids are skipped. `clean_up_tokenization_spaces` defaults to
  // the value of tokenizer_config.json, as in transformers.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false,
                     std::optional<bool> clean_up_tokenization_spaces = std::nullopt) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(TokenId id) const;
  // Ids run from 0 to vocab_size() - 1 (model vocabulary plus added tokens).
  size_t vocab_size() const;
  bool is_special(TokenId id) const;  // an added token marked special

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  bool clean_up_tokenization_spaces() const;

  struct Impl;  // engine/tokenizer_impl.h
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace pagellm::engine
