// CPU kernels other than attention: matmul, norms, rope, SiLU, embedding, KV writes,
// argmax, penalties, sampling. Where kernels.h promises an exact result (matmul vs
// matmul_reference, SIMD vs portable path, thread count, a row alone vs in a batch) the
// test compares bits; against a double-precision reference it uses a tolerance derived
// from float32 rounding.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support/kernel_test_util.h"

namespace pagellm::kernels::cpu {
namespace {

using testing::encode;
using testing::matmul_amx_modes;
using testing::poisoned;
using testing::random_floats;
using testing::rope_inv_freq;
using testing::ScopedAmx;
using testing::ScopedPortable;
using testing::ScopedThreads;
using testing::split_qkv;

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// ---------------------------------------------------------------------------------------
// matmul

struct MatmulCase {
  int64_t m, n, k;
  DType t;
  bool bias;
};

std::string describe(const MatmulCase& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " " + dtype_name(c.t) + (c.bias ? " bias" : "");
}

struct MatmulData {
  std::vector<float> x, bias;
  std::vector<uint8_t> w;
  PackedWeight packed;
};

MatmulData make_matmul(const MatmulCase& c, uint32_t seed) {
  MatmulData d;
  d.x = random_floats(c.m * c.k, seed);
  d.w = encode(random_floats(c.n * c.k, seed + 1, 0.05f), c.t);
  if (c.bias) d.bias = random_floats(c.n, seed + 2);
  d.packed = PackedWeight(d.w.data(), c.t, c.n, c.k);
  return d;
}

std::vector<float> run_matmul(const MatmulData& d, const MatmulCase& c, int64_t m, const float* x) {
  std::vector<float> y = poisoned(m * c.n);
  matmul(x, d.packed, c.bias ? d.bias.data() : nullptr, m, y.data());
  return y;
}

std::string path_name(bool amx) {
  return amx ? "AMX" : "fma";
}

// The fma path (the only one for float32 and float16 weights).
TEST(CpuMatmul, PackedEqualsReferenceBitForBit) {
  ScopedAmx fma(false);
  std::vector<MatmulCase> cases;
  for (DType t : kAllTypes)
    for (int64_t m : {1, 2, 5, 6, 7, 8, 13, 16, 31, 32, 33, 37, 100})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1},
                          {15, 7},
                          {16, 64},
                          {17, 33},
                          {48, 255},
                          {65, 300},
                          {100, 513},
                          {130, 768}})
        cases.push_back({m, n, k, t, (m + n) % 2 == 0});
  for (DType t : kAllTypes) {
    // Several row chunks and k-blocks (an odd last one), and chunks of unequal tile counts.
    cases.push_back({200, 257, 1031, t, true});
    cases.push_back({401, 65, 1600, t, false});
  }
  cases.push_back({3, 32000 / 16, 64, DType::kBF16, false});
  uint32_t seed = 1;
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const MatmulData d = make_matmul(c, seed += 7);
    std::vector<float> ref = poisoned(c.m * c.n);
    matmul_reference(d.x.data(), d.w.data(), c.t, c.bias ? d.bias.data() : nullptr, c.m, c.n, c.k,
                     ref.data());
    const std::vector<float> y = run_matmul(d, c, c.m, d.x.data());
    EXPECT_BITWISE_EQ(y.data(), ref.data(), c.m * c.n, "packed vs reference");
    {
      ScopedPortable portable(true);
      const std::vector<float> yp = run_matmul(d, c, c.m, d.x.data());
      EXPECT_BITWISE_EQ(yp.data(), ref.data(), c.m * c.n, "portable vs reference");
    }
    {
      ScopedThreads one(1);
      const std::vector<float> y1 = run_matmul(d, c, c.m, d.x.data());
      EXPECT_BITWISE_EQ(y1.data(), y.data(), c.m * c.n, "1 thread vs default");
    }
  }
}

// y[i, j] is a float32 sum of exact products over k terms: its error is below
// k * 2^-24 * sum |x w| (standard bound for recursive summation), plus the rounding of the
// bias add. The AMX path sums the same exact products in another order.
// `tight`: a smaller bound, in units of 2^-24 * sum |x w|.
void expect_close_to_exact_product(const MatmulCase& c, uint32_t seed, double tight = 1e30) {
  SCOPED_TRACE(describe(c));
  const DType t = c.t;
  const MatmulData d = make_matmul(c, seed);
  std::vector<float> y = run_matmul(d, c, c.m, d.x.data());
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double exact = c.bias ? d.bias[j] : 0.0, magnitude = std::abs(exact);
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double p = double(d.x[i * c.k + kk]) * load_f32(d.w.data(), t, j * c.k + kk);
        exact += p;
        magnitude += std::abs(p);
      }
      ASSERT_NEAR(y[i * c.n + j], exact, (c.k + 1) * 0x1p-24 * magnitude + 1e-30)
          << "row " << i << " column " << j;
      EXPECT_LE(std::abs(y[i * c.n + j] - exact), tight * 0x1p-24 * magnitude + 1e-30)
          << "row " << i << " column " << j;
    }
  }
}

TEST(CpuMatmul, ReferenceIsCloseToExactProduct) {
  for (bool amx : matmul_amx_modes()) {
    SCOPED_TRACE(path_name(amx));
    ScopedAmx path(amx);
    for (DType t : kAllTypes)
      expect_close_to_exact_product({9, 37, 301, t, true}, 11);
  }
}

// Shapes at the AMX path's edges: row tiles of 1 to 16 rows and more than one, k below,
// at and past a multiple of 32 (the rest taken by the fma tiles), odd k, partial panels
// and groups, and a row chunk boundary (12 tiles of 16 rows). Beside the worst-case bound,
// each error is within 16 x 2^-24 x sum |x w| (both paths stay below 5 on these inputs; x
// cut into two parts, 16 of its 24 bits, is far outside).
TEST(CpuMatmul, AmxPathIsCloseToExactProduct) {
  if (!amx_matmul_available()) GTEST_SKIP() << "no AMX on this machine";
  ScopedAmx amx(true);
  uint32_t seed = 100;
  for (int64_t m : {1, 2, 15, 16, 17, 33, 100, 193, 250})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 31},
                        {16, 32},
                        {17, 33},
                        {64, 64},
                        {65, 95},
                        {130, 768},
                        {200, 1031}})
      expect_close_to_exact_product({m, n, k, DType::kBF16, (m + n) % 2 == 0}, seed += 3, 16);
  // The path is taken: its sums round differently from the fma path's in places.
  const MatmulCase c{64, 200, 1031, DType::kBF16, false};
  const MatmulData d = make_matmul(c, 3);
  std::vector<float> ref(c.m * c.n);
  matmul_reference(d.x.data(), d.w.data(), c.t, nullptr, c.m, c.n, c.k, ref.data());
  const std::vector<float> y = run_matmul(d, c, c.m, d.x.data());
  int64_t differ = 0;
  for (int64_t i = 0; i < c.m * c.n; ++i)
    differ += y[i] != ref[i] ? 1 : 0;
  EXPECT_GT(differ, c.m * c.n / 100);
}

