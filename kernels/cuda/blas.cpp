// Blas: y = x w^T through cuBLAS, float32 accumulation, on one stream, with a workspace
// allocated once so that the matmuls of a decode step can be captured in a CUDA graph.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

// As PAGELLM_CUDA_CHECK, for cuBLAS calls.
#define PAGELLM_CUBLAS_CHECK(call)                                                        \
  do {                                                                                    \
    const cublasStatus_t _pagellm_status = (call);                                        \
    if (_pagellm_status != CUBLAS_STATUS_SUCCESS) {                                       \
      ::pagellm::kernels::cuda::throw_cuda_error(#call, __FILE__, __LINE__,               \
                                                 cublasGetStatusString(_pagellm_status)); \
    }                                                                                     \
  } while (0)

namespace pagellm::kernels::cuda {
namespace {

// cuBLAS's recommendation for Hopper (and ample for Ampere).
constexpr size_t kWorkspaceBytes = 32u << 20;

cublasHandle_t as_handle(void* h) {
  return static_cast<cublasHandle_t>(h);
}

// PAGELLM_GEMV=0 sends every shape to cuBLAS (to compare the two).
bool gemv_enabled() {
  static const bool enabled = [] {
    const char* e = std::getenv("PAGELLM_GEMV");
    return e == nullptr || std::string(e) != "0";
  }();
  return enabled;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  throw std::invalid_argument("Blas: unknown dtype " + std::to_string(static_cast<int>(t)));
}

}  // namespace

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t handle = nullptr;
  PAGELLM_CUBLAS_CHECK(cublasCreate(&handle));
  // The destructor does not run when the constructor throws: release by hand.
  void* workspace = nullptr;
  try {
    // The stream first: cublasSetStream resets the handle to cuBLAS's own workspace pool.
    PAGELLM_CUBLAS_CHECK(cublasSetStream(handle, stream_));
    // Default math: no TF32 for float32 operands (the compute type below also says so).
    PAGELLM_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    PAGELLM_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    PAGELLM_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, kWorkspaceBytes));
  } catch (...) {
    if (workspace != nullptr) cudaFree(workspace);
    cublasDestroy(handle);
    throw;
  }
  handle_ = handle;
  workspace_ = workspace;
}

Blas::~Blas() {
  // Never throws: statuses are ignored. cublasDestroy waits for the handle's work, so the
  // workspace is no longer in use when it is freed.
  if (handle_ != nullptr) cublasDestroy(as_handle(handle_));
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void Blas::matmul(const void* x, const void* w, DType dtype, int64_t m, int64_t n, int64_t k,
                  float* y, bool allow_gemv) {
  if (m < 0 || n < 0 || k < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX)
    throw std::invalid_argument("Blas::matmul: shape out of range: m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  if (m == 0 || n == 0) return;
  if (allow_gemv && gemv_enabled() && gemv_supports(dtype, m, n, k, x, w)) {
    gemv(x, w, dtype, m, n, k, y, stream_);
    return;
  }
  if (k == 0) {
    // An empty sum: zeros (cuBLAS need not touch C when k is 0).
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(m) * n * sizeof(float), stream_));
    return;
  }
  // Row-major y[m, n] = x[m, k] w[n, k]^T is column-major y^T[n, m] = w^T x^T: A = w read
  // transposed (column-major [k, n], lda = k), B = x as is (column-major [k, m], ldb = k),
  // C = y (column-major [n, m], ldc = n).
  const cudaDataType_t t = cuda_type(dtype);
  // float32 operands: the pedantic compute type rules out TF32 even when the environment
  // (NVIDIA_TF32_OVERRIDE) asks for it. 16-bit operands: tensor cores, float32 sums.
  const cublasComputeType_t compute =
      dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  PAGELLM_CUBLAS_CHECK(cublasGemmEx(as_handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki,
                                    &alpha, w, t, ki, x, t, ki, &beta, y, CUDA_R_32F, ni, compute,
                                    CUBLAS_GEMM_DEFAULT));
}

}  // namespace pagellm::kernels::cuda
