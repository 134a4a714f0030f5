#include "paging/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pagellm::paging {
namespace {

std::vector<TokenId> tokens(int n, TokenId first = 1) {
  std::vector<TokenId> out(n);
  std::iota(out.begin(), out.end(), first);
  return out;
}

// Adds a sequence for the whole prompt and marks it computed.
void add_computed(KVCacheManager& kv, SeqId id, const std::vector<TokenId>& prompt) {
  const PrefixMatch match = kv.match_prefix(prompt);
  ASSERT_TRUE(
      kv.add_sequence(id, match, static_cast<int32_t>(prompt.size()) - match.num_cached_tokens));
  kv.cache_full_blocks(id, prompt);
}

TEST(KVCacheManager, SecondRequestWithSamePromptSharesFullBlocks) {
  KVCacheManager kv(16);
  const auto prompt = tokens(40);  // blocks: [16 full][16 full][8 partial]
  add_computed(kv, 1, prompt);
  EXPECT_EQ(kv.usage().used_blocks, 3);

  const PrefixMatch match = kv.match_prefix(prompt);
  EXPECT_EQ(match.num_cached_tokens, 32);
  ASSERT_TRUE(kv.add_sequence(2, match, 8));
  const auto a = kv.block_table(1).blocks();
  const auto b = kv.block_table(2).blocks();
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);  // the partial block is each sequence's own
  EXPECT_EQ(kv.pool().ref_count(a[0]), 2);
  EXPECT_EQ(kv.usage().used_blocks, 4);
  EXPECT_EQ(kv.usage().prefix_query_tokens, 80);
  EXPECT_EQ(kv.usage().prefix_hit_tokens, 32);
}

TEST(KVCacheManager, LastPromptTokenIsAlwaysComputed) {
  KVCacheManager kv(16);
  const auto prompt = tokens(32);  // exactly two full blocks
  add_computed(kv, 1, prompt);
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 16);
  EXPECT_EQ(kv.match_prefix(tokens(1)).num_cached_tokens, 0);
  EXPECT_EQ(kv.match_prefix({}).num_cached_tokens, 0);
}

TEST(KVCacheManager, BlocksAreSharedOnlyAfterTheyAreComputed) {
  KVCacheManager kv(16);
  const auto prompt = tokens(40);
  ASSERT_TRUE(kv.add_sequence(1, kv.match_prefix(prompt), 40));
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 0);  // slots reserved, KV not written
  kv.cache_full_blocks(1, std::span(prompt).first(20));     // first chunk computed
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 16);
}

TEST(KVCacheManager, FreeReleasesTailBlocksFirstSoTheyAreEvictedFirst) {
  KVCacheManager kv(4);
  const auto prompt = tokens(48);
  add_computed(kv, 1, prompt);
  const std::vector<BlockId> blocks(kv.block_table(1).blocks().begin(),
                                    kv.block_table(1).blocks().end());
  kv.free_sequence(1);
  // LRU (evicted first) .. MRU: the tail block, then toward the head.
  EXPECT_EQ(kv.pool().cached_free_lru_order(),
            (std::vector<BlockId>{blocks[2], blocks[1], blocks[0]}));
  EXPECT_EQ(kv.usage().cached_free_blocks, 3);
  EXPECT_EQ(kv.usage().free_blocks, 1);

  // Two fresh blocks: the free one, then the cached tail is evicted; the head survives.
  ASSERT_TRUE(kv.add_sequence(2, PrefixMatch{}, 32));
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 32);
  EXPECT_FALSE(kv.prefix_cache().contains(blocks[2]));
}

