// build_forward_batch: one step's flat batch from scheduled chunks and their page tables.

#include "engine/forward_batch_builder.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pagellm::engine {
namespace {

std::vector<int32_t> iota(int32_t n, int32_t from) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A 20-token prompt's first chunk of 18 tokens beside a sequence decoding its 35th token:
//
//   seq 1  [  0 .. 17 ]  positions 0-17, slots in its blocks 0-1, no logits (mid-prompt)
//   seq 2  [ 34 ]        position 34, its third block, logits wanted
TEST(ForwardBatchBuilder, FlattensChunksInOrder) {
  paging::KVCacheManager kv(16, /*enable_prefix_caching=*/false);
  const std::vector<int32_t> prompt = iota(20, 100);
  const std::vector<int32_t> decoding = iota(35, 500);
  ASSERT_TRUE(kv.add_sequence(2, paging::PrefixMatch{}, 34));
  ASSERT_TRUE(kv.allocate_slots(2, 1));
  ASSERT_TRUE(kv.add_sequence(1, paging::PrefixMatch{}, 18));
  const ScheduledChunk chunks[] = {{1, prompt, 0, 18, false}, {2, decoding, 34, 1, true}};
  ForwardBatch b;
  build_forward_batch(chunks, kv, {}, b);

  ASSERT_EQ(b.num_tokens(), 19);
  ASSERT_EQ(b.num_seqs(), 2);
  std::vector<int32_t> ids = iota(18, 100);
  ids.push_back(534);
  EXPECT_EQ(b.token_ids, ids);
  std::vector<int32_t> positions = iota(18, 0);
  positions.push_back(34);
  EXPECT_EQ(b.positions, positions);
  const auto& t1 = kv.block_table(1).blocks();
  const auto& t2 = kv.block_table(2).blocks();
  ASSERT_EQ(t1.size(), 2u);
  ASSERT_EQ(t2.size(), 3u);
  for (int32_t i = 0; i < 18; ++i)
    EXPECT_EQ(b.slots[i], int64_t(t1[i / 16]) * 16 + i % 16) << i;
  EXPECT_EQ(b.slots[18], int64_t(t2[2]) * 16 + 2);
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 18, 19}));
  EXPECT_EQ(b.context_lens, (std::vector<int32_t>{18, 35}));
  EXPECT_EQ(b.max_blocks_per_seq, 3);
  EXPECT_EQ(b.block_tables, (std::vector<int32_t>{t1[0], t1[1], -1, t2[0], t2[1], t2[2]}));
  EXPECT_EQ(b.logit_rows, (std::vector<int32_t>{18}));
  EXPECT_TRUE(b.copy_src.empty() && b.copy_dst.empty());
}

// A reused batch keeps nothing of its last step, the fields its caller fills per row
// included: a backend must not apply the last step's penalties to this one's rows.
TEST(ForwardBatchBuilder, ClearsEveryFieldOfTheLastStep) {
  paging::KVCacheManager kv(8, /*enable_prefix_caching=*/false);
  const std::vector<int32_t> tokens = iota(5, 7);
  ASSERT_TRUE(kv.add_sequence(1, paging::PrefixMatch{}, 5));
  ForwardBatch b;
  b.token_ids = {1, 2, 3};
  b.positions = {9, 9, 9};
  b.slots = {5, 6, 7};
  b.query_start = {0, 1, 3};
  b.context_lens = {40, 41};
  b.block_tables = {1, 2, 3, 4};
  b.max_blocks_per_seq = 2;
  b.logit_rows = {0, 2};
  b.copy_src = {4};
  b.copy_dst = {5};
  b.host_logits = {1, 0};
  b.sampling.resize(2);
  b.penalty_rows.resize(2);
  b.penalty_tokens.resize(9);
  const ScheduledChunk chunk{1, tokens, 0, 5, true};
  build_forward_batch({&chunk, 1}, kv, {}, b);
  EXPECT_EQ(b.token_ids, tokens);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  ASSERT_EQ(b.slots.size(), 5u);
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(b.context_lens, (std::vector<int32_t>{5}));
  EXPECT_EQ(b.max_blocks_per_seq, 1);
  EXPECT_EQ(b.block_tables, (std::vector<int32_t>{kv.block_table(1).blocks()[0]}));
  EXPECT_EQ(b.logit_rows, (std::vector<int32_t>{4}));
  EXPECT_TRUE(b.copy_src.empty() && b.copy_dst.empty());
  EXPECT_TRUE(b.host_logits.empty());
  EXPECT_TRUE(b.sampling.empty());
  EXPECT_TRUE(b.penalty_rows.empty());
  EXPECT_TRUE(b.penalty_tokens.empty());
}

// Sampling rows go only where one row is drawn, penalty rows only where one row lists a
// token; otherwise the backend would do work that changes nothing.
TEST(ForwardBatchBuilder, DropsRowFieldsThatChangeNothing) {
  ForwardBatch b;
  b.sampling.resize(3);  // temperature 0: every row's token is its argmax
  b.penalty_rows = {{0, 0, 1.2f}, {0, 0}, {0, 0, 1.0f, 0.5f}};  // penalties, nothing listed yet
  drop_unused_row_fields(b);
  EXPECT_TRUE(b.sampling.empty());
  EXPECT_TRUE(b.penalty_rows.empty());

  b.sampling.resize(3);
  b.sampling[1].temperature = 0.7f;
  b.penalty_rows = {{0, 0}, {0, 1, 1.2f}, {1, 1}};
  b.penalty_tokens = {{5, 1, 0.0f, 0}};
  drop_unused_row_fields(b);
  EXPECT_EQ(b.sampling.size(), 3u);
  EXPECT_EQ(b.penalty_rows.size(), 3u);
  EXPECT_EQ(b.penalty_tokens.size(), 1u);
}

TEST(ForwardBatchBuilder, HostRowsAndTheRowFieldsCheck) {
  ForwardBatch b;
  b.logit_rows = {0, 1};
  check_row_fields(b);  // all empty: fine
  b.penalty_tokens = {{5, 1, 0.0f, 0}};
  append_host_row(b);
  EXPECT_EQ(b.host_logits, std::vector<uint8_t>{1});
  EXPECT_EQ(b.sampling.size(), 1u);
  EXPECT_EQ(b.sampling[0].temperature, 0.0f);
  ASSERT_EQ(b.penalty_rows.size(), 1u);
  EXPECT_EQ(b.penalty_rows[0].begin, 1);
  EXPECT_EQ(b.penalty_rows[0].end, 1);
  EXPECT_THROW(check_row_fields(b), std::logic_error);  // one row of fields, two logit rows
  append_host_row(b);
  check_row_fields(b);
  b.host_logits.push_back(0);
  EXPECT_THROW(check_row_fields(b), std::logic_error);
}

}  // namespace
}  // namespace pagellm::engine
