// Drawing tokens on the GPU: kernels::cuda::sample_top_k_top_p and argmax over rows of a
// Llama-3-sized vocabulary (128,256), at 1, 32 and 256 rows, for logits drawn from a
// normal distribution with spread 1 (flat: top-p 0.95 at temperature 0.8 keeps about
// 84,000 tokens) and 4 (peaked: it keeps tens to hundreds).
//   pagellm_cuda_sampling_bench [--rows R,...] [--vocab V]
// Each figure is the median of 50 launches after 5 of warm-up, CUDA events around each;
// every launch samples the same logits (a row of 128k floats, 513 KB, stays in L2 at
// small batches, as the logits a decode step has just written do).

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/list_options.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels.h"

namespace pagellm::kernels::cuda {
namespace {

using bench::Device;

constexpr int kWarmup = 5, kTimed = 50;

struct Params {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

constexpr Params kParams[] = {{"T 0.8, top-p 0.95", 0.8f, 0, 0.95f, 0.0f},
                              {"T 0.7, top-k 50, top-p 0.9", 0.7f, 50, 0.9f, 0.0f},
                              {"T 1, min-p 0.05", 1.0f, 0, 1.0f, 0.05f}};

int run(int argc, char** argv) {
  std::vector<int> rows_list = {1, 32, 256};
  int64_t vocab = 128256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      rows_list = bench::parse_int_list(argv[++i]);
    } else if (a == "--vocab" && i + 1 < argc) {
      vocab = std::stoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--rows R,...] [--vocab V]\n", argv[0]);
      return 2;
    }
  }
  if (vocab <= 0) throw std::runtime_error("--vocab: must be positive");
  const std::string device = bench::cuda_device_name();
  std::printf("device: %s\ndrawing tokens, vocabulary %lld; median us per launch\n", device.c_str(),
              static_cast<long long>(vocab));
  std::printf("%5s %-7s %-28s %10s %10s\n", "rows", "spread", "sampling", "us", "argmax us");
  std::mt19937 rng(7);
  for (int rows : rows_list) {
    if (rows <= 0) throw std::runtime_error("--rows: must be positive");
    for (float spread : {1.0f, 4.0f}) {
      std::normal_distribution<float> normal(0.0f, spread);
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      for (float& x : logits)
        x = normal(rng);
      Device d_logits(logits.size() * sizeof(float)), d_out(rows * sizeof(int32_t));
      upload(d_logits, logits);
      const double argmax_us = bench::median_launch_us(
          [&](int) { argmax(d_logits.get<float>(), rows, vocab, d_out.get<int32_t>(), nullptr); },
          kWarmup, kTimed);
      for (const Params& p : kParams) {
        std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
        std::vector<float> u(rows);
        for (float& x : u)
          x = uniform(rng);
        Device d_t(rows * sizeof(float)), d_k(rows * sizeof(int32_t)), d_p(rows * sizeof(float)),
            d_m(rows * sizeof(float)), d_u(rows * sizeof(float));
        upload(d_t, std::vector<float>(rows, p.temperature));
        upload(d_k, std::vector<int32_t>(rows, p.top_k));
        upload(d_p, std::vector<float>(rows, p.top_p));
        upload(d_m, std::vector<float>(rows, p.min_p));
        upload(d_u, u);
        const SamplingRows params{d_t.get<float>(), d_k.get<int32_t>(), d_p.get<float>(),
                                  d_m.get<float>(), d_u.get<float>()};
        const double us = bench::median_launch_us(
            [&](int) {
              sample_top_k_top_p(d_logits.get<float>(), rows, vocab, params, d_out.get<int32_t>(),
                                 nullptr);
            },
            kWarmup, kTimed);
        std::printf("%5d %-7s %-28s %10.1f %10.1f\n", rows, spread == 1.0f ? "flat" : "peaked",
                    p.name, us, argmax_us);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace pagellm::kernels::cuda

int main(int argc, char** argv) {
  return pagellm::bench::bench_main(pagellm::kernels::cuda::run, argc, argv);
}
