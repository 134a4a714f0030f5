// The device sampler's steps (kernels/cuda/block_sampler.h) run on the host, one thread
// after another, against the CPU twin kernels::cpu::sample_top_k_top_p: every clear
// decision must agree. Besides the kernel's own block (512 threads, up to 512 tokens
// ranked at once), blocks that rank one or four tokens at a time split every bin down to
// the last digit of the weight, and bins of tied weights down to the token ids. Fresh
// random inputs each run; PAGELLM_TEST_SEED=N replays one.

#include "kernels/cuda/block_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/simd.h"
#include "support/sampling_cases.h"

namespace pagellm::kernels::cuda::block_sampler {
namespace {

using testing::fresh_seed;
using testing::seed_trace;
using namespace testing::sampling;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The block interface on the host: the threads of a step run one after another, and a
// scan's first function runs for every thread before its second (as on the device,
// where the scan stands between them).
template <int kThreadsV, int kGatherV>
struct HostBlock {
  static constexpr int kThreads = kThreadsV;
  static constexpr int kGather = kGatherV;
  using SharedT = Shared<kGather>;
  std::unique_ptr<SharedT> storage = std::make_unique<SharedT>();

  SharedT& shared() { return *storage; }

  template <class F>
  void each(F f) {
    for (int t = 0; t < kThreads; ++t)
      f(t);
  }
  template <class F>
  float reduce_max(F f) {
    float m = -kInf;
    for (int t = 0; t < kThreads; ++t)
      m = std::fmax(m, f(t));
    return m;
  }
  template <class F>
  Tally sum(F f) {
    Tally total{0, 0};
    for (int t = 0; t < kThreads; ++t)
      total = total + f(t);
    return total;
  }
  template <class F, class G>
  Tally scan(F f, G g) {
    std::vector<Tally> v(kThreads);
    for (int t = 0; t < kThreads; ++t)
      v[t] = f(t);
    Tally run{0, 0};
    for (int t = 0; t < kThreads; ++t) {
      g(t, run);
      run = run + v[t];
    }
    return run;
  }
  static uint32_t atomic_add(uint32_t* p, uint32_t v) {
    const uint32_t old = *p;
    *p += v;
    return old;
  }
  static float scaled(float x, float inv_t) { return x * inv_t; }
  // The CPU twin's weights, bit for bit: its exp, and NaN kept (as the device's expf keeps
  // it; exp_scalar alone would turn it into a large number).
  static float exp_diff(float s, float m) {
    const float d = s - m;
    return std::isnan(d) ? d : cpu::detail::exp_scalar(d);
  }
  static float recip(float t) { return 1.0f / t; }
  static u64 quantize(float x) { return static_cast<u64>(std::nearbyint(x)); }
};

using KernelBlock = HostBlock<512, 512>;

// Every row of `b` through sample_row, as the kernel runs it (rows without a temperature
// keep -1). A step that finds nothing (-1) is kept, for the test to see.
template <class Block>
std::vector<int32_t> host_sample(const Batch& b) {
  Block block;
  const float scale = mass_scale(b.vocab);
  std::vector<int32_t> out(b.rows, -1);
  for (int64_t r = 0; r < b.rows; ++r) {
    if (!(b.temperature[r] > 0.0f)) continue;
    out[r] = sample_row(block, b.logits.data() + r * b.vocab, b.vocab, b.temperature[r], b.top_k[r],
                        b.top_p[r], b.min_p[r], b.uniform[r], scale);
  }
  return out;
}

TEST(BlockSampler, MassShiftKeepsARowBelow2To63) {
  for (int64_t vocab : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{32000}, int64_t{128256},
                        int64_t{1} << 17, int64_t{INT32_MAX} - 1}) {
    const int s = mass_shift(vocab);
    const long double top = std::ldexp(1.0L, 63);
    EXPECT_LT(static_cast<long double>(vocab) * std::ldexp(1.0L, s), top) << vocab;
    EXPECT_GE(static_cast<long double>(vocab) * std::ldexp(1.0L, s + 1), top) << vocab;
  }
  EXPECT_EQ(mass_shift(1), 62);
  EXPECT_EQ(mass_shift(128256), 46);
}

// A bin's mass is two 32-bit words: every carry out of the low word reaches the high one,
// whatever the order of the adds.
TEST(BlockSampler, MassCarriesFromTheLowWordIntoTheHighWord) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  KernelBlock b;
  auto& sh = b.shared();
  sh.mass_lo[7] = sh.mass_hi[7] = 0;
  u64 want = 0;
  for (const u64 v : {u64{0xFFFFFFFF}, u64{1}, u64{0}, u64{1} << 32, (u64{1} << 46) - 1,
                      u64{0xFFFFFFFF}, u64{0x80000000}, u64{0x80000000}}) {
    add_mass<KernelBlock>(sh, 7, v);
    want += v;
    ASSERT_EQ(mass_of(sh, 7), want) << "after adding " << v;
  }
  for (int i = 0; i < 100000; ++i) {
    const u64 v = rng() >> 18;  // masses of a 128k vocabulary are below 2^46
    add_mass<KernelBlock>(sh, 7, v);
    want += v;
  }
  EXPECT_EQ(mass_of(sh, 7), want);
}

