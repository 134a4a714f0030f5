// Blas::matmul (cuBLAS) against the CPU matmul on the same rounded inputs: x is rounded to
// the weight dtype first, so both sides multiply the same numbers (products of 16-bit
// values are exact in float32) and differ only in the order of the float32 sums.
// Fresh random inputs each run; PAGELLM_TEST_SEED=N replays one. Skipped without a GPU.

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "support/cuda_test_util.h"
#include "support/kernel_test_util.h"

namespace pagellm::kernels::cuda {
namespace {

using cpu::testing::encode;
using cpu::testing::random_floats;
using testing::decode;
using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::relative_error;
using testing::seed_trace;
using testing::Stream;

// float32 sums in another order: ~sqrt(k) * 2^-24 relative, far under 1e-5 up to k = 11008.
// 16-bit operands go through tensor cores, whose float32 accumulation may truncate rather
// than round between steps: a looser bound, still well under 1e-4.
double matmul_tolerance(DType t) {
  return t == DType::kF32 ? 1e-5 : 1e-4;
}

struct Shape {
  int64_t m, n, k;
};

struct Operands {
  std::vector<uint8_t> x, w;  // in the weight dtype
  std::vector<float> x_rounded;
  std::vector<float> expected;  // [m, n]
};

// The CPU reference: the packed matmul, equal bit for bit to matmul_reference on its fma
// path and to rounding on its AMX one (both tested in cpu_kernels_test), and much faster on
// the large shapes.
Operands make_operands(const Shape& s, DType t, std::mt19937& rng) {
  Operands o;
  o.x = encode(random_floats(s.m * s.k, rng()), t);
  o.w = encode(random_floats(s.n * s.k, rng(), 0.05f), t);
  o.x_rounded = decode(o.x, t);
  o.expected.resize(s.m * s.n);
  const cpu::PackedWeight packed(o.w.data(), t, s.n, s.k);
  cpu::matmul(o.x_rounded.data(), packed, nullptr, s.m, o.expected.data());
  return o;
}

TEST(CudaBlas, MatmulMatchesCpuOnRoundedInputs) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  Stream stream;
  Blas blas(stream);
  EXPECT_EQ(blas.stream(), static_cast<cudaStream_t>(stream));
  // m <= kGemvMaxRows (2) with k a multiple of 8: the gemv kernel (odd n, n not a
  // multiple of its 8 rows a block, k of one vector included); the rest: cuBLAS.
  const Shape shapes[] = {{1, 64, 64},      {7, 64, 4096},    {64, 4096, 64},    {257, 64, 64},
                          {1, 11008, 4096}, {7, 4096, 11008}, {64, 11008, 4096}, {257, 4096, 4096},
                          {3, 1, 5},        {13, 17, 33},     {2, 6144, 4096},   {2, 4096, 14336},
                          {2, 101, 4096},   {1, 4096, 8},     {2, 1, 16},        {4, 4096, 14336}};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& s : shapes) {
      const std::string what = std::string(dtype_name(t)) + " m=" + std::to_string(s.m) +
                               " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
      SCOPED_TRACE(what);
      const Operands o = make_operands(s, t, rng);
      const DeviceBuffer d_x = DeviceBuffer::from(o.x), d_w = DeviceBuffer::from(o.w);
      DeviceBuffer d_y(s.m * s.n * sizeof(float));
      d_y.poison();
      blas.matmul(d_x.get(), d_w.get(), t, s.m, s.n, s.k, d_y.get<float>());
      PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
      const double err = relative_error(d_y.download<float>(), o.expected);
      std::cout << "[ matmul   ] " << what << ": relative error " << err << "\n";
      EXPECT_LE(err, matmul_tolerance(t));
    }
  }
}

