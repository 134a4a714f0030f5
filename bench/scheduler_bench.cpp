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

// `running` decoding sequences (prompts of 256 tokens, staggered output lengths so they
// finish at different steps) and `waiting` more queued behind the sequence cap.
// Finished sequences are replaced, so the shape holds however long the benchmark runs.
class SteadyLoad {
 public:
  SteadyLoad(int running, int waiting)
      : kv_(running * paging::blocks_for_tokens(kPrompt + kMaxTokens) + 64),
        scheduler_(config(running, waiting), kv_) {
    for (int i = 0; i < running + waiting; ++i)
      add();
    // Warm up until every running sequence is decoding.
    for (int i = 0; i < 64; ++i)
      finish_step(scheduler_.schedule(0));
  }

  Scheduler& scheduler() { return scheduler_; }

  // The model's part of a step, faked: one token per sequence, then update().
  void finish_step(const ScheduledBatch& batch) {
    sampled_.assign(batch.seqs.size(), 7);
    const auto finished = scheduler_.update(batch, sampled_, 0);
    for (size_t i = 0; i < finished.size(); ++i)
      add();  // one new request for each that finished
  }

 private:
  static constexpr int kPrompt = 256, kMaxTokens = 512;

  static SchedulerConfig config(int running, int waiting) {
    SchedulerConfig c;
    c.max_num_seqs = running;
    c.max_num_batched_tokens = 8192;
    c.max_model_len = 4096;
    c.max_waiting = running + waiting + 1;
    return c;
  }

  void add() {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->tokens.resize(kPrompt);
    for (auto& t : seq->tokens)
      t = static_cast<int32_t>(rng_() % 32000);
    seq->prompt_len = kPrompt;
    seq->params.max_tokens = 64 + static_cast<int32_t>(rng_() % (kMaxTokens - 64));
    scheduler_.add(std::move(seq), 0);
  }

  paging::KVCacheManager kv_;
  Scheduler scheduler_;
  std::mt19937 rng_{1};
  paging::SeqId next_id_ = 0;
  std::vector<int32_t> sampled_;
};

void BM_Schedule(benchmark::State& state) {
  const int running = static_cast<int>(state.range(0));
  const int waiting = static_cast<int>(state.range(1));
  SteadyLoad load(running, waiting);
  Scheduler& s = load.scheduler();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const ScheduledBatch b = s.schedule(0);
    const auto end = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    if (static_cast<int>(b.seqs.size()) != running || s.num_waiting() < waiting - 1) {
      state.SkipWithError("the batch lost its shape");
      break;
    }
    load.finish_step(b);
  }
  state.counters["running"] = s.num_running();
  state.counters["waiting"] = s.num_waiting();
}
BENCHMARK(BM_Schedule)->Args({256, 1000})->UseManualTime()->Unit(benchmark::kMicrosecond);

// schedule() and update() together: the scheduler's whole share of a step.
void BM_ScheduleAndUpdate(benchmark::State& state) {
  SteadyLoad load(256, 1000);
  for (auto _ : state)
    load.finish_step(load.scheduler().schedule(0));
}
BENCHMARK(BM_ScheduleAndUpdate)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm::scheduler

BENCHMARK_MAIN();
