// Elementwise and row-wise CUDA kernels: embedding, norms, bias, rope, SiLU-mul, KV cache
// writes and copies, dtype conversion, random fill. All memory-bound: each reads and
// writes its data once (the norms twice, the second time from cache), 16-byte loads where
// the row length and the pointers allow, scalar loads otherwise. Every launch is checked;
// nothing allocates or synchronizes (decode steps are captured in CUDA graphs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------
// Storage formats: load and store one value, or four consecutive values (one 16-byte
// float4, or one 8-byte pair of 16-bit pairs). Stores round to nearest even.

template <DType T>
__device__ __forceinline__ float load1(const void* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kF16) {
    return __half2float(static_cast<const __half*>(p)[i]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

template <DType T>
__device__ __forceinline__ float bits16_to_float(unsigned int bits) {
  if constexpr (T == DType::kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits)));
  }
}

template <DType T>
__device__ __forceinline__ unsigned int float_to_bits16(float v) {
  if constexpr (T == DType::kF16) {
    return __half_as_ushort(__float2half_rn(v));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// Elements i .. i + 3; p + i must be aligned to 4 elements.
template <DType T>
__device__ __forceinline__ void load4(const void* p, int64_t i, float (&v)[4]) {
  if constexpr (T == DType::kF32) {
    const float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
    // Little endian: the element at the lower address is the low half of each word.
    const uint2 q = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
    v[0] = bits16_to_float<T>(q.x & 0xffffu);
    v[1] = bits16_to_float<T>(q.x >> 16);
    v[2] = bits16_to_float<T>(q.y & 0xffffu);
    v[3] = bits16_to_float<T>(q.y >> 16);
  }
}

template <DType T>
__device__ __forceinline__ void store1(void* p, int64_t i, float v) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (T == DType::kF16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

template <DType T>
__device__ __forceinline__ void store4(void* p, int64_t i, const float (&v)[4]) {
  if constexpr (T == DType::kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    uint2 q;
    q.x = float_to_bits16<T>(v[0]) | (float_to_bits16<T>(v[1]) << 16);
    q.y = float_to_bits16<T>(v[2]) | (float_to_bits16<T>(v[3]) << 16);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = q;
  }
}

// ---------------------------------------------------------------------------------------
// Host side: dtype dispatch, alignment tests, launch shapes.

template <DType T>
using DTypeConstant = std::integral_constant<DType, T>;

// Calls f(DTypeConstant<t>{}) so that kernels are instantiated per storage format.
template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      f(DTypeConstant<DType::kF32>{});
      return;
    case DType::kF16:
      f(DTypeConstant<DType::kF16>{});
      return;
    case DType::kBF16:
      f(DTypeConstant<DType::kBF16>{});
      return;
  }
  throw std::invalid_argument("CUDA kernel: unknown dtype " + std::to_string(static_cast<int>(t)));
}

// True when `p` may be read 4 elements of `t` at a time (16 bytes for float32, 8 for
// 16-bit formats).
bool aligned4(const void* p, DType t) {
  return reinterpret_cast<uintptr_t>(p) % (4 * dtype_size(t)) == 0;
}

constexpr int kRowThreads = 256;           // one block per row: norms, embedding, KV writes
constexpr int kFlatThreads = 256;          // grid-stride elementwise kernels
constexpr int64_t kMaxFlatBlocks = 65536;  // the grid-stride loop covers the rest

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

unsigned flat_blocks(int64_t items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div(items, kFlatThreads), 1, kMaxFlatBlocks));
}

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("CUDA kernel: ") + what);
}

// ---------------------------------------------------------------------------------------
// embedding: block t copies table row ids[t] into out row t.

