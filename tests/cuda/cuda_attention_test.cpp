// The CUDA paged-attention kernels (kernels/cuda/attention.cu) against their CPU twins,
// kernels::cpu::paged_attention and paged_attention_decode, on fresh random inputs every
// run (the seed is printed on failure: rerun with PAGELLM_TEST_SEED=N to reproduce).
//
// Every problem is a paged cache of random values in shuffled, non-contiguous block ids.
// Blocks no block table points to (block 0, spare blocks) hold NaN, and so do the 16
// rows just before the cache (what a -1 block id would address): a kernel that reads a
// block it must not read gets NaN into its output. Outputs and the decode workspace are
// poisoned (NaN) before each run, so an unwritten element fails relative_error(). The CPU
// reference, computed in float32, is rounded to the output dtype before the comparison.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "support/cuda_test_util.h"
#include "support/kernel_test_util.h"

namespace pagellm::kernels {
namespace {

using cuda::testing::DeviceBuffer;
using cuda::testing::relative_error;
using cuda::testing::tolerance;

constexpr int kBlock = cuda::kBlockSize;
static_assert(cuda::kBlockSize == cpu::kBlockSize);

using cuda::testing::fresh_seed;  // or PAGELLM_TEST_SEED to replay a failure

// n values uniform in [-scale, scale).
std::vector<float> random_values(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const uint64_t r = rng();
    v[i] = (static_cast<float>((r & 0xffffffffu) >> 8) * 0x1p-23f - 1.0f) * scale;
    if (i + 1 < n) v[i + 1] = (static_cast<float>(r >> 40) * 0x1p-23f - 1.0f) * scale;
  }
  return v;
}

// float32 values as they read back after a round trip through `t`.
std::vector<float> round_to(const std::vector<float>& v, DType t) {
  return cuda::testing::decode(cpu::testing::encode(v, t), t);
}

struct Shape {
  int hq, hkv, head_dim;
  DType cache, out;
};

std::string describe(const Shape& s, int32_t window) {
  return std::to_string(s.hq) + "/" + std::to_string(s.hkv) + " heads, head_dim " +
         std::to_string(s.head_dim) + ", cache " + dtype_name(s.cache) + ", out " +
         dtype_name(s.out) + (window > 0 ? ", window " + std::to_string(window) : "");
}

// One batch of sequences over one layer's paged cache, on the host and on the device.
// Sequence i has ctx[i] cached tokens, the last q_len[i] of which are its queries.
class Problem {
 public:
  Problem(const Shape& shape, std::vector<int32_t> ctx, std::vector<int32_t> q_len, int32_t window,
          uint64_t seed)
      : s_(shape), ctx_(std::move(ctx)), q_len_(std::move(q_len)), window_(window) {
    std::mt19937_64 rng(seed);
    const int n = static_cast<int>(ctx_.size());
    query_start_.assign(1, 0);
    for (int i = 0; i < n; ++i) {
      query_start_.push_back(query_start_.back() + q_len_[i]);
      max_q_len_ = std::max(max_q_len_, q_len_[i]);
      max_context_ = std::max(max_context_, ctx_[i]);
      max_blocks_ = std::max(max_blocks_, (ctx_[i] + kBlock - 1) / kBlock);
    }
    // Blocks wholly before the window of a sequence's first query are never read: their
    // entries are -1 (and no cache block holds them).
    std::vector<int32_t> first(n), count(n);
    int64_t used = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t nb = (ctx_[i] + kBlock - 1) / kBlock;
      first[i] = 0;
      if (window_ > 0 && ctx_[i] > 0) {
        const int32_t p0 = std::max(0, ctx_[i] - q_len_[i]);
        first[i] = std::min(nb, std::max(0, p0 - window_ + 1) / kBlock);
      }
      count[i] = nb - first[i];
      used += count[i];
    }
    num_blocks_ = 1 + used + used / 8 + 3;  // block 0 and a few spares stay unused
    std::vector<int32_t> ids(num_blocks_ - 1);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);

    const int64_t row = int64_t(s_.hkv) * s_.head_dim;
    const int64_t block_bytes = kBlock * row * dtype_size(s_.cache);
    k_.assign(num_blocks_ * block_bytes, 0xFF);  // NaN in every dtype
    v_.assign(num_blocks_ * block_bytes, 0xFF);
    tables_.assign(size_t(n) * max_blocks_, -1);
    size_t next = 0;
    for (int i = 0; i < n; ++i) {
      for (int32_t b = first[i]; b < first[i] + count[i]; ++b) {
        const int32_t id = ids[next++];
        tables_[size_t(i) * max_blocks_ + b] = id;
        const auto kb = cpu::testing::encode(random_values(kBlock * row, rng), s_.cache);
        const auto vb = cpu::testing::encode(random_values(kBlock * row, rng), s_.cache);
        std::memcpy(k_.data() + id * block_bytes, kb.data(), block_bytes);
        std::memcpy(v_.data() + id * block_bytes, vb.data(), block_bytes);
      }
    }
    // Queries of magnitude ~3 make the softmax peaked enough to notice a wrong score.
    q_ = random_values(size_t(num_tokens()) * s_.hq * s_.head_dim, rng, 3.0f);

