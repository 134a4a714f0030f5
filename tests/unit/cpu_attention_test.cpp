// Paged attention on the CPU: against a double-precision reference (tolerance from a
// float32 rounding bound, since the kernel rounds scores, exp and sums in float32), and bit
// for bit where kernels.h promises it: decode vs the general kernel, chunked vs whole
// prefill, a sequence alone vs in a batch of 37, SIMD vs portable path, 1 vs 2 threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "support/kernel_test_util.h"

namespace pagellm::kernels::cpu {
namespace {

using testing::encode;
using testing::poisoned;
using testing::random_floats;
using testing::ScopedPortable;
using testing::ScopedThreads;

// A cache holding a few sequences' keys and values, written through write_kv, with block
// tables over shuffled block ids (block 0 stays unused, as the null block).
struct Fixture {
  int hq, hkv, D;
  DType t;
  std::vector<int32_t> ctx;  // context length of each sequence
  int32_t window = 0;
  int32_t max_blocks = 0;
  std::vector<int32_t> tables;  // [num_seqs, max_blocks]
  std::vector<uint8_t> kc, vc;
  KVCacheLayer cache{};

  Fixture(int hq_, int hkv_, int D_, DType t_, std::vector<int32_t> ctx_, uint32_t seed,
          int32_t window_ = 0)
      : hq(hq_), hkv(hkv_), D(D_), t(t_), ctx(std::move(ctx_)), window(window_) {
    int32_t total = 1;
    for (int32_t c : ctx) {
      max_blocks = std::max(max_blocks, (c + kBlockSize - 1) / kBlockSize);
      total += (c + kBlockSize - 1) / kBlockSize;
    }
    std::vector<int32_t> ids(total - 1);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    tables.assign(ctx.size() * std::max(max_blocks, 1), -1);
    size_t next = 0;
    const int64_t row = static_cast<int64_t>(hkv) * D;
    kc.assign(total * kBlockSize * row * dtype_size(t), 0);
    vc.assign(kc.size(), 0);
    cache = KVCacheLayer{kc.data(), vc.data(), t, total, hkv, D};
    for (size_t s = 0; s < ctx.size(); ++s) {
      const int32_t nb = (ctx[s] + kBlockSize - 1) / kBlockSize;
      for (int32_t b = 0; b < nb; ++b)
        tables[s * max_blocks + b] = ids[next++];
      std::vector<int64_t> slots(ctx[s]);
      for (int32_t i = 0; i < ctx[s]; ++i)
        slots[i] = int64_t(tables[s * max_blocks + i / kBlockSize]) * kBlockSize + i % kBlockSize;
      const auto k = random_floats(ctx[s] * row, seed + 100 + s);
      const auto v = random_floats(ctx[s] * row, seed + 200 + s);
      write_kv(k.data(), v.data(), slots.data(), ctx[s], cache);
    }
    // Blocks wholly before every query's window are never read: mark them -1.
    if (window > 0) {
      for (size_t s = 0; s < ctx.size(); ++s) {
        const int32_t first_needed = std::max(0, ctx[s] - 1 - window + 1 - 64);
        for (int32_t b = 0; b < first_needed / kBlockSize; ++b)
          tables[s * max_blocks + b] = -1;
      }
    }
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(D)); }

  PagedAttentionBatch batch(const std::vector<int32_t>& query_start,
                            const std::vector<int32_t>& seqs, const std::vector<int32_t>& ctx_lens,
                            std::vector<int32_t>& table_storage) const {
    table_storage.clear();
    for (int32_t s : seqs)
      table_storage.insert(table_storage.end(), tables.begin() + s * max_blocks,
                           tables.begin() + (s + 1) * max_blocks);
    return PagedAttentionBatch{static_cast<int32_t>(seqs.size()),
                               query_start.data(),
                               ctx_lens.data(),
                               table_storage.data(),
                               max_blocks,
                               window};
  }

