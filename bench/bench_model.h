#pragma once
// The model the throughput benchmarks run on: --model DIR, or the `bench` demo model
// written once under models/bench.

#include <cstdio>
#include <filesystem>

#include "engine/demo_model.h"

namespace pagellm::bench {

inline std::filesystem::path bench_model_dir(std::filesystem::path requested) {
  if (!requested.empty()) return requested;
  const std::filesystem::path dir = "models/bench";
  if (!std::filesystem::exists(dir / "config.json")) {
    std::fprintf(stderr, "writing the bench demo model to %s ...\n", dir.c_str());
    engine::write_demo_model(dir, engine::demo_model_preset("bench"));
  }
  return dir;
}

}  // namespace pagellm::bench