// More rows than one split of x holds (512) run as blocks of rows, with the same results.
TEST(CpuMatmul, AmxPathRunsLongBatchesAsBlocksOfRows) {
  if (!amx_matmul_available()) GTEST_SKIP() << "no AMX on this machine";
  ScopedAmx amx(true);
  const MatmulCase c{1100, 40, 96, DType::kBF16, true};
  expect_close_to_exact_product(c, 5, 16);
  const MatmulData d = make_matmul(c, 5);
  const std::vector<float> batch = run_matmul(d, c, c.m, d.x.data());
  for (int64_t r0 : {0, 500, 1000}) {
    const std::vector<float> part = run_matmul(d, c, 100, d.x.data() + r0 * c.k);
    EXPECT_BITWISE_EQ(part.data(), batch.data() + r0 * c.n, 100 * c.n,
                      "rows from " + std::to_string(r0));
  }
}

// Non-finite x: an infinite x[i, kk] gives what the fma path gives (inf or NaN), not a NaN
// made by splitting it; the largest finite x (which rounds to an infinite bf16) stays
// finite.
TEST(CpuMatmul, AmxPathKeepsNonFiniteInputs) {
  if (!amx_matmul_available()) GTEST_SKIP() << "no AMX on this machine";
  const MatmulCase c{4, 20, 64, DType::kBF16, false};
  MatmulData d = make_matmul(c, 7);
  d.x[1 * c.k + 5] = std::numeric_limits<float>::infinity();
  d.x[2 * c.k + 40] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t kk = 0; kk < c.k; ++kk)
    d.x[3 * c.k + kk] = kk % 3 == 0 ? -std::numeric_limits<float>::max() : 0.f;
  std::vector<float> fma_y, amx_y;
  {
    ScopedAmx off(false);
    fma_y = run_matmul(d, c, c.m, d.x.data());
  }
  {
    ScopedAmx on(true);
    amx_y = run_matmul(d, c, c.m, d.x.data());
  }
  for (int64_t j = 0; j < c.n; ++j) {
    EXPECT_TRUE(std::isfinite(amx_y[j])) << j;
    EXPECT_EQ(std::isinf(amx_y[c.n + j]), std::isinf(fma_y[c.n + j])) << j;
    EXPECT_EQ(std::signbit(amx_y[c.n + j]), std::signbit(fma_y[c.n + j])) << j;
    EXPECT_TRUE(std::isnan(amx_y[2 * c.n + j])) << j;
    EXPECT_TRUE(std::isfinite(amx_y[3 * c.n + j])) << j;
    double magnitude = 0;
    for (int64_t kk = 0; kk < c.k; ++kk)
      magnitude += std::abs(double(d.x[3 * c.k + kk]) * load_f32(d.w.data(), c.t, j * c.k + kk));
    EXPECT_NEAR(amx_y[3 * c.n + j], fma_y[3 * c.n + j], 16 * 0x1p-24 * magnitude) << j;
  }
}

// 101 rows take the float32-copy path, 96 rows or fewer the streaming one; on the AMX
// path, row tiles of 1 to 16 rows. k = 781 leaves 13 kk to the fma tiles there.
TEST(CpuMatmul, RowAloneEqualsRowInBatchOf101) {
  for (bool amx : matmul_amx_modes())
    for (DType t : kAllTypes)
      for (int64_t k : {768, 781}) {
        ScopedAmx path(amx);
        const MatmulCase c{101, 200, k, t, true};
        SCOPED_TRACE(describe(c) + " " + path_name(amx));
        const MatmulData d = make_matmul(c, 21);
        const std::vector<float> batch = run_matmul(d, c, c.m, d.x.data());
        for (int64_t i = 0; i < c.m; ++i) {
          const std::vector<float> alone = run_matmul(d, c, 1, d.x.data() + i * c.k);
          EXPECT_BITWISE_EQ(alone.data(), batch.data() + i * c.n, c.n, "row " + std::to_string(i));
        }
        // Every split of the batch into chunks gives the same rows.
        for (int64_t chunk : {2, 5, 6, 7, 8, 16, 32, 33, 96, 97}) {
          for (int64_t r0 = 0; r0 < c.m; r0 += chunk) {
            const int64_t rows = std::min(chunk, c.m - r0);
            const std::vector<float> part = run_matmul(d, c, rows, d.x.data() + r0 * c.k);
            EXPECT_BITWISE_EQ(part.data(), batch.data() + r0 * c.n, rows * c.n,
                              "chunk " + std::to_string(chunk) + " at " + std::to_string(r0));
          }
        }
      }
}

TEST(CpuMatmul, ThreadCountDoesNotChangeResults) {
  for (bool amx : matmul_amx_modes())
    for (int64_t m : {1, 8, 37, 150, 400}) {
      ScopedAmx path(amx);
      const MatmulCase c{m, 333, 517, DType::kBF16, true};
      SCOPED_TRACE(describe(c) + " " + path_name(amx));
      const MatmulData d = make_matmul(c, 31);
      std::vector<float> y1, y2;
      {
        ScopedThreads one(1);
        y1 = run_matmul(d, c, m, d.x.data());
      }
      {
        ScopedThreads two(2);
        y2 = run_matmul(d, c, m, d.x.data());
      }
      {
        ScopedThreads three(3);
        const std::vector<float> y3 = run_matmul(d, c, m, d.x.data());
        EXPECT_BITWISE_EQ(y3.data(), y1.data(), m * c.n, "3 threads vs 1");
      }
      EXPECT_BITWISE_EQ(y2.data(), y1.data(), m * c.n, "2 threads vs 1");
    }
}

// A call from inside a parallel region gets one thread although it plans for several:
// that thread must take every planned thread's share. Two callers run at once, each with
// its own share bookkeeping.
TEST(CpuMatmul, CallsFromInsideAParallelRegionComputeEveryOutput) {
  for (bool amx : matmul_amx_modes())
    for (int64_t m : {1, 8, 37}) {
      ScopedAmx path(amx);
      const MatmulCase c{m, 333, 517, DType::kBF16, true};
      SCOPED_TRACE(describe(c) + " " + path_name(amx));
      const MatmulData d = make_matmul(c, 41);
      // The AMX path's own result from a call on its own; the reference's on the fma path.
      std::vector<float> ref(m * c.n);
      if (amx)
        ref = run_matmul(d, c, m, d.x.data());
      else
        matmul_reference(d.x.data(), d.w.data(), c.t, d.bias.data(), m, c.n, c.k, ref.data());
      ScopedThreads four(4);
      std::vector<std::vector<float>> ys(2);
#pragma omp parallel num_threads(2)
      ys[omp_get_thread_num()] = run_matmul(d, c, m, d.x.data());
      for (const std::vector<float>& y : ys) {
        if (y.empty()) continue;  // the runtime ran fewer callers
        EXPECT_BITWISE_EQ(y.data(), ref.data(), m * c.n, "nested call vs reference");
      }
    }
}

TEST(CpuMatmul, PackedWeightShape) {
  const std::vector<uint8_t> w = encode(random_floats(17 * 5, 3), DType::kBF16);
  const PackedWeight p(w.data(), DType::kBF16, 17, 5);
  EXPECT_EQ(p.n(), 17);
  EXPECT_EQ(p.k(), 5);
  EXPECT_EQ(p.dtype(), DType::kBF16);
  EXPECT_EQ(p.bytes(), 32 * 5 * 2);  // two panels of 16, zero padded
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u);
}