    // Device copies; the cache sits one block past a NaN-filled guard.
    guard_bytes_ = block_bytes;
    d_k_ = DeviceBuffer(guard_bytes_ + k_.size());
    d_v_ = DeviceBuffer(guard_bytes_ + v_.size());
    d_k_.poison();
    d_v_.poison();
    cudaMemcpy(d_k_.get<char>() + guard_bytes_, k_.data(), k_.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_v_.get<char>() + guard_bytes_, v_.data(), v_.size(), cudaMemcpyHostToDevice);
    d_q_ = DeviceBuffer::from(q_);
    d_query_start_ = DeviceBuffer::from(query_start_);
    d_ctx_ = DeviceBuffer::from(ctx_);
    d_tables_ = DeviceBuffer::from(tables_);
  }

  int32_t num_seqs() const { return static_cast<int32_t>(ctx_.size()); }
  int32_t num_tokens() const { return query_start_.back(); }
  int32_t max_context() const { return max_context_; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(s_.head_dim)); }
  int64_t out_elems() const { return int64_t(num_tokens()) * s_.hq * s_.head_dim; }
  const Shape& shape() const { return s_; }

  // CPU twin, rounded to the output dtype.
  std::vector<float> reference(bool decode) const {
    const cpu::KVCacheLayer cache{const_cast<uint8_t*>(k_.data()),
                                  const_cast<uint8_t*>(v_.data()),
                                  s_.cache,
                                  num_blocks_,
                                  s_.hkv,
                                  s_.head_dim};
    const cpu::PagedAttentionBatch batch{num_seqs(),     query_start_.data(), ctx_.data(),
                                         tables_.data(), max_blocks_,         window_};
    std::vector<float> out(out_elems(), std::nanf(""));
    if (decode)
      cpu::paged_attention_decode(q_.data(), cache, batch, s_.hq, scale(), out.data());
    else
      cpu::paged_attention(q_.data(), cache, batch, s_.hq, scale(), out.data());
    return round_to(out, s_.out);
  }

  std::vector<float> run_general() const {
    DeviceBuffer out(out_elems() * dtype_size(s_.out));
    out.poison();
    cuda::paged_attention(d_q_.get<float>(), gpu_cache(), gpu_batch(), num_tokens(), max_q_len_,
                          s_.hq, scale(), out.get(), s_.out, nullptr);
    return finish(out);
  }

  // The decode kernel with a grid for `max_context` (>= every context; default: the
  // batch's longest), as a captured graph would run it.
  // `partition_tokens` 0: the kernel's own choice.
  std::vector<float> run_decode(int32_t max_context = -1, int partition_tokens = 0) const {
    if (max_context < 0) max_context = max_context_;
    DeviceBuffer ws(cuda::paged_attention_decode_workspace_bytes(
        num_seqs(), s_.hq, s_.hkv, s_.head_dim, max_context, partition_tokens));
    if (ws.bytes() > 0) ws.poison();  // (a zero-byte memset would leave a sticky error)
    DeviceBuffer out(out_elems() * dtype_size(s_.out));
    out.poison();
    cuda::paged_attention_decode(d_q_.get<float>(), gpu_cache(), gpu_batch(), max_context, s_.hq,
                                 scale(), ws.get(), out.get(), s_.out, nullptr, partition_tokens);
    return finish(out);
  }

  // The decode kernel on sequence `i` alone (its own batch of one).
  std::vector<float> run_decode_alone(int i, int32_t max_context, int partition_tokens = 0) const {
    const int64_t width = int64_t(s_.hq) * s_.head_dim;
    const std::vector<float> q(q_.begin() + i * width, q_.begin() + (i + 1) * width);
    const std::vector<int32_t> starts = {0, 1}, ctx = {ctx_[i]};
    const std::vector<int32_t> table(tables_.begin() + size_t(i) * max_blocks_,
                                     tables_.begin() + size_t(i + 1) * max_blocks_);
    const DeviceBuffer dq = DeviceBuffer::from(q), ds = DeviceBuffer::from(starts),
                       dc = DeviceBuffer::from(ctx), dt = DeviceBuffer::from(table);
    const cuda::PagedAttentionBatch batch{
        1, ds.get<int32_t>(), dc.get<int32_t>(), dt.get<int32_t>(), max_blocks_, window_};
    DeviceBuffer ws(cuda::paged_attention_decode_workspace_bytes(1, s_.hq, s_.hkv, s_.head_dim,
                                                                 max_context, partition_tokens));
    DeviceBuffer out(width * dtype_size(s_.out));
    out.poison();
    cuda::paged_attention_decode(dq.get<float>(), gpu_cache(), batch, max_context, s_.hq, scale(),
                                 ws.get(), out.get(), s_.out, nullptr, partition_tokens);
    return finish(out);
  }

  // The general kernel on sequence `i` alone: by default its own queries; or, for a
  // sequence whose queries are its whole prompt (q_len == ctx), the chunk of `count`
  // queries from position `first` over a context of first + count tokens.
  std::vector<float> run_general_alone(int i, int32_t first = -1, int32_t count = 0) const {
    const int64_t width = int64_t(s_.hq) * s_.head_dim;
    int32_t ctx = ctx_[i], q_len = q_len_[i];
    int64_t row0 = query_start_[i];
    if (first >= 0) {
      EXPECT_EQ(q_len_[i], ctx_[i]) << "chunks of a whole prompt only";
      ctx = first + count;
      q_len = count;
      row0 += first;
    }
    const std::vector<float> q(q_.begin() + row0 * width, q_.begin() + (row0 + q_len) * width);
    const std::vector<int32_t> starts = {0, q_len}, lens = {ctx};
    const std::vector<int32_t> table(tables_.begin() + size_t(i) * max_blocks_,
                                     tables_.begin() + size_t(i + 1) * max_blocks_);
    const DeviceBuffer dq = DeviceBuffer::from(q), ds = DeviceBuffer::from(starts),
                       dc = DeviceBuffer::from(lens), dt = DeviceBuffer::from(table);
    const cuda::PagedAttentionBatch batch{
        1, ds.get<int32_t>(), dc.get<int32_t>(), dt.get<int32_t>(), max_blocks_, window_};
    DeviceBuffer out(q.size() * dtype_size(s_.out));
    out.poison();
    cuda::paged_attention(dq.get<float>(), gpu_cache(), batch, q_len, q_len, s_.hq, scale(),
                          out.get(), s_.out, nullptr);
    return finish(out);
  }

  // Rows [query_start[i], query_start[i+1]) of an output.
  std::vector<float> rows_of(const std::vector<float>& out, int i) const {
    const int64_t width = int64_t(s_.hq) * s_.head_dim;
    return std::vector<float>(out.begin() + query_start_[i] * width,
                              out.begin() + query_start_[i + 1] * width);
  }

 private:
  cuda::KVCacheLayer gpu_cache() const {
    return cuda::KVCacheLayer{d_k_.get<char>() + guard_bytes_,
                              d_v_.get<char>() + guard_bytes_,
                              s_.cache,
                              num_blocks_,
                              s_.hkv,
                              s_.head_dim};
  }
  cuda::PagedAttentionBatch gpu_batch() const {
    return cuda::PagedAttentionBatch{num_seqs(),
                                     d_query_start_.get<int32_t>(),
                                     d_ctx_.get<int32_t>(),
                                     d_tables_.get<int32_t>(),
                                     max_blocks_,
                                     window_};
  }
  // Synchronizes, checks for a CUDA error, and reads `out` back as float32. An error gives
  // an empty vector (relative_error() of which is infinite).
  std::vector<float> finish(const DeviceBuffer& out) const {
    const cudaError_t err = cudaDeviceSynchronize();
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    if (err != cudaSuccess) return {};
    return cuda::testing::decode(out.download<uint8_t>(), s_.out);
  }

  Shape s_;
  std::vector<int32_t> ctx_, q_len_;
  int32_t window_;
  int32_t max_q_len_ = 0, max_context_ = 0, max_blocks_ = 1;
  int64_t num_blocks_ = 0;
  std::vector<int32_t> query_start_, tables_;
  std::vector<uint8_t> k_, v_;
  std::vector<float> q_;
  size_t guard_bytes_ = 0;
  DeviceBuffer d_k_, d_v_, d_q_, d_query_start_, d_ctx_, d_tables_;
};

