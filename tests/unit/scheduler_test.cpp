#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>

namespace pagellm::scheduler {
namespace {

constexpr int32_t kEos = 2;

std::unique_ptr<Sequence> make_seq(paging::SeqId id, int32_t prompt_len, int32_t max_tokens,
                                   int32_t first_token = 100, int32_t priority = 0) {
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->tokens.resize(prompt_len);
  std::iota(seq->tokens.begin(), seq->tokens.end(), first_token);
  seq->prompt_len = prompt_len;
  seq->params.max_tokens = max_tokens;
  seq->params.temperature = 0;
  seq->priority = priority;
  seq->eos_token_ids = {kEos};
  return seq;
}

// Runs one step with a fake model that always answers `token`.
std::vector<std::unique_ptr<Sequence>> step(Scheduler& s, ScheduledBatch& batch,
                                            int32_t token = 7) {
  batch = s.schedule(0);
  std::vector<int32_t> sampled;
  for (const auto& e : batch.seqs) {
    if (e.wants_logits) sampled.push_back(token);
  }
  return s.update(batch, sampled, 0);
}

TEST(Scheduler, PrefillThenDecodeUntilMaxTokens) {
  paging::KVCacheManager kv(64);
  Scheduler s({}, kv);
  ASSERT_EQ(s.add(make_seq(1, 20, 3), 0).status, AddStatus::kAdded);
  ScheduledBatch b;
  EXPECT_TRUE(step(s, b).empty());
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].num_new_tokens, 20);
  EXPECT_TRUE(b.seqs[0].wants_logits);
  EXPECT_TRUE(step(s, b).empty());
  EXPECT_EQ(b.seqs[0].num_new_tokens, 1);
  auto done = step(s, b);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
  EXPECT_EQ(done[0]->num_output_tokens(), 3);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_FALSE(s.has_work());
}

TEST(Scheduler, LongPromptIsChunkedAndDecodesGoFirst) {
  paging::KVCacheManager kv(64);
  SchedulerConfig config;
  config.max_num_batched_tokens = 32;
  Scheduler s(config, kv);
  s.add(make_seq(1, 10, 50), 0);
  ScheduledBatch b;
  step(s, b);  // sequence 1 prefilled
  s.add(make_seq(2, 100, 5, 500), 0);
  std::vector<int32_t> chunks;
  for (int i = 0; i < 4; ++i) {
    step(s, b);
    ASSERT_EQ(b.seqs.size(), 2u);
    EXPECT_EQ(b.seqs[0].seq->id, 1);  // the decode first
    EXPECT_EQ(b.seqs[0].num_new_tokens, 1);
    EXPECT_LE(b.num_tokens, 32);
    chunks.push_back(b.seqs[1].num_new_tokens);
    EXPECT_EQ(b.seqs[1].wants_logits, i == 3);
  }
  EXPECT_EQ(chunks, (std::vector<int32_t>{31, 31, 31, 7}));
}

TEST(Scheduler, AdmissionPaysOnlyForUncachedTokens) {
  paging::KVCacheManager kv(64);
  Scheduler s({}, kv);
  s.add(make_seq(1, 40, 1), 0);
  ScheduledBatch b;
  step(s, b);  // computes and caches blocks 0 and 1, finishes (max_tokens 1)
  s.add(make_seq(2, 40, 1), 0);
  step(s, b);
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].num_new_tokens, 8);  // 32 of 40 from the prefix cache
  EXPECT_EQ(kv.usage().prefix_hit_tokens, 32);
}

