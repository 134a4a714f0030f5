#pragma once
// CUDA kernels: the same list as kernels/cpu/kernels.h, with the same contracts, over
// device pointers, each enqueued on `stream` (no synchronization, no allocation, so a
// decode step can be captured in a CUDA graph). The CPU versions are the reference
// tests/cuda compares these against.
//
// Differences from the CPU contracts, all about number formats:
//   - Outputs that feed a matmul (norms, attention, silu-mul) are written in an
//     activation dtype `out_dtype`: the weights' 16-bit format, so that cuBLAS reads
//     16-bit operands, or float32 for a float32 pass. Values are computed in float32
//     and rounded once, to nearest even, when stored.
//   - Sums run in a different order than on the CPU (warp and block reductions), so
//     results agree with the CPU twin to rounding, not bit for bit.
// This header includes no CUDA header: it can be read by plain C++ code.

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/penalties.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace pagellm::kernels::cuda {

inline constexpr int kBlockSize = 16;  // tokens per KV block (see paging/)

// out[t, :] = table[ids[t], :], converted to float32.
void embedding(const int32_t* ids,  // [num_tokens]
               int64_t num_tokens,
               const void* table,  // [vocab, hidden] of `dtype`
               DType dtype, int64_t hidden,
               float* out,  // [num_tokens, hidden]
               cudaStream_t stream);

// out = x / sqrt(mean(x^2) + eps) * weight, row by row, stored as `out_dtype`. `out`
// may alias `x` when out_dtype is float32.
void rmsnorm(const float* x,      // [rows, dim]
             const void* weight,  // [dim] of `w_dtype`
             DType w_dtype, int64_t rows, int64_t dim, float eps,
             void* out,  // [rows, dim] of `out_dtype`
             DType out_dtype, cudaStream_t stream);

// residual += x (float32), then out = rmsnorm(residual) stored as `out_dtype`.
void add_rmsnorm(float* residual,     // [rows, dim], updated in place
                 const float* x,      // [rows, dim]
                 const void* weight,  // [dim] of `w_dtype`
                 DType w_dtype, int64_t rows, int64_t dim, float eps,
                 void* out,  // [rows, dim] of `out_dtype`
                 DType out_dtype, cudaStream_t stream);

// y[r, :] += bias (float32), row by row.
void add_bias(float* y,           // [rows, n], in place
              const float* bias,  // [n]
              int64_t rows, int64_t n, cudaStream_t stream);

// Rotary position embedding, rotate-half layout (see the CPU contract).
void rope(float* q,                  // [num_tokens, num_q_heads, head_dim], in place
          float* k,                  // [num_tokens, num_kv_heads, head_dim], in place
          const int32_t* positions,  // [num_tokens]
          int64_t num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
          const float* inv_freq,  // [head_dim / 2]
          cudaStream_t stream);

// out[r, :] = silu(gate_up[r, :dim]) * gate_up[r, dim:], stored as `out_dtype`.
void silu_mul_fused(const float* gate_up,  // [rows, 2 * dim]
                    int64_t rows, int64_t dim,
                    void* out,  // [rows, dim] of `out_dtype`
                    DType out_dtype, cudaStream_t stream);

// One layer's paged KV cache in device memory: K and V each [num_blocks, kBlockSize,
// num_kv_heads, head_dim] of `dtype`; token slot s is row s of the first two axes.
struct KVCacheLayer {
  void* k;
  void* v;
  DType dtype;
  int64_t num_blocks;
  int num_kv_heads;
  int head_dim;
};

// Writes the new tokens' K and V into their slots, rounded to nearest even to the
// cache dtype. A negative slot means "do not store" (padding); a slot past the cache is
// skipped too (a caller bug, but never a write out of bounds).
void write_kv(const float* k,        // [num_tokens, num_kv_heads, head_dim]
              const float* v,        // [num_tokens, num_kv_heads, head_dim]
              const int64_t* slots,  // [num_tokens]
              int64_t num_tokens, const KVCacheLayer& cache, cudaStream_t stream);

// rope and write_kv in one pass over a fused projection: for each token, the query heads
// of its q|k|v row are rotated into `q`, and its keys (rotated) and values are stored at
// its slot in the cache (a slot that is negative or beyond the cache stores nothing). The
// same values, bit for bit, as splitting the row and calling rope then write_kv.
void rope_write_kv(const float* qkv,          // [num_tokens, (num_q_heads + 2 kv heads) x head_dim]
                   const int32_t* positions,  // [num_tokens]
                   const int64_t* slots,      // [num_tokens]
                   int64_t num_tokens, int num_q_heads,
                   const float* inv_freq,  // [head_dim / 2]
                   float* q,               // [num_tokens, num_q_heads, head_dim], out
                   const KVCacheLayer& cache, cudaStream_t stream);

// Copies whole blocks (copy-on-write of a block shared by forked sequences). The copies
// run in parallel: no block may be both a destination and a source in one call (the CPU
// twin copies one after another). Block ids outside the cache are skipped.
void copy_blocks(const KVCacheLayer& cache,
                 const int32_t* src,  // [num_copies]
                 const int32_t* dst,  // [num_copies]
                 int64_t num_copies, cudaStream_t stream);

// Attention metadata, as on the CPU; every pointer is device memory.
struct PagedAttentionBatch {
  int32_t num_seqs;
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs] tokens in the cache, this step's included
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq;
  int32_t sliding_window;  // 0: none
};

