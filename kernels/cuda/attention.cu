// Paged attention on the GPU, the contracts of kernels.h (semantics of
// kernels/cpu/attention.cpp): query j of a sequence with q_len queries and context_len
// cached tokens is at position p = context_len - q_len + j and attends to cached positions
// [max(0, p - window + 1), p]; query head h reads KV head h / G, G = num_q_heads /
// num_kv_heads. K and V are [num_blocks, 16, num_kv_heads, head_dim] of bf16, f16 or f32,
// so one token's row for one KV head is head_dim contiguous values (32 to 1024 bytes).
//
// Decode (flash-decoding), two kernels:
//   1. decode_partition_kernel, grid (kv head, sequence, partition), 128 threads.
//      Partitions are 512 tokens, or 256, 128 or 64 when the batch is too small to fill
//      the GPU otherwise (decode_partition_tokens). The block reads its partition's K
//      and V for one KV head once, for all G query heads (padded to GP = 4, 8 or 16 with
//      zero queries). Tiles of 64 tokens are copied to shared memory with 16-byte
//      cp.async (coalesced: consecutive threads copy consecutive 16 bytes of a row), in a
//      ring of two stages: K tiles, then V tiles, through the same ring, so the first V
//      tile is in flight while the softmax runs. Block ids of the partition
//      are read into shared memory first. Scores for the whole partition stay in shared memory
//      ([partition][GP] floats): Q.K, then max and sum over the partition, then P.V; no
//      rescaling inside a partition. Writes the partition's unnormalized output, max and
//      sum (float32) to the workspace.
//      For 16-bit caches at head_dim 64, 128 and 256, decode_mma_kernel takes its place
//      (same grid, partitions and workspace): Q.K and P.V on tensor cores, with q and p
//      split into 16-bit pieces so that no precision is lost (PAGELLM_DECODE_MMA=0 keeps
//      the CUDA-core kernel, for comparison). On an H200 it reads the cache at 77% of
//      the copy bandwidth at 16 sequences of 4k tokens and 91% at 256 of 2k, against
//      68% and 81% for the CUDA-core kernel.
//   2. decode_merge_kernel, grid (q head, sequence): log-sum-exp merge of the partitions,
//      writes `out` in out_dtype.
// General (any q_len), general_attention_kernel<head_dim>, grid (kv head, query tile,
// sequence), 128 threads: one block holds the rows (query, head) of up to kRows / G queries
// of one sequence and the G heads of one KV head; K and V tiles of 32 tokens are staged
// with cp.async (raw), converted to float32 in shared memory and reused by every row;
// online softmax in float32 per row.
//
// Every sum runs in an order fixed by the shapes (head_dim, G, context length), never by
// the batch: a row's result does not depend on the other rows of its batch (nor, in the
// general kernel, on how a prompt is cut into chunks: key tiles sit at absolute positions
// and masked keys add exact zeros). Products that feed a later add are __fmul_rn, so the
// compiler's FMA contraction cannot round one row differently from another. Tokens outside
// a query's window or past the context are never read: their shared-memory rows are filled
// with zeros (cp.async with source size 0) and their scores are -inf, so a -1 block-table
// entry is never dereferenced.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------
// Small device helpers.

// 16 bytes of cache values (kElems of them) as float32, in memory order.
template <typename T>
struct CacheVec;

template <>
struct CacheVec<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void to_float(const uint4 r, float* f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
};

template <>
struct CacheVec<__nv_bfloat16> {
  static constexpr int kElems = 8;
  // A bf16 is the top half of a float32: exact, two integer ops per pair.
  __device__ __forceinline__ static void to_float(const uint4 r, float* f) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

template <>
struct CacheVec<__half> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void to_float(const uint4 r, float* f) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &w[i], sizeof h);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

// 16 bytes of `t` values as float32 (runtime dtype); returns how many (4 or 8).
__device__ __forceinline__ int vec_to_float(const uint4 r, DType t, float* f) {
  switch (t) {
    case DType::kF32:
      CacheVec<float>::to_float(r, f);
      return 4;
    case DType::kF16:
      CacheVec<__half>::to_float(r, f);
      return 8;
    default:
      CacheVec<__nv_bfloat16>::to_float(r, f);
      return 8;
  }
}

// Stores one value as `t`, rounded to nearest even.
__device__ __forceinline__ void store_out(void* out, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(out)[i] = v;
      break;
    case DType::kF16:
      static_cast<__half*>(out)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
      break;
  }
}

// Stores four consecutive values as `t` (i a multiple of 4; one 16- or 8-byte store).
__device__ __forceinline__ void store_out4(void* out, DType t, int64_t i, float4 v) {
  switch (t) {
    case DType::kF32:
      *reinterpret_cast<float4*>(static_cast<float*>(out) + i) = v;
      break;
    case DType::kF16: {
      const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
      uint2 u;
      memcpy(&u.x, &a, 4);
      memcpy(&u.y, &b, 4);
      *reinterpret_cast<uint2*>(static_cast<__half*>(out) + i) = u;
      break;
    }
    default: {
      const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y);
      const __nv_bfloat162 b = __floats2bfloat162_rn(v.z, v.w);
      uint2 u;
      memcpy(&u.x, &a, 4);
      memcpy(&u.y, &b, 4);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + i) = u;
      break;
    }
  }
}

// 16-byte asynchronous copy global -> shared (L2 only). With valid == false nothing is
// read and the 16 bytes are zero-filled; `src` must still be a valid address.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float4 fma4(float a, float4 b, float4 c) {
  return make_float4(fmaf(a, b.x, c.x), fmaf(a, b.y, c.y), fmaf(a, b.z, c.z), fmaf(a, b.w, c.w));
}

// Programmatic dependent launch (sm_90 and later; no-ops before): a partition block lets
// the merge kernel's blocks be scheduled as soon as it starts; a merge block waits until
// the partition kernel has finished and its writes are visible.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// Decode: partition kernel.

constexpr int kDecodeThreads = 128;
// Ring stages. The kernel is written for S stages, loaded S - 1 tiles ahead; 3 read the
// cache more slowly than 2 on an H200 (60% against 68% of the copy bandwidth at 16
// sequences of 4k tokens), since fewer blocks fit in an SM.
constexpr int kDecodeStages = 2;
// Blocks per SM the registers must allow. With 2 stages, at head_dim 128, bf16, G <= 4,
// a block takes 42.3 KB of shared memory, so 5 blocks fit in an H100/H200 SM (228 KB):
// 20 warps and 5 x 16 KB of loads in flight per SM (at most 102 registers a thread).
// With 3 stages it takes 58.3 KB: 3 blocks, each with 2 tiles in flight.
constexpr int decode_min_blocks(int stages) {
  return stages == 2 ? 5 : 3;
}
constexpr int kDecodeTile = 64;  // tokens per staged tile (4 KV blocks)
constexpr int kMaxBlocksPerPartition = kDecodeMaxPartitionTokens / kBlockSize;  // 32
// Q.K: kQkLanes threads share a token (each takes every kQkLanes-th 16-byte vector of the
// row), and each thread takes kQkTokens tokens of a tile.
constexpr int kQkLanes = 4;
constexpr int kQkTokens = 2;
static_assert(kDecodeThreads / kQkLanes * kQkTokens == kDecodeTile);
static_assert(kDecodeMinPartitionTokens % kDecodeTile == 0);
// P.V: a thread accumulates kPvHeads heads x kPvElems consecutive elements of head_dim
// (one "unit"), for every tsn-th token of a tile; units = GP/4 * head_dim/8 <= 128.
constexpr int kPvHeads = 4;
constexpr int kPvElems = 8;
constexpr int kDecodeWarps = kDecodeThreads / 32;

// Shared memory of the partition kernel, in bytes (all offsets multiples of 16):
//   ring    S tiles of kDecodeTile rows (reused at the end for the P.V
//           partial sums, [tsn][GP][head_dim] floats = 128 * 32 floats)
//   scores  [512][GP] floats (scores, then exp(score - max)), for the longest partition
//   q       [GP][head_dim] floats
//   bt      [32] block ids
//   red     [2][warps][GP] floats (max, sum)
struct DecodeLayout {
  int scores, q, bt, red, total;
};
__host__ __device__ inline DecodeLayout decode_layout(int stages, int gp, int head_dim,
                                                      int row_bytes) {
  DecodeLayout l;
  const int ring = stages * kDecodeTile * row_bytes;
  const int reduce = kDecodeThreads * kPvHeads * kPvElems * 4;
  l.scores = ring > reduce ? ring : reduce;
  l.q = l.scores + kDecodeMaxPartitionTokens * gp * 4;
  l.bt = l.q + gp * head_dim * 4;
  l.red = l.bt + kMaxBlocksPerPartition * 4;
  l.total = l.red + 2 * kDecodeWarps * gp * 4;
  return l;
}

// XOR swizzle of a row's 16-byte vectors in shared memory: odd rows swap vector halves
// of each 128-byte group, so that 8 threads reading 4 vectors of each of two consecutive
// rows (Q.K) hit 32 distinct banks. Rows of 4 or fewer vectors need none.
__device__ __forceinline__ int swizzle(int row, int row_vecs) {
  return row_vecs >= 8 ? (row & 1) << 2 : 0;
}

struct DecodeParams {
  const float* q;  // [num_seqs, num_q_heads, head_dim]
  const uint4* k;  // cache, in 16-byte vectors
  const uint4* v;
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  int32_t window;
  int num_kv_heads, num_q_heads, group, head_dim;
  int row_vecs, row_vecs_shift;  // 16-byte vectors per row (one token, one KV head)
  int dv_shift;                  // log2(head_dim / 8)
  int units_shift;               // log2(GP / 4 * head_dim / 8)
  int num_parts;                 // partitions per sequence in the workspace
  int part_tokens;               // tokens per partition (a multiple of kDecodeTile)
  float scale;
  float* ws_out;  // [num_seqs, num_q_heads, num_parts, head_dim]
  float* ws_max;  // [num_seqs, num_q_heads, num_parts]
  float* ws_sum;  // [num_seqs, num_q_heads, num_parts]
};

