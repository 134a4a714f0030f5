#pragma once
// Builds the ForwardBatch of one step from the scheduled sequences and their page tables.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/llama_model.h"
#include "paging/kv_cache_manager.h"

namespace pagellm::engine {

// One scheduled sequence: compute tokens [num_computed, num_computed + num_new) of
// `tokens`, whose slots are already allocated in the KVCacheManager.
struct ScheduledChunk {
  paging::SeqId id;
  std::span<const int32_t> tokens;  // the sequence so far (prompt + output)
  int32_t num_computed = 0;
  int32_t num_new = 0;
  bool wants_logits = false;  // the chunk ends at the last token: sample after it
};

// Fills `out` (cleared first): token ids, positions, slots, query offsets, context
// lengths, block tables and the rows to take logits from, in the order of `chunks`,
// plus the copy-on-write block copies to perform first. The per-row sampling fields
// (host_logits, sampling, penalties) are left empty: every row's logits reach the host
// and the backend applies nothing to them.
void build_forward_batch(std::span<const ScheduledChunk> chunks, const paging::KVCacheManager& kv,
                         std::span<const paging::BlockCopy> copies, ForwardBatch& out);

// Empties the per-row fields that would change nothing, so that the backend skips their
// work: `sampling` when no row is drawn (temperature > 0), the penalty rows when no row
// lists a token (apply_penalties changes listed logits only).
void drop_unused_row_fields(ForwardBatch& batch);

// Appends a logit row the host samples itself: its logits come back, and the backend
// neither draws from them nor applies penalties to them.
void append_host_row(ForwardBatch& batch);

// Throws std::logic_error unless each per-row field (host_logits, sampling, penalty_rows)
// is empty or holds one entry per logit row: what a backend checks before its work.
void check_row_fields(const ForwardBatch& batch);

}  // namespace pagellm::engine