// Causal attention through the page tables, any q_len per sequence (prefill, chunked
// prefill, mixed batches): the CPU contract of paged_attention. `max_q_len` bounds every
// sequence's q_len. Softmax in float32.
// Both attention kernels take head_dim 16, 32, 64, 128 or 256 and up to 16 query heads
// per KV head (num_q_heads a multiple of num_kv_heads); other shapes throw
// std::invalid_argument. q, out, the cache's k and v (and the decode workspace) must be
// 16-byte aligned. A row's result does not depend on the rest of its batch, nor (here) on
// how its prompt was cut into chunks; the two kernels agree with each other to float32
// rounding, not bit for bit. In decode this holds for a given partition length: the
// automatic length (decode_partition_tokens) depends on the grid, so a sequence alone
// may be cut into shorter partitions than in a large batch, and its sums then round
// differently.
void paged_attention(const float* q,  // [num_tokens, num_q_heads, head_dim]
                     const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                     int32_t num_tokens, int32_t max_q_len, int num_q_heads, float scale,
                     void* out,  // [num_tokens, num_q_heads, head_dim] of `out_dtype`
                     DType out_dtype, cudaStream_t stream);

// Decode attention (q_len == 1 for every sequence), flash-decoding: each sequence's
// context is cut into partitions read by separate thread blocks, each reading every KV
// head once for all the query heads that share it; a second kernel merges the
// partitions' softmax statistics. The grid covers `max_context` (so a captured graph
// stays valid for any batch whose contexts are at most that); partitions past a
// sequence's context do nothing. A sequence with context_len 0 (a padding row of a
// captured batch) gets zero output.
inline constexpr int kDecodeMaxPartitionTokens = 512;
inline constexpr int kDecodeMinPartitionTokens = 64;
// Partitions are 512 tokens, halved (down to 64) while the grid, num_seqs x num_kv_heads
// x partitions of max_context, would have fewer than this many blocks per multiprocessor
// of the current device: a single sequence, or a few short ones, then still spread over
// the whole GPU. Each block pays a fixed start-up cost (its first load's full latency,
// the softmax barriers, the final reduction), so longer grids keep 512 tokens: on an
// H200 shorter partitions were slower at every batch x context that already had two
// blocks per multiprocessor.
inline constexpr int kDecodeTargetBlocksPerSM = 2;
int decode_partition_tokens(int32_t num_seqs, int num_kv_heads, int32_t max_context);
// The same choice for a device with `multiprocessors` SMs (needs no device).
int decode_partition_tokens_on(int32_t num_seqs, int num_kv_heads, int32_t max_context,
                               int multiprocessors);

// Whether both attention kernels take this shape (head_dim 16, 32, 64, 128 or 256; at
// most 16 query heads per KV head): a model can be checked when it loads.
bool paged_attention_supports(int head_dim, int num_q_heads, int num_kv_heads);
// Whether paged_attention_decode runs on tensor cores for this cache (bf16 or f16 at
// head_dim 64, 128 or 256, unless PAGELLM_DECODE_MMA=0); else on CUDA cores. Both give
// float32-accurate results.
bool paged_attention_decode_tensor_cores(DType cache_dtype, int head_dim);

