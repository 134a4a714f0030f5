#pragma once
// Helpers shared by the CPU kernel tests: random data in each dtype, NaN-poisoned
// outputs, bitwise comparison, and scoped switches for thread count and kernel path.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/dtype.h"

namespace pagellm::kernels::cpu::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& v : out)
    v = dist(rng);
  return out;
}

inline std::vector<float> poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// Rotary frequencies inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2.
inline std::vector<float> rope_inv_freq(int head_dim, double theta) {
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i)
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / head_dim));
  return inv_freq;
}

// The q, k and v parts of each row of a fused [tokens, qd + 2 * kvd] projection.
struct QkvRows {
  std::vector<float> q, k, v;  // [tokens, qd], [tokens, kvd], [tokens, kvd]
};
inline QkvRows split_qkv(const std::vector<float>& qkv, int64_t tokens, int64_t qd, int64_t kvd) {
  QkvRows out{std::vector<float>(tokens * qd), std::vector<float>(tokens * kvd),
              std::vector<float>(tokens * kvd)};
  const int64_t width = qd + 2 * kvd;
  for (int64_t r = 0; r < tokens; ++r) {
    std::copy_n(qkv.begin() + r * width, qd, out.q.begin() + r * qd);
    std::copy_n(qkv.begin() + r * width + qd, kvd, out.k.begin() + r * kvd);
    std::copy_n(qkv.begin() + r * width + qd + kvd, kvd, out.v.begin() + r * kvd);
  }
  return out;
}

// Values stored in `t` (raw bytes), from float32 with round to nearest even.
inline std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i)
    store_f32(out.data(), t, static_cast<int64_t>(i), v[i]);
  return out;
}

// Index of the first element whose bits differ, or -1.
inline int64_t first_bit_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return -1;
}

#define EXPECT_BITWISE_EQ(a, b, n, what)                                                       \
  do {                                                                                         \
    const int64_t _i = ::pagellm::kernels::cpu::testing::first_bit_difference(a, b, n);        \
    EXPECT_EQ(_i, -1) << (what) << ": first difference at " << _i << ": " << (a)[_i] << " vs " \
                      << (b)[_i];                                                              \
  } while (0)

class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

class ScopedPortable {
 public:
  explicit ScopedPortable(bool on) : saved_(portable_kernels()) { set_portable_kernels(on); }
  ~ScopedPortable() { set_portable_kernels(saved_); }

 private:
  bool saved_;
};

// Turns matmul's AMX path on or off (see amx_matmul) for the scope; on changes nothing on
// a machine without it.
class ScopedAmx {
 public:
  explicit ScopedAmx(bool on) : saved_(amx_matmul()) { set_amx_matmul(on); }
  ~ScopedAmx() { set_amx_matmul(saved_ || !amx_matmul_available()); }

 private:
  bool saved_;
};

// The matmul paths this machine has: the fma one, and AMX where there is one.
inline std::vector<bool> matmul_amx_modes() {
  if (amx_matmul_available()) return {false, true};
  return {false};
}

inline const char* name(DType t) {
  return dtype_name(t);
}

}  // namespace pagellm::kernels::cpu::testing
