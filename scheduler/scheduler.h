#pragma once
// Scheduler: which sequences run in the next forward pass, and how many tokens each.
//
// Every step (iteration-level, continuous batching):
//   1. running sequences first, decodes before prompt chunks, in policy order; each
//      gets its KV slots from the KVCacheManager. When the pool is short, the lowest in
//      policy order among those not yet scheduled is preempted (its blocks freed,
//      recomputed later, mostly from the prefix cache). It goes back to the waiting
//      queue in policy order: under FCFS that is the head, behind only older sequences
//      preempted before it. A sequence resumed in the last steps is passed over while
//      another that comes after the one short of blocks can go.
//   2. then waiting sequences, in policy order, while the token budget, the sequence cap
//      and the pool allow. Each pays only for the tokens the prefix cache does not hold;
//      long prompts are cut into chunks of what is left of the budget.
// Policies: FCFS (arrival order; the victim is the most recently admitted) and priority
// (lower `priority` first, then arrival; the victim is the lowest priority).
//
// The scheduler owns the sequences and the KV bookkeeping of them; the engine owns the
// model. No locks: one engine thread calls everything.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "paging/kv_cache_manager.h"
#include "scheduler/sequence.h"

namespace pagellm::scheduler {

enum class SchedulingPolicy : uint8_t { kFcfs, kPriority };

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // sequences in one forward pass
  int32_t max_num_batched_tokens = 2048;  // tokens in one forward pass
  int32_t max_waiting = 4096;             // queue length beyond which add() refuses
  int32_t max_model_len = 2048;           // context window: prompt + output
  int32_t sliding_window = 0;             // the model's attention window, 0 = none
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
};

// One sequence's share of a step.
struct ScheduledSeq {
  Sequence* seq;
  int32_t num_new_tokens;  // tokens [num_computed, num_computed + num_new_tokens)
  bool wants_logits;       // the chunk reaches the end: a token is sampled after it
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;
  std::vector<paging::BlockCopy> block_copies;  // to perform before the forward pass
  int32_t num_tokens = 0;
  int32_t num_preempted = 0;  // in this step
  bool empty() const { return seqs.empty(); }
};

enum class AddStatus : uint8_t {
  kAdded,
  kTooLong,    // prompt + max_tokens over the context window
  kNeverFits,  // needs more KV blocks than the whole pool
  kQueueFull,  // max_waiting reached: try again later
  kInvalid,    // empty prompt, duplicate id, max_tokens < 1
};

struct AddResult {
  AddStatus status;
  std::string message;  // for the client when not added
};

struct SchedulerStats {
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;  // of admitted requests
  int64_t generation_tokens = 0;
  int64_t steps = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, paging::KVCacheManager& kv);

  // Whether a sequence of this size could ever run: the context window, the pool size
  // and max_tokens >= 1. Reads only configuration, so any thread may call it.
  AddResult validate(int32_t prompt_len, int32_t max_tokens) const;

  // Queues a new sequence (status waiting). Refused sequences are returned untouched in
  // the result's message, never queued.
  AddResult add(std::unique_ptr<Sequence> seq, double now);

  // Finishes a sequence in any state with reason abort and frees its blocks now.
  // Returns the finished sequence, or nullptr for an unknown id.
  std::unique_ptr<Sequence> abort(paging::SeqId id, double now);

  // Picks the next step's work and reserves its KV slots.
  ScheduledBatch schedule(double now);

  // After the forward pass: marks the batch's tokens computed (full blocks become
  // shareable), appends `sampled` (one token per scheduled sequence that wants logits,
  // in batch order) and finishes sequences that hit EOS, a stop token, max_tokens or
  // the context window. Returns the sequences finished in this step.
  std::vector<std::unique_ptr<Sequence>> update(const ScheduledBatch& batch,
                                                std::span<const int32_t> sampled, double now);

  // Finishes a running sequence for a reason found outside (a stop string).
  std::unique_ptr<Sequence> finish(paging::SeqId id, FinishReason reason, double now);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const Sequence* get(paging::SeqId id) const;
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }
  const paging::KVCacheManager& kv() const { return kv_; }

 private:
  bool before(const Sequence& a, const Sequence& b) const;  // policy order
  void insert_waiting(Sequence* seq);
  void preempt(Sequence* seq);
  std::unique_ptr<Sequence> release(paging::SeqId id, FinishReason reason, double now);
  int32_t blocks_needed_for(int64_t num_tokens) const;
  Sequence* pick_victim(const std::vector<Sequence*>& candidates, const Sequence& seq,
                        int64_t step) const;

  SchedulerConfig config_;
  paging::KVCacheManager& kv_;
  std::unordered_map<paging::SeqId, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // policy order
  std::vector<Sequence*> running_;  // policy order
  uint64_t next_arrival_ = 0;
  int64_t step_ = 0;
  SchedulerStats stats_;
};

}  // namespace pagellm::scheduler
