#pragma once
// PrefixCache: which block holds a given full block of tokens after a given prefix.
//
// Only full blocks are cached. Blocks are chained: the hash of block i covers the hash
// of block i-1, its 16 token ids and an extra key (a cache salt, so tenants that must
// not share prefixes never do):
//     hash_i = XXH3-128(hash_{i-1}, extra_key, tokens[16 i .. 16 i + 16))
// so one lookup per block walks the longest cached prefix. A hit is verified: the
// stored tokens, extra key and parent hash must equal the query's, so a hash collision
// can only cost a miss, never a wrong hit.
//
// The cache records ids only; BlockPool decides when a cached block is reclaimed and the
// owner then calls erase().

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "paging/types.h"

namespace pagellm::paging {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// The parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash{};

// Hash of one full block. `tokens` must hold exactly kBlockSize ids.
BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens, uint64_t extra_key);

// Extra key for a cache salt string; the empty salt is 0.
uint64_t cache_salt_key(std::string_view salt);

class PrefixCache {
 public:
  explicit PrefixCache(int32_t num_blocks);

  // Longest chain of cached full blocks that starts `tokens`, at most `max_blocks` long.
  // Appends the blocks and their hashes to `blocks` and `hashes`.
  void match(std::span<const TokenId> tokens, uint64_t extra_key, int32_t max_blocks,
             std::vector<BlockId>& blocks, std::vector<BlockHash>& hashes) const;

  // The block registered under `hash` whose content equals (parent, tokens, extra_key),
  // or kNoBlock.
  BlockId find(const BlockHash& hash, const BlockHash& parent, std::span<const TokenId> tokens,
               uint64_t extra_key) const;

  // Registers `block` as holding `tokens` after `parent`. Returns false (and changes
  // nothing) when the block is already registered or another block already holds this
  // hash: then the first copy stays the shared one. Throws PagingError for a bad id or
  // a token span that is not one full block.
  bool insert(BlockId block, const BlockHash& hash, const BlockHash& parent,
              std::span<const TokenId> tokens, uint64_t extra_key);

  // Unregisters a block; returns false when it was not registered.
  bool erase(BlockId block);

  bool contains(BlockId block) const;
  // The hash a registered block is stored under; throws PagingError if not registered.
  const BlockHash& hash_of(BlockId block) const;
  std::span<const TokenId> tokens_of(BlockId block) const;

  int32_t size() const { return size_; }
  // Drops every entry.
  void clear();

 private:
  // Open-addressing table from hash.lo to block id, linear probing, backward-shift
  // deletion (no tombstones), at most half full.
  int64_t slot_of(uint64_t key) const;
  void check_id(BlockId block, const char* what) const;

  std::vector<BlockId> table_;
  uint64_t mask_ = 0;

  // Per block: whether registered, and what it holds.
  std::vector<uint8_t> registered_;
  std::vector<BlockHash> hash_;
  std::vector<BlockHash> parent_;
  std::vector<uint64_t> extra_key_;
  std::vector<TokenId> tokens_;  // kBlockSize per block
  int32_t size_ = 0;
};

}  // namespace pagellm::paging
