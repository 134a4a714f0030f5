// The elementwise CUDA kernels against their CPU twins on fresh random inputs (the seed
// is in every failure message; PAGELLM_TEST_SEED=N replays a run). Outputs are poisoned
// (NaN) first, so an element a kernel forgets shows as a failure. Shapes cover the
// vectorized paths (rows of a multiple of 4, aligned pointers) and the scalar fallbacks
// (odd sizes, pointers offset by one element). Skipped without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "support/cuda_test_util.h"
#include "support/kernel_test_util.h"

namespace pagellm::kernels::cuda {
namespace {

using cpu::testing::encode;
using cpu::testing::random_floats;
using cpu::testing::rope_inv_freq;
using cpu::testing::split_qkv;
using testing::decode;
using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::relative_error;
using testing::seed_trace;
using testing::Stream;
using testing::tolerance;

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// The bytes of a buffer (after the device finished), and as float32 values of `t`.
std::vector<uint8_t> bytes_of(const DeviceBuffer& b) {
  return b.download<uint8_t>();
}
std::vector<float> values_of(const DeviceBuffer& b, DType t) {
  return decode(b.download<uint8_t>(), t);
}

// Index of the first byte where a and b differ (-1: equal), for readable failures.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return -2;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

// A device buffer holding `host` starting `offset` elements in (offset 1 makes every row
// start misaligned for 16-byte loads, forcing the scalar paths).
template <typename T>
DeviceBuffer upload_at(const std::vector<T>& host, int64_t offset) {
  std::vector<T> padded(offset + host.size());
  std::copy(host.begin(), host.end(), padded.begin() + offset);
  return DeviceBuffer::from(padded);
}

// ---------------------------------------------------------------------------------------
// embedding

TEST(CudaEmbedding, GathersAndConvertsRowsExactly) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (DType t : kAllTypes) {
    for (int64_t hidden : {1, 7, 13, 64, 4096}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " hidden=" + std::to_string(hidden) +
                     " offset=" + std::to_string(offset));
        const int64_t vocab = 50, tokens = 37;
        const std::vector<uint8_t> table = encode(random_floats(vocab * hidden, rng()), t);
        std::vector<int32_t> ids(tokens);
        for (auto& id : ids)
          id = static_cast<int32_t>(rng() % vocab);
        ids[0] = 0;
        ids[1] = vocab - 1;
        std::vector<float> expected(tokens * hidden);
        cpu::embedding(ids.data(), tokens, table.data(), t, hidden, expected.data());

        const DeviceBuffer d_table = DeviceBuffer::from(table);
        const DeviceBuffer d_ids = DeviceBuffer::from(ids);
        DeviceBuffer d_out((offset + tokens * hidden) * sizeof(float));
        d_out.poison();
        embedding(d_ids.get<int32_t>(), tokens, d_table.get(), t, hidden,
                  d_out.get<float>() + offset, stream);
        PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> out = d_out.download<float>();
        out.erase(out.begin(), out.begin() + offset);
        EXPECT_EQ(std::memcmp(out.data(), expected.data(), expected.size() * sizeof(float)), 0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// rmsnorm, add_rmsnorm

struct NormCase {
  int64_t rows, dim;
  DType w, out;
};

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> cases;
  for (int64_t dim : {1, 15, 64, 100, 4096, 4099})
    for (int64_t rows : {1, 3, 37})
      for (DType w : kAllTypes) {
        cases.push_back({rows, dim, w, w});  // a 16-bit pass: activations in the weights' format
        if (w != DType::kF32) cases.push_back({rows, dim, w, DType::kF32});
      }
  return cases;
}

std::string describe(const NormCase& c) {
  return "rows=" + std::to_string(c.rows) + " dim=" + std::to_string(c.dim) +
         " w=" + dtype_name(c.w) + " out=" + dtype_name(c.out);
}

TEST(CudaRmsnorm, MatchesCpuInEveryDtype) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (const NormCase& c : norm_cases()) {
    SCOPED_TRACE(describe(c));
    const std::vector<float> x = random_floats(c.rows * c.dim, rng(), 3.0f);
    const std::vector<uint8_t> w = encode(random_floats(c.dim, rng()), c.w);
    std::vector<float> expected(c.rows * c.dim);
    cpu::rmsnorm(x.data(), w.data(), c.w, c.rows, c.dim, 1e-6f, expected.data());

    const DeviceBuffer d_x = DeviceBuffer::from(x);
    const DeviceBuffer d_w = DeviceBuffer::from(w);
    DeviceBuffer d_out(c.rows * c.dim * dtype_size(c.out));
    d_out.poison();
    rmsnorm(d_x.get<float>(), d_w.get(), c.w, c.rows, c.dim, 1e-6f, d_out.get(), c.out, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LE(relative_error(values_of(d_out, c.out), expected), tolerance(c.out));

    if (c.out == DType::kF32) {
      // In place: out aliases x.
      const DeviceBuffer d_inplace = DeviceBuffer::from(x);
      rmsnorm(d_inplace.get<float>(), d_w.get(), c.w, c.rows, c.dim, 1e-6f, d_inplace.get(), c.out,
              stream);
      PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
      EXPECT_LE(relative_error(d_inplace.download<float>(), expected), tolerance(c.out))
          << "in place";
    }
  }
}

TEST(CudaRmsnorm, MisalignedRowsTakeTheScalarPath) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  const int64_t rows = 5, dim = 64;
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> x = random_floats(rows * dim, rng());
    const std::vector<float> res0 = random_floats(rows * dim, rng());
    const std::vector<uint8_t> w = encode(random_floats(dim, rng()), t);
    std::vector<float> residual = res0, expected(rows * dim);
    cpu::add_rmsnorm(residual.data(), x.data(), w.data(), t, rows, dim, 1e-5f, expected.data());

    const DeviceBuffer d_x = upload_at(x, 1);
    const DeviceBuffer d_res = upload_at(res0, 1);
    const DeviceBuffer d_w = DeviceBuffer::from(w);
    DeviceBuffer d_out((1 + rows * dim) * sizeof(float));
    d_out.poison();
    add_rmsnorm(d_res.get<float>() + 1, d_x.get<float>() + 1, d_w.get(), t, rows, dim, 1e-5f,
                d_out.get<float>() + 1, DType::kF32, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> out = d_out.download<float>(), res = d_res.download<float>();
    out.erase(out.begin());
    res.erase(res.begin());
    EXPECT_EQ(res, residual);
    EXPECT_LE(relative_error(out, expected), tolerance(DType::kF32));
  }
}

TEST(CudaAddRmsnorm, UpdatesResidualExactlyThenNormalizes) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (const NormCase& c : norm_cases()) {
    SCOPED_TRACE(describe(c));
    const std::vector<float> x = random_floats(c.rows * c.dim, rng());
    const std::vector<float> res0 = random_floats(c.rows * c.dim, rng(), 2.0f);
    const std::vector<uint8_t> w = encode(random_floats(c.dim, rng()), c.w);
    std::vector<float> residual = res0, expected(c.rows * c.dim);
    cpu::add_rmsnorm(residual.data(), x.data(), w.data(), c.w, c.rows, c.dim, 1e-5f,
                     expected.data());

    const DeviceBuffer d_x = DeviceBuffer::from(x);
    const DeviceBuffer d_res = DeviceBuffer::from(res0);
    const DeviceBuffer d_w = DeviceBuffer::from(w);
    DeviceBuffer d_out(c.rows * c.dim * dtype_size(c.out));
    d_out.poison();
    add_rmsnorm(d_res.get<float>(), d_x.get<float>(), d_w.get(), c.w, c.rows, c.dim, 1e-5f,
                d_out.get(), c.out, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    // One float32 add per element, as on the CPU: the same bits.
    EXPECT_EQ(d_res.download<float>(), residual);
    EXPECT_LE(relative_error(values_of(d_out, c.out), expected), tolerance(c.out));

    if (c.out == DType::kF32) {
      // out may alias x.
      const DeviceBuffer d_res2 = DeviceBuffer::from(res0);
      const DeviceBuffer d_x2 = DeviceBuffer::from(x);
      add_rmsnorm(d_res2.get<float>(), d_x2.get<float>(), d_w.get(), c.w, c.rows, c.dim, 1e-5f,
                  d_x2.get(), c.out, stream);
      PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(d_res2.download<float>(), residual) << "aliased";
      EXPECT_LE(relative_error(d_x2.download<float>(), expected), tolerance(c.out)) << "aliased";
    }
  }
}

// ---------------------------------------------------------------------------------------
// add_bias

TEST(CudaAddBias, AddsTheBiasToEveryRowExactly) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (int64_t n : {1, 13, 64, 4096}) {
    for (int64_t rows : {1, 7}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                     " offset=" + std::to_string(offset));
        const std::vector<float> y0 = random_floats(rows * n, rng());
        const std::vector<float> bias = random_floats(n, rng());
        std::vector<float> expected = y0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < n; ++j)
            expected[r * n + j] = y0[r * n + j] + bias[j];
        const DeviceBuffer d_y = upload_at(y0, offset);
        const DeviceBuffer d_bias = DeviceBuffer::from(bias);
        add_bias(d_y.get<float>() + offset, d_bias.get<float>(), rows, n, stream);
        PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> y = d_y.download<float>();
        y.erase(y.begin(), y.begin() + offset);
        EXPECT_EQ(y, expected);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// rope

struct Heads {
  int q, kv;
};

// Llama 3's frequencies for `head_dim`.
std::vector<float> llama3_inv_freq(int head_dim) {
  return rope_inv_freq(head_dim, 500000.0);
}

// Positions up to 128k, the first one 0.
std::vector<int32_t> random_positions(int64_t tokens, std::mt19937& rng) {
  std::vector<int32_t> pos(tokens);
  for (auto& p : pos)
    p = static_cast<int32_t>(rng() % 131072);
  pos[0] = 0;
  return pos;
}

TEST(CudaRope, MatchesCpuRotateHalf) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (int head_dim : {16, 64, 128}) {
    for (Heads h : {Heads{4, 4}, Heads{6, 2}, Heads{8, 1}, Heads{32, 8}}) {
      for (int64_t tokens : {1, 37}) {
        SCOPED_TRACE("head_dim=" + std::to_string(head_dim) + " heads=" + std::to_string(h.q) +
                     "/" + std::to_string(h.kv) + " tokens=" + std::to_string(tokens));
        const std::vector<float> inv_freq = llama3_inv_freq(head_dim);
        const std::vector<int32_t> pos = random_positions(tokens, rng);
        const std::vector<float> q0 = random_floats(tokens * h.q * head_dim, rng());
        const std::vector<float> k0 = random_floats(tokens * h.kv * head_dim, rng());
        std::vector<float> q = q0, k = k0;
        cpu::rope(q.data(), k.data(), pos.data(), tokens, h.q, h.kv, head_dim, inv_freq.data());

        const DeviceBuffer d_q = DeviceBuffer::from(q0);
        const DeviceBuffer d_k = DeviceBuffer::from(k0);
        const DeviceBuffer d_pos = DeviceBuffer::from(pos);
        const DeviceBuffer d_freq = DeviceBuffer::from(inv_freq);
        rope(d_q.get<float>(), d_k.get<float>(), d_pos.get<int32_t>(), tokens, h.q, h.kv, head_dim,
             d_freq.get<float>(), stream);
        PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
        EXPECT_LE(relative_error(d_q.download<float>(), q), tolerance(DType::kF32)) << "q";
        EXPECT_LE(relative_error(d_k.download<float>(), k), tolerance(DType::kF32)) << "k";
      }
    }
  }
}

// rope_write_kv: the fused q|k|v epilogue against rope then write_kv on the device (bit
// for bit), and against its CPU twin.
TEST(CudaRope, RopeWriteKvEqualsRopeThenWriteKv) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (DType t : kAllTypes) {
    for (int head_dim : {64, 128, 17}) {  // (17: an odd head_dim's last value is not rotated)
      for (Heads h : {Heads{32, 8}, Heads{6, 2}, Heads{4, 4}}) {
        for (int64_t tokens : {1, 37}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " head_dim=" + std::to_string(head_dim) +
                       " heads=" + std::to_string(h.q) + "/" + std::to_string(h.kv) +
                       " tokens=" + std::to_string(tokens));
          const int64_t qd = int64_t(h.q) * head_dim, kvd = int64_t(h.kv) * head_dim;
          const int64_t width = qd + 2 * kvd;
          const std::vector<float> inv_freq = llama3_inv_freq(head_dim);
          const std::vector<int32_t> pos = random_positions(tokens, rng);
          // Distinct slots in shuffled order; padding (-1) and one past the cache.
          const int64_t num_blocks = tokens / kBlockSize + 2;
          std::vector<int64_t> slots(num_blocks * kBlockSize);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          slots.resize(tokens);
          if (tokens > 2) slots[1] = -1, slots[2] = num_blocks * kBlockSize;
          const std::vector<float> qkv = random_floats(tokens * width, rng(), 2.0f);
          const std::vector<uint8_t> cache0 =
              encode(random_floats(num_blocks * kBlockSize * kvd, rng()), t);

          // Fused.
          const DeviceBuffer d_qkv = DeviceBuffer::from(qkv), d_pos = DeviceBuffer::from(pos),
                             d_slots = DeviceBuffer::from(slots),
                             d_freq = DeviceBuffer::from(inv_freq);
          DeviceBuffer d_q(tokens * qd * sizeof(float));
          d_q.poison();
          const DeviceBuffer kc = DeviceBuffer::from(cache0), vc = DeviceBuffer::from(cache0);
          rope_write_kv(d_qkv.get<float>(), d_pos.get<int32_t>(), d_slots.get<int64_t>(), tokens,
                        h.q, d_freq.get<float>(), d_q.get<float>(),
                        KVCacheLayer{kc.get(), vc.get(), t, num_blocks, h.kv, head_dim}, stream);
          PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));

          // Split on the host, then rope and write_kv (device), and the CPU twins.
          const auto [q, k, v] = split_qkv(qkv, tokens, qd, kvd);
          const DeviceBuffer s_q = DeviceBuffer::from(q), s_k = DeviceBuffer::from(k),
                             s_v = DeviceBuffer::from(v);
          const DeviceBuffer skc = DeviceBuffer::from(cache0), svc = DeviceBuffer::from(cache0);
          const KVCacheLayer split_cache{skc.get(), svc.get(), t, num_blocks, h.kv, head_dim};
          rope(s_q.get<float>(), s_k.get<float>(), d_pos.get<int32_t>(), tokens, h.q, h.kv,
               head_dim, d_freq.get<float>(), stream);
          write_kv(s_k.get<float>(), s_v.get<float>(), d_slots.get<int64_t>(), tokens, split_cache,
                   stream);
          PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
          EXPECT_EQ(first_difference(bytes_of(d_q), bytes_of(s_q)), -1) << "q";
          EXPECT_EQ(first_difference(bytes_of(kc), bytes_of(skc)), -1) << "K cache";
          EXPECT_EQ(first_difference(bytes_of(vc), bytes_of(svc)), -1) << "V cache";

          // The CPU twin (itself bit for bit rope then write_kv on the CPU).
          std::vector<uint8_t> cpu_k = cache0, cpu_v = cache0;
          std::vector<float> cpu_q(tokens * qd);
          cpu::rope_write_kv(
              qkv.data(), pos.data(), slots.data(), tokens, h.q, inv_freq.data(), cpu_q.data(),
              cpu::KVCacheLayer{cpu_k.data(), cpu_v.data(), t, num_blocks, h.kv, head_dim});
          EXPECT_LE(relative_error(d_q.download<float>(), cpu_q), tolerance(DType::kF32)) << "q";
          EXPECT_LE(relative_error(values_of(kc, t), decode(cpu_k, t)), tolerance(t)) << "K";
          EXPECT_EQ(first_difference(bytes_of(vc), cpu_v), -1) << "V cache";
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// silu_mul_fused

TEST(CudaSiluMul, FusedMatchesCpuInEveryOutputDtype) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (int64_t dim : {1, 17, 64, 2048, 11008}) {
    for (int64_t rows : {1, 5, 33}) {
      for (DType out_dtype : kAllTypes) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " dim=" + std::to_string(dim) +
                     " out=" + dtype_name(out_dtype));
        std::vector<float> gu = random_floats(rows * 2 * dim, rng(), 3.0f);
        gu[0] = -100.f;  // silu(-100) = -0
        if (dim > 2) gu[1] = 100.f, gu[2] = 0.f;
        std::vector<float> expected(rows * dim);
        cpu::silu_mul_fused(gu.data(), rows, dim, expected.data());

        const DeviceBuffer d_gu = DeviceBuffer::from(gu);
        DeviceBuffer d_out(rows * dim * dtype_size(out_dtype));
        d_out.poison();
        silu_mul_fused(d_gu.get<float>(), rows, dim, d_out.get(), out_dtype, stream);
        PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
        EXPECT_LE(relative_error(values_of(d_out, out_dtype), expected), tolerance(out_dtype));
      }
    }
  }
}

