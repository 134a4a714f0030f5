#pragma once
// KVCacheManager: the one object the scheduler talks to about KV memory. It owns the
// BlockPool, the PrefixCache and every sequence's BlockTable, and keeps them in step.
//
// Life of a sequence, as the scheduler drives it (one engine thread, no locks):
//
//   match = kv.match_prefix(prompt)              // cached full blocks, no side effects
//   kv.add_sequence(id, match, first_chunk)      // take them + slots for the first chunk
//   ... forward pass writes KV into the slots of block_table(id) ...
//   kv.cache_full_blocks(id, computed_tokens)    // newly full blocks become shareable
//   kv.allocate_slots(id, n)                     // next chunk, or 1 per decode step
//   kv.fork_sequence(id, sibling)                // n > 1: siblings share every block
//   kv.free_sequence(id)                         // finished, aborted or preempted
//
// Blocks become shareable only after their KV has been computed (cache_full_blocks runs
// after the forward pass), so no request can hit a block that is still being written.
// A shared block that is only partly full is copied on write: the next allocate_slots
// of either sibling moves it to a fresh block and queues a BlockCopy that the backend
// performs before the next forward pass (take_block_copies).

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "paging/block_pool.h"
#include "paging/block_table.h"
#include "paging/prefix_cache.h"
#include "paging/types.h"

namespace pagellm::paging {

// The cached prefix of a prompt found by match_prefix, to hand to add_sequence.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  int32_t num_cached_tokens = 0;  // blocks.size() * kBlockSize
  int32_t num_query_tokens = 0;   // prompt length, for the hit-rate counters
  uint64_t extra_key = 0;
};

// Copy the KV of block `src` into block `dst` (copy-on-write of a shared partial block).
struct BlockCopy {
  BlockId src;
  BlockId dst;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

struct KVCacheUsage {
  int32_t total_blocks = 0;
  int32_t used_blocks = 0;
  int32_t cached_free_blocks = 0;
  int32_t free_blocks = 0;
  int32_t num_sequences = 0;
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up at first admission
  int64_t prefix_hit_tokens = 0;    // of which found in the cache
  // Share of blocks in use, 0..1 (cached-free blocks count as reclaimable, not used).
  double usage() const { return total_blocks ? double(used_blocks) / total_blocks : 0.0; }
  double prefix_hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / prefix_query_tokens : 0.0;
  }
};

class KVCacheManager {
 public:
  // Throws PagingError unless num_blocks > 0.
  explicit KVCacheManager(int32_t num_blocks, bool enable_prefix_caching = true);

  // Longest cached prefix of `prompt` in whole blocks. The last prompt token is never
  // covered: its logits are needed, so at least one token is always computed.
  PrefixMatch match_prefix(std::span<const TokenId> prompt, uint64_t extra_key = 0) const;

  // Whether add_sequence(match, num_new_tokens, first_needed_position) would succeed now.
  bool can_add_sequence(const PrefixMatch& match, int32_t num_new_tokens,
                        int32_t first_needed_position = 0) const;

  // Starts sequence `id` holding the matched blocks plus slots for `num_new_tokens`
  // tokens after them. All or nothing: returns false and changes nothing when the pool
  // is short. Throws PagingError when `id` exists, the match is stale (a matched block
  // was evicted since), or the request needs more blocks than the pool has. The match
  // counts in the prefix-cache statistics unless `resumed` (a preempted sequence coming
  // back: its prompt was counted when it was first admitted).
  // Sliding-window attention: matched blocks that hold only positions before
  // `first_needed_position` are not taken (their page-table entries are kNoBlock, as if
  // release_blocks_before had released them), and only the blocks taken count against
  // the pool, so a cached prefix longer than the pool can still be resumed from.
  bool add_sequence(SeqId id, const PrefixMatch& match, int32_t num_new_tokens,
                    bool resumed = false, int32_t first_needed_position = 0);

  // Blocks allocate_slots(id, n) would take from the pool (copy-on-write included).
  int32_t num_blocks_needed(SeqId id, int32_t num_new_tokens) const;
  bool can_allocate_slots(SeqId id, int32_t num_new_tokens) const;

  // Reserves slots for `num_new_tokens` more tokens of `id`. All or nothing: returns
  // false and changes nothing when the pool is short. Throws PagingError for an unknown
  // id, a negative count, or a sequence that would outgrow the whole pool.
  bool allocate_slots(SeqId id, int32_t num_new_tokens);

  // Tells the manager that `computed_tokens` (the sequence's first tokens, KV written)
  // are final: every full block among them is hashed and offered to the prefix cache.
  void cache_full_blocks(SeqId id, std::span<const TokenId> computed_tokens);

  // Sliding-window attention: releases the leading blocks of `id` that hold only
  // positions before `first_needed_position` (no later query attends to them). Their
  // page-table entries become kNoBlock. Returns how many blocks were released.
  int32_t release_blocks_before(SeqId id, int32_t first_needed_position);

  // Makes `child` a copy of `parent` sharing all its blocks (n > 1 sampling).
  void fork_sequence(SeqId parent, SeqId child);

  // Releases every block of `id`, last block first so the tail of a cached prefix is
  // evicted before its head. Throws PagingError for an unknown id (or a second free).
  void free_sequence(SeqId id);

  // Copy-on-write copies queued since the last call; the backend must perform them
  // before the next forward pass.
  std::vector<BlockCopy> take_block_copies();

  // Forgets every cached prefix. Blocks in use stay with their sequences; cached-free
  // blocks become free. Returns how many blocks were dropped from the cache.
  int32_t reset_prefix_cache();

  bool has_sequence(SeqId id) const { return sequences_.count(id) > 0; }
  int32_t num_sequences() const { return static_cast<int32_t>(sequences_.size()); }
  const BlockTable& block_table(SeqId id) const;
  KVCacheUsage usage() const;
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }

  const BlockPool& pool() const { return pool_; }
  const PrefixCache& prefix_cache() const { return prefix_cache_; }

 private:
  struct Sequence {
    BlockTable table;
    int32_t num_hashed_blocks = 0;    // leading blocks whose hash is known
    int32_t num_released_blocks = 0;  // leading blocks dropped by the sliding window
    BlockHash last_hash = kRootBlockHash;
    uint64_t extra_key = 0;
  };

  Sequence& get(SeqId id);
  const Sequence& get(SeqId id) const;
  // Whether appending to `seq` must first copy a shared, partly filled last block.
  bool needs_copy_on_write(const Sequence& seq, int32_t num_new_tokens) const;
  // Leading matched blocks that add_sequence leaves out for `first_needed_position`.
  static int32_t blocks_behind_window(const PrefixMatch& match, int32_t num_new_tokens,
                                      int32_t first_needed_position);
  bool allocate_blocks(int32_t count, std::vector<BlockId>& out);
  // Throws PagingError when a sequence would hold more blocks than the pool has.
  void check_fits_pool(int64_t num_blocks) const;

  BlockPool pool_;
  PrefixCache prefix_cache_;
  bool enable_prefix_caching_;
  std::unordered_map<SeqId, Sequence> sequences_;
  std::vector<BlockCopy> pending_copies_;
  std::vector<BlockId> scratch_blocks_;
  std::vector<BlockId> scratch_evicted_;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace pagellm::paging
