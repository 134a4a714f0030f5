#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/forward_batch_builder.h"
#include "engine/kv_cache_memory.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "engine/tokenizer_config.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::engine {
namespace cuda = kernels::cuda;
using kernels::DType;

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {

// Device memory (cudaMalloc) or page-locked host memory (cudaMallocHost: fast,
// asynchronous copies), freed on destruction.
enum class Where { kDevice, kPinnedHost };

template <Where kWhere>
class CudaMemory {
 public:
  CudaMemory() = default;
  explicit CudaMemory(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    if (kWhere == Where::kDevice) {
      PAGELLM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    } else {
      PAGELLM_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
    }
  }
  CudaMemory(CudaMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~CudaMemory() {
    if (ptr_ == nullptr) return;
    if (kWhere == Where::kDevice) {
      cudaFree(ptr_);
    } else {
      cudaFreeHost(ptr_);
    }
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};
using DeviceMemory = CudaMemory<Where::kDevice>;
using PinnedMemory = CudaMemory<Where::kPinnedHost>;

// Copies n values of `from` at host address `src` into device memory as `to`,
// converting on the host only when the formats differ.
void copy_to_device(void* dst, const void* src, DType from, DType to, int64_t n) {
  const size_t bytes = static_cast<size_t>(n * kernels::dtype_size(to));
  if (from == to) {
    PAGELLM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return;
  }
  std::vector<unsigned char> converted(bytes);
  for (int64_t i = 0; i < n; ++i)
    kernels::store_f32(converted.data(), to, i, kernels::load_f32(src, from, i));
  PAGELLM_CUDA_CHECK(cudaMemcpy(dst, converted.data(), bytes, cudaMemcpyHostToDevice));
}

// Decode graphs are captured for these batch sizes; a batch runs in the smallest that
// holds it (the extra rows are padding that writes nothing).
constexpr int32_t kGraphBatchSizes[] = {1,   2,   4,   8,   16,  24,  32,  48,  64, 96,
                                        128, 160, 192, 224, 256, 320, 384, 448, 512};
constexpr int32_t kMinGraphContext = 512;
// Contexts the decode attention workspace is sized for at start-up (longer steps grow it).
constexpr int64_t kWorkspaceContextAtStart = 131072;

// The captured batch size a batch of `seqs` runs in; none above the largest.
std::optional<int32_t> graph_batch_size(int32_t seqs) {
  const int32_t* b =
      std::lower_bound(std::begin(kGraphBatchSizes), std::end(kGraphBatchSizes), seqs);
  if (b == std::end(kGraphBatchSizes)) return std::nullopt;
  return *b;
}

int64_t round_up_pow2(int64_t v, int64_t at_least) {
  int64_t p = at_least;
  while (p < v)
    p *= 2;
  return p;
}

// Page-locked staging for one step's inputs: taken in order, reset every step (each
// step ends with a stream synchronization, so the previous step's copies are done).
class Staging {
 public:
  void reserve(size_t bytes) {
    if (bytes > capacity_) {
      memory_ = PinnedMemory(bytes);
      capacity_ = bytes;
    }
    used_ = 0;
  }
  void reset() { used_ = 0; }
  template <typename T>
  T* take(size_t n) {
    const size_t start = (used_ + 15) / 16 * 16;
    const size_t bytes = n * sizeof(T);
    if (start + bytes > capacity_) throw std::logic_error("CUDA backend: input staging overflow");
    used_ = start + bytes;
    return reinterpret_cast<T*>(memory_.get<unsigned char>() + start);
  }

 private:
  PinnedMemory memory_;
  size_t capacity_ = 0, used_ = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(ModelConfig config, const BackendOptions& options, DType weight_dtype)
      : config_(std::move(config)), options_(options) {
    PAGELLM_CUDA_CHECK(cudaSetDevice(options.device));
    cudaDeviceProp prop{};
    PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device));
    device_name_ = prop.name;
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    blas_ = std::make_unique<cuda::Blas>(stream_);
    compute_dtype_ = options.float32_compute ? DType::kF32 : weight_dtype;
    const int64_t max_len =
        options.max_model_len > 0 ? options.max_model_len : config_.context_length();
    if (max_len > (int64_t(1) << 30)) {
      throw ConfigError("backend cuda: max_model_len " + std::to_string(max_len) +
                        " is over 2^30 tokens (set --max-model-len)");
    }
    max_model_len_ = static_cast<int32_t>(max_len);
    const int64_t D = config_.head_dim;
    if (!cuda::paged_attention_supports(static_cast<int>(D), static_cast<int>(config_.num_heads),
                                        static_cast<int>(config_.num_kv_heads))) {
      throw ConfigError(
          "backend cuda: attention supports head_dim 16, 32, 64, 128 or 256 and "
          "at most 16 query heads per KV head; this model has head_dim " +
          std::to_string(D) + ", " + std::to_string(config_.num_heads) + " query and " +
          std::to_string(config_.num_kv_heads) + " KV heads (serve it with --backend cpu)");
    }
    // Before the weights go up: the KV cache will have the model's dtype.
    check_attention_fits(default_kv_dtype(config_));
    q_dim_ = config_.num_heads * D;
    kv_dim_ = config_.num_kv_heads * D;
  }

  ~CudaBackend() override {
    cudaSetDevice(options_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    graphs_.clear();
    blas_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Weights from a checkpoint (host memory-mapped), converted to the compute dtype
  // where they differ from it.
  void upload(const ModelWeights& w) {
    embed_dtype_ = w.embed_tokens.dtype;
    embed_ = upload_tensor(w.embed_tokens, embed_dtype_);
    final_norm_ = upload_tensor(w.final_norm, w.final_norm.dtype);
    final_norm_dtype_ = w.final_norm.dtype;
    // Tied embeddings in the compute dtype serve as lm_head too: one copy on the device.
    if (w.lm_head.data == w.embed_tokens.data && embed_dtype_ == compute_dtype_) {
      lm_head_weights_ = embed_.get();
    } else {
      lm_head_ = upload_tensor(w.lm_head, compute_dtype_);
      lm_head_weights_ = lm_head_.get();
    }
    for (const LayerWeights& src : w.layers) {
      Layer dst;
      dst.qkv = upload_concat({&src.q_proj, &src.k_proj, &src.v_proj});
      if (src.q_bias || src.k_bias || src.v_bias) {
        // float32 q|k|v bias; a part the model lacks stays zero.
        dst.qkv_bias = DeviceMemory((q_dim_ + 2 * kv_dim_) * sizeof(float));
        PAGELLM_CUDA_CHECK(cudaMemset(dst.qkv_bias.get(), 0, dst.qkv_bias.bytes()));
        const std::optional<TensorView>* parts[] = {&src.q_bias, &src.k_bias, &src.v_bias};
        const int64_t offsets[] = {0, q_dim_, q_dim_ + kv_dim_};
        const int64_t sizes[] = {q_dim_, kv_dim_, kv_dim_};
        for (int i = 0; i < 3; ++i) {
          if (!*parts[i]) continue;
          copy_to_device(dst.qkv_bias.get<float>() + offsets[i], (*parts[i])->data,
                         (*parts[i])->dtype, DType::kF32, sizes[i]);
        }
      }
      dst.o = upload_tensor(src.o_proj, compute_dtype_);
      dst.gate_up = upload_concat({&src.gate_proj, &src.up_proj});
      dst.down = upload_tensor(src.down_proj, compute_dtype_);
      dst.input_norm = upload_tensor(src.input_norm, src.input_norm.dtype);
      dst.input_norm_dtype = src.input_norm.dtype;
      dst.post_norm = upload_tensor(src.post_attention_norm, src.post_attention_norm.dtype);
      dst.post_norm_dtype = src.post_attention_norm.dtype;
      if (src.q_norm) {
        dst.q_norm = upload_tensor(*src.q_norm, src.q_norm->dtype);
        dst.k_norm = upload_tensor(*src.k_norm, src.k_norm->dtype);
        dst.qk_norm_dtype = src.q_norm->dtype;
        dst.k_norm_dtype = src.k_norm->dtype;
      }
      layers_.push_back(std::move(dst));
    }
    finish_setup();
  }

  // Random weights of the model's shape, made on the device (benchmarks). Norm weights
  // are near 1 so activations keep a realistic scale.
  void randomize(uint64_t seed) {
    const ModelConfig& c = config_;
    const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    auto random = [&](int64_t n, float scale) {
      DeviceMemory m(static_cast<size_t>(n * kernels::dtype_size(compute_dtype_)));
      cuda::fill_uniform(m.get(), compute_dtype_, n, scale, seed++, stream_);
      return m;
    };
    auto norm = [&](int64_t n) {
      std::vector<float> host(n);
      for (int64_t i = 0; i < n; ++i)
        host[i] = 1.0f + 0.01f * static_cast<float>((i * 7919) % 13 - 6);
      DeviceMemory m(static_cast<size_t>(n * kernels::dtype_size(compute_dtype_)));
      copy_to_device(m.get(), host.data(), DType::kF32, compute_dtype_, n);
      return m;
    };
    embed_dtype_ = compute_dtype_;
    embed_ = random(V * H, 1.0f);
    final_norm_ = norm(H);
    final_norm_dtype_ = compute_dtype_;
    lm_head_ = random(V * H, 1.0f / std::sqrt(static_cast<float>(H)));
    lm_head_weights_ = lm_head_.get();
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(H));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer dst;
      dst.qkv = random((q_dim_ + 2 * kv_dim_) * H, in_scale);
      dst.o = random(H * q_dim_, 1.0f / std::sqrt(static_cast<float>(q_dim_)));
      dst.gate_up = random(2 * I * H, in_scale);
      dst.down = random(H * I, 1.0f / std::sqrt(static_cast<float>(I)));
      dst.input_norm = norm(H);
      dst.post_norm = norm(H);
      dst.input_norm_dtype = dst.post_norm_dtype = compute_dtype_;
      if (c.qk_norm) {
        dst.q_norm = norm(c.head_dim);
        dst.k_norm = norm(c.head_dim);
        dst.qk_norm_dtype = dst.k_norm_dtype = compute_dtype_;
      }
      layers_.push_back(std::move(dst));
    }
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    finish_setup();
  }

  std::string_view name() const override { return "cuda"; }
  std::string device_description() const override {
    size_t free = 0, total = 0;
    cudaSetDevice(options_.device);
    cudaMemGetInfo(&free, &total);
    return device_name_ + " (device " + std::to_string(options_.device) + ", " +
           std::to_string(total >> 20) + " MiB, " + std::to_string(weight_bytes_ >> 20) +
           " MiB of weights in " + kernels::dtype_name(compute_dtype_) + ")";
  }
  const ModelConfig& config() const override { return config_; }
  int64_t weight_bytes_per_step() const override { return weight_bytes_; }

  std::optional<int64_t> kv_cache_budget(double fraction) const override {
    size_t free = 0, total = 0;
    PAGELLM_CUDA_CHECK(cudaSetDevice(options_.device));
    PAGELLM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(static_cast<double>(free) * fraction);
  }

  void allocate_kv_cache(int64_t num_blocks, DType dtype) override {
    if (!kv_.empty()) throw std::logic_error("the KV cache is allocated once");
    PAGELLM_CUDA_CHECK(cudaSetDevice(options_.device));
    check_attention_fits(dtype);
    const int64_t per_tensor = num_blocks * cuda::kBlockSize * kv_dim_ * kernels::dtype_size(dtype);
    kv_memory_ = DeviceMemory(static_cast<size_t>(2 * config_.num_layers * per_tensor));
    // Zeroed, as on the CPU: a block is always written before it is read, but a clean
    // pool makes a stray read show as zeros rather than as old data.
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(kv_memory_.get(), 0, kv_memory_.bytes(), stream_));
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      unsigned char* base = kv_memory_.get<unsigned char>() + 2 * l * per_tensor;
      kv_.push_back({base, base + per_tensor, dtype, num_blocks,
                     static_cast<int>(config_.num_kv_heads), static_cast<int>(config_.head_dim)});
    }
  }
  int64_t kv_cache_bytes() const override { return static_cast<int64_t>(kv_memory_.bytes()); }

  // The attention kernels' shared memory per block for this model and cache dtype against
  // the device's limit: refused when the model loads rather than at its first request.
  // (Called again with the dtype the pool is allocated in.)
  void check_attention_fits(DType dtype) const {
    const auto D = static_cast<int>(config_.head_dim);
    const auto heads = static_cast<int>(config_.num_heads);
    const auto kv_heads = static_cast<int>(config_.num_kv_heads);
    const size_t need = cuda::paged_attention_shared_bytes(D, heads, kv_heads, dtype);
    int limit = 0;
    PAGELLM_CUDA_CHECK(
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, options_.device));
    if (need > static_cast<size_t>(limit)) {
      throw ConfigError("backend cuda: attention over a " +
                        std::string(kernels::dtype_name(dtype)) + " KV cache with head_dim " +
                        std::to_string(D) + " and " + std::to_string(heads / kv_heads) +
                        " query heads per KV head needs " + std::to_string((need + 1023) / 1024) +
                        " KiB of shared memory per thread block, and the " + device_name_ +
                        " allows " + std::to_string(limit / 1024) +
                        " KiB (serve this model with --backend cpu)");
    }
  }

  void forward(const ForwardBatch& batch, ForwardOutput& out) override;

 private:
  struct Layer {
    DeviceMemory qkv, qkv_bias, o, gate_up, down;  // projections in compute_dtype_
    DeviceMemory input_norm, post_norm, q_norm, k_norm;
    DType input_norm_dtype = DType::kF32, post_norm_dtype = DType::kF32,
          qk_norm_dtype = DType::kF32, k_norm_dtype = DType::kF32;
  };

  // The shape of one step, as the kernels see it.
  struct Step {
    int32_t tokens = 0;
    int32_t seqs = 0;
    int32_t logit_rows = 0;
    int32_t max_q_len = 0;
    int32_t table_width = 0;  // block-table row length
    int32_t max_context = 0;  // decode: the attention grid covers this many tokens
    bool decode = false;
  };

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };

  // Straight from the checkpoint's mapping when the format is already `to`.
  DeviceMemory upload_tensor(const TensorView& t, DType to) { return upload_concat({&t}, to); }
  // Row-wise concatenation ([n1 + n2 + ..., k]) of weights that read the same input.
  DeviceMemory upload_concat(std::initializer_list<const TensorView*> parts,
                             std::optional<DType> to = std::nullopt) {
    const DType dtype = to.value_or(compute_dtype_);
    int64_t n = 0;
    for (const TensorView* t : parts)
      n += t->num_elements();
    DeviceMemory m(static_cast<size_t>(n * kernels::dtype_size(dtype)));
    unsigned char* at = m.get<unsigned char>();
    for (const TensorView* t : parts) {
      copy_to_device(at, t->data, t->dtype, dtype, t->num_elements());
      at += t->num_elements() * kernels::dtype_size(dtype);
    }
    return m;
  }

  void finish_setup();
  void run_step(const ForwardBatch& batch, ForwardOutput& out);  // forward, minus recovery
  void ensure_capacity(int32_t tokens, int32_t seqs, int32_t table_width);
  void ensure_workspace(int32_t seqs, int32_t max_context);
  void reserve_workspace(size_t bytes);
  void capture(const Step& step, std::pair<int32_t, int32_t> key);
  void upload_inputs(const ForwardBatch& batch, const Step& step, int32_t padded_seqs);
  void apply_penalties(const ForwardBatch& batch);  // then the argmax again, on stream_
  void enqueue(const Step& step);  // the whole pass, embedding to argmax, on stream_
  cuda::KVCacheLayer layer_cache(int64_t l) const { return kv_[static_cast<size_t>(l)]; }

  ModelConfig config_;
  BackendOptions options_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Blas> blas_;
  DType compute_dtype_ = DType::kBF16;
  int32_t max_model_len_ = 0;
  int64_t q_dim_ = 0, kv_dim_ = 0;
  int64_t weight_bytes_ = 0;

  // Weights.
  DeviceMemory embed_, final_norm_, lm_head_, inv_freq_;
  const void* lm_head_weights_ = nullptr;  // lm_head_, or embed_ when they are tied
  DType embed_dtype_ = DType::kBF16, final_norm_dtype_ = DType::kBF16;
  std::vector<Layer> layers_;

  // KV pool: per layer K then V, [num_blocks, 16, kv_heads, head_dim] each.
  DeviceMemory kv_memory_;
  std::vector<cuda::KVCacheLayer> kv_;

  // Activations and step inputs, sized for the largest step (ensure_capacity).
  int32_t cap_tokens_ = 0, cap_seqs_ = 0, cap_width_ = 0;
  DeviceMemory hidden_, proj_, normed_, qkv_, q_, k_, v_, attn_, gate_up_, mlp_;
  DeviceMemory rows_hidden_, rows_proj_, rows_normed_, logits_, argmax_;
  DeviceMemory workspace_;  // decode attention's partitions; grows with the longest step
  DeviceMemory in_ids_, in_positions_, in_slots_, in_query_start_, in_context_lens_,
      in_block_tables_, in_logit_rows_, in_copy_src_, in_copy_dst_;
  DeviceMemory sample_temperature_, sample_top_k_, sample_top_p_, sample_min_p_, sample_uniform_,
      sampled_;
  // Penalty lists: rows sized with the step, tokens grown to the longest list seen.
  DeviceMemory penalty_rows_, penalty_tokens_;
  PinnedMemory host_penalty_tokens_;
  PinnedMemory host_argmax_, host_logits_, host_sampled_;
  Staging staging_;

  // Decode graphs by (batch size, context bucket).
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<Graph>> graphs_;
  std::map<std::pair<int32_t, int32_t>, int> graph_seen_;  // -1: capture failed, stay eager
};

