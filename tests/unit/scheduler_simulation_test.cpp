// Deterministic simulation of the scheduler with a fake model (no weights): thousands of
// requests with long-tailed lengths, random arrival times, priorities and aborts, on
// pools from tight to roomy. Every step checks the scheduler's promises; at the end every
// request has ended, each with exactly the tokens it would have had alone, and the pool
// holds no used block.
//
// The fake model's next token depends only on the sequence so far, so a request's output
// is fixed whatever the batching, chunking, preemption or prefix hits: any bookkeeping
// error (a chunk computed twice or skipped, a lost token) changes it.

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "scheduler/scheduler.h"

namespace pagellm::scheduler {
namespace {

constexpr int32_t kEos = 0;
constexpr int32_t kVocab = 1000;

// The fake model: a hash of the last few tokens and the length. EOS about 1 in 60.
int32_t fake_next_token(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull ^ tokens.size();
  const size_t from = tokens.size() > 4 ? tokens.size() - 4 : 0;
  for (size_t i = from; i < tokens.size(); ++i)
    h = (h ^ tokens[i]) * 1099511628211ull;
  h ^= h >> 29;
  return static_cast<int32_t>(h % (kVocab * 60) < 60 ? kEos : 1 + h % (kVocab - 1));
}

// What a request produces alone: its prompt followed by the fake model's tokens until
// EOS, max_tokens or the context window.
std::vector<int32_t> expected_tokens(std::vector<int32_t> tokens, const SamplingParams& p,
                                     int32_t prompt_len, int32_t max_model_len) {
  while (true) {
    const int32_t next = fake_next_token(tokens);
    tokens.push_back(next);
    if (next == kEos) break;
    if (static_cast<int32_t>(tokens.size()) - prompt_len >= p.max_tokens) break;
    if (static_cast<int32_t>(tokens.size()) >= max_model_len) break;
  }
  return tokens;
}

struct SimConfig {
  int32_t num_blocks;
  SchedulingPolicy policy;
  int32_t max_num_seqs;
  int32_t budget;
  uint32_t seed;
  int32_t sliding_window = 0;
};

void simulate(const SimConfig& c) {
  paging::KVCacheManager kv(c.num_blocks);
  SchedulerConfig config;
  config.max_num_seqs = c.max_num_seqs;
  config.max_num_batched_tokens = c.budget;
  config.max_model_len = 1024;
  config.max_waiting = 100000;
  config.policy = c.policy;
  config.sliding_window = c.sliding_window;
  Scheduler s(config, kv);
  std::mt19937 rng(c.seed);
  std::lognormal_distribution<double> prompt_len(std::log(120.0), 1.0);
  std::lognormal_distribution<double> output_len(std::log(40.0), 1.0);
  // A few shared system prompts so the prefix cache gets hits.
  std::vector<std::vector<int32_t>> system_prompts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p(40 + 30 * i);
    for (auto& t : p)
      t = 1 + rng() % (kVocab - 1);
    system_prompts.push_back(p);
  }

