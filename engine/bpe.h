#pragma once
// The BPE model of tokenizer.json: a vocabulary, ranked merges, and the options LLM
// tokenizers use (ignore_merges, byte_fallback, unk_token, fuse_unk, subword prefix and
// end-of-word suffix). Dropout is ignored: serving wants deterministic ids.

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer.h"
#include "engine/tokenizer_json.h"

namespace pagellm::engine {

// Token ids must stay below this (the largest real vocabularies hold ~260k tokens); a
// corrupt file with a huge id fails cleanly instead of allocating gigabytes.
inline constexpr int64_t kMaxTokenId = 1 << 24;

// String -> id with open addressing over one flat array; keys live in `keys_`.
class VocabMap {
 public:
  void build(std::vector<std::pair<std::string, int64_t>>&& entries);
  std::optional<TokenId> find(std::string_view key) const;
  size_t size() const { return keys_.size(); }
  const std::vector<std::string>& keys() const { return keys_; }
  const std::vector<TokenId>& ids() const { return ids_; }

 private:
  struct Slot {
    int32_t index;  // into keys_, -1 when empty
    uint32_t tag;   // high hash bits, to skip most mismatching keys without touching them
  };
  std::vector<std::string> keys_;
  std::vector<TokenId> ids_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id), open addressing.
class MergeMap {
 public:
  struct Merge {
    uint32_t rank;
    TokenId id;
  };
  void reserve(size_t n);
  // A pair inserted again takes the later merge, as Hugging Face's map of merges does.
  void insert(TokenId left, TokenId right, Merge merge);
  void prefetch(TokenId left, TokenId right) const {
    __builtin_prefetch(&slots_[hash(pack(left, right))]);
  }
  const Merge* find(TokenId left, TokenId right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t pack(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t hash(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // `spec` is the "model" object (vocab and merges already moved into `data`).
  BpeModel(const nlohmann::json& spec, TokenizerJson& data, const SpecReader& reader);
  ~BpeModel();

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const { return vocab_.find(token); }
  const std::string* id_to_token(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= key_of_id_.size() || key_of_id_[id] < 0)
      return nullptr;
    return &vocab_.keys()[key_of_id_[id]];
  }
  size_t id_bound() const { return key_of_id_.size(); }  // one past the largest id

 private:
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;
  void initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const;

  VocabMap vocab_;
  MergeMap merges_;
  std::vector<int32_t> key_of_id_;  // id -> index into vocab_.keys(), -1 for gaps
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<TokenId> unk_id_;
  std::string subword_prefix_;
  std::string word_suffix_;
  std::array<TokenId, 256> byte_tokens_{};  // <0xNN> ids, -1 when absent
  std::vector<TokenId> char_ids_;           // single-character tokens below U+0800

  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace pagellm::engine
