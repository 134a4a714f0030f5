// The correctness anchor: greedy generation through the paged, batched, chunked path
// gives exactly the tokens of a plain implementation that recomputes every sequence
// from scratch each step (tests/support/reference_llama.h), for every architecture.

#include "engine/llama_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "engine/demo_model.h"
#include "engine/forward_batch_builder.h"
#include "engine/kv_cache_memory.h"
#include "paging/kv_cache_manager.h"
#include "support/reference_llama.h"
#include "support/temp_model.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// A minimal serving loop: sequences join at different steps, prompts are prefilled in
// chunks of at most `chunk` tokens while others decode, and every step is one forward
// pass over all of them through the paged KV cache.
struct PagedRun {
  struct Seq {
    paging::SeqId id;
    std::vector<int32_t> tokens;
    int32_t prompt_len;
    int32_t computed = 0;
    int32_t join_step;
    std::vector<int32_t> generated;
    std::vector<std::vector<float>> logits;  // of each generated token
  };

  LlamaModel& model;
  paging::KVCacheManager& kv;
  KVCacheMemory& memory;
  int32_t chunk;
  int32_t max_new_tokens;
  int32_t window;  // sliding window: release blocks no query will read again
  std::vector<Seq> seqs;
  int64_t hit_tokens = 0;

  void run() {
    ForwardBatch batch;
    std::vector<float> logits;
    const int64_t vocab = model.config().vocab_size;
    for (int32_t step = 0;; ++step) {
      std::vector<ScheduledChunk> chunks;
      std::vector<Seq*> scheduled;
      bool pending = false;
      for (Seq& s : seqs) {
        if (static_cast<int32_t>(s.generated.size()) >= max_new_tokens) continue;
        pending = true;
        if (s.join_step > step) continue;
        const bool is_new = !kv.has_sequence(s.id);
        if (is_new) {
          const std::span<const int32_t> prompt(s.tokens.data(), s.prompt_len);
          const paging::PrefixMatch match = kv.match_prefix(prompt);
          s.computed = match.num_cached_tokens;
          hit_tokens += match.num_cached_tokens;
          const int32_t n = std::min(chunk, s.prompt_len - s.computed);
          ASSERT_TRUE(kv.add_sequence(s.id, match, n));
          chunks.push_back({s.id, s.tokens, s.computed, n, s.computed + n == s.prompt_len});
        } else {
          if (window > 0) kv.release_blocks_before(s.id, s.computed - window + 1);
          const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - s.computed;
          const int32_t n = std::min(chunk, remaining);
          ASSERT_TRUE(kv.allocate_slots(s.id, n));
          chunks.push_back({s.id, s.tokens, s.computed, n, n == remaining});
        }
        scheduled.push_back(&s);
      }
      if (!pending) break;
      if (chunks.empty()) continue;
      const auto copies = kv.take_block_copies();
      build_forward_batch(chunks, kv, copies, batch);
      model.forward(batch, memory, logits);
      int32_t row = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        Seq& s = *scheduled[i];
        s.computed += chunks[i].num_new;
        kv.cache_full_blocks(s.id, std::span(s.tokens).first(s.computed));
        if (!chunks[i].wants_logits) continue;
        const float* r = logits.data() + row++ * vocab;
        s.logits.emplace_back(r, r + vocab);
        const int32_t next = argmax(r, vocab);
        s.generated.push_back(next);
        s.tokens.push_back(next);
      }
    }
  }
};

struct ArchCase {
  std::string name;
  DemoModelSpec spec;
};

void PrintTo(const ArchCase& c, std::ostream* os) {
  *os << c.name;
}

class LlamaModelExactness : public ::testing::TestWithParam<ArchCase> {};

