#include "engine/bpe.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>

#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

constexpr size_t kCharTableSize = 0x800;
constexpr size_t kCacheShards = 16;
constexpr size_t kCacheEntriesPerShard = 4096;
constexpr size_t kMaxCachedWordBytes = 64;

size_t table_size_for(size_t n) {
  size_t size = 16;
  while (size < n * 2)
    size <<= 1;
  return size;
}

}  // namespace

void VocabMap::build(std::vector<std::pair<std::string, int64_t>>&& entries) {
  keys_.clear();
  ids_.clear();
  keys_.reserve(entries.size());
  ids_.reserve(entries.size());
  const size_t size = table_size_for(entries.size());
  slots_.assign(size, Slot{-1, 0});
  mask_ = size - 1;
  const std::hash<std::string_view> hasher;
  for (auto& [key, id] : entries) {
    const size_t h = hasher(key);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    size_t i = h & mask_;
    while (slots_[i].index >= 0 && (slots_[i].tag != tag || keys_[slots_[i].index] != key)) {
      i = (i + 1) & mask_;
    }
    if (slots_[i].index >= 0) {
      ids_[slots_[i].index] = static_cast<TokenId>(id);  // a repeated key: the last one wins
      continue;
    }
    slots_[i] = Slot{static_cast<int32_t>(keys_.size()), tag};
    keys_.push_back(std::move(key));
    ids_.push_back(static_cast<TokenId>(id));
  }
}

std::optional<TokenId> VocabMap::find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  const size_t h = std::hash<std::string_view>()(key);
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot slot = slots_[i];
    if (slot.index < 0) return std::nullopt;
    if (slot.tag == tag && keys_[slot.index] == key) return ids_[slot.index];
  }
}

void MergeMap::reserve(size_t n) {
  const size_t size = table_size_for(n);
  slots_.assign(size, Slot{kEmpty, {0, 0}});
  mask_ = size - 1;
  shift_ = 64 - std::countr_zero(size);
}

void MergeMap::insert(TokenId left, TokenId right, Merge merge) {
  const uint64_t key = pack(left, right);
  size_t i = hash(key);
  while (slots_[i].key != kEmpty && slots_[i].key != key)
    i = (i + 1) & mask_;
  slots_[i] = Slot{key, merge};
}

