#include "paging/block_pool.h"

#include <string>

namespace pagellm::paging {

BlockPool::BlockPool(int32_t num_blocks) {
  if (num_blocks <= 0) {
    throw PagingError("BlockPool needs at least one block, got " + std::to_string(num_blocks));
  }
  ref_count_.assign(num_blocks, 0);
  cached_.assign(num_blocks, 0);
  prev_.assign(num_blocks, kNoBlock);
  next_.assign(num_blocks, kNoBlock);
  for (BlockId b = 0; b < num_blocks; ++b)
    push_back(free_, b);
}

void BlockPool::check_id(BlockId block, const char* what) const {
  if (block < 0 || block >= num_blocks()) {
    throw PagingError(std::string(what) + ": block id " + std::to_string(block) +
                      " is outside the pool [0, " + std::to_string(num_blocks()) + ")");
  }
}

void BlockPool::push_back(Queue& q, BlockId block) {
  prev_[block] = q.tail;
  next_[block] = kNoBlock;
  if (q.tail != kNoBlock) {
    next_[q.tail] = block;
  } else {
    q.head = block;
  }
  q.tail = block;
  ++q.size;
}

void BlockPool::unlink(Queue& q, BlockId block) {
  const BlockId p = prev_[block];
  const BlockId n = next_[block];
  if (p != kNoBlock) {
    next_[p] = n;
  } else {
    q.head = n;
  }
  if (n != kNoBlock) {
    prev_[n] = p;
  } else {
    q.tail = p;
  }
  prev_[block] = next_[block] = kNoBlock;
  --q.size;
}

BlockId BlockPool::pop_front(Queue& q) {
  const BlockId block = q.head;
  unlink(q, block);
  return block;
}

bool BlockPool::allocate(int32_t count, std::vector<BlockId>& out, std::vector<BlockId>& evicted) {
  if (count < 0) throw PagingError("cannot allocate a negative number of blocks");
  if (count > num_blocks()) {
    throw PagingError("asked for " + std::to_string(count) + " blocks but the pool has only " +
                      std::to_string(num_blocks()));
  }
  if (count > num_available()) return false;
  out.reserve(out.size() + count);
  for (int32_t i = 0; i < count; ++i) {
    BlockId block;
    if (free_.size > 0) {
      block = pop_front(free_);
    } else {
      block = pop_front(cached_free_);
      cached_[block] = 0;
      evicted.push_back(block);
    }
    ref_count_[block] = 1;
    out.push_back(block);
  }
  return true;
}

void BlockPool::acquire(BlockId block) {
  check_id(block, "acquire");
  if (ref_count_[block] == 0) {
    if (!cached_[block]) {
      throw PagingError("acquire: block " + std::to_string(block) +
                        " is free; only used or cached blocks can gain holders");
    }
    unlink(cached_free_, block);
  }
  ++ref_count_[block];
}

void BlockPool::release(BlockId block) {
  check_id(block, "release");
  if (ref_count_[block] == 0) {
    throw PagingError("release: block " + std::to_string(block) + " is not in use");
  }
  if (--ref_count_[block] == 0) push_back(cached_[block] ? cached_free_ : free_, block);
}

void BlockPool::set_cached(BlockId block, bool cached) {
  check_id(block, "set_cached");
  if (static_cast<bool>(cached_[block]) == cached) return;
  if (ref_count_[block] == 0) {
    // Only a cached-free block can lose its mark here (a free block is never marked).
    if (cached) throw PagingError("set_cached: block " + std::to_string(block) + " is free");
    unlink(cached_free_, block);
    push_back(free_, block);
  }
  cached_[block] = cached ? 1 : 0;
}

int32_t BlockPool::ref_count(BlockId block) const {
  check_id(block, "ref_count");
  return ref_count_[block];
}

bool BlockPool::is_cached(BlockId block) const {
  check_id(block, "is_cached");
  return cached_[block] != 0;
}

BlockState BlockPool::state(BlockId block) const {
  check_id(block, "state");
  if (ref_count_[block] > 0) return BlockState::kUsed;
  return cached_[block] ? BlockState::kCachedFree : BlockState::kFree;
}

std::vector<BlockId> BlockPool::cached_free_lru_order() const {
  std::vector<BlockId> order;
  order.reserve(cached_free_.size);
  for (BlockId b = cached_free_.head; b != kNoBlock; b = next_[b])
    order.push_back(b);
  return order;
}

}  // namespace pagellm::paging