TEST(CudaSiluMul, MisalignedInputTakesTheScalarPath) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  const int64_t rows = 3, dim = 64;
  const std::vector<float> gu = random_floats(rows * 2 * dim, seed, 3.0f);
  std::vector<float> expected(rows * dim);
  cpu::silu_mul_fused(gu.data(), rows, dim, expected.data());
  const DeviceBuffer d_gu = upload_at(gu, 1);
  DeviceBuffer d_out(rows * dim * sizeof(float));
  d_out.poison();
  silu_mul_fused(d_gu.get<float>() + 1, rows, dim, d_out.get(), DType::kF32, stream);
  PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_LE(relative_error(d_out.download<float>(), expected), tolerance(DType::kF32));
}

// ---------------------------------------------------------------------------------------
// write_kv, copy_blocks

struct KvShape {
  int kv_heads, head_dim;
};

TEST(CudaKvCache, WriteKvRoundsLikeCpuAndSkipsNegativeSlots) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (DType t : kAllTypes) {
    for (KvShape s : {KvShape{2, 64}, KvShape{8, 128}, KvShape{1, 16}, KvShape{3, 5}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " kv_heads=" + std::to_string(s.kv_heads) +
                   " head_dim=" + std::to_string(s.head_dim));
      const int64_t num_blocks = 6, row = static_cast<int64_t>(s.kv_heads) * s.head_dim;
      const int64_t cache_bytes = num_blocks * kBlockSize * row * dtype_size(t);
      // Slots in several blocks, padding (-1, -7), the first and the last slot.
      const std::vector<int64_t> slots = {5, -1, 63, 16, -7, 0, num_blocks * kBlockSize - 1, 17};
      const int64_t tokens = static_cast<int64_t>(slots.size());
      std::vector<float> k = random_floats(tokens * row, rng()),
                         v = random_floats(tokens * row, rng());
      k[0] = 1.00390625f;          // halfway between two bf16 values: rounds to even
      if (row > 1) k[1] = 1e-40f;  // subnormal in float32: kept by the 16-bit rounding
      std::vector<uint8_t> k_cache(cache_bytes), v_cache(cache_bytes);
      for (auto& b : k_cache)
        b = static_cast<uint8_t>(rng());
      for (auto& b : v_cache)
        b = static_cast<uint8_t>(rng());

      const DeviceBuffer d_k = DeviceBuffer::from(k), d_v = DeviceBuffer::from(v);
      const DeviceBuffer d_slots = DeviceBuffer::from(slots);
      const DeviceBuffer d_kc = DeviceBuffer::from(k_cache), d_vc = DeviceBuffer::from(v_cache);
      const cpu::KVCacheLayer host{k_cache.data(), v_cache.data(), t,
                                   num_blocks,     s.kv_heads,     s.head_dim};
      cpu::write_kv(k.data(), v.data(), slots.data(), tokens, host);
      const KVCacheLayer dev{d_kc.get(), d_vc.get(), t, num_blocks, s.kv_heads, s.head_dim};
      write_kv(d_k.get<float>(), d_v.get<float>(), d_slots.get<int64_t>(), tokens, dev, stream);
      PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
      // Written slots rounded identically; every other byte untouched.
      EXPECT_EQ(first_difference(bytes_of(d_kc), k_cache), -1) << "K cache";
      EXPECT_EQ(first_difference(bytes_of(d_vc), v_cache), -1) << "V cache";
    }
  }
}

