// The engine end to end on a tiny demo model: concurrency, preemption, abort, stop
// strings, seeds, usage and refusals, through the public submit/stream interface.

#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/incremental_detokenizer.h"
#include "engine/llama_model.h"
#include "support/temp_model.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;
using scheduler::FinishReason;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new testing::TempDemoModel("pagellm_engine_test", demo_model_preset("tiny"));
    tokenizer_ = new std::shared_ptr<const Tokenizer>(
        std::make_shared<Tokenizer>(Tokenizer::from_dir(model_->path())));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
  }

  static std::unique_ptr<Engine> make_engine(int64_t num_blocks, int32_t max_num_seqs = 64,
                                             int32_t max_waiting = 1000) {
    EngineConfig config;
    config.num_kv_blocks = num_blocks;
    config.scheduler.max_num_seqs = max_num_seqs;
    config.scheduler.max_num_batched_tokens = 256;
    config.scheduler.max_waiting = max_waiting;
    config.seed = 1;
    return std::make_unique<Engine>(LlamaModel::load(model_->path()), *tokenizer_, config);
  }

  static GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    return r;
  }

  static std::vector<int32_t> token_ids(const GenerationChunk& c) {
    std::vector<int32_t> ids;
    for (const auto& t : c.tokens)
      ids.push_back(t.token);
    return ids;
  }

  static inline testing::TempDemoModel* model_ = nullptr;
  static inline std::shared_ptr<const Tokenizer>* tokenizer_ = nullptr;
};

TEST_F(EngineTest, ConcurrentRequestsGetTheirSoloTokensEvenWithPreemption) {
  std::mt19937 rng(5);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 64; ++i) {
    std::vector<int32_t> prompt(5 + rng() % 60);
    for (auto& t : prompt)
      t = 3 + rng() % 400;
    if (i % 4 == 0)
      prompt.insert(prompt.begin(),
                    {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
    requests.push_back(greedy(prompt, 12 + rng() % 12));
  }
  // Alone: one request at a time on a roomy engine.
  std::vector<std::vector<int32_t>> solo;
  {
    auto engine = make_engine(512);
    for (const auto& r : requests) {
      auto submitted = engine->submit(r);
      ASSERT_TRUE(submitted.ok()) << submitted.message;
      const GenerationChunk all = submitted.stream->collect();
      ASSERT_EQ(all.finish_reason, FinishReason::kLength);
      solo.push_back(token_ids(all));
    }
  }
  // Together, from several threads at once, on a pool far too small for all of them.
  auto engine = make_engine(24);
  std::vector<std::shared_ptr<RequestStream>> streams(requests.size());
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (size_t i = c; i < requests.size(); i += 4) {
        auto submitted = engine->submit(requests[i]);
        streams[i] = submitted.stream;
      }
    });
  }
  for (auto& t : clients)
    t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(streams[i]) << "request " << i << " refused";
    const GenerationChunk all = streams[i]->collect();
    EXPECT_EQ(token_ids(all), solo[i]) << "request " << i;
    EXPECT_EQ(all.usage.completion_tokens, static_cast<int32_t>(solo[i].size()));
    EXPECT_EQ(all.usage.prompt_tokens, static_cast<int32_t>(requests[i].prompt.size()));
  }
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.scheduler.num_preemptions, 0) << "the pool was meant to force preemptions";
  EXPECT_EQ(stats.kv.used_blocks, 0);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_GT(stats.kv.prefix_hit_tokens, 0);
}