// Dynamic shared memory per thread block, in bytes, that the attention kernels launch
// with for this shape (the largest of the decode kernel it runs and the general kernel). Over 48
// KiB they ask for it with cudaFuncSetAttribute, which fails on a device whose limit per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on Hopper, 163 KiB on A100, 99 KiB on other
// Ampere and Ada GPUs) is lower: a backend compares the two when the model loads. Throws
// std::invalid_argument for a shape the kernels do not take.
size_t paged_attention_shared_bytes(int head_dim, int num_q_heads, int num_kv_heads,
                                    DType cache_dtype);
// Of that, what the decode partition kernel's layout takes (needs no device): with the 1
// KiB each block reserves, it says how many blocks share a multiprocessor's shared memory.
// PAGELLM_DECODE_MAX_BLOCKS_PER_SM=N (for comparison only) launches it with more, so
// that at most N blocks fit.
size_t paged_attention_decode_shared_bytes(int head_dim, int num_q_heads, int num_kv_heads,
                                           DType cache_dtype);
// Blocks of the decode partition kernel that one multiprocessor of the current device
// runs at once for this shape (the occupancy calculator's count: shared memory, registers
// and threads), with the shared memory it is launched with.
int paged_attention_decode_blocks_per_sm(int head_dim, int num_q_heads, int num_kv_heads,
                                         DType cache_dtype);

// Float32 scratch the decode kernel needs, in bytes. `partition_tokens` as for
// paged_attention_decode.
size_t paged_attention_decode_workspace_bytes(int32_t num_seqs, int num_q_heads, int num_kv_heads,
                                              int head_dim, int32_t max_context,
                                              int partition_tokens = 0);

// The most scratch any batch of at most `max_seqs` sequences, at contexts up to
// `max_context`, needs with the automatic partition length: a smaller batch can need
// more than the largest one, its partitions being shorter. `multiprocessors` 0: the
// current device's.
size_t paged_attention_decode_workspace_bound(int32_t max_seqs, int num_q_heads, int num_kv_heads,
                                              int head_dim, int32_t max_context,
                                              int multiprocessors = 0);

// `partition_tokens`: 0 for decode_partition_tokens(), or a multiple of 64 from 64 to 512
// (benchmarks and tests); the workspace must have been sized with the same value.
void paged_attention_decode(const float* q,  // [num_seqs, num_q_heads, head_dim]
                            const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                            int32_t max_context, int num_q_heads, float scale,
                            void* workspace,  // paged_attention_decode_workspace_bytes(...)
                            void* out,        // [num_seqs, num_q_heads, head_dim] of `out_dtype`
                            DType out_dtype, cudaStream_t stream, int partition_tokens = 0);

// Applies each row's penalties to its logits in place, exactly as kernels::cpu's
// apply_penalties (the same operations, each rounded on its own, so the same bits). One
// thread block per row; a row lists each token at most once, so no two threads write
// the same logit.
void apply_penalties(float* logits,  // [rows, vocab]
                     int64_t rows, int64_t vocab,
                     const PenaltyRow* penalty_rows,  // [rows] device memory
                     const PenaltyToken* tokens,      // [penalty_rows[rows - 1].end] device
                     cudaStream_t stream);

// Index of the largest value of each row (the first one on ties); NaN never wins.
void argmax(const float* logits,  // [rows, vocab]
            int64_t rows, int64_t vocab,
            int32_t* out,  // [rows]
            cudaStream_t stream);

// Per-row sampling parameters for sample_top_k_top_p (device arrays).
struct SamplingRows {
  const float* temperature;  // [rows]; a row with temperature <= 0 is skipped (out untouched)
  const int32_t* top_k;      // [rows] 0 or >= vocab: no limit
  const float* top_p;        // [rows] in (0, 1]
  const float* min_p;        // [rows] in [0, 1]; 0: no limit
  const float* uniform;      // [rows] in [0, 1): the row's random draw
};

