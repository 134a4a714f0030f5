// The sampling kernels against their CPU twins: penalties and argmax exactly (ties, NaN,
// rows of one token, a 128k vocabulary), and top-k / top-p / min-p sampling token for token on
// random logits with mixed parameters, wherever the draw is not within rounding of a boundary (the
// device's exp and float32 weights differ from the CPU's by an ulp or two; the test finds the
// boundaries on the CPU and counts only clear cases, which must all match). Fresh random inputs
// each run; PAGELLM_TEST_SEED=N replays one. Skipped without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "support/cuda_test_util.h"
#include "support/sampling_cases.h"

namespace pagellm::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::seed_trace;
using testing::Stream;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------
// apply_penalties

// Random rows of random lists (prompt tokens, counted output tokens, biases, tokens
// outside the vocabulary, empty lists, rows without a repetition penalty): every logit
// equals the CPU twin's, bit for bit.
TEST(CudaPenalties, MatchCpuExactly) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_real_distribution<float> penalty(0.0f, 2.0f);
  for (int64_t vocab : {7, 1000, 128256}) {
    for (int64_t rows : {1, 5, 200}) {
      SCOPED_TRACE("vocab=" + std::to_string(vocab) + " rows=" + std::to_string(rows));
      std::vector<float> logits(rows * vocab);
      for (float& x : logits)
        x = normal(rng);
      std::vector<PenaltyRow> penalty_rows;
      std::vector<PenaltyToken> tokens;
      for (int64_t r = 0; r < rows; ++r) {
        PenaltyRow row;
        row.begin = static_cast<int32_t>(tokens.size());
        const int mode = static_cast<int>(r % 4);
        row.repetition = mode == 1 ? 1.0f : 0.5f + penalty(rng);
        row.presence = mode == 2 ? 0.0f : penalty(rng) - 1.0f;
        row.frequency = mode == 2 ? 0.0f : penalty(rng) - 1.0f;
        // Distinct tokens: a random subset, plus two outside the vocabulary.
        const int64_t n = mode == 3 ? 0 : std::min<int64_t>(vocab, 1 + rng() % 3000);
        std::vector<int32_t> ids(vocab);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(n);
        if (n > 0) {
          ids.push_back(static_cast<int32_t>(vocab));
          ids.push_back(-3);
        }
        for (int32_t id : ids) {
          PenaltyToken t{id, static_cast<int32_t>(rng() % 3 == 0 ? rng() % 20 : 0), 0.0f, 0};
          if (rng() % 2) t.flags |= kPenaltyInPrompt;
          if (rng() % 3 == 0) {
            t.flags |= kPenaltyHasBias;
            t.bias = normal(rng) * 10.0f;
          }
          tokens.push_back(t);
        }
        row.end = static_cast<int32_t>(tokens.size());
        penalty_rows.push_back(row);
      }
      std::vector<float> expected = logits;
      cpu::apply_penalties(expected.data(), rows, vocab, penalty_rows.data(), tokens.data());
      const DeviceBuffer d_logits = DeviceBuffer::from(logits);
      const DeviceBuffer d_rows = DeviceBuffer::from(penalty_rows);
      const DeviceBuffer d_tokens = DeviceBuffer::from(tokens);
      Stream stream;
      apply_penalties(d_logits.get<float>(), rows, vocab, d_rows.get<PenaltyRow>(),
                      d_tokens.get<PenaltyToken>(), stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::vector<float> got = d_logits.download<float>();
      ASSERT_EQ(got.size(), expected.size());
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i)
        differ += std::memcmp(&got[i], &expected[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "of " << got.size() << " logits";
      EXPECT_NE(expected, logits);  // the lists did change something
    }
  }
}

// ---------------------------------------------------------------------------------------
// argmax

std::vector<int32_t> gpu_argmax(const std::vector<float>& logits, int64_t rows, int64_t vocab,
                                int64_t offset = 0) {
  std::vector<float> padded(offset + logits.size());
  std::copy(logits.begin(), logits.end(), padded.begin() + offset);
  const DeviceBuffer d_logits = DeviceBuffer::from(padded);
  DeviceBuffer d_out(rows * sizeof(int32_t));
  d_out.poison();
  Stream stream;
  argmax(d_logits.get<float>() + offset, rows, vocab, d_out.get<int32_t>(), stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return d_out.download<int32_t>();
}

TEST(CudaArgmax, MatchesCpuExactlyWithTies) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (int64_t vocab : {1, 2, 7, 128, 1000, 32000, 128256, 128257}) {
    for (int64_t rows : {1, 3, 64}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE("vocab=" + std::to_string(vocab) + " rows=" + std::to_string(rows) +
                     " offset=" + std::to_string(offset));
        std::normal_distribution<float> normal(0.0f, 3.0f);
        std::vector<float> logits(rows * vocab);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = logits.data() + r * vocab;
          const int mode = static_cast<int>(r % 4);
          for (int64_t i = 0; i < vocab; ++i) {
            const float x = normal(rng);
            row[i] = mode == 1 ? std::round(x) : x;  // mode 1: many ties
          }
          if (mode == 2 && vocab > 1) {
            // The maximum at several places, the last one and a random one included.
            const int64_t a = rng() % vocab, b = rng() % vocab;
            row[a] = row[b] = row[vocab - 1] = 100.0f;
          }
          if (mode == 3) std::fill(row, row + vocab, 0.5f);  // all tied: index 0
        }
        std::vector<int32_t> expected(rows);
        cpu::argmax(logits.data(), rows, vocab, expected.data());
        EXPECT_EQ(gpu_argmax(logits, rows, vocab, offset), expected);
      }
    }
  }
}

