// Model-based randomized test of KVCacheManager.
//
// Tens of thousands of random operations (admit sequences whose prompts overlap, prefill
// in chunks, decode, fork, free, reset the cache, bad calls) run against the manager
// while a shadow KV pool records which token was written into every slot, as the
// forward pass would. After every operation the test checks:
//   - used + cached-free + free == total, and the pool's counts match block states;
//   - every block's ref count equals the number of page tables holding it;
//   - a cached-free block is exactly a registered prefix-cache block with ref 0;
//   - every computed token of every sequence is found in its slot of the shadow pool
//     (so prefix hits, copy-on-write and eviction never hand out the wrong content);
//   - every registered block's stored tokens equal what its slots hold;
// and at the end, with every sequence freed, nothing is in use.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "paging/kv_cache_manager.h"

namespace pagellm::paging {
namespace {

struct ModelSequence {
  std::vector<TokenId> tokens;  // every token with a slot: computed ones first
  int32_t computed = 0;         // tokens whose KV is written
  int32_t prompt_len = 0;
  int32_t released_tokens = 0;  // leading tokens whose blocks a sliding window released
};

class RandomKVCacheTest {
 public:
  RandomKVCacheTest(int32_t num_blocks, uint32_t seed, bool prefix_caching)
      : kv_(num_blocks, prefix_caching),
        rng_(seed),
        shadow_(static_cast<size_t>(num_blocks) * kBlockSize, kEmptySlot) {
    // A few shared system prompts so that admissions overlap.
    std::uniform_int_distribution<TokenId> token(0, 50);
    for (int f = 0; f < 4; ++f) {
      std::vector<TokenId> family(std::uniform_int_distribution<int>(8, 80)(rng_));
      for (auto& t : family)
        t = token(rng_);
      families_.push_back(family);
    }
  }

  void run(int steps) {
    for (int step = 0; step < steps; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 99)(rng_);
      if (op < 25) {
        admit();
      } else if (op < 70) {
        advance();
      } else if (op < 78) {
        fork();
      } else if (op < 91) {
        free_one();
      } else if (op < 95) {
        slide_window();
      } else if (op < 96) {
        kv_.reset_prefix_cache();
      } else {
        bad_call();
      }
      check("step " + std::to_string(step));
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!seqs_.empty())
      free_one();
    check("after freeing everything");
    const KVCacheUsage u = kv_.usage();
    EXPECT_EQ(u.used_blocks, 0);
    EXPECT_EQ(u.num_sequences, 0);
    EXPECT_EQ(u.free_blocks + u.cached_free_blocks, u.total_blocks);
  }

  int64_t admitted() const { return admitted_; }
  int64_t hit_tokens() const { return kv_.usage().prefix_hit_tokens; }
  int64_t copies() const { return copies_; }
  int64_t slides() const { return slides_; }
  int64_t refused() const { return refused_; }

 private:
  static constexpr TokenId kEmptySlot = -1;