TEST(CpuMatmul, ZeroDepthGivesBias) {
  const std::vector<float> bias = {1.f, -2.f, 3.f};
  const PackedWeight p(nullptr, DType::kF32, 3, 0);
  std::vector<float> y = poisoned(6);
  matmul(nullptr, p, bias.data(), 2, y.data());
  EXPECT_EQ(y, (std::vector<float>{1.f, -2.f, 3.f, 1.f, -2.f, 3.f}));
}

// ---------------------------------------------------------------------------------------
// allocate_streamed

// Large arrays start on a 2 MiB page (so that they can sit on huge pages), small ones on
// a cache line; all of the asked size is writable.
TEST(CpuMemory, AllocateStreamedAlignsLargeArraysToHugePages) {
  for (int64_t bytes : {int64_t(1), int64_t(1000), int64_t(1) << 20, (int64_t(5) << 20) + 3}) {
    unsigned char* p = static_cast<unsigned char*>(allocate_streamed(bytes));
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(at % (bytes >= int64_t(1) << 20 ? uintptr_t(2) << 20 : 64), 0u) << bytes;
    std::fill(p, p + bytes, static_cast<unsigned char>(7));
    EXPECT_EQ(p[bytes - 1], 7);
    std::free(p);
  }
}

// ---------------------------------------------------------------------------------------
// exp (internal): the scalar and vector forms agree bit for bit and stay within a few ulp.

TEST(CpuExp, ScalarAndVectorAgreeAndAreAccurate) {
  std::vector<float> xs;
  for (float x = -90.f; x <= 90.f; x += 0.0137f)
    xs.push_back(x);
  for (float x : {0.f, -0.f, 1e-30f, -1e-30f, 88.f, -87.f, 1000.f, -1000.f})
    xs.push_back(x);
  while (xs.size() % 16 != 0)
    xs.push_back(0.5f);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const float e = detail::exp_scalar(x);
    if (x < -87.f) {
      EXPECT_EQ(e, 0.f);
    } else if (x > 88.f) {
      EXPECT_EQ(e, HUGE_VALF);
    } else {
      const double exact = std::exp(double(x));
      EXPECT_NEAR(e, exact, 4e-7 * exact) << x;
    }
  }
#if defined(PAGELLM_KERNELS_AVX512)
  for (size_t i = 0; i < xs.size(); i += 16) {
    float out[16];
    _mm512_storeu_ps(out, detail::exp16(_mm512_loadu_ps(xs.data() + i)));
    for (int l = 0; l < 16; ++l) {
      const float e = detail::exp_scalar(xs[i + l]);
      EXPECT_EQ(std::memcmp(&out[l], &e, 4), 0) << xs[i + l];
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------
// rmsnorm, add_rmsnorm

std::vector<double> rmsnorm_exact(const float* x, const void* w, DType t, int64_t dim, float eps) {
  double ss = 0;
  for (int64_t d = 0; d < dim; ++d)
    ss += double(x[d]) * x[d];
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  std::vector<double> out(dim);
  for (int64_t d = 0; d < dim; ++d)
    out[d] = x[d] * inv * load_f32(w, t, d);
  return out;
}

TEST(CpuRmsnorm, MatchesExactAndIsRowInvariant) {
  for (DType t : kAllTypes) {
    for (int64_t dim : {1, 15, 16, 17, 64, 100, 768, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " dim=" + std::to_string(dim));
      const int64_t rows = 37;
      const std::vector<float> x = random_floats(rows * dim, dim, 3.0f);
      const std::vector<uint8_t> w = encode(random_floats(dim, dim + 1), t);
      std::vector<float> y = poisoned(rows * dim);
      rmsnorm(x.data(), w.data(), t, rows, dim, 1e-6f, y.data());
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<double> e = rmsnorm_exact(x.data() + r * dim, w.data(), t, dim, 1e-6f);
        // Sum of squares (dim fma's), sqrt, divide and two products: a few ulp of |out|.
        for (int64_t d = 0; d < dim; ++d)
          ASSERT_NEAR(y[r * dim + d], e[d], (dim * 0x1p-24 + 1e-6) * std::abs(e[d]) + 1e-30);
        std::vector<float> alone = poisoned(dim);
        rmsnorm(x.data() + r * dim, w.data(), t, 1, dim, 1e-6f, alone.data());
        EXPECT_BITWISE_EQ(alone.data(), y.data() + r * dim, dim, "row alone");
      }
      {
        ScopedPortable portable(true);
        std::vector<float> yp = poisoned(rows * dim);
        rmsnorm(x.data(), w.data(), t, rows, dim, 1e-6f, yp.data());
        EXPECT_BITWISE_EQ(yp.data(), y.data(), rows * dim, "portable");
      }
      {
        ScopedThreads one(1);
        std::vector<float> y1 = poisoned(rows * dim);
        rmsnorm(x.data(), w.data(), t, rows, dim, 1e-6f, y1.data());
        EXPECT_BITWISE_EQ(y1.data(), y.data(), rows * dim, "1 thread");
      }
      std::vector<float> in_place = x;
      rmsnorm(in_place.data(), w.data(), t, rows, dim, 1e-6f, in_place.data());
      EXPECT_BITWISE_EQ(in_place.data(), y.data(), rows * dim, "in place");
    }
  }
}

TEST(CpuRmsnorm, AddRmsnormUpdatesResidualThenNormalizes) {
  for (DType t : kAllTypes) {
    const int64_t rows = 7, dim = 130;
    const std::vector<float> res0 = random_floats(rows * dim, 1), x = random_floats(rows * dim, 2);
    const std::vector<uint8_t> w = encode(random_floats(dim, 3), t);
    std::vector<float> res = res0, out = poisoned(rows * dim);
    add_rmsnorm(res.data(), x.data(), w.data(), t, rows, dim, 1e-5f, out.data());
    std::vector<float> sum(rows * dim), expected = poisoned(rows * dim);
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] = res0[i] + x[i];
    rmsnorm(sum.data(), w.data(), t, rows, dim, 1e-5f, expected.data());
    EXPECT_BITWISE_EQ(res.data(), sum.data(), rows * dim, "residual");
    EXPECT_BITWISE_EQ(out.data(), expected.data(), rows * dim, "normed");
    // out may alias x.
    std::vector<float> res2 = res0, x2 = x;
    add_rmsnorm(res2.data(), x2.data(), w.data(), t, rows, dim, 1e-5f, x2.data());
    EXPECT_BITWISE_EQ(x2.data(), expected.data(), rows * dim, "aliased");
  }
}

// ---------------------------------------------------------------------------------------
// rope

