#pragma once
// What the throughput benchmarks share: the model they run on (--model DIR, or the
// `bench` demo model written once under models/bench) and their list options
// (list_options.h).

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/list_options.h"
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
