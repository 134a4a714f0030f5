#include "paging/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace pagellm::paging {
namespace {

std::vector<TokenId> block_of(TokenId first) {
  std::vector<TokenId> tokens(kBlockSize);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST(BlockHashTest, DependsOnParentTokensAndExtraKey) {
  const auto tokens = block_of(100);
  const BlockHash h = hash_block(kRootBlockHash, tokens, 0);
  EXPECT_EQ(h, hash_block(kRootBlockHash, tokens, 0));
  EXPECT_NE(h, hash_block(BlockHash{1, 0}, tokens, 0));
  EXPECT_NE(h, hash_block(kRootBlockHash, tokens, cache_salt_key("tenant-a")));
  auto other = tokens;
  other[15] += 1;
  EXPECT_NE(h, hash_block(kRootBlockHash, other, 0));
  EXPECT_EQ(cache_salt_key(""), 0u);
  EXPECT_NE(cache_salt_key("a"), cache_salt_key("b"));
}

TEST(BlockHashTest, OnlyFullBlocksAreHashed) {
  std::vector<TokenId> partial(kBlockSize - 1, 1);
  EXPECT_THROW(hash_block(kRootBlockHash, partial, 0), PagingError);
}

TEST(PrefixCacheTest, MatchWalksTheLongestChain) {
  PrefixCache cache(8);
  std::vector<TokenId> prompt;
  for (int b = 0; b < 3; ++b) {
    const auto block = block_of(b * 16);
    prompt.insert(prompt.end(), block.begin(), block.end());
  }
  BlockHash parent = kRootBlockHash;
  // Cache blocks 0 and 1 of the prompt in blocks 5 and 2; block 2 of the prompt is not cached.
  const BlockId ids[] = {5, 2};
  for (int b = 0; b < 2; ++b) {
    const std::span<const TokenId> tokens(prompt.data() + b * 16, 16);
    const BlockHash h = hash_block(parent, tokens, 0);
    ASSERT_TRUE(cache.insert(ids[b], h, parent, tokens, 0));
    parent = h;
  }
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  cache.match(prompt, 0, 10, blocks, hashes);
  EXPECT_EQ(blocks, (std::vector<BlockId>{5, 2}));
  EXPECT_EQ(hashes.size(), 2u);

  blocks.clear();
  hashes.clear();
  cache.match(prompt, 0, 1, blocks, hashes);  // capped
  EXPECT_EQ(blocks, std::vector<BlockId>{5});

  blocks.clear();
  cache.match(prompt, cache_salt_key("other tenant"), 10, blocks, hashes);
  EXPECT_TRUE(blocks.empty());

  // A different first block breaks the chain even if later blocks are equal.
  auto changed = prompt;
  changed[0] = 999;
  blocks.clear();
  cache.match(changed, 0, 10, blocks, hashes);
  EXPECT_TRUE(blocks.empty());
}

TEST(PrefixCacheTest, HitsAreVerifiedAgainstTheStoredTokens) {
  PrefixCache cache(4);
  const auto tokens = block_of(0);
  const BlockHash h = hash_block(kRootBlockHash, tokens, 0);
  // Register block 1 under h but with other tokens, as a hash collision would.
  const auto impostor = block_of(500);
  ASSERT_TRUE(cache.insert(1, h, kRootBlockHash, impostor, 0));
  EXPECT_EQ(cache.find(h, kRootBlockHash, tokens, 0), kNoBlock);
  EXPECT_EQ(cache.find(h, kRootBlockHash, impostor, 0), 1);
  EXPECT_EQ(cache.find(h, BlockHash{7, 7}, impostor, 0), kNoBlock);  // parent differs
  EXPECT_EQ(cache.find(h, kRootBlockHash, impostor, 3), kNoBlock);   // extra key differs
}

TEST(PrefixCacheTest, FirstCopyStaysTheSharedOne) {
  PrefixCache cache(4);
  const auto tokens = block_of(0);
  const BlockHash h = hash_block(kRootBlockHash, tokens, 0);
  EXPECT_TRUE(cache.insert(0, h, kRootBlockHash, tokens, 0));
  EXPECT_FALSE(cache.insert(3, h, kRootBlockHash, tokens, 0));  // same content elsewhere
  EXPECT_FALSE(cache.insert(0, h, kRootBlockHash, tokens, 0));  // already registered
  EXPECT_EQ(cache.size(), 1);
  EXPECT_FALSE(cache.contains(3));
  EXPECT_THROW(cache.insert(9, h, kRootBlockHash, tokens, 0), PagingError);
}

TEST(PrefixCacheTest, EraseKeepsOtherEntriesFindable) {
  // Many entries in a small table force long probe runs; erasing from the middle of a
  // run must not hide the entries after it.
  constexpr int kBlocks = 512;
  PrefixCache cache(kBlocks);
  std::vector<BlockHash> hashes(kBlocks);
  std::vector<std::vector<TokenId>> contents(kBlocks);
  for (BlockId b = 0; b < kBlocks; ++b) {
    contents[b] = block_of(b * 16);
    hashes[b] = hash_block(kRootBlockHash, contents[b], 0);
    ASSERT_TRUE(cache.insert(b, hashes[b], kRootBlockHash, contents[b], 0));
  }
  std::mt19937 rng(7);
  std::vector<BlockId> order(kBlocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<bool> present(kBlocks, true);
  for (int i = 0; i < kBlocks; ++i) {
    const BlockId victim = order[i];
    ASSERT_TRUE(cache.erase(victim));
    EXPECT_FALSE(cache.erase(victim));
    present[victim] = false;
    if (i % 37 == 0) {
      for (BlockId b = 0; b < kBlocks; ++b) {
        const BlockId found = cache.find(hashes[b], kRootBlockHash, contents[b], 0);
        ASSERT_EQ(found, present[b] ? b : kNoBlock) << "block " << b << " after " << i;
      }
    }
  }
  EXPECT_EQ(cache.size(), 0);
}

TEST(PrefixCacheTest, ClearDropsEverything) {
  PrefixCache cache(2);
  const auto tokens = block_of(0);
  const BlockHash h = hash_block(kRootBlockHash, tokens, 0);
  cache.insert(0, h, kRootBlockHash, tokens, 0);
  cache.clear();
  EXPECT_EQ(cache.size(), 0);
  EXPECT_EQ(cache.find(h, kRootBlockHash, tokens, 0), kNoBlock);
  EXPECT_THROW(cache.hash_of(0), PagingError);
}

}  // namespace
}  // namespace pagellm::paging