TEST(CudaArgmax, NaNNeverWinsAndInfinitiesCount) {
  PAGELLM_REQUIRE_GPU();
  const int64_t vocab = 1001;
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> want;
  auto add = [&](std::vector<float> row, int32_t expected) {
    row.resize(vocab, -5.0f);
    rows.push_back(row);
    want.push_back(expected);
  };
  add({kNaN, 1.0f, 3.0f, kNaN, 3.0f}, 2);  // NaN first: still the first maximum
  add({1.0f, kNaN, 2.0f}, 2);
  add(std::vector<float>(vocab, kNaN), 0);  // nothing but NaN: 0
  add(std::vector<float>(vocab, -kInf), 0);
  add({-kInf, 1.0f, kInf, kNaN, kInf}, 2);
  std::vector<float> last(vocab, kNaN);
  last[vocab - 1] = -1.0f;
  add(last, vocab - 1);
  std::vector<float> flat;
  for (const auto& r : rows)
    flat.insert(flat.end(), r.begin(), r.end());
  const int64_t n = static_cast<int64_t>(rows.size());
  EXPECT_EQ(gpu_argmax(flat, n, vocab), want);
  std::vector<int32_t> cpu_out(n);
  cpu::argmax(flat.data(), n, vocab, cpu_out.data());
  EXPECT_EQ(cpu_out, want) << "the CPU twin";
}

// ---------------------------------------------------------------------------------------
// sample_top_k_top_p

using namespace pagellm::testing::sampling;

std::vector<int32_t> gpu_sample(const Batch& b) {
  const DeviceBuffer d_logits = DeviceBuffer::from(b.logits);
  const DeviceBuffer d_t = DeviceBuffer::from(b.temperature), d_k = DeviceBuffer::from(b.top_k);
  const DeviceBuffer d_p = DeviceBuffer::from(b.top_p), d_m = DeviceBuffer::from(b.min_p);
  const DeviceBuffer d_u = DeviceBuffer::from(b.uniform);
  DeviceBuffer d_out(b.rows * sizeof(int32_t));
  d_out.poison();
  const SamplingRows params{d_t.get<float>(), d_k.get<int32_t>(), d_p.get<float>(),
                            d_m.get<float>(), d_u.get<float>()};
  Stream stream;
  sample_top_k_top_p(d_logits.get<float>(), b.rows, b.vocab, params, d_out.get<int32_t>(), stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return d_out.download<int32_t>();
}

int64_t expect_same_tokens(const Batch& b) {
  return pagellm::testing::sampling::expect_same_tokens(b, gpu_sample(b));
}

TEST(CudaSampleTopKTopP, MatchesCpuTwinOnMixedRows) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (int64_t vocab : {1, 2, 50, 1000, 32000, 128256}) {
    SCOPED_TRACE("vocab=" + std::to_string(vocab));
    const int64_t rows = 96;
    const Batch b = make_batch(rows, vocab, rng);
    const int64_t clear = expect_same_tokens(b);
    EXPECT_GE(clear, rows * 8 / 10) << "too few clear cases to judge by";
  }
}

