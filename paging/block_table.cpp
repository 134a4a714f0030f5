#include "paging/block_table.h"

#include <string>

namespace pagellm::paging {

SlotId BlockTable::slot(int32_t token_index) const {
  if (token_index < 0 || token_index >= num_tokens_) {
    throw PagingError("token " + std::to_string(token_index) + " has no slot (sequence holds " +
                      std::to_string(num_tokens_) + " tokens)");
  }
  const BlockId block = blocks_[token_index / kBlockSize];
  if (block == kNoBlock) {
    throw PagingError("token " + std::to_string(token_index) +
                      " is outside the attention window: its block was released");
  }
  return static_cast<SlotId>(block) * kBlockSize + token_index % kBlockSize;
}

void BlockTable::append_slots(int32_t begin, int32_t end, std::vector<SlotId>& out) const {
  if (begin < 0 || begin > end || end > num_tokens_) {
    throw PagingError("slot range [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside the sequence's " + std::to_string(num_tokens_) + " tokens");
  }
  out.reserve(out.size() + (end - begin));
  for (int32_t i = begin; i < end; ++i) {
    const BlockId block = blocks_[i / kBlockSize];
    if (block == kNoBlock) slot(i);  // throws with the reason
    out.push_back(static_cast<SlotId>(block) * kBlockSize + i % kBlockSize);
  }
}

void BlockTable::set_num_tokens(int32_t num_tokens) {
  if (num_tokens < 0 || num_tokens > capacity()) {
    throw PagingError("token count " + std::to_string(num_tokens) + " does not fit in " +
                      std::to_string(num_blocks()) + " blocks");
  }
  num_tokens_ = num_tokens;
}

}  // namespace pagellm::paging