// The tokens of one partition of one sequence that are read: partition-local [v0, v1),
// in tiles tile_first .. tile_first + ntiles - 1. ntiles is 0 for a partition past the
// context (also context_len 0) or wholly before the sliding window.
struct PartitionSpan {
  int ctx, lo;  // the context length and its first token inside the window
  int v0, v1, tile_first, ntiles;
};
__device__ __forceinline__ PartitionSpan partition_span(const DecodeParams& p, int seq, int part) {
  PartitionSpan s{};
  s.ctx = p.context_lens[seq];
  s.lo = p.window > 0 ? max(0, s.ctx - p.window) : 0;
  const int part_begin = part * p.part_tokens;
  if (part_begin >= s.ctx || part_begin + p.part_tokens <= s.lo) return s;
  s.v0 = max(s.lo - part_begin, 0);
  s.v1 = min(s.ctx - part_begin, p.part_tokens);
  s.tile_first = s.v0 / kDecodeTile;
  s.ntiles = (s.v1 - 1) / kDecodeTile - s.tile_first + 1;
  return s;
}

// Into bt[0 .. part_tokens / kBlockSize): the block ids of the partition's blocks that hold
// read tokens, -1 for the others (never read: entries before the window may be -1, entries
// past the context may be anything). Threads tid < part_tokens / kBlockSize write one each.
__device__ __forceinline__ void load_block_ids(const DecodeParams& p, int seq, int part,
                                               const PartitionSpan& s, int tid, int* bt) {
  const int part_blocks = p.part_tokens / kBlockSize;
  if (tid < part_blocks) {
    const int b = part * part_blocks + tid;
    int id = -1;
    if (b < p.max_blocks_per_seq && b * kBlockSize < s.ctx && (b + 1) * kBlockSize > s.lo)
      id = p.block_tables[static_cast<int64_t>(seq) * p.max_blocks_per_seq + b];
    bt[tid] = id;
  }
}