Problem decode_problem(const Shape& s, const std::vector<int32_t>& ctx, int32_t window,
                       uint64_t seed) {
  return Problem(s, ctx, std::vector<int32_t>(ctx.size(), 1), window, seed);
}

#define EXPECT_MATCHES(out, ref, dtype)                                            \
  do {                                                                             \
    const double _err = relative_error(out, ref);                                  \
    EXPECT_LT(_err, tolerance(dtype))                                              \
        << "relative error " << _err << " (out of " << (ref).size() << " values)"; \
  } while (0)

// Context lengths at and around block (16) and partition (512) boundaries.
const std::vector<int32_t> kBoundaryContexts = {1, 15, 16, 17, 31, 33, 511, 512, 513, 1000};

const DType kCacheDtypes[] = {DType::kBF16, DType::kF32, DType::kF16};
const DType kOutDtypes[] = {DType::kF32, DType::kBF16};

// The shared memory the kernels launch with (needs no GPU): a 16-bit cache with head_dim
// up to 128 fits every Ampere, Ada and Hopper GPU (99 KiB and up per block); head_dim 256,
// or 128 over a float32 cache, needs more than Ada's 99 KiB, and 256 over float32 more
// than an A100's 163 KiB: the backend refuses those there when the model loads.
TEST(CudaAttention, SharedMemoryPerBlockForEachShape) {
  constexpr size_t kAda = 99 * 1024, kA100 = 163 * 1024, kHopper = 227 * 1024;
  EXPECT_LE(cuda::paged_attention_shared_bytes(128, 32, 8, DType::kBF16), kAda);
  EXPECT_LE(cuda::paged_attention_shared_bytes(64, 32, 32, DType::kF16), kAda);
  EXPECT_GT(cuda::paged_attention_shared_bytes(256, 16, 8, DType::kF32), kA100);
  EXPECT_GT(cuda::paged_attention_shared_bytes(256, 16, 8, DType::kBF16), kAda);
  EXPECT_GT(cuda::paged_attention_shared_bytes(128, 32, 8, DType::kF32), kAda);
  for (int d : {16, 32, 64, 128, 256}) {
    for (int group : {1, 4, 8, 16}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", group " + std::to_string(group));
      const size_t bf16 = cuda::paged_attention_shared_bytes(d, 8 * group, 8, DType::kBF16);
      EXPECT_EQ(cuda::paged_attention_shared_bytes(d, 8 * group, 8, DType::kF16), bf16);
      EXPECT_GE(cuda::paged_attention_shared_bytes(d, 8 * group, 8, DType::kF32), bf16);
      EXPECT_LE(cuda::paged_attention_shared_bytes(d, 8 * group, 8, DType::kF32), kHopper);
      if (d <= 128) {
        EXPECT_LE(bf16, kAda);
      }
    }
  }
  EXPECT_THROW(cuda::paged_attention_shared_bytes(96, 32, 8, DType::kBF16), std::invalid_argument);
  EXPECT_THROW(cuda::paged_attention_shared_bytes(128, 32, 1, DType::kBF16), std::invalid_argument);
}

