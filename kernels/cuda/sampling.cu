// Sampling kernels: penalties, argmax (greedy) and top-k / top-p / min-p sampling, one
// thread block per row. The sampler's steps are in block_sampler.h (a radix select over
// the ranking, with integer masses), run here by a block of kSampleThreads threads.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdexcept>
#include <string>

#include "kernels/cuda/block_sampler.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

constexpr int kPenaltyThreads = 128;
constexpr int kArgmaxThreads = 512;
constexpr int kSampleThreads = 512;

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("CUDA kernel: ") + what);
}

// ---------------------------------------------------------------------------------------
// apply_penalties

// The CPU twin's operations with explicit rounding (nvcc would otherwise fuse the
// frequency product into the subtraction).
__global__ void __launch_bounds__(kPenaltyThreads)
    penalties_kernel(float* __restrict__ logits, int64_t vocab,
                     const PenaltyRow* __restrict__ penalty_rows,
                     const PenaltyToken* __restrict__ tokens) {
  const PenaltyRow row = penalty_rows[blockIdx.x];
  float* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  for (int32_t i = row.begin + static_cast<int32_t>(threadIdx.x); i < row.end;
       i += kPenaltyThreads) {
    const PenaltyToken t = tokens[i];
    if (t.token < 0 || t.token >= vocab) continue;
    float v = x[t.token];
    if (t.flags & kPenaltyHasBias) v = __fadd_rn(v, t.bias);
    if (row.repetition != 1.0f && ((t.flags & kPenaltyInPrompt) || t.output_count > 0)) {
      v = v > 0.0f ? __fdiv_rn(v, row.repetition) : __fmul_rn(v, row.repetition);
    }
    if (t.output_count > 0 && (row.presence != 0.0f || row.frequency != 0.0f)) {
      const float count = static_cast<float>(t.output_count);
      v = __fsub_rn(v, __fadd_rn(row.presence, __fmul_rn(row.frequency, count)));
    }
    x[t.token] = v;
  }
}

// ---------------------------------------------------------------------------------------
// argmax

struct Best {
  float value;
  int32_t index;  // -1: no value seen (or only NaN)
};

// The larger value, the lower index on ties; a total order, so the block tree's shape
// cannot change the winner.
struct PickBest {
  __device__ __forceinline__ Best operator()(const Best& a, const Best& b) const {
    if (b.index < 0) return a;
    if (a.index < 0) return b;
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
};

template <bool kVec>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ out) {
  using BlockReduce = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  Best best{0.0f, -1};
  // A thread visits its elements in increasing index order: strict > keeps the first.
  auto visit = [&](float x, int64_t i) {
    if (!isnan(x) && (best.index < 0 || x > best.value)) best = {x, static_cast<int32_t>(i)};
  };
  if constexpr (kVec) {
    for (int64_t j = 4 * static_cast<int64_t>(threadIdx.x); j < vocab; j += 4 * kArgmaxThreads) {
      const float4 q = *reinterpret_cast<const float4*>(row + j);
      visit(q.x, j);
      visit(q.y, j + 1);
      visit(q.z, j + 2);
      visit(q.w, j + 3);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kArgmaxThreads)
      visit(row[j], j);
  }
  const Best b = BlockReduce(storage).Reduce(best, PickBest());
  if (threadIdx.x == 0) out[blockIdx.x] = b.index < 0 ? 0 : b.index;
}

// ---------------------------------------------------------------------------------------
// sample_top_k_top_p

using block_sampler::Tally;
using block_sampler::u64;

// Ranking n gathered tokens costs each thread n * n / kSampleThreads comparisons: at 512,
// about as much as a pass over a row of 128k.
constexpr int kGatherTokens = 512;

struct MaxIgnoringNaN {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct AddTally {
  __device__ __forceinline__ Tally operator()(const Tally& a, const Tally& b) const {
    return a + b;
  }
};

// block_sampler's block interface on the device: each step between barriers.
struct DeviceBlock {
  static constexpr int kThreads = kSampleThreads;
  static constexpr int kGather = kGatherTokens;
  using Shared = block_sampler::Shared<kGather>;
  // The warp-wise algorithms: their shared storage is per warp, not per thread.
  using ReduceMax = cub::BlockReduce<float, kThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>;
  using ReduceTally = cub::BlockReduce<Tally, kThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>;
  using ScanTally = cub::BlockScan<Tally, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  struct Storage {
    Shared shared;
    union {
      typename ReduceMax::TempStorage max;
      typename ReduceTally::TempStorage sum;
      typename ScanTally::TempStorage scan;
    } temp;
    float max_value;
    Tally tally;
  };

  Storage& s;

