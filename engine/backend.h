#pragma once
// Backend: one model's weights and KV pool on one device, and the forward pass over
// them. The engine, scheduler and paging are the same for every backend; only this
// differs. "cpu" is always built; "cuda" when the build has CUDA (cuda_backend_built()).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "engine/forward_batch.h"
#include "engine/model_config.h"
#include "kernels/dtype.h"

namespace pagellm::engine {

class LlamaModel;

// Thrown by a backend whose device can no longer run anything (a CUDA error that poisons
// its context, such as an illegal memory access). The engine fails every request and
// stops taking new ones, so that /health reports it; only a restart brings it back.
class DeviceLostError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "cpu" or "cuda"
  // What the backend runs on, for the start-up log ("2 CPU threads", "NVIDIA H200").
  virtual std::string device_description() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Bytes of weights one forward pass reads (its decode roofline).
  virtual int64_t weight_bytes_per_step() const = 0;

  // Bytes the KV pool may take when the operator names no size: the device's free
  // memory times `fraction`, less what the forward pass needs besides. nullopt where
  // the backend has no such budget (the CPU: the caller picks a default).
  virtual std::optional<int64_t> kv_cache_budget(double fraction) const { return std::nullopt; }

  // Allocates the KV pool, once, before the first forward. Throws when it cannot.
  virtual void allocate_kv_cache(int64_t num_blocks, kernels::DType dtype) = 0;
  virtual int64_t kv_cache_bytes() const = 0;

  // Runs one step: writes the batch's K/V into the pool and returns the argmax of every
  // logit row and the draws batch.sampling asks for, both after the row's
  // batch.penalty_rows, and the model's logits of the rows batch.host_logits asks for. Throws
  // DeviceLostError when the device is gone for good; another exception fails the step
  // only.
  virtual void forward(const ForwardBatch& batch, ForwardOutput& out) = 0;
};

struct BackendOptions {
  std::string kind = "auto";  // auto (CUDA when a GPU is there), cpu or cuda
  int device = 0;             // CUDA device index
  // Largest batch (sequences) and step (tokens) the engine will run, and the longest
  // context: the CUDA backend sizes its buffers and decode graphs from them.
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;  // <= 0: the model's context_length()
  bool cuda_graphs = true;    // replay captured CUDA graphs for decode steps
  // CUDA: run the matmuls on float32 copies of 16-bit weights (slower; the CPU
  // backend's arithmetic, for checking one against the other).
  bool float32_compute = false;
  // CPU: the bf16 matmul's path. auto: AMX where the CPU has it (much faster from a few
  // rows on; about a sixth slower for a single sequence's decode), unless max_num_seqs is
  // 1, else the fma one; amx (refused without AMX) or fma. Both keep every result
  // independent of the batch.
  std::string cpu_matmul = "auto";
};

// Whether `matmul` names a CPU matmul path: auto, amx or fma.
bool known_cpu_matmul(const std::string& matmul);
// Makes `matmul` the process's CPU matmul path (a process-wide setting of kernels/cpu/).
// ConfigError for an unknown name, or for amx where it is not available.
void select_cpu_matmul(const std::string& matmul);

// The CPU backend over an already loaded model.
std::unique_ptr<Backend> make_cpu_backend(std::unique_ptr<LlamaModel> model);

// Loads the model at `model_dir` on the backend `options.kind` names ("auto": CUDA when
// this build has it and a device is present, else the CPU). Throws ConfigError for an
// unknown kind or "cuda" where it is not available. The CPU backend's load leaves the
// calling thread without an OpenMP team (see backend.cpp): the engine thread's should be
// the process's only one.
std::unique_ptr<Backend> load_backend(const std::filesystem::path& model_dir,
                                      const BackendOptions& options);

// Whether this build has the CUDA backend, and whether a CUDA device can be used now.
bool cuda_backend_built();
bool cuda_device_available();

}  // namespace pagellm::engine
