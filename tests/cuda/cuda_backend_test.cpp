// The CUDA backend against the CPU backend on the tiny demo models of every
// architecture: greedy tokens through the engine identical (float32 matmuls, the CPU's
// arithmetic up to summation order), and with 16-bit matmuls the logits of prefill,
// decode and replayed-graph steps within bf16 rounding of the CPU's. Skipped without
// a GPU.

#include "engine/cuda/cuda_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "support/cuda_test_util.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;
using kernels::cuda::testing::relative_error;

struct Arch {
  const char* name;
  Architecture architecture;
};
const Arch kArchitectures[] = {{"llama", Architecture::kLlama},
                               {"mistral", Architecture::kMistral},
                               {"qwen2", Architecture::kQwen2},
                               {"qwen3", Architecture::kQwen3}};

class CudaBackendTest : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    PAGELLM_REQUIRE_GPU();
    dir_ = fs::temp_directory_path() /
           ("pagellm_cuda_backend_test_" + std::to_string(::getpid()) + "_" + GetParam().name);
    write_demo_model(dir_, demo_model_preset("tiny", GetParam().architecture));
    tokenizer_ = std::make_shared<Tokenizer>(Tokenizer::from_dir(dir_));
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  BackendOptions cuda_options(bool float32) const {
    BackendOptions o;
    o.kind = "cuda";
    o.max_num_seqs = 32;
    o.max_num_batched_tokens = 256;
    o.float32_compute = float32;
    return o;
  }

  std::unique_ptr<Engine> make_engine(std::unique_ptr<Backend> backend) const {
    EngineConfig config;
    config.num_kv_blocks = 256;
    config.scheduler.max_num_seqs = 32;
    config.scheduler.max_num_batched_tokens = 256;
    config.seed = 1;
    return std::make_unique<Engine>(std::move(backend), tokenizer_, config);
  }

  // Greedy tokens of every request, all submitted at once (one batch of mixed lengths).
  static std::vector<std::vector<int32_t>> generate(
      Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      GenerationRequest r;
      r.prompt = p;
      r.params.temperature = 0;
      r.params.max_tokens = max_tokens;
      r.params.ignore_eos = true;
      auto submitted = engine.submit(std::move(r));
      EXPECT_TRUE(submitted.ok()) << submitted.message;
      streams.push_back(submitted.stream);
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& s : streams) {
      std::vector<int32_t> ids;
      if (s) {
        for (const auto& t : s->collect().tokens)
          ids.push_back(t.token);
      }
      out.push_back(ids);
    }
    return out;
  }

  fs::path dir_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

TEST_P(CudaBackendTest, GreedyTokensMatchTheCpuBackend) {
  // Prompt lengths around block boundaries, two sharing a prefix (prefix-cache hits).
  std::mt19937 rng(std::random_device{}());
  const uint32_t seed = rng();
  SCOPED_TRACE("seed " + std::to_string(seed));
  rng.seed(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 15, 16, 17, 31, 33, 100}) {
    std::vector<int32_t> p(len);
    for (auto& t : p)
      t = 3 + static_cast<int32_t>(rng() % 400);
    prompts.push_back(p);
  }
  std::vector<int32_t> shared = prompts.back();
  shared.push_back(5);
  prompts.push_back(shared);

  auto cpu_engine = make_engine(make_cpu_backend(LlamaModel::load(dir_)));
  const auto cpu = generate(*cpu_engine, prompts, 40);
  cpu_engine.reset();
  auto cuda_engine = make_engine(make_cuda_backend(dir_, cuda_options(/*float32=*/true)));
  const auto gpu = generate(*cuda_engine, prompts, 40);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(gpu[i], cpu[i]) << "prompt " << i << " of " << prompts[i].size() << " tokens";
  }
}