TEST(KVCacheManager, AllocationIsAllOrNothing) {
  KVCacheManager kv(6);
  ASSERT_TRUE(kv.add_sequence(1, PrefixMatch{}, 40));  // 3 blocks
  ASSERT_TRUE(kv.add_sequence(3, PrefixMatch{}, 32));  // 2 blocks, 1 left
  const KVCacheUsage before = kv.usage();
  EXPECT_FALSE(kv.can_allocate_slots(1, 40));
  EXPECT_FALSE(kv.allocate_slots(1, 40));  // needs 2 more blocks
  EXPECT_EQ(kv.block_table(1).num_tokens(), 40);
  EXPECT_EQ(kv.block_table(1).num_blocks(), 3);
  EXPECT_EQ(kv.usage().used_blocks, before.used_blocks);
  EXPECT_FALSE(kv.add_sequence(2, PrefixMatch{}, 17));
  EXPECT_FALSE(kv.has_sequence(2));
  EXPECT_TRUE(kv.allocate_slots(1, 24));  // one more block, filled exactly
  EXPECT_EQ(kv.usage().free_blocks, 0);
}

TEST(KVCacheManager, DecodeAppendsABlockEverySixteenthToken) {
  KVCacheManager kv(8);
  ASSERT_TRUE(kv.add_sequence(1, PrefixMatch{}, 15));
  EXPECT_EQ(kv.num_blocks_needed(1, 1), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 1));
  EXPECT_EQ(kv.block_table(1).num_blocks(), 1);
  EXPECT_EQ(kv.num_blocks_needed(1, 1), 1);
  ASSERT_TRUE(kv.allocate_slots(1, 1));
  EXPECT_EQ(kv.block_table(1).num_blocks(), 2);
  EXPECT_EQ(kv.block_table(1).num_tokens(), 17);
}

TEST(KVCacheManager, ForkSharesBlocksAndCopiesThePartialBlockOnWrite) {
  KVCacheManager kv(8);
  const auto prompt = tokens(20);
  add_computed(kv, 1, prompt);
  kv.fork_sequence(1, 2);
  const BlockId full = kv.block_table(1).blocks()[0];
  const BlockId partial = kv.block_table(1).blocks()[1];
  EXPECT_EQ(kv.pool().ref_count(full), 2);
  EXPECT_EQ(kv.pool().ref_count(partial), 2);
  EXPECT_EQ(kv.usage().used_blocks, 2);

  EXPECT_EQ(kv.num_blocks_needed(2, 1), 1);  // the copy
  ASSERT_TRUE(kv.allocate_slots(2, 1));
  const BlockId copy = kv.block_table(2).blocks()[1];
  EXPECT_NE(copy, partial);
  EXPECT_EQ(kv.block_table(2).blocks()[0], full);
  EXPECT_EQ(kv.take_block_copies(), (std::vector<BlockCopy>{{partial, copy}}));
  EXPECT_TRUE(kv.take_block_copies().empty());

  // The parent is now the only holder of its partial block: no copy needed.
  EXPECT_EQ(kv.num_blocks_needed(1, 1), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 1));
  EXPECT_EQ(kv.block_table(1).blocks()[1], partial);
  EXPECT_TRUE(kv.take_block_copies().empty());

  kv.free_sequence(1);
  kv.free_sequence(2);
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

TEST(KVCacheManager, ForkOfABlockAlignedSequenceNeedsNoCopy) {
  KVCacheManager kv(8);
  add_computed(kv, 1, tokens(32));
  kv.fork_sequence(1, 2);
  EXPECT_EQ(kv.num_blocks_needed(2, 1), 1);  // a fresh block, not a copy
  ASSERT_TRUE(kv.allocate_slots(2, 1));
  EXPECT_TRUE(kv.take_block_copies().empty());
}

TEST(KVCacheManager, CacheSaltKeepsTenantsApart) {
  KVCacheManager kv(16);
  const auto prompt = tokens(40);
  const uint64_t salt_a = cache_salt_key("a");
  const PrefixMatch m = kv.match_prefix(prompt, salt_a);
  ASSERT_TRUE(kv.add_sequence(1, m, 40));
  kv.cache_full_blocks(1, prompt);
  EXPECT_EQ(kv.match_prefix(prompt, salt_a).num_cached_tokens, 32);
  EXPECT_EQ(kv.match_prefix(prompt, cache_salt_key("b")).num_cached_tokens, 0);
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 0);
}

