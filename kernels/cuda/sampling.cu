// Sampling kernels: penalties, argmax (greedy) and top-k / top-p / min-p sampling, one
// thread block per row. The sampler follows kernels::cpu::sample_top_k_top_p (engine/Sampler's
// draw) without sorting the vocabulary:
//
//   Every set of tokens the sampler keeps is a prefix of the ranking "larger weight first,
//   lower id first on ties", so it is written as a cut {tau, id}: the tokens with weight
//   above tau, and those with weight exactly tau and id <= id. A cut is found in two steps:
//   a bisection over the bits of tau (weights are non-negative floats, so their bit
//   patterns order like their values; each step is one block-wide count and sum over the
//   row), then, among the tokens whose weight is exactly tau, a block prefix scan in id
//   order for the one that completes the prefix.
//
// Weights are recomputed from the logits in every pass (the same instructions, so the same
// bits) rather than stored: a row of 256k logits is read about a hundred times, from L2
// for small batches. Masses are summed in double, as on the CPU, in a fixed order (each
// thread's elements in index order, then a fixed block tree), so a row's token does not
// depend on the other rows or the run.

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdexcept>
#include <string>

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

constexpr uint32_t kInfBits = 0x7f800000u;  // above every weight (all are <= 1)

// The tokens {i : w_i > tau || (w_i == tau && i <= id)}. NaN weights are in no cut.
struct Cut {
  float tau;
  int32_t id;
};

__device__ __forceinline__ bool in_cut(float w, int64_t i, const Cut& c) {
  return w > c.tau || (w == c.tau && i <= c.id);
}

struct CountMass {
  int32_t count;
  double mass;
};

struct AddCountMass {
  __device__ __forceinline__ CountMass operator()(const CountMass& a, const CountMass& b) const {
    return {a.count + b.count, a.mass + b.mass};
  }
};

struct MaxIgnoringNaN {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

using ReduceMax = cub::BlockReduce<float, kSampleThreads>;
using ReduceCountMass = cub::BlockReduce<CountMass, kSampleThreads>;
using ScanInt = cub::BlockScan<int, kSampleThreads>;

// Every block-wide step starts with __syncthreads(), so the storage and the broadcast
// slots are free again (every thread has read the previous step's result).
struct SampleShared {
  union {
    typename ReduceMax::TempStorage max;
    typename ReduceCountMass::TempStorage count_mass;
    typename ScanInt::TempStorage scan;
  } temp;
  float max_value;
  CountMass count_mass;
  int32_t found;
};

// One row's logits and the weight of each token, w = exp(x * (1 / T) - max), rounded
// exactly as the CPU twin: a float32 product, a float32 difference (no fused multiply-add),
// and 1 exactly for the largest.
struct Row {
  const float* logits;
  int64_t vocab;
  float inv_t;
  float max_s;

  __device__ __forceinline__ float scaled(int64_t i) const { return __fmul_rn(logits[i], inv_t); }
  __device__ __forceinline__ float weight(int64_t i) const {
    const float s = scaled(i);
    return s == max_s ? 1.0f : expf(__fsub_rn(s, max_s));
  }
};

__device__ float block_max(float v, SampleShared& sh) {
  __syncthreads();
  const float m = ReduceMax(sh.temp.max).Reduce(v, MaxIgnoringNaN());
  if (threadIdx.x == 0) sh.max_value = m;
  __syncthreads();
  return sh.max_value;
}

// Count and mass of the tokens of `s` whose weight's bits are >= `bits`.
__device__ CountMass count_mass(const Row& row, const Cut& s, uint32_t bits, SampleShared& sh) {
  CountMass local{0, 0.0};
  for (int64_t i = threadIdx.x; i < row.vocab; i += kSampleThreads) {
    const float w = row.weight(i);
    if (in_cut(w, i, s) && __float_as_uint(w) >= bits) {
      ++local.count;
      local.mass += static_cast<double>(w);
    }
  }
  __syncthreads();
  const CountMass total = ReduceCountMass(sh.temp.count_mass).Reduce(local, AddCountMass());
  if (threadIdx.x == 0) sh.count_mass = total;
  __syncthreads();
  return sh.count_mass;
}

// The id of the r-th token (1-based, by ascending id) of `s` whose weight is exactly
// `tau`; -1 when there are fewer. One scan per chunk of kSampleThreads ids, stopping at
// the chunk that holds it.
__device__ int32_t nth_tie(const Row& row, const Cut& s, float tau, int32_t r, SampleShared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  int32_t before = 0;  // ties in the chunks already scanned (the same in every thread)
  for (int64_t base = 0; base < row.vocab; base += kSampleThreads) {
    const int64_t i = base + threadIdx.x;
    int flag = 0;
    if (i < row.vocab) {
      const float w = row.weight(i);
      flag = in_cut(w, i, s) && w == tau;
    }
    int prefix = 0, chunk_ties = 0;
    ScanInt(sh.temp.scan).ExclusiveSum(flag, prefix, chunk_ties);
    if (flag && before + prefix + 1 == r) sh.found = static_cast<int32_t>(i);
    before += chunk_ties;
    __syncthreads();  // `found` is visible; the scan storage may be reused
    if (before >= r) break;
  }
  return sh.found;
}

// The k most likely tokens of `s` (1 <= k <= |s|): the cut whose last token is the k-th of
// the ranking.
__device__ Cut rank_cut(const Row& row, const Cut& s, int32_t k, SampleShared& sh) {
  // Invariant: count(lo) >= k > count(hi). count(0) = |s|, count(inf) = 0.
  uint32_t lo = 0, hi = kInfBits;
  int32_t count_hi = 0;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const int32_t c = count_mass(row, s, mid, sh).count;
    if (c >= k) {
      lo = mid;
    } else {
      hi = mid;
      count_hi = c;
    }
  }
  // tau is the k-th largest weight; count_hi tokens are above it.
  const float tau = __uint_as_float(lo);
  const int32_t id = nth_tie(row, s, tau, k - count_hi, sh);
  return {tau, id < 0 ? INT32_MAX : id};
}

