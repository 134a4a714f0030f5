// The scheduler's own cost per step, model excluded: schedule() with 256 running
// sequences (decoding; a new block every 16th token) and 1,000 waiting behind the
// sequence cap. Finished sequences are replaced from the waiting queue and the queue
// is refilled, so the shape holds for the whole run.
//   pagellm_scheduler_bench [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]

#include <benchmark/benchmark.h>

#include <chrono>
#include <random>

#include "scheduler/scheduler.h"

namespace pagellm::scheduler {
namespace {

void BM_Schedule(benchmark::State& state) {
  const int running = static_cast<int>(state.range(0));
  const int waiting = static_cast<int>(state.range(1));
  constexpr int kPrompt = 256, kMaxTokens = 512;
  paging::KVCacheManager kv(running * paging::blocks_for_tokens(kPrompt + kMaxTokens) + 64);
  SchedulerConfig config;
  config.max_num_seqs = running;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 4096;
  config.max_waiting = running + waiting + 1;
  Scheduler s(config, kv);
  std::mt19937 rng(1);
  paging::SeqId next_id = 0;
  auto add = [&] {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id++;
    seq->tokens.resize(kPrompt);
    for (auto& t : seq->tokens)
      t = static_cast<int32_t>(rng() % 32000);
    seq->prompt_len = kPrompt;
    // Staggered lengths so that sequences finish at different steps.
    seq->params.max_tokens = 64 + static_cast<int32_t>(rng() % (kMaxTokens - 64));
    s.add(std::move(seq), 0);
  };
  for (int i = 0; i < running + waiting; ++i)
    add();
  std::vector<int32_t> sampled;
  // Warm up until every running sequence is decoding.
  for (int i = 0; i < 64; ++i) {
    const ScheduledBatch b = s.schedule(0);
    sampled.assign(b.seqs.size(), 7);
    for (auto& done : s.update(b, sampled, 0))
      add();
  }
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const ScheduledBatch b = s.schedule(0);
    const auto end = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    if (static_cast<int>(b.seqs.size()) != running || s.num_waiting() < waiting - 1) {
      state.SkipWithError("the batch lost its shape");
      break;
    }
    sampled.assign(b.seqs.size(), 7);
    for (auto& done : s.update(b, sampled, 0))
      add();
  }
  state.counters["running"] = s.num_running();
  state.counters["waiting"] = s.num_waiting();
}
BENCHMARK(BM_Schedule)->Args({256, 1000})->UseManualTime()->Unit(benchmark::kMicrosecond);

// schedule() and update() together: the scheduler's whole share of a step.
void BM_ScheduleAndUpdate(benchmark::State& state) {
  paging::KVCacheManager kv(256 * 48 + 64);
  SchedulerConfig config;
  config.max_num_seqs = 256;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 4096;
  config.max_waiting = 2000;
  Scheduler s(config, kv);
  std::mt19937 rng(2);
  paging::SeqId next_id = 0;
  auto add = [&] {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id++;
    seq->tokens.resize(256);
    for (auto& t : seq->tokens)
      t = static_cast<int32_t>(rng() % 32000);
    seq->prompt_len = 256;
    seq->params.max_tokens = 64 + static_cast<int32_t>(rng() % 448);
    s.add(std::move(seq), 0);
  };
  for (int i = 0; i < 1256; ++i)
    add();
  std::vector<int32_t> sampled;
  for (int i = 0; i < 64; ++i) {
    const ScheduledBatch b = s.schedule(0);
    sampled.assign(b.seqs.size(), 7);
    for (auto& done : s.update(b, sampled, 0))
      add();
  }
  for (auto _ : state) {
    const ScheduledBatch b = s.schedule(0);
    sampled.assign(b.seqs.size(), 7);
    for (auto& done : s.update(b, sampled, 0))
      add();
  }
}
BENCHMARK(BM_ScheduleAndUpdate)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm::scheduler

BENCHMARK_MAIN();