// The decode partition kernel's own shared memory (needs no GPU): at head_dim 128 over a
// 16-bit cache with up to 4 query heads a KV head (Llama 3 8B's 32 / 8 among them), 5 of
// its blocks, with the 1 KiB each one reserves, fit in an H100/H200 multiprocessor's
// 228 KiB (its q pieces keep only the group's rows); and it is never more than the total
// the backend checks when a model loads.
TEST(CudaAttention, DecodeBlocksShareAHopperMultiprocessorFiveAtATime) {
  constexpr size_t kHopperSM = 228 * 1024, kReserved = 1024;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int q_heads : {8, 16, 32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", " + std::to_string(q_heads) + " query heads");
      EXPECT_LE(5 * (cuda::paged_attention_decode_shared_bytes(128, q_heads, 8, dt) + kReserved),
                kHopperSM);
    }
  }
  for (int d : {16, 32, 64, 128, 256}) {
    for (int group : {1, 2, 4, 7, 8, 16}) {
      for (DType dt : kCacheDtypes) {
        EXPECT_LE(cuda::paged_attention_decode_shared_bytes(d, 8 * group, 8, dt),
                  cuda::paged_attention_shared_bytes(d, 8 * group, 8, dt));
      }
    }
  }
  EXPECT_THROW(cuda::paged_attention_decode_shared_bytes(96, 32, 8, DType::kBF16),
               std::invalid_argument);
}

TEST(CudaAttention, DecodeMatchesCpuForEveryHeadDimGroupAndDtype) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  uint64_t k = 0;
  for (int D : {16, 32, 64, 128, 256}) {
    for (int G : {1, 2, 4, 7, 8, 16}) {
      for (DType cache : kCacheDtypes) {
        for (DType out : kOutDtypes) {
          const Shape s{2 * G, 2, D, cache, out};
          SCOPED_TRACE(describe(s, 0));
          const Problem p = decode_problem(s, kBoundaryContexts, 0, seed + k++);
          EXPECT_MATCHES(p.run_decode(), p.reference(true), out);
        }
      }
    }
  }
}