TEST(CpuRope, MatchesRotateHalfAndDependsOnlyOnPosition) {
  for (int head_dim : {64, 128}) {
    const int64_t tokens = 37;
    const int hq = 6, hk = 2;
    const std::vector<float> inv_freq = rope_inv_freq(head_dim, 10000.0);
    std::vector<int32_t> pos(tokens);
    for (int64_t t = 0; t < tokens; ++t)
      pos[t] = static_cast<int32_t>((t * 977) % 5000);
    const std::vector<float> q0 = random_floats(tokens * hq * head_dim, 1);
    const std::vector<float> k0 = random_floats(tokens * hk * head_dim, 2);
    std::vector<float> q = q0, k = k0;
    rope(q.data(), k.data(), pos.data(), tokens, hq, hk, head_dim, inv_freq.data());
    const int half = head_dim / 2;
    auto check = [&](const std::vector<float>& in, const std::vector<float>& out, int heads) {
      for (int64_t t = 0; t < tokens; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < half; ++i) {
            const int64_t base = (t * heads + h) * head_dim;
            // Angle rounded to float32 first, as Hugging Face computes it.
            const double a = static_cast<float>(pos[t]) * inv_freq[i];
            const double x0 = in[base + i], x1 = in[base + i + half];
            const double tol = 4e-7 * (std::abs(x0) + std::abs(x1));
            ASSERT_NEAR(out[base + i], x0 * std::cos(a) - x1 * std::sin(a), tol);
            ASSERT_NEAR(out[base + i + half], x1 * std::cos(a) + x0 * std::sin(a), tol);
          }
    };
    check(q0, q, hq);
    check(k0, k, hk);
    // Token 5 alone gives the same bits.
    std::vector<float> q5(q0.begin() + 5 * hq * head_dim, q0.begin() + 6 * hq * head_dim);
    std::vector<float> k5(k0.begin() + 5 * hk * head_dim, k0.begin() + 6 * hk * head_dim);
    rope(q5.data(), k5.data(), pos.data() + 5, 1, hq, hk, head_dim, inv_freq.data());
    EXPECT_BITWISE_EQ(q5.data(), q.data() + 5 * hq * head_dim, hq * head_dim, "q alone");
    EXPECT_BITWISE_EQ(k5.data(), k.data() + 5 * hk * head_dim, hk * head_dim, "k alone");
  }
}

// ---------------------------------------------------------------------------------------
// silu_mul

TEST(CpuSiluMul, MatchesExactAndPortablePath) {
  for (int64_t dim : {1, 17, 2048, 3001}) {
    const int64_t rows = 5;
    std::vector<float> g = random_floats(rows * dim, 1, 4.0f), u = random_floats(rows * dim, 2);
    g[0] = -100.f;
    if (g.size() > 3) g[1] = 100.f, g[2] = 0.f, g[3] = -0.f;
    std::vector<float> out = poisoned(rows * dim);
    silu_mul(g.data(), u.data(), rows, dim, out.data());
    for (int64_t i = 0; i < rows * dim; ++i) {
      const double e = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
      // exp within a few ulp, then an add, a divide and a multiply.
      ASSERT_NEAR(out[i], e, 1e-6 * std::abs(e) + 1e-37) << g[i];
    }
    ScopedPortable portable(true);
    std::vector<float> outp = poisoned(rows * dim);
    silu_mul(g.data(), u.data(), rows, dim, outp.data());
    EXPECT_BITWISE_EQ(outp.data(), out.data(), rows * dim, "portable");
  }
}

TEST(CpuSiluMul, FusedGateUpEqualsSeparateHalves) {
  for (int64_t dim : {1, 17, 2048, 3001}) {
    for (int64_t rows : {1, 5}) {
      const std::vector<float> gu = random_floats(rows * 2 * dim, 3, 4.0f);
      std::vector<float> g(rows * dim), u(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(gu.begin() + r * 2 * dim, dim, g.begin() + r * dim);
        std::copy_n(gu.begin() + r * 2 * dim + dim, dim, u.begin() + r * dim);
      }
      std::vector<float> ref = poisoned(rows * dim), out = poisoned(rows * dim);
      silu_mul(g.data(), u.data(), rows, dim, ref.data());
      silu_mul_fused(gu.data(), rows, dim, out.data());
      EXPECT_BITWISE_EQ(out.data(), ref.data(), rows * dim, "fused");
      ScopedPortable portable(true);
      std::vector<float> outp = poisoned(rows * dim);
      silu_mul_fused(gu.data(), rows, dim, outp.data());
      EXPECT_BITWISE_EQ(outp.data(), ref.data(), rows * dim, "fused portable");
    }
  }
}

// ---------------------------------------------------------------------------------------
// embedding, argmax

TEST(CpuEmbedding, GathersAndConvertsRows) {
  for (DType t : kAllTypes) {
    for (int64_t hidden : {7, 64, 768}) {
      const int64_t vocab = 50;
      const std::vector<uint8_t> table = encode(random_floats(vocab * hidden, 5), t);
      const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
      for (bool portable : {false, true}) {
        ScopedPortable scoped(portable);
        std::vector<float> out = poisoned(ids.size() * hidden);
        embedding(ids.data(), ids.size(), table.data(), t, hidden, out.data());
        for (size_t i = 0; i < ids.size(); ++i)
          for (int64_t d = 0; d < hidden; ++d)
            ASSERT_EQ(out[i * hidden + d], load_f32(table.data(), t, ids[i] * hidden + d));
      }
    }
  }
}

TEST(CpuArgmax, FirstMaximumPerRow) {
  const int64_t vocab = 1001;
  std::vector<float> logits = random_floats(3 * vocab, 9);
  logits[0 * vocab + 500] = 50.f;
  logits[1 * vocab + 7] = 60.f;
  logits[1 * vocab + 900] = 60.f;  // tie: the first wins
  logits[2 * vocab + 1000] = 70.f;
  std::vector<int32_t> out(3, -1);
  argmax(logits.data(), 3, vocab, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{500, 7, 1000}));
}

