#pragma once
// Temporary folders for tests, and a demo model written into one: created fresh, removed
// with everything in them when the object goes, whether the test passed or not.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "engine/demo_model.h"

namespace pagellm::testing {

// <temp dir>/<name>_<pid>, empty at construction.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A TempDir holding a complete demo model (config, weights, tokenizer) of `spec`.
class TempDemoModel : public TempDir {
 public:
  TempDemoModel(const std::string& name, const engine::DemoModelSpec& spec) : TempDir(name) {
    engine::write_demo_model(path(), spec);
  }
};

}  // namespace pagellm::testing
