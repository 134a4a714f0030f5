#pragma once
// The GPU's memory bandwidth as the decode roofline needs it: a large device-to-device
// copy, bytes read plus bytes written, median of several timed with CUDA events.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cuda/check.h"

namespace pagellm::bench {

inline double measure_cuda_copy_bandwidth(size_t bytes = size_t(1) << 30, int reps = 20) {
  void* src = nullptr;
  void* dst = nullptr;
  PAGELLM_CUDA_CHECK(cudaMalloc(&src, bytes));
  PAGELLM_CUDA_CHECK(cudaMalloc(&dst, bytes));
  PAGELLM_CUDA_CHECK(cudaMemset(src, 1, bytes));
  PAGELLM_CUDA_CHECK(cudaMemset(dst, 2, bytes));
  cudaEvent_t start, stop;
  PAGELLM_CUDA_CHECK(cudaEventCreate(&start));
  PAGELLM_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> rates;
  for (int r = 0; r < reps + 3; ++r) {
    PAGELLM_CUDA_CHECK(cudaEventRecord(start));
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    PAGELLM_CUDA_CHECK(cudaEventRecord(stop));
    PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 3) rates.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace pagellm::bench