// Mixed batches (decode rows, chunks of prompts over cached prefixes, whole prompts) for
// every head_dim and group size; dtypes rotate across the shapes.
TEST(CudaAttention, GeneralMatchesCpuForEveryHeadDimAndGroup) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  //                                 ctx  q_len
  const std::vector<int32_t> ctx = {1, 16, 17, 40, 100, 300, 513, 1000, 33};
  const std::vector<int32_t> qlen = {1, 16, 1, 7, 100, 16, 100, 1, 33};
  uint64_t k = 0;
  for (int D : {16, 32, 64, 128, 256}) {
    for (int G : {1, 2, 4, 7, 8, 16}) {
      const DType cache = kCacheDtypes[k % 3];
      const DType out = kOutDtypes[(k / 3) % 2];
      const Shape s{2 * G, 2, D, cache, out};
      SCOPED_TRACE(describe(s, 0));
      const Problem p(s, ctx, qlen, 0, seed + k++);
      EXPECT_MATCHES(p.run_general(), p.reference(false), out);
    }
  }
}

TEST(CudaAttention, GeneralMatchesCpuForEveryCacheAndOutputDtype) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  uint64_t k = 0;
  for (DType cache : kCacheDtypes) {
    for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int D : {64, 128}) {
        const Shape s{8, 2, D, cache, out};
        SCOPED_TRACE(describe(s, 0));
        const Problem p(s, {17, 200, 64, 1}, {17, 50, 1, 1}, 0, seed + k++);
        EXPECT_MATCHES(p.run_general(), p.reference(false), out);
      }
    }
  }
}

// q_len 1, 7, 16 and 100 in one batch with cached prefixes, next to a whole prompt and
// a long chunk that spans several query tiles and key tiles (Qwen2-7B's G = 7 included).
TEST(CudaAttention, MixedPrefillBatchWithCachedPrefixes) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  const std::vector<int32_t> ctx = {513, 7, 40, 116, 1100, 2100, 1};
  const std::vector<int32_t> qlen = {1, 7, 16, 100, 600, 1, 1};
  uint64_t k = 0;
  for (const Shape& s :
       {Shape{32, 8, 128, DType::kBF16, DType::kBF16}, Shape{28, 4, 128, DType::kBF16, DType::kF32},
        Shape{16, 2, 64, DType::kF32, DType::kF32}, Shape{8, 1, 16, DType::kBF16, DType::kF32}}) {
    SCOPED_TRACE(describe(s, 0));
    const Problem p(s, ctx, qlen, 0, seed + k++);
    EXPECT_MATCHES(p.run_general(), p.reference(false), s.out);
  }
}

TEST(CudaAttention, DecodeBatchesOfOneTo256Sequences) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int n : {1, 2, 3, 16, 64, 256}) {
    std::vector<int32_t> ctx(n);
    const int32_t longest = n >= 64 ? 1024 : 2048;
    for (auto& c : ctx)
      c = std::uniform_int_distribution<int32_t>(1, longest)(rng);
    for (const Shape& s : {Shape{8, 2, 128, DType::kBF16, DType::kF32},
                           Shape{16, 2, 64, DType::kBF16, DType::kBF16}}) {
      SCOPED_TRACE(std::to_string(n) + " sequences, " + describe(s, 0));
      const Problem p = decode_problem(s, ctx, 0, rng());
      EXPECT_MATCHES(p.run_decode(), p.reference(true), s.out);
    }
  }
}

// One 32k sequence (hundreds of partitions) and 16 x 4k (long sums: compared in bf16, where the
// float32 CPU reference's own rounding over thousands of terms is far below tolerance).
TEST(CudaAttention, DecodeLongContexts) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  {
    const Shape s{8, 2, 128, DType::kBF16, DType::kBF16};
    SCOPED_TRACE("1 x 32768, " + describe(s, 0));
    const Problem p = decode_problem(s, {32768}, 0, seed);
    EXPECT_MATCHES(p.run_decode(), p.reference(true), s.out);
  }
  {
    const Shape s{8, 2, 128, DType::kBF16, DType::kBF16};
    SCOPED_TRACE("16 x 4096, " + describe(s, 0));
    const Problem p = decode_problem(s, std::vector<int32_t>(16, 4096), 0, seed + 1);
    EXPECT_MATCHES(p.run_decode(), p.reference(true), s.out);
  }
  {
    const Shape s{4, 1, 64, DType::kF32, DType::kF32};
    SCOPED_TRACE("16 x 2000, " + describe(s, 0));
    const Problem p = decode_problem(s, std::vector<int32_t>(16, 2000), 0, seed + 2);
    EXPECT_MATCHES(p.run_decode(), p.reference(true), s.out);
  }
}