  float kv_at(const std::vector<uint8_t>& c, int32_t seq, int32_t pos, int h, int d) const {
    const int64_t slot =
        int64_t(tables[seq * max_blocks + pos / kBlockSize]) * kBlockSize + pos % kBlockSize;
    return load_f32(c.data(), t, (slot * hkv + h) * D + d);
  }

  // Checks out[hq, D] for sequence `seq`, query at `pos`, against a double reference.
  void expect_close(const float* q, const float* out, int32_t seq, int32_t pos) const {
    const int G = hq / hkv;
    const int32_t lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    const int npos = pos - lo + 1;
    for (int h = 0; h < hq; ++h) {
      const float* qh = q + h * D;
      std::vector<double> s(npos);
      double mx = -INFINITY, max_qk = 0, max_v = 0;
      for (int i = 0; i < npos; ++i) {
        double dot = 0, mag = 0;
        for (int d = 0; d < D; ++d) {
          const double p = double(qh[d]) * kv_at(kc, seq, lo + i, h / G, d);
          dot += p;
          mag += std::abs(p);
          max_v = std::max<double>(max_v, std::abs(kv_at(vc, seq, lo + i, h / G, d)));
        }
        s[i] = dot * scale();
        mx = std::max(mx, s[i]);
        max_qk = std::max(max_qk, mag * scale());
      }
      double sum = 0;
      for (double& x : s)
        sum += (x = std::exp(x - mx));
      // Score error <= D ulp of sum |q k| (plus the scale); exp a few ulp; the sums of p
      // and of p v are chains over npos terms.
      const double ds = (D + 2) * 0x1p-24 * max_qk;
      const double tol = max_v * (2 * ds + (npos + 24) * 0x1p-23) + 1e-30;
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int i = 0; i < npos; ++i)
          o += s[i] * kv_at(vc, seq, lo + i, h / G, d);
        ASSERT_NEAR(out[h * D + d], o / sum, tol)
            << "seq " << seq << " pos " << pos << " head " << h << " d " << d;
      }
    }
  }
};

struct Shape {
  int hq, hkv, D;
};
const Shape kShapes[] = {{4, 4, 64}, {8, 2, 64}, {16, 2, 128}, {8, 1, 128}, {12, 4, 64},
                         {6, 2, 80}, {4, 4, 72}, {4, 2, 8},    {3, 1, 33}};
const std::vector<int32_t> kContexts = {1, 15, 16, 17, 31, 33, 100, 1000};

std::vector<int32_t> iota_starts(int32_t n) {
  std::vector<int32_t> v(n + 1);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(CpuAttention, DecodeMatchesReferenceAndGeneralKernel) {
  uint32_t seed = 1;
  for (const Shape& sh : kShapes) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::to_string(sh.hq) + "/" + std::to_string(sh.hkv) + " heads, dim " +
                   std::to_string(sh.D) + ", " + dtype_name(t));
      const Fixture f(sh.hq, sh.hkv, sh.D, t, kContexts, seed += 3);
      const int32_t n = static_cast<int32_t>(kContexts.size());
      std::vector<int32_t> seqs(n), storage;
      std::iota(seqs.begin(), seqs.end(), 0);
      const auto starts = iota_starts(n);
      const PagedAttentionBatch b = f.batch(starts, seqs, f.ctx, storage);
      const int64_t width = int64_t(sh.hq) * sh.D;
      const auto q = random_floats(n * width, seed + 1);
      auto dec = poisoned(n * width), gen = poisoned(n * width);
      paged_attention_decode(q.data(), f.cache, b, sh.hq, f.scale(), dec.data());
      paged_attention(q.data(), f.cache, b, sh.hq, f.scale(), gen.data());
      EXPECT_BITWISE_EQ(dec.data(), gen.data(), n * width, "decode vs general");
      for (int32_t s = 0; s < n; ++s)
        f.expect_close(q.data() + s * width, dec.data() + s * width, s, f.ctx[s] - 1);
      {
        ScopedPortable portable(true);
        auto p = poisoned(n * width);
        paged_attention_decode(q.data(), f.cache, b, sh.hq, f.scale(), p.data());
        EXPECT_BITWISE_EQ(p.data(), dec.data(), n * width, "portable");
      }
      for (int threads : {1, 2}) {
        ScopedThreads scoped(threads);
        auto p = poisoned(n * width);
        paged_attention_decode(q.data(), f.cache, b, sh.hq, f.scale(), p.data());
        EXPECT_BITWISE_EQ(p.data(), dec.data(), n * width, std::to_string(threads) + " threads");
      }
    }
  }
}