void CudaBackend::finish_setup() {
  const std::vector<float> inv_freq = rope_inv_freq(config_);
  inv_freq_ = DeviceMemory(inv_freq.size() * sizeof(float));
  copy_to_device(inv_freq_.get(), inv_freq.data(), DType::kF32, DType::kF32,
                 static_cast<int64_t>(inv_freq.size()));
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t per_layer = (q_dim_ + 2 * kv_dim_) * H + H * q_dim_ + 2 * I * H + H * I;
  weight_bytes_ = (config_.num_layers * per_layer + config_.vocab_size * H) *
                  kernels::dtype_size(compute_dtype_);
  // Buffers for the largest step the engine will run, before the KV pool takes the rest.
  const int32_t graph_seqs =
      options_.cuda_graphs ? graph_batch_size(options_.max_num_seqs).value_or(options_.max_num_seqs)
                           : options_.max_num_seqs;
  const int32_t width = static_cast<int32_t>(
      (round_up_pow2(max_model_len_, kMinGraphContext) + cuda::kBlockSize - 1) / cuda::kBlockSize);
  ensure_capacity(std::max(options_.max_num_batched_tokens, graph_seqs), graph_seqs, width);
  // Decode attention's scratch for every step of up to graph_seqs sequences at contexts up
  // to 128k (or the model's longest, if shorter), taken now: it then does not grow (which
  // would drop every captured graph), and the KV pool's budget is what is left after it.
  // For Llama 3 8B with 256 sequences: 68 MB at 8k, 1.1 GB at 128k. Longer steps grow it.
  const int64_t longest =
      std::min<int64_t>(round_up_pow2(max_model_len_, kMinGraphContext), kWorkspaceContextAtStart);
  reserve_workspace(cuda::paged_attention_decode_workspace_bound(
      graph_seqs, static_cast<int>(config_.num_heads), static_cast<int>(config_.num_kv_heads),
      static_cast<int>(config_.head_dim), static_cast<int32_t>(longest)));
}

