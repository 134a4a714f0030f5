#pragma once
// Seeds of the randomized tests: fresh random inputs every run, or one run replayed.

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace pagellm::testing {

// A fresh seed for every run (fresh random inputs), or PAGELLM_TEST_SEED to replay one.
inline uint32_t fresh_seed() {
  if (const char* s = std::getenv("PAGELLM_TEST_SEED")) return static_cast<uint32_t>(std::stoul(s));
  return std::random_device{}();
}

inline std::string seed_trace(uint32_t seed) {
  return "seed " + std::to_string(seed) +
         " (replay with PAGELLM_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace pagellm::testing