// One sequence stepped by hand on both backends: a prefill of 40 tokens, then decode
// steps (the first runs eagerly, the second captures a graph, the rest replay it),
// with a second sequence joining so batch buckets change.
TEST_P(CudaBackendTest, LogitsOfPrefillDecodeAndGraphStepsMatchTheCpu) {
  auto cpu = make_cpu_backend(LlamaModel::load(dir_));
  auto gpu = make_cuda_backend(dir_, cuda_options(/*float32=*/false));
  const ModelConfig& c = cpu->config();
  const kernels::DType kv_dtype = default_kv_dtype(c);
  cpu->allocate_kv_cache(64, kv_dtype);
  gpu->allocate_kv_cache(64, kv_dtype);
  std::mt19937 rng(std::random_device{}());

  // Sequence 0 uses blocks 10, 3, 7, 20 ..., sequence 1 blocks 40, 41, ...
  const std::vector<int32_t> blocks0 = {10, 3, 7, 20, 1, 2};
  const std::vector<int32_t> blocks1 = {40, 41, 42, 43};
  auto slot = [](const std::vector<int32_t>& blocks, int32_t pos) {
    return int64_t(blocks[pos / 16]) * 16 + pos % 16;
  };
  std::vector<int32_t> seq0, seq1;
  for (int i = 0; i < 40; ++i)
    seq0.push_back(3 + static_cast<int32_t>(rng() % 400));
  for (int i = 0; i < 9; ++i)
    seq1.push_back(3 + static_cast<int32_t>(rng() % 400));

  auto compare = [&](const ForwardBatch& b, const std::string& what) {
    ForwardOutput a, g;
    cpu->forward(b, a);
    gpu->forward(b, g);
    const double err = relative_error(g.logits, a.logits);
    EXPECT_LT(err, 3e-2) << what;
    return a.argmax;
  };

  // Prefill of sequence 0 (40 tokens) and of sequence 1 (9 tokens) in one batch.
  ForwardBatch b;
  b.max_blocks_per_seq = 6;
  b.query_start = {0};
  b.block_tables.assign(2 * 6, -1);
  for (int i = 0; i < 40; ++i) {
    b.token_ids.push_back(seq0[i]);
    b.positions.push_back(i);
    b.slots.push_back(slot(blocks0, i));
  }
  b.query_start.push_back(40);
  for (int i = 0; i < 9; ++i) {
    b.token_ids.push_back(seq1[i]);
    b.positions.push_back(i);
    b.slots.push_back(slot(blocks1, i));
  }
  b.query_start.push_back(49);
  b.context_lens = {40, 9};
  std::copy(blocks0.begin(), blocks0.end(), b.block_tables.begin());
  std::copy(blocks1.begin(), blocks1.end(), b.block_tables.begin() + 6);
  b.logit_rows = {39, 48};
  std::vector<int32_t> next = compare(b, "prefill");
  seq0.push_back(next[0]);
  seq1.push_back(next[1]);

  // Decode steps of both (several replays of one graph bucket).
  for (int step = 0; step < 6; ++step) {
    ForwardBatch d;
    d.max_blocks_per_seq = 6;
    d.block_tables.assign(2 * 6, -1);
    std::copy(blocks0.begin(), blocks0.end(), d.block_tables.begin());
    std::copy(blocks1.begin(), blocks1.end(), d.block_tables.begin() + 6);
    const int32_t p0 = static_cast<int32_t>(seq0.size()) - 1;
    const int32_t p1 = static_cast<int32_t>(seq1.size()) - 1;
    d.token_ids = {seq0.back(), seq1.back()};
    d.positions = {p0, p1};
    d.slots = {slot(blocks0, p0), slot(blocks1, p1)};
    d.query_start = {0, 1, 2};
    d.context_lens = {p0 + 1, p1 + 1};
    d.logit_rows = {0, 1};
    next = compare(d, "decode step " + std::to_string(step));
    seq0.push_back(next[0]);
    seq1.push_back(next[1]);
  }
  // Sequence 0 alone (a smaller bucket), three steps.
  for (int step = 0; step < 3; ++step) {
    ForwardBatch d;
    d.max_blocks_per_seq = 6;
    d.block_tables = blocks0;
    const int32_t p0 = static_cast<int32_t>(seq0.size()) - 1;
    d.token_ids = {seq0.back()};
    d.positions = {p0};
    d.slots = {slot(blocks0, p0)};
    d.query_start = {0, 1};
    d.context_lens = {p0 + 1};
    d.logit_rows = {0};
    d.host_logits = {1};
    next = compare(d, "single decode step " + std::to_string(step));
    seq0.push_back(next[0]);
  }
}

TEST_P(CudaBackendTest, ArgmaxOnlyRowsSkipTheLogitsCopy) {
  auto gpu = make_cuda_backend(dir_, cuda_options(/*float32=*/false));
  gpu->allocate_kv_cache(8, default_kv_dtype(gpu->config()));
  ForwardBatch b;
  b.token_ids = {5, 6, 7};
  b.positions = {0, 1, 2};
  b.slots = {0, 1, 2};
  b.query_start = {0, 3};
  b.context_lens = {3};
  b.block_tables = {0};
  b.max_blocks_per_seq = 1;
  b.logit_rows = {2};
  b.host_logits = {0};
  ForwardOutput out;
  gpu->forward(b, out);
  ASSERT_EQ(out.argmax.size(), 1u);
  EXPECT_GE(out.argmax[0], 0);
  EXPECT_LT(out.argmax[0], gpu->config().vocab_size);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaBackendTest, ::testing::ValuesIn(kArchitectures),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CudaBackendSelection, AutoPicksTheCpuWithoutADevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(cuda_device_available());
  EXPECT_TRUE(cuda_backend_built());
}

}  // namespace
}  // namespace pagellm::engine