void CudaBackend::ensure_workspace(int32_t seqs, int32_t max_context) {
  reserve_workspace(cuda::paged_attention_decode_workspace_bytes(
      seqs, static_cast<int>(config_.num_heads), static_cast<int>(config_.num_kv_heads),
      static_cast<int>(config_.head_dim), max_context));
}

void CudaBackend::reserve_workspace(size_t need) {
  if (need <= workspace_.bytes()) return;
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();  // they point at the old workspace
  graph_seen_.clear();
  workspace_ = DeviceMemory();
  workspace_ = DeviceMemory(need);
}

void CudaBackend::ensure_capacity(int32_t tokens, int32_t seqs, int32_t table_width) {
  if (tokens <= cap_tokens_ && seqs <= cap_seqs_ && table_width <= cap_width_) return;
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();  // they point at the buffers about to be replaced
  graph_seen_.clear();
  const ModelConfig& c = config_;
  const int64_t T = std::max(tokens, cap_tokens_);
  const int64_t S = std::max(seqs, cap_seqs_);
  const int64_t W = std::max(table_width, cap_width_);
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t act = kernels::dtype_size(compute_dtype_);
  const size_t f = sizeof(float);
  hidden_ = DeviceMemory(T * H * f);
  proj_ = DeviceMemory(T * H * f);
  normed_ = DeviceMemory(T * H * act);
  qkv_ = DeviceMemory(T * (q_dim_ + 2 * kv_dim_) * f);
  q_ = DeviceMemory(T * q_dim_ * f);
  k_ = DeviceMemory(T * kv_dim_ * f);
  v_ = DeviceMemory(T * kv_dim_ * f);
  attn_ = DeviceMemory(T * q_dim_ * act);
  gate_up_ = DeviceMemory(T * 2 * I * f);
  mlp_ = DeviceMemory(T * I * act);
  // At most one logit row per sequence.
  rows_hidden_ = DeviceMemory(S * H * f);
  rows_proj_ = DeviceMemory(S * H * f);
  rows_normed_ = DeviceMemory(S * H * act);
  logits_ = DeviceMemory(S * V * f);
  argmax_ = DeviceMemory(S * sizeof(int32_t));
  in_ids_ = DeviceMemory(T * sizeof(int32_t));
  in_positions_ = DeviceMemory(T * sizeof(int32_t));
  in_slots_ = DeviceMemory(T * sizeof(int64_t));
  in_query_start_ = DeviceMemory((S + 1) * sizeof(int32_t));
  in_context_lens_ = DeviceMemory(S * sizeof(int32_t));
  in_block_tables_ = DeviceMemory(S * W * sizeof(int32_t));
  in_logit_rows_ = DeviceMemory(S * sizeof(int32_t));
  in_copy_src_ = DeviceMemory(S * sizeof(int32_t));
  in_copy_dst_ = DeviceMemory(S * sizeof(int32_t));
  sample_temperature_ = DeviceMemory(S * f);
  sample_top_k_ = DeviceMemory(S * sizeof(int32_t));
  sample_top_p_ = DeviceMemory(S * f);
  sample_min_p_ = DeviceMemory(S * f);
  sample_uniform_ = DeviceMemory(S * f);
  sampled_ = DeviceMemory(S * sizeof(int32_t));
  penalty_rows_ = DeviceMemory(S * sizeof(kernels::PenaltyRow));
  host_argmax_ = PinnedMemory(S * sizeof(int32_t));
  host_sampled_ = PinnedMemory(S * sizeof(int32_t));
  host_logits_ = PinnedMemory(S * V * f);
  // Inputs of one step: ids, positions, slots; query starts, contexts, block tables,
  // logit rows, copies, sampling parameters and penalty rows; 16 bytes of alignment
  // slack for each.
  static_assert(sizeof(kernels::PenaltyRow) == 5 * 4);
  staging_.reserve(static_cast<size_t>(T) * 16 + static_cast<size_t>(S) * (W + 17) * 4 + 64 * 16);
  cap_tokens_ = static_cast<int32_t>(T);
  cap_seqs_ = static_cast<int32_t>(S);
  cap_width_ = static_cast<int32_t>(W);
}