// Windows shorter and longer than a block, a tile and a partition; block-table entries
// before each window are -1 (and would read NaN if dereferenced).
TEST(CudaAttention, SlidingWindowSkipsBlocksBeforeTheWindow) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  const std::vector<int32_t> ctx = {1, 16, 17, 100, 511, 513, 1000, 1537, 3000};
  uint64_t k = 0;
  for (int32_t window : {1, 7, 16, 100, 512, 700, 4096}) {
    for (const Shape& s : {Shape{8, 2, 128, DType::kBF16, DType::kF32},
                           Shape{7, 1, 64, DType::kF32, DType::kBF16}}) {
      SCOPED_TRACE(describe(s, window));
      const Problem d = decode_problem(s, ctx, window, seed + k++);
      EXPECT_MATCHES(d.run_decode(), d.reference(true), s.out);
      const Problem g(s, {40, 600, 1000, 3000, 16}, {40, 200, 1, 300, 5}, window, seed + k++);
      EXPECT_MATCHES(g.run_general(), g.reference(false), s.out);
    }
  }
}

// A captured graph's batch: padding rows with context 0, and a grid for a max_context
// far above the batch's contexts. Padding rows are exactly zero.
TEST(CudaAttention, DecodePaddingRowsAndOversizedGrid) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  const Shape s{8, 2, 128, DType::kBF16, DType::kF32};
  const std::vector<int32_t> ctx = {0, 700, 0, 1, 513, 0};
  const Problem p = decode_problem(s, ctx, 0, seed);
  const auto ref = p.reference(true);
  for (int32_t max_context : {p.max_context(), 8192}) {
    SCOPED_TRACE("max_context " + std::to_string(max_context));
    const auto out = p.run_decode(max_context);
    EXPECT_MATCHES(out, ref, s.out);
    for (int i = 0; i < static_cast<int>(ctx.size()); ++i) {
      if (ctx[i] != 0) continue;
      for (float x : p.rows_of(out, i))
        ASSERT_EQ(x, 0.0f) << "padding row " << i;
    }
  }
  // A batch of padding rows only, with no partitions at all (max_context 0) or some.
  const Problem empty = decode_problem(s, {0, 0, 0}, 0, seed + 1);
  for (int32_t max_context : {0, 600}) {
    SCOPED_TRACE("all padding, max_context " + std::to_string(max_context));
    const auto out = empty.run_decode(max_context);
    ASSERT_EQ(out.size(), static_cast<size_t>(3 * 8 * 128));
    for (float x : out)
      ASSERT_EQ(x, 0.0f);
  }
}

// q_len-1 batches through both kernels: the same values up to float32 rounding.
TEST(CudaAttention, DecodeAndGeneralKernelsAgree) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  uint64_t k = 0;
  for (const Shape& s :
       {Shape{8, 2, 128, DType::kBF16, DType::kF32}, Shape{28, 4, 128, DType::kBF16, DType::kF32},
        Shape{8, 8, 64, DType::kF32, DType::kF32}, Shape{32, 2, 16, DType::kF16, DType::kF32}}) {
    for (int32_t window : {0, 300}) {
      SCOPED_TRACE(describe(s, window));
      const Problem p = decode_problem(s, kBoundaryContexts, window, seed + k++);
      EXPECT_MATCHES(p.run_decode(), p.run_general(), DType::kF32);
    }
  }
}

// A sequence's output does not depend on its batch: alone or among others, the same bits
// (decode: for one partition length, whatever grid the batch's max_context asks for; the
// automatic length itself depends on the grid, as kernels.h says).
TEST(CudaAttention, ResultsDoNotDependOnTheBatch) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  const Shape s{8, 2, 128, DType::kBF16, DType::kF32};
  {
    const std::vector<int32_t> ctx = {1500, 17, 600, 4000, 1, 512};
    const Problem p = decode_problem(s, ctx, 0, seed);
    for (const int part : {128, 448, 512}) {
      SCOPED_TRACE("partitions of " + std::to_string(part) + " tokens");
      const auto batch = p.run_decode(4096, part);
      for (int i = 0; i < static_cast<int>(ctx.size()); ++i) {
        EXPECT_TRUE(p.run_decode_alone(i, 4096, part) == p.rows_of(batch, i))
            << "decode, sequence " << i;
        EXPECT_TRUE(p.run_decode_alone(i, ctx[i], part) == p.rows_of(batch, i))
            << "decode with a grid for its own context, sequence " << i;
      }
    }
  }
  {
    const std::vector<int32_t> ctx = {300, 1000, 40, 77}, qlen = {300, 200, 1, 30};
    const Problem p(s, ctx, qlen, 0, seed + 1);
    const auto batch = p.run_general();
    for (int i = 0; i < static_cast<int>(ctx.size()); ++i)
      EXPECT_TRUE(p.run_general_alone(i) == p.rows_of(batch, i)) << "general, sequence " << i;
  }
  // Chunked prefill: a prompt computed in chunks (each over the cache of the ones before)
  // gives the rows of the whole prompt, bit for bit; with and without a window.
  for (int32_t window : {0, 100}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const Problem p(s, {700}, {700}, window, seed + 2 + window);
    const auto whole = p.rows_of(p.run_general(), 0);
    std::vector<float> chunked;
    for (auto [first, count] : {std::pair{0, 1}, {1, 200}, {201, 99}, {300, 1}, {301, 399}}) {
      const auto part = p.run_general_alone(0, first, count);
      chunked.insert(chunked.end(), part.begin(), part.end());
    }
    EXPECT_TRUE(chunked == whole) << "chunks vs whole prompt";
  }
}