TEST(CudaKvCache, CopyBlocksCopiesKeysAndValuesAtAnyAlignment) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::mt19937 rng(seed);
  for (DType t : kAllTypes) {
    // Byte offsets of the cache in its allocation: 16-byte, 4-byte and 2-byte aligned.
    for (int64_t offset : {0, 4, 2}) {
      if (t == DType::kF32 && offset == 2) continue;
      SCOPED_TRACE(std::string(dtype_name(t)) + " offset=" + std::to_string(offset));
      const int kv_heads = 2, head_dim = 64;
      const int64_t num_blocks = 7;
      const int64_t bytes = num_blocks * kBlockSize * kv_heads * head_dim * dtype_size(t);
      std::vector<uint8_t> k_cache(bytes), v_cache(bytes);
      for (auto& b : k_cache)
        b = static_cast<uint8_t>(rng());
      for (auto& b : v_cache)
        b = static_cast<uint8_t>(rng());
      // Destinations are never sources (copy-on-write into fresh blocks).
      const std::vector<int32_t> src = {1, 3, 1, 6}, dst = {4, 0, 5, 2};
      const DeviceBuffer d_kc = upload_at(k_cache, offset), d_vc = upload_at(v_cache, offset);
      const DeviceBuffer d_src = DeviceBuffer::from(src), d_dst = DeviceBuffer::from(dst);
      const cpu::KVCacheLayer host{k_cache.data(), v_cache.data(), t,
                                   num_blocks,     kv_heads,       head_dim};
      cpu::copy_blocks(host, src.data(), dst.data(), static_cast<int64_t>(src.size()));
      const KVCacheLayer dev{d_kc.get<uint8_t>() + offset,
                             d_vc.get<uint8_t>() + offset,
                             t,
                             num_blocks,
                             kv_heads,
                             head_dim};
      copy_blocks(dev, d_src.get<int32_t>(), d_dst.get<int32_t>(), static_cast<int64_t>(src.size()),
                  stream);
      PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
      std::vector<uint8_t> kc = bytes_of(d_kc), vc = bytes_of(d_vc);
      kc.erase(kc.begin(), kc.begin() + offset);
      vc.erase(vc.begin(), vc.begin() + offset);
      EXPECT_EQ(first_difference(kc, k_cache), -1) << "K cache";
      EXPECT_EQ(first_difference(vc, v_cache), -1) << "V cache";
    }
  }
}