// Whole prompts as one prefill batch: every query against the reference, and each
// prompt's last query equal to a decode step at that position.
TEST(CpuAttention, PrefillMatchesReferenceAndDecodeStep) {
  for (const Shape& sh : {kShapes[1], kShapes[3], kShapes[5], kShapes[6], kShapes[7], kShapes[8]}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const std::vector<int32_t> ctx = {1, 15, 16, 17, 33, 100};
      const Fixture f(sh.hq, sh.hkv, sh.D, t, ctx, 77);
      const int32_t n = static_cast<int32_t>(ctx.size());
      std::vector<int32_t> starts = {0}, seqs(n), storage;
      std::iota(seqs.begin(), seqs.end(), 0);
      for (int32_t c : ctx)
        starts.push_back(starts.back() + c);
      const int64_t width = int64_t(sh.hq) * sh.D, tokens = starts.back();
      const auto q = random_floats(tokens * width, 5);
      auto out = poisoned(tokens * width);
      paged_attention(q.data(), f.cache, f.batch(starts, seqs, ctx, storage), sh.hq, f.scale(),
                      out.data());
      std::vector<float> last_q, last_out;
      for (int32_t s = 0; s < n; ++s) {
        for (int32_t j = 0; j < ctx[s]; ++j)
          f.expect_close(q.data() + (starts[s] + j) * width, out.data() + (starts[s] + j) * width,
                         s, j);
        const int64_t tl = starts[s + 1] - 1;
        last_q.insert(last_q.end(), q.begin() + tl * width, q.begin() + (tl + 1) * width);
        last_out.insert(last_out.end(), out.begin() + tl * width, out.begin() + (tl + 1) * width);
      }
      auto dec = poisoned(n * width);
      const auto dstarts = iota_starts(n);
      paged_attention_decode(last_q.data(), f.cache, f.batch(dstarts, seqs, ctx, storage), sh.hq,
                             f.scale(), dec.data());
      EXPECT_BITWISE_EQ(dec.data(), last_out.data(), n * width, "decode vs prefill");
      ScopedPortable portable(true);
      auto portable_out = poisoned(tokens * width);
      paged_attention(q.data(), f.cache, f.batch(starts, seqs, ctx, storage), sh.hq, f.scale(),
                      portable_out.data());
      EXPECT_BITWISE_EQ(portable_out.data(), out.data(), tokens * width, "portable prefill");
    }
  }
}