// The vector form keeps several chains of lanes and merges them: every position of the
// maximum, ties across and within chains, NaN and infinities, and lengths around the
// chains' 64 values (32 in the AVX2 form), against the definition, on both paths.
TEST(CpuArgmax, FirstMaximumWithNaNInfinitiesAndTiesAtEveryLength) {
  const auto reference = [](const float* row, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
    return static_cast<int32_t>(std::max<int64_t>(best, 0));
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(11);
  for (int64_t n :
       {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 127, 128, 129, 200, 1001, 32000}) {
    std::vector<std::vector<float>> rows;
    rows.push_back(std::vector<float>(n, -inf));
    rows.push_back(std::vector<float>(n, nan));
    rows.push_back(std::vector<float>(n, 3.0f));  // all tied: 0
    for (int k = 0; k < 12; ++k) {
      std::vector<float> row = random_floats(n, 100 + k);
      std::uniform_int_distribution<int64_t> pos(0, n - 1);
      const int64_t a = pos(rng), b = pos(rng), c = pos(rng);
      switch (k % 6) {
        case 0:  // a tie
          row[a] = 9.0f;
          row[b] = 9.0f;
          break;
        case 1:  // NaN around the max
          row[a] = nan;
          row[b] = 9.0f;
          row[c] = nan;
          break;
        case 2:  // infinite ties
          row[a] = inf;
          row[b] = inf;
          break;
        case 3:  // nothing above -inf
          std::fill(row.begin(), row.end(), -inf);
          row[a] = nan;
          row[b] = -inf;
          break;
        case 4:  // one number
          std::fill(row.begin(), row.end(), nan);
          row[a] = -inf;
          break;
        default:  // ties past NaN
          std::fill(row.begin(), row.end(), 1.0f);
          row[a] = nan;
          break;
      }
      rows.push_back(row);
    }
    std::vector<float> logits;
    for (const auto& row : rows)
      logits.insert(logits.end(), row.begin(), row.end());
    const int64_t count = static_cast<int64_t>(rows.size());
    for (bool portable : {false, true}) {
      ScopedPortable scoped(portable);
      std::vector<int32_t> out(count, -7);
      argmax(logits.data(), count, n, out.data());
      for (int64_t r = 0; r < count; ++r)
        ASSERT_EQ(out[r], reference(logits.data() + r * n, n))
            << "n " << n << " row " << r << (portable ? " portable" : " simd");
    }
  }
}

// ---------------------------------------------------------------------------------------
// write_kv, copy_blocks

TEST(CpuKvCache, WriteKvRoundsToNearestEvenAndSkipsPaddingSlots) {
  for (DType t : kAllTypes) {
    const int kvh = 2, dim = 64;
    const int64_t num_blocks = 4, row = kvh * dim, esize = dtype_size(t);
    // One slot's worth of guard bytes past the cache: a slot past the cache is skipped,
    // as on the GPU, not written there.
    std::vector<uint8_t> kc((num_blocks * kBlockSize + 1) * row * esize, 0xAB);
    std::vector<uint8_t> vc(kc.size(), 0xCD);
    const KVCacheLayer cache{kc.data(), vc.data(), t, num_blocks, kvh, dim};
    const std::vector<int64_t> slots = {5, -1, 63, 16, -7, num_blocks * kBlockSize};
    std::vector<float> k = random_floats(slots.size() * row, 1),
                       v = random_floats(slots.size() * row, 2);
    k[0] = 1.00390625f;  // halfway between two bf16 values: rounds to even
    k[1] = 1e-40f;       // subnormal: kept
    write_kv(k.data(), v.data(), slots.data(), slots.size(), cache);
    std::vector<uint8_t> ek(kc.size(), 0xAB), ev(vc.size(), 0xCD);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= num_blocks * kBlockSize) continue;
      const std::vector<float> krow(k.begin() + i * row, k.begin() + (i + 1) * row);
      const std::vector<float> vrow(v.begin() + i * row, v.begin() + (i + 1) * row);
      const std::vector<uint8_t> kb = encode(krow, t), vb = encode(vrow, t);
      std::copy(kb.begin(), kb.end(), ek.begin() + slots[i] * row * esize);
      std::copy(vb.begin(), vb.end(), ev.begin() + slots[i] * row * esize);
    }
    EXPECT_EQ(kc, ek) << dtype_name(t);
    EXPECT_EQ(vc, ev) << dtype_name(t);
    if (t == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, kc.data() + 5 * row * esize, 2);
      EXPECT_EQ(h, 0x3f80);  // 1.00390625 -> 1.0 (even)
    }
  }
}

// The fused epilogue of a q|k|v projection gives the bits of splitting the rows, then
// rope and write_kv: q rotated, K rotated and stored, V stored, nothing written for
// padding or out-of-range slots; on any thread count.
TEST(CpuKvCache, RopeWriteKvEqualsRopeThenWriteKv) {
  struct Heads {
    int q, kv;
  };
  for (DType t : kAllTypes) {
    for (int dim : {64, 128, 17}) {  // (17: an odd head_dim's last value is not rotated)
      for (Heads h : {Heads{32, 8}, Heads{6, 2}, Heads{4, 4}}) {
        for (int64_t tokens : {int64_t(1), int64_t(37)}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " dim=" + std::to_string(dim) +
                       " heads=" + std::to_string(h.q) + "/" + std::to_string(h.kv) +
                       " tokens=" + std::to_string(tokens));
          const int64_t qd = int64_t(h.q) * dim, kvd = int64_t(h.kv) * dim, width = qd + 2 * kvd;
          const std::vector<float> inv_freq = rope_inv_freq(dim, 10000.0);
          std::vector<int32_t> pos(tokens);
          for (int64_t i = 0; i < tokens; ++i)
            pos[i] = static_cast<int32_t>((i * 977 + 3) % 5000);
          const int64_t num_blocks = tokens / kBlockSize + 2;
          std::vector<int64_t> slots(num_blocks * kBlockSize);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), std::mt19937(dim + tokens));
          slots.resize(tokens);
          if (tokens > 2) slots[1] = -1, slots[2] = num_blocks * kBlockSize;
          const std::vector<float> qkv = random_floats(tokens * width, 7, 2.0f);
          const std::vector<uint8_t> cache0 =
              encode(random_floats(num_blocks * kBlockSize * kvd, 8), t);

          auto [q, k, v] = split_qkv(qkv, tokens, qd, kvd);
          std::vector<uint8_t> split_k = cache0, split_v = cache0;
          rope(q.data(), k.data(), pos.data(), tokens, h.q, h.kv, dim, inv_freq.data());
          write_kv(k.data(), v.data(), slots.data(), tokens,
                   KVCacheLayer{split_k.data(), split_v.data(), t, num_blocks, h.kv, dim});

          for (int threads : {1, 2}) {
            ScopedThreads scoped(threads);
            std::vector<float> fq = poisoned(tokens * qd);
            std::vector<uint8_t> fk = cache0, fv = cache0;
            rope_write_kv(qkv.data(), pos.data(), slots.data(), tokens, h.q, inv_freq.data(),
                          fq.data(), KVCacheLayer{fk.data(), fv.data(), t, num_blocks, h.kv, dim});
            EXPECT_BITWISE_EQ(fq.data(), q.data(), tokens * qd, "q");
            EXPECT_EQ(fk, split_k) << "K cache";
            EXPECT_EQ(fv, split_v) << "V cache";
          }
        }
      }
    }
  }
}