template <typename T, int GP, int S>
__global__ void __launch_bounds__(kDecodeThreads, decode_min_blocks(S))
    decode_partition_kernel(const DecodeParams p) {
  allow_dependents();
  using Vec = CacheVec<T>;
  constexpr int kVec = Vec::kElems;  // values per 16 bytes
  static_assert(GP % 4 == 0 && GP <= 16);
  extern __shared__ uint4 smem_vec[];
  char* const smem = reinterpret_cast<char*>(smem_vec);

  const int kvh = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int tid = threadIdx.x;
  const PartitionSpan span = partition_span(p, seq, part);
  if (span.ntiles == 0) return;
  const int v0 = span.v0, v1 = span.v1, tile_first = span.tile_first, ntiles = span.ntiles;

  const int D = p.head_dim, rv = p.row_vecs;
  const int tile_bytes = kDecodeTile * rv * 16;
  const DecodeLayout lay = decode_layout(S, GP, D, rv * 16);
  char* const ring = smem;
  float* const scores = reinterpret_cast<float*>(smem + lay.scores);  // [512][GP]
  float* const qs = reinterpret_cast<float*>(smem + lay.q);           // [GP][D]
  int* const bt = reinterpret_cast<int*>(smem + lay.bt);              // [32]
  float* const red_max = reinterpret_cast<float*>(smem + lay.red);    // [warps][GP]
  float* const red_sum = red_max + kDecodeWarps * GP;                 // [warps][GP]

  load_block_ids(p, seq, part, span, tid, bt);
  // The G query heads of this KV head are contiguous; heads G..GP-1 are zero.
  {
    const float4* q4 = reinterpret_cast<const float4*>(
        p.q +
        (static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * p.group) * D);
    float4* qs4 = reinterpret_cast<float4*>(qs);
    const int n4 = GP * D / 4, valid4 = p.group * D / 4;
    for (int i = tid; i < n4; i += kDecodeThreads)
      qs4[i] = i < valid4 ? q4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();

  // Load number `load` of the partition: K tiles 0..ntiles-1, then V tiles; into ring
  // stage load % S. The tile's 64 rows x rv vectors are copied by the 128 threads with
  // consecutive threads on consecutive vectors: thread tid always copies vector
  // tid % rv, of rows tid / rv, + 128 / rv, ...
  const int nloads = 2 * ntiles;
  const int64_t slot_vecs = static_cast<int64_t>(p.num_kv_heads) * rv;  // per token slot
  const int my_vec = tid & (rv - 1);
  const int my_row = tid >> p.row_vecs_shift, row_step = kDecodeThreads >> p.row_vecs_shift;
  const int64_t my_col = static_cast<int64_t>(kvh) * rv + my_vec;
  auto issue = [&](int load) {
    const bool is_v = load >= ntiles;
    const int tile = tile_first + (is_v ? load - ntiles : load);
    const uint4* const base = (is_v ? p.v : p.k) + my_col;
    char* const dst = ring + (load % S) * tile_bytes;
    const int t0 = tile * kDecodeTile;
    const bool full = t0 >= v0 && t0 + kDecodeTile <= v1;
#pragma unroll 1
    for (int row = my_row; row < kDecodeTile; row += row_step) {
      const int lt = t0 + row;  // partition-local token
      const bool valid = full || (lt >= v0 && lt < v1);
      const uint4* src = base;
      if (valid)
        src += (static_cast<int64_t>(bt[lt / kBlockSize]) * kBlockSize + (lt & (kBlockSize - 1))) *
               slot_vecs;
      cp_async16(dst + (row * rv + (my_vec ^ swizzle(row, rv))) * 16, src, valid);
    }
    cp_async_commit();
  };
  // Load `load` if there is one, else an empty group (so that "all but S - 1 groups
  // done" always means the load S - 1 issues back has landed).
  auto issue_or_commit = [&](int load) {
    if (load < nloads)
      issue(load);
    else
      cp_async_commit();
  };

  // Loads 0 .. ntiles-1 are the K tiles, ntiles .. 2 ntiles-1 the V tiles; load L goes
  // to ring stage L % S and is issued S - 1 iterations before it is used.
#pragma unroll
  for (int l = 0; l < S - 1; ++l)
    issue_or_commit(l);

  // ---- Q.K, tile by tile: thread (tp, dp) takes tokens tp and tp + 32 of the tile and
  // vectors dp, dp + 4, ... of their rows; the 4 partial dots are summed by shuffles.
  {
    const int dp = tid % kQkLanes, tp = tid / kQkLanes;
    for (int load = 0; load < ntiles; ++load) {
      issue_or_commit(load + S - 1);  // a later K tile, or a V tile
      cp_async_wait<S - 1>();
      __syncthreads();
      const uint4* const st = reinterpret_cast<const uint4*>(ring + (load % S) * tile_bytes);
      float s[kQkTokens][GP];
#pragma unroll
      for (int n = 0; n < kQkTokens; ++n)
#pragma unroll
        for (int g = 0; g < GP; ++g)
          s[n][g] = 0.f;
#pragma unroll 1
      for (int vv = dp; vv < rv; vv += kQkLanes) {
        float kf[kQkTokens][kVec];
#pragma unroll
        for (int n = 0; n < kQkTokens; ++n) {
          const int row = tp + n * (kDecodeTile / kQkTokens);
          const uint4 raw = st[row * rv + (vv ^ swizzle(row, rv))];  // one 16-byte load
          Vec::to_float(raw, kf[n]);
        }
        const float* const qd = qs + vv * kVec;
#pragma unroll
        for (int g = 0; g < GP; ++g) {
#pragma unroll
          for (int j = 0; j < kVec; j += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(qd + g * D + j);
#pragma unroll
            for (int n = 0; n < kQkTokens; ++n) {
              s[n][g] = fmaf(qv.x, kf[n][j], s[n][g]);
              s[n][g] = fmaf(qv.y, kf[n][j + 1], s[n][g]);
              s[n][g] = fmaf(qv.z, kf[n][j + 2], s[n][g]);
              s[n][g] = fmaf(qv.w, kf[n][j + 3], s[n][g]);
            }
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kQkTokens; ++n)
#pragma unroll
        for (int g = 0; g < GP; ++g) {
          s[n][g] += __shfl_xor_sync(kFullMask, s[n][g], 1);
          s[n][g] += __shfl_xor_sync(kFullMask, s[n][g], 2);
        }
      // Lane dp of each token writes heads 4dp .. 4dp+3; masked tokens score -inf.
      const int tile = tile_first + load;
#pragma unroll
      for (int n = 0; n < kQkTokens; ++n) {
        const int lt = tile * kDecodeTile + tp + n * (kDecodeTile / kQkTokens);
        const bool valid = lt >= v0 && lt < v1;
#pragma unroll
        for (int c = 0; c < GP / 4; ++c) {
          if (c == dp) {
            float4 w;
            w.x = valid ? __fmul_rn(s[n][4 * c], p.scale) : -INFINITY;
            w.y = valid ? __fmul_rn(s[n][4 * c + 1], p.scale) : -INFINITY;
            w.z = valid ? __fmul_rn(s[n][4 * c + 2], p.scale) : -INFINITY;
            w.w = valid ? __fmul_rn(s[n][4 * c + 3], p.scale) : -INFINITY;
            *reinterpret_cast<float4*>(scores + lt * GP + 4 * c) = w;
          }
        }
      }
      __syncthreads();  // the stage is free for the load issued next iteration
    }
  }

  // ---- Softmax over the partition: thread (t0, g) takes tokens t0, t0 + 128/GP, ... of
  // head g; lanes of a warp with the same g combine by shuffles, then the 4 warps in order.
  // Scores become exp(score - max) in place; max and sum go to the workspace.
  {
    const int s_begin = tile_first * kDecodeTile, s_end = s_begin + ntiles * kDecodeTile;
    const int g = tid % GP;
    const int warp = tid / 32, lane = tid % 32;
    constexpr int kStride = kDecodeThreads / GP;
    float mx = -INFINITY;
    for (int t = s_begin + tid / GP; t < s_end; t += kStride)
      mx = fmaxf(mx, scores[t * GP + g]);
#pragma unroll
    for (int off = 16; off >= GP; off >>= 1)
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    if (lane < GP) red_max[warp * GP + lane] = mx;
    __syncthreads();
    float m = red_max[g];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w)
      m = fmaxf(m, red_max[w * GP + g]);
    // m is finite: the partition holds at least one valid token.
    float sum = 0.f;
    for (int t = s_begin + tid / GP; t < s_end; t += kStride) {
      const float e = expf(scores[t * GP + g] - m);
      scores[t * GP + g] = e;
      sum += e;
    }
#pragma unroll
    for (int off = 16; off >= GP; off >>= 1)
      sum += __shfl_xor_sync(kFullMask, sum, off);
    if (lane < GP) red_sum[warp * GP + lane] = sum;
    __syncthreads();
    if (tid < p.group) {  // g == tid
      float l = red_sum[g];
#pragma unroll
      for (int w = 1; w < kDecodeWarps; ++w)
        l += red_sum[w * GP + g];
      const int64_t row =
          static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * p.group + g;
      p.ws_max[row * p.num_parts + part] = m;
      p.ws_sum[row * p.num_parts + part] = l;
    }
    // The first V tile's barrier below orders these exp writes before their reads.
  }

  // ---- P.V: thread (ts, hg, dv) accumulates heads 4hg..4hg+3 x elements 8dv..8dv+7 over
  // tokens ts, ts + tsn, ... of each tile. Masked tokens have p = 0 and V = 0.
  const int unit = tid & ((1 << p.units_shift) - 1);
  const int ts = tid >> p.units_shift;  // token subset
  const int tsn = kDecodeThreads >> p.units_shift;
  const int hg = unit >> p.dv_shift;              // heads 4hg .. 4hg+3
  const int dv = unit & ((1 << p.dv_shift) - 1);  // elements 8dv .. 8dv+7
  float acc[kPvHeads * kPvElems];
#pragma unroll
  for (int i = 0; i < kPvHeads * kPvElems; ++i)
    acc[i] = 0.f;
  for (int load = ntiles; load < nloads; ++load) {
    issue_or_commit(load + S - 1);
    cp_async_wait<S - 1>();
    __syncthreads();
    const uint4* const st = reinterpret_cast<const uint4*>(ring + (load % S) * tile_bytes);
    const int tile = tile_first + load - ntiles;
    constexpr int kVecsPerUnit = kPvElems / kVec;  // 1 (16-bit) or 2 (f32)
#pragma unroll 1
    for (int i = ts; i < kDecodeTile; i += tsn) {
      const int lt = tile * kDecodeTile + i;
      const float4 pr = *reinterpret_cast<const float4*>(scores + lt * GP + 4 * hg);
      float vf[kPvElems];
#pragma unroll
      for (int u = 0; u < kVecsPerUnit; ++u) {
        const int vec = dv * kVecsPerUnit + u;
        const uint4 raw = st[i * rv + (vec ^ swizzle(i, rv))];  // one 16-byte load
        Vec::to_float(raw, vf + u * kVec);
      }
#pragma unroll
      for (int j = 0; j < kPvElems; ++j) {
        acc[j] = fmaf(pr.x, vf[j], acc[j]);
        acc[kPvElems + j] = fmaf(pr.y, vf[j], acc[kPvElems + j]);
        acc[2 * kPvElems + j] = fmaf(pr.z, vf[j], acc[2 * kPvElems + j]);
        acc[3 * kPvElems + j] = fmaf(pr.w, vf[j], acc[3 * kPvElems + j]);
      }
    }
    __syncthreads();  // the stage is free for the load issued next iteration
  }
  cp_async_wait<0>();  // only empty groups can remain; the ring is reused below

  // ---- Sum the P.V partial sums of the tsn token subsets (in subset order) into the
  // workspace: red_acc is [tsn][GP][D] over the ring.
  float* const red_acc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int hl = 0; hl < kPvHeads; ++hl) {
    float* const dst = red_acc + (static_cast<int>(ts) * GP + 4 * hg + hl) * D + kPvElems * dv;
    *reinterpret_cast<float4*>(dst) = make_float4(acc[hl * kPvElems], acc[hl * kPvElems + 1],
                                                  acc[hl * kPvElems + 2], acc[hl * kPvElems + 3]);
    *reinterpret_cast<float4*>(dst + 4) =
        make_float4(acc[hl * kPvElems + 4], acc[hl * kPvElems + 5], acc[hl * kPvElems + 6],
                    acc[hl * kPvElems + 7]);
  }
  __syncthreads();
  const int64_t row0 =
      static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * p.group;
  for (int idx = tid; idx < p.group * D; idx += kDecodeThreads) {  // idx = g * D + d
    float sum = red_acc[idx];
    for (int t = 1; t < tsn; ++t)
      sum += red_acc[t * GP * D + idx];
    const int g = idx / D, d = idx - g * D;
    p.ws_out[((row0 + g) * p.num_parts + part) * D + d] = sum;
  }
}

// ---------------------------------------------------------------------------------------
// Decode on tensor cores: decode_mma_kernel, for 16-bit caches at head_dim 64, 128 or 256.
//
// Same grid, partitions, workspace and results as decode_partition_kernel; only how the
// products are computed differs. Q.K and P.V are mma.sync m16n8k16 with float32
// accumulators, the 16 rows being the G query heads of the KV head (rows G..15 repeat
// head G - 1 in Q.K and are zero in P.V; what they give is dropped).
// K and V are exact operands. q and p are float32, so each is split into three 16-bit
// pieces, x = x1 + x2 + x3 (x1 = round(x), x2 = round(x - x1), x3 = round(x - x1 - x2)),
// which hold all 24 bits of a float32 significand, and each piece is multiplied in turn:
// every product is exact and the sums are the tensor cores' float32 accumulations (their
// order and rounding are the hardware's, fixed for a shape: results still do not depend
// on the batch). For an f16
// cache, q is scaled by a power of two so that its largest value sits at 2^13 (a float16
// holds up to 65504) and p by 2^14; the exact inverse scalings are applied to the sums.
//
// Block: 4 warps. A K tile (64 tokens) is scored by warp w on tokens 16w..16w+15 over the
// whole head_dim; a V tile is summed by warp w into elements [w D/4, (w+1) D/4) over all
// 64 tokens, so no partial sums are combined across warps. Tiles go through a ring of
// S stages in shared memory, loaded S - 1 tiles ahead (K tiles, then V
// tiles); rows are stored with their 16-byte vectors XOR-swizzled by (row % 8) so that
// ldmatrix reads 8 rows of one column without bank conflicts.

constexpr int kMmaThreads = 128;
constexpr int kMmaWarps = kMmaThreads / 32;
// Ring stages: 2. The kernel is written for S, and the simulation
// (scripts/decode-mma-sim.py) checks 2, 3 and 4; on an H200, 2 read the cache fastest at
// every shape measured (at 16 sequences of 4k tokens, 77%, 75% and 68% of the copy
// bandwidth with 2, 3 and 4), since more blocks fit in an SM.
constexpr int kMmaStages = 2;
// Blocks per SM the registers must allow. At head_dim 128 a block takes 35 to 43 KiB of
// shared memory (G 1 to 4) with 2 stages, so 5 fit in an H100/H200 SM (228 KiB, 1 KiB of
// it reserved per block) if a thread keeps to 96 registers; 51 to 59 KiB with 3 stages
// and 67 to 75 with 4. At head_dim 256 the ring alone takes 32 KiB a stage.
constexpr int mma_min_blocks(int stages, int head_dim) {
  return stages == 2 ? (head_dim <= 128 ? 5 : 4) : (stages == 3 ? 3 : 2);
}
constexpr int kMmaRows = 16;  // m of the mma: query heads, padded
constexpr int kMmaQPad = 8;   // 16-bit elements after each q row: rows 16 bytes apart mod 128
constexpr int kMmaScoreStride = kDecodeMaxPartitionTokens + 8;  // floats per head of scores
constexpr int kMmaPieces = 3;                                   // 16-bit pieces of a float32

// Shared memory of the tensor-core kernel, in bytes (all offsets multiples of 16):
//   ring    S tiles of kDecodeTile rows x head_dim 16-bit values
//   q       [kMmaPieces][G][head_dim + kMmaQPad] 16-bit pieces of q, the G heads' rows
//           only (the A operand's rows G..15 feed accumulator rows that are never read,
//           and read row G - 1 again): 3 KiB at head_dim 128 and G = 4, not 13 for 16
//   scores  [G][kMmaScoreStride] floats (scores, then exp(score - max))
//   bt      [32] block ids
struct MmaLayout {
  int q, scores, bt, total;
};
__host__ __device__ inline MmaLayout mma_layout(int stages, int head_dim, int group) {
  MmaLayout l;
  l.q = stages * kDecodeTile * head_dim * 2;
  l.scores = l.q + kMmaPieces * group * (head_dim + kMmaQPad) * 2;
  l.bt = l.scores + group * kMmaScoreStride * 4;
  l.total = l.bt + kMaxBlocksPerPartition * 4;
  return l;
}

// The 16-bit type of a cache (bf16 or f16) and its mma.
template <typename T>
struct MmaType {
  static constexpr bool kHalf = std::is_same_v<T, __half>;
  static constexpr bool kScaled = kHalf;  // bfloat16 has float32's exponent range
  __device__ __forceinline__ static float unscale(float x, int e) {
    return kScaled ? ldexpf(x, e) : x;
  }
  // (lo, hi) rounded to T, packed lo in the low half; `rounded` gets them back as float32.
  __device__ __forceinline__ static unsigned pack(float lo, float hi, float2& rounded) {
    unsigned u;
    if constexpr (kHalf) {
      const __half2 h = __floats2half2_rn(lo, hi);
      rounded = __half22float2(h);
      memcpy(&u, &h, 4);
    } else {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      rounded = __bfloat1622float2(h);
      memcpy(&u, &h, 4);
    }
    return u;
  }
  // d += a b: a 16 x 16 (row), b 16 x 8 (col), float32 accumulators.
  __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    if constexpr (kHalf) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
};

// The kMmaPieces 16-bit pieces of the float32 pair (x, y), each packed x in the low half.
template <typename T>
__device__ __forceinline__ void split_pair(float x, float y, unsigned (&pieces)[kMmaPieces]) {
#pragma unroll
  for (int i = 0; i < kMmaPieces; ++i) {
    float2 r;
    pieces[i] = MmaType<T>::pack(x, y, r);
    x -= r.x;  // exact: the rounding error of a 16-bit rounding is a float32
    y -= r.y;
  }
}

// Four 8x8 matrices of 16-bit values from shared memory: lanes 8i..8i+7 give the row
// addresses of matrix i, which lands in r[i] (lane l holds row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1); with .trans, lane l holds column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

template <typename T, int D, int S>
__global__ void __launch_bounds__(kMmaThreads, mma_min_blocks(S, D))
    decode_mma_kernel(const DecodeParams p) {
  allow_dependents();
  using M = MmaType<T>;
  constexpr int kRowVecs = D / 8;  // 16-byte vectors per row
  constexpr int kRowVecsShift = D == 64 ? 3 : (D == 128 ? 4 : 5);
  static_assert(kRowVecs == 1 << kRowVecsShift);
  constexpr int kTileBytes = kDecodeTile * D * 2;
  constexpr int kQStride = D + kMmaQPad;                // 16-bit elements per q row
  constexpr int kWarpDims = D / kMmaWarps;              // P.V: elements of head_dim per warp
  constexpr int kWarpNTiles = kWarpDims / 8;            // P.V: n8 tiles per warp (2, 4 or 8)
  constexpr int kCopyRowStep = kMmaThreads / kRowVecs;  // rows one pass of the copy covers
  extern __shared__ uint4 smem_vec[];
  char* const smem = reinterpret_cast<char*>(smem_vec);

  const int kvh = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // mma fragment coordinates
  const PartitionSpan span = partition_span(p, seq, part);
  if (span.ntiles == 0) return;
  const int v0 = span.v0, v1 = span.v1, tile_first = span.tile_first, ntiles = span.ntiles;
  const int G = p.group;

  const MmaLayout lay = mma_layout(S, D, G);
  char* const ring = smem;
  T* const qs = reinterpret_cast<T*>(smem + lay.q);                   // [3][G][kQStride]
  float* const scores = reinterpret_cast<float*>(smem + lay.scores);  // [G][kMmaScoreStride]
  int* const bt = reinterpret_cast<int*>(smem + lay.bt);              // [32]

  load_block_ids(p, seq, part, span, tid, bt);

  // Loads: K tiles 0..ntiles-1, then V tiles, load L into ring stage L % S.
  // Thread tid copies vector tid % kRowVecs of rows tid / kRowVecs, + kCopyRowStep, ...
  const int nloads = 2 * ntiles;
  const int64_t slot_vecs = static_cast<int64_t>(p.num_kv_heads) * kRowVecs;
  const int my_vec = tid % kRowVecs, my_row = tid / kRowVecs;
  const int64_t my_col = static_cast<int64_t>(kvh) * kRowVecs + my_vec;
  auto issue_or_commit = [&](int load) {
    if (load < nloads) {
      const bool is_v = load >= ntiles;
      const int t0 = (tile_first + (is_v ? load - ntiles : load)) * kDecodeTile;
      const uint4* const base = (is_v ? p.v : p.k) + my_col;
      char* const dst = ring + (load % S) * kTileBytes;
      const bool full = t0 >= v0 && t0 + kDecodeTile <= v1;
#pragma unroll
      for (int i = 0; i < kDecodeTile / kCopyRowStep; ++i) {
        const int row = my_row + i * kCopyRowStep;
        const int lt = t0 + row;  // partition-local token
        const bool valid = full || (lt >= v0 && lt < v1);
        const uint4* src = base;
        if (valid)
          src += (static_cast<int64_t>(bt[lt / kBlockSize]) * kBlockSize + lt % kBlockSize) *
                 slot_vecs;
        cp_async16(dst + (row * kRowVecs + (my_vec ^ (row & 7))) * 16, src, valid);
      }
    }
    cp_async_commit();  // possibly empty: "all but S - 1 groups done" means load L landed
  };

  // q of the G heads in 16-bit pieces, scaled by 2^-q_exp.
  int q_exp = 0;
  {
    const float* const qg =
        p.q + (static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * G) * D;
    if constexpr (M::kScaled) {
      float amax = 0.f;
      for (int i = tid; i < G * D; i += kMmaThreads)
        amax = fmaxf(amax, fabsf(qg[i]));
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, off));
      float* const red = scores;  // free until the first tile is scored
      if (lane == 0) red[warp] = amax;
      __syncthreads();
      amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
      __syncthreads();
      // The largest |q| lands in [2^13, 2^14); zero, inf and NaN are left unscaled.
      if (amax > 0.f && isfinite(amax)) q_exp = ilogbf(amax) - 13;
    }
    for (int i = 2 * tid; i < G * D; i += 2 * kMmaThreads) {  // i = row * D + d
      const int r = i / D, d = i % D;
      float2 x = *reinterpret_cast<const float2*>(qg + i);
      unsigned pc[kMmaPieces];
      if constexpr (M::kScaled) x = make_float2(ldexpf(x.x, -q_exp), ldexpf(x.y, -q_exp));
      split_pair<T>(x.x, x.y, pc);
#pragma unroll
      for (int k = 0; k < kMmaPieces; ++k)
        *reinterpret_cast<unsigned*>(qs + (k * G + r) * kQStride + d) = pc[k];
    }
  }

  __syncthreads();  // bt is written (the q pieces are read after the next barrier)
