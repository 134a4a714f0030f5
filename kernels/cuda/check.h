#pragma once
// One check for every CUDA runtime and cuBLAS call: a failure throws CudaError naming
// the call, the file and line, and the runtime's message. Kernel launches are checked
// with PAGELLM_CUDA_CHECK_LAUNCH() right after the launch.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pagellm::kernels::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_cuda_error(const char* call, const char* file, int line,
                                          const std::string& message) {
  throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  message);
}

}  // namespace pagellm::kernels::cuda

#define PAGELLM_CUDA_CHECK(call)                                                    \
  do {                                                                              \
    const cudaError_t _pagellm_err = (call);                                        \
    if (_pagellm_err != cudaSuccess) {                                              \
      ::pagellm::kernels::cuda::throw_cuda_error(#call, __FILE__, __LINE__,         \
                                                 cudaGetErrorString(_pagellm_err)); \
    }                                                                               \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows here, not at the next sync.
#define PAGELLM_CUDA_CHECK_LAUNCH() PAGELLM_CUDA_CHECK(cudaGetLastError())