// The shortest prefix of `s` (most likely first) whose mass reaches `target`: mass >=
// target, or mass > target when `strict`. Needs 0 < target <= mass(s) (0 <= target <
// mass(s) when strict); `all` is count_mass(s, 0).
__device__ Cut mass_cut(const Row& row, const Cut& s, CountMass all, double target, bool strict,
                        SampleShared& sh) {
  auto reaches = [&](double m) { return strict ? m > target : m >= target; };
  // Invariant: reaches(mass(lo)) and !reaches(mass(hi)).
  uint32_t lo = 0, hi = kInfBits;
  CountMass at_lo = all, at_hi{0, 0.0};
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const CountMass cm = count_mass(row, s, mid, sh);
    if (reaches(cm.mass)) {
      lo = mid;
      at_lo = cm;
    } else {
      hi = mid;
      at_hi = cm;
    }
  }
  // The tokens above tau (at_hi) fall short; the prefix ends among the `ties` tokens of
  // weight tau (tau > 0: a weight of 0 adds no mass): the r-th of them, the first where
  // mass(above) + r * tau reaches the target, clamped so that float rounding cannot pick
  // a tie that is not there.
  const float tau = __uint_as_float(lo);
  const int32_t ties = at_lo.count - at_hi.count;
  const double need = (target - at_hi.mass) / static_cast<double>(tau);
  double r = strict ? floor(need) + 1.0 : ceil(need);
  r = fmin(fmax(r, 1.0), static_cast<double>(ties > 1 ? ties : 1));
  const int32_t id = nth_tie(row, s, tau, static_cast<int32_t>(r), sh);
  return {tau, id < 0 ? INT32_MAX : id};
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ logits, int64_t vocab, SamplingRows params,
                  int32_t* __restrict__ out) {
  __shared__ SampleShared sh;
  const int64_t r = blockIdx.x;
  // A row this call does not sample (temperature <= 0) keeps its output untouched.
  if (!(params.temperature[r] > 0.0f)) return;
  Row row;
  row.logits = logits + r * vocab;
  row.vocab = vocab;
  row.inv_t = __fdiv_rn(1.0f, params.temperature[r]);
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kSampleThreads)
    m = fmaxf(m, row.scaled(i));
  row.max_s = block_max(m, sh);

  // Every value below is the same in all threads (block-wide results), so every branch is
  // taken by the whole block, as the __syncthreads() inside the steps need.
  int32_t token = 0;
  // min-p: w >= min_p (all non-NaN weights when min_p is 0).
  const float min_p = params.min_p[r];
  const Cut s0{min_p > 0.0f ? fminf(min_p, 1.0f) : 0.0f, INT32_MAX};
  const CountMass all0 = count_mass(row, s0, 0, sh);
  if (all0.count > 0) {
    // top-k
    Cut s1 = s0;
    CountMass all1 = all0;
    const int32_t top_k = params.top_k[r];
    if (top_k > 0 && top_k < all0.count) {
      s1 = rank_cut(row, s0, top_k, sh);
      all1 = count_mass(row, s1, 0, sh);
    }
    // top-p: the shortest prefix with top_p of the mass, at least one token.
    Cut s2 = s1;
    CountMass all2 = all1;
    const float top_p = params.top_p[r];
    if (top_p < 1.0f) {
      const double target = static_cast<double>(top_p) * all1.mass;
      s2 = target > 0.0 ? mass_cut(row, s1, all1, target, false, sh) : rank_cut(row, s1, 1, sh);
      all2 = count_mass(row, s2, 0, sh);
    }
    // The draw: the first token whose running mass exceeds u * (kept mass), or the last
    // kept token when rounding leaves none.
    const double u = fmax(static_cast<double>(params.uniform[r]), 0.0);
    const double threshold = u * all2.mass;
    const Cut pick = threshold < all2.mass ? mass_cut(row, s2, all2, threshold, true, sh)
                                           : rank_cut(row, s2, all2.count, sh);
    token = pick.id;
  }
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
  sample_kernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(logits, vocab, params,
                                                                            out);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::kernels::cuda
