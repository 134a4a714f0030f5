// Decode attention on the GPU (kernels::cuda::paged_attention_decode) against the device's
// copy bandwidth: 32 query heads / 8 KV heads of 128, bf16 cache, bf16 output, at
// batch x context 1 x 32768, 16 x 4096, 64 x 1024 and 256 x 2048.
//   pagellm_cuda_attention_bench [--shapes BxC,...] [--partitions P,...] [--json FILE]
// --partitions: partition lengths to time each shape at (0: the kernel's own choice,
// the default). The header also gives the partition kernel's shared memory per block and
// how many of its blocks a multiprocessor runs at once.
// Bytes counted per launch: K and V of every context token, q (float32) and out (bf16);
// GB/s = those bytes / the median launch time (>= 50 launches after warm-up, CUDA events
// around each). The copy bandwidth is a 1 GiB device-to-device copy, bytes read plus
// written. Caches hold random values in shuffled block ids; successive launches rotate
// over copies of the cache (distinct blocks) totalling at least 1 GiB, far past the L2,
// so every launch reads its K and V from HBM as a real decode step does.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/cuda_bandwidth.h"
#include "bench/cuda_bench_util.h"
#include "bench/list_options.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

using bench::Device;

constexpr int kQHeads = 32, kKVHeads = 8, kHeadDim = 128;
constexpr DType kCache = DType::kBF16, kOut = DType::kBF16;
constexpr int64_t kMinRotationBytes = int64_t(1) << 30;
constexpr int kWarmup = 10, kTimed = 100;

struct Result {
  int batch, context, partition;
  double us, bytes, gbps, percent;
};