#pragma unroll
  for (int l = 0; l < S - 1; ++l)
    issue_or_commit(l);

  // ---- Q.K: warp w scores tokens 16w .. 16w+15 of each K tile (two n8 tiles).
  // q piece k as the A operand: lane l addresses head l % 8 + 8 ((l / 8) % 2), or head
  // G - 1 in its place from G on (lanes that give the same address share its read).
  const int a_row = min((lane & 7) + ((lane >> 3) & 1) * 8, G - 1);
  for (int load = 0; load < ntiles; ++load) {
    cp_async_wait<S - 2>();
    __syncthreads();  // load `load` is in for every thread; the previous stage is free
    issue_or_commit(load + S - 1);
    const char* const st = ring + (load % S) * kTileBytes;
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ks += 2) {
      // K as the B operand of k-steps ks and ks + 1: lane l addresses token
      // 16w + 8j + l % 8, elements 16 ks + 8 (l / 8) .. + 7.
      unsigned kb[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = 16 * warp + 8 * j + (lane & 7);
        const int vec = 2 * ks + (lane >> 3);
        ldmatrix_x4(kb[j], st + (row * kRowVecs + (vec ^ (row & 7))) * 16);
      }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int k = 0; k < kMmaPieces; ++k) {
          // q piece k as the A operand: lane l addresses row a_row, elements
          // 16 (ks + kk) + 8 (l / 16) .. + 7.
          unsigned a[4];
          ldmatrix_x4(a, qs + (k * G + a_row) * kQStride + 16 * (ks + kk) + 8 * (lane >> 4));
#pragma unroll
          for (int j = 0; j < 2; ++j)
            M::mma(acc[j], a, kb[j][2 * kk], kb[j][2 * kk + 1]);
        }
      }
    }
    // acc[j][2h + e]: head gid + 8h, token 16w + 8j + 2 tig + e of the tile.
    const int t0 = (tile_first + load) * kDecodeTile + 16 * warp + 2 * tig;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int lt = t0 + 8 * j;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = gid + 8 * h;
        if (head < G) {
          float2 s;
          s.x = lt >= v0 && lt < v1 ? __fmul_rn(M::unscale(acc[j][2 * h], q_exp), p.scale)
                                    : -INFINITY;
          s.y = lt + 1 >= v0 && lt + 1 < v1
                    ? __fmul_rn(M::unscale(acc[j][2 * h + 1], q_exp), p.scale)
                    : -INFINITY;
          *reinterpret_cast<float2*>(scores + head * kMmaScoreStride + lt) = s;
        }
      }
    }
  }
  __syncthreads();  // every score is written

  // ---- Softmax over the partition: warp w takes heads w, w + 4, ...; lanes stride over
  // the tokens and combine by a butterfly. Scores become exp(score - max) in place.
  {
    const int s_begin = tile_first * kDecodeTile, s_end = s_begin + ntiles * kDecodeTile;
    const int64_t row0 = static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * G;
    for (int g = warp; g < G; g += kMmaWarps) {
      float* const sc = scores + g * kMmaScoreStride;
      float m = -INFINITY;
      for (int t = s_begin + lane; t < s_end; t += 32)
        m = fmaxf(m, sc[t]);
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1)
        m = fmaxf(m, __shfl_xor_sync(kFullMask, m, off));
      // m is finite: the partition holds at least one valid token.
      float sum = 0.f;
      for (int t = s_begin + lane; t < s_end; t += 32) {
        const float e = expf(sc[t] - m);
        sc[t] = e;
        sum += e;
      }
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1)
        sum += __shfl_xor_sync(kFullMask, sum, off);
      if (lane == 0) {
        p.ws_max[(row0 + g) * p.num_parts + part] = m;
        p.ws_sum[(row0 + g) * p.num_parts + part] = sum;
      }
    }
    // The first V tile's barrier below orders these writes before their reads.
  }

  // ---- P.V: warp w sums elements [w D/4, (w+1) D/4) of head_dim over each V tile.
  constexpr float kPScale = M::kScaled ? 16384.f : 1.f;  // p in [0, 1] -> [0, 2^14]
  float o[kWarpNTiles][4] = {};
  for (int load = ntiles; load < nloads; ++load) {
    cp_async_wait<S - 2>();
    __syncthreads();
    issue_or_commit(load + S - 1);
    const char* const st = ring + (load % S) * kTileBytes;
    const int tile_t0 = (tile_first + load - ntiles) * kDecodeTile;
#pragma unroll
    for (int kt = 0; kt < kDecodeTile / 16; ++kt) {
      // p as the A operand: a[h + 2c] holds head gid + 8h, tokens 16 kt + 8c + 2 tig, + 1.
      unsigned a[kMmaPieces][4];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int head = gid + 8 * h;
          float2 pr = make_float2(0.f, 0.f);
          if (head < G)
            pr = *reinterpret_cast<const float2*>(scores + head * kMmaScoreStride + tile_t0 +
                                                  16 * kt + 8 * c + 2 * tig);
          unsigned pc[kMmaPieces];
          split_pair<T>(pr.x * kPScale, pr.y * kPScale, pc);
#pragma unroll
          for (int k = 0; k < kMmaPieces; ++k)
            a[k][h + 2 * c] = pc[k];
        }
      }
      // V as the B operand of two n8 tiles at a time: lane l addresses token
      // 16 kt + 8 ((l / 8) % 2) + l % 8, elements n0 + 8 (l / 16) .. + 7.
