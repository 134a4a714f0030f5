// `pagellm demo-model` end to end: the real binary writes a directory the loaders accept.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class DemoModelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(PAGELLM_BINARY)) << "build the pagellm target first: " << PAGELLM_BINARY;
    dir_ = fs::temp_directory_path() / ("pagellm_cli_demo_model_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `pagellm demo-model ARGS`; returns the exit code, keeps stdout and stderr.
  int run(const std::string& args) {
    const std::string command = std::string("'") + PAGELLM_BINARY + "' demo-model " + args +
                                " > '" + (dir_ / "out").string() + "' 2> '" +
                                (dir_ / "err").string() + "'";
    const int status = std::system(command.c_str());
    out_ = read_file(dir_ / "out");
    err_ = read_file(dir_ / "err");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  fs::path dir_;
  std::string out_, err_;
};

TEST_F(DemoModelCli, WritesTheRequestedModel) {
  const fs::path model = dir_ / "qwen3";
  ASSERT_EQ(run("'" + model.string() + "' --preset tiny --arch qwen3 --dtype f32 --seed 7"), 0)
      << err_;
  EXPECT_THAT(out_, HasSubstr("Qwen3ForCausalLM"));
  EXPECT_THAT(out_, HasSubstr("parameters"));
  const engine::ModelConfig config = engine::load_model_config(model);
  EXPECT_EQ(config.architecture, engine::Architecture::kQwen3);
  EXPECT_EQ(config.dtype, kernels::DType::kF32);
  EXPECT_EQ(config.hidden_size, 64);
  const engine::SafetensorsCheckpoint ckpt = engine::SafetensorsCheckpoint::open(model);
  const engine::ModelWeights weights = engine::bind_weights(config, ckpt);
  EXPECT_TRUE(weights.layers[0].q_norm.has_value());

  // The same seed again gives the same bytes; the default preset is small.
  const std::string first = read_file(model / "model.safetensors");
  ASSERT_EQ(run("'" + model.string() + "' --preset=tiny --arch=qwen3 --dtype=f32 --seed=7"), 0);
  EXPECT_EQ(read_file(model / "model.safetensors"), first);
  ASSERT_EQ(run("'" + (dir_ / "default").string() + "'"), 0) << err_;
  EXPECT_EQ(engine::load_model_config(dir_ / "default").hidden_size, 256);
}

TEST_F(DemoModelCli, BadArgumentsAreUsageErrors) {
  EXPECT_EQ(run(""), 2);
  EXPECT_THAT(err_, HasSubstr("DIR"));
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --preset huge"), 2);
  EXPECT_THAT(err_, HasSubstr("huge"));
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --arch gpt2"), 2);
  EXPECT_THAT(err_, HasSubstr("gpt2"));
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --dtype int8"), 2);
  EXPECT_THAT(err_, HasSubstr("int8"));
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --seed -3"), 2);
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --seed 12abc"), 2);
  EXPECT_EQ(run("'" + (dir_ / "x").string() + "' --colour blue"), 2);
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  EXPECT_EQ(run("--help"), 0);
  EXPECT_THAT(out_, HasSubstr("--preset"));
  // A path that cannot be a directory: a runtime error, not a usage error.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(run("'" + (dir_ / "file").string() + "' --preset tiny"), 1);
  EXPECT_THAT(err_, HasSubstr((dir_ / "file").string()));
}

}  // namespace
}  // namespace pagellm
