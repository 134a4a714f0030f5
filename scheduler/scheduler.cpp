#include "scheduler/scheduler.h"

#include <algorithm>
#include <string>

namespace pagellm::scheduler {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerConfig& config, paging::KVCacheManager& kv)
    : config_(config), kv_(kv) {}

bool Scheduler::before(const Sequence& a, const Sequence& b) const {
  if (config_.policy == SchedulingPolicy::kPriority && a.priority != b.priority) {
    return a.priority < b.priority;
  }
  return a.arrival_order < b.arrival_order;
}

void Scheduler::insert_waiting(Sequence* seq) {
  // Policy order, for a preempted sequence too: it goes back among the waiting by its
  // arrival (and priority), not to the head, where it would overtake an older sequence
  // preempted before it.
  waiting_.insert(std::find_if(waiting_.begin(), waiting_.end(),
                               [&](const Sequence* other) { return before(*seq, *other); }),
                  seq);
}

int32_t Scheduler::blocks_needed_for(int64_t num_tokens) const {
  const int32_t all = paging::blocks_for_tokens(num_tokens);
  if (config_.sliding_window <= 0) return all;
  // Blocks behind the window are released, so at most a window plus one step's chunk.
  return std::min(all, paging::blocks_for_tokens(int64_t(config_.sliding_window) +
                                                 config_.max_num_batched_tokens) +
                           1);
}

AddResult Scheduler::validate(int32_t prompt_len, int32_t max_tokens) const {
  if (prompt_len <= 0) return {AddStatus::kInvalid, "the prompt is empty"};
  if (max_tokens < 1) return {AddStatus::kInvalid, "max_tokens must be at least 1"};
  const int64_t total = int64_t(prompt_len) + max_tokens;
  if (total > config_.max_model_len) {
    return {AddStatus::kTooLong, "this model's maximum context length is " +
                                     std::to_string(config_.max_model_len) + " tokens, but " +
                                     std::to_string(total) + " were requested (" +
                                     std::to_string(prompt_len) + " in the prompt, " +
                                     std::to_string(max_tokens) + " for the completion)"};
  }
  const int32_t needed = blocks_needed_for(total);
  if (needed > kv_.pool().num_blocks()) {
    return {AddStatus::kNeverFits, "the request needs " + std::to_string(needed) + " KV blocks (" +
                                       std::to_string(total) + " tokens) but the whole cache has " +
                                       std::to_string(kv_.pool().num_blocks())};
  }
  return {AddStatus::kAdded, ""};
}

AddResult Scheduler::add(std::unique_ptr<Sequence> seq, double now) {
  if (!seq) return {AddStatus::kInvalid, "no sequence"};
  if (seqs_.count(seq->id)) {
    return {AddStatus::kInvalid, "sequence id " + std::to_string(seq->id) + " is already in use"};
  }
  if (seq->prompt_len <= 0 || seq->prompt_len != seq->num_tokens()) {
    return {AddStatus::kInvalid, "the prompt is empty"};
  }
  if (AddResult r = validate(seq->prompt_len, seq->params.max_tokens);
      r.status != AddStatus::kAdded) {
    return r;
  }
  if (num_waiting() >= config_.max_waiting) {
    return {AddStatus::kQueueFull,
            "the waiting queue is full (" + std::to_string(config_.max_waiting) + " requests)"};
  }
  seq->status = SequenceStatus::kWaiting;
  seq->num_computed = 0;
  seq->arrival_order = next_arrival_++;
  seq->times.arrival = now;
  stats_.prompt_tokens += seq->prompt_len;
  Sequence* raw = seq.get();
  seqs_.emplace(seq->id, std::move(seq));
  insert_waiting(raw);
  return {AddStatus::kAdded, ""};
}

Sequence* Scheduler::pick_victim(const std::vector<Sequence*>& candidates, const Sequence& seq,
                                 int64_t step) const {
  // The lowest in policy order; one resumed in this step or the last is passed over for
  // the lowest of those after `seq` that were not, where there is one. Never for `seq`
  // itself or one before it: the grace must not make a sequence wait behind a later one.
  auto just_resumed = [&](const Sequence* c) { return c->resumed_at_step >= step - 1; };
  Sequence* lowest = nullptr;
  Sequence* settled = nullptr;
  for (Sequence* c : candidates) {
    if (lowest == nullptr || before(*lowest, *c)) lowest = c;
    if (!just_resumed(c) && before(seq, *c) && (settled == nullptr || before(*settled, *c))) {
      settled = c;
    }
  }
  return just_resumed(lowest) && settled ? settled : lowest;
}

void Scheduler::preempt(Sequence* seq) {
  kv_.free_sequence(seq->id);
  seq->num_computed = 0;
  seq->status = SequenceStatus::kWaiting;
  ++seq->num_preemptions;
  ++stats_.num_preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  insert_waiting(seq);
}