#pragma unroll
      for (int nt = 0; nt < kWarpNTiles; nt += 2) {
        const int row = 16 * kt + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int vec = (kWarpDims * warp + 8 * nt) / 8 + (lane >> 4);
        unsigned vb[4];
        ldmatrix_x4_trans(vb, st + (row * kRowVecs + (vec ^ (row & 7))) * 16);
#pragma unroll
        for (int k = 0; k < kMmaPieces; ++k) {
          M::mma(o[nt], a[k], vb[0], vb[1]);
          M::mma(o[nt + 1], a[k], vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain

  // o[nt][2h + e]: head gid + 8h, element kWarpDims w + 8 nt + 2 tig + e.
  const int64_t row0 = static_cast<int64_t>(seq) * p.num_q_heads + static_cast<int64_t>(kvh) * G;
#pragma unroll
  for (int nt = 0; nt < kWarpNTiles; ++nt) {
    const int d = kWarpDims * warp + 8 * nt + 2 * tig;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = gid + 8 * h;
      if (head < G)
        *reinterpret_cast<float2*>(p.ws_out + ((row0 + head) * p.num_parts + part) * D + d) =
            make_float2(o[nt][2 * h] / kPScale, o[nt][2 * h + 1] / kPScale);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Decode: merge kernel.

constexpr int kMergeThreads = 128;

struct MergeParams {
  const int32_t* context_lens;
  int32_t window;
  int num_q_heads, head_dim, num_parts, part_tokens;
  const float* ws_out;
  const float* ws_max;
  const float* ws_sum;
  void* out;  // [num_seqs, num_q_heads, head_dim] of out_dtype
  DType out_dtype;
};

// The block's maximum / sum of v (fixed order: lanes by a butterfly, then warps 0..3);
// every thread gets it. `red` holds one float per warp.
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kMergeThreads / 32; ++w)
    r = fmaxf(r, red[w]);
  __syncthreads();  // red may be reused
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1)
    v += __shfl_xor_sync(kFullMask, v, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kMergeThreads / 32; ++w)
    r += red[w];
  __syncthreads();
  return r;
}

// One block per (q head, sequence): out = sum_i w_i acc_i / sum_i w_i l_i over the
// partitions i that hold window tokens, w_i = exp(m_i - max_j m_j).
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const MergeParams p) {
  wait_for_primary();
  __shared__ float red[kMergeThreads / 32];
  __shared__ float4 part_acc[kMergeThreads];
  const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int D = p.head_dim, P = p.num_parts;
  const int64_t row = static_cast<int64_t>(seq) * p.num_q_heads + h;
  const int ctx = p.context_lens[seq];
  int first = 0, last = -1;
  if (ctx > 0) {
    const int lo = p.window > 0 ? max(0, ctx - p.window) : 0;
    first = lo / p.part_tokens;
    // A context over max_context is a caller bug; stay inside the workspace.
    last = min((ctx - 1) / p.part_tokens, P - 1);
  }
  if (last < first) {  // context_len 0: a padding row
    for (int d = tid; d < D; d += kMergeThreads)
      store_out(p.out, p.out_dtype, row * D + d, 0.f);
    return;
  }
  const float* const mx = p.ws_max + row * P;
  const float* const sm = p.ws_sum + row * P;
  float m = -INFINITY;
  for (int i = first + tid; i <= last; i += kMergeThreads)
    m = fmaxf(m, mx[i]);
  m = block_max(m, red);
  float l = 0.f;
  for (int i = first + tid; i <= last; i += kMergeThreads)
    l = fmaf(expf(mx[i] - m), sm[i], l);
  l = block_sum(l, red);

  // Thread (grp, col): float4 column col of head_dim, partitions first + grp + k * groups.
  const int cols = D / 4, groups = kMergeThreads / cols;
  const int col = tid % cols, grp = tid / cols;
  const float4* const acc4 = reinterpret_cast<const float4*>(p.ws_out + row * P * D);
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int i = first + grp; i <= last; i += groups)
    a = fma4(expf(mx[i] - m), acc4[static_cast<int64_t>(i) * cols + col], a);
  part_acc[tid] = a;  // tid == grp * cols + col
  __syncthreads();
  if (tid < cols) {
    float4 s = part_acc[tid];
    for (int gi = 1; gi < groups; ++gi) {
      const float4 b = part_acc[gi * cols + tid];
      s.x += b.x;
      s.y += b.y;
      s.z += b.z;
      s.w += b.w;
    }
    const int64_t o = row * D + 4 * tid;
    store_out(p.out, p.out_dtype, o, s.x / l);
    store_out(p.out, p.out_dtype, o + 1, s.y / l);
    store_out(p.out, p.out_dtype, o + 2, s.z / l);
    store_out(p.out, p.out_dtype, o + 3, s.w / l);
  }
}

// ---------------------------------------------------------------------------------------
// General kernel (any q_len).

constexpr int kGeneralThreads = 128;
constexpr int kGeneralMinBlocks = 2;  // 90 KB of shared memory at head_dim 128
constexpr int kGeneralTile = 32;      // keys per staged tile (2 KV blocks)

// Thread layout for a head_dim: kRows (query, head) rows per block, in groups of 4 rows;
// kGroupLanes consecutive threads share a row group. In Q.K a thread scores its 4 rows
// against kKeysPerThread keys (lane, lane + kGroupLanes, ...); in P.V it accumulates its 4
// rows over kDimsPerThread elements of head_dim (float4 groups lane, lane + kGroupLanes,
// ...). The same thread holds the rows' softmax state in both.
template <int D>
struct GeneralShape {
  static constexpr int kHeadDim = D;
  static constexpr int kRows = D == 16 ? 128 : (D == 256 ? 32 : 64);
  static constexpr int kGroupLanes = kGeneralThreads * 4 / kRows;  // 4, 8 or 16
  static constexpr int kKeysPerThread = kGeneralTile / kGroupLanes;
  static constexpr int kDimsPerThread = D / kGroupLanes;
  static constexpr int kF4 = kDimsPerThread / 4;  // float4 groups per thread
  static constexpr int kQStride = D + 4;          // floats per q / k / v row in shared memory
  static constexpr int kPStride = kRows + 4;      // floats per key row of probabilities
  static_assert(kDimsPerThread % 4 == 0 && kF4 >= 1);
  static_assert(kRows / 4 * kGroupLanes == kGeneralThreads);
  // Shared memory: q [kRows][kQStride], k and v [32][kQStride], p [32][kPStride] floats,
  // then the raw tile (K then V, [32][row_bytes] each).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kRows * kQStride * 4;
  static constexpr int kVOffset = kKOffset + kGeneralTile * kQStride * 4;
  static constexpr int kPOffset = kVOffset + kGeneralTile * kQStride * 4;
  static constexpr int kRawOffset = kPOffset + kGeneralTile * kPStride * 4;
  static constexpr int smem_bytes(int row_bytes) {
    return kRawOffset + 2 * kGeneralTile * row_bytes;
  }
};

struct GeneralParams {
  const float* q;  // [num_tokens, num_q_heads, D]
  const uint4* k;
  const uint4* v;
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  int32_t window;
  int num_kv_heads, num_q_heads, group;
  int queries_per_block;  // kRows / group
  DType cache_dtype;
  int row_vecs, row_vecs_shift;
  float scale;
  void* out;  // [num_tokens, num_q_heads, D] of out_dtype
  DType out_dtype;
};