void CudaBackend::upload_inputs(const ForwardBatch& batch, const Step& step, int32_t padded_seqs) {
  const int32_t T = step.tokens, S = step.seqs, P = padded_seqs;
  const int32_t rows = P + (T - S);  // token rows, padding included
  staging_.reset();
  auto send = [&](void* dst, const void* src, size_t bytes) {
    if (bytes > 0) {
      PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    }
  };
  // Padding rows (graph batches): token 0 at position 0, no slot, an empty context, and
  // their own token as the logit row.
  int32_t* ids = staging_.take<int32_t>(rows);
  int32_t* positions = staging_.take<int32_t>(rows);
  int64_t* slots = staging_.take<int64_t>(rows);
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), ids);
  std::copy(batch.positions.begin(), batch.positions.end(), positions);
  std::copy(batch.slots.begin(), batch.slots.end(), slots);
  std::fill(ids + T, ids + rows, 0);
  std::fill(positions + T, positions + rows, 0);
  std::fill(slots + T, slots + rows, int64_t(-1));
  send(in_ids_.get(), ids, rows * sizeof(int32_t));
  send(in_positions_.get(), positions, rows * sizeof(int32_t));
  send(in_slots_.get(), slots, rows * sizeof(int64_t));

  int32_t* starts = staging_.take<int32_t>(P + 1);
  std::copy(batch.query_start.begin(), batch.query_start.end(), starts);
  for (int32_t s = S; s < P; ++s)
    starts[s + 1] = starts[s] + 1;
  send(in_query_start_.get(), starts, (P + 1) * sizeof(int32_t));
  int32_t* contexts = staging_.take<int32_t>(P);
  std::copy(batch.context_lens.begin(), batch.context_lens.end(), contexts);
  std::fill(contexts + S, contexts + P, 0);
  send(in_context_lens_.get(), contexts, P * sizeof(int32_t));
  // Block tables re-laid with the step's row width.
  const int32_t W = step.table_width;
  int32_t* tables = staging_.take<int32_t>(static_cast<size_t>(P) * W);
  std::fill(tables, tables + static_cast<size_t>(P) * W, -1);
  const int32_t width = std::min(batch.max_blocks_per_seq, W);
  for (int32_t s = 0; s < S; ++s) {
    const int32_t* row =
        batch.block_tables.data() + static_cast<size_t>(s) * batch.max_blocks_per_seq;
    std::copy(row, row + width, tables + static_cast<size_t>(s) * W);
  }
  send(in_block_tables_.get(), tables, static_cast<size_t>(P) * W * sizeof(int32_t));
  const int32_t R = static_cast<int32_t>(batch.logit_rows.size());
  int32_t* logit_rows = staging_.take<int32_t>(R + (P - S));
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), logit_rows);
  for (int32_t s = S; s < P; ++s)
    logit_rows[R + (s - S)] = T + (s - S);
  send(in_logit_rows_.get(), logit_rows, (R + (P - S)) * sizeof(int32_t));
  if (!batch.copy_src.empty()) {
    const size_t n = batch.copy_src.size();
    int32_t* src = staging_.take<int32_t>(n);
    int32_t* dst = staging_.take<int32_t>(n);
    std::copy(batch.copy_src.begin(), batch.copy_src.end(), src);
    std::copy(batch.copy_dst.begin(), batch.copy_dst.end(), dst);
    send(in_copy_src_.get(), src, n * sizeof(int32_t));
    send(in_copy_dst_.get(), dst, n * sizeof(int32_t));
  }
  if (!batch.sampling.empty()) {
    // Rows the backend does not sample get temperature 0: the kernel skips them.
    float* t = staging_.take<float>(R);
    int32_t* k = staging_.take<int32_t>(R);
    float* p = staging_.take<float>(R);
    float* m = staging_.take<float>(R);
    float* u = staging_.take<float>(R);
    for (int32_t r = 0; r < R; ++r) {
      const RowSampling& rs = batch.sampling[r];
      t[r] = rs.temperature > 0.0f ? rs.temperature : 0.0f;
      k[r] = rs.top_k;
      p[r] = rs.top_p;
      m[r] = rs.min_p;
      // The device draws in float: a draw within float rounding below 1 stays below 1.
      u[r] = std::min(static_cast<float>(rs.uniform), 0x1.fffffep-1f);
    }
    send(sample_temperature_.get(), t, R * sizeof(float));
    send(sample_top_k_.get(), k, R * sizeof(int32_t));
    send(sample_top_p_.get(), p, R * sizeof(float));
    send(sample_min_p_.get(), m, R * sizeof(float));
    send(sample_uniform_.get(), u, R * sizeof(float));
  }
}