// ---------------------------------------------------------------------------------------
// convert, fill_uniform

TEST(CudaConvert, RoundsToNearestEvenLikeCpuAndRoundTrips) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  std::vector<float> values = random_floats(100003, seed, 4.0f);
  // Edge cases: halfway points of both formats, signed zero, subnormals of float32 and
  // of float16, values that overflow float16, the largest float32.
  const std::vector<float> edges = {1.00390625f, 1.01171875f, 1.00048828125f, -0.0f,  0.0f,
                                    1e-40f,      -1e-40f,     3e-8f,          6e-5f,  -6e-5f,
                                    65504.0f,    65520.0f,    70000.0f,       -1e30f, 3.4e38f,
                                    -2.5f,       0.333333f,   1e-45f,         1e-20f, 5.96e-8f};
  std::copy(edges.begin(), edges.end(), values.begin());
  const int64_t n = static_cast<int64_t>(values.size());
  const DeviceBuffer d_in = DeviceBuffer::from(values);
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> expected = encode(values, t);
    DeviceBuffer d_narrow(n * dtype_size(t));
    d_narrow.poison();
    convert(d_in.get(), DType::kF32, d_narrow.get(), t, n, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(first_difference(bytes_of(d_narrow), expected), -1) << "float32 -> " << dtype_name(t);
    // Back to float32: exact.
    DeviceBuffer d_wide(n * sizeof(float));
    d_wide.poison();
    convert(d_narrow.get(), t, d_wide.get(), DType::kF32, n, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    const std::vector<float> wide = d_wide.download<float>(), exact = decode(expected, t);
    EXPECT_EQ(std::memcmp(wide.data(), exact.data(), n * sizeof(float)), 0)
        << dtype_name(t) << " -> float32";
  }
  // Between the 16-bit formats: through float32, each rounding to nearest even.
  for (auto [from, to] :
       {std::pair{DType::kBF16, DType::kF16}, std::pair{DType::kF16, DType::kBF16}}) {
    SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
    const std::vector<uint8_t> in = encode(values, from);
    const std::vector<uint8_t> expected = encode(decode(in, from), to);
    const DeviceBuffer d_from = DeviceBuffer::from(in);
    DeviceBuffer d_to(n * 2);
    d_to.poison();
    convert(d_from.get(), from, d_to.get(), to, n, stream);
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(first_difference(bytes_of(d_to), expected), -1);
  }
}

