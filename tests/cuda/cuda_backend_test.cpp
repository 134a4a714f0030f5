// The CUDA backend against the CPU backend on the tiny demo models of every
// architecture: greedy tokens through the engine identical (float32 matmuls, the CPU's
// arithmetic up to summation order), and with 16-bit matmuls the logits of prefill,
// decode and replayed-graph steps within bf16 rounding of the CPU's. Skipped without
// a GPU.

#include "engine/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "engine/tokenizer_config.h"
#include "support/cuda_test_util.h"
#include "support/temp_model.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;
using kernels::cuda::testing::relative_error;

struct Arch {
  const char* name;
  Architecture architecture;
  bool tied = false;  // tie_word_embeddings: lm_head is the embedding
};
const Arch kArchitectures[] = {{"llama", Architecture::kLlama},
                               {"mistral", Architecture::kMistral},
                               {"qwen2", Architecture::kQwen2},
                               {"qwen3", Architecture::kQwen3},
                               {"llama_tied", Architecture::kLlama, true}};

class CudaBackendTest : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    PAGELLM_REQUIRE_GPU();
    DemoModelSpec spec = demo_model_preset("tiny", GetParam().architecture);
    spec.tie_word_embeddings = GetParam().tied;
    model_.emplace(std::string("pagellm_cuda_backend_test_") + GetParam().name, spec);
    dir_ = model_->path();
    tokenizer_ = std::make_shared<Tokenizer>(Tokenizer::from_dir(dir_));
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
    std::vector<GenerationRequest> requests;
    for (const auto& p : prompts) {
      GenerationRequest r;
      r.prompt = p;
      r.params.temperature = 0;
      r.params.max_tokens = max_tokens;
      r.params.ignore_eos = true;
      requests.push_back(std::move(r));
    }
    return generate(engine, requests);
  }

  static std::vector<std::vector<int32_t>> generate(
      Engine& engine, const std::vector<GenerationRequest>& requests) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerationRequest& r : requests) {
      auto submitted = engine.submit(r);
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

  // The same architecture with float32 weights, so a float32 KV cache too, for the tests
  // that compare with the CPU up to summation order: over a bf16 cache, a K or V value
  // within rounding of a bf16 midpoint rounds one way on one backend and the other way
  // on the other (one bf16 ulp, 2^-8), which moved logits by up to 4e-4 in about half
  // the runs, and now and then a greedy token.
  const fs::path& float32_dir() {
    if (!model_f32_) {
      DemoModelSpec spec = demo_model_preset("tiny", GetParam().architecture);
      spec.tie_word_embeddings = GetParam().tied;
      spec.dtype = kernels::DType::kF32;
      model_f32_.emplace(std::string("pagellm_cuda_backend_test_f32_") + GetParam().name, spec);
    }
    return model_f32_->path();
  }

  std::optional<testing::TempDemoModel> model_, model_f32_;
  fs::path dir_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

TEST_P(CudaBackendTest, GreedyTokensMatchTheCpuBackend) {
  // Prompt lengths around block boundaries, two sharing a prefix (prefix-cache hits).
  const uint32_t seed = kernels::cuda::testing::fresh_seed();
  SCOPED_TRACE(kernels::cuda::testing::seed_trace(seed));
  std::mt19937 rng(seed);
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

  auto cpu_engine = make_engine(make_cpu_backend(LlamaModel::load(float32_dir())));
  const auto cpu = generate(*cpu_engine, prompts, 40);
  cpu_engine.reset();
  auto cuda_engine = make_engine(make_cuda_backend(float32_dir(), cuda_options(/*float32=*/true)));
  const auto gpu = generate(*cuda_engine, prompts, 40);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(gpu[i], cpu[i]) << "prompt " << i << " of " << prompts[i].size() << " tokens";
  }
}