TEST(CpuKvCache, CopyBlocksCopiesKeysAndValues) {
  const int kvh = 2, dim = 16;
  const int64_t num_blocks = 5, block = kBlockSize * kvh * dim;
  std::vector<float> kc = random_floats(num_blocks * block, 1),
                     vc = random_floats(num_blocks * block, 2);
  const std::vector<float> k0 = kc, v0 = vc;
  const KVCacheLayer cache{kc.data(), vc.data(), DType::kF32, num_blocks, kvh, dim};
  const std::vector<int32_t> src = {1, 3}, dst = {4, 0};
  copy_blocks(cache, src.data(), dst.data(), 2);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t from = b == 4 ? 1 : b == 0 ? 3 : b;
    for (int64_t i = 0; i < block; ++i) {
      ASSERT_EQ(kc[b * block + i], k0[from * block + i]);
      ASSERT_EQ(vc[b * block + i], v0[from * block + i]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// apply_penalties

// Each rule on its own, worked by hand: the bias is added first, the repetition penalty
// divides positive and multiplies negative logits of tokens in the prompt or the output,
// presence and frequency subtract by the output count; unlisted tokens, tokens outside
// the vocabulary and other rows are left alone.
TEST(CpuPenalties, EachRuleOnItsOwnAndInOrder) {
  constexpr int64_t kVocab = 6;
  std::vector<float> logits = {4.0f, -2.0f, 3.0f, 1.0f, 0.5f, 7.0f,   // row 0
                               4.0f, -2.0f, 3.0f, 1.0f, 0.5f, 7.0f,   // row 1: none
                               4.0f, -2.0f, 3.0f, 1.0f, 0.5f, 7.0f};  // row 2
  const std::vector<PenaltyToken> tokens = {
      // row 0: repetition 2, presence 0.5, frequency 0.25
      {0, 0, 0.0f, kPenaltyInPrompt},                    // 4 / 2
      {1, 0, 0.0f, kPenaltyInPrompt},                    // -2 * 2
      {2, 3, 0.0f, 0},                                   // 3 / 2 - (0.5 + 0.75)
      {3, 0, -3.0f, kPenaltyHasBias},                    // 1 - 3, no repetition (unseen)
      {4, 1, 1.5f, kPenaltyHasBias | kPenaltyInPrompt},  // (0.5 + 1.5) / 2 - 0.75
      {kVocab, 2, 9.0f, kPenaltyHasBias},                // outside: ignored
      {-1, 2, 9.0f, kPenaltyHasBias},                    // outside: ignored
      // row 2: only a frequency penalty; the prompt flag alone changes nothing
      {5, 2, 0.0f, kPenaltyInPrompt},  // 7 - 2 * 1.5
      {0, 0, 0.0f, kPenaltyInPrompt}};
  const PenaltyRow rows[] = {{0, 7, 2.0f, 0.5f, 0.25f}, {7, 7}, {7, 9, 1.0f, 0.0f, 1.5f}};
  apply_penalties(logits.data(), 3, kVocab, rows, tokens.data());
  const std::vector<float> expected = {2.0f, -4.0f, 0.25f, -2.0f, 0.25f, 7.0f,   // row 0
                                       4.0f, -2.0f, 3.0f,  1.0f,  0.5f,  7.0f,   // row 1
                                       4.0f, -2.0f, 3.0f,  1.0f,  0.5f,  4.0f};  // row 2
  EXPECT_EQ(logits, expected);
}

// The rounding kernels.h states: every operation rounded on its own (the CUDA twin must
// give the same bits). A fused multiply-add in p + f * c changes some of these results.
TEST(CpuPenalties, EachOperationIsRoundedOnItsOwn) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f), penalty(0.1f, 2.0f);
  int fused_differs = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    float x = value(rng);
    const PenaltyToken t{0, 1 + trial % 7, value(rng), kPenaltyHasBias};
    const PenaltyRow row{0, 1, penalty(rng), penalty(rng), penalty(rng)};
    volatile float v = x + t.bias;  // volatile: each step stored, so rounded, on its own
    v = v > 0.0f ? v / row.repetition : v * row.repetition;
    volatile float product = row.frequency * static_cast<float>(t.output_count);
    volatile float sum = row.presence + product;
    const float expected = v - sum;
    fused_differs +=
        v - std::fma(row.frequency, static_cast<float>(t.output_count), row.presence) != expected;
    apply_penalties(&x, 1, 1, &row, &t);
    ASSERT_EQ(x, expected) << "trial " << trial;
  }
  EXPECT_GT(fused_differs, 0);
}

// ---------------------------------------------------------------------------------------
// sample_top_k_top_p

