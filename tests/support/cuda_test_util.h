#pragma once
// Helpers for the CUDA kernel tests: skip without a GPU, device buffers, poisoned
// outputs, and the relative error the tests judge by (||out - ref|| / ||ref||).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "support/test_seed.h"

namespace pagellm::kernels::cuda::testing {

// True when a CUDA device can run kernels here. Tests call PAGELLM_REQUIRE_GPU() first.
inline bool gpu_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

#define PAGELLM_REQUIRE_GPU()                                                       \
  do {                                                                              \
    if (!::pagellm::kernels::cuda::testing::gpu_available())                        \
      GTEST_SKIP() << "no CUDA device: the CUDA tests run on a machine with a GPU"; \
  } while (0)

#define PAGELLM_TEST_CUDA(call)                                            \
  do {                                                                     \
    const cudaError_t _e = (call);                                         \
    ASSERT_EQ(_e, cudaSuccess) << #call << ": " << cudaGetErrorString(_e); \
  } while (0)

// A device allocation of `bytes`, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      throw std::runtime_error("cudaMalloc of " + std::to_string(bytes) + " bytes failed");
    }
  }
  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    if (!host.empty()) cudaMemcpy(b.ptr_, host.data(), b.bytes_, cudaMemcpyHostToDevice);
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Fills every byte with 0xFF: a float32 NaN, a 16-bit NaN, and -1 as an integer.
  void poison() const { cudaMemset(ptr_, 0xFF, bytes_); }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), ptr_, host.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using pagellm::testing::fresh_seed;
using pagellm::testing::seed_trace;

// A blocking stream: ordered after the synchronous uploads and memsets of DeviceBuffer.
class Stream {
 public:
  Stream() {
    if (cudaStreamCreate(&s_) != cudaSuccess) throw std::runtime_error("cudaStreamCreate failed");
  }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Raw bytes of `dtype` values as float32.
inline std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = load_f32(bytes.data(), dtype, static_cast<int64_t>(i));
  return out;
}

// ||out - ref|| / ||ref|| in float64; infinity when any output is NaN or infinite (an
// unwritten, poisoned element shows as NaN).
inline double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    const double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Thresholds for relative_error (the method the project measures kernels by):
// float32 arithmetic in a different order lands far under 1e-5; outputs rounded to a
// 16-bit format once land near their unit roundoff.
inline double tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 2e-3;
    case DType::kBF16:
      return 1e-2;
  }
  return 0;
}

}  // namespace pagellm::kernels::cuda::testing
