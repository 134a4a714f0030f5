#pragma once
// CPU kernels: the math of one forward pass, as free functions over raw buffers.
// kernels/cuda/ implements the same list with the same contracts; these are the
// reference its tests compare against.
//
// Conventions:
//   - activations are float32, row-major; weights and KV caches may be 16-bit
//   - every array argument has its shape in a comment
//   - batch invariance: each output row is computed by the same operations in the
//     same order whatever the number of rows, the row's place in the batch, or how a
//     prompt was split into chunks. A request's result never depends on its batch.
//   - kernels use every core of the process (OpenMP); the split never changes the
//     order of a row's reductions, so results do not depend on the thread count.

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/penalties.h"

namespace pagellm::kernels::cpu {

inline constexpr int kBlockSize = 16;  // tokens per KV block (see paging/)

// out[t, :] = table[ids[t], :]. Ids outside [0, vocab) are a caller bug: checked by
// the caller, not here.
void embedding(const int32_t* ids,  // [num_tokens]
               int64_t num_tokens,
               const void* table,  // [vocab, hidden] of `dtype`
               DType dtype, int64_t hidden,
               float* out);  // [num_tokens, hidden]

// Memory for a large array that is read in long streams (weights, the KV cache): from
// 1 MiB on, 2 MiB-aligned and advised onto huge pages where the system allows it, so that
// streaming it, or reading its scattered KV blocks, takes far fewer TLB walks; smaller
// arrays are 64-byte aligned. Free with std::free. Throws std::bad_alloc.
void* allocate_streamed(int64_t bytes);

// A Linear weight ([n, k] as Hugging Face stores it) repacked once at load for the CPU
// matmul: panels of 16 outputs, k-major, in the weight's own format (16-bit weights stay
// 16-bit): panel p holds w[16p .. 16p + 16, 0 .. k) as [k][16], the last panel padded
// with zeros. Each output is then one SIMD lane that sums over k in order 0, 1, ..., k-1,
// whatever the number of rows m: decode (m = 1) and prefill (m = 512) round alike.
class PackedWeight {
 public:
  PackedWeight() = default;
  PackedWeight(const void* w,  // [n, k] of `dtype`
               DType dtype, int64_t n, int64_t k);
  DType dtype() const { return dtype_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  const void* data() const { return data_.get(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;  // 64-byte aligned
  int64_t bytes_ = 0;
  DType dtype_ = DType::kF32;
  int64_t n_ = 0, k_ = 0;
};

// y = x w^T + bias: a Linear layer. y[i, j] is a float32 sum over k in index order
// (see PackedWeight), so it does not depend on m or on the row's place in x.
void matmul(const float* x,  // [m, k]
            const PackedWeight& w,
            const float* bias,  // [n] or nullptr
            int64_t m,
            float* y);  // [m, n]

// On a CPU with AMX, matmul over bf16 weights (k >= 32) takes the tile unit's bf16 dot
// products, with x cut into three bf16 parts that sum to it exactly: every product is
// exact, as in the fma path, and the sum is rounded in a different order (results agree
// with matmul_reference to rounding, not bit for bit). Batch invariance and thread-count
// invariance hold on both paths. amx_matmul(): whether matmul takes it now (available
// and not turned off; the portable kernels never take it).
bool amx_matmul_available();
void set_amx_matmul(bool on);
bool amx_matmul();

// The same product straight from the unpacked weight, in the same summation order: the
// reference the packed kernel is tested against (slow; tests and tools only).
void matmul_reference(const float* x,  // [m, k]
                      const void* w,   // [n, k] of `w_dtype`
                      DType w_dtype, const float* bias, int64_t m, int64_t n, int64_t k,
                      float* y);  // [m, n]

// out = x / sqrt(mean(x^2) + eps) * weight, row by row. `out` may alias `x`.
void rmsnorm(const float* x,      // [rows, dim]
             const void* weight,  // [dim] of `w_dtype`
             DType w_dtype, int64_t rows, int64_t dim, float eps,
             float* out);  // [rows, dim]

// residual += x, then out = rmsnorm(residual): the add-and-norm between sublayers.
void add_rmsnorm(float* residual,     // [rows, dim], updated in place
                 const float* x,      // [rows, dim]
                 const void* weight,  // [dim] of `w_dtype`
                 DType w_dtype, int64_t rows, int64_t dim, float eps,
                 float* out);  // [rows, dim]

// Rotary position embedding in the rotate-half layout of Hugging Face Llama: element i
// of a head pairs with element i + head_dim/2, rotated by angle position * inv_freq[i].
void rope(float* q,                  // [num_tokens, num_q_heads, head_dim], in place
          float* k,                  // [num_tokens, num_kv_heads, head_dim], in place
          const int32_t* positions,  // [num_tokens]
          int64_t num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
          const float* inv_freq);  // [head_dim / 2]

// out = silu(gate) * up, elementwise.
void silu_mul(const float* gate,  // [rows, dim]
              const float* up,    // [rows, dim]
              int64_t rows, int64_t dim,
              float* out);  // [rows, dim]

// The same over a fused gate|up projection: out[r, :] = silu(gate_up[r, :dim]) *
// gate_up[r, dim:], each element computed exactly as silu_mul does.
void silu_mul_fused(const float* gate_up,  // [rows, 2 * dim]
                    int64_t rows, int64_t dim,
                    float* out);  // [rows, dim]

// One layer's paged KV cache: K and V each [num_blocks, kBlockSize, num_kv_heads,
// head_dim] of `dtype`; token slot s lives at row s of the flattened first two axes.
struct KVCacheLayer {
  void* k;
  void* v;
  DType dtype;
  int64_t num_blocks;
  int num_kv_heads;
  int head_dim;
};

// Writes the new tokens' keys and values into their slots (converted to the cache's
// dtype, round to nearest even). A negative slot means "do not store" (padding); a slot
// past the cache is skipped too (a caller bug, but never a write out of bounds).
void write_kv(const float* k,        // [num_tokens, num_kv_heads, head_dim]
              const float* v,        // [num_tokens, num_kv_heads, head_dim]
              const int64_t* slots,  // [num_tokens]
              int64_t num_tokens, const KVCacheLayer& cache);

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
                   const KVCacheLayer& cache);

// Copies whole blocks (copy-on-write of a block shared by forked sequences).
void copy_blocks(const KVCacheLayer& cache,
                 const int32_t* src,  // [num_copies]
                 const int32_t* dst,  // [num_copies]
                 int64_t num_copies);

// Attention metadata for a batch of sequences, each with q_len new tokens (1 for a
// decode step, a chunk of the prompt for prefill) whose KV is already in the cache.
struct PagedAttentionBatch {
  int32_t num_seqs;
  const int32_t* query_start;   // [num_seqs + 1] offsets of each sequence's queries
  const int32_t* context_lens;  // [num_seqs] tokens in the cache, this step's included
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq] block ids, row-major
  int32_t max_blocks_per_seq;
  // Keys older than this many positions before the query are not attended (Mistral);
  // 0 means no window. Their block-table entries may be -1.
  int32_t sliding_window;
};

// Causal attention through the page tables. Query j of sequence s (0 <= j < q_len,
// q_len = query_start[s+1] - query_start[s]) is at position p = context_len - q_len + j
// and attends to cached positions [max(0, p - window + 1), p]. Query head h reads KV
// head h / (num_q_heads / num_kv_heads) (GQA/MQA). Softmax in float32.
// out[t] depends only on q[t] and the cache: identical whether computed in a prefill
// chunk or a decode step (chunked-prefill and batch invariance).
void paged_attention(const float* q,  // [num_tokens, num_q_heads, head_dim]
                     const KVCacheLayer& cache, const PagedAttentionBatch& batch, int num_q_heads,
                     float scale,
                     float* out);  // [num_tokens, num_q_heads, head_dim]

// The decode case (q_len == 1 for every sequence), laid out for bandwidth: each KV
// head is read once for all the query heads that share it. Same results as
// paged_attention, bit for bit.
void paged_attention_decode(const float* q,  // [num_seqs, num_q_heads, head_dim]
                            const KVCacheLayer& cache, const PagedAttentionBatch& batch,
                            int num_q_heads, float scale,
                            float* out);  // [num_seqs, num_q_heads, head_dim]

// Applies each row's penalties to its logits in place, as engine/Sampler does before
// choosing a token. For every listed token t of row r (t in [0, vocab)), in this order:
//   x += bias                                      with kPenaltyHasBias
//   x = x > 0 ? x / repetition : x * repetition    if repetition != 1 and t is in the
//                                                  prompt or output_count > 0
//   x -= presence + frequency * output_count       if output_count > 0 and presence or
//                                                  frequency is not 0
// each operation rounded on its own (no fused multiply-add). Unlisted logits are left
// as they are.
void apply_penalties(float* logits,  // [rows, vocab]
                     int64_t rows, int64_t vocab,
                     const PenaltyRow* penalty_rows,  // [rows]
                     const PenaltyToken* tokens);     // [penalty_rows[rows - 1].end]

// Index of the largest value of each row (the first one on ties; NaN never wins).
void argmax(const float* logits,  // [rows, vocab]
            int64_t rows, int64_t vocab,
            int32_t* out);  // [rows]

// Per-row sampling parameters of sample_top_k_top_p (host arrays), as kernels/cuda's
// SamplingRows; the draw is a double here, as engine/Sampler makes it.
struct SamplingRows {
  const float* temperature;  // [rows]; a row with temperature <= 0 is skipped (out untouched)
  const int32_t* top_k;      // [rows] 0 or >= vocab: no limit
  const float* top_p;        // [rows] in (0, 1]; 1: no limit
  const float* min_p;        // [rows] in [0, 1]; 0: no limit
  const double* uniform;     // [rows] in [0, 1): the row's random draw
};

// Samples one token per row: engine/Sampler's draw after its penalties (Sampler calls
// this), and the reference of the CUDA kernel. Weights w = exp(logits * (1 / temperature)
// - max) in float32, with the kernels' exp (within 4e-7 of exact; 0 below e^-87), and 1
// for the largest logit even where it is infinite; weights of 0 and NaN logits are never
// drawn (a row of nothing else gives 0). min-p keeps w >= min_p (the largest weight is
// 1); top-k keeps the k most likely (ties by lower token id); top-p keeps the shortest
// prefix, most likely first, whose mass reaches top_p of the kept mass (at least one
// token); then the first token, most likely first (ties by lower id), where the running
// sum of kept weights exceeds uniform * (kept mass), or the last kept token if none does.
// Masses are summed in double: running sums most likely first, and the kept mass before
// top-p (or, with neither top-k nor top-p, before the draw) in token order. Rows run in
// parallel, each row's token the same on any thread count. Each thread keeps its buffers
// (24 bytes times the vocabulary: 3 MB at 128k) from call to call.
void sample_top_k_top_p(const float* logits,  // [rows, vocab]
                        int64_t rows, int64_t vocab, const SamplingRows& params,
                        int32_t* out);  // [rows]

}  // namespace pagellm::kernels::cpu