struct SampleCase {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

int32_t sample_one(const std::vector<float>& logits, SampleCase c, double u) {
  const SamplingRows rows{&c.temperature, &c.top_k, &c.top_p, &c.min_p, &u};
  int32_t out = -1;
  sample_top_k_top_p(logits.data(), 1, static_cast<int64_t>(logits.size()), rows, &out);
  return out;
}

// The tokens drawn over a fine grid of uniform draws: the kept set.
std::set<int32_t> kept_tokens(const std::vector<float>& logits, SampleCase c) {
  std::set<int32_t> seen;
  for (int s = 0; s < 2000; ++s)
    seen.insert(sample_one(logits, c, (s + 0.5) / 2000));
  return seen;
}

std::vector<float> log_of(const std::vector<double>& weights) {
  std::vector<float> out;
  for (double w : weights)
    out.push_back(static_cast<float>(std::log(w)));
  return out;
}

TEST(CpuSample, TopKKeepsExactlyKWithTiesByLowerId) {
  // Token 6 is the most likely, then four tokens tied at e^-1 (ids 1, 2, 4, 5).
  const std::vector<float> logits = {0.f, 2.f, 2.f, 1.f, 2.f, 2.f, 3.f, -1.f};
  auto with_k = [&](int32_t k) {
    SampleCase c;
    c.top_k = k;
    return kept_tokens(logits, c);
  };
  EXPECT_EQ(with_k(1), (std::set<int32_t>{6}));
  EXPECT_EQ(with_k(2), (std::set<int32_t>{6, 1}));
  EXPECT_EQ(with_k(3), (std::set<int32_t>{6, 1, 2}));
  EXPECT_EQ(with_k(5), (std::set<int32_t>{6, 1, 2, 4, 5}));
  EXPECT_EQ(with_k(6), (std::set<int32_t>{6, 1, 2, 4, 5, 3}));
  EXPECT_EQ(with_k(8).size(), 8u);  // k == vocab: no limit
  EXPECT_EQ(with_k(0).size(), 8u);
  // Within the kept set, most likely first, ties by id: masses 1, e^-1, e^-1 of
  // 1 + 2/e = 1.7358, so token 6 below u = 0.576, token 1 below 0.788, then token 2.
  SampleCase c;
  c.top_k = 3;
  EXPECT_EQ(sample_one(logits, c, 0.0), 6);
  EXPECT_EQ(sample_one(logits, c, 0.57), 6);
  EXPECT_EQ(sample_one(logits, c, 0.58), 1);
  EXPECT_EQ(sample_one(logits, c, 0.78), 1);
  EXPECT_EQ(sample_one(logits, c, 0.79), 2);
}

TEST(CpuSample, TopPKeepsTheShortestPrefixReachingTheMass) {
  // Weights 1, 0.75, 0.5, 0.25 (total 2.5): prefixes hold 1, 1.75, 2.25, 2.5.
  const std::vector<float> logits = log_of({1.0, 0.75, 0.5, 0.25});
  auto with_p = [&](float p) {
    SampleCase c;
    c.top_p = p;
    return kept_tokens(logits, c);
  };
  EXPECT_EQ(with_p(0.69f), (std::set<int32_t>{0, 1}));     // 1.725 <= 1.75
  EXPECT_EQ(with_p(0.71f), (std::set<int32_t>{0, 1, 2}));  // 1.775 > 1.75
  EXPECT_EQ(with_p(0.39f), (std::set<int32_t>{0}));        // 0.975 <= 1
  EXPECT_EQ(with_p(0.41f), (std::set<int32_t>{0, 1}));     // 1.025 > 1
  EXPECT_EQ(with_p(1e-6f), (std::set<int32_t>{0}));        // at least one token
  EXPECT_EQ(with_p(0.91f), (std::set<int32_t>{0, 1, 2, 3}));
  // Ties at the cut: weights 1, 0.5, 0.5, 0.25; 0.55 * 2.25 = 1.2375 takes one of the
  // tied tokens, the lower id.
  const std::vector<float> tied = log_of({0.5, 1.0, 0.5, 0.25});
  SampleCase c;
  c.top_p = 0.55f;
  EXPECT_EQ(kept_tokens(tied, c), (std::set<int32_t>{1, 0}));
  // top-p over what top-k kept: 0.7 of (1 + 0.75) = 1.225 needs both.
  SampleCase ck;
  ck.top_k = 2;
  ck.top_p = 0.7f;
  EXPECT_EQ(kept_tokens(logits, ck), (std::set<int32_t>{0, 1}));
  ck.top_p = 0.5f;  // 0.875 <= 1
  EXPECT_EQ(kept_tokens(logits, ck), (std::set<int32_t>{0}));
}

TEST(CpuSample, MinPKeepsWeightsAboveMinPOfTheLargest) {
  const std::vector<float> logits = log_of({0.25, 1.0, 0.5, 0.75});
  auto with_min_p = [&](float m, int32_t k = 0) {
    SampleCase c;
    c.min_p = m;
    c.top_k = k;
    return kept_tokens(logits, c);
  };
  EXPECT_EQ(with_min_p(0.6f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(with_min_p(0.3f), (std::set<int32_t>{1, 3, 2}));
  EXPECT_EQ(with_min_p(0.0f).size(), 4u);
  EXPECT_EQ(with_min_p(1.0f), (std::set<int32_t>{1}));  // the largest weight is exactly 1
  EXPECT_EQ(with_min_p(0.3f, 2), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(with_min_p(0.6f, 3), (std::set<int32_t>{1, 3}));  // k above the count: no-op
}

TEST(CpuSample, UniformNearZeroAndNearOne) {
  // Two tokens tie for the top (1 and 2), two for the bottom (3 and 5).
  const std::vector<float> logits = {1.f, 3.f, 3.f, -2.f, 0.5f, -2.f};
  const SampleCase all;
  for (double u : {0.0, 1e-15, 1e-9})
    EXPECT_EQ(sample_one(logits, all, u), 1) << u;  // the most likely, lower id
  for (double u : {1.0 - 1e-9, 1.0 - 1e-15, std::nextafter(1.0, 0.0)})
    EXPECT_EQ(sample_one(logits, all, u), 5) << u;  // the least likely, higher id
  // A draw of 1 itself (outside the contract) leaves no token above it: the last kept.
  EXPECT_EQ(sample_one(logits, all, 1.0), 5);
  SampleCase k3;
  k3.top_k = 3;
  EXPECT_EQ(sample_one(logits, k3, 0.0), 1);
  EXPECT_EQ(sample_one(logits, k3, 1.0 - 1e-12), 0);
  // A very low temperature leaves the largest logit all the mass (the others' weights
  // underflow to 0), whatever the draw.
  const std::vector<float> distinct = {1.f, 3.f, 2.5f, -2.f, 0.5f, -2.f};
  SampleCase cold;
  cold.temperature = 1e-3f;
  for (double u : {0.0, 0.5, 1.0 - 1e-12})
    EXPECT_EQ(sample_one(distinct, cold, u), 1) << u;
}

// An independent reference: sort the whole vocabulary, then cut and draw.
int32_t sample_by_full_sort(const std::vector<float>& logits, SampleCase c, double u,
                            bool* near_boundary) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float inv_t = 1.0f / c.temperature;
  std::vector<float> w(vocab);
  float max_s = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i)
    max_s = std::max(max_s, w[i] = logits[i] * inv_t);
  for (float& x : w)
    x = detail::exp_scalar(x - max_s);  // the kernels' exp
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; });
  int32_t count = vocab;
  if (c.min_p > 0) count = std::count_if(w.begin(), w.end(), [&](float x) { return x >= c.min_p; });
  if (c.top_k > 0) count = std::min(count, c.top_k);
  // Sums in this order differ from the kernel's by rounding: a draw within 1e-9 of a
  // boundary may go either way.
  auto near = [](double a, double b) {
    return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b));
  };
  if (c.top_p < 1.0f) {
    double total = 0;
    for (int32_t i = 0; i < count; ++i)
      total += w[order[i]];
    const double target = c.top_p * total;
    double mass = 0;
    int32_t keep = 0;
    while (keep < count && mass < target) {
      mass += w[order[keep++]];
      if (near(mass, target)) *near_boundary = true;
    }
    count = std::max(keep, 1);
  }
  double total = 0;
  for (int32_t i = 0; i < count; ++i)
    total += w[order[i]];
  double cumulative = 0;
  for (int32_t i = 0; i < count; ++i) {
    cumulative += w[order[i]];
    if (near(cumulative, u * total)) *near_boundary = true;
    if (u * total < cumulative) return order[i];
  }
  return order[count - 1];
}

// Rows with temperature 0 (greedy rows of a batch) are not sampled: their output stays as
// the caller left it (the backends put the argmax there), on one thread or several.
TEST(CpuSample, RowsWithoutATemperatureAreLeftUntouched) {
  constexpr int64_t kVocab = 50;
  std::vector<float> logits(4 * kVocab, 0.0f);
  for (int64_t r = 0; r < 4; ++r)
    logits[r * kVocab + 10 + r] = 30.0f;  // row r draws 10 + r
  const std::vector<float> temperature = {1.0f, 0.0f, 1.0f, -1.0f};
  const std::vector<int32_t> top_k(4, 0);
  const std::vector<float> top_p(4, 1.0f), min_p(4, 0.0f);
  const std::vector<double> uniform(4, 0.5);
  const SamplingRows params{temperature.data(), top_k.data(), top_p.data(), min_p.data(),
                            uniform.data()};
  for (int threads : {1, 2}) {
    ScopedThreads scoped(threads);
    std::vector<int32_t> out = {-7, -7, -7, -7};
    sample_top_k_top_p(logits.data(), 4, kVocab, params, out.data());
    EXPECT_EQ(out, (std::vector<int32_t>{10, -7, 12, -7})) << threads << " threads";
  }
}

// NaN logits are never drawn, whatever the settings; a row of nothing but NaN gives 0.
// The AVX-512 and portable paths draw the same tokens.
TEST(CpuSample, NaNLogitsAreNeverDrawnOnEitherPath) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(40, 0.0f);
  for (int i = 0; i < 40; i += 3)
    logits[i] = nan;
  logits[7] = 2.0f;
  const std::vector<SampleCase> cases = {
      {1.0f, 0, 1.0f, 0.0f}, {1.0f, 5, 1.0f, 0.0f}, {0.7f, 0, 0.9f, 0.0f}, {1.0f, 0, 1.0f, 0.1f}};
  for (const SampleCase& c : cases) {
    std::vector<int32_t> drawn[2];
    for (bool portable : {false, true}) {
      ScopedPortable scoped(portable);
      for (int s = 0; s < 200; ++s) {
        const int32_t t = sample_one(logits, c, (s + 0.5) / 200);
        EXPECT_TRUE(t >= 0 && t < 40 && t % 3 != 0) << t;
        drawn[portable].push_back(t);
      }
    }
    EXPECT_EQ(drawn[0], drawn[1]);
  }
  EXPECT_EQ(sample_one(std::vector<float>(9, nan), {}, 0.5), 0);
}