TEST(Scheduler, SlidingWindowResumesFromACachedPrefixLongerThanThePool) {
  paging::KVCacheManager kv(12);  // 192 tokens
  SchedulerConfig config;
  config.sliding_window = 24;
  config.max_num_batched_tokens = 32;
  Scheduler s(config, kv);
  ScheduledBatch b;
  ASSERT_EQ(s.add(make_seq(1, 180, 1), 0).status, AddStatus::kAdded);
  while (s.has_work())
    step(s, b);  // leaves 11 full blocks in the prefix cache
  // The same 180 tokens and 20 more: 176 come from the cache, 9 of whose 11 blocks are
  // behind the first new query's window.
  ASSERT_EQ(s.add(make_seq(2, 200, 5), 0).status, AddStatus::kAdded);
  std::vector<std::unique_ptr<Sequence>> done;
  for (int i = 0; i < 20 && done.empty(); ++i) {
    done = step(s, b);
    EXPECT_LE(kv.usage().used_blocks, 5);
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
  EXPECT_EQ(done[0]->num_cached_prompt_tokens, 176);
  EXPECT_EQ(done[0]->num_output_tokens(), 5);
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

// Decodes are scheduled before prompt chunks, but a lower-priority decode must not keep
// its blocks from a higher-priority prompt: it is taken back out of the step and
// preempted, instead of the prompt preempting itself step after step.
TEST(Scheduler, APromptPreemptsALowerPriorityDecodeScheduledBeforeIt) {
  paging::KVCacheManager kv(8);
  SchedulerConfig config;
  config.policy = SchedulingPolicy::kPriority;
  config.max_num_seqs = 2;
  config.max_num_batched_tokens = 32;
  Scheduler s(config, kv);
  ScheduledBatch b;
  // 1 holds 2 blocks and never needs a third; 2's prompt needs 7 of the 6 left.
  ASSERT_EQ(s.add(make_seq(1, 20, 12, 100, /*priority=*/10), 0).status, AddStatus::kAdded);
  step(s, b);  // 1 decodes from now on
  ASSERT_EQ(s.add(make_seq(2, 100, 5, 300, /*priority=*/0), 0).status, AddStatus::kAdded);
  std::vector<paging::SeqId> finished;
  for (int i = 0; i < 400 && finished.size() < 2; ++i) {
    for (auto& done : step(s, b))
      finished.push_back(done->id);
    int32_t tokens = 0;
    for (const auto& e : b.seqs)
      tokens += e.num_new_tokens;
    EXPECT_EQ(tokens, b.num_tokens);
    EXPECT_LE(b.num_tokens, 32);
  }
  ASSERT_EQ(finished, (std::vector<paging::SeqId>{2, 1}));
  EXPECT_GE(s.stats().num_preemptions, 1);
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

TEST(Scheduler, RejectsWhatCanNeverRunAndFullQueues) {
  paging::KVCacheManager kv(4);  // 64 tokens
  SchedulerConfig config;
  config.max_model_len = 100;
  config.max_waiting = 2;
  Scheduler s(config, kv);
  AddResult r = s.add(make_seq(1, 90, 20), 0);
  EXPECT_EQ(r.status, AddStatus::kTooLong);
  EXPECT_NE(r.message.find("maximum context length is 100"), std::string::npos) << r.message;
  r = s.add(make_seq(2, 60, 10), 0);
  EXPECT_EQ(r.status, AddStatus::kNeverFits);
  EXPECT_NE(r.message.find("the whole cache has 4"), std::string::npos) << r.message;
  EXPECT_EQ(s.add(make_seq(3, 0, 10), 0).status, AddStatus::kInvalid);
  EXPECT_EQ(s.add(make_seq(4, 10, 0), 0).status, AddStatus::kInvalid);
  EXPECT_EQ(s.add(make_seq(5, 10, 10), 0).status, AddStatus::kAdded);
  EXPECT_EQ(s.add(make_seq(5, 10, 10), 0).status, AddStatus::kInvalid);  // id in use
  EXPECT_EQ(s.add(make_seq(6, 10, 10), 0).status, AddStatus::kAdded);
  EXPECT_EQ(s.add(make_seq(7, 10, 10), 0).status, AddStatus::kQueueFull);
  EXPECT_EQ(s.num_waiting(), 2);
}

TEST(Scheduler, StopTokensEosAndIgnoreEos) {
  paging::KVCacheManager kv(64);
  Scheduler s({}, kv);
  auto a = make_seq(1, 5, 10);
  a->params.stop_token_ids = {9};
  auto b = make_seq(2, 5, 10);
  auto c = make_seq(3, 5, 3);
  c->params.ignore_eos = true;
  s.add(std::move(a), 0);
  s.add(std::move(b), 0);
  s.add(std::move(c), 0);
  ScheduledBatch batch;
  batch = s.schedule(0);
  auto done = s.update(batch, std::vector<int32_t>{9, kEos, kEos}, 0);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kStop);
  EXPECT_EQ(done[1]->finish_reason, FinishReason::kStop);
  EXPECT_EQ(s.num_running(), 1);  // ignores EOS
  step(s, batch, kEos);
  done = step(s, batch, kEos);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
}

TEST(Scheduler, AbortInEveryStateFreesEverything) {
  paging::KVCacheManager kv(6);
  SchedulerConfig config;
  config.max_num_batched_tokens = 16;
  Scheduler s(config, kv);
  s.add(make_seq(1, 40, 20), 0);      // prefilling in chunks of 16
  s.add(make_seq(2, 8, 20, 900), 0);  // waiting behind it
  ScheduledBatch b;
  step(s, b);
  EXPECT_EQ(s.get(1)->status, SequenceStatus::kRunning);
  EXPECT_TRUE(s.get(1)->is_prefilling());
  EXPECT_EQ(s.get(2)->status, SequenceStatus::kWaiting);
  auto waiting = s.abort(2, 0);
  ASSERT_TRUE(waiting);
  EXPECT_EQ(waiting->finish_reason, FinishReason::kAbort);
  auto prefilling = s.abort(1, 0);
  ASSERT_TRUE(prefilling);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_EQ(s.abort(1, 0), nullptr);  // twice: unknown

  s.add(make_seq(3, 8, 20), 0);
  step(s, b);
  step(s, b);
  EXPECT_FALSE(s.get(3)->is_prefilling());
  s.abort(3, 0);  // decoding
  EXPECT_EQ(kv.usage().used_blocks, 0);
  EXPECT_FALSE(s.has_work());
}

// Pool of 4 blocks (64 tokens), two sequences that each grow past 32 tokens: the later
// one is preempted, waits at the head of the queue, and resumes when the first is done.
TEST(Scheduler, FcfsPreemptsTheMostRecentlyAdmittedAndResumesIt) {
  paging::KVCacheManager kv(4);
  Scheduler s({}, kv);
  s.add(make_seq(1, 30, 30), 0);
  s.add(make_seq(2, 30, 30, 500), 0);
  s.add(make_seq(3, 4, 2, 900), 0);
  ScheduledBatch b;
  bool saw_preemption = false;
  std::vector<paging::SeqId> order_finished;
  for (int i = 0; i < 200 && s.has_work(); ++i) {
    for (auto& done : step(s, b))
      order_finished.push_back(done->id);
    if (b.num_preempted > 0) {
      saw_preemption = true;
      EXPECT_EQ(s.get(2)->status, SequenceStatus::kWaiting);  // not the older sequence 1
      EXPECT_EQ(s.get(1)->status, SequenceStatus::kRunning);
    }
  }
  EXPECT_TRUE(saw_preemption);
  EXPECT_EQ(s.stats().num_preemptions, 1);
  EXPECT_EQ(order_finished.front(), 1);
  EXPECT_EQ(order_finished.size(), 3u);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  // Prefix-cache lookups count prompts once: resuming sequence 2 is not a new query.
  EXPECT_EQ(kv.usage().prefix_query_tokens, 30 + 30 + 4);
}

// A sequence resumed a step ago is spared for another victim, but never for the one
// short of blocks when that one comes first: here 1 (priority 0) used to preempt itself
// for 2 (priority 10), just back after a preemption, and then wait for it to finish.
TEST(Scheduler, TheGraceOfAResumedSequenceNeverPreemptsOneBeforeIt) {
  paging::KVCacheManager kv(5);
  SchedulerConfig config;
  config.policy = SchedulingPolicy::kPriority;
  Scheduler s(config, kv);
  ASSERT_EQ(s.add(make_seq(1, 7, 60, 100, /*priority=*/0), 0).status, AddStatus::kAdded);
  ASSERT_EQ(s.add(make_seq(2, 19, 60, 1000, /*priority=*/10), 0).status, AddStatus::kAdded);
  ASSERT_EQ(s.add(make_seq(3, 1, 25, 2000, /*priority=*/5), 0).status, AddStatus::kAdded);
  ScheduledBatch b;
  bool resumed_beside_1 = false;
  std::vector<paging::SeqId> finished;
  for (int i = 0; i < 400 && s.has_work(); ++i) {
    for (auto& done : step(s, b))
      finished.push_back(done->id);
    const Sequence* two = s.get(2);
    if (two && two->status == SequenceStatus::kRunning && two->num_preemptions > 0 &&
        s.get(1) != nullptr) {
      resumed_beside_1 = true;
      EXPECT_EQ(s.get(1)->status, SequenceStatus::kRunning) << "step " << i;
    }
  }
  EXPECT_TRUE(resumed_beside_1);
  EXPECT_EQ(finished, (std::vector<paging::SeqId>{3, 1, 2}));  // 3 is the shortest
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

TEST(Scheduler, PriorityPolicyAdmitsAndPreemptsByPriority) {
  paging::KVCacheManager kv(4);
  SchedulerConfig config;
  config.policy = SchedulingPolicy::kPriority;
  config.max_num_seqs = 2;
  Scheduler s(config, kv);
  s.add(make_seq(1, 30, 30, 100, /*priority=*/5), 0);
  s.add(make_seq(2, 30, 30, 500, /*priority=*/0), 0);
  s.add(make_seq(3, 4, 1, 900, /*priority=*/1), 0);
  ScheduledBatch b;
  step(s, b);
  // Priorities 0 and 1 admitted first; 5 waits (cap of 2 sequences).
  EXPECT_EQ(s.get(1)->status, SequenceStatus::kWaiting);
  for (int i = 0; i < 100 && s.get(2) != nullptr; ++i) {
    step(s, b);
    if (b.num_preempted > 0) {
      EXPECT_EQ(s.get(1)->status, SequenceStatus::kWaiting) << "victim must be priority 5";
      ASSERT_NE(s.get(2), nullptr);
      EXPECT_EQ(s.get(2)->status, SequenceStatus::kRunning);
    }
  }
  for (int i = 0; i < 200 && s.has_work(); ++i)
    step(s, b);
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(kv.usage().used_blocks, 0);
}

}  // namespace
}  // namespace pagellm::scheduler
