// Micro-benchmarks of the CPU kernels at the `bench` model's shapes, next to the machine's
// memory bandwidth (the ceiling of decode, which reads every weight byte once per token).
//   pagellm_kernels_bench [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
// Counters: GB/s (bytes the kernel must move, per second), GFLOP/s for matmul.
// Weights and KV caches rotate through copies totalling more than the last-level cache,
// so that each iteration reads from memory as a real decode step does.

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace pagellm::kernels::cpu {
namespace {

constexpr int64_t kColdBytes = int64_t(512) << 20;  // working set past the L3 cache

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<char, FreeDeleter>;

Buffer alloc_touched(int64_t bytes) {
  Buffer b(static_cast<char*>(allocate_streamed(bytes)));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < bytes; i += 4096)
    b.get()[i] = 1;
  return b;
}

// PAGELLM_BENCH_HOT=1 keeps one copy of each weight and cache (cache-resident timings).
bool hot_caches() {
  const char* v = std::getenv("PAGELLM_BENCH_HOT");
  return v != nullptr && std::string(v) == "1";
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& v : out)
    v = dist(rng);
  return out;
}

// Copy of a large buffer, split over all threads: bytes read + bytes written per second.
void BM_MemoryCopy(benchmark::State& state) {
  const int64_t bytes = kColdBytes / 2;
  Buffer src = alloc_touched(bytes), dst = alloc_touched(bytes);
  for (auto _ : state) {
#pragma omp parallel
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t chunk = (bytes / nt + 63) / 64 * 64;
      const int64_t begin = std::min(bytes, t * chunk), end = std::min(bytes, begin + chunk);
      std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
    }
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(2.0 * bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Sum of a large buffer: read-only bandwidth, the ceiling of an m = 1 matmul. Each thread
// reads its share as that matmul reads its weights: tiles of 8 sequential streams side by
// side (the 8 panels of a k = 768 bf16 tile), each prefetched 1 KiB ahead.
void BM_MemoryRead(benchmark::State& state) {
  using Line = uint64_t __attribute__((vector_size(64)));
  constexpr int kStreams = 8;
  constexpr int64_t kStream = 16 * 768 * 2, kTile = kStreams * kStream;
  const int64_t tiles = kColdBytes / kTile;
  Buffer src = alloc_touched(tiles * kTile);
  for (auto _ : state) {
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      Line acc[kStreams] = {};
      for (int64_t i = tiles * t / nt; i < tiles * (t + 1) / nt; ++i) {
        const char* tile = src.get() + i * kTile;
        for (int64_t off = 0; off < kStream; off += 64) {
          for (int s = 0; s < kStreams; ++s) {
            const char* at = tile + s * kStream + off;
            __builtin_prefetch(at + 1024);
            acc[s] += *reinterpret_cast<const Line*>(at);
          }
        }
      }
      for (const Line& a : acc)
        for (int l = 0; l < 8; ++l)
          total += a[l];
    }
    benchmark::DoNotOptimize(total);
  }
  state.counters["GB/s"] =
      benchmark::Counter(1.0 * tiles * kTile / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// y = x w^T with a bf16 weight [n, k]; iterations walk through enough packed copies of the
// weight to leave the caches.
// amx false: the fma path, on a machine whose default is the AMX one.
void BM_MatmulBF16(benchmark::State& state, int64_t n, int64_t k, bool amx) {
  const int64_t m = state.range(0);
  const bool saved = amx_matmul();
  set_amx_matmul(amx);
  const auto wf = random_floats(n * k, 1, 0.05f);
  std::vector<uint16_t> w(n * k);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = f32_to_bf16(wf[i]);
  std::vector<PackedWeight> copies;
  copies.emplace_back(w.data(), DType::kBF16, n, k);
  const int64_t count =
      m >= 128 || hot_caches() ? 1 : std::max<int64_t>(1, kColdBytes / copies[0].bytes());
  for (int64_t c = 1; c < count; ++c)
    copies.emplace_back(w.data(), DType::kBF16, n, k);
  const auto x = random_floats(m * k, 2);
  std::vector<float> y(m * n);
  size_t next = 0;
  for (auto _ : state) {
    matmul(x.data(), copies[next], nullptr, m, y.data());
    next = next + 1 == copies.size() ? 0 : next + 1;
    benchmark::ClobberMemory();
  }
  set_amx_matmul(saved || !amx_matmul_available());
  const double bytes = copies[0].bytes() + 4.0 * m * (k + n);
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Decode attention over a bf16 cache: each sequence's context in shuffled blocks; layers
// rotate so that the K and V bytes come from memory.
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t ctx = static_cast<int32_t>(state.range(1));
  const int hq = 12, hkv = 4, D = 64;
  const int32_t blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = int64_t(batch) * blocks_per_seq + 1;
  const int64_t cache_bytes = num_blocks * kBlockSize * hkv * D * 2;
  const int64_t layers = hot_caches() ? 1 : std::max<int64_t>(1, kColdBytes / (2 * cache_bytes));
  std::vector<Buffer> k, v;
  for (int64_t l = 0; l < layers; ++l) {
    k.push_back(alloc_touched(cache_bytes));
    v.push_back(alloc_touched(cache_bytes));
    std::memset(k.back().get(), 0x3c, cache_bytes);  // bf16 0x3c3c ~ 0.0115
    std::memset(v.back().get(), 0x3f, cache_bytes);
  }
  std::vector<int32_t> ids(num_blocks - 1);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(i + 1);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  std::vector<int32_t> starts(batch + 1), lens(batch, ctx);
  for (int32_t s = 0; s <= batch; ++s)
    starts[s] = s;
  const PagedAttentionBatch b{batch, starts.data(), lens.data(), ids.data(), blocks_per_seq, 0};
  const auto q = random_floats(int64_t(batch) * hq * D, 4);
  std::vector<float> out(q.size());
  int64_t next = 0;
  for (auto _ : state) {
    const KVCacheLayer layer{k[next].get(), v[next].get(), DType::kBF16, num_blocks, hkv, D};
    paged_attention_decode(q.data(), layer, b, hq, 0.125f, out.data());
    next = next + 1 == layers ? 0 : next + 1;
    benchmark::ClobberMemory();
  }
  const double bytes = 2.0 * batch * ctx * hkv * D * 2;
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// One prompt of `len` tokens whose keys and values are in the cache, attended in one
// call (the attention of a prefill step, one layer).
void BM_PagedAttentionPrefill(benchmark::State& state) {
  const int32_t len = static_cast<int32_t>(state.range(0));
  const int hq = 12, hkv = 4, D = 64;
  const int32_t blocks = (len + kBlockSize - 1) / kBlockSize;
  const int64_t cache_bytes = int64_t(blocks + 1) * kBlockSize * hkv * D * 2;
  Buffer k = alloc_touched(cache_bytes), v = alloc_touched(cache_bytes);
  const auto kv = random_floats(int64_t(blocks + 1) * kBlockSize * hkv * D, 5);
  for (int64_t i = 0; i < int64_t(kv.size()); ++i) {
    const uint16_t h = f32_to_bf16(kv[i]);
    std::memcpy(k.get() + 2 * i, &h, 2);
    std::memcpy(v.get() + 2 * ((i * 7 + 3) % int64_t(kv.size())), &h, 2);
  }
  std::vector<int32_t> ids(blocks);
  for (int32_t i = 0; i < blocks; ++i)
    ids[i] = i + 1;
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  const std::vector<int32_t> starts = {0, len}, lens = {len};
  const PagedAttentionBatch b{1, starts.data(), lens.data(), ids.data(), blocks, 0};
  const auto q = random_floats(int64_t(len) * hq * D, 4);
  std::vector<float> out(q.size());
  const KVCacheLayer layer{k.get(), v.get(), DType::kBF16, blocks + 1, hkv, D};
  for (auto _ : state) {
    paged_attention(q.data(), layer, b, hq, 0.125f, out.data());
    benchmark::ClobberMemory();
  }
  // Multiply-adds of the scores and of the weighted values: len (len + 1) / 2 pairs.
  const double flops = 2.0 * 2.0 * hq * D * len * (len + 1) / 2.0;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// A decode step's draws: `rows` rows of `vocab` logits at temperature 0.8 and top_p 0.95
// (common chat settings). The logits are normal with standard deviation `sigma`: 1 is
// as flat as a random-weight model's (top-p keeps most of the vocabulary), 4 is peaked.
void BM_SampleTopKTopP(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = state.range(1);
  const auto logits = random_floats(rows * vocab, 6, static_cast<float>(state.range(2)));
  const std::vector<float> temperature(rows, 0.8f), top_p(rows, 0.95f), min_p(rows, 0.0f);
  const std::vector<int32_t> top_k(rows, 0);
  std::vector<double> uniform(rows);
  std::mt19937 rng(7);
  std::vector<int32_t> out(rows);
  for (auto _ : state) {
    for (double& u : uniform)
      u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const SamplingRows params{temperature.data(), top_k.data(), top_p.data(), min_p.data(),
                              uniform.data()};
    sample_top_k_top_p(logits.data(), rows, vocab, params, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

// Greedy decoding's pick: the first maximum of each of `rows` rows of `vocab` logits.
void BM_Argmax(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = state.range(1);
  const auto logits = random_floats(rows * vocab, 8);
  std::vector<int32_t> out(rows);
  for (auto _ : state) {
    argmax(logits.data(), rows, vocab, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(rows * vocab * sizeof(float)) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  benchmark::RegisterBenchmark("BM_MemoryCopy", BM_MemoryCopy)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_MemoryRead", BM_MemoryRead)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  // The matrices a decode step of the bench model runs: q|k|v and gate|up are fused.
  for (const Shape& s : {Shape{"qkv_1280x768", 1280, 768}, Shape{"o_768x768", 768, 768},
                         Shape{"gate_up_4096x768", 4096, 768}, Shape{"down_768x2048", 768, 2048},
                         Shape{"lm_head_32000x768", 32000, 768}}) {
    const int64_t n = s.n, k = s.k;
    // On a machine with AMX, BM_MatmulBF16 runs its path and BM_MatmulBF16FMA the other.
    for (bool amx : {true, false}) {
      if (!amx && !amx_matmul_available()) continue;
      const std::string name = std::string(amx ? "BM_MatmulBF16/" : "BM_MatmulBF16FMA/") + s.name;
      benchmark::RegisterBenchmark(
          name.c_str(), [n, k, amx](benchmark::State& st) { BM_MatmulBF16(st, n, k, amx); })
          ->ArgName("m")
          ->Arg(1)
          ->Arg(5)
          ->Arg(6)
          ->Arg(8)
          ->Arg(16)
          ->Arg(32)
          ->Arg(64)
          ->Arg(96)
          ->Arg(512)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("BM_PagedAttentionDecode", BM_PagedAttentionDecode)
      ->ArgNames({"batch", "ctx"})
      ->Args({16, 512})
      ->Args({4, 2048})
      ->Args({1, 4096})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_PagedAttentionPrefill", BM_PagedAttentionPrefill)
      ->ArgName("len")
      ->Arg(512)
      ->Arg(2048)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Argmax", BM_Argmax)
      ->ArgNames({"rows", "vocab"})
      ->Args({1, 32000})
      ->Args({32, 32000})
      ->Args({256, 32000})
      ->Args({1, 128256})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_SampleTopKTopP", BM_SampleTopKTopP)
      ->ArgNames({"rows", "vocab", "sigma"})
      ->Args({1, 32000, 1})
      ->Args({1, 32000, 4})
      ->Args({32, 32000, 1})
      ->Args({32, 32000, 4})
      ->Args({1, 128256, 4})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

}  // namespace
}  // namespace pagellm::kernels::cpu

int main(int argc, char** argv) {
  pagellm::kernels::cpu::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