// The penalties change the logits of the rows that have them, after the pass (a graph,
// perhaps) took every row's argmax: the argmax is taken again. Rows whose logits the host
// receives have none, so those logits stay the model's own.
void CudaBackend::apply_penalties(const ForwardBatch& batch) {
  const auto R = static_cast<int32_t>(batch.logit_rows.size());  // penalty rows: checked
  const size_t bytes = batch.penalty_tokens.size() * sizeof(kernels::PenaltyToken);
  if (bytes > penalty_tokens_.bytes()) {
    // The previous step's copies ended with its synchronization; nothing reads these now.
    // Both replaced only once both exist: a failed allocation leaves the old pair.
    const size_t grown = std::max(bytes + bytes / 2, size_t(64) << 10);
    DeviceMemory device(grown);
    PinnedMemory host(grown);
    penalty_tokens_ = std::move(device);
    host_penalty_tokens_ = std::move(host);
  }
  auto* rows = staging_.take<kernels::PenaltyRow>(R);
  std::copy(batch.penalty_rows.begin(), batch.penalty_rows.end(), rows);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(penalty_rows_.get(), rows, R * sizeof(kernels::PenaltyRow),
                                     cudaMemcpyHostToDevice, stream_));
  if (bytes > 0) {
    std::memcpy(host_penalty_tokens_.get(), batch.penalty_tokens.data(), bytes);
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(penalty_tokens_.get(), host_penalty_tokens_.get(), bytes,
                                       cudaMemcpyHostToDevice, stream_));
  }
  const int64_t V = config_.vocab_size;
  cuda::apply_penalties(logits_.get<float>(), R, V, penalty_rows_.get<kernels::PenaltyRow>(),
                        penalty_tokens_.get<kernels::PenaltyToken>(), stream_);
  cuda::argmax(logits_.get<float>(), R, V, argmax_.get<int32_t>(), stream_);
}

