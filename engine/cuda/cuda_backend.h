#pragma once
// The CUDA backend: weights and the KV pool in device memory (plain cudaMalloc), the
// kernels of kernels/cuda/, matmuls through cuBLAS, and decode steps replayed from CUDA
// graphs captured per (batch size, context length) bucket. Built only with CUDA.

#include <cstdint>
#include <filesystem>
#include <memory>

#include "engine/backend.h"
#include "engine/model_config.h"
#include "kernels/dtype.h"

namespace pagellm::engine {

// CUDA devices usable now (0 without a driver or a GPU; never throws).
int cuda_device_count();

// Loads the checkpoint at `model_dir` onto device options.device.
std::unique_ptr<Backend> make_cuda_backend(const std::filesystem::path& model_dir,
                                           const BackendOptions& options);

// A model of `config`'s shape whose weights are random values of `dtype` made on the
// device (benchmarks of real model shapes with nothing to download).
std::unique_ptr<Backend> make_random_cuda_backend(const ModelConfig& config, kernels::DType dtype,
                                                  uint64_t seed, const BackendOptions& options);

}  // namespace pagellm::engine