// A batch of 1..64 sequences with mixed q_len, then the same queries in random chunks
// (several sequences' chunks per batch): the same bits.
TEST(CpuAttention, ChunkedPrefillEqualsWholeForMixedBatches) {
  std::mt19937 rng(5);
  for (int32_t n : {1, 2, 7, 37, 64}) {
    for (DType t : {DType::kF16, DType::kBF16}) {
      std::vector<int32_t> ctx(n), qlen(n);
      for (int32_t s = 0; s < n; ++s) {
        ctx[s] = std::uniform_int_distribution<int32_t>(1, 150)(rng);
        qlen[s] = std::uniform_int_distribution<int32_t>(1, ctx[s])(rng);
      }
      const Fixture f(8, 2, 64, t, ctx, n);
      std::vector<int32_t> starts = {0}, seqs(n), storage;
      std::iota(seqs.begin(), seqs.end(), 0);
      for (int32_t s = 0; s < n; ++s)
        starts.push_back(starts.back() + qlen[s]);
      const int64_t width = 8 * 64, tokens = starts.back();
      const auto q = random_floats(tokens * width, n + 9);
      auto whole = poisoned(tokens * width);
      paged_attention(q.data(), f.cache, f.batch(starts, seqs, ctx, storage), 8, f.scale(),
                      whole.data());
      // Spot-check against the reference (first query of each sequence).
      for (int32_t s = 0; s < n; s += 5)
        f.expect_close(q.data() + starts[s] * width, whole.data() + starts[s] * width, s,
                       ctx[s] - qlen[s]);

      // Chunks: each round takes the next chunk of every unfinished sequence.
      std::vector<int32_t> done(n, 0);
      auto chunked = poisoned(tokens * width);
      for (bool any = true; any;) {
        any = false;
        std::vector<int32_t> cstarts = {0}, cseqs, cctx;
        std::vector<float> cq;
        std::vector<int64_t> rows;
        for (int32_t s = 0; s < n; ++s) {
          if (done[s] == qlen[s]) continue;
          any = true;
          const int32_t len = std::uniform_int_distribution<int32_t>(1, qlen[s] - done[s])(rng);
          cseqs.push_back(s);
          cctx.push_back(ctx[s] - qlen[s] + done[s] + len);
          cstarts.push_back(cstarts.back() + len);
          for (int32_t j = 0; j < len; ++j) {
            const int64_t row = starts[s] + done[s] + j;
            rows.push_back(row);
            cq.insert(cq.end(), q.begin() + row * width, q.begin() + (row + 1) * width);
          }
          done[s] += len;
        }
        if (!any) break;
        std::vector<float> cout = poisoned(rows.size() * width);
        paged_attention(cq.data(), f.cache, f.batch(cstarts, cseqs, cctx, storage), 8, f.scale(),
                        cout.data());
        for (size_t r = 0; r < rows.size(); ++r)
          std::copy(cout.begin() + r * width, cout.begin() + (r + 1) * width,
                    chunked.begin() + rows[r] * width);
      }
      EXPECT_BITWISE_EQ(chunked.data(), whole.data(), tokens * width,
                        std::to_string(n) + " sequences");
    }
  }
}

TEST(CpuAttention, SlidingWindowSkipsOldPositions) {
  for (int32_t window : {1, 16, 20, 100}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const std::vector<int32_t> ctx = {1, 17, 40, 200, 333};
      const Fixture f(8, 2, 64, t, ctx, 3, window);
      const int32_t n = static_cast<int32_t>(ctx.size());
      std::vector<int32_t> seqs(n), storage;
      std::iota(seqs.begin(), seqs.end(), 0);
      const auto starts = iota_starts(n);
      const int64_t width = 8 * 64;
      const auto q = random_floats(n * width, 4);
      auto dec = poisoned(n * width), gen = poisoned(n * width);
      const PagedAttentionBatch b = f.batch(starts, seqs, ctx, storage);
      paged_attention_decode(q.data(), f.cache, b, 8, f.scale(), dec.data());
      paged_attention(q.data(), f.cache, b, 8, f.scale(), gen.data());
      EXPECT_BITWISE_EQ(dec.data(), gen.data(), n * width, "window " + std::to_string(window));
      for (int32_t s = 0; s < n; ++s)
        f.expect_close(q.data() + s * width, dec.data() + s * width, s, ctx[s] - 1);
      // Prefill of the last 50 tokens of the longest prompt, with the window.
      const int32_t s = 4, len = 50;
      std::vector<int32_t> ps = {0, len}, pseq = {s}, pctx = {ctx[s]};
      const auto pq = random_floats(len * width, 8);
      auto pout = poisoned(len * width);
      paged_attention(pq.data(), f.cache, f.batch(ps, pseq, pctx, storage), 8, f.scale(),
                      pout.data());
      for (int32_t j = 0; j < len; ++j)
        f.expect_close(pq.data() + j * width, pout.data() + j * width, s, ctx[s] - len + j);
      // Each of those queries alone, as a decode step at its position, and the portable
      // path: the same bits (queries of one prefill start their windows at different keys).
      std::vector<int32_t> dseq(len, s), dctx(len);
      for (int32_t j = 0; j < len; ++j)
        dctx[j] = ctx[s] - len + j + 1;
      auto dout = poisoned(len * width);
      paged_attention_decode(pq.data(), f.cache, f.batch(iota_starts(len), dseq, dctx, storage), 8,
                             f.scale(), dout.data());
      EXPECT_BITWISE_EQ(dout.data(), pout.data(), len * width, "decode steps vs windowed prefill");
      ScopedPortable portable(true);
      auto portable_out = poisoned(len * width);
      paged_attention(pq.data(), f.cache, f.batch(ps, pseq, pctx, storage), 8, f.scale(),
                      portable_out.data());
      EXPECT_BITWISE_EQ(portable_out.data(), pout.data(), len * width, "portable windowed prefill");
    }
  }
}

