// Micro-benchmarks of the KV block bookkeeping: the per-step costs the engine pays.
//   pagellm_paging_bench [--benchmark_format=json] [--benchmark_repetitions=N]

#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "paging/kv_cache_manager.h"

namespace pagellm::paging {
namespace {

std::vector<TokenId> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> token(0, 127999);
  std::vector<TokenId> out(n);
  for (auto& t : out)
    t = token(rng);
  return out;
}

// Longest-prefix lookup of a 4096-token prompt whose first 4080 tokens are cached
// (255 full blocks hashed, found and verified; the last token is always computed).
void BM_PrefixLookup4096(benchmark::State& state) {
  KVCacheManager kv(1024);
  const auto prompt = random_tokens(4096, 1);
  if (!kv.add_sequence(1, kv.match_prefix(prompt), 4096)) state.SkipWithError("pool too small");
  kv.cache_full_blocks(1, prompt);
  kv.free_sequence(1);  // blocks stay cached-free
  for (auto _ : state) {
    PrefixMatch match = kv.match_prefix(prompt);
    benchmark::DoNotOptimize(match.num_cached_tokens);
    if (match.num_cached_tokens != 4080) state.SkipWithError("unexpected cache miss");
  }
  state.SetItemsProcessed(state.iterations() * 4096);
}
BENCHMARK(BM_PrefixLookup4096)->Unit(benchmark::kMicrosecond);

// Admission with a full prefix hit: lookup, take the 255 cached blocks and one fresh
// block, then free the sequence again.
void BM_AdmitWithPrefixHit4096(benchmark::State& state) {
  KVCacheManager kv(1024);
  const auto prompt = random_tokens(4096, 2);
  kv.add_sequence(1, kv.match_prefix(prompt), 4096);
  kv.cache_full_blocks(1, prompt);
  kv.free_sequence(1);
  for (auto _ : state) {
    PrefixMatch match = kv.match_prefix(prompt);
    kv.add_sequence(2, match, 4096 - match.num_cached_tokens);
    kv.free_sequence(2);
  }
}
BENCHMARK(BM_AdmitWithPrefixHit4096)->Unit(benchmark::kMicrosecond);

// One decode step's bookkeeping for 256 running sequences: reserve a slot for each
// (a new block every 16th token) and hash the blocks that became full. A sequence that
// reaches 2048 tokens finishes and a new one takes its place, as in a real server.
void BM_DecodeStepBookkeeping(benchmark::State& state) {
  const int num_seqs = static_cast<int>(state.range(0));
  constexpr int kMaxLen = 2048;
  KVCacheManager kv(num_seqs * (kMaxLen / kBlockSize) + 16);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> prompt_len(64, 1024);
  std::vector<std::vector<TokenId>> tokens(num_seqs);
  std::vector<SeqId> ids(num_seqs);
  SeqId next_id = 0;
  auto start = [&](int i) {
    ids[i] = next_id++;
    tokens[i] = random_tokens(prompt_len(rng), static_cast<uint32_t>(ids[i]));
    kv.add_sequence(ids[i], kv.match_prefix(tokens[i]), static_cast<int32_t>(tokens[i].size()));
    kv.cache_full_blocks(ids[i], tokens[i]);
    tokens[i].reserve(kMaxLen);
  };
  for (int i = 0; i < num_seqs; ++i)
    start(i);
  TokenId next_token = 0;
  for (auto _ : state) {
    for (int i = 0; i < num_seqs; ++i) {
      if (tokens[i].size() >= kMaxLen) {
        kv.free_sequence(ids[i]);
        start(i);
      }
      tokens[i].push_back(next_token++);
      kv.allocate_slots(ids[i], 1);
      kv.cache_full_blocks(ids[i], tokens[i]);
    }
  }
  state.SetItemsProcessed(state.iterations() * num_seqs);
}
BENCHMARK(BM_DecodeStepBookkeeping)->Arg(256)->Unit(benchmark::kMicrosecond);

// Allocate slots for a new sequence of N blocks (no prefix caching), then free it.
void BM_AllocateFree(benchmark::State& state) {
  const int32_t blocks = static_cast<int32_t>(state.range(0));
  KVCacheManager kv(4096, /*enable_prefix_caching=*/false);
  const PrefixMatch none;
  for (auto _ : state) {
    kv.add_sequence(1, none, blocks * kBlockSize);
    kv.free_sequence(1);
  }
  state.SetItemsProcessed(state.iterations() * blocks);
}
BENCHMARK(BM_AllocateFree)->Arg(1)->Arg(32)->Arg(256)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace pagellm::paging

BENCHMARK_MAIN();
