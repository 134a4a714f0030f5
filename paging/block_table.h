#pragma once
// BlockTable: one sequence's page table. Token i of the sequence lives in block
// blocks()[i / 16] at offset i % 16, i.e. in slot blocks()[i / 16] * 16 + i % 16.
// The table only records ids and counts; KVCacheManager decides what goes in it.

#include <cstdint>
#include <span>
#include <vector>

#include "paging/types.h"

namespace pagellm::paging {

class BlockTable {
 public:
  std::span<const BlockId> blocks() const { return blocks_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Tokens that have a slot (computed, or reserved for this step's computation).
  int32_t num_tokens() const { return num_tokens_; }
  // Slots the current blocks can hold.
  int32_t capacity() const { return num_blocks() * kBlockSize; }
  int32_t free_slots_in_last_block() const { return capacity() - num_tokens_; }

  // Slot of token `token_index`; throws PagingError when it has no slot (beyond the
  // token count, or in a block released by a sliding window: entry kNoBlock).
  SlotId slot(int32_t token_index) const;
  // Slots of tokens [begin, end), appended to `out` (the per-step slot mapping).
  void append_slots(int32_t begin, int32_t end, std::vector<SlotId>& out) const;

  void append_block(BlockId block) { blocks_.push_back(block); }
  void replace_block(int32_t index, BlockId block) { blocks_.at(index) = block; }
  // Sets the token count; throws PagingError when it exceeds capacity() or is negative.
  void set_num_tokens(int32_t num_tokens);
  void clear() {
    blocks_.clear();
    num_tokens_ = 0;
  }

 private:
  std::vector<BlockId> blocks_;
  int32_t num_tokens_ = 0;
};

}  // namespace pagellm::paging
