#include "paging/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace pagellm::paging {
namespace {

struct HashInput {
  uint64_t parent_lo;
  uint64_t parent_hi;
  uint64_t extra_key;
  TokenId tokens[kBlockSize];
};
static_assert(sizeof(HashInput) == 3 * sizeof(uint64_t) + kBlockSize * sizeof(TokenId));

void check_full_block(std::span<const TokenId> tokens) {
  if (tokens.size() != static_cast<size_t>(kBlockSize)) {
    throw PagingError("a cached block holds exactly " + std::to_string(kBlockSize) +
                      " tokens, got " + std::to_string(tokens.size()));
  }
}

// Spreads hash.lo over the table; it is already uniform, so this only picks bits.
inline uint64_t table_key(const BlockHash& h) {
  return h.lo;
}

}  // namespace

BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens, uint64_t extra_key) {
  check_full_block(tokens);
  HashInput in;
  in.parent_lo = parent.lo;
  in.parent_hi = parent.hi;
  in.extra_key = extra_key;
  std::memcpy(in.tokens, tokens.data(), sizeof(in.tokens));
  const XXH128_hash_t h = XXH3_128bits(&in, sizeof(in));
  return BlockHash{h.low64, h.high64};
}

uint64_t cache_salt_key(std::string_view salt) {
  if (salt.empty()) return 0;
  const uint64_t key = XXH3_64bits(salt.data(), salt.size());
  return key == 0 ? 1 : key;  // keep 0 for "no salt"
}

PrefixCache::PrefixCache(int32_t num_blocks) {
  if (num_blocks <= 0) {
    throw PagingError("PrefixCache needs at least one block, got " + std::to_string(num_blocks));
  }
  size_t capacity = 16;
  while (capacity < 2 * static_cast<size_t>(num_blocks))
    capacity *= 2;
  table_.assign(capacity, kNoBlock);
  mask_ = capacity - 1;
  registered_.assign(num_blocks, 0);
  hash_.assign(num_blocks, BlockHash{});
  parent_.assign(num_blocks, BlockHash{});
  extra_key_.assign(num_blocks, 0);
  tokens_.assign(static_cast<size_t>(num_blocks) * kBlockSize, 0);
}

void PrefixCache::check_id(BlockId block, const char* what) const {
  if (block < 0 || block >= static_cast<BlockId>(registered_.size())) {
    throw PagingError(std::string(what) + ": block id " + std::to_string(block) +
                      " is outside the pool [0, " + std::to_string(registered_.size()) + ")");
  }
}

int64_t PrefixCache::slot_of(uint64_t key) const {
  for (uint64_t i = key & mask_;; i = (i + 1) & mask_) {
    const BlockId b = table_[i];
    if (b == kNoBlock) return -1;
    if (table_key(hash_[b]) == key) return static_cast<int64_t>(i);
  }
}

BlockId PrefixCache::find(const BlockHash& hash, const BlockHash& parent,
                          std::span<const TokenId> tokens, uint64_t extra_key) const {
  const int64_t slot = slot_of(table_key(hash));
  if (slot < 0) return kNoBlock;
  const BlockId b = table_[slot];
  if (!(hash_[b] == hash) || !(parent_[b] == parent) || extra_key_[b] != extra_key) {
    return kNoBlock;
  }
  if (!std::equal(tokens.begin(), tokens.end(), tokens_.begin() + b * kBlockSize)) return kNoBlock;
  return b;
}

void PrefixCache::match(std::span<const TokenId> tokens, uint64_t extra_key, int32_t max_blocks,
                        std::vector<BlockId>& blocks, std::vector<BlockHash>& hashes) const {
  const int32_t full_blocks =
      std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / kBlockSize);
  BlockHash parent = kRootBlockHash;
  for (int32_t i = 0; i < full_blocks; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * kBlockSize, kBlockSize);
    const BlockHash h = hash_block(parent, block_tokens, extra_key);
    const BlockId b = find(h, parent, block_tokens, extra_key);
    if (b == kNoBlock) break;
    blocks.push_back(b);
    hashes.push_back(h);
    parent = h;
  }
}

bool PrefixCache::insert(BlockId block, const BlockHash& hash, const BlockHash& parent,
                         std::span<const TokenId> tokens, uint64_t extra_key) {
  check_id(block, "PrefixCache::insert");
  check_full_block(tokens);
  if (registered_[block]) return false;
  const uint64_t key = table_key(hash);
  uint64_t i = key & mask_;
  for (; table_[i] != kNoBlock; i = (i + 1) & mask_) {
    if (table_key(hash_[table_[i]]) == key) return false;
  }
  table_[i] = block;
  registered_[block] = 1;
  hash_[block] = hash;
  parent_[block] = parent;
  extra_key_[block] = extra_key;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + block * kBlockSize);
  ++size_;
  return true;
}

bool PrefixCache::erase(BlockId block) {
  check_id(block, "PrefixCache::erase");
  if (!registered_[block]) return false;
  int64_t found = slot_of(table_key(hash_[block]));
  uint64_t hole = static_cast<uint64_t>(found);
  // Backward-shift deletion: pull later entries of the probe run into the hole when
  // their home slot does not lie cyclically in (hole, current].
  for (uint64_t j = (hole + 1) & mask_; table_[j] != kNoBlock; j = (j + 1) & mask_) {
    const uint64_t home = table_key(hash_[table_[j]]) & mask_;
    const bool home_in_range = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!home_in_range) {
      table_[hole] = table_[j];
      hole = j;
    }
  }
  table_[hole] = kNoBlock;
  registered_[block] = 0;
  --size_;
  return true;
}

bool PrefixCache::contains(BlockId block) const {
  check_id(block, "PrefixCache::contains");
  return registered_[block] != 0;
}

const BlockHash& PrefixCache::hash_of(BlockId block) const {
  if (!contains(block)) {
    throw PagingError("block " + std::to_string(block) + " is not in the prefix cache");
  }
  return hash_[block];
}

std::span<const TokenId> PrefixCache::tokens_of(BlockId block) const {
  if (!contains(block)) {
    throw PagingError("block " + std::to_string(block) + " is not in the prefix cache");
  }
  return std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(block) * kBlockSize,
                                                   kBlockSize);
}

void PrefixCache::clear() {
  std::fill(table_.begin(), table_.end(), kNoBlock);
  std::fill(registered_.begin(), registered_.end(), 0);
  size_ = 0;
}

}  // namespace pagellm::paging