// With the twin's weights, the rows near a boundary agree as well: only the masses differ,
// summed in double there and as integers here, by about 2^-30 of the largest weight (a
// draw that close to a boundary has a chance of about 1e-9).
void expect_all_rows_agree(const Batch& b, const std::vector<int32_t>& got) {
  EXPECT_GE(expect_same_tokens(b, got), b.rows * 7 / 10) << "too few clear rows to judge by";
  EXPECT_EQ(got, cpu_sample(b));
}

TEST(BlockSampler, KernelBlockMatchesCpuTwinOnMixedRows) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (int64_t vocab : {1, 2, 50, 1000, 32000}) {
    SCOPED_TRACE("vocab=" + std::to_string(vocab));
    const Batch b = make_batch(96, vocab, rng);
    expect_all_rows_agree(b, host_sample<KernelBlock>(b));
  }
  const Batch b = make_batch(24, 128256, rng);
  expect_all_rows_agree(b, host_sample<KernelBlock>(b));
}

// One or four tokens ranked at once: bins are split down to the last digit of the weight,
// and tied weights (the logits on a grid of 1/16) down to the ids.
TEST(BlockSampler, EveryDigitOfTheKeyMatchesCpuTwin) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (int64_t vocab : {1, 3, 700, 5000}) {
    SCOPED_TRACE("vocab=" + std::to_string(vocab));
    const Batch b = make_batch(48, vocab, rng);
    expect_all_rows_agree(b, host_sample<HostBlock<32, 1>>(b));
    expect_all_rows_agree(b, host_sample<HostBlock<64, 4>>(b));
  }
}

// Rows at the edges of what requests send: ties on grids, masked (-inf) and infinite
// logits, NaN, all equal; temperatures from 1e-4 to 100; top-k 1, vocab - 1 and past the
// vocabulary; top-p 0 and 1e-6; min-p 1 and above; draws of 0 and just below 1.
Batch edge_batch(std::mt19937& rng) {
  auto pick = [&](const auto& options) { return options[rng() % std::size(options)]; };
  const int64_t vocabs[] = {1, 2, 3, 5, 17, 100, 513, 1000, 1025, 2049, 4096, 5000, 33000};
  Batch b;
  b.vocab = pick(vocabs);
  b.rows = 1 + rng() % 8;
  const auto n = static_cast<int32_t>(b.vocab);
  const float temperatures[] = {1e-4f, 0.01f, 0.3f, 0.7f, 1.0f, 1.5f, 4.0f, 100.0f};
  const int32_t top_ks[] = {0, 0, 1, 2, 5, 50, n - 1, n, 1 << 30};
  const float top_ps[] = {1.0f, 1.0f, 0.0f, 1e-6f, 0.1f, 0.5f, 0.9f, 0.95f, 0.999f};
  const float min_ps[] = {0.0f, 0.0f, 0.0f, 1e-6f, 0.01f, 0.1f, 0.5f, 0.999f, 1.0f, 2.0f};
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t r = 0; r < b.rows; ++r) {
    const int kind = static_cast<int>(rng() % 8);
    std::normal_distribution<float> normal(0.0f, std::pow(10.0f, 3.0f * unit(rng) - 1.0f));
    const float grid = static_cast<float>(1 << (rng() % 6));
    for (int64_t i = 0; i < b.vocab; ++i) {
      float x = normal(rng);
      if (kind == 0) x = std::round(x * grid) / grid;  // ties
      if (kind == 1 && rng() % 4 == 0) x = -kInf;      // masked
      if (kind == 2 && rng() % 50 == 0) x = kNaN;
      if (kind == 3 && i % 7 == 0) x = 3.0f;  // a tied top
      if (kind == 4) x = 0.5f;                // all equal
      if (kind == 5 && rng() % 100 == 0) x = kInf;
      b.logits.push_back(x);
    }
    b.temperature.push_back(pick(temperatures));
    b.top_k.push_back(pick(top_ks));
    b.top_p.push_back(pick(top_ps));
    b.min_p.push_back(pick(min_ps));
    float u = unit(rng);
    if (rng() % 10 == 0) u = 0.0f;
    if (rng() % 10 == 0) u = std::nextafter(1.0f, 0.0f);
    b.uniform.push_back(u);
  }
  return b;
}

