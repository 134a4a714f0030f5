#pragma once
// Vocabulary shared by the paging classes: ids, the block size, the error type.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace pagellm::paging {

// Tokens per KV block. Fixed: kernels, page tables and the prefix hash all assume it.
inline constexpr int32_t kBlockSize = 16;

using BlockId = int32_t;
using TokenId = int32_t;
using SeqId = int64_t;
// A token's place in the KV pool: block_id * kBlockSize + offset within the block.
using SlotId = int64_t;

inline constexpr BlockId kNoBlock = -1;

// Thrown for calls that break a paging contract (unknown sequence, double free,
// a request larger than the pool). The object is left exactly as it was.
class PagingError : public std::logic_error {
 public:
  explicit PagingError(const std::string& what) : std::logic_error(what) {}
};

// Blocks needed to hold `num_tokens` tokens.
constexpr int32_t blocks_for_tokens(int64_t num_tokens) {
  return static_cast<int32_t>((num_tokens + kBlockSize - 1) / kBlockSize);
}

}  // namespace pagellm::paging