TEST(KVCacheManager, StaleMatchIsRejected) {
  KVCacheManager kv(3);
  const auto prompt = tokens(40);
  add_computed(kv, 1, prompt);
  kv.free_sequence(1);
  const PrefixMatch match = kv.match_prefix(prompt);
  ASSERT_EQ(match.num_cached_tokens, 32);
  ASSERT_TRUE(kv.add_sequence(2, PrefixMatch{}, 48));  // evicts every cached block
  kv.free_sequence(2);
  EXPECT_THROW(kv.add_sequence(3, match, 8), PagingError);
  EXPECT_FALSE(kv.has_sequence(3));
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

TEST(KVCacheManager, BadCallsAreClearErrorsAndLeaveThePoolIntact) {
  KVCacheManager kv(4);
  ASSERT_TRUE(kv.add_sequence(1, PrefixMatch{}, 20));
  const KVCacheUsage before = kv.usage();
  EXPECT_THROW(kv.allocate_slots(99, 1), PagingError);
  EXPECT_THROW(kv.block_table(99), PagingError);
  EXPECT_THROW(kv.add_sequence(1, PrefixMatch{}, 1), PagingError);   // id taken
  EXPECT_THROW(kv.add_sequence(2, PrefixMatch{}, 65), PagingError);  // larger than the pool
  EXPECT_THROW(kv.allocate_slots(1, 100), PagingError);              // would outgrow the pool
  EXPECT_THROW(kv.allocate_slots(1, -1), PagingError);
  EXPECT_THROW(kv.fork_sequence(99, 3), PagingError);
  EXPECT_THROW(kv.fork_sequence(1, 1), PagingError);
  EXPECT_THROW(kv.cache_full_blocks(1, tokens(21)), PagingError);  // more than it holds
  kv.free_sequence(1);
  try {
    kv.free_sequence(1);
    FAIL() << "double free accepted";
  } catch (const PagingError& e) {
    EXPECT_NE(std::string(e.what()).find("freed already"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_EQ(kv.usage().free_blocks + kv.usage().cached_free_blocks, before.total_blocks);
}

TEST(KVCacheManager, ResetPrefixCacheForgetsCachedBlocks) {
  KVCacheManager kv(8);
  const auto prompt = tokens(40);
  add_computed(kv, 1, prompt);
  add_computed(kv, 2, tokens(40, 1000));
  kv.free_sequence(2);
  EXPECT_EQ(kv.usage().cached_free_blocks, 2);
  EXPECT_EQ(kv.reset_prefix_cache(), 4);
  EXPECT_EQ(kv.usage().cached_free_blocks, 0);
  EXPECT_EQ(kv.usage().used_blocks, 3);  // sequence 1 keeps its blocks
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 0);
}

TEST(KVCacheManager, WithoutPrefixCachingNothingIsShared) {
  KVCacheManager kv(8, /*enable_prefix_caching=*/false);
  const auto prompt = tokens(40);
  add_computed(kv, 1, prompt);
  EXPECT_EQ(kv.match_prefix(prompt).num_cached_tokens, 0);
  kv.free_sequence(1);
  EXPECT_EQ(kv.usage().free_blocks, 8);
}

TEST(KVCacheManager, SlidingWindowReleasesBlocksNoQueryWillRead) {
  KVCacheManager kv(8, /*enable_prefix_caching=*/false);
  ASSERT_TRUE(kv.add_sequence(1, PrefixMatch{}, 50));  // blocks for positions 0..63
  // The next query is at position 50; with a window of 20 it reads positions 31..50.
  EXPECT_EQ(kv.release_blocks_before(1, 50 - 20 + 1), 1);  // block 0 (positions 0..15)
  const BlockTable& table = kv.block_table(1);
  EXPECT_EQ(table.blocks()[0], kNoBlock);
  EXPECT_NE(table.blocks()[1], kNoBlock);
  EXPECT_THROW(table.slot(15), PagingError);
  EXPECT_NO_THROW(table.slot(16));
  EXPECT_EQ(kv.usage().used_blocks, 3);
  EXPECT_EQ(kv.release_blocks_before(1, 31), 0);  // idempotent
  // Decoding goes on: the cache stops growing once the window slides.
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE(kv.allocate_slots(1, 1));
    kv.release_blocks_before(1, kv.block_table(1).num_tokens() - 20);
    ASSERT_LE(kv.usage().used_blocks, 3);
  }
  kv.free_sequence(1);
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

TEST(KVCacheManager, SlidingWindowKeepsTheLastBlock) {
  KVCacheManager kv(4, /*enable_prefix_caching=*/false);
  ASSERT_TRUE(kv.add_sequence(1, PrefixMatch{}, 32));
  EXPECT_EQ(kv.release_blocks_before(1, 1000), 1);
  EXPECT_NE(kv.block_table(1).blocks()[1], kNoBlock);
}

TEST(KVCacheManager, SlidingWindowTakesOnlyTheMatchedBlocksItsWindowReads) {
  KVCacheManager kv(12);  // 192 tokens
  // 11 full blocks (176 tokens) computed, cached, and left cached-free.
  const auto prompt = tokens(200);
  const std::vector<TokenId> head(prompt.begin(), prompt.begin() + 180);
  add_computed(kv, 1, head);
  kv.free_sequence(1);
  const PrefixMatch match = kv.match_prefix(prompt);
  ASSERT_EQ(match.num_cached_tokens, 176);
  // All 24 remaining tokens at once: 200 tokens, more than the pool holds...
  EXPECT_FALSE(kv.can_add_sequence(match, 24));
  EXPECT_THROW(kv.add_sequence(2, match, 24), PagingError);
  // ...but with a window of 24 the query at 176 reads from 153 on: blocks 0..8 are behind.
  const int32_t first_needed = 176 - 24 + 1;
  EXPECT_TRUE(kv.can_add_sequence(match, 24, first_needed));
  ASSERT_TRUE(kv.add_sequence(2, match, 24, false, first_needed));
  const auto table = kv.block_table(2).blocks();
  ASSERT_EQ(table.size(), 13u);
  for (int i = 0; i < 9; ++i)
    EXPECT_EQ(table[i], kNoBlock) << i;
  EXPECT_EQ(table[9], match.blocks[9]);
  EXPECT_EQ(table[10], match.blocks[10]);
  EXPECT_EQ(kv.usage().used_blocks, 4);  // blocks 9 and 10 shared, 11 and 12 new
  EXPECT_EQ(kv.usage().prefix_hit_tokens, 176);
  // The blocks left out stay cached-free, reclaimable (the new blocks took one of them);
  // the table's hashes go on from the match, so the new full block joins the cache.
  EXPECT_EQ(kv.usage().cached_free_blocks, 8);
  const std::vector<TokenId> computed(prompt.begin(), prompt.begin() + 192);
  kv.cache_full_blocks(2, computed);
  const BlockId full = kv.block_table(2).blocks()[11];
  ASSERT_TRUE(kv.prefix_cache().contains(full));
  EXPECT_EQ(kv.prefix_cache().hash_of(full),
            hash_block(match.hashes.back(), std::span(computed).subspan(176, 16), 0));
  kv.free_sequence(2);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_EQ(kv.usage().cached_free_blocks + kv.usage().free_blocks, 12);
}

TEST(KVCacheManager, SlidingWindowNeverLeavesOutTheBlockThatTakesNewTokens) {
  KVCacheManager kv(8);
  const auto prompt = tokens(33);
  add_computed(kv, 1, prompt);
  const PrefixMatch match = kv.match_prefix(prompt);  // blocks 0 and 1
  ASSERT_EQ(match.num_cached_tokens, 32);
  ASSERT_TRUE(kv.add_sequence(2, match, 0, false, 1000));
  const auto table = kv.block_table(2).blocks();
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0], kNoBlock);
  EXPECT_EQ(table[1], match.blocks[1]);
}

}  // namespace
}  // namespace pagellm::paging
