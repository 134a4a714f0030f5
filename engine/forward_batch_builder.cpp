#include "engine/forward_batch_builder.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pagellm::engine {

void build_forward_batch(std::span<const ScheduledChunk> chunks, const paging::KVCacheManager& kv,
                         std::span<const paging::BlockCopy> copies, ForwardBatch& out) {
  out.token_ids.clear();
  out.positions.clear();
  out.slots.clear();
  out.query_start.assign(1, 0);
  out.context_lens.clear();
  out.logit_rows.clear();
  out.copy_src.clear();
  out.copy_dst.clear();
  // How each row's token is picked is the caller's to fill (Engine::step).
  out.host_logits.clear();
  out.sampling.clear();
  out.penalty_rows.clear();
  out.penalty_tokens.clear();
  int32_t max_blocks = 0;
  for (const ScheduledChunk& c : chunks) {
    max_blocks = std::max(max_blocks, kv.block_table(c.id).num_blocks());
  }
  out.max_blocks_per_seq = max_blocks;
  out.block_tables.assign(chunks.size() * static_cast<size_t>(max_blocks), -1);

  for (size_t s = 0; s < chunks.size(); ++s) {
    const ScheduledChunk& c = chunks[s];
    const paging::BlockTable& table = kv.block_table(c.id);
    const int32_t end = c.num_computed + c.num_new;
    if (c.num_new <= 0 || end > static_cast<int32_t>(c.tokens.size()) || end > table.num_tokens()) {
      throw std::logic_error("sequence " + std::to_string(c.id) + ": chunk [" +
                             std::to_string(c.num_computed) + ", " + std::to_string(end) +
                             ") has no slots or tokens");
    }
    for (int32_t i = c.num_computed; i < end; ++i) {
      out.token_ids.push_back(c.tokens[i]);
      out.positions.push_back(i);
    }
    table.append_slots(c.num_computed, end, out.slots);
    out.query_start.push_back(static_cast<int32_t>(out.token_ids.size()));
    out.context_lens.push_back(end);
    std::copy(table.blocks().begin(), table.blocks().end(),
              out.block_tables.begin() + s * static_cast<size_t>(max_blocks));
    if (c.wants_logits) out.logit_rows.push_back(static_cast<int32_t>(out.token_ids.size()) - 1);
  }
  for (const paging::BlockCopy& copy : copies) {
    out.copy_src.push_back(copy.src);
    out.copy_dst.push_back(copy.dst);
  }
}

void drop_unused_row_fields(ForwardBatch& batch) {
  if (std::none_of(batch.sampling.begin(), batch.sampling.end(),
                   [](const RowSampling& row) { return row.temperature > 0.0f; })) {
    batch.sampling.clear();
  }
  if (batch.penalty_tokens.empty()) batch.penalty_rows.clear();
}

void append_host_row(ForwardBatch& batch) {
  const auto end = static_cast<int32_t>(batch.penalty_tokens.size());
  batch.host_logits.push_back(1);
  batch.sampling.emplace_back();
  batch.penalty_rows.push_back({end, end});
}

void check_row_fields(const ForwardBatch& batch) {
  auto per_row = [&](size_t n) { return n == 0 || n == batch.logit_rows.size(); };
  if (!per_row(batch.host_logits.size()) || !per_row(batch.sampling.size()) ||
      !per_row(batch.penalty_rows.size())) {
    throw std::logic_error("per-row fields do not match the logit rows");
  }
}

}  // namespace pagellm::engine