template <int D>
__global__ void __launch_bounds__(kGeneralThreads, kGeneralMinBlocks)
    general_attention_kernel(const GeneralParams p) {
  using S = GeneralShape<D>;
  constexpr int kLanes = S::kGroupLanes;
  extern __shared__ uint4 smem_vec[];
  char* const smem = reinterpret_cast<char*>(smem_vec);
  float* const qs = reinterpret_cast<float*>(smem + S::kQOffset);
  float* const ks = reinterpret_cast<float*>(smem + S::kKOffset);
  float* const vs = reinterpret_cast<float*>(smem + S::kVOffset);
  float* const ps = reinterpret_cast<float*>(smem + S::kPOffset);  // [key][row]
  char* const raw = smem + S::kRawOffset;
  const int rv = p.row_vecs;
  uint4* const raw_k = reinterpret_cast<uint4*>(raw);
  uint4* const raw_v = raw_k + kGeneralTile * rv;

  const int kvh = blockIdx.x, qtile = blockIdx.y, seq = blockIdx.z;
  const int tid = threadIdx.x;
  const int tok0 = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - tok0;
  const int q0 = qtile * p.queries_per_block;
  if (q0 >= q_len) return;
  const int nq = min(p.queries_per_block, q_len - q0);
  const int ctx = p.context_lens[seq];
  const int G = p.group;
  const int rows = nq * G;            // row r: query q0 + r / G, head kvh * G + r % G
  const int pos0 = ctx - q_len + q0;  // position of the block's first query
  const int p_last = pos0 + nq - 1;

  // Query rows (zero beyond `rows`).
  {
    const float4* const q4 = reinterpret_cast<const float4*>(p.q);
    float4* const qs4 = reinterpret_cast<float4*>(qs);
    for (int i = tid; i < S::kRows * (D / 4); i += kGeneralThreads) {
      const int r = i / (D / 4), c = i % (D / 4);
      float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < rows) {
        const int64_t t = tok0 + q0 + r / G;
        val = q4[(t * p.num_q_heads + static_cast<int64_t>(kvh) * G + r % G) * (D / 4) + c];
      }
      qs4[r * (S::kQStride / 4) + c] = val;
    }
  }

  // This thread's 4 rows: position (-1: no keys) and first attended position.
  const int rg = tid / kLanes, lane = tid % kLanes;
  int row_pos[4], row_lo[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg * 4 + i;
    row_pos[i] = -1;
    row_lo[i] = 0;
    if (r < rows) {
      const int pos = pos0 + r / G;
      if (pos >= 0) {
        row_pos[i] = pos;
        row_lo[i] = p.window > 0 ? max(0, pos - p.window + 1) : 0;
      }
    }
  }
  float m[4], l[4];
  float4 acc[4][S::kF4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int f = 0; f < S::kF4; ++f)
      acc[i][f] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  if (p_last >= 0) {
    // Keys any row of the block attends to: [lo_block, p_last]; others are zero-filled.
    const int lo_block = p.window > 0 ? max(0, max(pos0, 0) - p.window + 1) : 0;
    const int kt_first = lo_block / kGeneralTile, kt_last = p_last / kGeneralTile;
    const int32_t* const table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
    const int64_t slot_vecs = static_cast<int64_t>(p.num_kv_heads) * rv;
    // The two block ids of tile kt (read one iteration ahead, so that no cp.async waits on
    // a global load); entries wholly outside [lo_block, p_last] are not read.
    constexpr int kTileBlocks = kGeneralTile / kBlockSize;
    static_assert(kTileBlocks == 2);
    auto tile_blocks = [&](int kt, int& b0, int& b1) {
      const int first = kt * kTileBlocks;
      b0 = (first + 1) * kBlockSize > lo_block ? table[first] : -1;
      b1 = (first + 1) * kBlockSize <= p_last ? table[first + 1] : -1;
    };
    auto issue = [&](int kt, int b0, int b1) {
#pragma unroll 1
      for (int c = tid; c < kGeneralTile * rv; c += kGeneralThreads) {
        const int tok = c >> p.row_vecs_shift;
        const int vec = c & (rv - 1);
        const int pos = kt * kGeneralTile + tok;
        const bool valid = pos >= lo_block && pos <= p_last;
        const uint4* ksrc = p.k;
        const uint4* vsrc = p.v;
        if (valid) {
          const int blk = tok < kBlockSize ? b0 : b1;
          const int64_t slot = static_cast<int64_t>(blk) * kBlockSize + pos % kBlockSize;
          const int64_t off = slot * slot_vecs + static_cast<int64_t>(kvh) * rv + vec;
          ksrc += off;
          vsrc += off;
        }
        cp_async16(raw_k + c, ksrc, valid);
        cp_async16(raw_v + c, vsrc, valid);
      }
      cp_async_commit();
    };

    int b0, b1;
    tile_blocks(kt_first, b0, b1);
    issue(kt_first, b0, b1);
    for (int kt = kt_first; kt <= kt_last; ++kt) {
      if (kt < kt_last) tile_blocks(kt + 1, b0, b1);
      cp_async_wait<0>();
      __syncthreads();  // raw tile landed; the previous tile's k, v, p are no longer read
#pragma unroll 1
      for (int c = tid; c < kGeneralTile * rv; c += kGeneralThreads) {
        const int tok = c >> p.row_vecs_shift;
        const int vec = c & (rv - 1);
        float f[8];
        const int n = vec_to_float(raw_k[c], p.cache_dtype, f);
        float* const kd = ks + tok * S::kQStride + vec * n;
        *reinterpret_cast<float4*>(kd) = make_float4(f[0], f[1], f[2], f[3]);
        if (n == 8) *reinterpret_cast<float4*>(kd + 4) = make_float4(f[4], f[5], f[6], f[7]);
        vec_to_float(raw_v[c], p.cache_dtype, f);
        float* const vd = vs + tok * S::kQStride + vec * n;
        *reinterpret_cast<float4*>(vd) = make_float4(f[0], f[1], f[2], f[3]);
        if (n == 8) *reinterpret_cast<float4*>(vd + 4) = make_float4(f[4], f[5], f[6], f[7]);
      }
      __syncthreads();  // k, v in float32; the raw buffer is free
      if (kt < kt_last) issue(kt + 1, b0, b1);

      // ---- Scores of 4 rows x kKeysPerThread keys.
      float s[4][S::kKeysPerThread];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j)
          s[i][j] = 0.f;
      const float4* const qs4 = reinterpret_cast<const float4*>(qs);
      const float4* const ks4 = reinterpret_cast<const float4*>(ks);
#pragma unroll 4
      for (int d4 = 0; d4 < D / 4; ++d4) {
        float4 qv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qv[i] = qs4[(rg * 4 + i) * (S::kQStride / 4) + d4];
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) {
          const float4 kv = ks4[(lane + kLanes * j) * (S::kQStride / 4) + d4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            s[i][j] = fmaf(qv[i].x, kv.x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv.y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv.z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv.w, s[i][j]);
          }
        }
      }
      // ---- Online softmax per row; the kLanes threads of a row group combine by shuffles
      // (each ends with the same values).
      float alpha[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) {
          const int kp = kt * kGeneralTile + lane + kLanes * j;
          const bool valid = kp >= row_lo[i] && kp <= row_pos[i];
          s[i][j] = valid ? __fmul_rn(s[i][j], p.scale) : -INFINITY;
          tmax = fmaxf(tmax, s[i][j]);
        }
#pragma unroll
        for (int off = kLanes / 2; off >= 1; off >>= 1)
          tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, off));
        const float m_new = fmaxf(m[i], tmax);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: no NaN
        alpha[i] = expf(m[i] - m_use);
        float psum = 0.f;
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) {
          s[i][j] = expf(s[i][j] - m_use);
          psum += s[i][j];
        }
#pragma unroll
        for (int off = kLanes / 2; off >= 1; off >>= 1)
          psum += __shfl_xor_sync(kFullMask, psum, off);
        l[i] = fmaf(l[i], alpha[i], psum);
        m[i] = m_new;
      }
      float4* const ps4 = reinterpret_cast<float4*>(ps);
#pragma unroll
      for (int j = 0; j < S::kKeysPerThread; ++j)
        ps4[(lane + kLanes * j) * (S::kPStride / 4) + rg] =
            make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
      __syncthreads();  // p of every row group

      // ---- P.V: 4 rows x kDimsPerThread elements over the tile's 32 keys.
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int f = 0; f < S::kF4; ++f) {
          acc[i][f].x = __fmul_rn(acc[i][f].x, alpha[i]);
          acc[i][f].y = __fmul_rn(acc[i][f].y, alpha[i]);
          acc[i][f].z = __fmul_rn(acc[i][f].z, alpha[i]);
          acc[i][f].w = __fmul_rn(acc[i][f].w, alpha[i]);
        }
      const float4* const vs4 = reinterpret_cast<const float4*>(vs);
#pragma unroll 4
      for (int key = 0; key < kGeneralTile; ++key) {
        const float4 pr = ps4[key * (S::kPStride / 4) + rg];
#pragma unroll
        for (int f = 0; f < S::kF4; ++f) {
          const float4 vv = vs4[key * (S::kQStride / 4) + lane + kLanes * f];
          acc[0][f] = fma4(pr.x, vv, acc[0][f]);
          acc[1][f] = fma4(pr.y, vv, acc[1][f]);
          acc[2][f] = fma4(pr.z, vv, acc[2][f]);
          acc[3][f] = fma4(pr.w, vv, acc[3][f]);
        }
      }
    }
  }

  // Output rows; a row with no key (position < 0) gets zeros.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg * 4 + i;
    if (r >= rows) continue;
    const int64_t t = tok0 + q0 + r / G;
    const int64_t o = (t * p.num_q_heads + static_cast<int64_t>(kvh) * G + r % G) * D;
    const bool any = l[i] > 0.f;
#pragma unroll
    for (int f = 0; f < S::kF4; ++f) {
      const float4 a = acc[i][f];
      const float4 v = any ? make_float4(a.x / l[i], a.y / l[i], a.z / l[i], a.w / l[i])
                           : make_float4(0.f, 0.f, 0.f, 0.f);
      store_out4(p.out, p.out_dtype, o + 4 * (lane + kLanes * f), v);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host side.

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x)
    ++s;
  return s;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

constexpr int kMaxGroup = 16;  // query heads per KV head
static_assert(kMaxGroup <= kMmaRows, "a group's heads are rows of one mma");

// Query heads a decode block computes per KV head: the group rounded up to 4, 8 or 16.
int decode_group_pack(int group) {
  return group <= 4 ? 4 : (group <= 8 ? 8 : 16);
}

bool supported_head_dim(int d) {
  return d == 16 || d == 32 || d == 64 || d == 128 || d == 256;
}