  __device__ __forceinline__ Shared& shared() { return s.shared; }

  template <class F>
  __device__ __forceinline__ void each(F f) {
    __syncthreads();
    f(static_cast<int>(threadIdx.x));
    __syncthreads();
  }

  // f(t) of every thread combined by `op`, broadcast through `slot`.
  template <class Reduce, class T, class F, class Op>
  __device__ __forceinline__ T reduce(typename Reduce::TempStorage& temp, T& slot, F f, Op op) {
    __syncthreads();
    const T total = Reduce(temp).Reduce(f(static_cast<int>(threadIdx.x)), op);
    if (threadIdx.x == 0) slot = total;
    __syncthreads();
    return slot;
  }
  template <class F>
  __device__ __forceinline__ float reduce_max(F f) {
    return reduce<ReduceMax>(s.temp.max, s.max_value, f, MaxIgnoringNaN());
  }
  template <class F>
  __device__ __forceinline__ Tally sum(F f) {
    return reduce<ReduceTally>(s.temp.sum, s.tally, f, AddTally());
  }

  template <class F, class G>
  __device__ __forceinline__ Tally scan(F f, G g) {
    __syncthreads();
    const Tally v = f(static_cast<int>(threadIdx.x));
    Tally before, total;
    ScanTally(s.temp.scan).ExclusiveScan(v, before, Tally{0, 0}, AddTally(), total);
    g(static_cast<int>(threadIdx.x), before);
    __syncthreads();
    return total;
  }

  static __device__ __forceinline__ uint32_t atomic_add(uint32_t* p, uint32_t v) {
    return atomicAdd(p, v);
  }
  // The CPU twin's rounding: a float32 product and a float32 difference, never fused.
  static __device__ __forceinline__ float scaled(float x, float inv_t) {
    return __fmul_rn(x, inv_t);
  }
  static __device__ __forceinline__ float exp_diff(float s, float m) {
    return expf(__fsub_rn(s, m));
  }
  static __device__ __forceinline__ float recip(float t) { return __fdiv_rn(1.0f, t); }
  static __device__ __forceinline__ u64 quantize(float x) { return __float2ull_rn(x); }
};

__global__ void __launch_bounds__(kSampleThreads, 2)
    sample_kernel(const float* __restrict__ logits, int64_t vocab, SamplingRows params,
                  float mass_scale, int32_t* __restrict__ out) {
  __shared__ DeviceBlock::Storage storage;
  const int64_t r = blockIdx.x;
  // A row this call does not sample (temperature <= 0) keeps its output untouched.
  const float temperature = params.temperature[r];
  if (!(temperature > 0.0f)) return;
  DeviceBlock block{storage};
  const int32_t token =
      block_sampler::sample_row(block, logits + r * vocab, vocab, temperature, params.top_k[r],
                                params.top_p[r], params.min_p[r], params.uniform[r], mass_scale);
  if (threadIdx.x == 0) out[r] = token >= 0 && token < vocab ? token : 0;
}

}  // namespace

void apply_penalties(float* logits, int64_t rows, int64_t vocab, const PenaltyRow* penalty_rows,
                     const PenaltyToken* tokens, cudaStream_t stream) {
  require(rows >= 0, "apply_penalties: negative row count");
  if (rows == 0) return;
  require(vocab > 0, "apply_penalties: vocab out of range");
  require(rows <= INT32_MAX, "apply_penalties: too many rows");
  penalties_kernel<<<static_cast<unsigned>(rows), kPenaltyThreads, 0, stream>>>(
      logits, vocab, penalty_rows, tokens);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream) {
  require(rows >= 0, "argmax: negative row count");
  if (rows == 0) return;
  require(vocab > 0 && vocab <= INT32_MAX, "argmax: vocab out of range");
  require(rows <= INT32_MAX, "argmax: too many rows");
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vec) {
    argmax_kernel<true><<<grid, kArgmaxThreads, 0, stream>>>(logits, vocab, out);
  } else {
    argmax_kernel<false><<<grid, kArgmaxThreads, 0, stream>>>(logits, vocab, out);
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void sample_top_k_top_p(const float* logits, int64_t rows, int64_t vocab,
                        const SamplingRows& params, int32_t* out, cudaStream_t stream) {
  require(rows >= 0, "sample_top_k_top_p: negative row count");
  if (rows == 0) return;
  require(vocab > 0 && vocab < INT32_MAX, "sample_top_k_top_p: vocab out of range");
  require(rows <= INT32_MAX, "sample_top_k_top_p: too many rows");
  sample_kernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
      logits, vocab, params, block_sampler::mass_scale(vocab), out);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::kernels::cuda
