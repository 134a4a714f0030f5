#include "paging/kv_cache_manager.h"

#include <algorithm>
#include <string>

namespace pagellm::paging {

KVCacheManager::KVCacheManager(int32_t num_blocks, bool enable_prefix_caching)
    : pool_(num_blocks), prefix_cache_(num_blocks), enable_prefix_caching_(enable_prefix_caching) {}

KVCacheManager::Sequence& KVCacheManager::get(SeqId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) throw PagingError("unknown sequence " + std::to_string(id));
  return it->second;
}

const KVCacheManager::Sequence& KVCacheManager::get(SeqId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) throw PagingError("unknown sequence " + std::to_string(id));
  return it->second;
}

void KVCacheManager::check_fits_pool(int64_t num_blocks) const {
  if (num_blocks > pool_.num_blocks()) {
    throw PagingError("a sequence that holds " + std::to_string(num_blocks) +
                      " blocks can never fit: the whole pool has " +
                      std::to_string(pool_.num_blocks()) + " (" +
                      std::to_string(int64_t(pool_.num_blocks()) * kBlockSize) + " tokens)");
  }
}

bool KVCacheManager::allocate_blocks(int32_t count, std::vector<BlockId>& out) {
  scratch_evicted_.clear();
  if (!pool_.allocate(count, out, scratch_evicted_)) return false;
  for (BlockId b : scratch_evicted_)
    prefix_cache_.erase(b);
  return true;
}

PrefixMatch KVCacheManager::match_prefix(std::span<const TokenId> prompt,
                                         uint64_t extra_key) const {
  PrefixMatch match;
  match.num_query_tokens = static_cast<int32_t>(prompt.size());
  match.extra_key = extra_key;
  if (!enable_prefix_caching_ || prompt.empty()) return match;
  const int32_t max_blocks = static_cast<int32_t>((prompt.size() - 1) / kBlockSize);
  prefix_cache_.match(prompt, extra_key, max_blocks, match.blocks, match.hashes);
  match.num_cached_tokens = static_cast<int32_t>(match.blocks.size()) * kBlockSize;
  return match;
}

int32_t KVCacheManager::blocks_behind_window(const PrefixMatch& match, int32_t num_new_tokens,
                                             int32_t first_needed_position) {
  if (first_needed_position <= 0) return 0;
  // Never the last block of the table, which receives the new tokens (as
  // release_blocks_before keeps it).
  const int32_t table_blocks = blocks_for_tokens(int64_t(match.num_cached_tokens) + num_new_tokens);
  return std::min({first_needed_position / kBlockSize, static_cast<int32_t>(match.blocks.size()),
                   table_blocks - 1});
}

bool KVCacheManager::can_add_sequence(const PrefixMatch& match, int32_t num_new_tokens,
                                      int32_t first_needed_position) const {
  if (num_new_tokens < 0) return false;
  const int64_t total = static_cast<int64_t>(match.num_cached_tokens) + num_new_tokens;
  const int32_t skipped = blocks_behind_window(match, num_new_tokens, first_needed_position);
  if (blocks_for_tokens(total) - skipped > pool_.num_blocks()) return false;
  const int32_t needed = blocks_for_tokens(total) - static_cast<int32_t>(match.blocks.size());
  // Matched blocks that are cached-free leave the reclaimable set when taken.
  int32_t revived = 0;
  for (size_t i = skipped; i < match.blocks.size(); ++i)
    revived += pool_.ref_count(match.blocks[i]) == 0 ? 1 : 0;
  return needed <= pool_.num_available() - revived;
}

