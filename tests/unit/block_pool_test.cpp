#include "paging/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace pagellm::paging {
namespace {

void expect_counts(const BlockPool& pool, int used, int cached_free, int free) {
  EXPECT_EQ(pool.num_used(), used);
  EXPECT_EQ(pool.num_cached_free(), cached_free);
  EXPECT_EQ(pool.num_free(), free);
  EXPECT_EQ(pool.num_used() + pool.num_cached_free() + pool.num_free(), pool.num_blocks());
}

TEST(BlockPool, StartsAllFree) {
  BlockPool pool(8);
  expect_counts(pool, 0, 0, 8);
  for (BlockId b = 0; b < 8; ++b)
    EXPECT_EQ(pool.state(b), BlockState::kFree);
}

TEST(BlockPool, RejectsEmptyPool) {
  EXPECT_THROW(BlockPool(0), PagingError);
}

TEST(BlockPool, AllocateIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(3, out, evicted));
  EXPECT_EQ(out.size(), 3u);
  for (BlockId b : out)
    EXPECT_EQ(pool.ref_count(b), 1);
  std::vector<BlockId> more;
  EXPECT_FALSE(pool.allocate(2, more, evicted));  // only one left
  EXPECT_TRUE(more.empty());
  expect_counts(pool, 3, 0, 1);
}

TEST(BlockPool, AskingForMoreThanThePoolIsAnError) {
  BlockPool pool(4);
  std::vector<BlockId> out, evicted;
  EXPECT_THROW(pool.allocate(5, out, evicted), PagingError);
  EXPECT_THROW(pool.allocate(-1, out, evicted), PagingError);
  expect_counts(pool, 0, 0, 4);
}

TEST(BlockPool, ReleaseOfUncachedBlockMakesItFree) {
  BlockPool pool(2);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(1, out, evicted));
  pool.acquire(out[0]);
  EXPECT_EQ(pool.ref_count(out[0]), 2);
  pool.release(out[0]);
  expect_counts(pool, 1, 0, 1);
  pool.release(out[0]);
  expect_counts(pool, 0, 0, 2);
  EXPECT_EQ(pool.state(out[0]), BlockState::kFree);
}

TEST(BlockPool, DoubleReleaseIsAnErrorAndChangesNothing) {
  BlockPool pool(2);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(1, out, evicted));
  pool.release(out[0]);
  EXPECT_THROW(pool.release(out[0]), PagingError);
  expect_counts(pool, 0, 0, 2);
  EXPECT_THROW(pool.release(7), PagingError);
  EXPECT_THROW(pool.acquire(-1), PagingError);
  EXPECT_THROW(pool.acquire(out[0]), PagingError);  // free, uncached: nobody may revive it
}

// Cached-free blocks are reclaimed only when no free block is left, oldest release first:
//
//   allocate 0 1 2 3, cache 0 1 2, release 2 0 1     cached-free LRU: [2 0 1], free: [3]
//   allocate 1 -> 3 (free first)                     evicted: none
//   allocate 2 -> 2 0 (LRU order)                    evicted: 2 0, cached-free: [1]
TEST(BlockPool, EvictsCachedFreeBlocksInLruOrderAfterFreeOnes) {
  BlockPool pool(4);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(4, out, evicted));
  ASSERT_EQ(out, (std::vector<BlockId>{0, 1, 2, 3}));
  for (BlockId b : {0, 1, 2})
    pool.set_cached(b, true);
  for (BlockId b : {2, 0, 1})
    pool.release(b);
  pool.release(3);
  expect_counts(pool, 0, 3, 1);
  EXPECT_EQ(pool.cached_free_lru_order(), (std::vector<BlockId>{2, 0, 1}));

  std::vector<BlockId> first;
  ASSERT_TRUE(pool.allocate(1, first, evicted));
  EXPECT_EQ(first, std::vector<BlockId>{3});
  EXPECT_TRUE(evicted.empty());

  std::vector<BlockId> second;
  ASSERT_TRUE(pool.allocate(2, second, evicted));
  EXPECT_EQ(second, (std::vector<BlockId>{2, 0}));
  EXPECT_EQ(evicted, (std::vector<BlockId>{2, 0}));
  EXPECT_FALSE(pool.is_cached(2));
  EXPECT_EQ(pool.cached_free_lru_order(), std::vector<BlockId>{1});
  expect_counts(pool, 3, 1, 0);
}

TEST(BlockPool, AcquireRevivesCachedFreeBlockAndRemovesItFromLru) {
  BlockPool pool(3);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(3, out, evicted));
  for (BlockId b : out) {
    pool.set_cached(b, true);
    pool.release(b);
  }
  pool.acquire(1);
  EXPECT_EQ(pool.state(1), BlockState::kUsed);
  EXPECT_EQ(pool.cached_free_lru_order(), (std::vector<BlockId>{0, 2}));
  pool.release(1);  // now the most recently used
  EXPECT_EQ(pool.cached_free_lru_order(), (std::vector<BlockId>{0, 2, 1}));
}

TEST(BlockPool, UncachingACachedFreeBlockMovesItToFree) {
  BlockPool pool(2);
  std::vector<BlockId> out, evicted;
  ASSERT_TRUE(pool.allocate(1, out, evicted));
  pool.set_cached(out[0], true);
  pool.release(out[0]);
  expect_counts(pool, 0, 1, 1);
  pool.set_cached(out[0], false);
  expect_counts(pool, 0, 0, 2);
  EXPECT_THROW(pool.set_cached(out[0], true), PagingError);  // free blocks hold nothing
}

}  // namespace
}  // namespace pagellm::paging
