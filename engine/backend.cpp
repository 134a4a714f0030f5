#include "engine/backend.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "engine/forward_batch_builder.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/tokenizer_config.h"
#include "kernels/cpu/kernels.h"

#if PAGELLM_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace pagellm::engine {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::unique_ptr<LlamaModel> model) : model_(std::move(model)) {}

  std::string_view name() const override { return "cpu"; }
  std::string device_description() const override {
    return std::to_string(omp_get_max_threads()) + " CPU threads, " +
           (kernels::cpu::amx_matmul() ? "AMX" : "fma") + " matmul";
  }
  const ModelConfig& config() const override { return model_->config(); }
  int64_t weight_bytes_per_step() const override { return model_->weight_bytes_per_step(); }

  void allocate_kv_cache(int64_t num_blocks, kernels::DType dtype) override {
    if (memory_) throw std::logic_error("the KV cache is allocated once");
    memory_ = std::make_unique<KVCacheMemory>(model_->config(), num_blocks, dtype);
  }
  int64_t kv_cache_bytes() const override { return memory_ ? memory_->bytes() : 0; }

  void forward(const ForwardBatch& batch, ForwardOutput& out) override {
    if (!memory_) throw std::logic_error("forward before allocate_kv_cache");
    check_row_fields(batch);
    model_->forward(batch, *memory_, out.logits);
    const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
    out.argmax.resize(rows);
    const int64_t vocab = model_->config().vocab_size;
    if (!batch.penalty_rows.empty()) {
      kernels::cpu::apply_penalties(out.logits.data(), rows, vocab, batch.penalty_rows.data(),
                                    batch.penalty_tokens.data());
    }
    kernels::cpu::argmax(out.logits.data(), rows, vocab, out.argmax.data());
    out.sampled.clear();
    if (batch.sampling.empty()) return;
    out.sampled = out.argmax;
    // One call for every row (rows with temperature 0 keep their argmax), so that the
    // kernel can spread them over the cores.
    temperature_.clear();
    top_k_.clear();
    top_p_.clear();
    min_p_.clear();
    uniform_.clear();
    for (const RowSampling& s : batch.sampling) {
      temperature_.push_back(s.temperature);
      top_k_.push_back(s.top_k);
      top_p_.push_back(s.top_p);
      min_p_.push_back(s.min_p);
      uniform_.push_back(s.uniform);
    }
    const kernels::cpu::SamplingRows params{temperature_.data(), top_k_.data(), top_p_.data(),
                                            min_p_.data(), uniform_.data()};
    kernels::cpu::sample_top_k_top_p(out.logits.data(), rows, vocab, params, out.sampled.data());
  }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KVCacheMemory> memory_;
  std::vector<float> temperature_, top_p_, min_p_;  // batch.sampling as the kernel reads it
  std::vector<int32_t> top_k_;
  std::vector<double> uniform_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::unique_ptr<LlamaModel> model) {
  return std::make_unique<CpuBackend>(std::move(model));
}

bool cuda_backend_built() {
#if PAGELLM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_device_available() {
#if PAGELLM_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

bool known_cpu_matmul(const std::string& matmul) {
  return matmul == "auto" || matmul == "amx" || matmul == "fma";
}

namespace {
void check_known_cpu_matmul(const std::string& matmul) {
  if (!known_cpu_matmul(matmul)) {
    throw ConfigError("unknown CPU matmul '" + matmul + "' (auto, amx or fma)");
  }
}
}  // namespace

void select_cpu_matmul(const std::string& matmul) {
  check_known_cpu_matmul(matmul);
  if (matmul == "amx" && !kernels::cpu::amx_matmul_available()) {
    throw ConfigError("CPU matmul amx: this CPU, its kernel or this build has no AMX");
  }
  kernels::cpu::set_amx_matmul(matmul != "fma");
}

std::unique_ptr<Backend> load_backend(const std::filesystem::path& model_dir,
                                      const BackendOptions& options) {
  const std::string& kind = options.kind;
  if (kind != "auto" && kind != "cpu" && kind != "cuda") {
    throw ConfigError("unknown backend '" + kind + "' (auto, cpu or cuda)");
  }
  if (kind == "cuda" && !cuda_backend_built()) {
    throw ConfigError("backend cuda: this build has no CUDA support (build where nvcc is)");
  }
  if (kind == "cuda" && !cuda_device_available()) {
    throw ConfigError("backend cuda: no usable CUDA device (driver or GPU missing)");
  }
  check_known_cpu_matmul(options.cpu_matmul);
#if PAGELLM_HAVE_CUDA
  if (kind == "cuda" || (kind == "auto" && cuda_device_available())) {
    return make_cuda_backend(model_dir, options);
  }
#endif
  // One sequence at a time decodes one row per step, where the fma path is the faster.
  select_cpu_matmul(options.cpu_matmul == "auto" && options.max_num_seqs == 1 ? "fma"
                                                                              : options.cpu_matmul);
  // The load repacks the weights on every core (OpenMP) from a thread of its own, which
  // ends with it. Each thread that starts a parallel region keeps a team of workers for
  // the rest of its life, and libgomp counts them all: with the caller's team beside the
  // engine thread's, there were more OpenMP threads than cores, and libgomp then lets a
  // worker spin only briefly between parallel regions before it sleeps. A decode step
  // runs several regions a layer: on 2 cores the server's batch-1 forward pass took 9 ms
  // (about a hundred context switches a step) where the same pass alone took 5.5.
  std::unique_ptr<LlamaModel> model;
  std::exception_ptr error;
  std::thread([&] {
    try {
      model = LlamaModel::load(model_dir);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return make_cpu_backend(std::move(model));
}

}  // namespace pagellm::engine