// An infinite value at one position reaches only the queries that attend to it: the
// queries before it, computed in the same prefill runs, equal decode steps bit for bit.
TEST(CpuAttention, NonFiniteValueStaysOutOfEarlierQueries) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int32_t len = 40, bad = 21;
    Fixture f(6, 2, 64, t, {len}, 12);
    const int64_t slot = int64_t(f.tables[bad / kBlockSize]) * kBlockSize + bad % kBlockSize;
    for (int h = 0; h < f.hkv; ++h) {
      const int64_t i = (slot * f.hkv + h) * f.D + 5;
      if (t == DType::kF32) {
        reinterpret_cast<float*>(f.vc.data())[i] = INFINITY;
      } else {
        reinterpret_cast<uint16_t*>(f.vc.data())[i] = 0x7f80;  // bf16 +inf
      }
    }
    const int64_t width = 6 * 64;
    const auto q = random_floats(len * width, 13);
    std::vector<int32_t> storage, seq0 = {0}, ctx = {len}, starts = {0, len};
    auto pre = poisoned(len * width);
    paged_attention(q.data(), f.cache, f.batch(starts, seq0, ctx, storage), 6, f.scale(),
                    pre.data());
    std::vector<int32_t> dseq(bad, 0), dctx(bad);
    std::iota(dctx.begin(), dctx.end(), 1);
    auto dec = poisoned(bad * width);
    paged_attention_decode(q.data(), f.cache, f.batch(iota_starts(bad), dseq, dctx, storage), 6,
                           f.scale(), dec.data());
    EXPECT_BITWISE_EQ(dec.data(), pre.data(), bad * width, "queries before the infinite value");
    for (int64_t i = 0; i < bad * width; ++i)
      ASSERT_TRUE(std::isfinite(pre[i])) << i;
  }
}

TEST(CpuAttention, SequenceAloneEqualsSequenceInBatchOf37) {
  std::vector<int32_t> ctx(37);
  for (int32_t s = 0; s < 37; ++s)
    ctx[s] = 1 + (s * 53) % 300;
  const Fixture f(12, 4, 64, DType::kBF16, ctx, 9);
  std::vector<int32_t> seqs(37), storage;
  std::iota(seqs.begin(), seqs.end(), 0);
  const int64_t width = 12 * 64;
  const auto q = random_floats(37 * width, 10);
  auto batch_out = poisoned(37 * width);
  const auto starts = iota_starts(37);
  paged_attention_decode(q.data(), f.cache, f.batch(starts, seqs, ctx, storage), 12, f.scale(),
                         batch_out.data());
  const auto one = iota_starts(1);
  for (int32_t s = 0; s < 37; ++s) {
    auto alone = poisoned(width);
    std::vector<int32_t> only = {s}, only_ctx = {ctx[s]};
    paged_attention_decode(q.data() + s * width, f.cache, f.batch(one, only, only_ctx, storage), 12,
                           f.scale(), alone.data());
    EXPECT_BITWISE_EQ(alone.data(), batch_out.data() + s * width, width,
                      "sequence " + std::to_string(s));
  }
}

}  // namespace
}  // namespace pagellm::kernels::cpu