TEST(CudaFillUniform, IsDeterministicInRangeAndUniform) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  Stream stream;
  const int64_t n = 1000003;
  const float scale = 0.5f;
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    DeviceBuffer a(n * dtype_size(t)), b(n * dtype_size(t)), c(n * dtype_size(t));
    DeviceBuffer prefix(1000 * dtype_size(t));
    a.poison();
    b.poison();
    c.poison();
    prefix.poison();
    fill_uniform(a.get(), t, n, scale, seed, stream);
    fill_uniform(b.get(), t, n, scale, seed, stream);
    fill_uniform(c.get(), t, n, scale, seed + 1ull, stream);
    fill_uniform(prefix.get(), t, 1000, scale, seed, stream);  // another grid, same values
    PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
    const std::vector<uint8_t> ab = bytes_of(a);
    EXPECT_EQ(first_difference(ab, bytes_of(b)), -1) << "same seed, same values";
    EXPECT_FALSE(ab == bytes_of(c)) << "another seed, other values";
    const std::vector<uint8_t> pb = bytes_of(prefix);
    EXPECT_TRUE(std::equal(pb.begin(), pb.end(), ab.begin())) << "counter-based";

    const std::vector<float> v = decode(ab, t);
    // In [-scale, scale); a 16-bit value may round up to scale itself.
    const float top = t == DType::kF32 ? std::nextafter(scale, 0.0f) : scale;
    double sum = 0, sum_sq = 0;
    int64_t negatives = 0;
    for (float x : v) {
      ASSERT_TRUE(x >= -scale && x <= top) << x;
      sum += x;
      sum_sq += double(x) * x;
      negatives += x < 0;
    }
    // Uniform on [-s, s): mean 0 (sd s / sqrt(3n)), mean square s^2 / 3.
    EXPECT_NEAR(sum / n, 0.0, 5 * scale / std::sqrt(3.0 * n));
    EXPECT_NEAR(sum_sq / n, scale * scale / 3, 0.01 * scale * scale);
    EXPECT_NEAR(double(negatives) / n, 0.5, 0.005);
  }
}