Result run_shape(int batch, int context, int partition, double copy_gbps, uint64_t seed) {
  if (partition == 0) partition = decode_partition_tokens(batch, kKVHeads, context);
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t kv_bytes_per_copy =
      int64_t(batch) * blocks_per_seq * kBlockSize * kKVHeads * kHeadDim * dtype_size(kCache) * 2;
  const int copies = static_cast<int>(
      std::max<int64_t>(2, (kMinRotationBytes + kv_bytes_per_copy - 1) / kv_bytes_per_copy));
  const int64_t num_blocks = 1 + copies * batch * blocks_per_seq;  // block 0 unused
  const int64_t cache_elems = num_blocks * kBlockSize * kKVHeads * kHeadDim;

  Device k(cache_elems * dtype_size(kCache)), v(cache_elems * dtype_size(kCache));
  fill_uniform(k.get(), kCache, cache_elems, 1.0f, seed, nullptr);
  fill_uniform(v.get(), kCache, cache_elems, 1.0f, seed + 1, nullptr);
  const int64_t q_elems = int64_t(batch) * kQHeads * kHeadDim;
  Device q(q_elems * sizeof(float)), out(q_elems * dtype_size(kOut));
  fill_uniform(q.get(), DType::kF32, q_elems, 1.0f, seed + 2, nullptr);
  Device ws(paged_attention_decode_workspace_bytes(batch, kQHeads, kKVHeads, kHeadDim, context,
                                                   partition));

  // Block tables of each copy: shuffled, distinct block ids.
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  Device tables(ids.size() * sizeof(int32_t));
  upload(tables, ids);
  std::vector<int32_t> starts(batch + 1), lens(batch, context);
  std::iota(starts.begin(), starts.end(), 0);
  Device d_starts(starts.size() * sizeof(int32_t)), d_lens(lens.size() * sizeof(int32_t));
  upload(d_starts, starts);
  upload(d_lens, lens);

  const KVCacheLayer cache{k.get(), v.get(), kCache, num_blocks, kKVHeads, kHeadDim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto launch = [&](int i) {
    const PagedAttentionBatch b{batch,
                                d_starts.get<int32_t>(),
                                d_lens.get<int32_t>(),
                                tables.get<int32_t>() + (i % copies) * batch * blocks_per_seq,
                                static_cast<int32_t>(blocks_per_seq),
                                0};
    paged_attention_decode(q.get<float>(), cache, b, context, kQHeads, scale, ws.get(), out.get(),
                           kOut, nullptr, partition);
  };

  const double us = bench::median_launch_us(launch, kWarmup, kTimed);
  Result r{batch, context, partition, us, 0, 0, 0};
  r.bytes = double(batch) * context * kKVHeads * kHeadDim * dtype_size(kCache) * 2 +
            double(q_elems) * sizeof(float) + double(q_elems) * dtype_size(kOut);
  r.gbps = r.bytes / (r.us * 1e-6) / 1e9;
  r.percent = 100.0 * r.gbps / copy_gbps;
  return r;
}

// "16x4096,64x1024" -> {{16, 4096}, {64, 1024}}.
std::vector<std::pair<int, int>> parse_shapes(const std::string& text) {
  std::vector<std::pair<int, int>> shapes;
  for (const std::string& item : bench::split_list(text)) {
    int batch = 0, context = 0;
    char x = 0, extra = 0;
    if (std::sscanf(item.c_str(), "%d%c%d%c", &batch, &x, &context, &extra) != 3 || x != 'x' ||
        batch <= 0 || context <= 0)
      throw std::runtime_error("--shapes: '" + item + "' is not BATCHxCONTEXT");
    shapes.emplace_back(batch, context);
  }
  if (shapes.empty()) throw std::runtime_error("--shapes: no BATCHxCONTEXT given");
  return shapes;
}

int run(int argc, char** argv) {
  std::string json;
  std::vector<std::pair<int, int>> shapes = {{1, 32768}, {16, 4096}, {64, 1024}, {256, 2048}};
  std::vector<int> partitions = {0};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--shapes" && i + 1 < argc) {
      shapes = parse_shapes(argv[++i]);
    } else if (a == "--partitions" && i + 1 < argc) {
      partitions = bench::parse_int_list(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--shapes BxC,...] [--partitions P,...] [--json FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string device = bench::cuda_device_name();

  const double copy_gbps = bench::measure_cuda_copy_bandwidth();
  std::printf("device: %s\ndevice-to-device copy (1 GiB, read + write): %.0f GB/s\n",
              device.c_str(), copy_gbps);
  const int blocks_per_sm =
      paged_attention_decode_blocks_per_sm(kHeadDim, kQHeads, kKVHeads, kCache);
  const size_t block_smem =
      paged_attention_decode_shared_bytes(kHeadDim, kQHeads, kKVHeads, kCache);
  std::printf(
      "decode attention: %d query / %d KV heads of %d, bf16 cache, bf16 out, on %s\n"
      "partition kernel: %zu bytes of shared memory a block (its layout), %d blocks a "
      "multiprocessor\n",
      kQHeads, kKVHeads, kHeadDim,
      paged_attention_decode_tensor_cores(kCache, kHeadDim) ? "tensor cores" : "CUDA cores",
      block_smem, blocks_per_sm);
  std::printf("%-14s %9s %10s %12s %10s %10s\n", "batch x ctx", "partition", "us", "MB read",
              "GB/s", "% copy");
  std::vector<Result> results;
  uint64_t seed = 1;
  for (const auto& [batch, context] : shapes) {
    for (int partition : partitions) {
      const Result r = run_shape(batch, context, partition, copy_gbps, seed += 10);
      results.push_back(r);
      const std::string shape = std::to_string(r.batch) + " x " + std::to_string(r.context);
      std::printf("%-14s %9d %10.1f %12.1f %10.0f %9.1f%%\n", shape.c_str(), r.partition, r.us,
                  r.bytes / 1e6, r.gbps, r.percent);
      std::fflush(stdout);
    }
  }

  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"device\": \"%s\",\n  \"copy_gbps\": %.1f,\n  \"num_q_heads\": %d,\n"
                 "  \"num_kv_heads\": %d,\n  \"head_dim\": %d,\n  \"cache_dtype\": \"bf16\",\n"
                 "  \"out_dtype\": \"bf16\",\n  \"tensor_cores\": %s,\n"
                 "  \"block_shared_bytes\": %zu,\n  \"blocks_per_sm\": %d,\n  \"results\": [\n",
                 device.c_str(), copy_gbps, kQHeads, kKVHeads, kHeadDim,
                 paged_attention_decode_tensor_cores(kCache, kHeadDim) ? "true" : "false",
                 block_smem, blocks_per_sm);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"batch\": %d, \"context\": %d, \"partition_tokens\": %d, "
                   "\"us\": %.2f, \"bytes\": %.0f, \"gbps\": %.1f, \"percent_of_copy\": %.1f}%s\n",
                   r.batch, r.context, r.partition, r.us, r.bytes, r.gbps, r.percent,
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace pagellm::kernels::cuda

int main(int argc, char** argv) {
  return pagellm::bench::bench_main(pagellm::kernels::cuda::run, argc, argv);
}