ScheduledBatch Scheduler::schedule(double now) {
  ++step_;
  ++stats_.steps;
  ScheduledBatch batch;
  int32_t budget = config_.max_num_batched_tokens;
  auto take = [&](Sequence* seq, int32_t n, int32_t remaining) {
    batch.seqs.push_back({seq, n, n == remaining});
    batch.num_tokens += n;
    budget -= n;
    seq->last_scheduled_step = step_;
    if (seq->times.first_scheduled == 0) seq->times.first_scheduled = now;
  };

  // 1. Running sequences: decodes first, then prompt chunks, each in policy order.
  std::vector<Sequence*> order;
  order.reserve(running_.size());
  for (Sequence* s : running_) {
    if (!s->is_prefilling()) order.push_back(s);
  }
  for (Sequence* s : running_) {
    if (s->is_prefilling()) order.push_back(s);
  }
  std::vector<Sequence*> candidates;
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (seq->status != SequenceStatus::kRunning) continue;  // preempted in this loop
    const int32_t remaining = seq->num_tokens() - seq->num_computed;
    const int32_t n = std::min(remaining, budget);
    if (config_.sliding_window > 0) {
      kv_.release_blocks_before(seq->id, seq->num_computed - config_.sliding_window + 1);
    }
    bool preempted_self = false;
    while (!kv_.can_allocate_slots(seq->id, n)) {
      // Those not scheduled yet (seq among them), and those scheduled earlier in this
      // loop that come after seq in policy order: decodes go first, but a later decode
      // must not keep its blocks from a prompt that comes before it.
      candidates.clear();
      for (Sequence* s : running_) {
        if (s->last_scheduled_step != step_ || before(*seq, *s)) candidates.push_back(s);
      }
      Sequence* victim = pick_victim(candidates, *seq, step_);
      if (victim != seq && victim->last_scheduled_step == step_) {
        // Taken back out of the batch, with its tokens.
        auto entry = std::find_if(batch.seqs.begin(), batch.seqs.end(),
                                  [&](const ScheduledSeq& e) { return e.seq == victim; });
        budget += entry->num_new_tokens;
        batch.num_tokens -= entry->num_new_tokens;
        batch.seqs.erase(entry);
      }
      preempt(victim);
      ++batch.num_preempted;
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;
    kv_.allocate_slots(seq->id, n);
    take(seq, n, remaining);
  }

  // 2. Waiting sequences, unless this step had to preempt (the pool is tight).
  while (batch.num_preempted == 0 && !waiting_.empty() && budget > 0 &&
         num_running() < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const paging::PrefixMatch match = kv_.match_prefix(seq->tokens, seq->cache_salt);
    const int32_t remaining = seq->num_tokens() - match.num_cached_tokens;
    const int32_t n = std::min(remaining, budget);
    const bool resumed = seq->num_preemptions > 0;
    // With a sliding window, the first query (at the first uncached position) reads
    // nothing before its window: matched blocks behind it are not taken.
    const int32_t first_needed =
        config_.sliding_window > 0 ? match.num_cached_tokens - config_.sliding_window + 1 : 0;
    if (!kv_.add_sequence(seq->id, match, n, resumed, first_needed)) {
      break;  // the head waits for blocks
    }
    waiting_.pop_front();
    seq->num_computed = match.num_cached_tokens;
    seq->status = SequenceStatus::kRunning;
    if (resumed) {
      seq->resumed_at_step = step_;
    } else {
      seq->num_cached_prompt_tokens = match.num_cached_tokens;
    }
    running_.insert(std::find_if(running_.begin(), running_.end(),
                                 [&](const Sequence* other) { return before(*seq, *other); }),
                    seq);
    take(seq, n, remaining);
  }
  batch.block_copies = kv_.take_block_copies();
  return batch;
}

std::unique_ptr<Sequence> Scheduler::release(paging::SeqId id, FinishReason reason, double now) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return nullptr;
  Sequence* seq = it->second.get();
  if (seq->status == SequenceStatus::kRunning) {
    kv_.free_sequence(id);
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else if (seq->status == SequenceStatus::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  seq->status = SequenceStatus::kFinished;
  seq->finish_reason = reason;
  seq->times.finished = now;
  std::unique_ptr<Sequence> out = std::move(it->second);
  seqs_.erase(it);
  return out;
}

std::unique_ptr<Sequence> Scheduler::abort(paging::SeqId id, double now) {
  return release(id, FinishReason::kAbort, now);
}

std::unique_ptr<Sequence> Scheduler::finish(paging::SeqId id, FinishReason reason, double now) {
  return release(id, reason, now);
}

std::vector<std::unique_ptr<Sequence>> Scheduler::update(const ScheduledBatch& batch,
                                                         std::span<const int32_t> sampled,
                                                         double now) {
  std::vector<std::unique_ptr<Sequence>> finished;
  size_t next_sample = 0;
  for (const ScheduledSeq& s : batch.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed += s.num_new_tokens;
    kv_.cache_full_blocks(seq->id, std::span<const int32_t>(seq->tokens).first(seq->num_computed));
    if (!s.wants_logits) continue;
    if (next_sample >= sampled.size()) break;  // the caller gave too few: nothing appended
    const int32_t token = sampled[next_sample++];
    seq->tokens.push_back(token);
    ++stats_.generation_tokens;
    if (seq->times.first_token == 0) seq->times.first_token = now;
    seq->times.last_token = now;

    const SamplingParams& p = seq->params;
    FinishReason reason = FinishReason::kNone;
    auto contains = [token](const std::vector<int32_t>& ids) {
      return std::find(ids.begin(), ids.end(), token) != ids.end();
    };
    if (contains(p.stop_token_ids) || (!p.ignore_eos && contains(seq->eos_token_ids))) {
      reason = FinishReason::kStop;
    } else if (seq->num_output_tokens() >= p.max_tokens ||
               seq->num_tokens() >= config_.max_model_len) {
      reason = FinishReason::kLength;
    }
    if (reason != FinishReason::kNone) finished.push_back(release(seq->id, reason, now));
  }
  return finished;
}

const Sequence* Scheduler::get(paging::SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

}  // namespace pagellm::scheduler