TEST(BlockSampler, EdgeCasesMatchCpuTwin) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (int i = 0; i < 100; ++i) {
    const Batch b = edge_batch(rng);
    const std::vector<int32_t> want = cpu_sample(b);
    ASSERT_EQ(host_sample<KernelBlock>(b), want) << "batch " << i << ", vocab " << b.vocab;
    ASSERT_EQ((host_sample<HostBlock<32, 1>>(b)), want) << "batch " << i << ", vocab " << b.vocab;
  }
}

// Equal logits: every weight is 1, so the masses are whole multiples and each draw exact.
// A bin of 1,000 or 5,000 ties holds more than the kernel ranks at once (512): the ties
// are split by their ids (over one digit of them at 1,000, two at 5,000).
TEST(BlockSampler, TiesAreTakenByLowerIdExactly) {
  for (int64_t vocab : {1000, 5000}) {
    SCOPED_TRACE("vocab=" + std::to_string(vocab));
    Batch b;
    b.rows = 7;
    b.vocab = vocab;
    b.logits.assign(b.rows * b.vocab, 0.25f);
    b.temperature = {1.0f, 1.0f, 1.0f, 1.0f, 0.5f, 1.0f, 1.0f};
    b.top_k = {3, 3, 0, 0, 10, 0, 0};
    b.top_p = {1.0f, 1.0f, 0.5f, 1.0f, 0.45f, 1.0f, 1.0f};
    b.min_p = {0.0f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f};
    b.uniform = {0.5f, 0.0f, 0.999f, 0.25f, 0.5f, 0.7505f, std::nextafter(1.0f, 0.0f)};
    // top-k 3, u 0.5: 1.5 of 3, the second. top-p 0.5: the first half, then 0.999 of it.
    // Row 4: top-k 10, then top-p 0.45 of 10 = 4.5: five tokens; 2.5 of 5: the third.
    const auto n = static_cast<int32_t>(vocab);
    const std::vector<int32_t> want = {
        1,     0, static_cast<int32_t>(std::floor(0.999f * static_cast<float>(n / 2))),
        n / 4, 2, static_cast<int32_t>(std::floor(0.7505 * n)),
        n - 1};
    EXPECT_EQ(cpu_sample(b), want) << "the CPU twin";
    EXPECT_EQ(host_sample<KernelBlock>(b), want);
    EXPECT_EQ((host_sample<HostBlock<32, 1>>(b)), want);
  }
}

TEST(BlockSampler, NaNIsNeverDrawnAndARowOfNaNGivesZero) {
  Batch b;
  b.rows = 6;
  b.vocab = 700;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < 4 * b.vocab; ++i)
    b.logits.push_back(i % 3 == 0 ? kNaN : normal(rng));
  b.logits.insert(b.logits.end(), b.vocab, kNaN);   // row 4: nothing to draw
  b.logits.insert(b.logits.end(), b.vocab, -kInf);  // row 5: all tied at the top
  b.temperature = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  b.top_k = {0, 5, 0, 0, 0, 0};
  b.top_p = {1.0f, 1.0f, 0.5f, 1.0f, 1.0f, 1.0f};
  b.min_p = {0.0f, 0.0f, 0.0f, 0.1f, 0.0f, 0.0f};
  b.uniform = {0.3f, 0.9f, 0.0f, std::nextafter(1.0f, 0.0f), 0.5f, 0.5f};
  for (const auto& out : {host_sample<KernelBlock>(b), host_sample<HostBlock<32, 1>>(b)}) {
    for (int64_t r = 0; r < 4; ++r) {
      ASSERT_TRUE(out[r] >= 0 && out[r] < b.vocab) << "row " << r;
      EXPECT_FALSE(std::isnan(b.logits[r * b.vocab + out[r]])) << "row " << r;
    }
    EXPECT_EQ(out[4], 0);
    EXPECT_EQ(out[5], cpu_sample(b)[5]);
    EXPECT_EQ(out[5], 350);
  }
}

}  // namespace
}  // namespace pagellm::kernels::cuda::block_sampler