void CudaBackend::enqueue(const Step& st) {
  const ModelConfig& c = config_;
  const int64_t T = st.tokens, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int nh = static_cast<int>(c.num_heads), nkv = static_cast<int>(c.num_kv_heads);
  const int64_t qkv_n = q_dim_ + 2 * kv_dim_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = c.attention_scale();
  const DType cdt = compute_dtype_;
  float* hidden = hidden_.get<float>();
  float* proj = proj_.get<float>();
  float* q = q_.get<float>();
  float* k = k_.get<float>();
  float* v = v_.get<float>();
  const cuda::PagedAttentionBatch attention{st.seqs,
                                            in_query_start_.get<int32_t>(),
                                            in_context_lens_.get<int32_t>(),
                                            in_block_tables_.get<int32_t>(),
                                            st.table_width,
                                            static_cast<int32_t>(c.sliding_window)};

  cuda::embedding(in_ids_.get<int32_t>(), T, embed_.get(), embed_dtype_, H, hidden, stream_);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& layer = layers_[static_cast<size_t>(l)];
    const cuda::KVCacheLayer kv = layer_cache(l);
    if (l == 0) {
      cuda::rmsnorm(hidden, layer.input_norm.get(), layer.input_norm_dtype, T, H, eps,
                    normed_.get(), cdt, stream_);
    } else {
      cuda::add_rmsnorm(hidden, proj, layer.input_norm.get(), layer.input_norm_dtype, T, H, eps,
                        normed_.get(), cdt, stream_);
    }
    float* qkv = qkv_.get<float>();
    blas_->matmul(normed_.get(), layer.qkv.get(), cdt, T, qkv_n, H, qkv);
    if (layer.qkv_bias.get()) cuda::add_bias(qkv, layer.qkv_bias.get<float>(), T, qkv_n, stream_);
    if (layer.q_norm.get() == nullptr) {
      // Rotate q out of the q|k|v rows; rotate k and store it and v in the cache.
      cuda::rope_write_kv(qkv, in_positions_.get<int32_t>(), in_slots_.get<int64_t>(), T, nh,
                          inv_freq_.get<float>(), q, kv, stream_);
    } else {
      // Per-head q/k norms first: split q|k|v rows into contiguous q, k and v.
      const size_t row = static_cast<size_t>(qkv_n) * sizeof(float);
      PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(q, q_dim_ * sizeof(float), qkv, row,
                                           q_dim_ * sizeof(float), T, cudaMemcpyDeviceToDevice,
                                           stream_));
      PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(k, kv_dim_ * sizeof(float), qkv + q_dim_, row,
                                           kv_dim_ * sizeof(float), T, cudaMemcpyDeviceToDevice,
                                           stream_));
      PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(v, kv_dim_ * sizeof(float), qkv + q_dim_ + kv_dim_, row,
                                           kv_dim_ * sizeof(float), T, cudaMemcpyDeviceToDevice,
                                           stream_));
      cuda::rmsnorm(q, layer.q_norm.get(), layer.qk_norm_dtype, T * nh, D, eps, q, DType::kF32,
                    stream_);
      cuda::rmsnorm(k, layer.k_norm.get(), layer.k_norm_dtype, T * nkv, D, eps, k, DType::kF32,
                    stream_);
      cuda::rope(q, k, in_positions_.get<int32_t>(), T, nh, nkv, static_cast<int>(D),
                 inv_freq_.get<float>(), stream_);
      cuda::write_kv(k, v, in_slots_.get<int64_t>(), T, kv, stream_);
    }
    if (st.decode) {
      cuda::paged_attention_decode(q, kv, attention, st.max_context, nh, scale, workspace_.get(),
                                   attn_.get(), cdt, stream_);
    } else {
      cuda::paged_attention(q, kv, attention, st.tokens, st.max_q_len, nh, scale, attn_.get(), cdt,
                            stream_);
    }
    blas_->matmul(attn_.get(), layer.o.get(), cdt, T, H, q_dim_, proj);
    cuda::add_rmsnorm(hidden, proj, layer.post_norm.get(), layer.post_norm_dtype, T, H, eps,
                      normed_.get(), cdt, stream_);
    blas_->matmul(normed_.get(), layer.gate_up.get(), cdt, T, 2 * I, H, gate_up_.get<float>());
    cuda::silu_mul_fused(gate_up_.get<float>(), T, I, mlp_.get(), cdt, stream_);
    blas_->matmul(mlp_.get(), layer.down.get(), cdt, T, H, I, proj);
  }
  // Only the rows whose next token is wanted go through the final norm and lm_head,
  // as hidden + proj (the last sublayer's residual add), exactly as on the CPU.
  const int64_t R = st.logit_rows;
  cuda::embedding(in_logit_rows_.get<int32_t>(), R, hidden, DType::kF32, H,
                  rows_hidden_.get<float>(), stream_);
  cuda::embedding(in_logit_rows_.get<int32_t>(), R, proj, DType::kF32, H, rows_proj_.get<float>(),
                  stream_);
  cuda::add_rmsnorm(rows_hidden_.get<float>(), rows_proj_.get<float>(), final_norm_.get(),
                    final_norm_dtype_, R, H, eps, rows_normed_.get(), cdt, stream_);
  // (cuBLAS streams a vocabulary-sized head at the copy rate already.)
  blas_->matmul(rows_normed_.get(), lm_head_weights_, cdt, R, c.vocab_size, H, logits_.get<float>(),
                /*allow_gemv=*/false);
  cuda::argmax(logits_.get<float>(), R, c.vocab_size, argmax_.get<int32_t>(), stream_);
}