  int random(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::vector<TokenId> random_prompt() {
    std::vector<TokenId> prompt;
    if (random(0, 3) > 0) {
      const auto& family = families_[random(0, static_cast<int>(families_.size()) - 1)];
      // Sometimes only part of the family prefix, sometimes with a tenant salt.
      const int keep = random(0, 4) == 0 ? random(1, static_cast<int>(family.size()))
                                         : static_cast<int>(family.size());
      prompt.assign(family.begin(), family.begin() + keep);
    }
    const int extra = random(1, 40);
    for (int i = 0; i < extra; ++i)
      prompt.push_back(random(0, 50));
    return prompt;
  }

  // The forward pass: performs pending copies, then writes KV of the new tokens.
  void compute(SeqId id, int32_t upto) {
    for (const BlockCopy& c : kv_.take_block_copies()) {
      std::copy_n(shadow_.begin() + c.src * kBlockSize, kBlockSize,
                  shadow_.begin() + c.dst * kBlockSize);
      ++copies_;
    }
    ModelSequence& s = seqs_.at(id);
    const BlockTable& table = kv_.block_table(id);
    for (int32_t i = s.computed; i < upto; ++i)
      shadow_[table.slot(i)] = s.tokens[i];
    s.computed = upto;
    kv_.cache_full_blocks(id, std::span(s.tokens).first(s.computed));
  }

  void admit() {
    ModelSequence s;
    s.tokens = random_prompt();
    s.prompt_len = static_cast<int32_t>(s.tokens.size());
    const uint64_t salt = random(0, 9) == 0 ? cache_salt_key("tenant") : 0;
    const PrefixMatch match = kv_.match_prefix(s.tokens, salt);
    ASSERT_LT(match.num_cached_tokens, s.prompt_len);
    const int32_t chunk = random(1, s.prompt_len - match.num_cached_tokens);
    const KVCacheUsage before = kv_.usage();
    const bool can = kv_.can_add_sequence(match, chunk);
    const SeqId id = next_id_++;
    const bool ok = kv_.add_sequence(id, match, chunk);
    ASSERT_EQ(ok, can);
    if (!ok) {
      ++refused_;
      ASSERT_EQ(kv_.usage().used_blocks, before.used_blocks);
      ASSERT_FALSE(kv_.has_sequence(id));
      return;
    }
    ++admitted_;
    // Only the first chunk has slots; later chunks come through advance().
    s.tokens.resize(match.num_cached_tokens + chunk);
    s.computed = match.num_cached_tokens;
    seqs_[id] = s;
    compute(id, match.num_cached_tokens + chunk);
  }

  SeqId pick() {
    auto it = seqs_.begin();
    std::advance(it, random(0, static_cast<int>(seqs_.size()) - 1));
    return it->first;
  }

  void advance() {
    if (seqs_.empty()) return;
    const SeqId id = pick();
    ModelSequence& s = seqs_.at(id);
    const int32_t n = random(0, 3) == 0 ? random(2, 40) : 1;  // a chunk or a decode token
    const int32_t needed = kv_.num_blocks_needed(id, n);
    const KVCacheUsage before = kv_.usage();
    if (static_cast<int64_t>(s.tokens.size()) + n > int64_t{kv_.pool().num_blocks()} * kBlockSize) {
      EXPECT_THROW(kv_.allocate_slots(id, n), PagingError);
      return;
    }
    const bool ok = kv_.allocate_slots(id, n);
    ASSERT_EQ(ok, needed <= before.free_blocks + before.cached_free_blocks);
    if (!ok) {
      ++refused_;
      ASSERT_EQ(kv_.usage().used_blocks, before.used_blocks);
      ASSERT_EQ(kv_.block_table(id).num_tokens(), static_cast<int32_t>(s.tokens.size()));
      return;
    }
    for (int i = 0; i < n; ++i)
      s.tokens.push_back(random(0, 50));
    compute(id, static_cast<int32_t>(s.tokens.size()));
  }

  void fork() {
    if (seqs_.empty()) return;
    const SeqId parent = pick();
    const SeqId child = next_id_++;
    kv_.fork_sequence(parent, child);
    seqs_[child] = seqs_.at(parent);
  }

  // Sliding-window attention: a window of W positions lets go of older blocks.
  void slide_window() {
    if (seqs_.empty()) return;
    const SeqId id = pick();
    ModelSequence& s = seqs_.at(id);
    const int32_t window = random(8, 64);
    const int32_t first_needed = s.computed - window + 1;
    const int32_t before = kv_.usage().used_blocks;
    const int32_t released = kv_.release_blocks_before(id, first_needed);
    ASSERT_LE(kv_.usage().used_blocks, before);
    const BlockTable& table = kv_.block_table(id);
    int32_t dropped = 0;
    while (dropped < table.num_blocks() && table.blocks()[dropped] == kNoBlock)
      ++dropped;
    ASSERT_LT(dropped, table.num_blocks()) << "the last block must survive";
    ASSERT_LE(dropped * kBlockSize, std::max({first_needed, s.released_tokens, 0}));
    ASSERT_GE(dropped * kBlockSize, s.released_tokens);
    if (released > 0) {
      EXPECT_THROW(table.slot(dropped * kBlockSize - 1), PagingError);
    }
    s.released_tokens = dropped * kBlockSize;
    ++slides_;
  }

  void free_one() {
    if (seqs_.empty()) return;
    const SeqId id = pick();
    kv_.free_sequence(id);
    seqs_.erase(id);
  }

  void bad_call() {
    const KVCacheUsage before = kv_.usage();
    const SeqId unknown = next_id_ + 1000;
    EXPECT_THROW(kv_.free_sequence(unknown), PagingError);
    EXPECT_THROW(kv_.allocate_slots(unknown, 1), PagingError);
    EXPECT_THROW(kv_.add_sequence(unknown, PrefixMatch{}, kv_.pool().num_blocks() * kBlockSize + 1),
                 PagingError);
    if (!seqs_.empty()) {
      EXPECT_THROW(kv_.fork_sequence(pick(), seqs_.begin()->first), PagingError);
    }
    const KVCacheUsage after = kv_.usage();
    EXPECT_EQ(after.used_blocks, before.used_blocks);
    EXPECT_EQ(after.cached_free_blocks, before.cached_free_blocks);
  }

  void check(const std::string& where) {
    SCOPED_TRACE(where);
    const BlockPool& pool = kv_.pool();
    const PrefixCache& cache = kv_.prefix_cache();
    std::vector<int32_t> holders(pool.num_blocks(), 0);
    for (const auto& [id, s] : seqs_) {
      const BlockTable& table = kv_.block_table(id);
      ASSERT_EQ(table.num_tokens(), static_cast<int32_t>(s.tokens.size()));
      ASSERT_EQ(table.num_blocks(), blocks_for_tokens(table.num_tokens()));
      for (BlockId b : table.blocks()) {
        if (b != kNoBlock) ++holders[b];
      }
      for (int32_t i = s.released_tokens; i < s.computed; ++i) {
        ASSERT_EQ(shadow_[table.slot(i)], s.tokens[i])
            << "sequence " << id << " token " << i << " reads the wrong KV";
      }
    }
    int32_t used = 0, cached_free = 0, free = 0;
    for (BlockId b = 0; b < pool.num_blocks(); ++b) {
      ASSERT_EQ(pool.ref_count(b), holders[b]) << "block " << b;
      switch (pool.state(b)) {
        case BlockState::kUsed:
          ++used;
          break;
        case BlockState::kCachedFree:
          ++cached_free;
          ASSERT_TRUE(cache.contains(b));
          break;
        case BlockState::kFree:
          ++free;
          ASSERT_FALSE(cache.contains(b));
          break;
      }
      ASSERT_EQ(pool.is_cached(b), cache.contains(b));
      if (cache.contains(b)) {
        const auto stored = cache.tokens_of(b);
        for (int i = 0; i < kBlockSize; ++i) {
          ASSERT_EQ(stored[i], shadow_[b * kBlockSize + i]) << "cached block " << b;
        }
      }
    }
    ASSERT_EQ(used, pool.num_used());
    ASSERT_EQ(cached_free, pool.num_cached_free());
    ASSERT_EQ(free, pool.num_free());
    ASSERT_EQ(used + cached_free + free, pool.num_blocks());
  }

  KVCacheManager kv_;
  std::mt19937 rng_;
  std::vector<TokenId> shadow_;
  std::vector<std::vector<TokenId>> families_;
  std::map<SeqId, ModelSequence> seqs_;
  SeqId next_id_ = 1;
  int64_t admitted_ = 0;
  int64_t refused_ = 0;
  int64_t copies_ = 0;
  int64_t slides_ = 0;
};

struct Config {
  int32_t num_blocks;
  uint32_t seed;
  bool prefix_caching;
};

class KVCacheManagerRandomTest : public ::testing::TestWithParam<Config> {};

TEST_P(KVCacheManagerRandomTest, InvariantsHoldAfterEveryOperation) {
  const Config c = GetParam();
  RandomKVCacheTest test(c.num_blocks, c.seed, c.prefix_caching);
  test.run(20000);
  // The run must have exercised what it claims to.
  EXPECT_GT(test.admitted(), 500);
  if (c.prefix_caching) {
    EXPECT_GT(test.hit_tokens(), 0);
  }
  EXPECT_GT(test.copies(), 0);
  EXPECT_GT(test.slides(), 0);
  if (c.num_blocks <= 32) {
    EXPECT_GT(test.refused(), 0);
  }
  RecordProperty("admitted", std::to_string(test.admitted()));
}

INSTANTIATE_TEST_SUITE_P(Pools, KVCacheManagerRandomTest,
                         ::testing::Values(Config{12, 1, true}, Config{32, 2, true},
                                           Config{128, 3, true}, Config{512, 4, true},
                                           Config{32, 5, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.num_blocks) + "_blocks_" +
                                  (info.param.prefix_caching ? "cached" : "uncached");
                         });

}  // namespace
}  // namespace pagellm::paging