TEST(RequestStream, CollectUpToADeadlineGivesWhatHasCome) {
  RequestStream stream(1);
  GenerationChunk part;
  part.text = "ab";
  stream.push(part);
  const GenerationChunk cut =
      stream.collect(std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
  EXPECT_EQ(cut.text, "ab");
  EXPECT_FALSE(cut.finished);
  // Past its deadline it still takes what has come.
  GenerationChunk end;
  end.text = "c";
  end.finished = true;
  end.finish_reason = FinishReason::kLength;
  stream.push(end);
  const GenerationChunk rest = stream.collect(std::chrono::steady_clock::now());
  EXPECT_EQ(rest.text, "c");
  EXPECT_TRUE(rest.finished);
  EXPECT_EQ(rest.finish_reason, FinishReason::kLength);
}

TEST_F(EngineTest, AbortMidStreamFreesTheBlocks) {
  auto engine = make_engine(64);
  auto submitted = engine->submit(greedy(std::vector<int32_t>(40, 5), 500));
  ASSERT_TRUE(submitted.ok());
  auto first = submitted.stream->next(std::chrono::seconds(10));
  ASSERT_TRUE(first);
  engine->abort(submitted.stream->id());
  GenerationChunk rest = submitted.stream->collect();
  EXPECT_TRUE(rest.finished);
  EXPECT_EQ(rest.finish_reason, FinishReason::kAbort);
  // The step that handled the abort freed the blocks; stats follow that step.
  for (int i = 0; i < 100 && engine->stats().kv.used_blocks != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine->stats().kv.used_blocks, 0);
  EXPECT_EQ(engine->stats().finished_abort, 1);
}

TEST_F(EngineTest, StopStringEndsTheTextBeforeIt) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(12, 40);
  const GenerationChunk full = engine->submit(greedy(prompt, 40)).stream->collect();
  ASSERT_GT(full.text.size(), 20u) << full.text;
  const std::string stop = full.text.substr(10, 3);
  GenerationRequest r = greedy(prompt, 40);
  r.params.stop = {stop};
  const GenerationChunk cut = engine->submit(r).stream->collect();
  EXPECT_EQ(cut.finish_reason, FinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(engine->stats().kv.used_blocks, 0);
}

// A stop token ends the request as a stop string does: counted, with its logprob, but
// its text left out.
TEST_F(EngineTest, StopTokenEndsTheRequestWithoutItsText) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(12, 40);
  const GenerationChunk full = engine->submit(greedy(prompt, 40)).stream->collect();
  const std::vector<int32_t> ids = token_ids(full);
  // The first token whose text is whole and not empty, taken as the stop token.
  for (size_t n = 1; n + 1 < ids.size(); ++n) {
    const std::string before =
        engine->submit(greedy(prompt, static_cast<int32_t>(n))).stream->collect().text;
    const std::string with =
        engine->submit(greedy(prompt, static_cast<int32_t>(n) + 1)).stream->collect().text;
    if (with.size() <= before.size() ||
        std::find(ids.begin(), ids.begin() + n, ids[n]) != ids.begin() + n) {
      continue;
    }
    GenerationRequest r = greedy(prompt, 40);
    r.params.stop_token_ids = {ids[n]};
    r.params.logprobs = true;
    const GenerationChunk cut = engine->submit(r).stream->collect();
    EXPECT_EQ(cut.finish_reason, FinishReason::kStop);
    EXPECT_EQ(cut.text, before) << n;
    EXPECT_EQ(cut.usage.completion_tokens, static_cast<int32_t>(n) + 1);
    ASSERT_EQ(cut.tokens.size(), n + 1);
    EXPECT_EQ(cut.tokens.back().token, ids[n]);
    return;
  }
  FAIL() << "no token added text: " << full.text;
}

// min_tokens holds the stop token back, whether the backend picks the token or the host
// does (for logprobs): both give the same tokens.
TEST_F(EngineTest, MinTokensHoldsTheStopTokenBack) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(12, 40);
  const std::vector<int32_t> ids = token_ids(engine->submit(greedy(prompt, 20)).stream->collect());
  std::vector<int32_t> first;
  for (bool logprobs : {false, true}) {
    GenerationRequest r = greedy(prompt, 20);
    r.params.stop_token_ids = {ids[0]};
    r.params.min_tokens = 4;
    r.params.logprobs = logprobs;
    const GenerationChunk c = engine->submit(r).stream->collect();
    const std::vector<int32_t> got = token_ids(c);
    ASSERT_GE(got.size(), 4u);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_NE(got[i], ids[0]) << i;
    EXPECT_EQ(c.finish_reason == FinishReason::kStop, got.back() == ids[0]);
    if (logprobs) {
      EXPECT_EQ(got, first);
    } else {
      first = got;
    }
  }
}