TEST_P(LlamaModelExactness, PagedBatchedGreedyEqualsPlainRecompute) {
  const ArchCase& c = GetParam();
  const testing::TempDemoModel folder("pagellm_model_test_" + c.name, c.spec);
  const fs::path& dir = folder.path();
  auto model = LlamaModel::load(dir);
  const ModelConfig& config = model->config();
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir);
  const kernels::DType kv_dtype = default_kv_dtype(config);
  const testing::ReferenceLlama reference(config, bind_weights(config, checkpoint), kv_dtype);

  constexpr int kBlocks = 256;
  paging::KVCacheManager kv(kBlocks);
  KVCacheMemory memory(config, kBlocks, kv_dtype);
  PagedRun run{*model,
               kv,
               memory,
               /*chunk=*/24,
               /*max_new_tokens=*/8,
               static_cast<int32_t>(config.sliding_window),
               {}};

  // Prompt lengths around block boundaries, and a second wave that repeats earlier
  // prompts' prefixes so that it starts from the prefix cache.
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  const int lengths[] = {1, 15, 16, 17, 31, 33, 100, 2, 47, 64, 5, 16};
  std::vector<std::vector<int32_t>> prompts;
  for (int len : lengths) {
    std::vector<int32_t> p(len);
    for (auto& t : p)
      t = token(rng);
    prompts.push_back(p);
  }
  for (int i : {6, 9, 5, 4}) {  // 100-, 64-, 33- and 31-token prompts plus a new tail
    std::vector<int32_t> p = prompts[i];
    for (int extra = 0; extra < 3 + i; ++extra)
      p.push_back(token(rng));
    prompts.push_back(p);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int32_t join = i < 12 ? static_cast<int32_t>(i / 3) : 20;  // wave 2 after wave 1
    run.seqs.push_back({static_cast<paging::SeqId>(i),
                        prompts[i],
                        static_cast<int32_t>(prompts[i].size()),
                        0,
                        join,
                        {},
                        {}});
  }
  run.run();
  if (HasFatalFailure()) return;
  EXPECT_GT(run.hit_tokens, 0) << "the second wave should start from cached prefixes";

  double max_diff = 0;
  for (const auto& s : run.seqs) {
    const std::vector<int32_t> prompt(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
    EXPECT_EQ(s.generated, reference.greedy(prompt, run.max_new_tokens))
        << c.name << ": prompt of " << s.prompt_len << " tokens";
    // Logits of the first and last generated token against the reference's.
    for (size_t g : {size_t{0}, s.generated.size() - 1}) {
      std::vector<int32_t> context(s.tokens.begin(), s.tokens.begin() + s.prompt_len + g);
      const std::vector<float> want = reference.next_logits(context);
      for (size_t v = 0; v < want.size(); ++v) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(want[v] - s.logits[g][v])));
      }
    }
  }
  RecordProperty("max_logit_diff", std::to_string(max_diff));
  std::printf("[ %s ] largest logit difference against the plain recompute: %.3g\n", c.name.c_str(),
              max_diff);
  // A 16-bit cache rounds K and V; a last-bit difference before that rounding (the two
  // implementations sum in different orders) can move a cached value by one 16-bit ulp,
  // hence the looser bound. Tokens must agree exactly either way.
  EXPECT_LT(max_diff, kv_dtype == kernels::DType::kF32 ? 1e-4 : 1e-2);
}

DemoModelSpec tiny(Architecture arch) {
  return demo_model_preset("tiny", arch);
}

std::vector<ArchCase> cases() {
  std::vector<ArchCase> out;
  DemoModelSpec llama = tiny(Architecture::kLlama);
  out.push_back({"llama", llama});
  DemoModelSpec llama31 = tiny(Architecture::kLlama);
  llama31.rope_scaling = RopeScaling{.factor = 8.0,
                                     .low_freq_factor = 1.0,
                                     .high_freq_factor = 4.0,
                                     .original_max_position_embeddings = 64};
  llama31.tie_word_embeddings = true;
  out.push_back({"llama3_scaled_tied", llama31});
  DemoModelSpec linear = tiny(Architecture::kLlama);
  linear.rope_scaling = RopeScaling{.factor = 4.0};
  linear.rope_scaling->type = RopeScaling::Type::kLinear;
  out.push_back({"llama_linear_rope", linear});
  // YaRN over an original context of 32: for the tiny head's 8 frequencies, the band of
  // 32 to 1 rotations covers dimensions 0 to 3, so kept, blended and divided ones all
  // occur; the attention factor is 0.1 ln 8 + 1. The model folds its square into the
  // softmax scale where the reference scales q and k, so a 16-bit cache would round
  // different numbers: float32 weights (and cache) compare the arithmetic itself.
  DemoModelSpec yarn = tiny(Architecture::kLlama);
  yarn.dtype = kernels::DType::kF32;
  yarn.rope_scaling = RopeScaling{.factor = 8.0};
  yarn.rope_scaling->type = RopeScaling::Type::kYarn;
  yarn.rope_scaling->original_max_position_embeddings = 32;
  out.push_back({"llama_yarn_rope", yarn});
  DemoModelSpec mqa = tiny(Architecture::kLlama);
  mqa.num_kv_heads = 1;
  mqa.dtype = kernels::DType::kF16;
  out.push_back({"llama_mqa_f16", mqa});
  DemoModelSpec mistral = tiny(Architecture::kMistral);
  mistral.sliding_window = 24;
  out.push_back({"mistral_window24", mistral});
  out.push_back({"qwen2", tiny(Architecture::kQwen2)});
  DemoModelSpec qwen3 = tiny(Architecture::kQwen3);
  qwen3.dtype = kernels::DType::kF32;
  out.push_back({"qwen3_f32", qwen3});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Architectures, LlamaModelExactness, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pagellm::engine