// Shapes the kernels do not support throw std::invalid_argument before any launch.
TEST(CudaAttention, RejectsUnsupportedShapes) {
  PAGELLM_REQUIRE_GPU();
  const DeviceBuffer cache_mem(1 << 20), q(1 << 16), out(1 << 16), ws(1 << 16);
  const std::vector<int32_t> zeros(8, 0);  // one sequence, context 0
  const DeviceBuffer meta = DeviceBuffer::from(zeros);
  const cuda::PagedAttentionBatch batch{
      1, meta.get<int32_t>(), meta.get<int32_t>(), meta.get<int32_t>(), 1, 0};
  auto general = [&](int hq, int hkv, int D, DType out_dtype) {
    const cuda::KVCacheLayer cache{cache_mem.get(), cache_mem.get(), DType::kBF16, 4, hkv, D};
    cuda::paged_attention(q.get<float>(), cache, batch, 1, 1, hq, 1.0f, out.get(), out_dtype,
                          nullptr);
  };
  auto decode = [&](int hq, int hkv, int D) {
    const cuda::KVCacheLayer cache{cache_mem.get(), cache_mem.get(), DType::kBF16, 4, hkv, D};
    cuda::paged_attention_decode(q.get<float>(), cache, batch, 16, hq, 1.0f, ws.get(), out.get(),
                                 DType::kF32, nullptr);
  };
  for (int D : {8, 48, 80, 96, 512}) {
    EXPECT_THROW(general(8, 2, D, DType::kF32), std::invalid_argument) << "head_dim " << D;
    EXPECT_THROW(decode(8, 2, D), std::invalid_argument) << "head_dim " << D;
  }
  EXPECT_THROW(general(17, 1, 64, DType::kF32), std::invalid_argument);  // G = 17
  EXPECT_THROW(decode(34, 2, 64), std::invalid_argument);
  EXPECT_THROW(general(12, 8, 64, DType::kF32), std::invalid_argument);  // 12 % 8 != 0
  EXPECT_THROW(decode(12, 8, 64), std::invalid_argument);
  EXPECT_THROW(general(8, 0, 64, DType::kF32), std::invalid_argument);
  EXPECT_NO_THROW(decode(16, 1, 64));  // G = 16 is supported (one sequence, context 0)
  PAGELLM_TEST_CUDA(cudaDeviceSynchronize());
}

TEST(CudaAttention, DecodeWorkspaceCoversEveryPartition) {
  PAGELLM_REQUIRE_GPU();
  // [seqs, q heads, partitions] x (head_dim partial outputs + max + sum), float32.
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(4, 32, 8, 128, 1, 512),
            4u * 32 * 1 * 130 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(4, 32, 8, 128, 512, 512),
            4u * 32 * 1 * 130 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(4, 32, 8, 128, 513, 512),
            4u * 32 * 2 * 130 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(4, 32, 8, 128, 513, 64),
            4u * 32 * 9 * 130 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(1, 8, 2, 64, 32768, 512),
            1u * 8 * 64 * 66 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(4, 32, 8, 128, 0), 0u);
  // The kernel's own choice: the workspace of the partition length it picks.
  const int auto_tokens = cuda::decode_partition_tokens(1, 8, 32768);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(1, 32, 8, 128, 32768),
            cuda::paged_attention_decode_workspace_bytes(1, 32, 8, 128, 32768, auto_tokens));
}

// A caller's partition length: any multiple of the 64-token tile from 64 to 512. (Needs
// no GPU.)
TEST(CudaAttention, DecodePartitionLengthsAreChecked) {
  // 4096 tokens: 10 partitions of 448 (the last one 1 tile), 22 of 192.
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(2, 32, 8, 128, 4096, 448),
            2u * 32 * 10 * 130 * 4);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bytes(2, 32, 8, 128, 4096, 192),
            2u * 32 * 22 * 130 * 4);
  for (int bad : {32, 96, 100, 576, 1024, -64})
    EXPECT_THROW(cuda::paged_attention_decode_workspace_bytes(1, 32, 8, 128, 4096, bad),
                 std::invalid_argument)
        << bad;
}