  constexpr int kRequests = 2000;
  std::map<paging::SeqId, std::vector<int32_t>> expected;
  std::set<paging::SeqId> live, aborted;
  std::map<paging::SeqId, int64_t> added_at;
  int64_t rejected = 0, finished = 0, hits_before = 0;
  paging::SeqId next_id = 0;
  int64_t step = 0;
  int64_t max_wait_steps = 0;
  std::set<paging::SeqId> first_scheduled;
  paging::SeqId last_first_scheduled = -1;
  while (next_id < kRequests || s.has_work()) {
    ASSERT_LT(step, 200000) << "the simulation does not end: a request starves";
    // Arrivals: a burst now and then, quiet otherwise.
    const int arrivals = next_id < kRequests ? std::poisson_distribution<int>(0.7)(rng) : 0;
    for (int a = 0; a < arrivals && next_id < kRequests; ++a) {
      auto seq = std::make_unique<Sequence>();
      seq->id = next_id++;
      if (rng() % 3 == 0) seq->tokens = system_prompts[rng() % 3];
      const int own = std::clamp(static_cast<int>(prompt_len(rng)), 1, 900);
      for (int i = 0; i < own; ++i)
        seq->tokens.push_back(1 + rng() % (kVocab - 1));
      seq->prompt_len = seq->num_tokens();
      seq->params.max_tokens = std::clamp(static_cast<int>(output_len(rng)), 1, 400);
      seq->priority = static_cast<int32_t>(rng() % 4);
      seq->eos_token_ids = {kEos};
      const auto want =
          expected_tokens(seq->tokens, seq->params, seq->prompt_len, config.max_model_len);
      const paging::SeqId id = seq->id;
      const AddResult r = s.add(std::move(seq), double(step));
      if (r.status != AddStatus::kAdded) {
        ASSERT_TRUE(r.status == AddStatus::kTooLong || r.status == AddStatus::kNeverFits)
            << r.message;
        ++rejected;
        continue;
      }
      expected[id] = want;
      live.insert(id);
      added_at[id] = step;
    }
    // Aborts: now and then a live request is cancelled, in whatever state it is.
    if (!live.empty() && rng() % 50 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const paging::SeqId id = *it;
      auto seq = s.abort(id, double(step));
      ASSERT_TRUE(seq);
      EXPECT_EQ(seq->finish_reason, FinishReason::kAbort);
      live.erase(id);
      aborted.insert(id);
    }

    // Policy order (priority first under kPriority, then arrival).
    auto before = [&](const Sequence& a, const Sequence& b) {
      if (c.policy == SchedulingPolicy::kPriority && a.priority != b.priority) {
        return a.priority < b.priority;
      }
      return a.arrival_order < b.arrival_order;
    };
    std::vector<paging::SeqId> waiting_before;
    for (paging::SeqId id : live) {
      if (s.get(id)->status == SequenceStatus::kWaiting) waiting_before.push_back(id);
    }
    const ScheduledBatch batch = s.schedule(double(step));
    ++step;
    // The queue leaves in policy order, new and preempted sequences alike: none that is
    // admitted (or resumed) comes after one still waiting.
    std::vector<const Sequence*> admitted, still_waiting;
    for (paging::SeqId id : waiting_before) {
      const Sequence* seq = s.get(id);
      (seq->status == SequenceStatus::kWaiting ? still_waiting : admitted).push_back(seq);
    }
    for (const Sequence* a : admitted) {
      for (const Sequence* w : still_waiting) {
        ASSERT_FALSE(before(*w, *a)) << "request " << a->id << " (" << a->num_preemptions
                                     << " preemptions) went ahead of waiting request " << w->id
                                     << " (" << w->num_preemptions << ")";
      }
    }
    // The promises of one step.
    ASSERT_LE(batch.num_tokens, c.budget);
    ASSERT_LE(static_cast<int32_t>(batch.seqs.size()), c.max_num_seqs);
    ASSERT_LE(s.num_running(), c.max_num_seqs);
    if (s.has_work()) {
      ASSERT_FALSE(batch.empty()) << "work is pending but nothing was scheduled";
    }
    std::set<paging::SeqId> in_batch;
    int32_t tokens = 0;
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& e : batch.seqs) {
      ASSERT_TRUE(in_batch.insert(e.seq->id).second) << "scheduled twice in one step";
      if (first_scheduled.insert(e.seq->id).second && c.policy == SchedulingPolicy::kFcfs) {
        // FCFS admits in arrival order: nobody is overtaken, so nobody starves.
        ASSERT_GT(e.seq->id, last_first_scheduled) << "request admitted out of order";
        last_first_scheduled = e.seq->id;
      }
      ASSERT_GT(e.num_new_tokens, 0);
      const int32_t end = e.seq->num_computed + e.num_new_tokens;
      ASSERT_LE(end, e.seq->num_tokens());
      ASSERT_EQ(e.wants_logits, end == e.seq->num_tokens());
      ASSERT_GE(kv.block_table(e.seq->id).num_tokens(), end);
      tokens += e.num_new_tokens;
      if (e.wants_logits) {
        sampled.push_back(fake_next_token(std::span(e.seq->tokens).first(end)));
      }
    }
    ASSERT_EQ(tokens, batch.num_tokens);
    const paging::KVCacheUsage u = kv.usage();
    ASSERT_EQ(u.used_blocks + u.cached_free_blocks + u.free_blocks, u.total_blocks);

    for (auto& done : s.update(batch, sampled, double(step))) {
      ASSERT_TRUE(live.count(done->id));
      EXPECT_EQ(done->tokens, expected[done->id]) << "request " << done->id;
      live.erase(done->id);
      ++finished;
      max_wait_steps = std::max(max_wait_steps, step - added_at[done->id]);
    }
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(finished + static_cast<int64_t>(aborted.size()) + rejected, kRequests);
  EXPECT_GT(finished, kRequests / 2);
  const paging::KVCacheUsage end = kv.usage();
  EXPECT_EQ(end.used_blocks, 0);
  EXPECT_EQ(end.free_blocks + end.cached_free_blocks, end.total_blocks);
  EXPECT_GT(end.prefix_hit_tokens, hits_before);
  std::printf(
      "[ pool %d blocks, %s, budget %d ] %lld steps, %lld finished, %zu aborted, "
      "%lld rejected, %lld preemptions, prefix hit rate %.1f%%, longest request %lld "
      "steps\n",
      c.num_blocks, c.policy == SchedulingPolicy::kFcfs ? "fcfs" : "priority", c.budget,
      static_cast<long long>(step), static_cast<long long>(finished), aborted.size(),
      static_cast<long long>(rejected), static_cast<long long>(s.stats().num_preemptions),
      100 * end.prefix_hit_rate(), static_cast<long long>(max_wait_steps));
  if (c.num_blocks <= 128) {
    EXPECT_GT(s.stats().num_preemptions, 0) << "tight pools must preempt";
  }
}

class SchedulerSimulation : public ::testing::TestWithParam<SimConfig> {};

TEST_P(SchedulerSimulation, EveryRequestEndsWithItsOwnTokensAndThePoolDrains) {
  simulate(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Pools, SchedulerSimulation,
    ::testing::Values(SimConfig{72, SchedulingPolicy::kFcfs, 64, 256, 1},
                      SimConfig{128, SchedulingPolicy::kPriority, 64, 512, 2},
                      SimConfig{512, SchedulingPolicy::kFcfs, 128, 1024, 3},
                      SimConfig{4096, SchedulingPolicy::kPriority, 256, 2048, 4},
                      SimConfig{96, SchedulingPolicy::kFcfs, 32, 128, 5, /*window=*/64}),
    [](const auto& info) {
      const SimConfig& c = info.param;
      return std::to_string(c.num_blocks) + "_blocks_" +
             (c.policy == SchedulingPolicy::kFcfs ? "fcfs" : "priority") +
             (c.sliding_window ? "_window" : "");
    });

}  // namespace
}  // namespace pagellm::scheduler