// Samples one token per row, as engine/Sampler draws after its penalties: weights
// w = exp(logits / temperature - max); min-p keeps w >= min_p (the largest weight is 1);
// top-k keeps the k most likely (ties by lower token id); top-p keeps the shortest
// prefix, most likely first, whose mass reaches top_p of the kept mass (at least one
// token); then the token where the running sum of kept weights, most likely first,
// first exceeds uniform * (kept mass) (the last kept token if none does). Weights in
// float32 (the device's expf and the CPU's exp each within a few ulp); masses as integers
// (each weight rounded to a multiple of 2^-S, S = block_sampler::mass_shift(vocab):
// 2^-46 at 128k), so a draw that falls within rounding of a boundary may differ from the
// CPU twin kernels::cpu::sample_top_k_top_p, which sums in double; the integer sums do not
// depend on the order of the additions, so a row's token depends on that row alone. NaN
// logits are never drawn. One thread block per row, no sort: a radix select over the
// ranking (block_sampler.h): typically three to seven passes over the row (about six
// for a flat row of 128k at top-p 0.95, four for a peaked one), more when thousands of
// tokens tie on one weight (their ids are split digit by digit).
void sample_top_k_top_p(const float* logits,  // [rows, vocab]
                        int64_t rows, int64_t vocab, const SamplingRows& params,
                        int32_t* out,  // [rows]
                        cudaStream_t stream);

// Matmuls through cuBLAS (or, for up to kGemvMaxRows rows of 16-bit operands, the gemv
// kernel): y = x w^T for a Linear weight w ([n, k] as Hugging Face
// stores it, row-major, in device memory), x in the same dtype as w, y in float32, with
// float32 accumulation (for float32 weights, true float32: no TF32). One per stream;
// its workspace is allocated once, so matmuls can be captured in a CUDA graph.
// Unlike the CPU matmul this is not batch-invariant: cuBLAS picks its kernel (and its
// split of k) by shape, so a row's rounding can change with m, and a request's tokens
// with what else is in its batch, as in other GPU servers.
class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  void matmul(const void* x,  // [m, k] of `dtype`
              const void* w,  // [n, k] of `dtype`
              DType dtype, int64_t m, int64_t n, int64_t k,
              float* y,  // [m, n]
              // false: cuBLAS whatever the shape (a weight so large that cuBLAS already
              // streams it at the copy rate, such as an LM head)
              bool allow_gemv = true);
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_;
  void* handle_ = nullptr;     // cublasHandle_t
  void* workspace_ = nullptr;  // device memory for cuBLAS
};

// y = x w^T as Blas::matmul, for 1 to kGemvMaxRows rows of x and 16-bit weights, with k a
// multiple of 8 and x and w 16-byte aligned (gemv_supports): a kernel that streams the
// weights once, which cuBLAS's kernels for so few rows do not do at full bandwidth.
// Blas::matmul takes this path for such shapes. float32 sums, in another order than the
// CPU's. Up to 2 rows: on an H200, Llama 3 8B's shape decodes about 4% faster through it
// at batch 1 and 2 than through cuBLAS, and 2% to 4% slower at batch 3 and 4.
inline constexpr int kGemvMaxRows = 2;
bool gemv_supports(DType dtype, int64_t m, int64_t n, int64_t k, const void* x, const void* w);
void gemv(const void* x,  // [m, k] of `dtype`
          const void* w,  // [n, k] of `dtype`
          DType dtype, int64_t m, int64_t n, int64_t k,
          float* y,  // [m, n]
          cudaStream_t stream);

// Converts n values between dtypes (float32 <-> 16-bit), rounding to nearest even.
void convert(const void* in, DType in_dtype, void* out, DType out_dtype, int64_t n,
             cudaStream_t stream);

// Fills n values of `dtype` with uniform random numbers in [-scale, scale) (rounded to
// `dtype`, so a 16-bit value may reach scale itself), from a counter-based generator:
// value i depends only on the seed and i, so the same seed gives the same values
// (benchmarks make models on the device this way).
void fill_uniform(void* data, DType dtype, int64_t n, float scale, uint64_t seed,
                  cudaStream_t stream);

}  // namespace pagellm::kernels::cuda