// Captures `step` (already run eagerly, so its results are in place) as the graph of
// `key`. A capture that fails leaves the bucket eager: the step's results stand.
void CudaBackend::capture(const Step& step, std::pair<int32_t, int32_t> key) {
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaGraph_t graph = nullptr;
  auto graph_exec = std::make_unique<Graph>();
  bool ok = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    try {
      enqueue(step);
    } catch (const std::exception&) {
      ok = false;
    }
    ok = cudaStreamEndCapture(stream_, &graph) == cudaSuccess && ok;
  }
  ok = ok && graph != nullptr && cudaGraphInstantiate(&graph_exec->exec, graph, 0) == cudaSuccess;
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves its error pending; it is handled here
  if (ok) {
    graphs_[key] = std::move(graph_exec);
  } else {
    graph_seen_[key] = -1;
  }
}

void CudaBackend::forward(const ForwardBatch& batch, ForwardOutput& out) {
  try {
    run_step(batch, out);
  } catch (const std::exception& e) {
    // Nothing of this step may still run once the engine moves on (it reuses the pinned
    // inputs). An error that a synchronize still reports is sticky: the context is
    // poisoned and every later call would fail too.
    cudaGetLastError();
    if (cudaStreamSynchronize(stream_) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      throw DeviceLostError(std::string(e.what()) +
                            " (the GPU can run nothing more; restart the server)");
    throw;
  }
}

void CudaBackend::run_step(const ForwardBatch& batch, ForwardOutput& out) {
  if (kv_.empty()) throw std::logic_error("forward before allocate_kv_cache");
  // The engine thread is not the one that loaded the model: the current device is
  // per thread.
  PAGELLM_CUDA_CHECK(cudaSetDevice(options_.device));
  cudaGetLastError();  // nothing left over from an earlier failure is this step's
  const ModelConfig& c = config_;
  Step st;
  st.tokens = batch.num_tokens();
  st.seqs = batch.num_seqs();
  st.logit_rows = static_cast<int32_t>(batch.logit_rows.size());
  check_row_fields(batch);  // before anything is queued
  int32_t max_context = 0;
  for (int32_t s = 0; s < st.seqs; ++s) {
    st.max_q_len = std::max(st.max_q_len, batch.query_start[s + 1] - batch.query_start[s]);
    max_context = std::max(max_context, batch.context_lens[s]);
  }
  st.decode = st.tokens == st.seqs && st.logit_rows == st.seqs;
  st.table_width = batch.max_blocks_per_seq;
  st.max_context = max_context;

  // A decode step runs from a graph captured for its bucket: the batch padded to a
  // captured size, the block tables to a power-of-two context. Batches over the largest
  // bucket, and buckets whose capture failed, run eagerly.
  int32_t padded = st.seqs;
  std::pair<int32_t, int32_t> key{0, 0};
  bool use_graph = false;
  if (options_.cuda_graphs && st.decode && st.seqs > 0) {
    const int64_t context = round_up_pow2(max_context, kMinGraphContext);
    if (const auto b = graph_batch_size(st.seqs)) {
      key = {*b, static_cast<int32_t>(context)};
      use_graph = context <= int64_t(cap_width_) * cuda::kBlockSize;
    }
    auto seen = graph_seen_.find(key);
    if (seen != graph_seen_.end() && seen->second < 0) use_graph = false;
    if (use_graph) {
      padded = key.first;
      st.table_width = key.second / cuda::kBlockSize;
      st.max_context = key.second;
    }
  }
  const int32_t R = st.logit_rows;
  const int32_t copies = static_cast<int32_t>(batch.copy_src.size());
  ensure_capacity(st.tokens + (padded - st.seqs), std::max({padded, R, copies}), st.table_width);
  if (st.decode) ensure_workspace(padded, st.max_context);

  upload_inputs(batch, st, padded);
  if (copies > 0) {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      cuda::copy_blocks(layer_cache(l), in_copy_src_.get<int32_t>(), in_copy_dst_.get<int32_t>(),
                        copies, stream_);
    }
  }

  if (use_graph) {
    Step padded_step = st;
    padded_step.tokens = padded;
    padded_step.seqs = padded;
    padded_step.logit_rows = padded;
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      PAGELLM_CUDA_CHECK(cudaGraphLaunch(it->second->exec, stream_));
    } else {
      // The first step of a bucket runs as it is (cuBLAS picks and loads its kernels);
      // the second captures the bucket's graph, which every later one replays.
      enqueue(padded_step);
      if (graph_seen_[key]++ > 0) capture(padded_step, key);
    }
  } else {
    enqueue(st);
  }

  if (!batch.penalty_rows.empty()) apply_penalties(batch);

  // Results: every row's argmax, the draws asked for, and the logits the host wants.
  const int64_t V = c.vocab_size;
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host_argmax_.get(), argmax_.get(), R * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_));
  if (!batch.sampling.empty()) {
    const cuda::SamplingRows rows{sample_temperature_.get<float>(), sample_top_k_.get<int32_t>(),
                                  sample_top_p_.get<float>(), sample_min_p_.get<float>(),
                                  sample_uniform_.get<float>()};
    cuda::sample_top_k_top_p(logits_.get<float>(), R, V, rows, sampled_.get<int32_t>(), stream_);
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host_sampled_.get(), sampled_.get(), R * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, stream_));
  }
  int32_t wanted = 0;
  for (int32_t r = 0; r < R; ++r)
    wanted += batch.host_logits.empty() || batch.host_logits[r] ? 1 : 0;
  const size_t row_bytes = static_cast<size_t>(V) * sizeof(float);
  if (wanted == R) {
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host_logits_.get(), logits_.get(), R * row_bytes,
                                       cudaMemcpyDeviceToHost, stream_));
  } else {
    for (int32_t r = 0; r < R; ++r) {
      if (!batch.host_logits[r]) continue;
      PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host_logits_.get<unsigned char>() + r * row_bytes,
                                         logits_.get<unsigned char>() + r * row_bytes, row_bytes,
                                         cudaMemcpyDeviceToHost, stream_));
    }
  }
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  out.argmax.assign(host_argmax_.get<int32_t>(), host_argmax_.get<int32_t>() + R);
  out.sampled.clear();
  if (!batch.sampling.empty()) {
    out.sampled = out.argmax;
    for (int32_t r = 0; r < R; ++r) {
      if (batch.sampling[r].temperature > 0.0f) out.sampled[r] = host_sampled_.get<int32_t>()[r];
    }
  }
  out.logits.resize(static_cast<size_t>(R) * V);
  for (int32_t r = 0; r < R; ++r) {
    if (!batch.host_logits.empty() && !batch.host_logits[r]) continue;
    std::memcpy(out.logits.data() + static_cast<size_t>(r) * V,
                host_logits_.get<unsigned char>() + r * row_bytes, row_bytes);
  }
}

DType weight_dtype_of(const ModelWeights& w) {
  return w.layers.empty() ? w.lm_head.dtype : w.layers.front().q_proj.dtype;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const std::filesystem::path& model_dir,
                                           const BackendOptions& options) {
  ModelConfig config = load_model_config(model_dir);
  SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(model_dir);
  const ModelWeights weights = bind_weights(config, checkpoint);
  take_weight_dtype(config, weights);
  auto backend = std::make_unique<CudaBackend>(config, options, weight_dtype_of(weights));
  backend->upload(weights);
  return backend;
}

std::unique_ptr<Backend> make_random_cuda_backend(const ModelConfig& config, DType dtype,
                                                  uint64_t seed, const BackendOptions& options) {
  auto backend = std::make_unique<CudaBackend>(config, options, dtype);
  backend->randomize(seed);
  return backend;
}

}  // namespace pagellm::engine