// Penalties and logit biases applied on the device (then the argmax again, after a
// replayed graph's) give the CPU backend's greedy tokens; so does the host path, taken by
// a request that also asks for logprobs. All in one batch, each row with its own list.
TEST_P(CudaBackendTest, PenalizedTokensMatchTheCpuBackend) {
  const uint32_t seed = kernels::cuda::testing::fresh_seed();
  SCOPED_TRACE(kernels::cuda::testing::seed_trace(seed));
  std::mt19937 rng(seed);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt.resize(20 + 7 * i);
    for (auto& t : r.prompt)
      t = 3 + static_cast<int32_t>(rng() % 40);  // a small range: tokens repeat
    r.params.temperature = 0;
    r.params.max_tokens = 40;
    r.params.ignore_eos = true;
    switch (i) {
      case 0:
        break;  // none
      case 1:
        r.params.repetition_penalty = 1.4f;
        break;
      case 2:
        r.params.presence_penalty = 0.7f;
        r.params.frequency_penalty = 0.5f;
        break;
      case 3:
        r.params.logit_bias = {{10, 100.0f}, {11, -3.0f}};
        break;
      case 4:
        r.params.repetition_penalty = 1.2f;
        r.params.frequency_penalty = 0.3f;
        r.params.logit_bias = {{12, 2.0f}};
        break;
      case 5:  // the host path
        r.params.repetition_penalty = 1.4f;
        r.params.logprobs = true;
        break;
    }
    requests.push_back(std::move(r));
  }
  std::vector<GenerationRequest> unpenalized = requests;
  for (GenerationRequest& r : unpenalized)
    r.params = requests[0].params;
  auto cpu_engine = make_engine(make_cpu_backend(LlamaModel::load(float32_dir())));
  const auto cpu = generate(*cpu_engine, requests);
  const auto cpu_unpenalized = generate(*cpu_engine, unpenalized);
  cpu_engine.reset();
  auto cuda_engine = make_engine(make_cuda_backend(float32_dir(), cuda_options(/*float32=*/true)));
  const auto gpu = generate(*cuda_engine, requests);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(gpu[i], cpu[i]) << "request " << i;
  // The penalties did change tokens, so the comparison is of two paths that apply them.
  EXPECT_EQ(gpu[3], std::vector<int32_t>(40, 10));  // a bias of 100 wins every step
  int changed = 0;
  for (size_t i : {1, 2, 4})
    changed += cpu[i] != cpu_unpenalized[i] ? 1 : 0;
  EXPECT_GE(changed, 1) << "of the repetition, presence and frequency requests";
}

// Sequences stepped by hand on both backends, each with its own shuffled blocks.
class HandBatches {
 public:
  HandBatches(int num_seqs, int num_blocks, std::mt19937& rng) : rng_(rng) {
    std::vector<int32_t> ids(num_blocks);
    for (int i = 0; i < num_blocks; ++i)
      ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng_);
    const int per_seq = num_blocks / num_seqs;
    for (int s = 0; s < num_seqs; ++s) {
      blocks_.emplace_back(ids.begin() + s * per_seq, ids.begin() + (s + 1) * per_seq);
      tokens_.emplace_back();
    }
  }
  int32_t random_token() { return 3 + static_cast<int32_t>(rng_() % 400); }
  std::vector<int32_t>& tokens(int s) { return tokens_[s]; }

  // One step: sequence s computes its tokens [computed[s], tokens(s).size()).
  ForwardBatch step(const std::vector<int>& seqs, const std::vector<int32_t>& computed) const {
    ForwardBatch b;
    b.max_blocks_per_seq = static_cast<int32_t>(blocks_.front().size());
    b.query_start = {0};
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int s = seqs[i];
      for (int32_t p = computed[i]; p < static_cast<int32_t>(tokens_[s].size()); ++p) {
        b.token_ids.push_back(tokens_[s][p]);
        b.positions.push_back(p);
        b.slots.push_back(int64_t(blocks_[s][p / 16]) * 16 + p % 16);
      }
      b.query_start.push_back(b.num_tokens());
      b.context_lens.push_back(static_cast<int32_t>(tokens_[s].size()));
      b.block_tables.insert(b.block_tables.end(), blocks_[s].begin(), blocks_[s].end());
      b.logit_rows.push_back(b.num_tokens() - 1);
    }
    return b;
  }

 private:
  std::mt19937& rng_;
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<std::vector<int32_t>> tokens_;
};