// A draw at the very top of [0, 1) lands on a token with weight, never on one whose
// weight underflowed to 0 (its mass is nothing, whatever rounding leaves of the sums).
// First a row built so that the sums disagree: 1000 weights of about 2^-60 before one of
// 1 add up to more in token order (1 + 2^-50) than most likely first (each rounds away
// against the 1), so no running sum reaches the draw; then random rows.
TEST(CpuSample, DrawNearOneNeverPicksAZeroWeight) {
  std::vector<float> built(1006, -41.6f);  // e^-41.6 is about 2^-60
  built[1000] = 0.0f;
  for (int i = 1001; i < 1006; ++i)
    built[i] = -1000.0f;  // weight 0
  const int32_t last = sample_one(built, {}, std::nextafter(1.0, 0.0));
  EXPECT_TRUE(last >= 0 && last <= 1000) << last;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  const double top = std::nextafter(1.0, 0.0);
  for (int row = 0; row < 20; ++row) {
    std::vector<float> logits(8000);
    for (float& x : logits)
      x = normal(rng);
    const float max = *std::max_element(logits.begin(), logits.end());
    for (const SampleCase& c : {SampleCase{1.0f, 0, 1.0f, 0.0f}, SampleCase{1.0f, 0, 0.999f, 0.0f},
                                SampleCase{1.0f, 7000, 1.0f, 0.0f}}) {
      const int32_t t = sample_one(logits, c, top);
      ASSERT_TRUE(t >= 0 && t < 8000);
      EXPECT_GT(logits[t] - max, -87.0f) << "row " << row << ": token " << t;
    }
  }
}

// Equal weights are ranked by token id, past the sort's small-list cut (all weights
// equal, so every radix pass finds one digit; two interleaved levels of 600 tokens).
TEST(CpuSample, EqualWeightsAreRankedByTokenId) {
  const std::vector<float> flat(1000, 0.0f);
  for (int j = 0; j < 1000; j += 37)
    EXPECT_EQ(sample_one(flat, {}, (j + 0.5) / 1000), j);
  std::vector<float> levels(1200);
  for (int i = 0; i < 1200; ++i)
    levels[i] = i % 2 == 0 ? 0.5f : 0.0f;
  // Weights 1 (even ids) and e^-0.5 (odd ids): the ranking is 0, 2, ..., 1198, 1, 3, ...
  std::vector<int32_t> drawn;
  for (int j = 0; j < 4000; ++j)
    drawn.push_back(sample_one(levels, {}, (j + 0.5) / 4000));
  auto rank = [](int32_t t) { return t % 2 == 0 ? t / 2 : 600 + t / 2; };
  for (size_t j = 1; j < drawn.size(); ++j)
    ASSERT_LE(rank(drawn[j - 1]), rank(drawn[j])) << drawn[j - 1] << " then " << drawn[j];
  EXPECT_EQ(drawn.front(), 0);
  EXPECT_EQ(drawn.back(), 1199);
}

// An infinite logit gets weight 1 and the rest 0, as on the device; a row of -inf is
// uniform. Rows short of a vector and rows of several, on both paths.
TEST(CpuSample, InfiniteLogitsAreWeightedAsOnTheDevice) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> long_row = random_floats(37, 4);
  long_row[3] = nan;
  long_row[21] = inf;
  long_row[30] = -inf;
  // A NaN in the maximum's lane of a later vector (8 and 16 lanes) leaves the maximum.
  std::vector<float> nan_after = random_floats(37, 5);
  nan_after[5] = inf;
  nan_after[21] = nan;
  for (bool portable : {false, true}) {
    ScopedPortable scoped(portable);
    for (int s = 0; s < 50; ++s) {
      const double u = (s + 0.5) / 50;
      EXPECT_EQ(sample_one({1.0f, inf, 3.0f, -inf}, {}, u), 1);
      EXPECT_EQ(sample_one({-inf, -inf, -inf, -inf}, {}, u), static_cast<int32_t>(u * 4));
      EXPECT_EQ(sample_one(long_row, {}, u), 21);
      EXPECT_EQ(sample_one(nan_after, {}, u), 5);
      EXPECT_EQ(sample_one(std::vector<float>(37, -inf), {}, u), static_cast<int32_t>(u * 37));
    }
  }
}

TEST(CpuSample, MatchesAFullSortOnRandomRowsAndBatchesRowByRow) {
  std::mt19937 rng(2024);
  const std::vector<SampleCase> cases = {
      {1.0f, 0, 1.0f, 0.0f},  {0.7f, 50, 1.0f, 0.0f},   {1.0f, 0, 0.9f, 0.0f},
      {1.3f, 0, 1.0f, 0.05f}, {0.8f, 40, 0.95f, 0.02f}, {1e-3f, 0, 1.0f, 0.0f},
      {1.0f, 1, 1.0f, 0.0f},  {2.0f, 200, 0.5f, 0.0f},  {1.0f, 3000, 0.99f, 0.1f}};
  int clear = 0;
  for (int64_t vocab : {1, 7, 64, 1000, 5000}) {
    std::vector<float> logits(cases.size() * 8 * vocab);
    std::vector<float> temperature, top_p, min_p;
    std::vector<int32_t> top_k;
    std::vector<double> uniform;
    for (size_t r = 0; r < cases.size() * 8; ++r) {
      const SampleCase& c = cases[r % cases.size()];
      // Half the rows on a coarse grid of values: many exact ties.
      const bool grid = r % 2 == 1;
      std::normal_distribution<float> normal(0.0f, 2.0f);
      for (int64_t i = 0; i < vocab; ++i) {
        const float x = normal(rng);
        logits[r * vocab + i] = grid ? std::round(x * 2.0f) / 2.0f : x;
      }
      temperature.push_back(c.temperature);
      top_k.push_back(c.top_k);
      top_p.push_back(c.top_p);
      min_p.push_back(c.min_p);
      uniform.push_back(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
    }
    const int64_t rows = static_cast<int64_t>(uniform.size());
    std::vector<int32_t> batch(rows, -1);
    const SamplingRows params{temperature.data(), top_k.data(), top_p.data(), min_p.data(),
                              uniform.data()};
    {
      ScopedThreads two(2);  // rows spread over threads
      sample_top_k_top_p(logits.data(), rows, vocab, params, batch.data());
    }
    std::vector<int32_t> one_thread(rows, -1);
    {
      ScopedThreads one(1);  // the buffers the call before left on this thread, reused
      sample_top_k_top_p(logits.data(), rows, vocab, params, one_thread.data());
    }
    EXPECT_EQ(one_thread, batch);
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " row " + std::to_string(r));
      const std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      const SampleCase c{temperature[r], top_k[r], top_p[r], min_p[r]};
      EXPECT_EQ(sample_one(row, c, uniform[r]), batch[r]) << "alone vs in a batch";
      bool near_boundary = false;
      const int32_t expected = sample_by_full_sort(row, c, uniform[r], &near_boundary);
      if (near_boundary) continue;
      ++clear;
      EXPECT_EQ(batch[r], expected);
    }
  }
  EXPECT_GT(clear, 300);
}

}  // namespace
}  // namespace pagellm::kernels::cpu