bool KVCacheManager::add_sequence(SeqId id, const PrefixMatch& match, int32_t num_new_tokens,
                                  bool resumed, int32_t first_needed_position) {
  if (sequences_.count(id)) throw PagingError("sequence " + std::to_string(id) + " already exists");
  if (num_new_tokens < 0) throw PagingError("cannot add a negative number of tokens");
  if (match.blocks.size() != match.hashes.size() ||
      match.num_cached_tokens != static_cast<int32_t>(match.blocks.size()) * kBlockSize) {
    throw PagingError("malformed prefix match for sequence " + std::to_string(id));
  }
  for (size_t i = 0; i < match.blocks.size(); ++i) {
    const BlockId b = match.blocks[i];
    if (!prefix_cache_.contains(b) || !(prefix_cache_.hash_of(b) == match.hashes[i])) {
      throw PagingError("stale prefix match for sequence " + std::to_string(id) + ": block " +
                        std::to_string(b) + " no longer holds the matched tokens");
    }
  }
  const int32_t skipped = blocks_behind_window(match, num_new_tokens, first_needed_position);
  const int64_t held =
      blocks_for_tokens(static_cast<int64_t>(match.num_cached_tokens) + num_new_tokens) - skipped;
  check_fits_pool(held);
  if (!can_add_sequence(match, num_new_tokens, first_needed_position)) return false;

  Sequence seq;
  seq.extra_key = match.extra_key;
  for (size_t i = 0; i < match.blocks.size(); ++i) {
    const bool taken = static_cast<int32_t>(i) >= skipped;
    if (taken) pool_.acquire(match.blocks[i]);
    seq.table.append_block(taken ? match.blocks[i] : kNoBlock);
  }
  seq.num_released_blocks = skipped;
  const int32_t total = match.num_cached_tokens + num_new_tokens;
  scratch_blocks_.clear();
  if (!allocate_blocks(blocks_for_tokens(total) - seq.table.num_blocks(), scratch_blocks_)) {
    // Unreachable after can_add_sequence; undo rather than trust that.
    for (auto it = match.blocks.rbegin(); it != match.blocks.rend() - skipped; ++it)
      pool_.release(*it);
    return false;
  }
  for (BlockId b : scratch_blocks_)
    seq.table.append_block(b);
  seq.table.set_num_tokens(total);
  seq.num_hashed_blocks = static_cast<int32_t>(match.blocks.size());
  if (!match.hashes.empty()) seq.last_hash = match.hashes.back();
  sequences_.emplace(id, std::move(seq));
  if (!resumed) {
    prefix_query_tokens_ += match.num_query_tokens;
    prefix_hit_tokens_ += match.num_cached_tokens;
  }
  return true;
}

bool KVCacheManager::needs_copy_on_write(const Sequence& seq, int32_t num_new_tokens) const {
  if (num_new_tokens <= 0 || seq.table.num_tokens() % kBlockSize == 0) return false;
  return pool_.ref_count(seq.table.blocks().back()) > 1;
}

int32_t KVCacheManager::num_blocks_needed(SeqId id, int32_t num_new_tokens) const {
  const Sequence& seq = get(id);
  if (num_new_tokens < 0) throw PagingError("cannot allocate a negative number of tokens");
  const int64_t total = static_cast<int64_t>(seq.table.num_tokens()) + num_new_tokens;
  return blocks_for_tokens(total) - seq.table.num_blocks() +
         (needs_copy_on_write(seq, num_new_tokens) ? 1 : 0);
}

bool KVCacheManager::can_allocate_slots(SeqId id, int32_t num_new_tokens) const {
  return num_blocks_needed(id, num_new_tokens) <= pool_.num_available();
}

bool KVCacheManager::allocate_slots(SeqId id, int32_t num_new_tokens) {
  Sequence& seq = get(id);
  if (num_new_tokens < 0) throw PagingError("cannot allocate a negative number of tokens");
  if (num_new_tokens == 0) return true;
  const int32_t total = seq.table.num_tokens() + num_new_tokens;
  // Fast path of a decode step: the token fits in the sequence's own last block.
  if (total <= seq.table.capacity() && !needs_copy_on_write(seq, num_new_tokens)) {
    seq.table.set_num_tokens(total);
    return true;
  }
  const bool copy = needs_copy_on_write(seq, num_new_tokens);
  const int32_t needed = blocks_for_tokens(total) - seq.table.num_blocks() + (copy ? 1 : 0);
  // Blocks released by a sliding window do not count: such a sequence can outgrow the
  // pool's token capacity while holding only a window's worth of blocks.
  const int64_t held = seq.table.num_blocks() - seq.num_released_blocks + needed - (copy ? 1 : 0);
  check_fits_pool(held);
  scratch_blocks_.clear();
  if (!allocate_blocks(needed, scratch_blocks_)) return false;
  size_t next = 0;
  if (copy) {
    const int32_t last = seq.table.num_blocks() - 1;
    const BlockId shared = seq.table.blocks()[last];
    const BlockId own = scratch_blocks_[next++];
    seq.table.replace_block(last, own);
    pool_.release(shared);
    pending_copies_.push_back({shared, own});
  }
  for (; next < scratch_blocks_.size(); ++next)
    seq.table.append_block(scratch_blocks_[next]);
  seq.table.set_num_tokens(total);
  return true;
}

