// gemv: y[m, n] = x[m, k] w[n, k]^T for a few rows of x (m <= kGemvMaxRows) and 16-bit
// weights, y in float32 with float32 sums. At these sizes a matmul is a stream over the
// weights; cuBLAS's kernels for them (split-k with a separate reduction, or tiles sized
// for larger m) read Llama 3 8B's q|k|v and o projections at 54% and 30% of an H200's
// copy bandwidth.
//
// Each warp owns kRowsPerWarp rows of w. Lane l reads 16-byte vectors l, l + 32, ... of
// each of its rows (coalesced: a warp reads 512 contiguous bytes of a row per step),
// converts them to float32 (exact), and accumulates their products with the same
// elements of every row of x (read through L1: every warp of the block reads all of x);
// the 32 lanes' partial sums are then added by a butterfly. No shared memory, no
// workspace: the kernel can be captured in a graph like any other.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

constexpr int kGemvThreads = 128;
constexpr int kWarps = kGemvThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kUnroll = 4;  // steps of 32 vectors a lane loads ahead
constexpr unsigned kFullMask = 0xffffffffu;

// Eight 16-bit values (16 bytes, memory order) as float32.
template <DType T>
__device__ __forceinline__ void to_float8(const uint4 r, float (&f)[8]) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (T == DType::kBF16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &w[i], sizeof h);
      const float2 v = __half22float2(h);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

// The weights are read once: streamed past L1 (evict-first), leaving the cache to x.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  return __ldcs(p);
}

template <DType T, int M>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w, int n, int k_vecs,
                float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWarps + threadIdx.x / 32) * kRowsPerWarp;
  if (row0 >= n) return;  // uniform across the warp
  // A row past n (n odd) re-reads the last row; its result is not stored.
  const uint4* rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    rows[r] = w + static_cast<int64_t>(min(row0 + r, n - 1)) * k_vecs;
  float acc[M][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      acc[m][r] = 0.f;
  // kUnroll steps' weights are loaded before any is used: 2 x kUnroll 16-byte loads in
  // flight per lane, whatever the compiler would have batched.
  auto step = [&](int i, const uint4(&raw)[kRowsPerWarp]) {
    float wf[kRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      to_float8<T>(raw[r], wf[r]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      to_float8<T>(__ldg(x + static_cast<int64_t>(m) * k_vecs + i), xf);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          acc[m][r] = fmaf(xf[j], wf[r][j], acc[m][r]);
    }
  };
  int i = lane;
  for (; i + 32 * (kUnroll - 1) < k_vecs; i += 32 * kUnroll) {
    uint4 raw[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        raw[u][r] = load_stream(rows[r] + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      step(i + 32 * u, raw[u]);
  }
  for (; i < k_vecs; i += 32) {
    uint4 raw[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      raw[r] = load_stream(rows[r] + i);
    step(i, raw);
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1)
        acc[m][r] += __shfl_xor_sync(kFullMask, acc[m][r], off);
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (row0 + r < n) y[static_cast<int64_t>(m) * n + row0 + r] = acc[m][r];
  }
}

template <DType T>
void launch(const void* x, const void* w, int m, int n, int k, float* y, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const auto* x4 = static_cast<const uint4*>(x);
  const auto* w4 = static_cast<const uint4*>(w);
  const int kv = k / 8;
  static_assert(kGemvMaxRows == 2, "one instantiation per row count");
  if (m == 1)
    gemv_kernel<T, 1><<<grid, kGemvThreads, 0, stream>>>(x4, w4, n, kv, y);
  else
    gemv_kernel<T, 2><<<grid, kGemvThreads, 0, stream>>>(x4, w4, n, kv, y);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gemv_supports(DType dtype, int64_t m, int64_t n, int64_t k, const void* x, const void* w) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && m >= 1 && m <= kGemvMaxRows && n >= 1 &&
         n <= (int64_t(1) << 30) && k >= 8 && k % 8 == 0 && k <= (int64_t(1) << 30) &&
         aligned16(x) && aligned16(w);
}

void gemv(const void* x, const void* w, DType dtype, int64_t m, int64_t n, int64_t k, float* y,
          cudaStream_t stream) {
  if (!gemv_supports(dtype, m, n, k, x, w))
    throw std::invalid_argument("gemv: unsupported shape or alignment: m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  if (dtype == DType::kBF16)
    launch<DType::kBF16>(x, w, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), y,
                         stream);
  else
    launch<DType::kF16>(x, w, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), y,
                        stream);
}

}  // namespace pagellm::kernels::cuda