// The bytes held back to the end (a token that is part of a character) become U+FFFD
// there; a stop string they complete still cuts the text, and the reason is "stop".
TEST_F(EngineTest, StopStringInTheLastHeldBackBytesFinishesWithStop) {
  auto engine = make_engine(64);
  const Tokenizer& tokenizer = **tokenizer_;
  int32_t partial = -1;  // a token the detokenizer holds back until the end
  for (int32_t id = 0; id < static_cast<int32_t>(tokenizer.vocab_size()) && partial < 0; ++id) {
    IncrementalDetokenizer d(tokenizer);
    if (d.add(id).empty() && d.finish() == "\xEF\xBF\xBD") partial = id;
  }
  ASSERT_GE(partial, 0) << "no token is part of a character";
  GenerationRequest r = greedy(std::vector<int32_t>(12, 40), 1);
  r.params.logit_bias = {{partial, 100.0f}};
  r.params.stop = {"\xEF\xBF\xBD"};
  const GenerationChunk c = engine->submit(r).stream->collect();
  ASSERT_EQ(token_ids(c), std::vector<int32_t>{partial});
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.finish_reason, FinishReason::kStop);
  EXPECT_EQ(engine->stats().finished_stop, 1);
}

// Nor does a stop string end the text within the first min_tokens tokens.
TEST_F(EngineTest, MinTokensHoldsStopStringsBack) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(12, 40);
  const GenerationChunk full = engine->submit(greedy(prompt, 12)).stream->collect();
  const std::string first = engine->submit(greedy(prompt, 1)).stream->collect().text;
  ASSERT_FALSE(first.empty());
  GenerationRequest r = greedy(prompt, 12);
  r.params.stop = {first};
  EXPECT_EQ(engine->submit(r).stream->collect().text, "");  // the first token's text
  r.params.min_tokens = 3;
  const GenerationChunk held = engine->submit(r).stream->collect();
  EXPECT_GE(held.tokens.size(), 3u);
  EXPECT_EQ(full.text.compare(0, held.text.size(), held.text), 0) << held.text;
  EXPECT_GE(held.text.size(), first.size());
}

// A stop string completed by the token that also reaches max_tokens: the text was cut at
// the stop string, so the reason is "stop".
TEST_F(EngineTest, StopStringOnTheLastAllowedTokenFinishesWithStop) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(12, 40);
  const std::string full = engine->submit(greedy(prompt, 40)).stream->collect().text;
  std::string before = engine->submit(greedy(prompt, 3)).stream->collect().text;
  for (int32_t n = 4; n <= 40; ++n) {
    const std::string text = engine->submit(greedy(prompt, n)).stream->collect().text;
    // Token n adds text, and none of it is held back as an incomplete character.
    if (text.size() > before.size() && full.compare(0, text.size(), text) == 0) {
      GenerationRequest r = greedy(prompt, n);
      r.params.stop = {text};
      const GenerationChunk cut = engine->submit(r).stream->collect();
      EXPECT_EQ(cut.finish_reason, FinishReason::kStop) << n;
      EXPECT_EQ(cut.text, "");
      EXPECT_EQ(cut.usage.completion_tokens, n);
      EXPECT_EQ(engine->stats().finished_stop, 1);
      EXPECT_EQ(engine->stats().kv.used_blocks, 0);
      return;
    }
    before = text;
  }
  FAIL() << "no token added text: " << full;
}