// Validates what both kernels share; returns G.
int check_common(const char* fn, const KVCacheLayer& cache, int num_q_heads, DType out_dtype,
                 const void* q, const void* out) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(fn) + ": " + what);
  };
  const int D = cache.head_dim;
  if (!supported_head_dim(D))
    fail("head_dim " + std::to_string(D) + " is not supported (16, 32, 64, 128 or 256)");
  if (cache.num_kv_heads < 1 || num_q_heads < 1 || num_q_heads % cache.num_kv_heads != 0)
    fail("num_q_heads " + std::to_string(num_q_heads) + " is not a multiple of num_kv_heads " +
         std::to_string(cache.num_kv_heads));
  const int G = num_q_heads / cache.num_kv_heads;
  if (G > kMaxGroup) fail(std::to_string(G) + " query heads per KV head; at most 16 are supported");
  if (cache.dtype != DType::kF32 && cache.dtype != DType::kF16 && cache.dtype != DType::kBF16)
    fail("unsupported KV cache dtype");
  if (out_dtype != DType::kF32 && out_dtype != DType::kF16 && out_dtype != DType::kBF16)
    fail("unsupported output dtype");
  if (!aligned16(q) || !aligned16(out) || !aligned16(cache.k) || !aligned16(cache.v))
    fail("q, out and the KV cache must be 16-byte aligned");
  return G;
}

// compute(device) for the current device, computed once per device into `cache` (the
// value must be > 0).
template <class F>
int per_device(std::atomic<int> (&cache)[64], F compute) {
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) device = 0;
  int n = cache[device].load(std::memory_order_relaxed);
  if (n == 0) {
    n = compute(device);
    cache[device].store(n, std::memory_order_relaxed);
  }
  return n;
}
template <cudaDeviceAttr kAttr>
int device_attribute() {
  static std::atomic<int> cached[64] = {};
  return per_device(cached, [](int device) {
    int n = 0;
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttr, device));
    return n;
  });
}
int device_multiprocessors() {
  return device_attribute<cudaDevAttrMultiProcessorCount>();
}
// Whether the merge kernel is launched as a programmatic dependent of the partition
// kernel: on Hopper and later, where the merge kernel's code was compiled for them
// (griddepcontrol.wait is in it only from compute_90 on; a build for older GPUs alone
// runs there from its PTX, without it), unless PAGELLM_DECODE_PDL=0.
bool merge_as_dependent() {
  static const bool allowed = [] {
    const char* e = std::getenv("PAGELLM_DECODE_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  static std::atomic<int> cached[64] = {};  // 2: yes, 1: no
  return allowed && per_device(cached, [](int) {
                      cudaFuncAttributes merge{};
                      PAGELLM_CUDA_CHECK(cudaFuncGetAttributes(&merge, decode_merge_kernel));
                      const bool hopper =
                          device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9;
                      return hopper && merge.ptxVersion >= 90 ? 2 : 1;
                    }) == 2;
}
// The partition length a caller asked for (0: decode_partition_tokens), checked.
int resolve_partition_tokens(int requested, int32_t num_seqs, int num_kv_heads,
                             int32_t max_context) {
  if (requested == 0) return decode_partition_tokens(num_seqs, num_kv_heads, max_context);
  if (requested < kDecodeMinPartitionTokens || requested > kDecodeMaxPartitionTokens ||
      requested % kDecodeTile != 0)
    throw std::invalid_argument("paged_attention_decode: partition_tokens " +
                                std::to_string(requested) +
                                " is not 0 or a multiple of 64 from 64 to 512");
  return requested;
}
int64_t decode_parts(int32_t max_context, int part_tokens) {
  return max_context > 0 ? (static_cast<int64_t>(max_context) + part_tokens - 1) / part_tokens : 0;
}

// kernel<<<grid, threads, smem, stream>>>(params), asking for the shared memory first
// when it is over the default 48 KiB.
template <class Params>
void launch_with_shared(void (*kernel)(Params), dim3 grid, int threads, int smem,
                        cudaStream_t stream, const Params& params) {
  if (smem > 48 * 1024)
    PAGELLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, threads, smem, stream>>>(params);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

// Whether decode runs on tensor cores where the shape allows it (PAGELLM_DECODE_MMA=0:
// never, for comparison).
bool decode_mma_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("PAGELLM_DECODE_MMA");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}
bool decode_mma_shape(DType cache_dtype, int head_dim) {
  return (cache_dtype == DType::kBF16 || cache_dtype == DType::kF16) &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

// The partition kernel paged_attention_decode runs for a shape, its threads per block and
// the dynamic shared memory its layout takes. Needs no device.
struct DecodeKernel {
  void (*kernel)(DecodeParams);
  int threads, smem;
};
template <typename T>
DecodeKernel mma_decode_kernel(int head_dim, int group) {
  auto pick = [&](void (*kernel)(DecodeParams), int d) {
    return DecodeKernel{kernel, kMmaThreads, mma_layout(kMmaStages, d, group).total};
  };
  if (head_dim == 64) return pick(decode_mma_kernel<T, 64, kMmaStages>, 64);
  if (head_dim == 128) return pick(decode_mma_kernel<T, 128, kMmaStages>, 128);
  return pick(decode_mma_kernel<T, 256, kMmaStages>, 256);
}
template <typename T>
DecodeKernel cuda_core_decode_kernel(int head_dim, int group) {
  const int gp = decode_group_pack(group);
  const int row_bytes = head_dim * static_cast<int>(sizeof(T));
  auto pick = [&](void (*kernel)(DecodeParams)) {
    return DecodeKernel{kernel, kDecodeThreads,
                        decode_layout(kDecodeStages, gp, head_dim, row_bytes).total};
  };
  if (gp == 4) return pick(decode_partition_kernel<T, 4, kDecodeStages>);
  if (gp == 8) return pick(decode_partition_kernel<T, 8, kDecodeStages>);
  return pick(decode_partition_kernel<T, 16, kDecodeStages>);
}
DecodeKernel decode_kernel(DType cache_dtype, int head_dim, int group) {
  if (paged_attention_decode_tensor_cores(cache_dtype, head_dim))
    return cache_dtype == DType::kF16 ? mma_decode_kernel<__half>(head_dim, group)
                                      : mma_decode_kernel<__nv_bfloat16>(head_dim, group);
  switch (cache_dtype) {
    case DType::kF32:
      return cuda_core_decode_kernel<float>(head_dim, group);
    case DType::kF16:
      return cuda_core_decode_kernel<__half>(head_dim, group);
    default:
      return cuda_core_decode_kernel<__nv_bfloat16>(head_dim, group);
  }
}

// The shared memory a partition kernel is launched with: what its layout takes, or, with
// PAGELLM_DECODE_MAX_BLOCKS_PER_SM=N (for comparison), enough more that at most N of its
// blocks fit in a multiprocessor at once.
int decode_shared_request(int smem) {
  static const int cap = [] {
    const char* e = std::getenv("PAGELLM_DECODE_MAX_BLOCKS_PER_SM");
    return e == nullptr ? 0 : std::atoi(e);
  }();
  if (cap <= 0) return smem;
  const int per_sm = device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
  const int reserved = device_attribute<cudaDevAttrReservedSharedMemoryPerBlock>();
  const int per_block = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  // N + 1 blocks of (request + reserved) bytes overflow the multiprocessor.
  return std::min(std::max(smem, per_sm / (cap + 1) - reserved + 1), per_block);
}

// Lets the kernel take up to the device's most dynamic shared memory per block, and asks
// for the largest shared-memory carveout (its blocks are limited by shared memory, and its
// loads go through shared memory, not L1: the driver may otherwise pick a carveout with
// room for fewer blocks). Once per kernel and device, so that a launch in a step makes no
// driver call for it.
void configure_decode_kernel(void (*kernel)(DecodeParams)) {
  static std::mutex mu;
  static std::vector<std::pair<void (*)(DecodeParams), int>> done;
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  if (std::find(done.begin(), done.end(), std::make_pair(kernel, device)) != done.end()) return;
  PAGELLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>()));
  PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  done.emplace_back(kernel, device);
}

void launch_decode_partitions(const DecodeKernel& k, const DecodeParams& p, dim3 grid,
                              cudaStream_t stream) {
  const int smem = decode_shared_request(k.smem);
  configure_decode_kernel(k.kernel);
  k.kernel<<<grid, k.threads, smem, stream>>>(p);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_general(const GeneralParams& p, dim3 grid, cudaStream_t stream) {
  launch_with_shared(general_attention_kernel<D>, grid, kGeneralThreads,
                     GeneralShape<D>::smem_bytes(p.row_vecs * 16), stream, p);
}

// f(GeneralShape<head_dim>{}) for a supported head_dim.
template <class F>
auto with_general_shape(int head_dim, F f) {
  switch (head_dim) {
    case 16:
      return f(GeneralShape<16>{});
    case 32:
      return f(GeneralShape<32>{});
    case 64:
      return f(GeneralShape<64>{});
    case 128:
      return f(GeneralShape<128>{});
    default:
      return f(GeneralShape<256>{});
  }
}

int general_rows(int head_dim) {
  return with_general_shape(head_dim, [](auto shape) { return decltype(shape)::kRows; });
}

}  // namespace

bool paged_attention_decode_tensor_cores(DType cache_dtype, int head_dim) {
  return decode_mma_enabled() && decode_mma_shape(cache_dtype, head_dim);
}

bool paged_attention_supports(int head_dim, int num_q_heads, int num_kv_heads) {
  return supported_head_dim(head_dim) && num_kv_heads > 0 && num_q_heads > 0 &&
         num_q_heads % num_kv_heads == 0 && num_q_heads / num_kv_heads <= kMaxGroup;
}

namespace {
// Throws std::invalid_argument, naming `fn`, for a shape the kernels do not take.
void require_supported(const char* fn, int head_dim, int num_q_heads, int num_kv_heads) {
  if (!paged_attention_supports(head_dim, num_q_heads, num_kv_heads))
    throw std::invalid_argument(std::string(fn) + ": head_dim " + std::to_string(head_dim) +
                                " with " + std::to_string(num_q_heads) + " query and " +
                                std::to_string(num_kv_heads) +
                                " KV heads is not a shape the kernels take");
}
}  // namespace

size_t paged_attention_decode_shared_bytes(int head_dim, int num_q_heads, int num_kv_heads,
                                           DType cache_dtype) {
  require_supported("paged_attention_decode_shared_bytes", head_dim, num_q_heads, num_kv_heads);
  return static_cast<size_t>(decode_kernel(cache_dtype, head_dim, num_q_heads / num_kv_heads).smem);
}

int paged_attention_decode_blocks_per_sm(int head_dim, int num_q_heads, int num_kv_heads,
                                         DType cache_dtype) {
  require_supported("paged_attention_decode_blocks_per_sm", head_dim, num_q_heads, num_kv_heads);
  const DecodeKernel k = decode_kernel(cache_dtype, head_dim, num_q_heads / num_kv_heads);
  const int smem = decode_shared_request(k.smem);
  configure_decode_kernel(k.kernel);
  int blocks = 0;
  PAGELLM_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.kernel, k.threads, smem));
  return blocks;
}