TEST(CudaSampleTopKTopP, ManyRowsAndALargeVocabulary) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  {
    const Batch b = make_batch(1024, 4096, rng);
    EXPECT_GE(expect_same_tokens(b), 1024 * 8 / 10);
  }
  {
    const Batch b = make_batch(16, 256000, rng);
    EXPECT_GE(expect_same_tokens(b), 12);
  }
}

TEST(CudaSampleTopKTopP, TiesAreTakenByLowerIdExactly) {
  PAGELLM_REQUIRE_GPU();
  // 1000 equal logits: every weight is 1, so masses are whole numbers and each draw is
  // exact. top_k 3 keeps ids 0, 1, 2; u = 0.5 gives 1.5 of 3, the second.
  Batch b;
  b.rows = 7;
  b.vocab = 1000;
  b.logits.assign(b.rows * b.vocab, 0.25f);
  b.temperature = {1.0f, 1.0f, 1.0f, 1.0f, 0.5f, 1.0f, 1.0f};
  b.top_k = {3, 3, 0, 0, 10, 0, 0};
  b.top_p = {1.0f, 1.0f, 0.5f, 1.0f, 0.45f, 1.0f, 1.0f};  // 0.5 of 1000: the first 500
  b.min_p = {0.0f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f};
  b.uniform = {0.5f, 0.0f, 0.999f, 0.25f, 0.5f, 0.7505f, std::nextafter(1.0f, 0.0f)};
  const std::vector<int32_t> want = {1, 0, 499, 250, 2, 750, 999};
  // Row 4: top-k 10 then top-p 0.45 of 10 = 4.5: five tokens, 2.5 of 5: the third.
  EXPECT_EQ(cpu_sample(b), want) << "the CPU twin";
  EXPECT_EQ(gpu_sample(b), want);
}

TEST(CudaSampleTopKTopP, IsDeterministicAndBatchInvariant) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  const Batch b = make_batch(48, 5000, rng);
  const std::vector<int32_t> first = gpu_sample(b);
  EXPECT_EQ(gpu_sample(b), first);
  for (int64_t r : {int64_t{0}, int64_t{17}, int64_t{47}}) {
    Batch one;
    one.rows = 1;
    one.vocab = b.vocab;
    one.logits.assign(b.logits.begin() + r * b.vocab, b.logits.begin() + (r + 1) * b.vocab);
    one.temperature = {b.temperature[r]};
    one.top_k = {b.top_k[r]};
    one.top_p = {b.top_p[r]};
    one.min_p = {b.min_p[r]};
    one.uniform = {b.uniform[r]};
    EXPECT_EQ(gpu_sample(one)[0], first[r]) << "row " << r << " alone";
  }
}

TEST(CudaSampleTopKTopP, NaNLogitsAreNeverDrawn) {
  PAGELLM_REQUIRE_GPU();
  Batch b;
  b.rows = 4;
  b.vocab = 700;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < b.rows * b.vocab; ++i)
    b.logits.push_back(i % 3 == 0 ? kNaN : normal(rng));
  b.temperature = {1.0f, 1.0f, 1.0f, 1.0f};
  b.top_k = {0, 5, 0, 0};
  b.top_p = {1.0f, 1.0f, 0.5f, 1.0f};
  b.min_p = {0.0f, 0.0f, 0.0f, 0.1f};
  b.uniform = {0.3f, 0.9f, 0.0f, std::nextafter(1.0f, 0.0f)};
  const std::vector<int32_t> out = gpu_sample(b);
  for (int64_t r = 0; r < b.rows; ++r) {
    ASSERT_TRUE(out[r] >= 0 && out[r] < b.vocab);
    EXPECT_FALSE(std::isnan(b.logits[r * b.vocab + out[r]])) << "row " << r;
  }
}

// Rows with temperature <= 0 are not the kernel's (the backend answers them with the
// argmax): their output stays as it was, here the poison -1.
TEST(CudaSampleTopKTopP, RowsWithoutATemperatureAreLeftUntouched) {
  PAGELLM_REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  Batch b = make_batch(6, 1000, rng);
  b.temperature = {0.8f, 0.0f, 1.0f, -1.0f, 0.0f, 1.2f};
  const std::vector<int32_t> out = gpu_sample(b);
  for (int64_t r = 0; r < b.rows; ++r) {
    if (b.temperature[r] > 0.0f) {
      EXPECT_TRUE(out[r] >= 0 && out[r] < b.vocab) << "row " << r;
    } else {
      EXPECT_EQ(out[r], -1) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace pagellm::kernels::cuda