TEST_F(EngineTest, SameSeedSameTokens) {
  auto engine = make_engine(64);
  GenerationRequest r = greedy(std::vector<int32_t>(10, 33), 20);
  r.params.temperature = 1.0f;
  r.params.seed = 1234;
  const auto a = token_ids(engine->submit(r).stream->collect());
  const auto b = token_ids(engine->submit(r).stream->collect());
  r.params.seed = 99;
  const auto c = token_ids(engine->submit(r).stream->collect());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// A request that wants no logprobs is drawn by the backend's sampling kernel with the
// request's own random numbers; asking for logprobs moves the draw to the Sampler on the
// host. Both must give the same tokens for the same seed, greedy or not.
TEST_F(EngineTest, BackendDrawsEqualHostDrawsForTheSameSeed) {
  auto engine = make_engine(256);
  for (float temperature : {0.0f, 0.7f, 1.3f}) {
    for (int32_t top_k : {0, 20}) {
      GenerationRequest plain = greedy({5, 6, 7, 8, 9, 10, 11}, 24);
      plain.params.temperature = temperature;
      plain.params.top_k = top_k;
      plain.params.top_p = 0.9f;
      plain.params.min_p = 0.02f;
      plain.params.seed = 1234;
      GenerationRequest with_logprobs = plain;
      with_logprobs.params.logprobs = true;
      const auto a = engine->submit(plain);
      const auto b = engine->submit(with_logprobs);
      ASSERT_TRUE(a.ok() && b.ok());
      const GenerationChunk ca = a.stream->collect();
      const GenerationChunk cb = b.stream->collect();
      EXPECT_EQ(token_ids(ca), token_ids(cb))
          << "temperature " << temperature << ", top_k " << top_k;
      EXPECT_EQ(token_ids(ca).size(), 24u);
    }
  }
}

// Penalties and logit biases are applied by the backend, from the Sampler's counts, for
// a request that wants no logprobs, and by the Sampler on the host for one that does.
// Both must give the same tokens, greedy or drawn, with all of them in one batch (each
// row with its own list).
TEST_F(EngineTest, BackendPenaltiesEqualHostPenalties) {
  auto engine = make_engine(512);
  struct Setting {
    const char* name;
    float repetition, presence, frequency, temperature;
    std::vector<std::pair<int32_t, float>> bias;
  };
  const std::vector<Setting> settings = {
      {"none", 1.0f, 0.0f, 0.0f, 0.0f, {}},
      {"repetition", 1.5f, 0.0f, 0.0f, 0.0f, {}},
      {"presence and frequency", 1.0f, 0.8f, 0.6f, 0.0f, {}},
      {"bias", 1.0f, 0.0f, 0.0f, 0.0f, {{40, 100.0f}, {41, -2.0f}}},
      {"all, drawn", 1.3f, 0.5f, 0.4f, 0.9f, {{40, 1.0f}}},
      {"repetition, drawn", 1.5f, 0.0f, 0.0f, 1.2f, {}},
  };
  std::vector<SubmitResult> plain, with_logprobs;
  for (const Setting& setting : settings) {
    GenerationRequest r = greedy({5, 6, 7, 8, 9, 10, 11, 5, 6, 7}, 32);
    r.params.repetition_penalty = setting.repetition;
    r.params.presence_penalty = setting.presence;
    r.params.frequency_penalty = setting.frequency;
    r.params.temperature = setting.temperature;
    r.params.logit_bias = setting.bias;
    r.params.seed = 77;
    GenerationRequest l = r;
    l.params.logprobs = true;
    plain.push_back(engine->submit(r));
    with_logprobs.push_back(engine->submit(l));
  }
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < settings.size(); ++i) {
    ASSERT_TRUE(plain[i].ok() && with_logprobs[i].ok());
    tokens.push_back(token_ids(plain[i].stream->collect()));
    EXPECT_EQ(tokens.back(), token_ids(with_logprobs[i].stream->collect())) << settings[i].name;
    EXPECT_EQ(tokens.back().size(), 32u) << settings[i].name;
  }
  // The penalties did change the greedy tokens: the test compares two paths that apply
  // them, not two that skip them.
  for (size_t i = 1; i < 4; ++i)
    EXPECT_NE(tokens[i], tokens[0]) << settings[i].name;
  EXPECT_EQ(tokens[3], std::vector<int32_t>(32, 40));  // a bias of 100 wins every step
}

TEST_F(EngineTest, UsageCountsCachedPromptTokensAndTimesAreOrdered) {
  auto engine = make_engine(64);
  const std::vector<int32_t> prompt(50, 77);
  const GenerationChunk first = engine->submit(greedy(prompt, 4)).stream->collect();
  const GenerationChunk second = engine->submit(greedy(prompt, 4)).stream->collect();
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(second.usage.cached_prompt_tokens, 48);
  const auto& t = second.times;
  EXPECT_LE(t.arrival, t.first_scheduled);
  EXPECT_LE(t.first_scheduled, t.first_token);
  EXPECT_LE(t.first_token, t.last_token);
  EXPECT_LE(t.last_token, t.finished);
  ASSERT_EQ(second.token_times.size(), 4u);
  EXPECT_EQ(second.token_times.front(), t.first_token);
  EXPECT_EQ(second.token_times.back(), t.last_token);
  EXPECT_TRUE(std::is_sorted(second.token_times.begin(), second.token_times.end()));
}