// ---------------------------------------------------------------------------------------
// Empty launches: nothing to do, nothing touched, no error.

TEST(CudaElementwise, EmptyShapesLaunchNothing) {
  PAGELLM_REQUIRE_GPU();
  Stream stream;
  DeviceBuffer d(64);
  d.poison();
  const KVCacheLayer cache{d.get(), d.get(), DType::kF32, 0, 1, 4};
  embedding(nullptr, 0, nullptr, DType::kBF16, 64, d.get<float>(), stream);
  rmsnorm(nullptr, nullptr, DType::kBF16, 0, 64, 1e-5f, d.get(), DType::kBF16, stream);
  add_rmsnorm(d.get<float>(), nullptr, nullptr, DType::kBF16, 0, 64, 1e-5f, d.get(), DType::kF32,
              stream);
  add_bias(d.get<float>(), nullptr, 0, 64, stream);
  rope(nullptr, nullptr, nullptr, 0, 4, 4, 16, nullptr, stream);
  silu_mul_fused(nullptr, 0, 64, d.get(), DType::kF16, stream);
  write_kv(nullptr, nullptr, nullptr, 0, cache, stream);
  rope_write_kv(nullptr, nullptr, nullptr, 0, 4, nullptr, d.get<float>(), cache, stream);
  copy_blocks(cache, nullptr, nullptr, 0, stream);
  convert(nullptr, DType::kF32, d.get(), DType::kBF16, 0, stream);
  fill_uniform(d.get(), DType::kF32, 0, 1.0f, 1, stream);
  PAGELLM_TEST_CUDA(cudaStreamSynchronize(stream));
  for (uint8_t b : bytes_of(d))
    ASSERT_EQ(b, 0xFF);
}

}  // namespace
}  // namespace pagellm::kernels::cuda
