#pragma once
// BlockPool: the fixed set of KV blocks and who holds them.
//
// Every block is in exactly one state:
//   used         ref_count > 0: held by one or more page tables
//   cached-free  ref_count == 0 but still holds a full prefix block registered in the
//                PrefixCache; reclaimable, least recently released first
//   free         ref_count == 0 and holds nothing worth keeping
// and used + cached_free + free == total at all times.
//
// Fresh allocations take free blocks first and only then evict cached-free ones (LRU),
// so cached prefixes survive as long as possible. Both queues are intrusive doubly
// linked lists over block ids: allocate, release and revive are all O(1).

#include <cstdint>
#include <span>
#include <vector>

#include "paging/types.h"

namespace pagellm::paging {

enum class BlockState : uint8_t { kFree, kCachedFree, kUsed };

class BlockPool {
 public:
  // Throws PagingError unless num_blocks > 0.
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t num_free() const { return free_.size; }
  int32_t num_cached_free() const { return cached_free_.size; }
  int32_t num_used() const { return num_blocks() - num_free() - num_cached_free(); }
  // Blocks an allocation can take right now: free plus reclaimable cached-free.
  int32_t num_available() const { return num_free() + num_cached_free(); }

  // Takes `count` blocks, each with ref count 1, appending their ids to `out`. All or
  // nothing: returns false and changes nothing when fewer than `count` are available.
  // Cached-free blocks taken here lose their cached mark and are appended to `evicted`
  // so the caller can drop them from the prefix cache. Throws PagingError when `count`
  // is negative or larger than the whole pool (a request that can never succeed).
  bool allocate(int32_t count, std::vector<BlockId>& out, std::vector<BlockId>& evicted);

  // Adds a holder to a block. A cached-free block comes back into use (a prefix hit).
  // Throws PagingError for a free (unowned, uncached) block or a bad id.
  void acquire(BlockId block);

  // Drops a holder. At zero the block becomes cached-free (most recently used end) when
  // it is cached, free otherwise. Throws PagingError when the block is not in use.
  void release(BlockId block);

  // Marks whether a block holds a registered prefix. Unmarking a cached-free block
  // moves it to the free queue.
  void set_cached(BlockId block, bool cached);

  int32_t ref_count(BlockId block) const;
  bool is_cached(BlockId block) const;
  BlockState state(BlockId block) const;

  // Cached-free blocks from least to most recently released (the eviction order).
  std::vector<BlockId> cached_free_lru_order() const;

 private:
  // Intrusive doubly linked list; links live in prev_/next_, shared by both queues
  // since a block is in at most one of them.
  struct Queue {
    BlockId head = kNoBlock;
    BlockId tail = kNoBlock;
    int32_t size = 0;
  };

  void check_id(BlockId block, const char* what) const;
  void push_back(Queue& q, BlockId block);
  void unlink(Queue& q, BlockId block);
  BlockId pop_front(Queue& q);

  std::vector<int32_t> ref_count_;
  std::vector<uint8_t> cached_;
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  Queue free_;
  Queue cached_free_;
};

}  // namespace pagellm::paging