void KVCacheManager::cache_full_blocks(SeqId id, std::span<const TokenId> computed_tokens) {
  Sequence& seq = get(id);
  if (computed_tokens.size() > static_cast<size_t>(seq.table.num_tokens())) {
    throw PagingError("sequence " + std::to_string(id) + " has slots for " +
                      std::to_string(seq.table.num_tokens()) + " tokens, not " +
                      std::to_string(computed_tokens.size()));
  }
  if (!enable_prefix_caching_) return;
  const int32_t full_blocks = static_cast<int32_t>(computed_tokens.size() / kBlockSize);
  for (int32_t i = seq.num_hashed_blocks; i < full_blocks; ++i) {
    const auto tokens = computed_tokens.subspan(static_cast<size_t>(i) * kBlockSize, kBlockSize);
    const BlockHash h = hash_block(seq.last_hash, tokens, seq.extra_key);
    const BlockId block = seq.table.blocks()[i];
    if (block == kNoBlock) {  // released by the sliding window: nothing to share
      seq.last_hash = h;
      seq.num_hashed_blocks = i + 1;
      continue;
    }
    // A false insert means the block is registered already (shared with a sibling) or
    // another block holds the same content; then this one simply stays private.
    if (prefix_cache_.insert(block, h, seq.last_hash, tokens, seq.extra_key)) {
      pool_.set_cached(block, true);
    }
    seq.last_hash = h;
    seq.num_hashed_blocks = i + 1;
  }
}

int32_t KVCacheManager::release_blocks_before(SeqId id, int32_t first_needed_position) {
  Sequence& seq = get(id);
  // Keep the last block even when the window has passed it: it receives new tokens.
  const int32_t releasable =
      std::min(first_needed_position / kBlockSize, seq.table.num_blocks() - 1);
  int32_t released = 0;
  for (int32_t i = seq.num_released_blocks; i < releasable; ++i) {
    pool_.release(seq.table.blocks()[i]);
    seq.table.replace_block(i, kNoBlock);
    ++released;
  }
  seq.num_released_blocks = std::max(seq.num_released_blocks, releasable);
  return released;
}

void KVCacheManager::fork_sequence(SeqId parent, SeqId child) {
  const Sequence& source = get(parent);
  if (sequences_.count(child)) {
    throw PagingError("cannot fork into sequence " + std::to_string(child) + ": it already exists");
  }
  Sequence copy = source;
  for (BlockId b : copy.table.blocks()) {
    if (b != kNoBlock) pool_.acquire(b);
  }
  sequences_.emplace(child, std::move(copy));
}

void KVCacheManager::free_sequence(SeqId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    throw PagingError("cannot free sequence " + std::to_string(id) +
                      ": unknown (never added, or freed already)");
  }
  const auto blocks = it->second.table.blocks();
  // A copy-on-write queued for it in this step goes too: its block is about to be free,
  // and may be handed to another sequence before the copy would be made.
  std::erase_if(pending_copies_, [&](const BlockCopy& c) {
    return std::find(blocks.begin(), blocks.end(), c.dst) != blocks.end();
  });
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (*b != kNoBlock) pool_.release(*b);
  }
  sequences_.erase(it);
}

std::vector<BlockCopy> KVCacheManager::take_block_copies() {
  std::vector<BlockCopy> copies;
  copies.swap(pending_copies_);
  return copies;
}

int32_t KVCacheManager::reset_prefix_cache() {
  const int32_t dropped = prefix_cache_.size();
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (prefix_cache_.contains(b)) pool_.set_cached(b, false);
  }
  prefix_cache_.clear();
  return dropped;
}

const BlockTable& KVCacheManager::block_table(SeqId id) const {
  return get(id).table;
}

KVCacheUsage KVCacheManager::usage() const {
  KVCacheUsage u;
  u.total_blocks = pool_.num_blocks();
  u.used_blocks = pool_.num_used();
  u.cached_free_blocks = pool_.num_cached_free();
  u.free_blocks = pool_.num_free();
  u.num_sequences = num_sequences();
  u.prefix_query_tokens = prefix_query_tokens_;
  u.prefix_hit_tokens = prefix_hit_tokens_;
  return u;
}

}  // namespace pagellm::paging