size_t paged_attention_shared_bytes(int head_dim, int num_q_heads, int num_kv_heads,
                                    DType cache_dtype) {
  require_supported("paged_attention_shared_bytes", head_dim, num_q_heads, num_kv_heads);
  const int row_bytes = head_dim * static_cast<int>(dtype_size(cache_dtype));
  const int decode = decode_layout(kDecodeStages, decode_group_pack(num_q_heads / num_kv_heads),
                                   head_dim, row_bytes)
                         .total;
  const int general = with_general_shape(
      head_dim, [&](auto shape) { return decltype(shape)::smem_bytes(row_bytes); });
  const int mma = paged_attention_decode_tensor_cores(cache_dtype, head_dim)
                      ? mma_layout(kMmaStages, head_dim, num_q_heads / num_kv_heads).total
                      : 0;
  return static_cast<size_t>(std::max({decode, general, mma}));
}

int decode_partition_tokens_on(int32_t num_seqs, int num_kv_heads, int32_t max_context,
                               int multiprocessors) {
  int tokens = kDecodeMaxPartitionTokens;
  if (num_seqs <= 0 || num_kv_heads <= 0 || max_context <= 0) return tokens;
  const int64_t target =
      static_cast<int64_t>(std::max(multiprocessors, 1)) * kDecodeTargetBlocksPerSM;
  const int64_t rows = static_cast<int64_t>(num_seqs) * num_kv_heads;
  while (tokens > kDecodeMinPartitionTokens && rows * decode_parts(max_context, tokens) < target)
    tokens /= 2;
  return tokens;
}
int decode_partition_tokens(int32_t num_seqs, int num_kv_heads, int32_t max_context) {
  return decode_partition_tokens_on(num_seqs, num_kv_heads, max_context, device_multiprocessors());
}
size_t paged_attention_decode_workspace_bound(int32_t max_seqs, int num_q_heads, int num_kv_heads,
                                              int head_dim, int32_t max_context,
                                              int multiprocessors) {
  if (max_seqs <= 0 || num_q_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_context <= 0)
    return 0;
  if (multiprocessors <= 0) multiprocessors = device_multiprocessors();
  // Blocks (sequence, KV head, partition) of any such batch: at most the longest batch's
  // at 512 tokens; and where the length was halved, fewer than the target at twice it,
  // so fewer than twice the target.
  const int64_t target = static_cast<int64_t>(multiprocessors) * kDecodeTargetBlocksPerSM;
  const int64_t blocks = std::max(static_cast<int64_t>(max_seqs) * num_kv_heads *
                                      decode_parts(max_context, kDecodeMaxPartitionTokens),
                                  2 * target);
  return static_cast<size_t>(blocks) * (num_q_heads / num_kv_heads) * (head_dim + 2) *
         sizeof(float);
}
size_t paged_attention_decode_workspace_bytes(int32_t num_seqs, int num_q_heads, int num_kv_heads,
                                              int head_dim, int32_t max_context,
                                              int partition_tokens) {
  if (num_seqs <= 0 || num_q_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0) return 0;
  const int tokens =
      resolve_partition_tokens(partition_tokens, num_seqs, num_kv_heads, max_context);
  return static_cast<size_t>(num_seqs) * num_q_heads * decode_parts(max_context, tokens) *
         (head_dim + 2) * sizeof(float);
}

void paged_attention_decode(const float* q, const KVCacheLayer& cache,
                            const PagedAttentionBatch& batch, int32_t max_context, int num_q_heads,
                            float scale, void* workspace, void* out, DType out_dtype,
                            cudaStream_t stream, int partition_tokens) {
  const int G = check_common("paged_attention_decode", cache, num_q_heads, out_dtype, q, out);
  if (batch.num_seqs <= 0) return;
  if (batch.num_seqs > 65535)
    throw std::invalid_argument("paged_attention_decode: at most 65535 sequences per batch");
  const int part_tokens =
      resolve_partition_tokens(partition_tokens, batch.num_seqs, cache.num_kv_heads, max_context);
  const int64_t parts = decode_parts(max_context, part_tokens);
  if (parts > 65535)
    throw std::invalid_argument("paged_attention_decode: max_context " +
                                std::to_string(max_context) + " is too long");
  if (parts > 0 && (workspace == nullptr || !aligned16(workspace)))
    throw std::invalid_argument(
        "paged_attention_decode: the workspace must be 16-byte aligned device memory of "
        "paged_attention_decode_workspace_bytes()");
  const int D = cache.head_dim;
  const int64_t rows = static_cast<int64_t>(batch.num_seqs) * num_q_heads;
  float* const ws_out = static_cast<float*>(workspace);
  float* const ws_max = ws_out + rows * parts * D;
  float* const ws_sum = ws_max + rows * parts;

  if (parts > 0) {
    const int gp = decode_group_pack(G);
    DecodeParams p{};
    p.q = q;
    p.k = static_cast<const uint4*>(cache.k);
    p.v = static_cast<const uint4*>(cache.v);
    p.context_lens = batch.context_lens;
    p.block_tables = batch.block_tables;
    p.max_blocks_per_seq = batch.max_blocks_per_seq;
    p.window = batch.sliding_window;
    p.num_kv_heads = cache.num_kv_heads;
    p.num_q_heads = num_q_heads;
    p.group = G;
    p.head_dim = D;
    p.row_vecs = static_cast<int>(D * dtype_size(cache.dtype) / 16);
    p.row_vecs_shift = log2_exact(p.row_vecs);
    p.dv_shift = log2_exact(D / kPvElems);
    p.units_shift = log2_exact(gp / kPvHeads) + p.dv_shift;
    p.num_parts = static_cast<int>(parts);
    p.part_tokens = part_tokens;
    p.scale = scale;
    p.ws_out = ws_out;
    p.ws_max = ws_max;
    p.ws_sum = ws_sum;
    const dim3 grid(cache.num_kv_heads, batch.num_seqs, static_cast<unsigned>(parts));
    launch_decode_partitions(decode_kernel(cache.dtype, D, G), p, grid, stream);
  }

  MergeParams mp{};
  mp.context_lens = batch.context_lens;
  mp.window = batch.sliding_window;
  mp.num_q_heads = num_q_heads;
  mp.head_dim = D;
  mp.num_parts = static_cast<int>(parts);
  mp.part_tokens = part_tokens;
  mp.ws_out = ws_out;
  mp.ws_max = ws_max;
  mp.ws_sum = ws_sum;
  mp.out = out;
  mp.out_dtype = out_dtype;
  if (merge_as_dependent()) {
    // Its blocks are scheduled once every partition block has started, and wait in
    // griddepcontrol.wait for the partitions' results instead of for a launch.
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(num_q_heads, batch.num_seqs);
    config.blockDim = dim3(kMergeThreads);
    config.stream = stream;
    cudaLaunchAttribute dependent[1];
    dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = dependent;
    config.numAttrs = 1;
    PAGELLM_CUDA_CHECK(cudaLaunchKernelEx(&config, decode_merge_kernel, mp));
  } else {
    decode_merge_kernel<<<dim3(num_q_heads, batch.num_seqs), kMergeThreads, 0, stream>>>(mp);
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void paged_attention(const float* q, const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                     int32_t num_tokens, int32_t max_q_len, int num_q_heads, float scale, void* out,
                     DType out_dtype, cudaStream_t stream) {
  const int G = check_common("paged_attention", cache, num_q_heads, out_dtype, q, out);
  if (batch.num_seqs <= 0 || num_tokens <= 0 || max_q_len <= 0) return;
  if (batch.num_seqs > 65535)
    throw std::invalid_argument("paged_attention: at most 65535 sequences per batch");
  const int D = cache.head_dim;
  const int queries_per_block = general_rows(D) / G;
  const int64_t qtiles =
      (static_cast<int64_t>(max_q_len) + queries_per_block - 1) / queries_per_block;
  if (qtiles > 65535)
    throw std::invalid_argument("paged_attention: max_q_len " + std::to_string(max_q_len) +
                                " is too long");
  GeneralParams p{};
  p.q = q;
  p.k = static_cast<const uint4*>(cache.k);
  p.v = static_cast<const uint4*>(cache.v);
  p.query_start = batch.query_start;
  p.context_lens = batch.context_lens;
  p.block_tables = batch.block_tables;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.window = batch.sliding_window;
  p.num_kv_heads = cache.num_kv_heads;
  p.num_q_heads = num_q_heads;
  p.group = G;
  p.queries_per_block = queries_per_block;
  p.cache_dtype = cache.dtype;
  p.row_vecs = static_cast<int>(D * dtype_size(cache.dtype) / 16);
  p.row_vecs_shift = log2_exact(p.row_vecs);
  p.scale = scale;
  p.out = out;
  p.out_dtype = out_dtype;
  const dim3 grid(cache.num_kv_heads, static_cast<unsigned>(qtiles), batch.num_seqs);
  with_general_shape(
      D, [&](auto shape) { launch_general<decltype(shape)::kHeadDim>(p, grid, stream); });
}

}  // namespace pagellm::kernels::cuda
