#pragma once
// Helpers of the GPU benchmarks: their main(), the device's name, a device allocation
// freed on scope exit, and the median time of a launch, each of many timed with CUDA
// events.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"

namespace pagellm::bench {

// A benchmark's main(): run(argc, argv), or 1 with the message of what it threw.
inline int bench_main(int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

// The name of device 0; throws when there is no CUDA device.
inline std::string cuda_device_name() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw std::runtime_error("no CUDA device: this benchmark needs an NVIDIA GPU");
  cudaDeviceProp prop{};
  PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) {
    if (bytes > 0) PAGELLM_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  ~Device() {
    if (p) cudaFree(p);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p);
  }
};

// v into d (which holds at least v.size() elements).
template <class T>
void upload(const Device& d, const std::vector<T>& v) {
  PAGELLM_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// launch(i) for i = 0 .. warmup + timed - 1 on the default stream; the median time in
// microseconds of the last `timed`, each between its own pair of events.
template <class Launch>
double median_launch_us(Launch launch, int warmup, int timed) {
  for (int i = 0; i < warmup; ++i)
    launch(i);
  std::vector<cudaEvent_t> start(timed), stop(timed);
  for (int i = 0; i < timed; ++i) {
    PAGELLM_CUDA_CHECK(cudaEventCreate(&start[i]));
    PAGELLM_CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < timed; ++i) {
    PAGELLM_CUDA_CHECK(cudaEventRecord(start[i]));
    launch(warmup + i);
    PAGELLM_CUDA_CHECK(cudaEventRecord(stop[i]));
  }
  PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> us(timed);
  for (int i = 0; i < timed; ++i) {
    float ms = 0;
    PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1e3 * ms;
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  std::sort(us.begin(), us.end());
  return us[timed / 2];
}

}  // namespace pagellm::bench