TEST_F(EngineTest, RefusesWhatCanNeverRunAndFullQueues) {
  {
    auto engine = make_engine(4);
    auto too_long = engine->submit(greedy(std::vector<int32_t>(10, 1), 100000));
    EXPECT_FALSE(too_long.ok());
    EXPECT_EQ(too_long.status, scheduler::AddStatus::kTooLong);
    auto too_big = engine->submit(greedy(std::vector<int32_t>(60, 1), 10));
    EXPECT_EQ(too_big.status, scheduler::AddStatus::kNeverFits) << too_big.message;
    auto bad_id = engine->submit(greedy({1, 2, 1 << 20}, 1));
    EXPECT_EQ(bad_id.status, scheduler::AddStatus::kInvalid);
  }
  // One sequence runs at a time and one may wait: with one running and one waiting, the
  // queue is full.
  auto engine = make_engine(16, /*max_num_seqs=*/1, /*max_waiting=*/1);
  auto running = engine->submit(greedy({1, 2, 3}, 200));
  ASSERT_TRUE(running.ok()) << running.message;
  const auto first = running.stream->next(std::chrono::seconds(10));
  ASSERT_TRUE(first && !first->tokens.empty());
  auto waiting = engine->submit(greedy({4, 5, 6}, 2));
  ASSERT_TRUE(waiting.ok()) << waiting.message;
  auto full = engine->submit(greedy({1, 2, 3}, 1));
  EXPECT_EQ(full.status, scheduler::AddStatus::kQueueFull) << full.message;
  EXPECT_NE(full.message.find("retry"), std::string::npos);
  engine->abort(running.stream->id());
  const GenerationChunk after = waiting.stream->collect();
  EXPECT_TRUE(after.error.empty()) << after.error;
  EXPECT_EQ(after.finish_reason, FinishReason::kLength);
}

// The choices of one API request are queued together: all, or none (nothing queued and
// then aborted). More of them than the queue holds can never be queued.
TEST_F(EngineTest, SubmitsRequestsTogetherOrNotAtAll) {
  auto engine = make_engine(64, 64, /*max_waiting=*/3);
  const auto refused = engine->submit_all(std::vector<GenerationRequest>(4, greedy({1, 2, 3}, 2)));
  EXPECT_EQ(refused.status, scheduler::AddStatus::kNeverFits) << refused.message;
  EXPECT_NE(refused.message.find("4 sequences"), std::string::npos) << refused.message;
  EXPECT_NE(refused.message.find("3 the server queues"), std::string::npos) << refused.message;
  EXPECT_TRUE(refused.streams.empty());
  // One bad request refuses the others too.
  std::vector<GenerationRequest> mixed = {greedy({1, 2, 3}, 2), greedy({1, 1 << 20}, 2)};
  const auto bad = engine->submit_all(mixed);
  EXPECT_EQ(bad.status, scheduler::AddStatus::kInvalid) << bad.message;
  EXPECT_EQ(bad.param, "prompt");
  EXPECT_TRUE(bad.streams.empty());

  auto three = engine->submit_all(std::vector<GenerationRequest>(3, greedy({1, 2, 3}, 2)));
  ASSERT_TRUE(three.ok()) << three.message;
  ASSERT_EQ(three.streams.size(), 3u);
  for (const auto& stream : three.streams) {
    const GenerationChunk c = stream->collect();
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.usage.completion_tokens, 2);
  }
  // Nothing of the refused submissions reached the engine.
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.finished_abort, 0);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.finished_length, 3);
}