// Long batches keep 512-token partitions; a lone sequence, or a few short ones, get
// shorter partitions so that the grid still spans every multiprocessor. (Needs no GPU.)
TEST(CudaAttention, DecodePartitionsShrinkForSmallBatches) {
  for (int sms : {1, 108, 132}) {
    const int64_t target = int64_t(sms) * cuda::kDecodeTargetBlocksPerSM;
    for (int seqs : {1, 2, 16, 64, 256, 1024}) {
      for (int ctx : {1, 100, 512, 1024, 4096, 32768}) {
        const int p = cuda::decode_partition_tokens_on(seqs, 8, ctx, sms);
        SCOPED_TRACE(std::to_string(sms) + " SMs, " + std::to_string(seqs) + " x " +
                     std::to_string(ctx) + ": " + std::to_string(p));
        ASSERT_TRUE(p == 64 || p == 128 || p == 256 || p == 512);
        const int64_t blocks = int64_t(seqs) * 8 * ((ctx + p - 1) / p);
        // Shorter only when the longer partition left the grid below the target.
        if (p < 512) {
          EXPECT_LT(int64_t(seqs) * 8 * ((ctx + 2 * p - 1) / (2 * p)), target);
        }
        // And never shorter than needed.
        if (p > 64) {
          EXPECT_GE(blocks, target);
        }
      }
    }
  }
  EXPECT_EQ(cuda::decode_partition_tokens_on(1024, 8, 32768, 132), 512);
  EXPECT_EQ(cuda::decode_partition_tokens_on(1, 8, 100, 132), 64);
  EXPECT_EQ(cuda::decode_partition_tokens_on(1, 8, 512, 132), 64);    // Llama 3 8B, batch 1
  EXPECT_EQ(cuda::decode_partition_tokens_on(8, 8, 2048, 132), 256);  // 256 blocks at 512
  EXPECT_EQ(cuda::decode_partition_tokens_on(16, 8, 4096, 132), 512);
}

// The start-up bound covers the workspace of every smaller batch at every shorter
// context, although a smaller batch can need more than the largest one. (Needs no GPU.)
TEST(CudaAttention, DecodeWorkspaceBoundCoversEverySmallerBatch) {
  struct Heads {
    int q, kv, dim;
  };
  for (int sms : {1, 108, 132}) {
    for (Heads h : {Heads{32, 8, 128}, Heads{28, 4, 128}, Heads{16, 16, 64}}) {
      for (int max_seqs : {1, 3, 24, 256}) {
        for (int max_ctx : {100, 1024, 8192}) {
          const size_t bound = cuda::paged_attention_decode_workspace_bound(max_seqs, h.q, h.kv,
                                                                            h.dim, max_ctx, sms);
          for (int seqs = 1; seqs <= max_seqs; seqs += seqs < 32 ? 1 : 29) {
            for (int ctx = 1; ctx <= max_ctx; ctx += ctx < 130 ? 1 : 61) {
              const int p = cuda::decode_partition_tokens_on(seqs, h.kv, ctx, sms);
              const size_t need =
                  cuda::paged_attention_decode_workspace_bytes(seqs, h.q, h.kv, h.dim, ctx, p);
              ASSERT_LE(need, bound)
                  << sms << " SMs, " << h.q << "/" << h.kv << " heads, " << seqs << " of "
                  << max_seqs << " sequences, context " << ctx << " of " << max_ctx;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bound(0, 32, 8, 128, 1024, 132), 0u);
  EXPECT_EQ(cuda::paged_attention_decode_workspace_bound(256, 32, 8, 128, 131072, 132),
            size_t(256) * 8 * 256 * 4 * 130 * 4);
}

// Every partition length gives the same attention (to float32 rounding) on contexts
// around its boundaries, with and without a sliding window: the lengths the kernel picks
// (powers of two) and lengths of 3 and 7 tiles, which a caller may ask for.
TEST(CudaAttention, DecodeMatchesCpuForEveryPartitionLength) {
  PAGELLM_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("PAGELLM_TEST_SEED=" + std::to_string(seed));
  const std::vector<int32_t> ctx = {1,   63,  64,  65,  127, 128, 129, 191, 193,
                                    255, 257, 447, 449, 511, 513, 897, 2000};
  uint64_t k = 0;
  for (int32_t window : {0, 100}) {
    for (const Shape& s : {Shape{32, 8, 128, DType::kBF16, DType::kF32},
                           Shape{14, 2, 64, DType::kF16, DType::kF32}}) {
      const Problem p = decode_problem(s, ctx, window, seed + k++);
      const std::vector<float> ref = p.reference(true);
      for (int tokens : {64, 128, 192, 256, 448, 512}) {
        SCOPED_TRACE(describe(s, window) + ", partitions of " + std::to_string(tokens));
        EXPECT_MATCHES(p.run_decode(-1, tokens), ref, s.out);
        // A grid for a longer max_context (a graph bucket): the same result.
        EXPECT_MATCHES(p.run_decode(4096, tokens), ref, s.out);
      }
    }
  }
}

}  // namespace
}  // namespace pagellm::kernels