// Three sequences stepped by hand on both backends: one prefill batch, then decode
// steps of three (padded to the graph bucket of four: the first step of a bucket runs
// eagerly, the second captures its graph, the rest replay it), one sequence crossing a
// 512-token context (a new graph bucket), then one alone. Every step's logits must be
// within bf16 rounding of the CPU's.
TEST_P(CudaBackendTest, LogitsOfPrefillDecodeAndGraphStepsMatchTheCpu) {
  auto cpu = make_cpu_backend(LlamaModel::load(dir_));
  auto gpu = make_cuda_backend(dir_, cuda_options(/*float32=*/false));
  const ModelConfig& c = cpu->config();
  const kernels::DType kv_dtype = default_kv_dtype(c);
  cpu->allocate_kv_cache(150, kv_dtype);
  gpu->allocate_kv_cache(150, kv_dtype);
  const uint32_t seed = kernels::cuda::testing::fresh_seed();
  SCOPED_TRACE(kernels::cuda::testing::seed_trace(seed));
  std::mt19937 rng(seed);
  HandBatches h(3, 150, rng);  // 50 blocks (800 tokens) each
  const int prompt[] = {505, 9, 40};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < prompt[s]; ++i)
      h.tokens(s).push_back(h.random_token());
  }

  auto run = [&](const ForwardBatch& b, const std::string& what) {
    ForwardOutput a, g;
    cpu->forward(b, a);
    gpu->forward(b, g);
    EXPECT_LT(relative_error(g.logits, a.logits), 3e-2) << what;
    EXPECT_EQ(g.argmax.size(), a.argmax.size()) << what;
    return a.argmax;
  };
  std::vector<int32_t> next = run(h.step({0, 1, 2}, {0, 0, 0}), "prefill");
  for (int s = 0; s < 3; ++s)
    h.tokens(s).push_back(next[s]);
  for (int step = 0; step < 12; ++step) {  // sequence 0 goes from 506 to 517 tokens
    std::vector<int32_t> computed;
    for (int s = 0; s < 3; ++s)
      computed.push_back(static_cast<int32_t>(h.tokens(s).size()) - 1);
    next = run(h.step({0, 1, 2}, computed), "decode step " + std::to_string(step));
    for (int s = 0; s < 3; ++s)
      h.tokens(s).push_back(next[s]);
  }
  for (int step = 0; step < 4; ++step) {
    const int32_t computed = static_cast<int32_t>(h.tokens(1).size()) - 1;
    next = run(h.step({1}, {computed}), "single decode step " + std::to_string(step));
    h.tokens(1).push_back(next[0]);
  }
}