// A request the engine accepts is never refused afterwards for want of queue room: the
// room it takes is counted from its submission on, also while the engine thread is
// moving it into the scheduler.
TEST_F(EngineTest, AcceptedRequestsAreNotRefusedLater) {
  auto engine = make_engine(64, /*max_num_seqs=*/2, /*max_waiting=*/3);
  std::vector<std::shared_ptr<RequestStream>> accepted;
  int refused = 0;
  for (int i = 0; i < 600; ++i) {
    // Bursts of 20 at different moments of the engine's steps.
    if (i % 20 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100 * (i / 20 % 7)));
    auto s = engine->submit(greedy({1, 2, 3, 3 + i % 50}, 3));
    if (s.ok()) {
      accepted.push_back(s.stream);
    } else {
      EXPECT_EQ(s.status, scheduler::AddStatus::kQueueFull) << s.message;
      ++refused;
    }
  }
  int failed = 0;
  for (const auto& stream : accepted) {
    const GenerationChunk c = stream->collect();
    if (!c.error.empty()) ++failed;
    EXPECT_TRUE(c.error.empty()) << c.error;
  }
  EXPECT_EQ(failed, 0) << accepted.size() << " accepted, " << refused << " refused";
  EXPECT_GT(refused, 0);
}

// The CPU backend, except that forward calls number `fail_from` to `fail_to` throw `Error`.
template <typename Error>
class FailingBackend final : public Backend {
 public:
  FailingBackend(std::unique_ptr<Backend> inner, int fail_from, int fail_to)
      : inner_(std::move(inner)), fail_from_(fail_from), fail_to_(fail_to) {}
  std::string_view name() const override { return inner_->name(); }
  std::string device_description() const override { return inner_->device_description(); }
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t weight_bytes_per_step() const override { return inner_->weight_bytes_per_step(); }
  void allocate_kv_cache(int64_t num_blocks, kernels::DType dtype) override {
    inner_->allocate_kv_cache(num_blocks, dtype);
  }
  int64_t kv_cache_bytes() const override { return inner_->kv_cache_bytes(); }
  void forward(const ForwardBatch& batch, ForwardOutput& out) override {
    ++calls_;
    if (calls_ >= fail_from_ && calls_ <= fail_to_) throw Error("the device fell over");
    inner_->forward(batch, out);
  }

 private:
  std::unique_ptr<Backend> inner_;
  const int fail_from_, fail_to_;
  int calls_ = 0;
};

template <typename Error>
std::unique_ptr<Engine> engine_failing(const fs::path& model, std::shared_ptr<const Tokenizer> t,
                                       int fail_from, int fail_to) {
  EngineConfig config;
  config.num_kv_blocks = 64;
  config.seed = 1;
  return std::make_unique<Engine>(
      std::make_unique<FailingBackend<Error>>(make_cpu_backend(LlamaModel::load(model)), fail_from,
                                              fail_to),
      std::move(t), config);
}

TEST_F(EngineTest, AFailedStepFailsItsRequestsAndTheEngineGoesOn) {
  auto engine = engine_failing<std::runtime_error>(model_->path(), *tokenizer_, 3, 3);
  const GenerationChunk failed = engine->submit(greedy({5, 6, 7}, 10)).stream->collect();
  EXPECT_NE(failed.error.find("the device fell over"), std::string::npos) << failed.error;
  EXPECT_TRUE(engine->alive());
  const GenerationChunk next = engine->submit(greedy({5, 6, 7}, 10)).stream->collect();
  EXPECT_EQ(next.error, "");
  EXPECT_EQ(next.tokens.size(), 10u);
}

TEST_F(EngineTest, ALostDeviceFailsEveryRequestAndStopsTheEngine) {
  auto engine = engine_failing<DeviceLostError>(model_->path(), *tokenizer_, 3, 1 << 30);
  const GenerationChunk failed = engine->submit(greedy({5, 6, 7}, 10)).stream->collect();
  EXPECT_NE(failed.error.find("the device fell over"), std::string::npos) << failed.error;
  EXPECT_FALSE(engine->alive());
  EXPECT_FALSE(engine->stats().alive);
  const SubmitResult refused = engine->submit(greedy({5, 6, 7}, 10));
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.message, "the engine is not running");
}

}  // namespace
}  // namespace pagellm::engine