// Results of whole words, so that frequent words skip the merge loop. Sharded locks
// keep concurrent encoders from queueing on one mutex; a full shard starts over.
struct BpeModel::Cache {
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>> words;
  };
  std::array<Shard, kCacheShards> shards;

  Shard& shard_for(std::string_view word) {
    return shards[std::hash<std::string_view>()(word) % kCacheShards];
  }
  bool lookup(std::string_view word, std::vector<TokenId>& out) {
    Shard& shard = shard_for(word);
    std::lock_guard lock(shard.mutex);
    auto it = shard.words.find(std::string(word));
    if (it == shard.words.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void store(std::string_view word, const TokenId* ids, size_t n) {
    Shard& shard = shard_for(word);
    std::lock_guard lock(shard.mutex);
    if (shard.words.size() >= kCacheEntriesPerShard) shard.words.clear();
    shard.words.emplace(std::string(word), std::vector<TokenId>(ids, ids + n));
  }
};

BpeModel::BpeModel(const nlohmann::json& spec, TokenizerJson& data, const SpecReader& reader)
    : cache_(std::make_unique<Cache>()) {
  if (!data.has_vocab) reader.fail("model.vocab", "missing");
  if (!data.has_merges) reader.fail("model.merges", "missing");
  ignore_merges_ = reader.bool_or(spec, "model", "ignore_merges", false);
  byte_fallback_ = reader.bool_or(spec, "model", "byte_fallback", false);
  fuse_unk_ = reader.bool_or(spec, "model", "fuse_unk", false);
  subword_prefix_ = reader.string_or(spec, "model", "continuing_subword_prefix", "");
  word_suffix_ = reader.string_or(spec, "model", "end_of_word_suffix", "");

  TokenId max_id = -1;
  for (const auto& [key, id] : data.vocab) {
    if (id < 0 || id >= kMaxTokenId) {
      reader.fail("model.vocab", "id " + std::to_string(id) + " of '" + key + "' is out of range");
    }
    max_id = std::max(max_id, static_cast<TokenId>(id));
  }
  vocab_.build(std::move(data.vocab));
  data.vocab.clear();
  key_of_id_.assign(static_cast<size_t>(max_id + 1), -1);
  for (size_t k = 0; k < vocab_.size(); ++k)
    key_of_id_[vocab_.ids()[k]] = static_cast<int32_t>(k);

  if (const std::string unk = reader.string_or(spec, "model", "unk_token", ""); !unk.empty()) {
    unk_id_ = vocab_.find(unk);
    if (!unk_id_) reader.fail("model.unk_token", "'" + unk + "' is not in the vocabulary");
  }

  // Resolve every merge to ids first, then insert with the table slots prefetched: the
  // inserts are random accesses into a table of several MB and dominate loading.
  struct Resolved {
    TokenId left, right, merged;
  };
  std::vector<Resolved> resolved(data.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < data.merges.size(); ++rank) {
    const auto& [left, right] = data.merges[rank];
    const auto left_id = vocab_.find(left);
    const auto right_id = vocab_.find(right);
    joined.assign(left);
    // The right half carries the subword prefix, which the merged token drops.
    if (!subword_prefix_.empty() &&
        right.compare(0, subword_prefix_.size(), subword_prefix_) == 0) {
      joined.append(right, subword_prefix_.size(), std::string::npos);
    } else {
      joined.append(right);
    }
    const auto merged_id = vocab_.find(joined);
    if (!left_id || !right_id || !merged_id) {
      reader.fail("model.merges[" + std::to_string(rank) + "]",
                  "merge '" + left + " " + right + "' uses a token that is not in the vocabulary");
    }
    resolved[rank] = {*left_id, *right_id, *merged_id};
  }
  merges_.reserve(resolved.size());
  constexpr size_t kAhead = 16;
  for (size_t rank = 0; rank < resolved.size(); ++rank) {
    if (rank + kAhead < resolved.size()) {
      merges_.prefetch(resolved[rank + kAhead].left, resolved[rank + kAhead].right);
    }
    const Resolved& r = resolved[rank];
    merges_.insert(r.left, r.right, {static_cast<uint32_t>(rank), r.merged});
  }
  data.merges.clear();
  data.merges.shrink_to_fit();

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_tokens_[b] = vocab_.find(name).value_or(-1);
  }
  if (subword_prefix_.empty() && word_suffix_.empty()) {
    char_ids_.assign(kCharTableSize, -1);
    std::string text;
    for (char32_t c = 0; c < kCharTableSize; ++c) {
      text.clear();
      utf8::append_codepoint(text, c);
      char_ids_[c] = vocab_.find(text).value_or(-1);
    }
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const {
  std::optional<TokenId> pending_unk;
  auto flush_unk = [&] {
    if (pending_unk) symbols.push_back(*pending_unk);
    pending_unk.reset();
  };
  std::string piece;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const char32_t c = utf8::next_codepoint(word, pos);
    std::optional<TokenId> id;
    if (!char_ids_.empty()) {
      if (c < kCharTableSize) {
        if (char_ids_[c] >= 0) id = char_ids_[c];
      } else {
        id = vocab_.find(word.substr(start, pos - start));
      }
    } else {
      piece.clear();
      if (start > 0) piece += subword_prefix_;
      piece.append(word.substr(start, pos - start));
      if (pos == word.size()) piece += word_suffix_;
      id = vocab_.find(piece);
    }
    if (id) {
      flush_unk();
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t i = start; i < pos; ++i)
        all = all && byte_tokens_[static_cast<unsigned char>(word[i])] >= 0;
      if (all) {
        flush_unk();
        for (size_t i = start; i < pos; ++i)
          symbols.push_back(byte_tokens_[static_cast<unsigned char>(word[i])]);
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && pending_unk)) {
        flush_unk();
        pending_unk = unk_id_;
      }
    }
    // Without an unk token the character is dropped rather than failing the request.
  }
  flush_unk();
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId id;
    int32_t prev, next;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    TokenId id;
    // std heap is a max-heap: the best is the lowest rank, then the leftmost.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<TokenId> ids;
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> queue;
  ids.clear();
  initial_symbols(word, ids);
  const int32_t n = static_cast<int32_t>(ids.size());
  symbols.resize(n);
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  queue.clear();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges_.find(ids[i], ids[i + 1])) queue.push_back({m->rank, i, m->id});
  }
  std::make_heap(queue.begin(), queue.end());
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip entries made stale by an earlier merge of either side.
    const auto* current = merges_.find(left.id, right.id);
    if (current == nullptr || current->id != top.id) continue;
    left.id = top.id;
    const int32_t after = right.next;
    right.id = -1;
    left.next = after;
    if (after >= 0) symbols[after].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* m = merges_.find(symbols[left.prev].id, left.id)) {
        queue.push_back({m->rank, left.prev, m->id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
    if (after >= 0) {
      if (const auto* m = merges_.find(left.id, symbols[after].id)) {
        queue.push_back({m->rank, top.pos, m->id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next)
    out.push_back(symbols[i].id);
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable && cache_->lookup(word, out)) return;
  const size_t before = out.size();
  merge_word(word, out);
  if (cacheable) cache_->store(word, out.data() + before, out.size() - before);
}

}  // namespace pagellm::engine
