#include "paging/block_table.h"

#include <gtest/gtest.h>

namespace pagellm::paging {
namespace {

TEST(BlockTable, SlotIsBlockIdTimesBlockSizePlusOffset) {
  BlockTable table;
  table.append_block(7);
  table.append_block(2);
  table.set_num_tokens(20);
  EXPECT_EQ(table.slot(0), 7 * 16);
  EXPECT_EQ(table.slot(15), 7 * 16 + 15);
  EXPECT_EQ(table.slot(16), 2 * 16);
  EXPECT_EQ(table.slot(19), 2 * 16 + 3);
  EXPECT_EQ(table.capacity(), 32);
  EXPECT_EQ(table.free_slots_in_last_block(), 12);
}

TEST(BlockTable, AppendSlotsGivesTheStepSlotMapping) {
  BlockTable table;
  table.append_block(3);
  table.append_block(9);
  table.set_num_tokens(18);
  std::vector<SlotId> slots;
  table.append_slots(14, 18, slots);
  EXPECT_EQ(slots, (std::vector<SlotId>{3 * 16 + 14, 3 * 16 + 15, 9 * 16, 9 * 16 + 1}));
}

TEST(BlockTable, TokensWithoutSlotsAreErrors) {
  BlockTable table;
  table.append_block(1);
  table.set_num_tokens(5);
  EXPECT_THROW(table.slot(5), PagingError);
  EXPECT_THROW(table.slot(-1), PagingError);
  std::vector<SlotId> slots;
  EXPECT_THROW(table.append_slots(3, 6, slots), PagingError);
  EXPECT_THROW(table.set_num_tokens(17), PagingError);
  EXPECT_EQ(table.num_tokens(), 5);
}

TEST(BlockTable, BlocksForTokensRoundsUp) {
  EXPECT_EQ(blocks_for_tokens(0), 0);
  EXPECT_EQ(blocks_for_tokens(1), 1);
  EXPECT_EQ(blocks_for_tokens(16), 1);
  EXPECT_EQ(blocks_for_tokens(17), 2);
}

}  // namespace
}  // namespace pagellm::paging
