#pragma once
// Where the shared reference data lives: $PAGELLM_TEST_DATA, else the folder CMake found.

#include <cstdlib>
#include <filesystem>
#include <optional>

namespace pagellm::testing {

inline std::optional<std::filesystem::path> shared_data_dir() {
  if (const char* env = std::getenv("PAGELLM_TEST_DATA"); env != nullptr && *env != '\0') {
    if (std::filesystem::is_directory(env)) return std::filesystem::path(env);
    return std::nullopt;
  }
  const std::filesystem::path configured = PAGELLM_TEST_DATA_DIR;
  if (!configured.empty() && std::filesystem::is_directory(configured)) return configured;
  return std::nullopt;
}

}  // namespace pagellm::testing