template <DType T, bool kVec>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const void* __restrict__ table,
                                 int64_t hidden, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t src = static_cast<int64_t>(ids[t]) * hidden;
  float* dst = out + t * hidden;
  if constexpr (kVec) {
    for (int64_t j = 4 * static_cast<int64_t>(threadIdx.x); j < hidden; j += 4 * blockDim.x) {
      float v[4];
      load4<T>(table, src + j, v);
      store4<DType::kF32>(dst, j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
      dst[j] = load1<T>(table, src + j);
  }
}

// ---------------------------------------------------------------------------------------
// rmsnorm and add_rmsnorm: block r normalizes row r. Pass 1 forms the row (adding x
// into the residual for add_rmsnorm) and its sum of squares; a float32 block reduction;
// pass 2 scales each element, as Hugging Face: weight * (v * rsqrt(mean + eps)). Each
// thread reads in pass 2 only what it wrote or read in pass 1 (same element mapping), so
// `out` may alias `x` (and `residual` holds the sum before any thread reads it back).

template <DType W, DType O, bool kAdd, bool kVec>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_kernel(float* residual, const float* x, const void* weight, int64_t dim, float eps,
                   void* out) {
  using BlockReduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename BlockReduce::TempStorage reduce_storage;
  __shared__ float inv_rms;

  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  const float* xr = x + base;
  float* rr = kAdd ? residual + base : nullptr;
  // The row normalized in pass 2: the updated residual, or x itself.
  const float* vr = kAdd ? rr : xr;

  float ss = 0.0f;
  if constexpr (kVec) {
    for (int64_t j = 4 * static_cast<int64_t>(threadIdx.x); j < dim; j += 4 * kRowThreads) {
      float v[4];
      load4<DType::kF32>(xr, j, v);
      if constexpr (kAdd) {
        float r[4];
        load4<DType::kF32>(rr, j, r);
        for (int c = 0; c < 4; ++c)
          v[c] = r[c] + v[c];
        store4<DType::kF32>(rr, j, v);
      }
      for (int c = 0; c < 4; ++c)
        ss += v[c] * v[c];
    }
  } else {
    for (int64_t j = threadIdx.x; j < dim; j += kRowThreads) {
      float v = xr[j];
      if constexpr (kAdd) {
        v = rr[j] + v;
        rr[j] = v;
      }
      ss += v * v;
    }
  }
  const float total = BlockReduce(reduce_storage).Sum(ss);
  if (threadIdx.x == 0) inv_rms = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  __syncthreads();
  const float inv = inv_rms;

  if constexpr (kVec) {
    for (int64_t j = 4 * static_cast<int64_t>(threadIdx.x); j < dim; j += 4 * kRowThreads) {
      float v[4], w[4];
      load4<DType::kF32>(vr, j, v);
      load4<W>(weight, j, w);
      for (int c = 0; c < 4; ++c)
        v[c] = w[c] * (v[c] * inv);
      store4<O>(out, base + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < dim; j += kRowThreads)
      store1<O>(out, base + j, load1<W>(weight, j) * (vr[j] * inv));
  }
}

void launch_rmsnorm(float* residual, const float* x, const void* weight, DType w_dtype,
                    int64_t rows, int64_t dim, float eps, void* out, DType out_dtype,
                    cudaStream_t stream) {
  require(rows >= 0 && dim >= 0, "rmsnorm: negative shape");
  if (rows == 0 || dim == 0) return;
  const bool add = residual != nullptr;
  const bool vec = dim % 4 == 0 && aligned4(x, DType::kF32) && aligned4(weight, w_dtype) &&
                   aligned4(out, out_dtype) && (!add || aligned4(residual, DType::kF32));
  dispatch_dtype(w_dtype, [&](auto w) {
    dispatch_dtype(out_dtype, [&](auto o) {
      constexpr DType W = decltype(w)::value;
      constexpr DType O = decltype(o)::value;
      const unsigned grid = static_cast<unsigned>(rows);
      if (add) {
        if (vec) {
          rmsnorm_kernel<W, O, true, true>
              <<<grid, kRowThreads, 0, stream>>>(residual, x, weight, dim, eps, out);
        } else {
          rmsnorm_kernel<W, O, true, false>
              <<<grid, kRowThreads, 0, stream>>>(residual, x, weight, dim, eps, out);
        }
      } else {
        if (vec) {
          rmsnorm_kernel<W, O, false, true>
              <<<grid, kRowThreads, 0, stream>>>(nullptr, x, weight, dim, eps, out);
        } else {
          rmsnorm_kernel<W, O, false, false>
              <<<grid, kRowThreads, 0, stream>>>(nullptr, x, weight, dim, eps, out);
        }
      }
      PAGELLM_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---------------------------------------------------------------------------------------
// add_bias: grid-stride over the rows * n elements (rows * n / 4 groups of four).

template <bool kVec>
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t rows,
                                int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVec) {
    const int64_t groups_per_row = n / 4;
    const int64_t groups = rows * groups_per_row;
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
         g += stride) {
      const int64_t col = (g % groups_per_row) * 4;
      float v[4], b[4];
      load4<DType::kF32>(y, 4 * g, v);
      load4<DType::kF32>(bias, col, b);
      for (int c = 0; c < 4; ++c)
        v[c] = v[c] + b[c];
      store4<DType::kF32>(y, 4 * g, v);
    }
  } else {
    const int64_t total = rows * n;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += stride)
      y[i] = y[i] + bias[i % n];
  }
}

// ---------------------------------------------------------------------------------------
// rope: block (t, h) rotates head h of token t (query heads, then key heads); thread i
// takes the pairs (i, i + half), (i + blockDim, ...): angle = position * inv_freq[i] in
// float32, as Hugging Face; x0' = x0 cos - x1 sin, x1' = x1 cos + x0 sin, with the CPU
// twin's separate roundings. One block per head rather than per token keeps a single
// decode token spread over many multiprocessors.

constexpr int kRopeThreads = 64;

__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float pos, float inv_freq) {
  float s, c;
  sincosf(__fmul_rn(pos, inv_freq), &s, &c);
  const float a = x0, b = x1;
  x0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  x1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// Rotates one head: pairs (i, i + half) of `src` into `dst` (which may be `src`).
__device__ __forceinline__ void rotate_head(const float* src, float* dst, int half, float pos,
                                            const float* __restrict__ inv_freq) {
  for (int i = threadIdx.x; i < half; i += kRopeThreads) {
    float x0 = src[i], x1 = src[i + half];
    rotate_pair(x0, x1, pos, inv_freq[i]);
    dst[i] = x0;
    dst[i + half] = x1;
  }
}

__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(float* __restrict__ q, float* __restrict__ k, const int32_t* __restrict__ positions,
                int num_q_heads, int num_kv_heads, int head_dim,
                const float* __restrict__ inv_freq) {
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const float pos = static_cast<float>(positions[t]);
  float* head = h < num_q_heads
                    ? q + (t * num_q_heads + h) * static_cast<int64_t>(head_dim)
                    : k + (t * num_kv_heads + (h - num_q_heads)) * static_cast<int64_t>(head_dim);
  rotate_head(head, head, half, pos, inv_freq);
}

// rope_write_kv: block (t, h) takes head h of token t's fused q|k|v row: a query head is
// rotated into q; a KV head's key is rotated and its value copied, both stored at the
// token's slot in the cache (skipped for a negative slot or one past the cache). The same
// arithmetic and rounding as rope followed by write_kv.
template <DType T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_write_kv_kernel(const float* __restrict__ qkv, const int32_t* __restrict__ positions,
                         const int64_t* __restrict__ slots, int num_q_heads, int num_kv_heads,
                         int head_dim, int64_t num_slots, const float* __restrict__ inv_freq,
                         float* __restrict__ q, void* __restrict__ k_cache,
                         void* __restrict__ v_cache) {
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const float pos = static_cast<float>(positions[t]);
  const int64_t width = static_cast<int64_t>(num_q_heads + 2 * num_kv_heads) * head_dim;
  const float* const row = qkv + t * width;
  if (h < num_q_heads) {
    const float* src = row + static_cast<int64_t>(h) * head_dim;
    float* dst = q + (t * num_q_heads + h) * static_cast<int64_t>(head_dim);
    rotate_head(src, dst, half, pos, inv_freq);
    if (head_dim % 2 != 0 && threadIdx.x == 0)  // an odd head_dim's last value: not rotated
      dst[head_dim - 1] = src[head_dim - 1];
    return;
  }
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const int j = h - num_q_heads;
  const float* ks = row + static_cast<int64_t>(num_q_heads + j) * head_dim;
  const float* vs = ks + static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t dst = (slot * num_kv_heads + j) * static_cast<int64_t>(head_dim);
  for (int i = threadIdx.x; i < half; i += kRopeThreads) {
    float x0 = ks[i], x1 = ks[i + half];
    rotate_pair(x0, x1, pos, inv_freq[i]);
    store1<T>(k_cache, dst + i, x0);
    store1<T>(k_cache, dst + i + half, x1);
    store1<T>(v_cache, dst + i, vs[i]);
    store1<T>(v_cache, dst + i + half, vs[i + half]);
  }
  if (head_dim % 2 != 0 && threadIdx.x == 0) {  // an odd head_dim's last value: not rotated
    store1<T>(k_cache, dst + head_dim - 1, ks[head_dim - 1]);
    store1<T>(v_cache, dst + head_dim - 1, vs[head_dim - 1]);
  }
}

// ---------------------------------------------------------------------------------------
// silu_mul_fused: grid-stride over the rows * dim outputs (in groups of four when dim
// allows); s = g / (1 + exp(-g)), out = s * up, as the CPU twin.

__device__ __forceinline__ float silu_mul(float g, float u) {
  const float s = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return __fmul_rn(s, u);
}

template <DType O, bool kVec>
__global__ void silu_mul_kernel(const float* __restrict__ gate_up, int64_t rows, int64_t dim,
                                void* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t per_row = kVec ? dim / 4 : dim;
  const int64_t items = rows * per_row;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += stride) {
    const int64_t r = it / per_row;
    const int64_t d = (it - r * per_row) * (kVec ? 4 : 1);
    const float* g = gate_up + r * 2 * dim + d;
    if constexpr (kVec) {
      float gv[4], uv[4];
      load4<DType::kF32>(g, 0, gv);
      load4<DType::kF32>(g + dim, 0, uv);
      for (int c = 0; c < 4; ++c)
        gv[c] = silu_mul(gv[c], uv[c]);
      store4<O>(out, r * dim + d, gv);
    } else {
      store1<O>(out, r * dim + d, silu_mul(g[0], g[dim]));
    }
  }
}

// ---------------------------------------------------------------------------------------
// write_kv: block t stores token t's K and V rows ([num_kv_heads * head_dim]) at its slot.
// A negative slot is padding; a slot past the cache is a caller bug, skipped rather than
// written out of bounds.

template <DType T, bool kVec>
__global__ void write_kv_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                const int64_t* __restrict__ slots, int64_t row, int64_t num_slots,
                                void* __restrict__ k_cache, void* __restrict__ v_cache) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const float* ks = k + t * row;
  const float* vs = v + t * row;
  const int64_t dst = slot * row;
  if constexpr (kVec) {
    for (int64_t j = 4 * static_cast<int64_t>(threadIdx.x); j < row; j += 4 * blockDim.x) {
      float a[4], b[4];
      load4<DType::kF32>(ks, j, a);
      load4<DType::kF32>(vs, j, b);
      store4<T>(k_cache, dst + j, a);
      store4<T>(v_cache, dst + j, b);
    }
  } else {
    for (int64_t j = threadIdx.x; j < row; j += blockDim.x) {
      store1<T>(k_cache, dst + j, ks[j]);
      store1<T>(v_cache, dst + j, vs[j]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// copy_blocks: block (i, 0) copies copy i's K block, block (i, 1) its V block, in words of
// `Word` (16 bytes when the cache pointers allow; a block is always a multiple of 32 bytes).

template <typename Word>
__global__ void copy_blocks_kernel(void* k_cache, void* v_cache, const int32_t* __restrict__ src,
                                   const int32_t* __restrict__ dst, int64_t num_blocks,
                                   int64_t block_words) {
  const int64_t i = blockIdx.x;
  const int64_t from = src[i], to = dst[i];
  if (from < 0 || from >= num_blocks || to < 0 || to >= num_blocks) return;
  Word* base = static_cast<Word*>(blockIdx.y == 0 ? k_cache : v_cache);
  const Word* s = base + from * block_words;
  Word* d = base + to * block_words;
  for (int64_t j = threadIdx.x; j < block_words; j += blockDim.x)
    d[j] = s[j];
}

// ---------------------------------------------------------------------------------------
// convert and fill_uniform: grid-stride, one value per step.

template <DType I, DType O>
__global__ void convert_kernel(const void* in, void* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store1<O>(out, i, load1<I>(in, i));
}

// splitmix64's output function: a bijective mix of the 64-bit state.
__device__ __forceinline__ uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <DType T>
__global__ void fill_uniform_kernel(void* __restrict__ data, int64_t n, float scale,
                                    uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // Value i of the splitmix64 stream seeded with `seed`: counter-based, so any grid
    // gives the same values.
    const uint64_t h = splitmix64_mix(seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1));
    // 24 random bits: u = k / 2^24 in [0, 1), and 2u - 1 in [-1, 1) exactly in float32.
    const float unit = static_cast<float>(h >> 40) * 0x1p-23f - 1.0f;
    store1<T>(data, i, unit * scale);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Entry points.

void embedding(const int32_t* ids, int64_t num_tokens, const void* table, DType dtype,
               int64_t hidden, float* out, cudaStream_t stream) {
  require(num_tokens >= 0 && hidden >= 0, "embedding: negative shape");
  if (num_tokens == 0 || hidden == 0) return;
  const bool vec = hidden % 4 == 0 && aligned4(table, dtype) && aligned4(out, DType::kF32);
  dispatch_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    const unsigned grid = static_cast<unsigned>(num_tokens);
    if (vec) {
      embedding_kernel<T, true><<<grid, kRowThreads, 0, stream>>>(ids, table, hidden, out);
    } else {
      embedding_kernel<T, false><<<grid, kRowThreads, 0, stream>>>(ids, table, hidden, out);
    }
    PAGELLM_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm(const float* x, const void* weight, DType w_dtype, int64_t rows, int64_t dim,
             float eps, void* out, DType out_dtype, cudaStream_t stream) {
  launch_rmsnorm(nullptr, x, weight, w_dtype, rows, dim, eps, out, out_dtype, stream);
}

void add_rmsnorm(float* residual, const float* x, const void* weight, DType w_dtype, int64_t rows,
                 int64_t dim, float eps, void* out, DType out_dtype, cudaStream_t stream) {
  require(residual != nullptr, "add_rmsnorm: null residual");
  launch_rmsnorm(residual, x, weight, w_dtype, rows, dim, eps, out, out_dtype, stream);
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t n, cudaStream_t stream) {
  require(rows >= 0 && n >= 0, "add_bias: negative shape");
  if (rows == 0 || n == 0) return;
  const bool vec = n % 4 == 0 && aligned4(y, DType::kF32) && aligned4(bias, DType::kF32);
  const unsigned grid = flat_blocks(vec ? rows * n / 4 : rows * n);
  if (vec) {
    add_bias_kernel<true><<<grid, kFlatThreads, 0, stream>>>(y, bias, rows, n);
  } else {
    add_bias_kernel<false><<<grid, kFlatThreads, 0, stream>>>(y, bias, rows, n);
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void rope(float* q, float* k, const int32_t* positions, int64_t num_tokens, int num_q_heads,
          int num_kv_heads, int head_dim, const float* inv_freq, cudaStream_t stream) {
  require(num_tokens >= 0 && num_q_heads >= 0 && num_kv_heads >= 0 && head_dim >= 0,
          "rope: negative shape");
  require(num_q_heads + num_kv_heads <= 65535, "rope: at most 65535 heads");
  const int half = head_dim / 2;
  if (num_tokens == 0 || half == 0 || num_q_heads + num_kv_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(num_q_heads + num_kv_heads));
  rope_kernel<<<grid, kRopeThreads, 0, stream>>>(q, k, positions, num_q_heads, num_kv_heads,
                                                 head_dim, inv_freq);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void rope_write_kv(const float* qkv, const int32_t* positions, const int64_t* slots,
                   int64_t num_tokens, int num_q_heads, const float* inv_freq, float* q,
                   const KVCacheLayer& cache, cudaStream_t stream) {
  require(num_tokens >= 0 && num_q_heads >= 0 && cache.num_kv_heads >= 0 && cache.head_dim >= 0,
          "rope_write_kv: negative shape");
  require(num_q_heads + cache.num_kv_heads <= 65535, "rope_write_kv: at most 65535 heads");
  if (num_tokens == 0 || cache.head_dim == 0 || num_q_heads + cache.num_kv_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(num_q_heads + cache.num_kv_heads));
  const int64_t num_slots = cache.num_blocks * kBlockSize;
  dispatch_dtype(cache.dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    rope_write_kv_kernel<T><<<grid, kRopeThreads, 0, stream>>>(
        qkv, positions, slots, num_q_heads, cache.num_kv_heads, cache.head_dim, num_slots, inv_freq,
        q, cache.k, cache.v);
    PAGELLM_CUDA_CHECK_LAUNCH();
  });
}

void silu_mul_fused(const float* gate_up, int64_t rows, int64_t dim, void* out, DType out_dtype,
                    cudaStream_t stream) {
  require(rows >= 0 && dim >= 0, "silu_mul_fused: negative shape");
  if (rows == 0 || dim == 0) return;
  const bool vec = dim % 4 == 0 && aligned4(gate_up, DType::kF32) && aligned4(out, out_dtype);
  const unsigned grid = flat_blocks(vec ? rows * dim / 4 : rows * dim);
  dispatch_dtype(out_dtype, [&](auto o) {
    constexpr DType O = decltype(o)::value;
    if (vec) {
      silu_mul_kernel<O, true><<<grid, kFlatThreads, 0, stream>>>(gate_up, rows, dim, out);
    } else {
      silu_mul_kernel<O, false><<<grid, kFlatThreads, 0, stream>>>(gate_up, rows, dim, out);
    }
    PAGELLM_CUDA_CHECK_LAUNCH();
  });
}

void write_kv(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
              const KVCacheLayer& cache, cudaStream_t stream) {
  require(num_tokens >= 0, "write_kv: negative token count");
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  if (num_tokens == 0 || row <= 0) return;
  const int64_t num_slots = cache.num_blocks * kBlockSize;
  const bool vec = row % 4 == 0 && aligned4(k, DType::kF32) && aligned4(v, DType::kF32) &&
                   aligned4(cache.k, cache.dtype) && aligned4(cache.v, cache.dtype);
  dispatch_dtype(cache.dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    const unsigned grid = static_cast<unsigned>(num_tokens);
    if (vec) {
      write_kv_kernel<T, true>
          <<<grid, kRowThreads, 0, stream>>>(k, v, slots, row, num_slots, cache.k, cache.v);
    } else {
      write_kv_kernel<T, false>
          <<<grid, kRowThreads, 0, stream>>>(k, v, slots, row, num_slots, cache.k, cache.v);
    }
    PAGELLM_CUDA_CHECK_LAUNCH();
  });
}

void copy_blocks(const KVCacheLayer& cache, const int32_t* src, const int32_t* dst,
                 int64_t num_copies, cudaStream_t stream) {
  require(num_copies >= 0, "copy_blocks: negative count");
  const int64_t block_bytes = static_cast<int64_t>(kBlockSize) * cache.num_kv_heads *
                              cache.head_dim * dtype_size(cache.dtype);
  if (num_copies == 0 || block_bytes <= 0) return;
  require(num_copies <= 0x7fffffff, "copy_blocks: too many copies");
  const dim3 grid(static_cast<unsigned>(num_copies), 2);
  auto aligned_to = [&](int64_t bytes) {
    return reinterpret_cast<uintptr_t>(cache.k) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(cache.v) % bytes == 0 && block_bytes % bytes == 0;
  };
  if (aligned_to(16)) {
    copy_blocks_kernel<uint4><<<grid, kRowThreads, 0, stream>>>(cache.k, cache.v, src, dst,
                                                                cache.num_blocks, block_bytes / 16);
  } else if (aligned_to(4)) {
    copy_blocks_kernel<uint32_t><<<grid, kRowThreads, 0, stream>>>(
        cache.k, cache.v, src, dst, cache.num_blocks, block_bytes / 4);
  } else {
    copy_blocks_kernel<uint8_t><<<grid, kRowThreads, 0, stream>>>(cache.k, cache.v, src, dst,
                                                                  cache.num_blocks, block_bytes);
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void convert(const void* in, DType in_dtype, void* out, DType out_dtype, int64_t n,
             cudaStream_t stream) {
  require(n >= 0, "convert: negative count");
  if (n == 0) return;
  const unsigned grid = flat_blocks(n);
  dispatch_dtype(in_dtype, [&](auto i) {
    dispatch_dtype(out_dtype, [&](auto o) {
      convert_kernel<decltype(i)::value, decltype(o)::value>
          <<<grid, kFlatThreads, 0, stream>>>(in, out, n);
      PAGELLM_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill_uniform(void* data, DType dtype, int64_t n, float scale, uint64_t seed,
                  cudaStream_t stream) {
  require(n >= 0, "fill_uniform: negative count");
  if (n == 0) return;
  const unsigned grid = flat_blocks(n);
  dispatch_dtype(dtype, [&](auto t) {
    fill_uniform_kernel<decltype(t)::value>
        <<<grid, kFlatThreads, 0, stream>>>(data, n, scale, seed);
    PAGELLM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pagellm::kernels::cuda