// The argmax of every row, the logits of only the rows asked for, and device draws
// (float32 weights and cache, so the logits are the CPU's up to summation order), some rows with
// penalties: tokens equal the CPU backend's, draws included, except where a draw falls
// within rounding of a boundary; the logits the host receives are the model's own.
TEST_P(CudaBackendTest, ArgmaxPartialLogitsAndDrawsMatchTheCpu) {
  auto cpu = make_cpu_backend(LlamaModel::load(float32_dir()));
  auto gpu = make_cuda_backend(float32_dir(), cuda_options(/*float32=*/true));
  const kernels::DType kv_dtype = default_kv_dtype(cpu->config());
  ASSERT_EQ(kv_dtype, kernels::DType::kF32);
  cpu->allocate_kv_cache(64, kv_dtype);
  gpu->allocate_kv_cache(64, kv_dtype);
  const uint32_t seed = kernels::cuda::testing::fresh_seed();
  SCOPED_TRACE(kernels::cuda::testing::seed_trace(seed));
  std::mt19937 rng(seed);
  HandBatches h(8, 64, rng);
  for (int s = 0; s < 8; ++s) {
    for (int i = 0; i < 5 + s * 3; ++i)
      h.tokens(s).push_back(h.random_token());
  }
  ForwardBatch b = h.step({0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 0, 0, 0, 0, 0});
  b.host_logits = {1, 0, 0, 1, 0, 0, 0, 1};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int r = 0; r < 8; ++r) {
    RowSampling row;
    if (r % 2 == 1) row = {0.8f, r == 3 ? 20 : 0, 0.9f, 0.02f, u(rng)};
    b.sampling.push_back(row);
  }
  // Penalties on rows 1 (drawn), 2 (greedy: a bias that must win) and 4 (greedy); the
  // host rows 0, 3 and 7 have none, as the engine sends them.
  b.penalty_rows.resize(8);
  auto penalize = [&](int r, kernels::PenaltyRow row, std::vector<kernels::PenaltyToken> list) {
    row.begin = static_cast<int32_t>(b.penalty_tokens.size());
    row.end = row.begin + static_cast<int32_t>(list.size());
    b.penalty_tokens.insert(b.penalty_tokens.end(), list.begin(), list.end());
    b.penalty_rows[r] = row;
  };
  std::vector<kernels::PenaltyToken> seen;
  for (int32_t t : h.tokens(1))
    seen.push_back({t, 1, 0.0f, kernels::kPenaltyInPrompt});
  std::sort(seen.begin(), seen.end(), [](auto& x, auto& y) { return x.token < y.token; });
  seen.erase(
      std::unique(seen.begin(), seen.end(), [](auto& x, auto& y) { return x.token == y.token; }),
      seen.end());
  penalize(1, {0, 0, 1.5f, 0.3f, 0.2f}, seen);
  penalize(2, {}, {{7, 0, 1000.0f, kernels::kPenaltyHasBias}});
  penalize(4, {0, 0, 2.0f, 0.0f, 0.0f}, seen);
  ForwardOutput a, g;
  cpu->forward(b, a);
  gpu->forward(b, g);
  const int64_t vocab = cpu->config().vocab_size;
  ASSERT_EQ(g.argmax.size(), 8u);
  ASSERT_EQ(g.sampled.size(), 8u);
  EXPECT_EQ(g.argmax, a.argmax);
  EXPECT_EQ(g.argmax[2], 7);
  int same_draws = 0;
  for (int r = 0; r < 8; ++r) {
    if (b.host_logits[r]) {
      const std::vector<float> gr(g.logits.begin() + r * vocab, g.logits.begin() + (r + 1) * vocab);
      const std::vector<float> ar(a.logits.begin() + r * vocab, a.logits.begin() + (r + 1) * vocab);
      EXPECT_LT(relative_error(gr, ar), 1e-4) << "row " << r;
    }
    if (b.sampling[r].temperature > 0.0f) {
      ASSERT_TRUE(g.sampled[r] >= 0 && g.sampled[r] < vocab) << "row " << r;
      same_draws += g.sampled[r] == a.sampled[r] ? 1 : 0;
    } else {
      EXPECT_EQ(g.sampled[r], g.argmax[r]) << "row " << r;
    }
  }
  EXPECT_GE(same_draws, 3) << "of 4 draws";
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaBackendTest, ::testing::ValuesIn(kArchitectures),
                         [](const auto& info) { return std::string(info.param.name); });

// Without a GPU, auto loads the CPU backend and cuda is refused with the reason.
TEST(CudaBackendSelection, AutoPicksTheCpuWithoutADevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(cuda_device_available());
  const testing::TempDemoModel model("pagellm_cuda_selection_test", demo_model_preset("tiny"));
  BackendOptions o;
  o.kind = "auto";
  EXPECT_EQ(load_backend(model.path(), o)->name(), "cpu");
  o.kind = "cuda";
  EXPECT_THROW(load_backend(model.path(), o), ConfigError);
}

}  // namespace
}  // namespace pagellm::engine