// Which shapes the gemv kernel takes (needs no GPU).
TEST(CudaGemv, TakesFewRowsOf16BitWeightsWithWholeVectors) {
  EXPECT_TRUE(gemv_supports(DType::kBF16, 1, 4096, 4096, nullptr, nullptr));
  EXPECT_TRUE(gemv_supports(DType::kF16, kGemvMaxRows, 3, 8, nullptr, nullptr));
  EXPECT_FALSE(gemv_supports(DType::kF32, 1, 4096, 4096, nullptr, nullptr));
  EXPECT_FALSE(gemv_supports(DType::kBF16, kGemvMaxRows + 1, 4096, 4096, nullptr, nullptr));
  EXPECT_FALSE(gemv_supports(DType::kBF16, 0, 4096, 4096, nullptr, nullptr));
  EXPECT_FALSE(gemv_supports(DType::kBF16, 1, 4096, 4100, nullptr, nullptr));  // k % 8
  const auto* odd = reinterpret_cast<const void*>(uintptr_t{2});
  EXPECT_FALSE(gemv_supports(DType::kBF16, 1, 4096, 4096, odd, nullptr));
  EXPECT_FALSE(gemv_supports(DType::kBF16, 1, 4096, 4096, nullptr, odd));
}

TEST(CudaBlas, EmptyShapes) {
  PAGELLM_REQUIRE_GPU();
  Stream stream;
  Blas blas(stream);
  DeviceBuffer d_y(6 * sizeof(float));
  d_y.poison();
  blas.matmul(nullptr, nullptr, DType::kBF16, 0, 3, 8, d_y.get<float>());  // no rows: no-op
  PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
  for (float v : d_y.download<float>())
    EXPECT_TRUE(std::isnan(v)) << "m = 0 wrote";
  DeviceBuffer d_x(16), d_w(16);
  blas.matmul(d_x.get(), d_w.get(), DType::kBF16, 2, 3, 0, d_y.get<float>());  // an empty sum
  PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(d_y.download<float>(), std::vector<float>(6, 0.0f));
}

TEST(CudaBlas, MatmulReplaysFromACapturedGraph) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  Stream stream;
  Blas blas(stream);
  for (const auto& [s, t] :
       {std::pair{Shape{8, 4096, 4096}, DType::kBF16}, std::pair{Shape{8, 4096, 4096}, DType::kF32},
        std::pair{Shape{1, 4096, 4096}, DType::kBF16}}) {  // (gemv)
    SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(s.m));
    const Operands o = make_operands(s, t, rng);
    const DeviceBuffer d_x = DeviceBuffer::from(o.x), d_w = DeviceBuffer::from(o.w);
    DeviceBuffer d_y(s.m * s.n * sizeof(float));
    d_y.poison();
    // No allocation inside: the workspace was set at construction.
    cudaGraph_t graph = nullptr;
    PAGELLM_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    blas.matmul(d_x.get(), d_w.get(), t, s.m, s.n, s.k, d_y.get<float>());
    PAGELLM_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    PAGELLM_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    PAGELLM_TEST_CUDA(cudaGraphLaunch(exec, stream));
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LE(relative_error(d_y.download<float>(), o.expected), matmul_tolerance(t));
    // A second replay over new inputs reads them (the graph holds pointers, not values).
    const Operands o2 = make_operands(s, t, rng);
    PAGELLM_TEST_CUDA(cudaMemcpy(d_x.get(), o2.x.data(), o2.x.size(), cudaMemcpyHostToDevice));
    PAGELLM_TEST_CUDA(cudaMemcpy(d_w.get(), o2.w.data(), o2.w.size(), cudaMemcpyHostToDevice));
    d_y.poison();
    PAGELLM_TEST_CUDA(cudaGraphLaunch(exec, stream));
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LE(relative_error(d_y.download<float>(), o2.expected), matmul_tolerance(t));
    PAGELLM_TEST_CUDA(cudaGraphExecDestroy(exec));
    PAGELLM_TEST_CUDA(cudaGraphDestroy(graph));
  }
}

}  // namespace
}  // namespace pagellm::kernels::cuda
